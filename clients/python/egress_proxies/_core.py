"""What the sync and asyncio clients share: the address, the request
messages, and what a granted lease is."""
from __future__ import annotations

import dataclasses
import datetime
import logging
import urllib.parse
import uuid
from typing import Dict, Mapping, Optional, Tuple

import grpc

from . import policy as _policy
from ._gen import lease_pb2

from ._results import BLOCKED, ERROR, OK, RATE_LIMITED, RESULTS, TARGET_ERROR  # noqa: F401 (re-exported)

logger = logging.getLogger("egress_proxies")

#: Tries of a call the broker answered UNAVAILABLE (restarting, or its
#: Redis failing over); a CreateLease keeps its request id across them, so
#: a try the broker applied is answered with the same lease. Each retry
#: waits for the channel to be ready again, up to the call's timeout.
ATTEMPTS = 3
BACKOFF = 0.1  # seconds, doubled per try
#: Calls tried again when cut off by their deadline too: a CreateLease
#: keeps its request id, so a try the broker applied answers with the same
#: lease; a release is idempotent. A report is never sent twice.
RETRY_ON_DEADLINE = ("CreateLease", "ReleaseLease")
#: How long cleaning up after an interrupted CreateLease may take, s.
ABANDON_TIMEOUT = 5.0


def retryable(method: str, code: grpc.StatusCode) -> bool:
    return code == grpc.StatusCode.UNAVAILABLE or (code == grpc.StatusCode.DEADLINE_EXCEEDED and method in RETRY_ON_DEADLINE)


@dataclasses.dataclass(frozen=True)
class Target:
    """Where and how to dial the broker, from its URL."""

    address: str
    tls: bool

    @staticmethod
    def parse(url: str) -> "Target":
        """``grpc://host:port`` (plaintext) or ``grpcs://host:port`` (TLS)."""
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("grpc", "grpcs") or not u.hostname or not u.port or u.path not in ("", "/"):
            raise ValueError(f"broker URL {url!r}: want grpc://host:port (plaintext) or grpcs://host:port (TLS)")
        host = f"[{u.hostname}]" if ":" in u.hostname else u.hostname
        return Target(f"{host}:{u.port}", u.scheme == "grpcs")


def channel_credentials(ca_file: Optional[str]) -> grpc.ChannelCredentials:
    """TLS verifying the broker with ca_file's PEM bundle, or the system's roots."""
    roots = None
    if ca_file:
        with open(ca_file, "rb") as f:
            roots = f.read()
    return grpc.ssl_channel_credentials(root_certificates=roots)


def call_metadata(token: Optional[str]) -> Tuple[Tuple[str, str], ...]:
    # Per call rather than as call credentials: gRPC refuses those on a
    # plaintext channel, and a local broker without TLS may still want one.
    return (("authorization", "Bearer " + token),) if token else ()


def create_request(selector: Optional[Mapping[str, str]], target: str, session_key: str, ttl: Optional[float],
                   namespace: str, request_id: Optional[str]) -> lease_pb2.CreateLeaseRequest:
    return lease_pb2.CreateLeaseRequest(
        selector=dict(selector or {}), target=target or "", session_key=session_key or "",
        ttl_seconds=int(ttl or 0), namespace=namespace or "",
        # Fresh per lease wanted, kept across this call's own retries.
        request_id=request_id or str(uuid.uuid4()))


def list_request(selector: Optional[Mapping[str, str]], healthy: Optional[bool], namespace: str,
                 target: str, page_size: int) -> lease_pb2.ListProxiesRequest:
    req = lease_pb2.ListProxiesRequest(selector=dict(selector or {}), namespace=namespace or "", target=target or "",
                                       page_size=page_size)
    if healthy is not None:
        req.healthy = healthy
    return req


def renew_request(lease_id: str, ttl: Optional[float]) -> lease_pb2.RenewLeaseRequest:
    return lease_pb2.RenewLeaseRequest(lease_id=lease_id, ttl_seconds=int(ttl or 0))


@dataclasses.dataclass(frozen=True)
class Proxy:
    """A proxy as the broker lists it."""

    id: str
    ip: str
    port: int
    attributes: Dict[str, str]
    healthy: bool
    lease_count: int
    egress_ip: str
    #: When, in a list naming a target, the proxy cools down for it until.
    cooldown_until: Optional[datetime.datetime]
    quarantined_until: Optional[datetime.datetime]

    @staticmethod
    def from_pb(p: lease_pb2.Proxy) -> "Proxy":
        return Proxy(id=p.id, ip=p.ip, port=p.port, attributes=dict(p.attributes), healthy=p.healthy,
                     lease_count=p.lease_count, egress_ip=p.egress_ip,
                     cooldown_until=_time(p, "cooldown_until"), quarantined_until=_time(p, "quarantined_until"))


def _time(msg, field: str) -> Optional[datetime.datetime]:
    if not msg.HasField(field):
        return None
    return getattr(msg, field).ToDatetime().replace(tzinfo=datetime.timezone.utc)


#: ProxyEvent kinds: the proxy is in the watched set (first set, newly
#: matching or changed); it left the set; the first set has been sent.
UPSERT, DELETE, SYNCED = "upsert", "delete", "synced"
_EVENT_KINDS = {lease_pb2.ProxyEvent.TYPE_UPSERT: UPSERT, lease_pb2.ProxyEvent.TYPE_DELETE: DELETE,
                lease_pb2.ProxyEvent.TYPE_SYNCED: SYNCED}


