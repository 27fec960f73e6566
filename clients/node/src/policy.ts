// Whose fault it was: how a response or an error through a leased proxy
// becomes a report result. One table for every client of this project
// (pkg/faults/table.json, docs/api/clients.md "Whose fault"); this package's suite
// runs that table's cases against classify and fails when they differ.
//
// A proxy is blamed ("error") only for what happens on its own hop: the
// client could not connect to it, it refused the credentials (a 407 with
// its challenge), or it refused a CONNECT itself. What a site does through
// a working proxy is the site's ("target_error"), which never counts
// against the proxy. The caller's own errors, and aborts, report nothing.

export type Result = "ok" | "rate_limited" | "blocked" | "error" | "target_error";
export const RESULTS: readonly Result[] = ["ok", "rate_limited", "blocked", "error", "target_error"];

/** Words of block and captcha pages, searched in a body's first 64 KiB (the table's blockMarkers). */
export const MARKERS: readonly string[] = [
  "captcha",
  "g-recaptcha",
  "h-captcha",
  "cf-chl-",
  "challenge-platform",
  "access denied",
  "are you a robot",
  "unusual traffic",
  "request blocked",
  "you have been blocked",
  "bot detection",
];
export const BLOCK_MARKERS = new RegExp(MARKERS.map((m) => m.replace(/[.*+?^${}()|[\]\\-]/g, "\\$&")).join("|"), "i");
export const SCAN = 64 * 1024;

/** Whose fault a proxy's non-2xx answer to CONNECT is, by status (the table's connectStatus); any other is the proxy's. */
export const CONNECT_STATUS: Readonly<Record<number, "caller" | "proxy" | "site">> = {
  403: "caller",
  407: "proxy",
  502: "site",
  503: "site",
  504: "site",
};

export type Headers = Record<string, string | string[] | undefined> | { get(name: string): string | null };

function header(h: Headers, name: string): string | undefined {
  if (typeof (h as { get?: unknown }).get === "function") {
    return (h as { get(n: string): string | null }).get(name) ?? undefined;
  }
  const rec = h as Record<string, string | string[] | undefined>;
  const key = Object.keys(rec).find((k) => k.toLowerCase() === name.toLowerCase());
  const v = key === undefined ? undefined : rec[key];
  return Array.isArray(v) ? v[0] : v;
}

/**
 * The default policy for a response: 407 with its challenge is `error`
 * (the proxy refused its credentials); 429, and 503 with Retry-After, are
 * `rate_limited`; 403, and any page carrying a captcha or block marker,
 * are `blocked`; any other 5xx is `target_error`; everything else is `ok`.
 * A Squid error header on a response is not trusted: a site can send one.
 */
export function classify(status: number, headers: Headers = {}, body?: string | Uint8Array): Result {
  if (status === 407 && header(headers, "proxy-authenticate")) return "error";
  if (status === 429 || (status === 503 && header(headers, "retry-after"))) return "rate_limited";
  if (status === 403) return "blocked";
  if (body !== undefined) {
    const text = typeof body === "string" ? body.slice(0, SCAN) : Buffer.from(body.subarray(0, SCAN)).toString("latin1");
    if (BLOCK_MARKERS.test(text)) return "blocked";
  }
  if (status >= 500) return "target_error";
  return "ok";
}

/** The result for a proxy's non-2xx answer to CONNECT; undefined when its policy refused the destination. */
export function classifyConnect(status: number): Result | undefined {
  const c = CONNECT_STATUS[status] ?? "proxy";
  return c === "proxy" ? "error" : c === "site" ? "target_error" : undefined;
}

/** System error codes of a connect that never reached the proxy (the client only ever dials the proxy). */
const PROXY_CODES = new Set(["ECONNREFUSED", "EHOSTUNREACH", "ENETUNREACH", "EADDRNOTAVAIL"]);
// A refused CONNECT as the proxy agents word it: http2-wrapper's (got,
// crawlee), undici's, and any saying tunnel or CONNECT near its status.
const TUNNEL_STATUS = /(?:proxy server rejected the request with status code |Proxy response \(|tunnel[^\d]{0,40}|CONNECT[^\d]{0,40})(\d{3})/i;

function* chain(err: unknown): Generator<Record<string, unknown>> {
  const seen = new Set<unknown>();
  let e: unknown = err;
  while (e && typeof e === "object" && !seen.has(e)) {
    seen.add(e);
    yield e as Record<string, unknown>;
    e = (e as { cause?: unknown }).cause;
  }
}

/**
 * The result for a request that failed with err: `error` when it never got
 * through to the proxy (refused, unreachable) or the proxy refused the
 * tunnel itself; `target_error` for a failure past the proxy (TLS, a reset,
 * a timeout, a CONNECT the proxy could not open to the site); undefined for
 * an abort and for the caller's own errors: no verdict on the proxy.
 */
export function classifyError(err: unknown): Result | undefined {
  for (const e of chain(err)) {
    const name = String(e.name ?? "");
    const code = String(e.code ?? "");
    if (name === "AbortError" || code === "ABORT_ERR") return undefined;
    const m = TUNNEL_STATUS.exec(String(e.message ?? ""));
    if (m) return classifyConnect(Number(m[1]));
    if (PROXY_CODES.has(code)) return "error";
    if (/^E[A-Z]+$/.test(code) || code.startsWith("ERR_TLS") || code.startsWith("ERR_SSL") || code.startsWith("UND_ERR_") || name === "TimeoutError") {
      return "target_error";
    }
  }
  return undefined;
}
