"""A stand-in for Docker's apt repository (download.docker.com/linux/debian) for Debian 12 hosts.

Debian 12 ships Docker 20.10 and Compose v1 only (TESTBED-FACTS.md), so a deploy installs Docker
from Docker's own repository there (docs.docker.com, "Install Docker Engine on Debian"). No
internet here: this builds the same five packages under Docker's names, versions in Docker's
scheme, relations as Docker declares them (docker-ce conflicts with Debian's docker.io,
containerd.io provides and conflicts with containerd and runc), from real binaries that run on
Debian 12:

============================  =========================================================
``docker-ce``                 dockerd + docker-proxy from Debian 13's docker.io (Docker 26,
                              glibc >= 2.34), docker-init = Debian 12's tini-static; Docker's
                              unit layout (/usr/bin/dockerd, docker.service, docker.socket)
``docker-ce-cli``             /usr/bin/docker from Debian 13's docker-cli
``containerd.io``             containerd, ctr, shims from Debian 13's containerd 1.7 and
                              /usr/bin/runc from Debian 12's runc (Debian 13's needs glibc 2.38)
``docker-compose-plugin``     /usr/libexec/docker/cli-plugins/docker-compose, Compose v2 from
                              Debian 13's docker-compose
``docker-buildx-plugin``      /usr/libexec/docker/cli-plugins/docker-buildx from Debian 13
============================  =========================================================

The Debian packages are fetched with apt inside the testbed's own debootstrapped base images
(so apt checks the archive signatures), once, into a cache outside the repository
(``$RIGFLEET_TESTBED_CACHE``, default ``~/.cache/rigfleet-testbed``); repackaging happens again
only when those inputs or this recipe change::

    debs = build_docker_debs(client, Path(".testbed/docker-debs"), images, log)
    aptrepo.build_repo(web_root, gnupg, debs, aptrepo.DOCKER_LAYOUT)
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import docker

from rigfleet_testbed.packages import FileEntry, Package, build_deb

Log = Callable[[str], None]
MAINTAINER = "rigfleet testbed (Docker CE stand-in) <testbed@rigfleet.test>"
COMPRESSION = ("-Zzstd", "-z3")
STAMP = "docker-standin.stamp"
PLUGINS = "/usr/libexec/docker/cli-plugins"
NOTE = (
    "This is a rigfleet testbed stand-in, not Docker's package: Debian's own builds under\n"
    "Docker's package name (see docs/architecture.md in the rigfleet repository).\n"
)


@dataclass(frozen=True)
class Source:
    """A Debian package the stand-ins are made of, and the release it comes from."""

    package: str
    suite: str


SOURCES = (
    Source("docker.io", "trixie"), Source("docker-cli", "trixie"),
    Source("containerd", "trixie"), Source("docker-compose", "trixie"),
    Source("docker-buildx", "trixie"), Source("runc", "bookworm"), Source("tini", "bookworm"),
)
DOCKER_PACKAGES = ("containerd.io", "docker-buildx-plugin", "docker-ce", "docker-ce-cli",
                   "docker-compose-plugin")


def cache_dir() -> Path:
    return Path(os.environ.get("RIGFLEET_TESTBED_CACHE")
                or Path.home() / ".cache" / "rigfleet-testbed")


def upstream_of(debian_version: str) -> str:
    """'26.1.5+dfsg1-9+deb13u1+b1' -> '26.1.5'; '1.7.24~ds1-6' -> '1.7.24'."""
    v = debian_version.split(":", 1)[-1].rsplit("-", 1)[0]
    return re.split(r"[+~]", v, maxsplit=1)[0]


def docker_version(upstream: str, epoch: bool = False) -> str:
    """Docker's Debian 12 version scheme: ``5:26.1.5-1~debian.12~bookworm``."""
    return f"{'5:' if epoch else ''}{upstream}-1~debian.12~bookworm"


# --- fetching ------------------------------------------------------------------------------------


