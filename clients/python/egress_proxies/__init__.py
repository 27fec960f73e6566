"""Python client of egress-proxies' lease API: lease a healthy proxy for a
target, renew it while you crawl, report how the target treated it,
release it; plus a Scrapy downloader middleware
(``egress_proxies.scrapy.EgressProxiesMiddleware``).

Blocking: ``egress_proxies.Client``; asyncio: ``egress_proxies.aio.AsyncClient``.
"""
from ._core import BLOCKED, DELETE, ERROR, OK, RATE_LIMITED, RESULTS, SYNCED, TARGET_ERROR, UPSERT, Proxy, ProxyEvent, Report
from ._version import API_VERSION, __version__
from .client import Client, Lease
from .errors import EgressProxiesError, InvalidRequest, LeaseGone, NoProxyAvailable, TargetPaced, Unauthenticated
from .policy import BanPolicy

__all__ = [
    "API_VERSION", "BLOCKED", "BanPolicy", "Client", "DELETE", "ERROR", "EgressProxiesError", "InvalidRequest", "Lease", "LeaseGone",
    "NoProxyAvailable", "OK", "Proxy", "ProxyEvent", "RATE_LIMITED", "RESULTS", "Report", "SYNCED", "TARGET_ERROR", "TargetPaced", "UPSERT", "Unauthenticated",
    "__version__",
]
