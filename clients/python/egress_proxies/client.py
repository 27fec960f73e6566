"""The blocking client.

    from egress_proxies import Client

    client = Client("grpc://egress-proxies-broker-grpc.egress-proxies-system:9090", token=token)
    with client.lease({"geo": "eu"}, target="example.com") as lease:
        requests.get("https://example.com/", proxies=lease.proxies)

The ``with`` block renews the lease while it runs, reports ``ok`` when it
ends cleanly (on an exception, what the ban policy makes of it: ``error``
only for the proxy's own failure, ``target_error`` for the site's, nothing
for the caller's own exceptions or an interrupt; or what ``set_outcome``
said), and releases it. A report or release that fails there is logged
and counted in ``Client.exit_failures``, never raised.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Iterator, List, Mapping, Optional

import grpc

from . import _core
from ._core import Granted, Proxy, ProxyEvent, Report
from ._gen import lease_pb2, lease_pb2_grpc
from .errors import EgressProxiesError, LeaseGone, from_rpc_error
from .policy import CANCELLED, BanPolicy


class Client:
    """A connection to the broker's gRPC API; thread-safe."""

    def __init__(self, url: str, *, token: Optional[str] = None, ca_file: Optional[str] = None,
                 timeout: float = 10.0, channel: Optional[grpc.Channel] = None, policy: Optional[BanPolicy] = None):
        target = _core.Target.parse(url)
        if channel is None:
            if target.tls:
                channel = grpc.secure_channel(target.address, _core.channel_credentials(ca_file))
            else:
                channel = grpc.insecure_channel(target.address)
        self._channel = channel
        self._stub = lease_pb2_grpc.LeaseServiceStub(channel)
        self._metadata = _core.call_metadata(token)
        self.timeout = timeout
        #: How a lease block's exception becomes its report.
        self.policy = policy or BanPolicy()
        #: Reports and releases that failed at the end of a lease block
        #: ("report", "release"): logged, counted here, never raised.
        self.exit_failures: collections.Counter = collections.Counter()

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method, request, *, lease_id: str = "", creating: bool = False, timeout: Optional[float] = None):
        delay = _core.BACKOFF
        for attempt in range(_core.ATTEMPTS):
            try:
                # A retry waits for the channel to reconnect (gRPC's own
                # backoff) rather than failing fast on its last error.
                return getattr(self._stub, method)(request, metadata=self._metadata, timeout=timeout or self.timeout,
                                               wait_for_ready=attempt > 0)
            except grpc.RpcError as err:
                if not _core.retryable(method, err.code()) or attempt == _core.ATTEMPTS - 1:
                    raise from_rpc_error(err, lease_id=lease_id, creating=creating) from None
            time.sleep(delay)
            delay *= 2

    def lease(self, selector: Optional[Mapping[str, str]] = None, *, target: str = "", session_key: str = "",
              ttl: Optional[float] = None, namespace: str = "", request_id: Optional[str] = None) -> "Lease":
        """Take a proxy: the least-loaded healthy one matching ``selector`` that
        is not cooling down for ``target`` (a host name). ``session_key``
        keeps the same proxy for every lease with that key while it
        qualifies. Raises NoProxyAvailable (TargetPaced when the target is
        paced) with ``retry_after``."""
        req = _core.create_request(selector, target, session_key, ttl, namespace, request_id)
        try:
            resp = self._call("CreateLease", req, creating=True)
        except CANCELLED:
            self._abandon(req)
            raise
        return Lease(self, resp, target, ttl)

    def _abandon(self, req) -> None:
        """A CreateLease interrupted in flight may have been granted: ask again
        with its request id (the same lease if it was, a new one if not) and
        release what comes back, so no lease is left to its TTL."""
        try:
            resp = self._call("CreateLease", req, creating=True, timeout=_core.ABANDON_TIMEOUT)
            self._call("ReleaseLease", lease_pb2.ReleaseLeaseRequest(lease_id=resp.lease_id), timeout=_core.ABANDON_TIMEOUT)
        except Exception as err:  # noqa: BLE001 (best effort: it ends at its TTL)
            self.exit_failures["abandon"] += 1
            _core.logger.warning("egress-proxies: releasing an interrupted lease request failed (%s); it ends at its TTL", err)

    def list_proxies(self, selector: Optional[Mapping[str, str]] = None, *, healthy: Optional[bool] = None,
                     namespace: str = "", target: str = "", page_size: int = 0) -> List[Proxy]:
        """The proxies the broker knows, filtered, in id order; naming a
        ``target`` fills each one's ``cooldown_until`` for it. Fetched a page
        of ``page_size`` at a time (0: the broker's, 500), every page."""
        req = _core.list_request(selector, healthy, namespace, target, page_size)
        out: List[Proxy] = []
        while True:
            resp = self._call("ListProxies", req)
            out.extend(Proxy.from_pb(p) for p in resp.proxies)
            if not resp.next_page_token:
                return out
            req.page_token = resp.next_page_token

    def watch_proxies(self, selector: Optional[Mapping[str, str]] = None, *, healthy: Optional[bool] = None,
                      namespace: str = "") -> Iterator[ProxyEvent]:
        """The proxies ``list_proxies`` lists for the same filters, then their
        changes: an UPSERT event for each, one SYNCED, then UPSERT and DELETE
        events as the set changes, until the watch ends (the broker stops,
        or the watcher fell behind: an EgressProxiesError is raised; watch
        again and let the new first set replace what you kept). Closing the
        iterator (``break``) ends the watch."""
        call = self._stub.WatchProxies(_core.watch_request(selector, healthy, namespace), metadata=self._metadata)
        try:
            for resp in call:
                for e in resp.events:
                    yield ProxyEvent.from_pb(e)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.CANCELLED:
                raise from_rpc_error(err) from None
        finally:
            call.cancel()