def fetch_sources(client: docker.DockerClient, images: Mapping[str, str], cache: Path,
                  log: Log) -> dict[str, Path]:
    """The Debian .debs of :data:`SOURCES`, downloaded once per suite with ``apt-get download``.

    + images: suite -> base image with that release's sources.list (debootstrap writes it)
    """
    found: dict[str, Path] = {}
    for suite in sorted({s.suite for s in SOURCES}):
        names = [s.package for s in SOURCES if s.suite == suite]
        dest = cache / suite
        manifest = dest / "manifest.json"
        try:
            have = json.loads(manifest.read_text())
            if all((dest / have[n]).is_file() for n in names):
                found.update({n: dest / have[n] for n in names})
                continue
        except (OSError, ValueError, KeyError):
            pass
        dest.mkdir(parents=True, exist_ok=True)
        log(f"downloading {', '.join(names)} from Debian {suite} (cached in {dest})")
        script = ("set -e; apt-get update -qq; cd /out; "
                  f"apt-get download -qq {' '.join(names)} 2>&1 | grep -v unsandboxed || true; "
                  "ls *.deb")
        out = client.containers.run(images[suite], ["sh", "-c", script], remove=True,
                                    volumes={str(dest): {"bind": "/out", "mode": "rw"}})
        files = out.decode().split()
        picked = {}
        for n in names:
            matches = sorted(f for f in files if f.startswith(f"{n}_"))
            if not matches:
                raise RuntimeError(f"apt-get download {n} (Debian {suite}) fetched nothing")
            picked[n] = matches[-1]
        manifest.write_text(json.dumps(picked, indent=1) + "\n")
        found.update({n: dest / f for n, f in picked.items()})
    return found


# --- the packages --------------------------------------------------------------------------------


def _field(deb: Path, name: str) -> str:
    return subprocess.run(["dpkg-deb", "-f", str(deb), name], check=True, capture_output=True,
                          text=True).stdout.strip()


def _extract(deb: Path, into: Path) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run(["dpkg-deb", "-x", str(deb), str(into)], check=True)
    return into


def _bin(tree: Path, rel: str, dest: str) -> FileEntry:
    return FileEntry(dest, source=tree / rel.lstrip("/"), mode=0o755)


def _doc(name: str, origin: str) -> FileEntry:
    return FileEntry(f"/usr/share/doc/{name}/README.testbed",
                     (NOTE + f"Built from: {origin}\n").encode())


DOCKER_SERVICE = """\
[Unit]
Description=Docker Application Container Engine
Documentation=https://docs.docker.com
After=network-online.target docker.socket firewalld.service containerd.service
Wants=network-online.target
Requires=docker.socket containerd.service

[Service]
Type=notify
ExecStart=/usr/bin/dockerd -H fd:// --containerd=/run/containerd/containerd.sock
ExecReload=/bin/kill -s HUP $MAINPID
TimeoutStartSec=0
RestartSec=2
Restart=always
StartLimitBurst=3
StartLimitInterval=60s
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
Delegate=yes
KillMode=process
OOMScoreAdjust=-500

[Install]
WantedBy=multi-user.target
"""

DOCKER_SOCKET = """\
[Unit]
Description=Docker Socket for the API

[Socket]
ListenStream=/run/docker.sock
SocketMode=0660
SocketUser=root
SocketGroup=docker

[Install]
WantedBy=sockets.target
"""

CONTAINERD_SERVICE = """\
[Unit]
Description=containerd container runtime
Documentation=https://containerd.io
After=network.target local-fs.target

[Service]
ExecStartPre=-/sbin/modprobe overlay
ExecStart=/usr/bin/containerd
Type=notify
Delegate=yes
KillMode=process
Restart=always
RestartSec=5
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
OOMScoreAdjust=-999

[Install]
WantedBy=multi-user.target
"""

# containerd.io ships a config that turns the CRI plugin off (Docker does not use it).
CONTAINERD_CONFIG = b'disabled_plugins = ["cri"]\n'


