"""How a response or an error through a proxy becomes a report result.

One default for every client of this project (this package, the Node
client, the broker's gateway), documented in docs/api.md ("Outcomes"), and
overridable the way scrapy-rotating-proxies' BanDetectionPolicy is:
subclass ``BanPolicy`` and name it in ``EGRESS_PROXIES_BAN_POLICY``.
"""
from __future__ import annotations

import re
from typing import Mapping, Optional

from ._core import BLOCKED, ERROR, OK, RATE_LIMITED

#: Words of block and captcha pages, searched in a response's first 64 KiB.
BLOCK_MARKERS = re.compile(
    rb"captcha|g-recaptcha|h-captcha|cf-chl-|challenge-platform|access denied|are you a robot|"
    rb"unusual traffic|request blocked|you have been blocked|bot detection",
    re.IGNORECASE)
SCAN = 64 * 1024


class BanPolicy:
    """The default policy:

    * a Squid error page (``X-Squid-Error``: the proxy could not reach the
      site, or refused to) is ``error``, the proxy's fault;
    * 429 is ``rate_limited``; so is 503 with ``Retry-After``;
    * 403, and 503 carrying a block marker, are ``blocked``;
    * any other page carrying a captcha or block marker is ``blocked``;
    * everything else is ``ok``: the site answered, and a 404 or a 500 is
      the site's business, not a verdict on the proxy.
    """

    def classify(self, status: int, headers: Mapping[str, str], body: bytes = b"") -> str:
        """The result for a response. ``headers`` is looked up case-insensitively
        by the callers' header types (Scrapy's, requests', a dict of
        lower-case names)."""
        if _header(headers, "X-Squid-Error"):
            return ERROR
        if status == 429 or (status == 503 and _header(headers, "Retry-After")):
            return RATE_LIMITED
        if status == 403:
            return BLOCKED
        if BLOCK_MARKERS.search(body[:SCAN] if body else b""):
            return BLOCKED
        return OK

    def classify_exception(self, exc: BaseException) -> Optional[str]:
        """The result for a request that failed in the proxy (refused, reset,
        timed out, a CONNECT the proxy refused): ``error``. None leaves the
        exception unreported."""
        return ERROR


def _header(headers: Mapping[str, str], name: str) -> Optional[str]:
    # Scrapy's and requests' header types ignore case; a plain dict may
    # carry either spelling.
    for key in (name, name.lower()):
        value = headers.get(key)
        if value:
            return value.decode() if isinstance(value, bytes) else value
    return None
