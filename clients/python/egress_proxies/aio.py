"""The asyncio client (grpc.aio), for asyncio code and Scrapy's asyncio
reactor.

    from egress_proxies.aio import AsyncClient

    async with AsyncClient("grpc://egress-proxies-broker-grpc.egress-proxies-system:9090", token=token) as client:
        async with client.lease({"geo": "eu"}, target="example.com") as lease:
            ...  # fetch through lease.proxy_url
"""
from __future__ import annotations

import asyncio
import collections
import time
from typing import AsyncIterator, List, Mapping, Optional, Set

import grpc
import grpc.aio

from . import _core
from ._core import Granted, Proxy, ProxyEvent, Report
from ._gen import lease_pb2, lease_pb2_grpc
from .errors import EgressProxiesError, LeaseGone, from_rpc_error
from .policy import CANCELLED, BanPolicy


class AsyncClient:
    """A connection to the broker's gRPC API, for one event loop."""

    def __init__(self, url: str, *, token: Optional[str] = None, ca_file: Optional[str] = None, timeout: float = 10.0,
                 policy: Optional[BanPolicy] = None):
        target = _core.Target.parse(url)
        if target.tls:
            self._channel = grpc.aio.secure_channel(target.address, _core.channel_credentials(ca_file))
        else:
            self._channel = grpc.aio.insecure_channel(target.address)
        self._stub = lease_pb2_grpc.LeaseServiceStub(self._channel)
        self._metadata = _core.call_metadata(token)
        self.timeout = timeout
        #: As Client.policy and Client.exit_failures.
        self.policy = policy or BanPolicy()
        self.exit_failures: collections.Counter = collections.Counter()
        self._abandoning: Set[asyncio.Task] = set()

    async def close(self) -> None:
        if self._abandoning:
            await asyncio.gather(*self._abandoning, return_exceptions=True)
        await self._channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _call(self, method, request, *, lease_id: str = "", creating: bool = False, timeout: Optional[float] = None):
        delay = _core.BACKOFF
        for attempt in range(_core.ATTEMPTS):
            try:
                # A retry waits for the channel to reconnect (gRPC's own
                # backoff) rather than failing fast on its last error.
                return await getattr(self._stub, method)(request, metadata=self._metadata, timeout=timeout or self.timeout,
                                                     wait_for_ready=attempt > 0)
            except grpc.aio.AioRpcError as err:
                if not _core.retryable(method, err.code()) or attempt == _core.ATTEMPTS - 1:
                    raise from_rpc_error(err, lease_id=lease_id, creating=creating) from None
            await asyncio.sleep(delay)
            delay *= 2

    def lease(self, selector: Optional[Mapping[str, str]] = None, *, target: str = "", session_key: str = "",
              ttl: Optional[float] = None, namespace: str = "", request_id: Optional[str] = None) -> "_Pending":
        """As Client.lease: ``await client.lease(...)`` for an AsyncLease, or
        ``async with client.lease(...) as lease`` for one that renews,
        reports and releases itself."""
        req = _core.create_request(selector, target, session_key, ttl, namespace, request_id)
        return _Pending(self, req, target, ttl)

    async def _create(self, req, target, ttl) -> "AsyncLease":
        try:
            resp = await self._call("CreateLease", req, creating=True)
        except CANCELLED:
            # The broker may have granted it: clean up in a task of its
            # own, which the cancellation does not reach (close() awaits it).
            task = asyncio.ensure_future(self._abandon(req))
            self._abandoning.add(task)
            task.add_done_callback(self._abandoning.discard)
            raise
        return AsyncLease(self, resp, target, ttl)

    async def _abandon(self, req) -> None:
        """As Client._abandon: ask again with the request id, release what
        comes back."""
        try:
            resp = await self._call("CreateLease", req, creating=True, timeout=_core.ABANDON_TIMEOUT)
            await self._call("ReleaseLease", lease_pb2.ReleaseLeaseRequest(lease_id=resp.lease_id), timeout=_core.ABANDON_TIMEOUT)
        except Exception as err:  # noqa: BLE001 (best effort: it ends at its TTL)
            self.exit_failures["abandon"] += 1
            _core.logger.warning("egress-proxies: releasing an interrupted lease request failed (%s); it ends at its TTL", err)

    async def list_proxies(self, selector: Optional[Mapping[str, str]] = None, *, healthy: Optional[bool] = None,
                           namespace: str = "", target: str = "", page_size: int = 0) -> List[Proxy]:
        """As Client.list_proxies: every page."""
        req = _core.list_request(selector, healthy, namespace, target, page_size)
        out: List[Proxy] = []
        while True:
            resp = await self._call("ListProxies", req)
            out.extend(Proxy.from_pb(p) for p in resp.proxies)
            if not resp.next_page_token:
                return out
            req.page_token = resp.next_page_token

    async def watch_proxies(self, selector: Optional[Mapping[str, str]] = None, *, healthy: Optional[bool] = None,
                            namespace: str = "") -> AsyncIterator[ProxyEvent]:
        """As Client.watch_proxies: ``async for event in client.watch_proxies(...)``."""
        call = self._stub.WatchProxies(_core.watch_request(selector, healthy, namespace), metadata=self._metadata)
        try:
            async for resp in call:
                for e in resp.events:
                    yield ProxyEvent.from_pb(e)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.CANCELLED:
                raise from_rpc_error(err) from None
        finally:
            call.cancel()


