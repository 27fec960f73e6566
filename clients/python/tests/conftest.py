"""The suites run against the whole system on loopback: hack/demo/clientenv
(real broker, Redis, Squid, controller, prober and API server), started once
per session and described in a JSON file."""
from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import tempfile
import time
import urllib.request

import pytest

REPO = pathlib.Path(__file__).resolve().parents[3]


@pytest.fixture(scope="session")
def env():
    binary = os.environ.get("CLIENTENV")
    work = tempfile.mkdtemp(prefix="egress-proxies-pytest-")
    if not binary:
        binary = os.path.join(work, "clientenv")
        subprocess.run(["go", "build", "-o", binary, "./hack/demo/clientenv"], cwd=REPO, check=True)
    out = os.path.join(work, "env.json")
    log = open(os.path.join(work, "clientenv.log"), "wb")
    # Its stdin is ours to hold: closing it (or dying) stops the system.
    proc = subprocess.Popen([binary, "--out", out, "--dir", os.path.join(work, "system")], cwd=REPO,
                            stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while not os.path.exists(out):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"clientenv did not come up; its log: {log.name}")
        time.sleep(0.5)
    with open(out) as f:
        e = json.load(f)
    e["log"] = log.name
    yield e
    proc.stdin.close()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()


def metric(env, name: str, **labels) -> float:
    """The sum over every broker of a counter's series matching labels."""
    total = 0.0
    want = [f'{k}="{v}"' for k, v in labels.items()]
    for ops in env["ops"]:
        for line in urllib.request.urlopen(ops + "/metrics", timeout=10).read().decode().splitlines():
            m = re.match(r"^" + re.escape(name) + r"(\{[^}]*\})? (\S+)$", line)
            if m and all(w in (m.group(1) or "") for w in want):
                total += float(m.group(2))
    return total


def site_requests(env):
    return json.load(urllib.request.urlopen(env["site"] + "_requests", timeout=10))
