"""The package as published: its version tied to the API's, its generated
code in step with proto/, a wheel that carries it all."""
from __future__ import annotations

import filecmp
import json
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

import egress_proxies
from conftest import REPO

PKG = REPO / "clients" / "python"


def test_version_is_the_apis():
    proto = (REPO / "proto" / "egressproxies" / "lease" / "v1" / "lease.proto").read_text()
    major = re.search(r"^package egressproxies\.lease\.v(\d+);", proto, re.M).group(1)
    assert egress_proxies.API_VERSION == "v" + major
    assert egress_proxies.__version__.split(".")[0] == major
    node = json.loads((REPO / "clients" / "node" / "package.json").read_text())
    assert node["version"] == egress_proxies.__version__, "the Python and Node clients release together"


def test_generated_code_is_fresh(tmp_path):
    subprocess.run(["bash", str(REPO / "clients" / "gen.sh"), str(tmp_path)], check=True, cwd=REPO)
    fresh = tmp_path / "clients" / "python" / "egress_proxies" / "_gen"
    ours = PKG / "egress_proxies" / "_gen"
    names = sorted(p.name for p in fresh.iterdir())
    assert names == sorted(p.name for p in ours.iterdir() if p.name != "__pycache__")
    _, mismatch, errors = filecmp.cmpfiles(fresh, ours, names, shallow=False)
    assert not mismatch and not errors, f"stale: {mismatch + errors}; run make generate"


def test_wheel_carries_the_package(tmp_path):
    src = tmp_path / "src"  # setuptools writes build/ beside the sources
    shutil.copytree(PKG, src, ignore=shutil.ignore_patterns("tests", "__pycache__"))
    subprocess.run([sys.executable, "-c", "from setuptools import build_meta; build_meta.build_wheel('dist')"],
                   check=True, cwd=src, capture_output=True)
    wheel = next((src / "dist").glob("*.whl"))
    assert wheel.name.startswith(f"egress_proxies-{egress_proxies.__version__}-")
    names = zipfile.ZipFile(wheel).namelist()
    for module in ("egress_proxies/scrapy.py", "egress_proxies/aio.py", "egress_proxies/_gen/lease_pb2_grpc.py"):
        assert module in names
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "Requires-Dist: grpcio" in meta and "Provides-Extra: scrapy" in meta
