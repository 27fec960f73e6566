// The clients' environment, as test/run.mjs started it, and probes of it.
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

export const REPO = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");

export function env() {
  const path = process.env.EGRESS_PROXIES_ENV;
  if (!path) throw new Error("EGRESS_PROXIES_ENV is not set: run the suite with npm test (test/run.mjs)");
  return JSON.parse(readFileSync(path, "utf8"));
}

/** The sum over every broker of a counter's series matching labels. */
export async function metric(e, name, labels = {}) {
  let total = 0;
  const want = Object.entries(labels).map(([k, v]) => `${k}="${v}"`);
  for (const ops of e.ops) {
    const text = await (await fetch(`${ops}/metrics`)).text();
    for (const line of text.split("\n")) {
      const m = line.match(/^(\S+?)(\{[^}]*\})? (\S+)$/);
      if (m && m[1] === name && want.every((w) => (m[2] ?? "").includes(w))) total += Number(m[3]);
    }
  }
  return total;
}

export async function siteRequests(e) {
  return (await fetch(`${e.site}_requests`)).json();
}

export const uniqueTarget = (prefix) => `${prefix}-${Math.random().toString(36).slice(2, 10)}.test`;
