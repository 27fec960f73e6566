"""The Scrapy middleware's own behaviour, each through a real crawl of the
clients' environment in a Scrapy process: refusals wait and reschedule, a
session keeps one proxy and one lease. They crawl the site at its other
address, another target than the example's, so they neither use nor
leave cooldowns the example test looks at."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time

import egress_proxies as ep
from conftest import REPO, metric, site_requests
from deadhosts import CLOSED, DEAD, FILTERED, SITE_502, Hosts

EXAMPLE = REPO / "examples" / "scrapy"
HERE = os.path.dirname(__file__)


def crawl(env, spider, out, *settings, **environ):
    run_env = dict(os.environ, EGRESS_PROXIES_URL="grpcs://" + env["grpcTLS"], EGRESS_PROXIES_TOKEN=env["token"],
                   EGRESS_PROXIES_CA_FILE=env["caFile"], SITE_URL=env["otherSite"],
                   PYTHONPATH=os.pathsep.join([str(REPO / "clients" / "python"), HERE]), **environ)
    args = [sys.executable, "-m", "scrapy", "crawl", spider, "-O", str(out), "-s", "SPIDER_MODULES=sitecrawl.spiders,session_spiders"]
    for s in settings:
        args += ["-s", s]
    p = subprocess.run(args, cwd=EXAMPLE, env=run_env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-4000:]
    return dict((k, int(v)) for k, v in re.findall(r"'(egress_proxies/[^']+)': (\d+)", p.stderr)), p.stderr


def test_a_refusal_reschedules_the_request_after_retry_after(env, tmp_path):
    """Every proxy at its lease cap: the broker refuses with ALL_AT_CAP and
    Retry-After 1 s; the crawl waits instead of failing, and completes once
    capacity returns."""
    with ep.Client("grpc://" + env["grpcPlain"], token=env["token"]) as c:
        held = []
        while True:
            try:
                held.append(c.lease(env["selector"], ttl=120))
            except ep.NoProxyAvailable as full:
                assert full.reason == "ALL_AT_CAP"
                break
        refused = metric(env, "proxy_operator_broker_no_candidate_total", reason="ALL_AT_CAP")

        crawled = threading.Event()

        def give_back():
            # Once the crawl has been refused (the broker counts it), not
            # after a guess at how long Scrapy takes to start.
            while not crawled.is_set() and metric(env, "proxy_operator_broker_no_candidate_total", reason="ALL_AT_CAP") == refused:
                time.sleep(0.2)
            for lease in held:
                lease.release()

        giver = threading.Thread(target=give_back, daemon=True)
        giver.start()
        try:
            stats, log = crawl(env, "site", tmp_path / "pages.jsonl")
        finally:
            # A crawl refused for another reason still gives the fleet back,
            # so its failure is this test's alone.
            crawled.set()
            giver.join()
    pages = (tmp_path / "pages.jsonl").read_text().splitlines()
    assert len(pages) == env["pages"] + 1, "nothing was dropped; the crawl's log ends:\n" + log[-4000:]
    assert stats.get("egress_proxies/refused/ALL_AT_CAP", 0) >= 1, log[-3000:]
    assert stats.get("egress_proxies/rescheduled", 0) >= 1
    assert "egress_proxies/gave_up" not in stats


def test_a_session_keeps_one_proxy_and_one_lease(env, tmp_path):
    before = len(site_requests(env))
    stats, log = crawl(env, "session", tmp_path / "pages.jsonl", "EGRESS_PROXIES_SESSION_IDLE=1")
    pages = [json.loads(line) for line in (tmp_path / "pages.jsonl").read_text().splitlines()]
    assert len(pages) == env["pages"] + 1, "the crawl's log ends:\n" + log[-4000:]
    served = {r["from"] for r in site_requests(env)[before:] if r["status"] == 200}
    assert len(served) == 1, f"one session, one exit IP: {served}"
    # One lease per proxy the session held: the one it kept, and one more
    # if its first proxy was the limited one.
    assert stats["egress_proxies/leases"] <= 2, stats
    assert stats["egress_proxies/leases"] == stats["egress_proxies/released"]


def test_a_broad_crawl_blames_the_sites_not_the_proxies(env, tmp_path):
    """60 hosts, a third dead in every way a site can be: through the
    middleware no proxy is blamed, quarantined or cooled down, every live
    host is fetched, and the dead ones are reported as the sites' fault."""
    hosts = Hosts("127.0.40")
    try:
        urls = {}
        for i in range(60):
            kind = DEAD[(i // 3) % len(DEAD)] if i % 3 == 2 else "live"
            urls[hosts.live() if kind == "live" else hosts.dead(kind)] = kind
        (tmp_path / "urls").write_text("\n".join(urls))
        before = {r: metric(env, "proxy_operator_broker_reports_total", result=r) for r in ep.RESULTS}
        stats, log = crawl(env, "broad", tmp_path / "out.jsonl", BROAD_URLS=str(tmp_path / "urls"))
    finally:
        hosts.close()
    seen = {}
    for line in (tmp_path / "out.jsonl").read_text().splitlines():
        item = json.loads(line)
        seen[item["url"]] = item
    for url, kind in urls.items():
        if kind == "live":
            assert seen.get(url, {}).get("status") == 200, (url, seen.get(url), log[-3000:])
    assert len(seen) == len(urls), log[-3000:]
    after = {r: metric(env, "proxy_operator_broker_reports_total", result=r) for r in ep.RESULTS}
    delta = {r: after[r] - before[r] for r in ep.RESULTS}
    assert delta[ep.ERROR] == 0, ("a proxy was blamed for a site", delta, stats)
    reported_dead = sum(1 for k in urls.values() if k in (CLOSED, FILTERED, SITE_502))
    assert delta[ep.TARGET_ERROR] >= reported_dead, (delta, stats)
    assert delta[ep.OK] == sum(1 for k in urls.values() if k == "live"), (delta, stats)
    with ep.Client("grpc://" + env["grpcPlain"], token=env["token"]) as c:
        assert all(p.quarantined_until is None for p in c.list_proxies(env["selector"]))
        for url, kind in urls.items():
            if kind == "live":
                host = url.split("//")[1].split(":")[0]
                assert all(p.cooldown_until is None for p in c.list_proxies(env["selector"], target=host)), url
        assert sum(p.lease_count for p in c.list_proxies(env["selector"])) == 0