@dataclasses.dataclass(frozen=True)
class ProxyEvent:
    """One change to a watched set: ``kind`` is UPSERT (``proxy`` as the
    broker lists it), DELETE (``proxy.id`` is the one that left) or SYNCED
    (``proxy`` is None)."""

    kind: str
    proxy: Optional[Proxy]

    @staticmethod
    def from_pb(e: lease_pb2.ProxyEvent) -> "ProxyEvent":
        return ProxyEvent(kind=_EVENT_KINDS[e.type], proxy=Proxy.from_pb(e.proxy) if e.HasField("proxy") else None)


def watch_request(selector: Optional[Mapping[str, str]], healthy: Optional[bool], namespace: str) -> lease_pb2.WatchProxiesRequest:
    req = lease_pb2.WatchProxiesRequest(selector=dict(selector or {}), namespace=namespace or "")
    if healthy is not None:
        req.healthy = healthy
    return req


@dataclasses.dataclass(frozen=True)
class Report:
    """What the broker did about a report (docs/api/ban-aware.md, Ban-aware leasing)."""

    actions: Tuple[str, ...]
    cooldown_until: Optional[datetime.datetime]
    quarantined_until: Optional[datetime.datetime]
    pace_per_second: float

    @staticmethod
    def from_pb(r: lease_pb2.ReportLeaseResponse) -> "Report":
        return Report(actions=tuple(r.actions), cooldown_until=_time(r, "cooldown_until"),
                      quarantined_until=_time(r, "quarantined_until"), pace_per_second=r.pace_per_second)


def check_result(result: str) -> None:
    if result not in RESULTS:
        raise ValueError(f"result {result!r}: want one of {', '.join(RESULTS)}")


def report_request(lease_id: str, result: str, target: str, status_code: int, latency: float) -> lease_pb2.ReportLeaseRequest:
    check_result(result)
    return lease_pb2.ReportLeaseRequest(lease_id=lease_id, result=result, target=target or "", status_code=int(status_code or 0),
                                        latency_ms=max(0, min(3_600_000, int(latency * 1000))))


class Granted:
    """A granted lease's facts, shared by the sync and asyncio leases."""

    def __init__(self, resp: lease_pb2.CreateLeaseResponse, target: str, ttl: Optional[float], policy, exit_failures):
        self.id: str = resp.lease_id
        self.proxy: Proxy = Proxy.from_pb(resp.proxy)
        creds = resp.credentials if resp.HasField("credentials") else None
        #: (username, password) the proxy asks for, or None.
        self.credentials: Optional[Tuple[str, str]] = (creds.username, creds.password) if creds and creds.username else None
        self.target = target
        self.session_moved: bool = resp.session_moved
        self.expires_at: datetime.datetime = resp.expires_at.ToDatetime().replace(tzinfo=datetime.timezone.utc)
        self._ttl = ttl
        self._policy = policy
        self._exit_failures = exit_failures
        self._outcome: Optional[Tuple[str, int]] = None
        self._reported = False
        #: Set when a renewal found the lease gone (a LeaseGone).
        self.lost: Optional[Exception] = None

    @property
    def proxy_url(self) -> str:
        """``http://[user:password@]ip:port``, for any HTTP client's proxy setting."""
        host = f"[{self.proxy.ip}]" if ":" in self.proxy.ip else self.proxy.ip
        auth = ""
        if self.credentials:
            user, password = (urllib.parse.quote(c, safe="") for c in self.credentials)
            auth = f"{user}:{password}@"
        return f"http://{auth}{host}:{self.proxy.port}"

    @property
    def proxies(self) -> Dict[str, str]:
        """``proxy_url`` for both schemes, as requests and httpx take it."""
        return {"http": self.proxy_url, "https": self.proxy_url}

    def set_outcome(self, result: str, status_code: int = 0) -> None:
        """The result the lease reports when its ``with`` block ends, clean or
        not (instead of what the ban policy makes of how it ended)."""
        check_result(result)
        self._outcome = (result, status_code)

    def _exit_outcome(self, exc: Optional[BaseException]) -> Optional[Tuple[str, int]]:
        """What the end of a ``with`` block reports: nothing when the caller
        was cancelled or interrupted; what ``set_outcome`` said; ``ok`` for a
        clean end; for an exception, what the ban policy makes of it
        (``error`` only for a proxy's own failure, nothing for the caller's
        own exceptions)."""
        if isinstance(exc, _policy.CANCELLED):
            return None
        if self._outcome:
            return self._outcome
        if self._reported or self.lost:
            return None
        if exc is None:
            return (OK, 0)
        result = self._policy.classify_exception(exc)
        return (result, 0) if result else None

    def _failed_at_exit(self, what: str, err: BaseException) -> None:
        """A report or release at a block's end failed: logged and counted
        (the client's ``exit_failures``), never raised over what the block
        raised, or over a block that went well."""
        self._exit_failures[what] += 1
        logger.warning("egress-proxies: %s of lease %s at the end of its block failed (%s); %s", what, self.id, err,
                       "it ends at its TTL" if what == "release" else "the outcome is lost")

    def _renew_every(self) -> float:
        left = (self.expires_at - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
        return max(0.5, left / 3)

    def __repr__(self) -> str:
        return f"<Lease {self.id} proxy={self.proxy.id} target={self.target!r}>"
