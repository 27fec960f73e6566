"""A Scrapy downloader middleware that sends every request through a proxy
leased from egress-proxies for the request's host.

Enable it with settings alone (it needs Scrapy's asyncio reactor)::

    TWISTED_REACTOR = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"
    DOWNLOADER_MIDDLEWARES = {"egress_proxies.scrapy.EgressProxiesMiddleware": 610}
    EGRESS_PROXIES_URL = "grpc://egress-proxies-broker-grpc.egress-proxies-system:9090"
    EGRESS_PROXIES_TOKEN = os.environ["EGRESS_PROXIES_TOKEN"]
    EGRESS_PROXIES_SELECTOR = {"geo": "eu"}

Per request it leases a proxy for the request's host (``target``), or
reuses the lease of ``request.meta["egress_session"]`` (one per session and
host, sticky through the broker's session key), sets ``meta["proxy"]``
with the proxy's credentials (Scrapy's HttpProxyMiddleware, at 750, turns
them into Proxy-Authorization), classifies the response with the ban
policy, reports the result, and releases; a download that raised is
reported as the policy's ``classify_exception`` judges it (``error`` only
when the proxy itself failed, ``target_error`` when the site did). A ``rate_limited`` or
``blocked`` response is retried through another proxy (the broker now
cools the first one down for the host, for every crawler of the fleet);
a refusal (no proxy qualifies, the host is paced) reschedules the request
after the broker's Retry-After instead of failing it.

Settings (``EGRESS_PROXIES_``...): ``URL`` (required; ``grpc://`` or
``grpcs://``), ``TOKEN`` or ``TOKEN_FILE``, ``CA_FILE``, ``SELECTOR`` (a
dict), ``NAMESPACE``, ``BAN_POLICY`` (import path of a ``BanPolicy``
subclass), ``TTL`` (60 s), ``MAX_WAIT`` (the longest Retry-After honoured
at once, 60 s), ``MAX_REFUSALS`` (reschedules before a request is dropped,
30), ``BAN_RETRIES`` (5), ``SESSION_IDLE`` (a session's lease is released
after this long unused, 60 s). ``meta["egress_proxies"] = False`` sends a
request without a proxy; a ``meta["proxy"]`` you set yourself is left
alone. Stats go to Scrapy's collector under ``egress_proxies/``.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Dict, Optional, Tuple

from scrapy import signals
from scrapy.exceptions import IgnoreRequest, NotConfigured
from scrapy.utils.defer import deferred_from_coro
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.misc import load_object
from scrapy.utils.reactor import is_asyncio_reactor_installed

from ._core import BLOCKED, OK, RATE_LIMITED, TARGET_ERROR
from .aio import AsyncClient, AsyncLease
from .errors import EgressProxiesError, NoProxyAvailable

logger = logging.getLogger(__name__)

_LEASE, _PROXY, _STARTED = "_egress_lease", "_egress_proxy", "_egress_started"
_REFUSALS, _BANS = "_egress_refusals", "_egress_bans"


class _Session:
    """The lease one session holds for one host, and who is using it."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.lease: Optional[AsyncLease] = None
        self.users = 0
        self.last_used = time.monotonic()


