"""Typed errors of the lease API.

Every error the broker answers with becomes an ``EgressProxiesError`` that
carries the gRPC code, the broker's ``ErrorInfo`` reason and metadata, and
``RetryInfo`` as ``retry_after`` (seconds), so callers branch on types
and fields, never on messages.
"""
from __future__ import annotations

from typing import Mapping, Optional

import grpc

from ._gen import rpc_status_pb2

_DETAILS = "grpc-status-details-bin"


class EgressProxiesError(Exception):
    """An error the broker answered with (or the call could not reach it)."""

    def __init__(self, message: str, *, code: Optional[grpc.StatusCode] = None, reason: str = "",
                 metadata: Optional[Mapping[str, str]] = None, retry_after: Optional[float] = None):
        super().__init__(message)
        self.message = message
        self.code = code
        #: ErrorInfo.reason, e.g. ALL_COOLING_DOWN (docs/api/errors-and-metrics.md, Errors).
        self.reason = reason
        self.metadata = dict(metadata or {})
        #: Seconds the broker asks the caller to wait, when it says.
        self.retry_after = retry_after


class NoProxyAvailable(EgressProxiesError):
    """No proxy qualifies now (none matches, all cool down for the target,
    all at their cap, the token at its cap, ...): retry after
    ``retry_after`` seconds or widen the selector. ``reason`` says which."""


class TargetPaced(NoProxyAvailable):
    """The target is paced fleet-wide (it rate-limited more of the fleet than
    its cooling limit allows) and its next lease is due in ``retry_after``
    seconds."""


class LeaseGone(EgressProxiesError):
    """The lease expired, was released, or its proxy left the leasable set
    (``reason``: PROXY_GONE, PROXY_UNHEALTHY, ...; empty when it expired)."""

    def __init__(self, message: str, *, lease_id: str = "", **kw):
        super().__init__(message, **kw)
        self.lease_id = lease_id


class Unauthenticated(EgressProxiesError):
    """The broker refused the token (missing or wrong)."""


class InvalidRequest(EgressProxiesError, ValueError):
    """The broker refused an argument; the message names the field."""


def _details(err: grpc.RpcError):
    reason, metadata, retry_after = "", {}, None
    for key, value in err.trailing_metadata() or ():
        if key != _DETAILS:
            continue
        status = rpc_status_pb2.Status.FromString(value)
        for any_ in status.details:
            name = any_.type_url.rsplit("/", 1)[-1]
            if name == "google.rpc.ErrorInfo":
                info = rpc_status_pb2.ErrorInfo.FromString(any_.value)
                reason, metadata = info.reason, dict(info.metadata)
            elif name == "google.rpc.RetryInfo":
                delay = rpc_status_pb2.RetryInfo.FromString(any_.value).retry_delay
                retry_after = delay.seconds + delay.nanos / 1e9
    return reason, metadata, retry_after


def from_rpc_error(err: grpc.RpcError, *, lease_id: str = "", creating: bool = False) -> EgressProxiesError:
    """The typed error for a failed call (``creating``: a CreateLease)."""
    code = err.code()
    message = err.details() or str(code)
    reason, metadata, retry_after = _details(err)
    kw = dict(code=code, reason=reason, metadata=metadata, retry_after=retry_after)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and creating:
        if reason == "TARGET_PACED":
            return TargetPaced(message, **kw)
        return NoProxyAvailable(message, **kw)
    if code in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION) and lease_id:
        return LeaseGone(message, lease_id=lease_id, **kw)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return Unauthenticated(message, **kw)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidRequest(message, **kw)
    return EgressProxiesError(message, **kw)
