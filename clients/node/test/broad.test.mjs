// A broad crawl through crawlee: 45 hosts on loopback, a third dead in
// every way a site can be (closed, filtered, TLS that fails, the site's
// 502). No proxy is blamed, quarantined or cooled down, every live host is
// fetched, and no lease is left.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { createServer as createHttpServer } from "node:http";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { Client } from "../dist/index.js";
import { REPO, env, metric } from "./env.mjs";

const e = env();
const RESULTS = ["ok", "rate_limited", "blocked", "error", "target_error"];
const reports = async () => Object.fromEntries(await Promise.all(RESULTS.map(async (r) => [r, await metric(e, "proxy_operator_broker_reports_total", { result: r })])));

function runNode(script, environ) {
  return new Promise((resolve) => {
    const p = spawn(process.execPath, [script], { env: { ...process.env, ...environ } });
    let stdout = "";
    let stderr = "";
    p.stdout.on("data", (d) => (stdout += d));
    p.stderr.on("data", (d) => (stderr += d));
    const timer = setTimeout(() => p.kill(), 180_000);
    p.on("close", (status) => {
      clearTimeout(timer);
      resolve({ status, stdout, stderr });
    });
  });
}

const closers = [];
const listen = (server, host) => new Promise((resolve) => server.listen(0, host, () => resolve(server.address().port)));

async function live(ip) {
  const s = createHttpServer((_, res) => {
    res.setHeader("Content-Type", "text/html");
    res.end("<html><title>live</title></html>");
  });
  closers.push(() => s.close());
  return `http://${ip}:${await listen(s, ip)}/`;
}

async function site502(ip) {
  const s = createHttpServer((_, res) => {
    res.setHeader("Content-Type", "text/html");
    res.statusCode = 502;
    res.end("upstream broke");
  });
  closers.push(() => s.close());
  return `http://${ip}:${await listen(s, ip)}/`;
}

async function closed(ip) {
  const s = createServer();
  const port = await listen(s, ip);
  await new Promise((r) => s.close(r));
  return `https://${ip}:${port}/`;
}

async function badTLS(ip) {
  const s = createServer((c) => c.end("this is not TLS\r\n"));
  closers.push(() => s.close());
  return `https://${ip}:${await listen(s, ip)}/`;
}

// Node's listeners accept at once, so a port whose SYNs go unanswered
// (a backlog of none, filled by one connection never accepted) is made
// by Debian's python3.
async function filtered(ip) {
  const p = spawn("python3", ["-c",
    "import socket,sys,time\ns=socket.socket();s.bind((sys.argv[1],0));s.listen(0)\nf=socket.create_connection(s.getsockname())\nprint(s.getsockname()[1],flush=True)\ntime.sleep(900)", ip]);
  closers.push(() => p.kill());
  const port = await new Promise((resolve) => p.stdout.once("data", (d) => resolve(String(d).trim())));
  return `https://${ip}:${port}/`;
}

test("a broad crawl through crawlee blames the sites, not the proxies", { timeout: 300_000 }, async () => {
  const dead = [closed, filtered, badTLS, site502];
  const urls = new Map();
  for (let i = 0; i < 45; i++) {
    const ip = `127.0.41.${i + 1}`;
    const kind = i % 3 === 2 ? dead[Math.floor(i / 3) % dead.length] : live;
    urls.set(await kind(ip), kind.name);
  }
  const before = await reports();
  const dir = mkdtempSync(join(tmpdir(), "broad-"));
  writeFileSync(join(dir, "urls.json"), JSON.stringify([...urls.keys()]));
  // Not spawnSync: the hosts are served by this process's event loop.
  const run = await runNode(join(REPO, "clients", "node", "test", "broad-crawl.mjs"), {
      ...process.env,
      EGRESS_PROXIES_URL: `grpc://${e.grpcPlain}`,
      EGRESS_PROXIES_TOKEN: e.token,
      EGRESS_PROXIES_SELECTOR: JSON.stringify(e.selector),
      BROAD_URLS: join(dir, "urls.json"),
      CRAWLEE_STORAGE_DIR: join(dir, "storage"),
      CRAWLEE_LOG_LEVEL: "DEBUG",
  });
  for (const c of closers) c();
  writeFileSync(join(tmpdir(), "egress-proxies-broad-crawl.log"), run.stderr + run.stdout);
  assert.equal(run.status, 0, run.stderr.slice(-4000));
  const out = JSON.parse(run.stdout.trim().split("\n").pop());
  const liveUrls = [...urls].filter(([, k]) => k === "live").map(([u]) => u);
  assert.deepEqual(out.fetched.sort(), liveUrls.sort(), JSON.stringify(out.failed).slice(0, 2000));

  const after = await reports();
  const delta = Object.fromEntries(RESULTS.map((r) => [r, after[r] - before[r]]));
  assert.equal(delta.error, 0, `a proxy was blamed for a site: ${JSON.stringify(delta)}`);
  assert.equal(delta.blocked + delta.rate_limited, 0, JSON.stringify(delta));
  // crawlee tells a session no status for a 5xx or a failure without an
  // answer (its markBad comes bare): those report nothing, never the proxy's error.
  assert.equal(delta.target_error, 0, JSON.stringify(delta));
  assert.ok(delta.ok > 0 && delta.ok <= liveUrls.length, JSON.stringify(delta));
  const c = new Client(`grpc://${e.grpcPlain}`, { token: e.token });
  const fleet = await c.listProxies({ selector: e.selector });
  assert.ok(fleet.every((p) => !p.quarantinedUntil), "no proxy is quarantined");
  assert.deepEqual(fleet.map((p) => p.leaseCount), fleet.map(() => 0), "no lease is left");
  for (const u of liveUrls) {
    const host = new URL(u).hostname;
    assert.ok((await c.listProxies({ selector: e.selector, target: host })).every((p) => !p.cooldownUntil), `a proxy cools down for the live ${host}`);
  }
});
