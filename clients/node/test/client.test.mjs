// The Node client against a real broker (TLS, bearer token), Redis and Squid.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import http from "node:http";
import tls from "node:tls";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import { Client, InvalidRequest, LeaseGone, NoProxyAvailable, TargetPaced, Unauthenticated, baseUrl } from "../dist/index.js";
import { env, metric, uniqueTarget } from "./env.mjs";

const e = env();
const tlsClient = () => new Client(`grpcs://${e.grpcTLS}`, { token: e.token, caFile: e.caFile });
const live = async (c) => (await c.listProxies({ selector: e.selector })).reduce((n, p) => n + p.leaseCount, 0);

/** GET url (https) through the proxy at proxyUrl: a CONNECT tunnel with its credentials. */
function viaProxy(proxyUrl, url, caFile) {
  const p = new URL(proxyUrl);
  const u = new URL(url);
  const auth = `Basic ${Buffer.from(`${decodeURIComponent(p.username)}:${decodeURIComponent(p.password)}`).toString("base64")}`;
  return new Promise((resolve, reject) => {
    const req = http.request({ host: p.hostname, port: p.port, method: "CONNECT", path: u.host, headers: { "Proxy-Authorization": auth } });
    req.on("connect", (res, socket) => {
      if (res.statusCode !== 200) return reject(new Error(`CONNECT answered ${res.statusCode}`));
      const s = tls.connect({ socket, ca: readFileSync(caFile), checkServerIdentity: () => undefined }, () => {
        s.write(`GET ${u.pathname} HTTP/1.1\r\nHost: ${u.host}\r\nConnection: close\r\n\r\n`);
      });
      let data = "";
      s.on("data", (d) => (data += d));
      s.on("end", () => resolve(data.split("\r\n\r\n")[1].trim()));
      s.on("error", reject);
    });
    req.on("error", reject);
    req.end();
  });
}

test("withLease egresses through its proxy, reports ok and releases", async () => {
  const c = tlsClient();
  const oks = await metric(e, "proxy_operator_broker_reports_total", { result: "ok" });
  const ip = await c.withLease({ selector: e.selector, target: uniqueTarget("n"), ttlSeconds: 30 }, async (lease) => {
    assert.ok(lease.credentials, "a broker with a token hands out the proxy's credentials");
    assert.equal(await live(c), 1);
    assert.equal(await viaProxy(lease.proxyUrl, `${e.httpsEcho}/ip`, e.httpsEchoCA), lease.proxy.egressIp);
    return lease.proxy.egressIp;
  });
  assert.ok(ip);
  assert.equal(await live(c), 0, "released");
  assert.equal(await metric(e, "proxy_operator_broker_reports_total", { result: "ok" }), oks + 1, "and reported ok");
});

const RESULTS = ["ok", "rate_limited", "blocked", "error", "target_error"];
const reports = async () => Object.fromEntries(await Promise.all(RESULTS.map(async (r) => [r, await metric(e, "proxy_operator_broker_reports_total", { result: r })])));
const delta = (before, after) => Object.fromEntries(RESULTS.filter((r) => after[r] !== before[r]).map((r) => [r, after[r] - before[r]]));

test("the caller's own throw is rethrown unchanged, reports nothing and releases; a set outcome is reported instead", async () => {
  const c = tlsClient();
  const before = await reports();
  const bug = new TypeError("the caller's own bug");
  await assert.rejects(
    c.withLease({ selector: e.selector, target: uniqueTarget("n") }, async () => {
      throw bug;
    }),
    (err) => err === bug,
  );
  assert.equal(await live(c), 0);
  assert.deepEqual(delta(before, await reports()), {}, "no verdict on the proxy");

  const t = uniqueTarget("n");
  let leased;
  await c.withLease({ selector: e.selector, target: t }, async (lease) => {
    leased = lease.proxy.id;
    lease.setOutcome("rate_limited", 429);
  });
  const cooling = (await c.listProxies({ selector: e.selector, target: t })).filter((p) => p.cooldownUntil).map((p) => p.id);
  assert.deepEqual(cooling, [leased], "the report cooled that proxy down for the target, and only it");
  assert.equal(await live(c), 0);
});

for (const [name, err, result] of [
  ["the proxy refused the connection", Object.assign(new Error("connect ECONNREFUSED"), { code: "ECONNREFUSED" }), "error"],
  ["the site reset it", Object.assign(new Error("read ECONNRESET"), { code: "ECONNRESET" }), "target_error"],
  ["an abort", Object.assign(new Error("aborted"), { name: "AbortError" }), undefined],
]) {
  test(`a transport failure is reported against whoever failed: ${name}`, async () => {
    const c = tlsClient();
    const before = await reports();
    await assert.rejects(
      c.withLease({ selector: e.selector, target: uniqueTarget("n") }, async () => {
        throw err;
      }),
      (got) => got === err,
    );
    assert.equal(await live(c), 0);
    assert.deepEqual(delta(before, await reports()), result ? { [result]: 1 } : {});
  });
}

