"""The Docker CE repository stand-in: Docker's names, versions, relations and repository layout.

The Debian packages it is made of are replaced by small .debs with the same file paths and
versions, so the test needs neither the network nor Docker.
"""

from __future__ import annotations

import gzip
import re
import subprocess
from pathlib import Path

import pytest
from rigfleet_testbed import aptrepo, dockerrepo, packages
from rigfleet_testbed.packages import FileEntry, Package

FAKE_SOURCES = {
    "docker.io": ("26.1.5+dfsg1-9+deb13u1+b1", ["usr/sbin/dockerd", "usr/sbin/docker-proxy"]),
    "docker-cli": ("26.1.5+dfsg1-9+deb13u1+b1",
                   ["usr/bin/docker", "usr/share/bash-completion/completions/docker"]),
    "containerd": ("1.7.24~ds1-6+deb13u1", ["usr/bin/containerd", "usr/bin/ctr",
                                            "usr/bin/containerd-shim-runc-v2"]),
    "docker-compose": ("2.26.1-4", ["usr/libexec/docker/cli-plugins/docker-compose"]),
    "docker-buildx": ("0.13.1+ds1-3", ["usr/libexec/docker/cli-plugins/docker-buildx"]),
    "runc": ("1.1.5+ds1-1+deb12u1", ["usr/sbin/runc"]),
    "tini": ("0.19.0-1+b3", ["usr/bin/tini-static"]),
}


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("debian")
    return {name: packages.build_deb(Package(
        name, version, "fake", "fake Debian package",
        files=tuple(FileEntry(f"/{p}", f"#!/bin/sh\necho {name} {p}\n".encode(), 0o755)
                    for p in paths)), out)
        for name, (version, paths) in FAKE_SOURCES.items()}


