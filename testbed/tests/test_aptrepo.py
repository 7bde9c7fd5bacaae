"""The stand-in packages build, and NVIDIA's apt repositories made of them are laid out, signed
and stocked as NVIDIA's are (rigfleet_testbed.nvidiarepo)."""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import subprocess
from pathlib import Path

import pytest
from rigfleet_testbed import aptrepo, nvidiarepo

DRIVER = ("nvidia-kernel-open-dkms", "nvidia-smi", "nvidia-persistenced", "nvidia-driver-cuda")
TOOLKIT = ("nvidia-container-toolkit", "nvidia-container-toolkit-base",
           "libnvidia-container-tools", "libnvidia-container1")
ALL_BRANCHES = ["580.105.08-1", "595.58.03-1", "620.37.02-1"]
EXPECTED = {
    "debian12": dict.fromkeys(DRIVER, ALL_BRANCHES),
    "debian13": dict.fromkeys(DRIVER, ["595.58.03-1", "620.37.02-1"]),  # no 580 (#38, #40)
    "ubuntu2204": dict.fromkeys(DRIVER, ALL_BRANCHES),
    "ubuntu2404": dict.fromkeys(DRIVER, ALL_BRANCHES),
    "toolkit": dict.fromkeys(TOOLKIT, ["1.17.7-1", "1.17.8-1", "1.20.0-1"]),
}
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, aptrepo.RepoInfo], Path]:
    base = tmp_path_factory.mktemp("apt")
    return nvidiarepo.build_nvidia_repos(base / "debs", base / "web", base / "gnupg"), base


def _paragraphs(text: str) -> list[dict[str, str]]:
    out = []
    for block in text.strip().split("\n\n"):
        fields = dict(re.findall(r"^([\w-]+): (.*)$", block, re.MULTILINE))
        out.append(fields)
    return out


def test_each_repository_lists_the_branches_nvidias_carries(built) -> None:
    repos, _ = built
    assert set(repos) == set(EXPECTED)
    for name, info in repos.items():
        text = (info.repo_dir / "Packages").read_text()
        assert gzip.decompress((info.repo_dir / "Packages.gz").read_bytes()).decode() == text
        found: dict[str, list[str]] = {}
        for p in _paragraphs(text):
            found.setdefault(p["Package"], []).append(p["Version"])
            assert p["Filename"].startswith("./")  # flat: the .debs beside the indexes
            deb = info.repo_dir / p["Filename"]
            assert deb.exists() and int(p["Size"]) == deb.stat().st_size
            assert p["SHA256"] == hashlib.sha256(deb.read_bytes()).hexdigest()
            assert p["Architecture"] == "amd64"
        assert {k: sorted(v) for k, v in found.items()} == EXPECTED[name], name


def test_the_pinned_branch_is_in_every_cuda_repository(built) -> None:
    """The shipped defaults work on each supported OS: pins.yaml's driver branch is one that
    every distribution's repository carries (580 is not in debian13's)."""
    from rigfleet.pins import load_pins

    branch = load_pins(REPO / "pins.yaml", allow_unresolved=True).driver_branch
    repos, _ = built
    for distro in aptrepo.CUDA_BRANCHES:
        assert any(v.startswith(f"{branch}.") for v in repos[distro].versions(
            "nvidia-driver-cuda")), distro
    assert not any(v.startswith("580.") for v in repos["debian13"].versions("nvidia-smi"))


def test_dependencies_are_pinned_to_the_same_version(built) -> None:
    repos, _ = built
    pars = {(p["Package"], p["Version"]): p for name in ("debian12", "toolkit")
            for p in _paragraphs((repos[name].repo_dir / "Packages").read_text())}
    assert pars[("nvidia-driver-cuda", "580.105.08-1")]["Depends"] == (
        "nvidia-kernel-open-dkms (= 580.105.08-1), nvidia-smi (= 580.105.08-1), "
        "nvidia-persistenced (= 580.105.08-1)")
    assert pars[("nvidia-container-toolkit", "1.17.7-1")]["Depends"].startswith(
        "nvidia-container-toolkit-base (= 1.17.7-1), libnvidia-container-tools (= 1.17.7-1)")
    assert pars[("libnvidia-container-tools", "1.17.8-1")]["Depends"] == (
        "libnvidia-container1 (= 1.17.8-1)")
    assert "python3" in pars[("nvidia-smi", "595.58.03-1")]["Depends"]