test("reports refused at the token's rate are never thrown", async () => {
  // Broker 2 takes 10 reports a second from the token.
  const c = new Client(`grpc://${e.grpcReportLimited}`, { token: e.token, onExitFailure: () => {} });
  for (let i = 0; i < 500; i++) {
    await c.withLease({ selector: e.selector, target: uniqueTarget("r") }, async () => {});
  }
  assert.ok(c.exitFailures.report > 0, "the token's report rate refused some");
  assert.equal(c.exitFailures.release, 0);
  assert.equal(await live(c), 0);

  // Nor over the caller's own error.
  for (let i = 0; i < 30; i++) {
    await assert.rejects(
      c.withLease({ selector: e.selector, target: uniqueTarget("r") }, async () => {
        throw Object.assign(new Error("read ECONNRESET"), { code: "ECONNRESET" });
      }),
      /ECONNRESET/,
    );
  }
  assert.equal(await live(c), 0);
});

test("the lease is renewed while held", async () => {
  const c = tlsClient();
  await c.withLease({ selector: e.selector, target: uniqueTarget("n"), ttlSeconds: 10 }, async (lease) => {
    const first = lease.expiresAt;
    await sleep(13_000); // past the TTL: only renewals keep it
    assert.ok(lease.expiresAt > first);
    assert.equal(lease.lost, undefined);
    await lease.report("ok");
  });
});

test("typed errors", async () => {
  const c = tlsClient();
  const refused = await c.lease({ selector: { pool: "no-such-pool" } }).catch((err) => err);
  assert.ok(refused instanceof NoProxyAvailable && !(refused instanceof TargetPaced));
  assert.equal(refused.reason, "NO_MATCHING_PROXY");
  assert.equal(refused.retryAfter, 10);
  await assert.rejects(c.lease({ selector: e.selector, ttlSeconds: 999999 }), (err) => err instanceof InvalidRequest && /ttl/.test(err.message));
  const bad = new Client(`grpcs://${e.grpcTLS}`, { token: "not-the-token", caFile: e.caFile });
  await assert.rejects(bad.lease({ selector: e.selector }), Unauthenticated);
  assert.throws(() => baseUrl(`https://${e.grpcTLS}`), /grpc:\/\//);
  const lease = await c.lease({ selector: e.selector });
  await lease.release();
  await lease.release(); // harmless twice
  await assert.rejects(lease.renew(), (err) => err instanceof LeaseGone && err.leaseId === lease.id);
});

test("plaintext, request ids and sessions", async () => {
  const c = new Client(`grpc://${e.grpcPlain}`, { token: e.token });
  const a = await c.lease({ selector: e.selector, requestId: "node-request-1" });
  const b = await c.lease({ selector: e.selector, requestId: "node-request-1" });
  assert.equal(a.id, b.id, "the same request id is the same lease");
  await a.release();
  const s1 = await c.lease({ selector: e.selector, sessionKey: "node-login" });
  const s2 = await c.lease({ selector: e.selector, sessionKey: "node-login" });
  assert.equal(s2.proxy.id, s1.proxy.id, "a session keeps its proxy");
  await Promise.all([s1.release(), s2.release()]);
  assert.equal(await live(c), 0);
});

test("listProxies walks every page", async () => {
  const c = tlsClient();
  const whole = (await c.listProxies({ selector: e.selector })).map((p) => p.id);
  assert.ok(whole.length >= 2, "the environment's fleet spans pages of one");
  assert.deepEqual([...whole].sort(), whole);
  assert.deepEqual((await c.listProxies({ selector: e.selector, pageSize: 1 })).map((p) => p.id), whole);
});

test("watchProxies sends the set, then synced; leaving the loop ends the watch", async () => {
  const c = tlsClient();
  const listed = (await c.listProxies({ selector: e.selector })).map((p) => p.id);
  const first = [];
  for await (const ev of c.watchProxies({ selector: e.selector })) {
    if (ev.kind === "synced") {
      assert.equal(ev.proxy, undefined);
      break;
    }
    assert.equal(ev.kind, "upsert");
    first.push(ev.proxy.id);
  }
  assert.deepEqual(first, listed, "the first set is what listProxies lists, in id order");
  let open = await metric(e, "proxy_operator_broker_watches");
  for (let i = 0; open !== 0 && i < 200; i++) {
    await sleep(50);
    open = await metric(e, "proxy_operator_broker_watches");
  }
  assert.equal(open, 0, "leaving the loop ends the watch on the broker");
});