@pytest.fixture(scope="module")
def built(sources, tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("docker")
    pkgs = dockerrepo.docker_packages(sources, base / "work")
    debs = [packages.build_deb(p, base / "debs", dockerrepo.COMPRESSION) for p in pkgs]
    info = aptrepo.build_repo(base / "web", base / "gnupg", debs, aptrepo.DOCKER_LAYOUT)
    return {p.name: p for p in pkgs}, debs, info


def test_versions_follow_dockers_scheme() -> None:
    assert dockerrepo.upstream_of("26.1.5+dfsg1-9+deb13u1+b1") == "26.1.5"
    assert dockerrepo.upstream_of("1.7.24~ds1-6+deb13u1") == "1.7.24"
    assert dockerrepo.docker_version("26.1.5", epoch=True) == "5:26.1.5-1~debian.12~bookworm"
    assert dockerrepo.docker_version("2.26.1") == "2.26.1-1~debian.12~bookworm"


def _contents(deb: Path) -> dict[str, str]:
    out = subprocess.run(["dpkg-deb", "-c", str(deb)], check=True, capture_output=True,
                         text=True).stdout
    return {line.split()[5].lstrip("."): line.split()[0] for line in out.splitlines()}


def test_packages_have_dockers_names_files_and_relations(built) -> None:
    pkgs, debs, _ = built
    assert sorted(pkgs) == sorted(dockerrepo.DOCKER_PACKAGES)
    assert pkgs["docker-ce"].version == "5:26.1.5-1~debian.12~bookworm"
    assert pkgs["docker-ce-cli"].version == "5:26.1.5-1~debian.12~bookworm"
    assert pkgs["containerd.io"].version == "1.7.24-1"
    assert pkgs["docker-compose-plugin"].version == "2.26.1-1~debian.12~bookworm"
    assert pkgs["docker-buildx-plugin"].version == "0.13.1-1~debian.12~bookworm"
    rel = {name: dict(p.relations) for name, p in pkgs.items()}
    assert "docker.io" in rel["docker-ce"]["Conflicts"]  # as Docker's own package
    assert rel["containerd.io"]["Provides"] == "containerd, runc"
    assert rel["containerd.io"]["Conflicts"] == "containerd, runc"
    assert "containerd.io (>= 1.6.24)" in pkgs["docker-ce"].depends
    assert "docker-compose-plugin" in rel["docker-ce-cli"]["Recommends"]
    by_name = {d.name.split("_")[0]: d for d in debs}
    assert by_name["docker-ce"].name == "docker-ce_26.1.5-1~debian.12~bookworm_amd64.deb"
    files = {name: _contents(deb) for name, deb in by_name.items()}
    assert {"/usr/bin/dockerd", "/usr/bin/docker-proxy", "/usr/bin/docker-init",
            "/usr/lib/systemd/system/docker.service", "/usr/lib/systemd/system/docker.socket",
            "/etc/docker/"} <= set(files["docker-ce"])
    assert files["docker-ce"]["/usr/bin/dockerd"].startswith("-rwx")
    assert "/usr/bin/docker" in files["docker-ce-cli"]
    assert {"/usr/bin/containerd", "/usr/bin/runc", "/usr/bin/ctr",
            "/usr/lib/systemd/system/containerd.service"} <= set(files["containerd.io"])
    assert "/usr/libexec/docker/cli-plugins/docker-compose" in files["docker-compose-plugin"]
    assert "/usr/libexec/docker/cli-plugins/docker-buildx" in files["docker-buildx-plugin"]
    service = next(f.data.decode() for f in pkgs["docker-ce"].files
                   if f.path.endswith("docker.service"))
    assert "ExecStart=/usr/bin/dockerd -H fd:// --containerd=/run/containerd/containerd.sock" \
        in service
    postinst = dict(pkgs["docker-ce"].scripts)["postinst"]
    assert "groupadd --system docker" in postinst and "restart 'docker.service'" in postinst


def test_repository_is_laid_out_like_download_docker_com(built, tmp_path: Path) -> None:
    _, _, info = built
    repo = info.repo_dir
    assert repo == info.web_root / "linux/debian"
    dists = repo / "dists/bookworm"
    text = (dists / "stable/binary-amd64/Packages").read_text()
    assert gzip.decompress((dists / "stable/binary-amd64/Packages.gz").read_bytes()).decode() \
        == text
    files = re.findall(r"^Filename: (.+)$", text, re.MULTILINE)
    assert files and all(f.startswith("dists/bookworm/pool/stable/amd64/") for f in files)
    assert all((repo / f).is_file() for f in files)
    release = (dists / "Release").read_text()
    for line in ("Origin: Docker", "Label: Docker CE", "Suite: bookworm", "Codename: bookworm",
                 "Components: stable", "Architectures: amd64"):
        assert line in release
    key = info.web_root / "linux/debian/gpg"  # armored, as https://download.docker.com/linux/debian/gpg
    assert key.read_text().startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----")
    keyring = tmp_path / "docker.gpg"
    subprocess.run(["gpg", "--dearmor", "-o", str(keyring), str(key)], check=True)
    proc = subprocess.run(["gpgv", "--keyring", str(keyring), "InRelease"], cwd=dists,
                          capture_output=True, text=True)
    assert proc.returncode == 0 and info.fingerprint in proc.stderr
    nvidia = aptrepo.TOOLKIT_LAYOUT
    # its own key, as Docker's repository has
    assert aptrepo.ensure_key(info.web_root.parent / "gnupg", nvidia.key_uid, nvidia.key_algo,
                              nvidia.cert_digest) != info.fingerprint


def test_a_complete_download_cache_is_used_without_docker(sources, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    for suite in ("trixie", "bookworm"):
        names = [s.package for s in dockerrepo.SOURCES if s.suite == suite]
        (cache / suite).mkdir(parents=True)
        for n in names:
            (cache / suite / sources[n].name).write_bytes(sources[n].read_bytes())
        (cache / suite / "manifest.json").write_text(
            '{' + ", ".join(f'"{n}": "{sources[n].name}"' for n in names) + '}')
    found = dockerrepo.fetch_sources(None, {}, cache, log=print)  # type: ignore[arg-type]
    assert sorted(found) == sorted(FAKE_SOURCES)
