"""Whose fault it was: how a response or an exception through a leased
proxy becomes a report result.

One table for every client of this project (this package, the Node
client, the broker's gateway): ``pkg/faults/table.json``, documented in
docs/api/clients.md ("Whose fault"); this package's suite runs that table's cases
against ``BanPolicy`` and fails when they differ. Override it the way
scrapy-rotating-proxies' BanDetectionPolicy is overridden: subclass
``BanPolicy`` and name it in ``EGRESS_PROXIES_BAN_POLICY``.

A proxy is blamed (``error``) only for what happens on its own hop: the
client could not connect to it, it refused the credentials (a 407 with its
challenge), or it refused a CONNECT itself. What a site does through a
working proxy (refused, reset, timed out, failed TLS, a 5xx) is the site's
(``target_error``), which never counts against the proxy. The caller's own
exceptions, and cancellation, report nothing.
"""
from __future__ import annotations

import asyncio
import re
from typing import Iterator, Mapping, Optional

from ._results import BLOCKED, ERROR, OK, RATE_LIMITED, TARGET_ERROR

#: Words of block and captcha pages, searched in a response's first 64 KiB
#: (the table's ``blockMarkers``).
MARKERS = ("captcha", "g-recaptcha", "h-captcha", "cf-chl-", "challenge-platform", "access denied", "are you a robot",
           "unusual traffic", "request blocked", "you have been blocked", "bot detection")
BLOCK_MARKERS = re.compile("|".join(re.escape(m) for m in MARKERS).encode(), re.IGNORECASE)
SCAN = 64 * 1024

#: Whose fault a proxy's non-2xx answer to CONNECT is, by status (the
#: table's ``connectStatus``); any other status is the proxy's.
CONNECT_STATUS = {403: "caller", 407: "proxy", 502: "site", 503: "site", 504: "site"}
_CLASS_RESULT = {"proxy": ERROR, "site": TARGET_ERROR}

#: Exceptions that say the client never got through to the proxy (it only
#: ever dials the proxy): requests', urllib3's, aiohttp's, httpx's,
#: Twisted's and the standard library's names for a refused or timed-out
#: connect.
PROXY_FAILURES = frozenset({
    "ProxyError", "ClientProxyConnectionError", "ProxyConnectionError", "ConnectTimeout", "ConnectTimeoutError",
    "ConnectionRefusedError", "TCPTimedOutError", "NoRouteError", "ConnectError", "NewConnectionError",
})
# ConnectTimeout is requests' and httpx's connect timeout (to the proxy);
# ConnectError httpx's and Twisted's refused connect (to the proxy).
#: Exceptions of a request that reached the proxy and failed past it: the
#: site's doing. Any other OSError is too.
SITE_FAILURES = frozenset({
    "SSLError", "ClientSSLError", "ClientConnectorSSLError", "ClientConnectorCertificateError", "ReadTimeout", "ReadTimeoutError",
    "TimeoutError", "ServerTimeoutError", "ResponseNeverReceived", "ResponseFailed", "ConnectionLost", "ConnectionDone",
    "ServerDisconnectedError", "RemoteProtocolError", "ReadError", "ChunkedEncodingError", "ContentDecodingError",
    "IncompleteRead", "ProtocolError", "DNSLookupError",
})
#: Never a verdict on anyone: the caller stopped.
CANCELLED = (asyncio.CancelledError, KeyboardInterrupt, SystemExit, GeneratorExit)

_TUNNEL_STATUS = re.compile(r"(?:Tunnel connection failed: |'status': |CONNECT tunnel failed, response |status=)(\d{3})")


class BanPolicy:
    """The default policy (docs/api/clients.md, "Whose fault"):

    * 407 with a ``Proxy-Authenticate`` challenge is ``error``: the proxy
      refused its credentials (proxies never pass a site's challenge on);
    * 429, and 503 with ``Retry-After``, are ``rate_limited``;
    * 403, and any page carrying a captcha or block marker, are ``blocked``;
    * any other 5xx is ``target_error``: the site failed, not the proxy;
    * everything else is ``ok``. A Squid error header on a response is
      not trusted: a site can send one.
    """

    def classify(self, status: int, headers: Mapping[str, str], body: bytes = b"") -> str:
        """The result for a response. ``headers`` is looked up case-insensitively
        by the callers' header types (Scrapy's, requests', a dict of
        lower-case names)."""
        if status == 407 and _header(headers, "Proxy-Authenticate"):
            return ERROR
        if status == 429 or (status == 503 and _header(headers, "Retry-After")):
            return RATE_LIMITED
        if status == 403 or BLOCK_MARKERS.search(body[:SCAN] if body else b""):
            return BLOCKED
        if status >= 500:
            return TARGET_ERROR
        return OK

    def classify_connect(self, status: int) -> Optional[str]:
        """The result for a proxy's non-2xx answer to CONNECT: ``error`` when
        the proxy failed itself, ``target_error`` when it could not reach
        the site, None when its policy refused the destination."""
        return _CLASS_RESULT.get(CONNECT_STATUS.get(status, "proxy"))

    def classify_exception(self, exc: BaseException) -> Optional[str]:
        """The result for a request that raised ``exc``: ``error`` when it
        never got through to the proxy (or the proxy refused the tunnel
        itself), ``target_error`` when it failed past the proxy (TLS, a
        reset, a read timeout, a CONNECT the proxy could not open to the
        site), None for the caller's own exceptions and cancellation: no
        verdict on the proxy."""
        if isinstance(exc, CANCELLED):
            return None
        for e in _chain(exc):
            status = _tunnel_status(e)
            if status:
                return self.classify_connect(status)
            names = {c.__name__ for c in type(e).__mro__}
            # The site's names first: where a library's name says both (a
            # timeout that is a ConnectError), the proxy is not blamed.
            if names & SITE_FAILURES:
                return TARGET_ERROR
            if names & PROXY_FAILURES:
                return ERROR
            if isinstance(e, OSError):
                return TARGET_ERROR
        return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """exc, then what it wraps (``raise ... from``, urllib3's ``reason``,
    Twisted's ``reasons``), each once."""
    seen, todo = set(), [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen or not isinstance(e, BaseException):
            continue
        seen.add(id(e))
        yield e
        todo += [e.__cause__, e.__context__, getattr(e, "reason", None)]
        todo += [getattr(r, "value", r) for r in getattr(e, "reasons", None) or ()]
        todo += [a for a in e.args if isinstance(a, BaseException)]


def _tunnel_status(e: BaseException) -> int:
    status = getattr(e, "status", None)
    if isinstance(status, int) and type(e).__name__ in ("ClientHttpProxyError", "TunnelError", "ProxyError"):
        return status
    if type(e).__name__ in ("TunnelError", "ProxyError", "OSError", "ClientHttpProxyError") or "tunnel" in str(e).lower():
        m = _TUNNEL_STATUS.search(str(e))
        if m:
            return int(m.group(1))
    return 0


def _header(headers: Mapping[str, str], name: str) -> Optional[str]:
    # Scrapy's and requests' header types ignore case; a plain dict may
    # carry either spelling.
    for key in (name, name.lower()):
        value = headers.get(key)
        if value:
            return value.decode() if isinstance(value, bytes) else value
    return None
