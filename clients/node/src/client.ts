// The Node client of the lease API, over gRPC (Connect's gRPC transport on
// node:http2), with the Python client's semantics: a lease that renews
// while held, reports at the end what the ban policy makes of how it ended
// (ok, the proxy's error, the site's target_error, nothing for the
// caller's own errors) or the outcome you set, releases, never throws a
// failed report or release over the caller's own outcome, and typed errors.
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";

import { create } from "@bufbuild/protobuf";
import { timestampDate, type Timestamp } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient, type Client as RpcClient, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";

import { EgressProxiesError, LeaseGone, fromCallError } from "./errors.js";
import {
  CreateLeaseRequestSchema,
  LeaseService,
  ListProxiesRequestSchema,
  ProxyEvent_Type,
  ReportLeaseRequestSchema,
  WatchProxiesRequestSchema,
  type CreateLeaseResponse,
  type Proxy as ProxyMessage,
  type ReportLeaseResponse,
} from "./gen/egressproxies/lease/v1/lease_pb.js";
import { RESULTS, classifyError, type Result } from "./policy.js";

/** Tries of a call the broker answered UNAVAILABLE; a CreateLease keeps its request id across them. */
const ATTEMPTS = 3;
const BACKOFF_MS = 100;

export interface ClientOptions {
  /** Bearer token the broker asks for. */
  token?: string;
  /** PEM CA bundle (a path) the broker's certificate is verified with; default: the system's roots. */
  caFile?: string;
  /** Deadline of each call, ms (default 10 s). */
  timeoutMs?: number;
  /** How a withLease function's error becomes its report (default: the fault table's classifyError). */
  classifyError?: (err: unknown) => Result | undefined;
  /** Hears a report or release that failed at the end of withLease (default: console.warn); it is counted in exitFailures and never thrown. */
  onExitFailure?: (what: "report" | "release", leaseId: string, err: unknown) => void;
}

export interface LeaseRequest {
  /** The proxy's attributes must contain every pair. */
  selector?: Record<string, string>;
  /** The host the crawler will fetch; proxies cooling down for it are skipped. */
  target?: string;
  /** Keeps the same proxy for every lease with this key while it qualifies. */
  sessionKey?: string;
  /** Lease lifetime in seconds; 0 or unset: the broker's default. */
  ttlSeconds?: number;
  namespace?: string;
  /** Names this lease for safe retries; default: a fresh UUID. */
  requestId?: string;
}

/** A proxy as the broker lists it. */
export interface Proxy {
  id: string;
  ip: string;
  port: number;
  attributes: Record<string, string>;
  healthy: boolean;
  leaseCount: number;
  egressIp: string;
  /** In a list naming a target: while the proxy cools down for it. */
  cooldownUntil?: Date;
  quarantinedUntil?: Date;
}

/** What the broker did about a report (docs/api/ban-aware.md, Ban-aware leasing). */
export interface Report {
  actions: string[];
  cooldownUntil?: Date;
  quarantinedUntil?: Date;
  pacePerSecond: number;
}

export interface ReportOptions {
  target?: string;
  statusCode?: number;
  /** How long the request took, ms. */
  latencyMs?: number;
}

function checkResult(result: Result): void {
  if (!RESULTS.includes(result)) throw new TypeError(`result ${JSON.stringify(result)}: want one of ${RESULTS.join(", ")}`);
}

const date = (t?: Timestamp) => (t ? timestampDate(t) : undefined);

/** One change to a watched set (Client.watchProxies). */
export interface ProxyEvent {
  /**
   * "upsert": proxy is in the set (the first set, newly matching, or changed);
   * "delete": proxy.id left the set; "synced": the first set has been sent.
   */
  kind: "upsert" | "delete" | "synced";
  proxy?: Proxy;
}

const EVENT_KINDS: Partial<Record<ProxyEvent_Type, ProxyEvent["kind"]>> = {
  [ProxyEvent_Type.UPSERT]: "upsert",
  [ProxyEvent_Type.DELETE]: "delete",
  [ProxyEvent_Type.SYNCED]: "synced",
};

