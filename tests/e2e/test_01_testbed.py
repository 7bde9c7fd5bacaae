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


# Adds one repository (its armored key, fetched here, as the keyring) in a directory of its own
# and runs apt's update for it alone, as apt on that host verifies it (sqv on Debian 13, gpgv on
# 12; both run as _apt, hence the directory readable by others). A bare host has no curl.
APT_TRY = """set -u; d=$(mktemp -d); chmod 755 "$d"; mkdir -p "$d/parts" "$d/lists/partial"
cat > "$d/key.asc" <<'KEY'
{key}KEY
printf 'Types: deb\\nURIs: %s\\nSuites: /\\nSigned-By: %s\\n' {url} "$d/key.asc" > "$d/parts/try.sources"
apt-get update -o Dir::Etc::SourceList=/dev/null -o Dir::Etc::SourceParts="$d/parts" \\
    -o Dir::State::Lists="$d/lists" 2>&1; rc=$?; rm -rf "$d"; echo "apt-rc=$rc"
"""


def apt_try(host, distro: str) -> tuple[bool, str]:
    """(apt accepted NVIDIA's ``distro`` CUDA repository on ``host``, apt's output)."""
    path = f"compute/cuda/repos/{distro}/x86_64"
    key_file = "8793F200.pub" if distro == "debian13" else "3bf863cc.pub"
    url = f"http://127.0.0.1:{layout.APT_LOCAL_PORT}/{path}/{key_file}"
    with urllib.request.urlopen(url) as resp:
        key = resp.read().decode()
    rc, out = host.sh(APT_TRY.format(url=f"{layout.CUDA_APT_BASE}/{distro}/x86_64/", key=key),
                      timeout=180)
    return out.rstrip().endswith("apt-rc=0") and "not signed" not in out, out


def test_nvidia_repositories_are_signed_as_nvidia_signs_them(testbed):
    """debian13's repository carries no 580 and is signed with the new key; the others keep
    the old key with its SHA-1 binding, which trixie's apt (sqv, default policy) refuses while
    bookworm's (gpgv) takes it."""
    with urllib.request.urlopen(f"http://127.0.0.1:{layout.APT_LOCAL_PORT}/compute/cuda/repos/"
                                "debian13/x86_64/Packages") as resp:
        packages = resp.read().decode()
    versions = {line.split()[1] for line in packages.splitlines()
                if line.startswith("Version: ")}
    assert versions and not any(v.startswith("580.") for v in versions), versions
    assert any(v.startswith("595.") for v in versions), versions
    trixie = testbed.fleet[0]
    ok, out = apt_try(trixie, "debian13")
    assert ok, out
    ok, out = apt_try(trixie, "debian12")
    assert not ok, out
    assert "sqv" in out and "SHA1" in out, out
    if testbed.single is not None and testbed.single.os == "debian12":
        ok, out = apt_try(testbed.single, "debian12")
        assert ok, out


def test_reboot_from_inside_brings_the_host_back_with_its_disk(testbed):
    host = testbed.hosts[-1]
    # /root is on the host's disk; /run is tmpfs and must not survive a reboot.
    rc, _ = host.sh("echo disk-kept > /root/marker; echo volatile > /run/marker")
    assert rc == 0
    host.reboot()
    rc, out = host.sh("cat /root/marker; cat /run/marker 2>/dev/null || echo run-cleared; "
                      "systemctl is-system-running --wait")
    assert out.split()[:2] == ["disk-kept", "run-cleared"], out
