// Typed errors of the lease API: every error the broker answers with
// carries its gRPC code, the ErrorInfo reason and metadata, and RetryInfo
// as retryAfter (seconds), so callers branch on types and fields, never on
// messages. The same taxonomy as the Python client's.
import { fromBinary } from "@bufbuild/protobuf";
import { Code, ConnectError } from "@connectrpc/connect";
import { ErrorInfoSchema, RetryInfoSchema } from "./gen/rpc_status_pb.js";

export interface ErrorFields {
  code?: Code;
  /** ErrorInfo.reason, e.g. ALL_COOLING_DOWN (docs/api/errors-and-metrics.md, Errors). */
  reason?: string;
  metadata?: Record<string, string>;
  /** Seconds the broker asks the caller to wait, when it says. */
  retryAfter?: number;
}

/** An error the broker answered with (or the call could not reach it). */
export class EgressProxiesError extends Error {
  readonly code?: Code;
  readonly reason: string;
  readonly metadata: Record<string, string>;
  readonly retryAfter?: number;
  constructor(message: string, f: ErrorFields = {}) {
    super(message);
    this.name = new.target.name;
    this.code = f.code;
    this.reason = f.reason ?? "";
    this.metadata = f.metadata ?? {};
    this.retryAfter = f.retryAfter;
  }
}

/** No proxy qualifies now; `reason` says why, `retryAfter` when to try again. */
export class NoProxyAvailable extends EgressProxiesError {}

/** The target is paced fleet-wide; its next lease is due in `retryAfter` s. */
export class TargetPaced extends NoProxyAvailable {}

/** The lease expired, was released, or its proxy left the leasable set. */
export class LeaseGone extends EgressProxiesError {
  constructor(
    message: string,
    readonly leaseId: string,
    f: ErrorFields = {},
  ) {
    super(message, f);
  }
}

/** The broker refused the token. */
export class Unauthenticated extends EgressProxiesError {}

/** The broker refused an argument; the message names the field. */
export class InvalidRequest extends EgressProxiesError {}

/** The typed error for a failed call (`creating`: a CreateLease). */
export function fromCallError(err: unknown, opts: { leaseId?: string; creating?: boolean } = {}): EgressProxiesError {
  const ce = ConnectError.from(err);
  const f: ErrorFields = { code: ce.code };
  for (const d of ce.details) {
    if (!("type" in d) || !(d.value instanceof Uint8Array)) continue; // an outgoing detail: not from the wire
    if (d.type === "google.rpc.ErrorInfo") {
      const info = fromBinary(ErrorInfoSchema, d.value);
      f.reason = info.reason;
      f.metadata = { ...info.metadata };
    } else if (d.type === "google.rpc.RetryInfo") {
      const delay = fromBinary(RetryInfoSchema, d.value).retryDelay;
      if (delay) f.retryAfter = Number(delay.seconds) + delay.nanos / 1e9;
    }
  }
  const message = ce.rawMessage || Code[ce.code];
  if (ce.code === Code.ResourceExhausted && opts.creating) {
    return f.reason === "TARGET_PACED" ? new TargetPaced(message, f) : new NoProxyAvailable(message, f);
  }
  if ((ce.code === Code.NotFound || ce.code === Code.FailedPrecondition) && opts.leaseId) {
    return new LeaseGone(message, opts.leaseId, f);
  }
  if (ce.code === Code.Unauthenticated) return new Unauthenticated(message, f);
  if (ce.code === Code.InvalidArgument) return new InvalidRequest(message, f);
  return new EgressProxiesError(message, f);
}
