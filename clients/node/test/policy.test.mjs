// The default ban policy against the one fault table (pkg/faults/table.json)
// the broker's gateway and the Python client are held to as well.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";

import { CONNECT_STATUS, MARKERS, SCAN, classify, classifyConnect, classifyError } from "../dist/index.js";
import { REPO } from "./env.mjs";

const table = JSON.parse(readFileSync(join(REPO, "pkg", "faults", "table.json"), "utf8"));
const resultOfClass = { proxy: "error", site: "target_error", caller: undefined };

for (const c of table.responses) {
  test(`response: ${c.name} -> ${c.result}`, () => {
    const body = "x".repeat(c.pad ?? 0) + (c.body ?? "");
    assert.equal(classify(c.status, c.headers ?? {}, body), c.result);
    assert.equal(classify(c.status, new Headers(c.headers ?? {}), Buffer.from(body)), c.result, "fetch's Headers and bytes too");
  });
}

// A client's library gives it a refused CONNECT's status, not its headers.
for (const c of table.connects.filter((c) => !c.headers)) {
  test(`connect: ${c.name} -> ${c.class}`, () => {
    assert.equal(classifyConnect(c.status), resultOfClass[c.class]);
  });
}

test("the same markers and statuses as the table", () => {
  assert.deepEqual([...MARKERS], table.blockMarkers);
  assert.equal(SCAN, table.markerWindow);
  assert.deepEqual(Object.fromEntries(Object.entries(CONNECT_STATUS).map(([k, v]) => [String(k), v])), table.connectStatus);
  assert.equal(table.connectDefault, "proxy");
});

const sysErr = (code, message = code) => Object.assign(new Error(message), { code });
const cases = [
  ["the caller's own TypeError", new TypeError("undefined is not a function"), undefined],
  ["an abort", Object.assign(new Error("This operation was aborted"), { name: "AbortError" }), undefined],
  ["the proxy refused the connection", sysErr("ECONNREFUSED"), "error"],
  ["fetch failed, caused by the proxy refusing", new TypeError("fetch failed", { cause: sysErr("ECONNREFUSED") }), "error"],
  ["the proxy is unreachable", sysErr("EHOSTUNREACH"), "error"],
  ["the site reset the connection", sysErr("ECONNRESET"), "target_error"],
  ["a timeout", sysErr("ETIMEDOUT"), "target_error"],
  ["the site's TLS failed", sysErr("EPROTO", "write EPROTO ssl3_get_record:wrong version number"), "target_error"],
  ["the site's certificate", sysErr("ERR_TLS_CERT_ALTNAME_INVALID"), "target_error"],
  ["undici's tunnel refused by the site", new Error("Proxy response (503) !== 200 when HTTP Tunneling"), "target_error"],
  ["undici's tunnel refused for credentials", new Error("Proxy response (407) !== 200 when HTTP Tunneling"), "error"],
  ["a tunnel the proxy's policy refused", new Error("Proxy response (403) !== 200 when HTTP Tunneling"), undefined],
  ["got's (http2-wrapper's) refused tunnel", new Error("The proxy server rejected the request with status code 503 (Service Unavailable)"), "target_error"],
  ["got's tunnel refused for credentials", new Error("The proxy server rejected the request with status code 407 (Proxy Authentication Required)"), "error"],
];
for (const [name, err, want] of cases) {
  test(`error: ${name} -> ${want}`, () => {
    assert.equal(classifyError(err), want);
  });
}
