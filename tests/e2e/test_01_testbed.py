"""The simulated fleet itself: bare hosts over real SSH, reboots keep the disk, the mirror,
hub and Genesis repository answer like the real services."""

from __future__ import annotations

import json
import urllib.request

import pytest
from rigfleet_testbed import layout

from rigfleet.registry import Registry


def test_hosts_are_bare_debian_with_systemd(testbed):
    for host in testbed.hosts:
        if host.sh("test -e /var/lib/rigfleet/state.json")[0] == 0:
            pytest.skip("the kept testbed is already converged (RIGFLEET_KEEP_TESTBED=1)")
        rc, out = host.sh(
            ". /etc/os-release; echo $VERSION_ID; systemctl is-system-running --wait; "
            "command -v docker nvidia-smi nginx || echo none-installed"
        )
        lines = out.split()
        assert lines[0] == ("12" if host.os == "debian12" else "13"), out
        assert lines[1] in ("running", "degraded"), out
        assert "none-installed" in out, f"{host.name} is not bare: {out}"


def test_hardware_is_described_by_the_testbed(testbed):
    rc, out = testbed.hosts[0].sh("cat /etc/nvidia-sim/hardware.json")
    hw = json.loads(out)
    assert [g["name"] for g in hw["gpus"]] == ["NVIDIA GeForce RTX 3090"] * 2
    assert {g["memory_total_mib"] for g in hw["gpus"]} == {24576}
    assert (hw["nvlink"], hw["gpus"][0]["power_max_w"], hw["gpus"][0]["power_min_w"]) == (
        False, 350, 100)
    # Read-only: the deploy cannot rewrite the hardware.
    rc, _ = testbed.hosts[0].sh("echo x >> /etc/nvidia-sim/hardware.json")
    assert rc != 0


def test_mirror_serves_releases_and_only_the_newest_nightlies_like_docker_hub(testbed):
    """vLLM's cleanup keeps the 14 newest nightly-* tags; release tags stay
    (upstream-2026.md 4.1): a purged nightly is gone by tag and by digest."""
    from rigfleet_testbed import vllm_builds

    from rigfleet.registry import RegistryError

    reg = Registry(f"http://127.0.0.1:{layout.REGISTRY_LOCAL_PORT}")
    tags = set(reg.tags(layout.SIM_IMAGE_REPO))
    kept, purged = vllm_builds.retention(vllm_builds.BUILDS)
    assert {b.tag for b in kept} <= tags and not {b.tag for b in purged} & tags
    assert sum(1 for t in tags if t.startswith("nightly-")) == vllm_builds.KEEP_NIGHTLIES
    assert {"v0.21.0", "v0.27.1"} <= tags
    assert set(vllm_builds.THROUGHPUT_NIGHTLIES) <= set(kept)
    for b in kept:
        assert reg.digest(layout.SIM_IMAGE_REPO, b.tag).startswith("sha256:")
    gone = vllm_builds.by_tag("nightly-01d4d1ad375dc5854779c593eee093bcebb0cada")
    assert gone in purged and gone.tag not in tags
    with pytest.raises(RegistryError):
        reg.digest(layout.SIM_IMAGE_REPO, gone.tag)


def test_apt_repository_is_signed_and_reachable_from_hosts(testbed):
    host = testbed.hosts[-1]
    rc, out = host.sh(
        "python3 -c 1 2>/dev/null; "
        "apt-get -o Acquire::Retries=2 -qq update >/dev/null; "
        "getent hosts apt.rigfleet.test hub.rigfleet.test git.rigfleet.test registry.rigfleet.test"
    )
    assert out.count("rigfleet.test") == 4, out
    with urllib.request.urlopen(
        f"http://127.0.0.1:{layout.APT_LOCAL_PORT}/debian/dists/stable/InRelease") as resp:
        body = resp.read().decode()
    assert "BEGIN PGP SIGNED MESSAGE" in body and "nvidia" not in body.split("-----BEGIN PGP SIGNATURE")[1]


def test_reboot_from_inside_brings_the_host_back_with_its_disk(testbed):
    host = testbed.hosts[-1]
    # /root is on the host's disk; /run is tmpfs and must not survive a reboot.
    rc, _ = host.sh("echo disk-kept > /root/marker; echo volatile > /run/marker")
    assert rc == 0
    host.reboot()
    rc, out = host.sh("cat /root/marker; cat /run/marker 2>/dev/null || echo run-cleared; "
                      "systemctl is-system-running --wait")
    assert out.split()[:2] == ["disk-kept", "run-cleared"], out