def _keyring(info: aptrepo.RepoInfo, tmp: Path) -> Path:
    out = tmp / f"{info.layout.repo_dir.replace('/', '_')}.gpg"
    subprocess.run(["gpg", "--batch", "--yes", "--dearmor", "-o", str(out),
                    str(info.public_key)], check=True)
    return out


def test_flat_release_is_signed_and_checksums_match(built, tmp_path: Path) -> None:
    repos, _ = built
    for name, info in repos.items():
        keyring = _keyring(info, tmp_path)
        for args in (["InRelease"], ["Release.gpg", "Release"]):
            proc = subprocess.run(["gpgv", "--keyring", str(keyring), *args],
                                  cwd=info.repo_dir, capture_output=True, text=True)
            assert proc.returncode == 0, (name, proc.stderr)
            assert info.fingerprint in proc.stderr
        release = (info.repo_dir / "Release").read_text()
        assert "Origin: NVIDIA" in release
        assert "Suite:" not in release and "Components:" not in release  # flat
        sums = re.findall(r"^ ([0-9a-f]{64}) +(\d+) (\S+)$", release, re.MULTILINE)
        assert {rel for _, _, rel in sums} == {"Packages", "Packages.gz"}
        for digest, size, rel in sums:
            data = (info.repo_dir / rel).read_bytes()
            assert (hashlib.sha256(data).hexdigest(), len(data)) == (digest, int(size))


def test_each_repository_is_signed_with_the_key_nvidia_uses(built, tmp_path: Path) -> None:
    repos, _ = built
    old = {repos[d].fingerprint for d in ("debian12", "ubuntu2204", "ubuntu2404")}
    assert len(old) == 1  # NVIDIA does not rotate the keys of existing repositories
    assert repos["debian13"].fingerprint not in old
    assert repos["toolkit"].fingerprint not in old | {repos["debian13"].fingerprint}
    # Key files named as NVIDIA names them, beside each repository.
    assert repos["debian12"].public_key.name == "3bf863cc.pub"
    assert repos["debian13"].public_key.name == "8793F200.pub"
    # debian12's InRelease does not verify with debian13's key.
    proc = subprocess.run(["gpgv", "--keyring", str(_keyring(repos["debian13"], tmp_path)),
                           "InRelease"], cwd=repos["debian12"].repo_dir, capture_output=True)
    assert proc.returncode != 0


def _self_signature_digests(public_key: Path) -> set[int]:
    """The digest algorithms (RFC 4880 ids: 2 = SHA-1, 10 = SHA-512) of a key's user-id
    self-signatures (sigclass 0x13, what sqv calls a PositiveCertification)."""
    dump = subprocess.run(["gpg", "--list-packets"], input=public_key.read_bytes(),
                          capture_output=True, check=True).stdout.decode()
    sigs = dump.split(":signature packet:")[1:]
    return {int(m.group(1)) for sig in sigs if "sigclass 0x13" in sig
            for m in [re.search(r"digest algo (\d+)", sig)] if m}


def test_the_old_key_is_sha1_bound_and_the_new_one_is_not(built) -> None:
    """As NVIDIA's 3bf863cc (what Debian 13's sqv refuses since 2026-02-01) and 8793F200."""
    repos, _ = built
    assert _self_signature_digests(repos["debian12"].public_key) == {2}
    assert _self_signature_digests(repos["debian13"].public_key) == {10}
    assert _self_signature_digests(repos["toolkit"].public_key) == {10}


def test_rebuild_is_idempotent_and_reuses_the_keys(built) -> None:
    repos, base = built
    before = {p: p.stat().st_mtime_ns for p in base.rglob("*") if p.is_file()}
    again = nvidiarepo.build_nvidia_repos(base / "debs", base / "web", base / "gnupg")
    assert {k: v.fingerprint for k, v in again.items()} == {
        k: v.fingerprint for k, v in repos.items()}
    after = {p: p.stat().st_mtime_ns for p in base.rglob("*") if p.is_file()}
    changed = [p for p in after if before.get(p) != after[p] and "gnupg" not in p.parts]
    assert changed == []


def test_kmod_package_enables_but_never_starts_its_unit(built, tmp_path: Path) -> None:
    debs = built[1] / "debs"
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
    debs = built[1] / "debs"
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
    (tmp_path / "run/loaded").write_text("595.58.03\n")  # new module, old user space
    proc = subprocess.run([str(smi), "-L"], env=env, capture_output=True, text=True)
    assert proc.returncode == 18 and "Driver/library version mismatch" in proc.stdout
