// A crawlee crawl whose every request goes through a proxy leased from
// egress-proxies: the proxyConfiguration and the sessionPoolOptions are
// all it takes. The broker, token and site come from the environment so
// the project's test can point it at its own system.
import { CheerioCrawler } from "@crawlee/cheerio";
import { egressProxyConfiguration } from "@egress-proxies/client/crawlee";

const proxyConfiguration = egressProxyConfiguration({
  url: process.env.EGRESS_PROXIES_URL, // grpc://egress-proxies-broker-grpc.egress-proxies-system:9090 (grpcs:// with EGRESS_PROXIES_CA_FILE when the brokers serve TLS)
  token: process.env.EGRESS_PROXIES_TOKEN,
  caFile: process.env.EGRESS_PROXIES_CA_FILE,
  selector: { pool: "crawl" },
});

const pages = [];
const crawler = new CheerioCrawler({
  proxyConfiguration,
  // Through these the fleet hears how each session fared: a session
  // crawlee retires (a 429, a 403) cools its proxy down for the site.
  sessionPoolOptions: proxyConfiguration.sessionPoolOptions,
  maxConcurrency: 8,
  async requestHandler({ request, $, enqueueLinks, proxyInfo }) {
    pages.push({ url: request.loadedUrl, title: $("title").text(), proxy: proxyInfo?.hostname });
    await enqueueLinks();
  },
});

const stats = await crawler.run([process.env.SITE_URL]);
await proxyConfiguration.close(); // release what the sessions still hold
console.log(JSON.stringify({ pages, finished: stats.requestsFinished, failed: stats.requestsFailed, retries: stats.retryHistogram }));