class _Pending:
    """A lease being asked for: awaitable, or an async context manager."""

    def __init__(self, client: AsyncClient, req, target, ttl):
        self._args = (req, target, ttl)
        self._client = client
        self._lease: Optional[AsyncLease] = None

    def __await__(self):
        return self._client._create(*self._args).__await__()

    async def __aenter__(self) -> "AsyncLease":
        self._lease = await self._client._create(*self._args)
        return await self._lease.__aenter__()

    async def __aexit__(self, exc_type, exc, tb) -> None:
        await self._lease.__aexit__(exc_type, exc, tb)


class AsyncLease(Granted):
    """A live lease; as an async context manager it renews itself in a task."""

    def __init__(self, client: AsyncClient, resp, target: str, ttl: Optional[float]):
        super().__init__(resp, target, ttl, client.policy, client.exit_failures)
        self._client = client
        self._renewer: Optional[asyncio.Task] = None
        self._released = False
        self._entered = 0.0

    async def renew(self, ttl: Optional[float] = None) -> None:
        resp = await self._client._call("RenewLease", _core.renew_request(self.id, ttl or self._ttl),
                                        lease_id=self.id)
        self.expires_at = resp.expires_at.ToDatetime().replace(tzinfo=self.expires_at.tzinfo)

    async def report(self, result: str, *, target: str = "", status_code: int = 0, latency: float = 0.0) -> Report:
        req = _core.report_request(self.id, result, target, status_code, latency)
        resp = await self._client._call("ReportLease", req, lease_id=self.id)
        self._reported = True
        return Report.from_pb(resp)

    async def release(self) -> None:
        await self._stop_renewing()
        if self._released:
            return
        await self._client._call("ReleaseLease", lease_pb2.ReleaseLeaseRequest(lease_id=self.id))
        self._released = True

    def keep_alive(self) -> None:
        """Renew in the background until release (what ``async with`` does)."""
        if self._renewer is None:
            self._renewer = asyncio.ensure_future(self._renew_loop())

    async def _stop_renewing(self) -> None:
        if self._renewer and self._renewer is not asyncio.current_task():
            self._renewer.cancel()
            try:
                await self._renewer
            except asyncio.CancelledError:
                pass

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self._renew_every())
            try:
                await self.renew()
            except LeaseGone as gone:
                self.lost = gone
                return
            except EgressProxiesError:
                continue

    async def __aenter__(self) -> "AsyncLease":
        self._entered = time.monotonic()
        self.keep_alive()
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        await self._stop_renewing()
        outcome = self._exit_outcome(exc)
        if outcome:
            try:
                await self.report(outcome[0], status_code=outcome[1], latency=time.monotonic() - self._entered)
            except LeaseGone:
                pass
            except Exception as err:  # noqa: BLE001 (never over the block's own outcome)
                self._failed_at_exit("report", err)
        try:
            await self.release()
        except Exception as err:  # noqa: BLE001
            self._failed_at_exit("release", err)
