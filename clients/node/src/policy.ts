// How a response or an error through a proxy becomes a report result: the
// default every client of this project shares (docs/api.md, "Outcomes"),
// the same table as the Python client's BanPolicy.

export type Result = "ok" | "rate_limited" | "blocked" | "error";
export const RESULTS: readonly Result[] = ["ok", "rate_limited", "blocked", "error"];

/** Words of block and captcha pages, searched in a body's first 64 KiB. */
export const BLOCK_MARKERS =
  /captcha|g-recaptcha|h-captcha|cf-chl-|challenge-platform|access denied|are you a robot|unusual traffic|request blocked|you have been blocked|bot detection/i;
const SCAN = 64 * 1024;

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
 * The default policy: a Squid error page (X-Squid-Error) is `error`; 429,
 * and 503 with Retry-After, are `rate_limited`; 403, and any page carrying
 * a captcha or block marker, are `blocked`; everything else is `ok`.
 */
export function classify(status: number, headers: Headers = {}, body?: string | Uint8Array): Result {
  if (header(headers, "x-squid-error")) return "error";
  if (status === 429 || (status === 503 && header(headers, "retry-after"))) return "rate_limited";
  if (status === 403) return "blocked";
  if (body !== undefined) {
    const text = typeof body === "string" ? body.slice(0, SCAN) : Buffer.from(body.subarray(0, SCAN)).toString("latin1");
    if (BLOCK_MARKERS.test(text)) return "blocked";
  }
  return "ok";
}
