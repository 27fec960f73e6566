"""The default ban policy against the one fault table (pkg/faults/table.json)
the broker's gateway and the Node client are held to as well."""
from __future__ import annotations

import asyncio
import json
import pathlib
import socket
import ssl

import pytest

from egress_proxies import BLOCKED, ERROR, OK, RATE_LIMITED, TARGET_ERROR, BanPolicy
from egress_proxies import policy

TABLE = json.loads((pathlib.Path(__file__).resolve().parents[3] / "pkg" / "faults" / "table.json").read_text())
RESULT_OF_CLASS = {"proxy": ERROR, "site": TARGET_ERROR, "caller": None}


@pytest.mark.parametrize("case", TABLE["responses"], ids=lambda c: c["name"])
def test_responses_as_the_table_says(case):
    body = b"x" * case.get("pad", 0) + case.get("body", "").encode()
    assert BanPolicy().classify(case["status"], case.get("headers", {}), body) == case["result"]


@pytest.mark.parametrize("case", [c for c in TABLE["connects"] if "headers" not in c], ids=lambda c: c["name"])
def test_connect_answers_as_the_table_says(case):
    # A client's library gives it a refused CONNECT's status, not its
    # headers: the table's cases by status alone.
    assert BanPolicy().classify_connect(case["status"]) == RESULT_OF_CLASS[case["class"]]


def test_the_same_markers_and_statuses_as_the_table():
    assert list(policy.MARKERS) == TABLE["blockMarkers"]
    assert policy.SCAN == TABLE["markerWindow"]
    assert {str(k): v for k, v in policy.CONNECT_STATUS.items()} == TABLE["connectStatus"]
    assert TABLE["connectDefault"] == "proxy"


def test_scrapy_headers_are_understood():
    from scrapy.http import Headers
    assert BanPolicy().classify(503, Headers({"Retry-After": "5"})) == RATE_LIMITED
    assert BanPolicy().classify(502, Headers({"X-Squid-Error": "ERR_READ_TIMEOUT 0"})) == TARGET_ERROR
    assert BanPolicy().classify(407, Headers({"Proxy-Authenticate": "Basic realm=x"})) == ERROR


class _Reason(Exception):
    """As urllib3's errors: what went wrong is in .reason."""

    def __init__(self, msg, reason):
        super().__init__(msg)
        self.reason = reason


def _requests_errors():
    import requests
    return [
        (requests.exceptions.ProxyError("Cannot connect to proxy.", ConnectionRefusedError(111, "refused")), ERROR),
        (requests.exceptions.ProxyError(OSError("Tunnel connection failed: 503 Service Unavailable")), TARGET_ERROR),
        (requests.exceptions.ProxyError(OSError("Tunnel connection failed: 407 Proxy Authentication Required")), ERROR),
        (requests.exceptions.ProxyError(OSError("Tunnel connection failed: 403 Forbidden")), None),
        (requests.exceptions.ConnectTimeout("connect to the proxy timed out"), ERROR),
        (requests.exceptions.SSLError("handshake failure"), TARGET_ERROR),
        (requests.exceptions.ReadTimeout("read timed out"), TARGET_ERROR),
        (requests.exceptions.ConnectionError("Connection aborted.", ConnectionResetError(104, "reset")), TARGET_ERROR),
    ]


def _scrapy_errors():
    from scrapy.core.downloader.handlers.http11 import TunnelError
    from twisted.internet import error
    from twisted.web._newclient import ResponseNeverReceived
    return [
        (TunnelError("Could not open CONNECT tunnel with proxy 127.0.0.1:3128 [{'status': 503, 'reason': b'Service Unavailable'}]"), TARGET_ERROR),
        (TunnelError("Could not open CONNECT tunnel with proxy 127.0.0.1:3128 [{'status': 407, 'reason': b'Proxy Authentication Required'}]"), ERROR),
        (error.ConnectionRefusedError("proxy refused"), ERROR),
        (error.TCPTimedOutError(), ERROR),
        (error.TimeoutError("Getting https://a.test/ took longer than 180.0 seconds."), TARGET_ERROR),
        (ResponseNeverReceived([]), TARGET_ERROR),
        (error.DNSLookupError("a.test"), TARGET_ERROR),
    ]


@pytest.mark.parametrize("exc,want", [
    (ValueError("the caller's own bug"), None),
    (KeyError("x"), None),
    (asyncio.CancelledError(), None),
    (KeyboardInterrupt(), None),
    (ConnectionRefusedError(111, "Connection refused"), ERROR),
    (ConnectionResetError(104, "reset by peer"), TARGET_ERROR),
    (TimeoutError("timed out"), TARGET_ERROR),
    (ssl.SSLError(1, "tlsv1 alert"), TARGET_ERROR),
    (socket.gaierror(-2, "Name or service not known"), TARGET_ERROR),
    (_Reason("wrapped", ConnectionRefusedError(111, "refused")), ERROR),
    (OSError("Tunnel connection failed: 502 Bad Gateway"), TARGET_ERROR),
] + _requests_errors() + _scrapy_errors(), ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v))
def test_exceptions_blame_the_right_party(exc, want):
    assert BanPolicy().classify_exception(exc) == want
