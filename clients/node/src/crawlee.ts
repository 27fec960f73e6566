// crawlee integration: a ProxyConfiguration whose proxies are leased from
// egress-proxies, one lease per crawlee session and target host (the
// session id is the lease's session key, so the broker keeps the session on
// one proxy while it qualifies), with crawlee's own verdicts on sessions
// reported to the fleet.
//
//   const proxyConfiguration = egressProxyConfiguration({ url, token, selector });
//   const crawler = new CheerioCrawler({
//     proxyConfiguration,
//     sessionPoolOptions: proxyConfiguration.sessionPoolOptions,
//     requestHandler: ...,
//   });
//   await crawler.run([...]);
//   await proxyConfiguration.close();
import { setTimeout as sleep } from "node:timers/promises";

import { ProxyConfiguration, Session, log as crawleeLog, type SessionOptions, type SessionPool } from "@crawlee/core";

import { Client, type ClientOptions, type Lease } from "./client.js";
import { EgressProxiesError, NoProxyAvailable } from "./errors.js";
import { classify, type Result } from "./policy.js";

export interface EgressProxyConfigurationOptions extends ClientOptions {
  /** The broker: grpc://host:port or grpcs://host:port. */
  url: string;
  selector?: Record<string, string>;
  namespace?: string;
  /** Lease TTL, seconds (default 60); leases renew while their session lives. */
  ttlSeconds?: number;
  /** How long a request waits out the broker's refusals before it fails, seconds (default 60). */
  maxWaitSeconds?: number;
  /**
   * How long a session keeps its lease with no request in flight, seconds
   * (default 5): its next request within it reuses the lease and proxy, and
   * idle sessions (crawlee keeps up to maxPoolSize) hold no proxy capacity.
   */
  lingerSeconds?: number;
}

const log = crawleeLog.child({ prefix: "EgressProxies" });

/** The lease one session holds for one host. */
interface Held {
  lease: Promise<Lease>;
  host: string;
  /** Requests that took its proxy URL and have no verdict yet. */
  inflight: number;
  lastUsed: number;
}

/**
 * A crawlee ProxyConfiguration over egress-proxies. Pass
 * `sessionPoolOptions` to the crawler too: through it the fleet hears how
 * each session fared, on the lease of the request that earned it (markGood:
 * ok; retire or markBad: what the fault table makes of the status crawlee
 * saw, so a 429 is rate_limited, a 403 blocked, a 5xx the site's
 * target_error; markBad with no status, a request that failed without an
 * answer, reports nothing), and a retired session's leases are released.
 * A session holds its lease while it has requests in flight and
 * lingerSeconds after; `close()` releases whatever is still held.
 */
export class EgressProxyConfiguration extends ProxyConfiguration {
  readonly client: Client;
  /** Spread into the crawler's sessionPoolOptions. */
  readonly sessionPoolOptions: { createSessionFunction: (pool: SessionPool, options?: { sessionOptions?: SessionOptions }) => Session };
  private readonly held = new Map<string, Held[]>();
  private readonly o: EgressProxyConfigurationOptions;
  private sweeper?: NodeJS.Timeout;

  constructor(o: EgressProxyConfigurationOptions) {
    super({ newUrlFunction: (sessionId, options) => this.proxyUrlFor(String(sessionId ?? ""), options?.request?.url) });
    this.o = o;
    this.client = new Client(o.url, o);
    this.sessionPoolOptions = { createSessionFunction: (pool, options) => this.observe(pool, options) };
  }

  private async proxyUrlFor(sessionId: string, url?: string): Promise<string> {
    const host = url ? new URL(url).hostname : "";
    const leases = this.held.get(sessionId) ?? [];
    this.held.set(sessionId, leases);
    let h = leases.find((x) => x.host === host);
    if (!h) {
      const lease = this.leaseWaiting(host, sessionId).then((l) => {
        l.keepAlive();
        log.debug("leased", { session: sessionId, host, lease: l.id, proxy: l.proxy.id });
        return l;
      });
      h = { lease, host, inflight: 0, lastUsed: Date.now() };
      leases.push(h);
      const mine = h;
      lease.catch(() => leases.includes(mine) && leases.splice(leases.indexOf(mine), 1)); // refused: the next request asks again
      this.sweep();
    }
    h.inflight++;
    h.lastUsed = Date.now();
    return (await h.lease).proxyUrl;
  }

  /** Release, now and then, the leases of sessions with nothing in flight for lingerSeconds. */
  private sweep(): void {
    if (this.sweeper) return;
    const linger = (this.o.lingerSeconds ?? 5) * 1000;
    // A request that never got a verdict (aborted before it used its
    // session) counts as done after this long.
    const stuck = Math.max(linger, (this.o.ttlSeconds ?? 60) * 2000);
    this.sweeper = setInterval(() => {
      const now = Date.now();
      for (const [id, leases] of this.held) {
        for (const h of [...leases]) {
          const idle = now - h.lastUsed;
          if ((h.inflight === 0 && idle > linger) || idle > stuck) {
            leases.splice(leases.indexOf(h), 1);
            void release(h);
          }
        }
        if (leases.length === 0) this.held.delete(id);
      }
    }, Math.max(250, linger / 2));
    this.sweeper.unref();
  }

