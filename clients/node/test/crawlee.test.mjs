// examples/crawlee, crawled for real: a local site that rate-limits one
// proxy's exit IP, through leased Squid proxies.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { Client } from "../dist/index.js";
import { REPO, env, metric, siteRequests } from "./env.mjs";

const e = env();

test("the crawlee example crawls through the fleet", async () => {
  const before = (await siteRequests(e)).length;
  const limited = await metric(e, "proxy_operator_broker_reports_total", { result: "rate_limited" });
  const run = spawnSync(process.execPath, ["main.js"], {
    cwd: join(REPO, "examples", "crawlee"),
    encoding: "utf8",
    timeout: 300_000,
    env: {
      ...process.env,
      EGRESS_PROXIES_URL: `grpcs://${e.grpcTLS}`,
      EGRESS_PROXIES_TOKEN: e.token,
      EGRESS_PROXIES_CA_FILE: e.caFile,
      SITE_URL: e.site,
      CRAWLEE_STORAGE_DIR: mkdtempSync(join(tmpdir(), "crawlee-")),
      CRAWLEE_LOG_LEVEL: "DEBUG",
    },
  });
  writeFileSync(join(tmpdir(), "egress-proxies-crawlee-example.log"), run.stderr + run.stdout);
  assert.equal(run.status, 0, run.stderr.slice(-4000));
  const out = JSON.parse(run.stdout.trim().split("\n").pop());

  // The crawl completed: the root and every page it links, once each.
  const want = [e.site, ...Array.from({ length: e.pages }, (_, i) => `${e.site}p/${i + 1}`)].sort();
  assert.deepEqual(out.pages.map((p) => p.url).sort(), want);
  assert.equal(out.failed, 0);

  // crawlee retired the sessions the site rate-limited; the fleet heard
  // it, so the limited proxy now cools down for the site, in the API,
  assert.ok((await metric(e, "proxy_operator_broker_reports_total", { result: "rate_limited" })) > limited, run.stderr.slice(-3000));
  const c = new Client(`grpc://${e.grpcPlain}`, { token: e.token });
  const proxies = await c.listProxies({ selector: e.selector, target: "127.0.0.1" });
  const cooling = proxies.filter((p) => p.cooldownUntil && p.cooldownUntil > new Date()).map((p) => p.egressIp);
  assert.deepEqual(cooling, [e.limitedIP]);
  // and no lease is left.
  assert.deepEqual(
    proxies.map((p) => p.leaseCount),
    proxies.map(() => 0),
  );

  // Every request the site saw came from a proxy's exit IP, never from the
  // crawler itself, and that proxy's Squid logged it.
  const seen = (await siteRequests(e)).slice(before);
  assert.ok(seen.length >= want.length);
  const logs = Object.fromEntries(e.proxies.map((p) => [p.egressIP, readFileSync(p.accessLog, "utf8")]));
  for (const r of seen) {
    assert.ok(r.from in logs, `${JSON.stringify(r)} did not come through a proxy`);
    assert.ok(logs[r.from].includes(e.site.replace(/\/$/, "") + r.path), `${JSON.stringify(r)} is not in that proxy's access log`);
  }
  assert.ok(seen.some((r) => r.from === e.limitedIP && r.status === 429), "the site did rate-limit a request");
});