def _units_postinst(units: tuple[str, ...], start: str, group: bool = False) -> str:
    """Enable the units and start one, the way dh_installsystemd's snippets do."""
    lines = ["#!/bin/sh", "set -e", 'if [ "$1" = "configure" ]; then']
    if group:
        lines += ["\tif ! getent group docker >/dev/null; then",
                  "\t\tgroupadd --system docker", "\tfi"]
    lines += [f"\tdeb-systemd-helper unmask '{u}' >/dev/null || true" for u in units]
    lines += [f"\tdeb-systemd-helper enable '{u}' >/dev/null || true" for u in units]
    lines += ["\tif [ -d /run/systemd/system ]; then",
              "\t\tsystemctl --system daemon-reload >/dev/null || true",
              f"\t\tdeb-systemd-invoke restart '{start}' >/dev/null || true", "\tfi", "fi", ""]
    return "\n".join(lines)


def _units_prerm(unit: str) -> str:
    return ("#!/bin/sh\nset -e\n"
            'if [ -d /run/systemd/system ] && [ "$1" = remove ]; then\n'
            f"\tdeb-systemd-invoke stop '{unit}' >/dev/null || true\nfi\n")


def _units_postrm(units: tuple[str, ...]) -> str:
    lines = ["#!/bin/sh", "set -e",
             'if [ -d /run/systemd/system ]; then', "\tsystemctl --system daemon-reload "
             ">/dev/null || true", "fi", 'if [ "$1" = "purge" ]; then']
    lines += [f"\tdeb-systemd-helper purge '{u}' >/dev/null || true" for u in units]
    lines += ["fi", ""]
    return "\n".join(lines)


def docker_packages(src: Mapping[str, Path], work: Path) -> list[Package]:
    """The five Docker packages made of the Debian .debs in ``src`` (extracted under work)."""
    tree = {name: _extract(deb, work / name) for name, deb in src.items()}
    up = {name: upstream_of(_field(deb, "Version")) for name, deb in src.items()}
    origin = {name: f"Debian {_field(deb, 'Package')} {_field(deb, 'Version')}"
              for name, deb in src.items()}
    engine = docker_version(up["docker.io"], epoch=True)
    cli = Package(
        "docker-ce-cli", docker_version(up["docker-cli"], epoch=True),
        "Docker CLI: the open-source application container engine",
        "The docker command line client (testbed stand-in).",
        depends=("libc6 (>= 2.34)",),
        relations=(("Recommends", "docker-buildx-plugin, docker-compose-plugin"),
                   ("Conflicts", "docker (<< 1.5~), docker-engine, docker.io"),
                   ("Breaks", "docker-ce (<< 5:0)"), ("Replaces", "docker-ce (<< 5:0)")),
        files=(_bin(tree["docker-cli"], "usr/bin/docker", "/usr/bin/docker"),
               FileEntry("/usr/share/bash-completion/completions/docker", source=tree[
                   "docker-cli"] / "usr/share/bash-completion/completions/docker"),
               _doc("docker-ce-cli", origin["docker-cli"])),
        section="admin", maintainer=MAINTAINER,
    )
    ce = Package(
        "docker-ce", engine, "Docker: the open-source application container engine",
        "The Docker engine, dockerd (testbed stand-in).",
        depends=("containerd.io (>= 1.6.24)", "docker-ce-cli", "iptables",
                 "libseccomp2 (>= 2.3.0)", "libc6 (>= 2.34)", "libsystemd0"),
        relations=(("Recommends", "ca-certificates, pigz, procps, xz-utils"),
                   ("Conflicts", "docker (<< 1.5~), docker-engine, docker.io"),
                   ("Replaces", "docker-engine")),
        files=(_bin(tree["docker.io"], "usr/sbin/dockerd", "/usr/bin/dockerd"),
               _bin(tree["docker.io"], "usr/sbin/docker-proxy", "/usr/bin/docker-proxy"),
               _bin(tree["tini"], "usr/bin/tini-static", "/usr/bin/docker-init"),
               FileEntry("/usr/lib/systemd/system/docker.service", DOCKER_SERVICE.encode()),
               FileEntry("/usr/lib/systemd/system/docker.socket", DOCKER_SOCKET.encode()),
               FileEntry("/etc/docker/"),
               _doc("docker-ce", f"{origin['docker.io']}, {origin['tini']}")),
        scripts=(("postinst", _units_postinst(("docker.socket", "docker.service"),
                                              "docker.service", group=True)),
                 ("prerm", _units_prerm("docker.service")),
                 ("postrm", _units_postrm(("docker.socket", "docker.service")))),
        section="admin", maintainer=MAINTAINER,
    )
    ctd_tree = tree["containerd"]
    containerd = Package(
        "containerd.io", f"{up['containerd']}-1", "An open and reliable container runtime",
        "containerd and runc (testbed stand-in).",
        depends=("libc6 (>= 2.34)", "libseccomp2 (>= 2.5.0)"),
        relations=(("Conflicts", "containerd, runc"), ("Replaces", "containerd, runc"),
                   ("Provides", "containerd, runc")),
        files=tuple(_bin(ctd_tree, f"usr/bin/{b}", f"/usr/bin/{b}") for b in (
            "containerd", "containerd-shim-runc-v2", "ctr")) + (
            _bin(tree["runc"], "usr/sbin/runc", "/usr/bin/runc"),
            FileEntry("/etc/containerd/config.toml", CONTAINERD_CONFIG),
            FileEntry("/usr/lib/systemd/system/containerd.service", CONTAINERD_SERVICE.encode()),
            _doc("containerd.io", f"{origin['containerd']}, {origin['runc']}")),
        scripts=(("postinst", _units_postinst(("containerd.service",), "containerd.service")),
                 ("prerm", _units_prerm("containerd.service")),
                 ("postrm", _units_postrm(("containerd.service",)))),
        conffiles=("/etc/containerd/config.toml",), section="devel", maintainer=MAINTAINER,
    )
    compose = Package(
        "docker-compose-plugin", docker_version(up["docker-compose"]),
        "Docker Compose (V2) plugin for the Docker CLI",
        "docker compose, installed as a CLI plugin (testbed stand-in).",
        depends=("libc6 (>= 2.34)",), relations=(("Enhances", "docker-ce-cli"),),
        files=(_bin(tree["docker-compose"], f"{PLUGINS}/docker-compose",
                    f"{PLUGINS}/docker-compose"),
               _doc("docker-compose-plugin", origin["docker-compose"])),
        section="admin", maintainer=MAINTAINER,
    )
    buildx = Package(
        "docker-buildx-plugin", docker_version(up["docker-buildx"]),
        "Docker Buildx CLI plugin", "docker buildx, installed as a CLI plugin (stand-in).",
        depends=("libc6 (>= 2.34)",), relations=(("Enhances", "docker-ce-cli"),),
        files=(_bin(tree["docker-buildx"], f"{PLUGINS}/docker-buildx",
                    f"{PLUGINS}/docker-buildx"),
               _doc("docker-buildx-plugin", origin["docker-buildx"])),
        section="admin", maintainer=MAINTAINER,
    )
    return [containerd, buildx, ce, cli, compose]


