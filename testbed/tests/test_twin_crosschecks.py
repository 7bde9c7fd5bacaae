"""Product code checked against the twin: the Genesis role's checkout over the testbed's dumb-HTTP
git server, and the load generator's idea of the testbed's networks."""

from __future__ import annotations

import sys
from pathlib import Path

from rigfleet_testbed import layout
from rigfleet_testbed.genesis_fixture import build_genesis_fixture
from services_helpers import services
from test_genesis_role import converge, head

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import loadgen


def test_checkout_over_the_testbeds_dumb_http_git(tmp_path) -> None:
    # The testbed serves Genesis over git's dumb HTTP, as the hosts reach it: the role's
    # fetches (every head and tag; a sha the refs reach) work there too.
    fx = build_genesis_fixture(tmp_path / "data" / "git")
    dest = tmp_path / "checkout"
    with services(tmp_path / "data") as ports:
        url = f"http://127.0.0.1:{ports['git']}/{fx.repo_path.name}"
        for sha in (fx.releases["v7.72.2"], fx.tags["v12.1.0"], fx.commits[-1].sha):
            run = converge(url, sha, dest)
            assert run.returncode == 0, run.stderr
            assert head(dest) == sha


def test_the_testbed_networks_are_the_testbeds():
    assert any(str(net) == layout.SUBNET for net in loadgen.TESTBED_NETWORKS)
