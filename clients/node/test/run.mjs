// Runs the suite against one clientenv (hack/demo/clientenv: the whole
// system on loopback), started here and stopped at the end, unless
// EGRESS_PROXIES_ENV already names a running one's description.
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, openSync, readdirSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";

import { REPO } from "./env.mjs";

let system;
if (!process.env.EGRESS_PROXIES_ENV) {
  const work = mkdtempSync(join(tmpdir(), "egress-proxies-node-"));
  let bin = process.env.CLIENTENV;
  if (!bin) {
    bin = join(work, "clientenv");
    const b = spawnSync("go", ["build", "-o", bin, "./hack/demo/clientenv"], { cwd: REPO, stdio: "inherit" });
    if (b.status !== 0) process.exit(1);
  }
  const out = join(work, "env.json");
  const log = join(work, "clientenv.log");
  // Its stdin is ours to hold: when this process ends, the system stops.
  system = spawn(bin, ["--out", out, "--dir", join(work, "system")], { cwd: REPO, stdio: ["pipe", openSync(log, "w"), openSync(log, "a")] });
  const deadline = Date.now() + 300_000;
  while (!existsSync(out)) {
    if (system.exitCode !== null || Date.now() > deadline) {
      console.error(`clientenv did not come up; its log: ${log}`);
      system.kill();
      process.exit(1);
    }
    await sleep(500);
  }
  process.env.EGRESS_PROXIES_ENV = out;
  console.log(`clientenv up (${out}; log ${log})`);
}
const files = readdirSync("test").filter((f) => f.endsWith(".test.mjs")).map((f) => join("test", f));
const t = spawnSync(process.execPath, ["--test", "--test-concurrency=1", "--test-reporter=spec", ...files], { stdio: "inherit", env: process.env });
if (system) {
  system.stdin.end();
  await new Promise((r) => system.once("exit", r));
}
process.exit(t.status ?? 1);