  /**
   * A lease for the session and host; a refusal (no proxy qualifies, the
   * host is paced) is waited out for the broker's Retry-After, up to
   * maxWaitSeconds in all, rather than failing the request.
   */
  private async leaseWaiting(host: string, sessionId: string): Promise<Lease> {
    const deadline = Date.now() + (this.o.maxWaitSeconds ?? 60) * 1000;
    for (;;) {
      try {
        return await this.client.lease({
          selector: this.o.selector,
          namespace: this.o.namespace,
          target: host,
          ttlSeconds: this.o.ttlSeconds ?? 60,
          sessionKey: sessionKey(sessionId),
        });
      } catch (err) {
        const wait = ((err instanceof NoProxyAvailable && err.retryAfter) || 1) * 1000;
        log.debug("lease refused", { session: sessionId, host, error: String(err), waitMs: wait });
        if (!(err instanceof NoProxyAvailable) || Date.now() + wait > deadline) throw err;
        await sleep(wait);
      }
    }
  }

  /** A crawlee Session whose verdicts reach the fleet. */
  private observe(pool: SessionPool, options?: { sessionOptions?: SessionOptions }): Session {
    // As crawlee's default createSessionFunction builds it.
    const defaults = (pool as unknown as { sessionOptions: SessionOptions }).sessionOptions;
    const session = new Session({ ...defaults, ...options?.sessionOptions, sessionPool: pool });
    // The status crawlee saw for the session's request now ending: it
    // calls retireOnBlockedStatusCodes with each answer, before its verdict.
    let lastStatus = 0;
    const verdict = (): Result | undefined => {
      const s = lastStatus;
      lastStatus = 0;
      return s ? classify(s) : undefined;
    };
    const { markGood, markBad, retire, retireOnBlockedStatusCodes } = session;
    session.markGood = () => {
      markGood.call(session);
      lastStatus = 0;
      void this.report(session.id, "ok", 0);
    };
    session.markBad = () => {
      const status = lastStatus;
      void this.report(session.id, verdict(), status);
      markBad.call(session);
    };
    session.retireOnBlockedStatusCodes = (statusCode: number, extra?: number[]) => {
      lastStatus = statusCode;
      return retireOnBlockedStatusCodes.call(session, statusCode, extra);
    };
    session.retire = () => {
      const status = lastStatus;
      retire.call(session);
      void this.end(session.id, verdict(), status);
    };
    return session;
  }

  /**
   * The verdict goes to the lease of the request that earned it: the one
   * lease of the session with a request in flight. With none, or with
   * requests in flight for several hosts at once, it cannot be told which,
   * and nothing is reported rather than a guess.
   */
  private async report(sessionId: string, result: Result | undefined, statusCode: number): Promise<void> {
    const busy = (this.held.get(sessionId) ?? []).filter((x) => x.inflight > 0);
    const h = busy.length === 1 ? busy[0] : undefined;
    log.debug("session verdict", { session: sessionId, result, statusCode, host: h?.host, inflight: busy.length });
    if (!h) return;
    h.inflight--;
    h.lastUsed = Date.now();
    if (!result) return;
    try {
      await (await h.lease).report(result, { statusCode });
    } catch (err) {
      if (!(err instanceof EgressProxiesError)) throw err; // a gone lease or a refused report: nothing to do
    }
  }

  /** Report a retired session's verdict and release its leases. */
  private async end(sessionId: string, result: Result | undefined, statusCode: number): Promise<void> {
    await this.report(sessionId, result, statusCode);
    await this.releaseSession(sessionId);
  }

  private async releaseSession(sessionId: string): Promise<void> {
    const leases = this.held.get(sessionId) ?? [];
    this.held.delete(sessionId);
    await Promise.all(leases.map(release));
  }

  /** Release every lease still held; call after crawler.run(). */
  async close(): Promise<void> {
    clearInterval(this.sweeper);
    this.sweeper = undefined;
    await Promise.all([...this.held.keys()].map((id) => this.releaseSession(id)));
  }
}

/** A crawlee ProxyConfiguration whose proxies are leased from egress-proxies. */
export function egressProxyConfiguration(o: EgressProxyConfigurationOptions): EgressProxyConfiguration {
  return new EgressProxyConfiguration(o);
}

async function release(h: Held): Promise<void> {
  try {
    const lease = await h.lease;
    await lease.release();
    log.debug("released", { lease: lease.id, host: h.host });
  } catch {
    // refused at lease time, or the broker is away: it ends at its TTL
  }
}

// The broker takes 1-128 of [A-Za-z0-9_.:-]; crawlee's ids are session_<random>.
function sessionKey(id: string): string {
  return id.replace(/[^A-Za-z0-9_.:-]/g, "_").slice(0, 128) || "_";
}