def _stamp(src: Mapping[str, Path]) -> str:
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for name in sorted(src):
        digest.update(f"{name}={src[name].name}:{src[name].stat().st_size}".encode())
    return digest.hexdigest()


def build_docker_debs(client: docker.DockerClient, out_dir: Path, images: Mapping[str, str],
                      log: Log, cache: Path | None = None) -> list[Path]:
    """The Docker stand-in .debs in out_dir, rebuilt only when their inputs changed."""
    src = fetch_sources(client, images, cache or cache_dir(), log)
    stamp = _stamp(src)
    out_dir.mkdir(parents=True, exist_ok=True)
    built = sorted(out_dir.glob("*.deb"))
    if (out_dir / STAMP).exists() and (out_dir / STAMP).read_text() == stamp and \
            {p.name.split("_", 1)[0] for p in built} == set(DOCKER_PACKAGES):
        return built
    log("repackaging Debian's Docker builds as the Docker CE stand-in packages")
    with tempfile.TemporaryDirectory(prefix="rigfleet-dockerdebs-") as tmp:
        pkgs = docker_packages(src, Path(tmp))
        paths = [build_deb(p, out_dir, COMPRESSION) for p in pkgs]
    for old in out_dir.glob("*.deb"):
        if old not in paths:
            old.unlink()
    (out_dir / STAMP).write_text(stamp)
    return sorted(paths)
