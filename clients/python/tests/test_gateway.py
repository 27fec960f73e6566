"""The gateway: any HTTP client crawls through the fleet with a proxy URL
and no egress-proxies code. curl, requests and an unmodified Scrapy spider
against the clientenv's brokers, Squids and rate-limiting site."""
from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
import urllib.parse

import requests

import egress_proxies as ep
from conftest import metric, site_requests

HERE = os.path.dirname(__file__)


def proxy_url(env, options: str = "") -> str:
    user = f"namespace={env['namespace']}" + "".join(f",attr.{k}={v}" for k, v in env["selector"].items()) + options
    return f"http://{urllib.parse.quote(user, safe='=,.')}:{env['token']}@{env['gateway']}"


def egress_ips(env) -> set[str]:
    return {p["egressIP"] for p in env["proxies"]}


def live_leases(env) -> list[int]:
    with ep.Client("grpc://" + env["grpcPlain"], token=env["token"]) as c:
        return [p.lease_count for p in c.list_proxies(env["selector"], namespace=env["namespace"])]


def wait_no_leases(env):
    """Tunnels release their leases when the client's connection closes,
    a moment after the client is done."""
    deadline = time.monotonic() + 30
    while live_leases(env) != [0, 0, 0]:
        assert time.monotonic() < deadline, f"leases left: {live_leases(env)}"
        time.sleep(0.1)


def test_curl_through_the_gateway(env):
    # curl -x, as docs/api/gateway.md shows it: HTTPS through a CONNECT tunnel.
    out = subprocess.run(["curl", "-sS", "--fail", "--max-time", "30", "--cacert", env["httpsEchoCA"], "-x", proxy_url(env),
                          env["httpsEcho"] + "/ip"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() in egress_ips(env), "the target saw a leased proxy's address"

    # Without the token: 407, and curl says so.
    bad = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "30", "-x",
                          f"http://{env['gateway']}", env["site"]], capture_output=True, text=True, timeout=60)
    assert bad.stdout == "407"


def test_requests_through_the_gateway_with_a_session(env):
    proxy = proxy_url(env, ",session=basket-1")
    seen = set()
    for _ in range(4):
        # A new connection each time: the session, not the connection, keeps the proxy.
        with requests.Session() as s:
            r = s.get(env["httpsEcho"] + "/ip", proxies={"https": proxy, "http": proxy}, verify=env["httpsEchoCA"], timeout=30)
            assert r.status_code == 200
            seen.add(r.text.strip())
    assert len(seen) == 1 and seen <= egress_ips(env), seen

    # Plain HTTP is forwarded, and the page is the site's. Its request log,
    # which the site answers every exit IP alike: a 429 from the limited
    # proxy would cool it down for a target the Scrapy tests lease for.
    r = requests.get(env["otherSite"] + "_requests", proxies={"http": proxy_url(env)}, timeout=30)
    assert r.status_code == 200 and isinstance(r.json(), list), r.text[:200]
    wait_no_leases(env)


def test_an_unmodified_scrapy_spider_crawls_through_the_gateway(env, tmp_path):
    items = tmp_path / "pages.jsonl"
    gateway = proxy_url(env)
    # Only the proxy variables: Scrapy's own HttpProxyMiddleware sends the
    # user name and token from the URL as Proxy-Authorization.
    run_env = dict(os.environ, http_proxy=gateway, https_proxy=gateway, HTTP_PROXY=gateway, HTTPS_PROXY=gateway)
    run_env.pop("no_proxy", None)
    run_env.pop("NO_PROXY", None)
    before = len(site_requests(env))
    limited_before = metric(env, "proxy_operator_broker_gateway_reports_total", kind="http", result="rate_limited")
    crawl = subprocess.run([sys.executable, "-m", "scrapy", "runspider", os.path.join(HERE, "gateway_spider.py"),
                            "-a", "start=" + env["gatewaySite"], "-O", str(items)],
                           cwd=tmp_path, env=run_env, capture_output=True, text=True, timeout=300)
    assert crawl.returncode == 0, crawl.stderr[-4000:]

    # The crawl completed: the root and every page it links.
    pages = {json.loads(line)["url"] for line in items.read_text().splitlines()}
    assert pages == {env["gatewaySite"]} | {f"{env['gatewaySite']}p/{i}" for i in range(1, env["pages"] + 1)}, crawl.stderr[-4000:]

    # Every request the site saw came through a proxy; the limited one was
    # answered 429, which the gateway reported ...
    seen = site_requests(env)[before:]
    assert seen and {r["from"] for r in seen} <= egress_ips(env)
    limited = [r for r in seen if r["from"] == env["limitedIP"]]
    assert limited and {r["status"] for r in limited} == {429}, "the site's own target: the limited proxy was tried first-hand"
    assert metric(env, "proxy_operator_broker_gateway_reports_total", kind="http", result="rate_limited") - limited_before == len(limited)

    # ... so the limited proxy cools down for the site, in the API, and no
    # lease is left.
    with ep.Client("grpc://" + env["grpcPlain"], token=env["token"]) as c:
        proxies = c.list_proxies(env["selector"], namespace=env["namespace"], target=urllib.parse.urlsplit(env["gatewaySite"]).hostname)
        now = datetime.datetime.now(datetime.timezone.utc)
        cooling = {p.egress_ip for p in proxies if p.cooldown_until and p.cooldown_until > now}
        assert cooling == {env["limitedIP"]}
    wait_no_leases(env)