function toProxy(p?: ProxyMessage): Proxy {
  return {
    id: p?.id ?? "",
    ip: p?.ip ?? "",
    port: p?.port ?? 0,
    attributes: { ...p?.attributes },
    healthy: p?.healthy ?? false,
    leaseCount: p?.leaseCount ?? 0,
    egressIp: p?.egressIp ?? "",
    cooldownUntil: date(p?.cooldownUntil),
    quarantinedUntil: date(p?.quarantinedUntil),
  };
}

function toReport(r: ReportLeaseResponse): Report {
  return {
    actions: [...r.actions],
    cooldownUntil: date(r.cooldownUntil),
    quarantinedUntil: date(r.quarantinedUntil),
    pacePerSecond: r.pacePerSecond,
  };
}

/** `grpc://host:port` (plaintext) or `grpcs://host:port` (TLS) as an http(s) base URL. */
export function baseUrl(url: string): string {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    u = new URL("invalid:");
  }
  if ((u.protocol !== "grpc:" && u.protocol !== "grpcs:") || !u.hostname || !u.port || (u.pathname !== "" && u.pathname !== "/")) {
    throw new TypeError(`broker URL ${JSON.stringify(url)}: want grpc://host:port (plaintext) or grpcs://host:port (TLS)`);
  }
  return `${u.protocol === "grpcs:" ? "https" : "http"}://${u.host}`;
}

/** A connection to the broker's gRPC API. */
export class Client {
  private readonly rpc: RpcClient<typeof LeaseService>;
  private readonly timeoutMs: number;

  constructor(url: string, opts: ClientOptions = {}) {
    const auth: Interceptor = (next) => (req) => {
      if (opts.token) req.header.set("authorization", `Bearer ${opts.token}`);
      return next(req);
    };
    const transport = createGrpcTransport({
      baseUrl: baseUrl(url),
      interceptors: [auth],
      nodeOptions: opts.caFile ? { ca: readFileSync(opts.caFile) } : undefined,
    });
    this.rpc = createClient(LeaseService, transport);
    this.timeoutMs = opts.timeoutMs ?? 10_000;
    this.classifyError = opts.classifyError ?? classifyError;
    this.onExitFailure =
      opts.onExitFailure ??
      ((what, id, err) => console.warn(`egress-proxies: ${what} of lease ${id} at the end of withLease failed: ${String(err)}`));
  }

  /** How a withLease function's error becomes its report. */
  readonly classifyError: (err: unknown) => Result | undefined;
  /** Reports and releases that failed at the end of withLease: counted, never thrown. */
  readonly exitFailures = { report: 0, release: 0 };
  /** @internal */
  readonly onExitFailure: (what: "report" | "release", leaseId: string, err: unknown) => void;

  /** @internal */
  async call<T>(
    fn: (o: { timeoutMs: number }) => Promise<T>,
    ctx: { leaseId?: string; creating?: boolean; idempotent?: boolean } = {},
  ): Promise<T> {
    for (let attempt = 0; ; attempt++) {
      try {
        return await fn({ timeoutMs: this.timeoutMs });
      } catch (err) {
        // A CreateLease keeps its request id and a release is idempotent:
        // both are tried again when cut off by their deadline too (a try
        // the broker applied answers with the same lease). A report never.
        const code = ConnectError.from(err).code;
        const again = code === Code.Unavailable || (code === Code.DeadlineExceeded && (ctx.creating || ctx.idempotent));
        if (!again || attempt === ATTEMPTS - 1) {
          throw fromCallError(err, ctx);
        }
      }
      await sleep(BACKOFF_MS * 2 ** attempt);
    }
  }

  /**
   * Take a proxy: the least-loaded healthy one matching the selector that is
   * not cooling down for the target. Throws NoProxyAvailable (TargetPaced
   * when the target is paced) with retryAfter.
   */
  async lease(r: LeaseRequest = {}): Promise<Lease> {
    const req = create(CreateLeaseRequestSchema, {
      selector: r.selector ?? {},
      target: r.target ?? "",
      sessionKey: r.sessionKey ?? "",
      ttlSeconds: Math.floor(r.ttlSeconds ?? 0),
      namespace: r.namespace ?? "",
      requestId: r.requestId ?? randomUUID(),
    });
    const resp = await this.call((o) => this.rpc.createLease(req, o), { creating: true });
    return new Lease(this, resp, r.target ?? "", r.ttlSeconds ?? 0);
  }

