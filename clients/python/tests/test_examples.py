"""examples/scrapy, crawled for real: a local site that rate-limits one
proxy's exit IP, through leased Squid proxies."""
from __future__ import annotations

import datetime
import json
import os
import pathlib
import re
import subprocess
import sys

import egress_proxies as ep
from conftest import REPO, site_requests

EXAMPLE = REPO / "examples" / "scrapy"


def test_scrapy_example_crawls_through_the_fleet(env, tmp_path):
    items = tmp_path / "pages.jsonl"
    run_env = dict(os.environ, EGRESS_PROXIES_URL="grpcs://" + env["grpcTLS"], EGRESS_PROXIES_TOKEN=env["token"],
                   EGRESS_PROXIES_CA_FILE=env["caFile"], SITE_URL=env["site"],
                   PYTHONPATH=os.pathsep.join([str(REPO / "clients" / "python"), os.environ.get("PYTHONPATH", "")]))
    before = len(site_requests(env))
    crawl = subprocess.run([sys.executable, "-m", "scrapy", "crawl", "site", "-O", str(items)], cwd=EXAMPLE, env=run_env,
                           capture_output=True, text=True, timeout=300)
    log = crawl.stderr
    assert crawl.returncode == 0, log[-4000:]

    # The crawl completed: the root and every page it links, once each.
    pages = [json.loads(line) for line in items.read_text().splitlines()]
    assert sorted(p["url"] for p in pages) == sorted([env["site"]] + [f"{env['site']}p/{i}" for i in range(1, env["pages"] + 1)])

    # The site rate-limited one exit IP; the middleware reported it and
    # retried elsewhere (Scrapy's stats say so) ...
    stats = dict(re.findall(r"'(egress_proxies/[^']+)': (\d+)", log))
    assert int(stats.get("egress_proxies/outcome/rate_limited", 0)) >= 1, log[-4000:]
    assert int(stats.get("egress_proxies/retried_after_ban", 0)) >= 1
    assert stats.get("egress_proxies/leases") == stats.get("egress_proxies/released"), stats

    with ep.Client("grpc://" + env["grpcPlain"], token=env["token"]) as c:
        # ... so the limited proxy now cools down for the site, in the API,
        proxies = c.list_proxies(env["selector"], target="127.0.0.1")
        now = datetime.datetime.now(datetime.timezone.utc)
        cooling = {p.egress_ip for p in proxies if p.cooldown_until and p.cooldown_until > now}
        assert cooling == {env["limitedIP"]}
        # and no lease is left.
        assert [p.lease_count for p in proxies] == [0] * len(proxies)

    # Every request the site saw came from a proxy's exit IP, never from
    # the crawler itself, and that proxy's Squid logged it.
    seen = site_requests(env)[before:]
    assert len(seen) >= len(pages)
    by_ip = {p["egressIP"]: pathlib.Path(p["accessLog"]).read_text() for p in env["proxies"]}
    for r in seen:
        assert r["from"] in by_ip, f"{r} did not come through a proxy"
        assert env["site"].rstrip("/") + r["path"] in by_ip[r["from"]], f"{r} is not in that proxy's access log"
    assert {r["status"] for r in seen if r["from"] == env["limitedIP"]} == {429}
