"""A bump's candidate goes into the fleet caches before the canary, and the canary pulls it
from there first (the probe script run in bash with a fake ``docker``); a cache that fails is
a warning and the upstream serves."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from balancer_helpers import key_file

from rigfleet.bump.candidate import Candidate
from rigfleet.bump.images import parse_probe, prefetch, probe_script
from rigfleet.fleetcache import SEED_SERVICE
from rigfleet.inventory import InventoryHost

DIGEST = "sha256:" + "c" * 64
CAND = Candidate("vllm/vllm-openai", "v0.28.0", DIGEST)


class Remote:
    def __init__(self, rc: int = 0) -> None:
        self.rc, self.commands = rc, []

    def run(self, host, command, *, timeout=120, stdin=b""):
        self.commands.append((host.name, command))
        return self.rc, "" if self.rc == 0 else "[rigfleet-cache] ERROR: upstream: HTTP 503\n"


def inventory(tmp_path: Path) -> list[InventoryHost]:
    key = key_file(tmp_path)
    return [InventoryHost("host1", ("gpu_hosts",), {}),
            InventoryHost("lb1", ("balancers", "caches"), {"api_key_file": str(key),
                                                           "cache_address": "10.0.0.9"})]


def test_the_candidate_is_seeded_into_each_cache_which_then_holds_it(tmp_path):
    remote, logged = Remote(), []
    assert prefetch(remote, inventory(tmp_path), CAND, logged.append) == ("10.0.0.9:5000",)
    [(name, command)] = remote.commands
    assert name == "lb1" and f"systemctl start {SEED_SERVICE}" in command
    assert f"--repo vllm/vllm-openai --digest {DIGEST}" in command
    assert "lb1: fetching vllm/vllm-openai@sha256:cccccccccccc" in logged[0]


def test_a_cache_that_cannot_is_a_warning_and_the_canary_pulls_upstream(tmp_path):
    logged: list[str] = []
    assert prefetch(Remote(rc=1), inventory(tmp_path), CAND, logged.append) == ()
    assert "warning" in logged[-1] and "HTTP 503" in logged[-1]
    assert "the canary pulls it from the upstream" in logged[-1]


def test_a_cache_its_own_preflight_refuses_is_not_seeded(tmp_path):
    """A cache whose registry port is its balancer's port: refused by its preflight, so the
    bump neither seeds it nor names it to the canary."""
    key = str(key_file(tmp_path))
    clash = InventoryHost("lb2", ("balancers", "caches"), {"api_key_file": key,
                                                          "cache_registry_port": 8080})
    remote = Remote()
    assert prefetch(remote, [*inventory(tmp_path), clash], CAND, lambda _: None) == (
        "10.0.0.9:5000",)
    assert [name for name, _ in remote.commands] == ["lb1"]


def test_an_image_of_another_registry_skips_the_caches(tmp_path):
    remote = Remote()
    ghcr = Candidate("ghcr.io/org/vllm", "v1", DIGEST)
    assert prefetch(remote, inventory(tmp_path), ghcr, lambda _: None) == ()
    assert remote.commands == []


@pytest.fixture()
def docker(tmp_path: Path):
    """A ``docker`` that holds nothing, logs its calls, and fails pulls named in FAIL."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls"
    (bin_dir / "docker").write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {log}\n'
        'case "$1 $2" in "image inspect") exit 1 ;; esac\n'
        'if [ "$1" = pull ]; then case "$3" in $FAIL) exit 1 ;; esac; exit 0; fi\n'
        'if [ "$1" = run ]; then echo 0.28.0; fi\n')
    (bin_dir / "docker").chmod(0o755)
    (tmp_path / "vllm-versions").mkdir()

    def run(script: str, fail: str = "nothing") -> tuple[dict[str, str], str, list[str]]:
        proc = subprocess.run(["sh", "-c", script.replace("/var/lib/rigfleet", str(tmp_path))],
                              capture_output=True, text=True,
                              env={"PATH": f"{bin_dir}:/usr/bin:/bin", "FAIL": fail})
        assert proc.returncode == 0, proc.stderr
        return parse_probe(proc.stdout), proc.stderr, log.read_text().splitlines()

    return run


def test_the_canary_pulls_from_the_cache_and_runs_what_it_pulled(docker):
    values, err, calls = docker(probe_script(CAND, pull=True, caches=("lb1:5000",)))
    cached = f"lb1:5000/vllm/vllm-openai@{DIGEST}"
    assert values == {"source": "pulled", "version": "0.28.0"} and "WARNING" not in err
    assert [c for c in calls if c.startswith(("pull", "run"))] == [
        f"pull --quiet {cached}",
        f"run --rm --network none --entrypoint python3 {cached} -c import vllm; "
        "print(vllm.__version__)"]


def test_a_failed_pull_from_the_cache_warns_and_pulls_upstream(docker):
    cached = f"lb1:5000/vllm/vllm-openai@{DIGEST}"
    values, err, calls = docker(probe_script(CAND, pull=True, caches=("lb1:5000",)),
                                fail=cached)
    assert values["version"] == "0.28.0"
    assert f"WARNING: the pull of {cached} from the fleet cache failed" in err
    assert [c for c in calls if c.startswith("pull")] == [f"pull --quiet {cached}",
                                                           f"pull --quiet {CAND.ref}"]