  /**
   * Lease, run fn with the lease while renewing it, then report and
   * release: Python's `with client.lease(...)`. The report is what
   * lease.setOutcome said, else ok when fn resolves, else what
   * classifyError makes of its error: `error` only when the proxy failed,
   * `target_error` when the site did, nothing for an abort or the
   * caller's own error, which is rethrown unchanged. A report or release
   * that fails here is counted in exitFailures, never thrown.
   */
  async withLease<T>(r: LeaseRequest, fn: (lease: Lease) => Promise<T>): Promise<T> {
    const lease = await this.lease(r);
    lease.keepAlive();
    const started = performance.now();
    let failure: { err: unknown } | undefined;
    try {
      return await fn(lease);
    } catch (err) {
      failure = { err };
      throw err;
    } finally {
      await lease.finish(failure, performance.now() - started);
    }
  }

  /**
   * The proxies the broker knows, filtered, in id order; naming a target
   * fills cooldownUntil for it. Fetched pageSize at a time (0: the
   * broker's, 500), every page.
   */
  async listProxies(
    f: { selector?: Record<string, string>; healthy?: boolean; namespace?: string; target?: string; pageSize?: number } = {},
  ): Promise<Proxy[]> {
    const req = create(ListProxiesRequestSchema, {
      selector: f.selector ?? {},
      healthy: f.healthy,
      namespace: f.namespace ?? "",
      target: f.target ?? "",
      pageSize: f.pageSize ?? 0,
    });
    const out: Proxy[] = [];
    for (;;) {
      const resp = await this.call((o) => this.rpc.listProxies(req, o));
      out.push(...resp.proxies.map(toProxy));
      if (!resp.nextPageToken) return out;
      req.pageToken = resp.nextPageToken;
    }
  }

  /**
   * The proxies listProxies lists for the same filters, then their changes:
   * an "upsert" event for each, one "synced", then "upsert" and "delete"
   * events as the set changes, until the watch ends (the broker stops, or
   * the watcher fell behind: the loop throws; watch again and let the new
   * first set replace what you kept). Leaving the loop, or aborting
   * signal, ends the watch.
   */
  async *watchProxies(
    f: { selector?: Record<string, string>; healthy?: boolean; namespace?: string; signal?: AbortSignal } = {},
  ): AsyncGenerator<ProxyEvent> {
    const req = create(WatchProxiesRequestSchema, { selector: f.selector ?? {}, healthy: f.healthy, namespace: f.namespace ?? "" });
    const abort = new AbortController();
    const stop = () => abort.abort();
    f.signal?.addEventListener("abort", stop);
    try {
      for await (const resp of this.rpc.watchProxies(req, { signal: abort.signal })) {
        for (const e of resp.events) {
          const kind = EVENT_KINDS[e.type];
          if (kind) yield { kind, proxy: e.proxy ? toProxy(e.proxy) : undefined };
        }
      }
    } catch (err) {
      if (!abort.signal.aborted) throw fromCallError(err, {});
    } finally {
      f.signal?.removeEventListener("abort", stop);
      abort.abort();
    }
  }

  /** @internal */
  get api(): RpcClient<typeof LeaseService> {
    return this.rpc;
  }
}

/** A live lease. */
export class Lease {
  readonly id: string;
  readonly proxy: Proxy;
  /** [username, password] the proxy asks for, or undefined. */
  readonly credentials?: [string, string];
  readonly target: string;
  readonly sessionMoved: boolean;
  expiresAt: Date;
  /** Set when a renewal found the lease gone. */
  lost?: LeaseGone;
  private outcome?: [Result, number];
  private reported = false;
  private released = false;
  private timer?: NodeJS.Timeout;

