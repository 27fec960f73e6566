// A crawlee crawl of the URLs in BROAD_URLS (a JSON array) through
// egress-proxies, once each, with no retries: it prints which it fetched.
import { readFileSync } from "node:fs";

import { CheerioCrawler } from "@crawlee/cheerio";

import { egressProxyConfiguration } from "../dist/crawlee.js";

const proxyConfiguration = egressProxyConfiguration({
  url: process.env.EGRESS_PROXIES_URL,
  token: process.env.EGRESS_PROXIES_TOKEN,
  selector: JSON.parse(process.env.EGRESS_PROXIES_SELECTOR),
  lingerSeconds: 1,
});
const fetched = [];
const failed = [];
const crawler = new CheerioCrawler({
  proxyConfiguration,
  sessionPoolOptions: proxyConfiguration.sessionPoolOptions,
  maxConcurrency: 16,
  maxRequestRetries: 0,
  maxSessionRotations: 0,
  navigationTimeoutSecs: 20,
  async requestHandler({ request }) {
    fetched.push(request.url);
  },
  async failedRequestHandler({ request }, error) {
    failed.push({ url: request.url, error: String(error).slice(0, 200) });
  },
});
await crawler.run(JSON.parse(readFileSync(process.env.BROAD_URLS, "utf8")));
await proxyConfiguration.close();
console.log(JSON.stringify({ fetched, failed }));