class EgressProxiesMiddleware:
    def __init__(self, crawler, url: str, token: Optional[str], ca_file: Optional[str], selector: Dict[str, str],
                 namespace: str, policy, ttl: float, max_wait: float, max_refusals: int, ban_retries: int, session_idle: float):
        self.crawler, self.stats = crawler, crawler.stats
        self._client_args = dict(url=url, token=token, ca_file=ca_file)
        self.selector, self.namespace, self.policy = selector, namespace, policy
        self.ttl, self.max_wait, self.max_refusals, self.ban_retries = ttl, max_wait, max_refusals, ban_retries
        self.session_idle = session_idle
        self._client: Optional[AsyncClient] = None
        self._sessions: Dict[Tuple[str, str], _Session] = {}
        self._sweeper: Optional[asyncio.Task] = None

    @classmethod
    def from_crawler(cls, crawler):
        s = crawler.settings
        url = s.get("EGRESS_PROXIES_URL")
        if not url:
            raise NotConfigured("EGRESS_PROXIES_URL is not set")
        if not is_asyncio_reactor_installed():
            raise RuntimeError("egress_proxies.scrapy.EgressProxiesMiddleware needs the asyncio reactor: set "
                               'TWISTED_REACTOR = "twisted.internet.asyncioreactor.AsyncioSelectorReactor"')
        token = s.get("EGRESS_PROXIES_TOKEN")
        if not token and s.get("EGRESS_PROXIES_TOKEN_FILE"):
            with open(s.get("EGRESS_PROXIES_TOKEN_FILE")) as f:
                token = f.readline().strip()
        policy_cls = load_object(s.get("EGRESS_PROXIES_BAN_POLICY") or "egress_proxies.policy.BanPolicy")
        mw = cls(crawler, url, token, s.get("EGRESS_PROXIES_CA_FILE"), s.getdict("EGRESS_PROXIES_SELECTOR"),
                 s.get("EGRESS_PROXIES_NAMESPACE", ""), policy_cls(), s.getfloat("EGRESS_PROXIES_TTL", 60),
                 s.getfloat("EGRESS_PROXIES_MAX_WAIT", 60), s.getint("EGRESS_PROXIES_MAX_REFUSALS", 30),
                 s.getint("EGRESS_PROXIES_BAN_RETRIES", 5), s.getfloat("EGRESS_PROXIES_SESSION_IDLE", 60))
        crawler.signals.connect(mw.spider_closed, signal=signals.spider_closed)
        return mw

    def _inc(self, key: str, n: int = 1) -> None:
        self.stats.inc_value("egress_proxies/" + key, n)

    def _get_client(self) -> AsyncClient:
        # Made in the running loop, which grpc.aio binds it to.
        if self._client is None:
            self._client = AsyncClient(**self._client_args)
            self._sweeper = asyncio.ensure_future(self._sweep())
        return self._client

    # Requests

    async def process_request(self, request, spider):
        if request.meta.get("egress_proxies") is False or _LEASE in request.meta:
            return None
        if "proxy" in request.meta and _PROXY not in request.meta:
            return None  # a proxy the spider chose
        _forget_proxy(request)
        target = urlparse_cached(request).hostname or ""
        try:
            lease = await self._acquire(target, request.meta.get("egress_session"))
        except NoProxyAvailable as refused:
            return await self._refused(request, refused)
        request.meta[_LEASE], request.meta[_PROXY], request.meta[_STARTED] = lease, lease.proxy_url, time.monotonic()
        request.meta["proxy"] = lease.proxy_url
        return None

    async def _acquire(self, target: str, session: Optional[str]) -> AsyncLease:
        client = self._get_client()
        if not session:
            lease = await client.lease(self.selector, target=target, ttl=self.ttl, namespace=self.namespace)
            lease.keep_alive()
            self._inc("leases")
            return lease
        s = self._sessions.setdefault((str(session), target), _Session())
        async with s.lock:
            if s.lease is None or s.lease.lost:
                s.lease = await client.lease(self.selector, target=target, ttl=self.ttl, namespace=self.namespace,
                                             session_key=_session_key(session))
                s.lease.keep_alive()
                self._inc("leases")
                if s.lease.session_moved:
                    self._inc("session_moved")
            s.users += 1
            s.last_used = time.monotonic()
            return s.lease

    async def _refused(self, request, refused: NoProxyAvailable):
        self._inc("refused/" + (refused.reason or "UNKNOWN"))
        n = request.meta.get(_REFUSALS, 0) + 1
        if n > self.max_refusals:
            self._inc("gave_up")
            raise IgnoreRequest(f"egress-proxies refused {n} times: {refused.message}")
        await asyncio.sleep(min(refused.retry_after or 1.0, self.max_wait))
        self._inc("rescheduled")
        retry = request.replace(dont_filter=True)
        retry.meta[_REFUSALS] = n
        return retry

    # Outcomes

    async def process_response(self, request, response, spider):
        lease = request.meta.pop(_LEASE, None)
        if lease is None:
            return response
        result = self.policy.classify(response.status, response.headers, response.body)
        await self._done(request, lease, result, response.status)
        if result not in (RATE_LIMITED, BLOCKED):
            return response
        n = request.meta.get(_BANS, 0) + 1
        if n > self.ban_retries:
            self._inc("ban_retries_exhausted")
            return response
        self._inc("retried_after_ban")
        retry = request.replace(dont_filter=True)
        retry.meta[_BANS] = n
        _forget_proxy(retry)
        return retry

    async def process_exception(self, request, exception, spider):
        lease = request.meta.pop(_LEASE, None)
        if lease is not None:
            await self._done(request, lease, self.policy.classify_exception(exception), 0)
        return None  # RetryMiddleware decides, and the retry leases anew

    async def _done(self, request, lease: AsyncLease, result: Optional[str], status: int) -> None:
        latency = time.monotonic() - request.meta.pop(_STARTED, time.monotonic())
        if result:
            self._inc("outcome/" + result)
            try:
                await lease.report(result, status_code=status, latency=latency)
            except EgressProxiesError as err:
                self._inc("report_failed")
                logger.warning("egress-proxies: reporting %s on lease %s failed: %s", result, lease.id, err)
        session = request.meta.get("egress_session")
        s = self._sessions.get((str(session), lease.target)) if session else None
        if s is not None and s.lease is lease:
            s.users -= 1
            s.last_used = time.monotonic()
            if result in (None, OK, TARGET_ERROR) and not lease.lost:
                return  # the session keeps its proxy: it did not fail it
            s.lease = None  # the next request of the session moves on
            if s.users > 0:
                return  # whoever still uses it releases it
        await self._release(lease)

    async def _release(self, lease: AsyncLease) -> None:
        try:
            await lease.release()
            self._inc("released")
        except EgressProxiesError as err:
            self._inc("release_failed")
            logger.warning("egress-proxies: releasing lease %s failed (it ends at its TTL): %s", lease.id, err)

    # Sessions and shutdown

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(max(1.0, self.session_idle / 2))
            now = time.monotonic()
            for key, s in list(self._sessions.items()):
                if s.users == 0 and now - s.last_used > self.session_idle:
                    del self._sessions[key]
                    if s.lease is not None:
                        await self._release(s.lease)

    def spider_closed(self, spider):
        return deferred_from_coro(self._close())

    async def _close(self) -> None:
        if self._sweeper:
            self._sweeper.cancel()
        for s in self._sessions.values():
            if s.lease is not None:
                await self._release(s.lease)
        self._sessions.clear()
        if self._client is not None:
            await self._client.close()


def _forget_proxy(request) -> None:
    """Drop what an earlier attempt's lease left on the request."""
    if request.meta.pop(_PROXY, None) is not None:
        request.meta.pop("proxy", None)
        request.meta.pop("_auth_proxy", None)
        request.headers.pop(b"Proxy-Authorization", None)


def _session_key(session) -> str:
    # The broker takes 1-128 of [A-Za-z0-9_.:-]; a spider's session may be
    # any string.
    key = "".join(c if c.isalnum() or c in "_.:-" else "_" for c in str(session))[:128]
    return key or "_"