  constructor(
    private readonly client: Client,
    resp: CreateLeaseResponse,
    target: string,
    private readonly ttlSeconds: number,
  ) {
    this.id = resp.leaseId;
    this.proxy = toProxy(resp.proxy);
    const c = resp.credentials;
    this.credentials = c && c.username ? [c.username, c.password] : undefined;
    this.target = target;
    this.sessionMoved = resp.sessionMoved;
    this.expiresAt = date(resp.expiresAt) ?? new Date();
  }

  /** `http://[user:password@]ip:port`, for any HTTP client's proxy setting. */
  get proxyUrl(): string {
    const host = this.proxy.ip.includes(":") ? `[${this.proxy.ip}]` : this.proxy.ip;
    const auth = this.credentials ? `${encodeURIComponent(this.credentials[0])}:${encodeURIComponent(this.credentials[1])}@` : "";
    return `http://${auth}${host}:${this.proxy.port}`;
  }

  /** The result reported when withLease's function ends, instead of ok or error. */
  setOutcome(result: Result, statusCode = 0): void {
    checkResult(result);
    this.outcome = [result, statusCode];
  }

  /** Extend the lease by ttlSeconds from now (0: as leased). Throws LeaseGone once it cannot be renewed. */
  async renew(ttlSeconds = 0): Promise<void> {
    const resp = await this.client.call((o) => this.client.api.renewLease({ leaseId: this.id, ttlSeconds: ttlSeconds || this.ttlSeconds }, o), {
      leaseId: this.id,
    });
    this.expiresAt = date(resp.expiresAt) ?? this.expiresAt;
  }

  /** Tell the broker how the target treated the proxy and hear what it did. */
  async report(result: Result, o: ReportOptions = {}): Promise<Report> {
    checkResult(result);
    const req = create(ReportLeaseRequestSchema, {
      leaseId: this.id,
      result,
      target: o.target ?? "",
      statusCode: o.statusCode ?? 0,
      latencyMs: Math.max(0, Math.min(3_600_000, Math.round(o.latencyMs ?? 0))),
    });
    const resp = await this.client.call((c) => this.client.api.reportLease(req, c), { leaseId: this.id });
    this.reported = true;
    return toReport(resp);
  }

  /** End the lease; calling it again is harmless. */
  async release(): Promise<void> {
    this.stopRenewing();
    if (this.released) return;
    await this.client.call((o) => this.client.api.releaseLease({ leaseId: this.id }, o), { idempotent: true });
    this.released = true;
  }

  /** Renew in the background until release (what withLease does); the timer does not keep the process alive. */
  keepAlive(): void {
    if (this.timer || this.released) return;
    const tick = () => {
      const left = this.expiresAt.getTime() - Date.now();
      this.timer = setTimeout(async () => {
        try {
          await this.renew();
        } catch (err) {
          if (err instanceof LeaseGone) {
            this.lost = err;
            return;
          }
          if (!(err instanceof EgressProxiesError)) throw err;
        }
        if (this.timer) tick();
      }, Math.max(500, left / 3));
      this.timer.unref();
    };
    tick();
  }

  /**
   * @internal Report what the holder's work came to (unless already said)
   * and release; failure is undefined for work that went well. Never throws.
   */
  async finish(failure: { err: unknown } | undefined, latencyMs: number): Promise<void> {
    this.stopRenewing();
    const verdict = failure ? this.client.classifyError(failure.err) : "ok";
    const outcome: [Result, number] | undefined =
      this.outcome ?? (this.reported || this.lost || !verdict ? undefined : [verdict, 0]);
    if (outcome) {
      try {
        await this.report(outcome[0], { statusCode: outcome[1], latencyMs });
      } catch (err) {
        if (!(err instanceof LeaseGone)) this.failedAtExit("report", err);
      }
    }
    try {
      await this.release();
    } catch (err) {
      this.failedAtExit("release", err);
    }
  }

  private failedAtExit(what: "report" | "release", err: unknown): void {
    this.client.exitFailures[what]++;
    this.client.onExitFailure(what, this.id, err);
  }

  private stopRenewing(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
  }
}
