// The package as published: its version the API's and the Python client's,
// its generated code in step with proto/, its exports resolvable.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, readdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { REPO } from "./env.mjs";

const pkg = JSON.parse(readFileSync(join(REPO, "clients", "node", "package.json"), "utf8"));

test("the version is the API's and the Python client's", async () => {
  const proto = readFileSync(join(REPO, "proto", "egressproxies", "lease", "v1", "lease.proto"), "utf8");
  const major = proto.match(/^package egressproxies\.lease\.v(\d+);/m)[1];
  assert.equal(pkg.version.split(".")[0], major);
  const { API_VERSION } = await import("../dist/index.js");
  assert.equal(API_VERSION, `v${major}`);
  const py = readFileSync(join(REPO, "clients", "python", "egress_proxies", "_version.py"), "utf8");
  assert.equal(py.match(/__version__ = "([^"]+)"/)[1], pkg.version);
});

test("the generated code is fresh", () => {
  const out = mkdtempSync(join(tmpdir(), "egress-proxies-gen-"));
  const r = spawnSync("bash", [join(REPO, "clients", "gen.sh"), out], { cwd: REPO, encoding: "utf8" });
  assert.equal(r.status, 0, r.stderr);
  const walk = (d) => readdirSync(d, { recursive: true }).filter((f) => f.endsWith(".ts")).sort();
  const fresh = join(out, "clients", "node", "src", "gen");
  const ours = join(REPO, "clients", "node", "src", "gen");
  assert.deepEqual(walk(fresh), walk(ours));
  for (const f of walk(ours)) {
    assert.equal(readFileSync(join(fresh, f), "utf8"), readFileSync(join(ours, f), "utf8"), `${f} is stale; run make generate`);
  }
});

test("the exports resolve", async () => {
  for (const entry of Object.keys(pkg.exports)) {
    const mod = await import(join(REPO, "clients", "node", pkg.exports[entry].import));
    assert.ok(Object.keys(mod).length > 0, entry);
  }
  const { egressProxyConfiguration } = await import("../dist/crawlee.js");
  assert.equal(typeof egressProxyConfiguration, "function");
});