class Lease(Granted):
    """A live lease. As a context manager it renews itself in a thread while
    the block runs, reports its outcome and releases at the end."""

    def __init__(self, client: Client, resp, target: str, ttl: Optional[float]):
        super().__init__(resp, target, ttl, client.policy, client.exit_failures)
        self._client = client
        self._stop = threading.Event()
        self._renewer: Optional[threading.Thread] = None
        self._released = False
        self._entered = 0.0

    def renew(self, ttl: Optional[float] = None) -> None:
        """Extend the lease by ``ttl`` seconds from now (None: as leased).
        Raises LeaseGone once it cannot be renewed."""
        resp = self._client._call("RenewLease", _core.renew_request(self.id, ttl or self._ttl),
                                  lease_id=self.id)
        self.expires_at = resp.expires_at.ToDatetime().replace(tzinfo=self.expires_at.tzinfo)

    def report(self, result: str, *, target: str = "", status_code: int = 0, latency: float = 0.0) -> Report:
        """Tell the broker how the target treated the proxy (``ok``,
        ``rate_limited``, ``blocked``, ``error``) and hear what it did."""
        req = _core.report_request(self.id, result, target, status_code, latency)
        resp = self._client._call("ReportLease", req, lease_id=self.id)
        self._reported = True
        return Report.from_pb(resp)

    def release(self) -> None:
        """End the lease; calling it again is harmless."""
        self._stop.set()
        if self._renewer and self._renewer is not threading.current_thread():
            self._renewer.join()
        if self._released:
            return
        self._client._call("ReleaseLease", lease_pb2.ReleaseLeaseRequest(lease_id=self.id))
        self._released = True

    def _renew_loop(self) -> None:
        while not self._stop.wait(self._renew_every()):
            try:
                self.renew()
            except LeaseGone as gone:
                self.lost = gone
                return
            except EgressProxiesError:
                continue  # transient: the next tick tries again, well before expiry

    def keep_alive(self) -> None:
        """Renew in a thread until release (what ``with`` does)."""
        if self._renewer is None:
            self._renewer = threading.Thread(target=self._renew_loop, name=f"renew-{self.id}", daemon=True)
            self._renewer.start()

    def __enter__(self) -> "Lease":
        self._entered = time.monotonic()
        self.keep_alive()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop.set()
        self._renewer.join()
        outcome = self._exit_outcome(exc)
        if outcome:
            try:
                self.report(outcome[0], status_code=outcome[1], latency=time.monotonic() - self._entered)
            except LeaseGone:
                pass  # it ended under us; nothing to say about it
            except Exception as err:  # noqa: BLE001 (never over the block's own outcome)
                self._failed_at_exit("report", err)
        try:
            self.release()
        except Exception as err:  # noqa: BLE001
            self._failed_at_exit("release", err)
