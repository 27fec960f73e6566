"""The default ban policy, table-driven."""
from __future__ import annotations

import pytest

from egress_proxies import BLOCKED, ERROR, OK, RATE_LIMITED, BanPolicy


@pytest.mark.parametrize("status,headers,body,want", [
    (200, {}, b"<html>products</html>", OK),
    (404, {}, b"not here", OK),
    (500, {}, b"oops", OK),
    (429, {}, b"", RATE_LIMITED),
    (503, {"Retry-After": "30"}, b"", RATE_LIMITED),
    (503, {}, b"<div class='g-recaptcha'>", BLOCKED),
    (403, {}, b"Forbidden", BLOCKED),
    (200, {}, b"<title>Are you a robot?</title>", BLOCKED),
    (200, {}, b"x" * 70000 + b"captcha", OK),  # past the 64 KiB scanned
    (503, {"X-Squid-Error": "ERR_CONNECT_FAIL 111"}, b"", ERROR),
    (403, {"x-squid-error": "ERR_ACCESS_DENIED 0"}, b"", ERROR),
])
def test_default_policy(status, headers, body, want):
    assert BanPolicy().classify(status, headers, body) == want


def test_scrapy_headers_are_understood():
    from scrapy.http import Headers
    assert BanPolicy().classify(503, Headers({"Retry-After": "5"})) == RATE_LIMITED
    assert BanPolicy().classify(502, Headers({"X-Squid-Error": "ERR_READ_TIMEOUT 0"})) == ERROR


def test_an_exception_is_an_error():
    assert BanPolicy().classify_exception(TimeoutError()) == ERROR
