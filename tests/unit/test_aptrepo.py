"""The stand-in packages build, and the apt repository made of them is signed and complete."""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import subprocess
from pathlib import Path

import pytest
from rigfleet_testbed import aptrepo, packages

EXPECTED = {
    **{name: ["580.105.08-1", "590.44.01-1"] for name in (
        "nvidia-kernel-open-dkms", "nvidia-smi", "nvidia-persistenced", "nvidia-driver-cuda")},
    **{name: ["1.17.7-1", "1.17.8-1"] for name in (
        "nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container-tools",
        "libnvidia-container1")},
}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[aptrepo.RepoInfo, Path, Path]:
    base = tmp_path_factory.mktemp("apt")
    debs = base / "debs"
    packages.build_all(debs)
    info = aptrepo.build_repo(base / "web", base / "gnupg", debs)
    return info, debs, base


def _paragraphs(text: str) -> list[dict[str, str]]:
    out = []
    for block in text.strip().split("\n\n"):
        fields = dict(re.findall(r"^([\w-]+): (.*)$", block, re.MULTILINE))
        out.append(fields)
    return out


def test_packages_lists_every_name_and_version(built) -> None:
    info, _, _ = built
    dists = info.repo_dir / "dists/stable"
    text = (dists / "main/binary-amd64/Packages").read_text()
    assert gzip.decompress((dists / "main/binary-amd64/Packages.gz").read_bytes()).decode() == text
    found: dict[str, list[str]] = {}
    for p in _paragraphs(text):
        found.setdefault(p["Package"], []).append(p["Version"])
        deb = info.repo_dir / p["Filename"]
        assert deb.exists() and int(p["Size"]) == deb.stat().st_size
        assert p["SHA256"] == hashlib.sha256(deb.read_bytes()).hexdigest()
        assert p["Architecture"] == "amd64"
    assert {k: sorted(v) for k, v in found.items()} == EXPECTED
    assert {k: info.versions(k) for k in EXPECTED} == EXPECTED


def test_dependencies_are_pinned_to_the_same_version(built) -> None:
    info, _, _ = built
    pars = {(p["Package"], p["Version"]): p for p in _paragraphs(
        (info.repo_dir / "dists/stable/main/binary-amd64/Packages").read_text())}
    assert pars[("nvidia-driver-cuda", "580.105.08-1")]["Depends"] == (
        "nvidia-kernel-open-dkms (= 580.105.08-1), nvidia-smi (= 580.105.08-1), "
        "nvidia-persistenced (= 580.105.08-1)")
    assert pars[("nvidia-container-toolkit", "1.17.7-1")]["Depends"].startswith(
        "nvidia-container-toolkit-base (= 1.17.7-1), libnvidia-container-tools (= 1.17.7-1)")
    assert pars[("libnvidia-container-tools", "1.17.8-1")]["Depends"] == (
        "libnvidia-container1 (= 1.17.8-1)")
    assert "python3" in pars[("nvidia-smi", "590.44.01-1")]["Depends"]


def test_release_is_signed_and_checksums_match(built) -> None:
    info, _, _ = built
    dists = info.repo_dir / "dists/stable"
    for args in (["InRelease"], ["Release.gpg", "Release"]):
        proc = subprocess.run(["gpgv", "--keyring", str(info.keyring), *args], cwd=dists,
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        assert info.fingerprint in proc.stderr
    release = (dists / "Release").read_text()
    assert "Suite: stable" in release and "Architectures: amd64 all" in release
    sums = re.findall(r"^ ([0-9a-f]{64}) +(\d+) (\S+)$", release, re.MULTILINE)
    assert {rel for _, _, rel in sums} == {
        "main/binary-amd64/Packages", "main/binary-amd64/Packages.gz",
        "main/binary-all/Packages", "main/binary-all/Packages.gz"}
    for digest, size, rel in sums:
        data = (dists / rel).read_bytes()
        assert (hashlib.sha256(data).hexdigest(), len(data)) == (digest, int(size))
    assert info.public_key.read_text().startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----")


def test_rebuild_is_idempotent_and_reuses_the_key(built) -> None:
    info, debs, base = built
    before = {p: p.stat().st_mtime_ns for p in base.rglob("*") if p.is_file()}
    packages.build_all(debs)
    again = aptrepo.build_repo(info.web_root, base / "gnupg", debs)
    assert again.fingerprint == info.fingerprint
    after = {p: p.stat().st_mtime_ns for p in base.rglob("*") if p.is_file()}
    changed = [p for p in after if before.get(p) != after[p] and "gnupg" not in p.parts]
    assert changed == []


def test_kmod_package_enables_but_never_starts_its_unit(built, tmp_path: Path) -> None:
    _, debs, _ = built
    deb = debs / "nvidia-kernel-open-dkms_580.105.08-1_amd64.deb"
    subprocess.run(["dpkg-deb", "-e", str(deb), str(tmp_path / "ctl")], check=True)
    postinst = (tmp_path / "ctl/postinst").read_text()
    assert "deb-systemd-helper enable 'nvidia-sim-kmod.service'" in postinst
    assert "deb-systemd-invoke" not in postinst and "systemctl start" not in postinst
    deb = debs / "nvidia-persistenced_580.105.08-1_amd64.deb"
    subprocess.run(["dpkg-deb", "-e", str(deb), str(tmp_path / "ctl2")], check=True)
    assert "deb-systemd-invoke restart 'nvidia-persistenced.service'" in (
        tmp_path / "ctl2/postinst").read_text()


def test_packaged_nvidia_smi_runs_standalone(built, tmp_path: Path) -> None:
    _, debs, _ = built
    subprocess.run(["dpkg-deb", "-x", str(debs / "nvidia-smi_580.105.08-1_amd64.deb"),
                    str(tmp_path)], check=True)
    smi = tmp_path / "usr/bin/nvidia-smi"
    assert os.access(smi, os.X_OK)
    env = {"PATH": os.environ["PATH"], "NVIDIA_SIM_ROOT": str(tmp_path / "run")}
    proc = subprocess.run(["python3", str(smi), "-L"], env=env, capture_output=True, text=True,
                          cwd=tmp_path)  # cwd: nothing of rigfleet importable, as on a host
    assert proc.returncode == 9
    assert proc.stdout.startswith("NVIDIA-SMI has failed because it couldn't communicate")
    (tmp_path / "run").mkdir()
    (tmp_path / "run/loaded").write_text("580.105.08\n")
    (tmp_path / "run/hardware.json").write_text(
        '{"gpus": [{"index": 0, "name": "NVIDIA GeForce RTX 3090", "uuid": "GPU-1", '
        '"pci_bus_id": "00000000:01:00.0", "memory_total_mib": 24576, "power_default_w": 350, '
        '"power_min_w": 100, "power_max_w": 350, "vbios": "94.02.42.40.2A", '
        '"compute_cap": "8.6"}]}')
    proc = subprocess.run([str(smi), "--version"], env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and "DRIVER version      : 580.105.08" in proc.stdout
    (tmp_path / "run/loaded").write_text("590.44.01\n")  # new module, old user space
    proc = subprocess.run([str(smi), "-L"], env=env, capture_output=True, text=True)
    assert proc.returncode == 18 and "Driver/library version mismatch" in proc.stdout
