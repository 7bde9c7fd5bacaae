"""Bring the simulated fleet up, show it, take it down.

``up`` is idempotent: it builds what is missing, starts what is stopped, and rewrites the
generated inventory and pins. The pieces (see docs/architecture.md):

- ``rigfleet-registry``: the pull mirror serving ``vllm/vllm-openai`` as Docker Hub does today
  (every release, the 14 newest nightlies; ``rigfleet_testbed.mirror``);
- ``rigfleet-services``: signed apt repositories (the NVIDIA stand-ins; Docker CE's stand-in
  when a host runs Debian 12), Hugging Face-compatible hub, Genesis git repositories, PyPI
  stand-in;
- ``rigfleet-hostN``: bare Debian 13 (or 12) hosts with systemd, sshd, simulated dual-3090
  hardware and UEFI firmware (Secure Boot, MOK list), logged into as root or a sudo user;
- ``rigfleet-lb1`` (``--balancer``): a bare Debian 13 host of the same image without GPU
  hardware, in the inventory groups ``balancers`` (the fleet endpoint, HAProxy),
  ``monitors`` (Prometheus, Alertmanager) and ``caches`` (the fleet cache);
- ``.testbed-<n>/archives/<tag>.tar``: ``docker save`` copies of purged nightlies an operator
  kept.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from pprint import pformat
from typing import Any

import docker
import docker.errors
import yaml

from rigfleet.pins import GenesisPin, Pins
from rigfleet.registry import Registry, RegistryError
from rigfleet_testbed import (
    firmware,
    hardware,
    hostspec,
    images,
    layout,
    mirror,
    nvidiarepo,
    vllm_builds,
    vllm_images,
)
from rigfleet_testbed.hostspec import HostSpec
from rigfleet_testbed.layout import BalancerSlot, HostOS, HostSlot

Log = Callable[[str], None]


class TestbedError(RuntimeError):
    """Something the testbed needs is missing; the message says what to do."""


def client() -> docker.DockerClient:
    try:
        c = docker.from_env(timeout=600)
        c.ping()
        return c
    except docker.errors.DockerException as exc:
        raise TestbedError(
            f"no Docker engine answers ({exc}). Start one: `make testbed-deps` installs and "
            "starts dockerd on a Debian machine."
        ) from None


@dataclass
class Paths:
    root: Path = layout.STATE_DIR

    @property
    def ssh_key(self) -> Path:
        return self.root / "ssh" / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.root / "ssh" / "known_hosts"

    def owner(self) -> str:
        """Who a container was made for: this state directory and its SSH key (made first)."""
        pub = self.ssh_key.with_suffix(".pub").read_bytes()
        return hostspec.hashed({"state": str(self.root.resolve()), "key": pub.decode()})

    @property
    def services_data(self) -> Path:
        return self.root / "services"

    @property
    def gnupg(self) -> Path:
        return self.root / "gnupg"

    @property
    def api_key(self) -> Path:
        return self.root / "secrets" / "api-key"

    @property
    def alertmanager(self) -> Path:
        """The monitor's Alertmanager config, as an operator keeps it (host data
        ``monitor_alertmanager_file``)."""
        return self.root / "secrets" / "alertmanager.yml"

    @property
    def tls(self) -> Path:
        """The testbed's CA (``ca.pem``) and each TLS host's ``<host>.pem`` / ``.key``."""
        return self.root / "secrets" / "tls"

    @property
    def pins(self) -> Path:
        return self.root / "pins.yaml"

    @property
    def fixtures(self) -> Path:
        return self.root / "fixtures.json"

    @property
    def archives(self) -> Path:
        """``docker save`` archives of purged nightlies (the copy an operator kept)."""
        return self.root / "archives"

    @property
    def docker_debs(self) -> Path:
        return self.root / "docker-debs"

    def hardware(self, host: str) -> Path:
        return self.root / "hosts" / host / "hardware.json"

    def firmware(self, host: str) -> Path:
        """The host's simulated UEFI NVRAM (``rigfleet_testbed.firmware``)."""
        return self.root / "hosts" / host / "firmware"

    def host_meta(self, host: str) -> Path:
        return self.root / "hosts" / host / "host.json"


@dataclass
class UpOptions:
    hosts: int = 2
    hardware_overrides: list[dict[str, Any]] = field(default_factory=list)
    inventory: Path = layout.INVENTORY
    oses: list[tuple[str, HostOS]] = field(default_factory=list)
    sudo: list[str] = field(default_factory=list)
    # The serving simulators' clock on every host (a host's override wins); 1 = real time.
    sim_speedup: float = hardware.DEFAULT_SIM_SPEEDUP
    # A balancer host (lb1) in the inventory group `balancers`.
    balancer: bool = False
    # Hosts whose front serves TLS: the testbed's CA signs a certificate for each, and the
    # inventory names the files (front_tls_*) as a user's would.
    tls: list[str] = field(default_factory=list)


# -- artifacts on the control machine --------------------------------------------------------


def ensure_secrets(paths: Paths) -> None:
    paths.ssh_key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not paths.ssh_key.exists():
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "rigfleet-testbed",
             "-f", str(paths.ssh_key)], check=True,
        )
    paths.api_key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not paths.api_key.exists():
        fd = os.open(paths.api_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"rf-{secrets.token_urlsafe(24)}\n")
    if not paths.alertmanager.exists():
        # A webhook with a bearer token, as an operator's chat bridge would have: nothing
        # listens there (Alertmanager logs its failed sends); the token must stay unseen.
        fd = os.open(paths.alertmanager, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("route:\n  receiver: testbed-ops\n  group_by: [alertname, instance]\n"
                    "receivers:\n  - name: testbed-ops\n    webhook_configs:\n"
                    "      - url: http://127.0.0.1:9/alerts\n        send_resolved: false\n"
                    "        http_config:\n          authorization:\n"
                    f"            credentials: am-{secrets.token_urlsafe(16)}\n")


def ensure_tls(paths: Paths, host: str) -> dict[str, str]:
    """A certificate for ``host``'s front, signed by the testbed's own CA (made once): valid
    for the names the control side and a balancer use (127.0.0.1, ``host``). Returns the host
    data a user writes for it (``front_tls_*``)."""
    d = paths.tls
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    ca, ca_key = d / "ca.pem", d / "ca.key"

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    old = os.umask(0o077)  # keys are born 0600
    try:
        if not ca.exists():
            openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650",
                    "-subj", "/CN=rigfleet testbed CA", "-keyout", str(ca_key), "-out", str(ca))
        cert, key = d / f"{host}.pem", d / f"{host}.key"
        if not cert.exists():
            csr, ext = d / f"{host}.csr", d / f"{host}.ext"
            ext.write_text(f"subjectAltName=IP:127.0.0.1,DNS:{host}\n"
                           "extendedKeyUsage=serverAuth\n")
            openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={host}",
                    "-keyout", str(key), "-out", str(csr))
            openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
                    "-CAcreateserial", "-days", "825", "-extfile", str(ext), "-out", str(cert))
            csr.unlink()
            ext.unlink()
    finally:
        os.umask(old)
    os.chmod(cert, 0o644)
    return {"front_tls_cert_file": str(cert), "front_tls_key_file": str(key),
            "front_tls_ca_file": str(ca)}


def build_service_data(paths: Paths, log: Log) -> dict[str, Any]:
    """The apt repository, the model on the hub, the Genesis repositories and the PyPI index,
    on disk (the services container serves them read-only)."""
    from rigfleet_testbed import genesis_fixture, model_fixture, pypi_fixture

    data = paths.services_data
    log("building stand-in packages and NVIDIA's signed apt repositories")
    nvidiarepo.build_nvidia_repos(paths.root / "debs", paths.services_data / "apt",
                                  paths.gnupg)
    log("building the model fixture, the Genesis repositories and the PyPI index")
    model = model_fixture.build_model_fixture(data / "hub")
    next_model = model_fixture.build_next_model_fixture(data / "hub")
    genesis = genesis_fixture.build_genesis_fixture(data / "git", layout.GENESIS_BUNDLE)
    if genesis.real_path is None:
        log(f"real Genesis history not served: {layout.GENESIS_BUNDLE} is not there")
    pypi = pypi_fixture.build_index(data / "pypi")
    fixtures = {
        # revision: the known-good commit the fleet is pinned at; main has moved on to
        # later_revision, the re-quantised upload that fails verify-stress's needles.
        "model": {"repo": model.repo, "revision": model.commit,
                  "later_revision": model.later_commit},
        # A second model repo (one commit) for a stack file that serves another model.
        "next_model": {"repo": next_model.repo, "revision": next_model.commit},
        "genesis": {
            "url": layout.GENESIS_URL, "old_url": layout.GENESIS_OLD_URL,
            "real_url": layout.GENESIS_REAL_URL if genesis.real_path else None,
            "branches": genesis.branches, "tags": genesis.tags,
            "commits": [{"sha": c.sha, "title": c.title, "allowlist": list(c.allowlist),
                         "pending": list(c.pending), "layout": c.layout, "branch": c.branch,
                         "tag": c.tag} for c in genesis.all_commits()],
        },
        "pypi": {"url": layout.PYPI_URL, "packages": pypi},
        "vllm": {"images": vllm_builds.summary(vllm_builds.BUILDS),
                 "archives": {b.tag: str(vllm_images.archive_path(paths.archives, b))
                              for b in vllm_builds.BUILDS if b.archived}},
    }
    paths.fixtures.write_text(json.dumps(fixtures, indent=2) + "\n")
    return fixtures


def sim_builds() -> tuple[list[vllm_builds.Build], list[vllm_builds.Build]]:
    """(builds the mirror serves, purged builds an operator kept as archives)."""
    served, purged = vllm_builds.retention(vllm_builds.BUILDS)
    return served, [b for b in purged if b.archived]


def host_kind(os_: HostOS) -> str:
    return f"host-{os_.name}"


def build_images(c: docker.DockerClient, paths: Paths, log: Log,
                 oses: set[HostOS] | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """Build what changed. Returns (the pinned image of each container kind: ``host-<os>``,
    ``registry``, ``services``; the base image of each Debian suite that was needed).

    Containers are made from the pinned images, whatever another checkout does to the tags.
    """
    oses = oses or {layout.DEFAULT_OS}
    bases = {o.codename: images.ensure_base(c, log, o.codename)
             for o in sorted(oses | {layout.DEFAULT_OS}, key=lambda o: o.name)}
    ca = images.site_ca_files()
    jobs: dict[str, tuple[Path, str, dict[str, str] | None, dict[str, Path] | None]] = {
        host_kind(o): (layout.IMAGES_DIR / "host", o.host_image,
                       {"BASE": o.base_image, "MOKUTIL_VERSION": MOKUTIL_VERSIONS[o.codename]},
                       ca)
        for o in sorted(oses, key=lambda o: o.name)}
    jobs["registry"] = (layout.IMAGES_DIR / "registry", layout.REGISTRY_IMAGE, None, None)
    jobs["services"] = (layout.IMAGES_DIR / "services", layout.SERVICES_IMAGE, None, None)
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures: dict[str, Future[Any]] = {
            kind: pool.submit(images.build, c, ctx, tag, log, args, extra, True)
            for kind, (ctx, tag, args, extra) in jobs.items()}
        futures["sim-base"] = pool.submit(vllm_images.ensure_base, c, log)
        refs = {kind: f.result() for kind, f in futures.items()}
    served, kept = sim_builds()
    built = vllm_images.build_sim_images(c, served + kept, log)
    if built:
        log(f"built {len(built)} vllm/vllm-openai simulator image(s)")
    with ThreadPoolExecutor(max_workers=2) as pool:
        for saved in [pool.submit(vllm_images.save_archive, c, b, paths.archives, log)
                      for b in kept]:
            saved.result()
    return {kind: refs[kind].ref for kind in jobs}, bases


# Debian's mokutil version per release; the hosts' stand-in is this + "+rigfleet1", so apt sees
# the installed stand-in as newer and `apt-get install mokutil` leaves it (images/host).
MOKUTIL_VERSIONS = {"trixie": "0.7.2-1", "bookworm": "0.6.0-2"}


def build_docker_repo(c: docker.DockerClient, paths: Paths, bases: dict[str, str],
                      log: Log) -> str:
    """Docker CE's apt repository stand-in under the apt web root; returns its key fingerprint.

    Only Debian 12 hosts need it; it is built the first time one is asked for (both base
    images are needed then) and kept after. The key exists either way (the inventory names it).
    """
    from rigfleet_testbed import aptrepo, dockerrepo

    if {"bookworm", "trixie"} <= set(bases):
        debs = dockerrepo.build_docker_debs(c, paths.docker_debs, bases, log)
        return aptrepo.build_repo(paths.services_data / "apt", paths.gnupg, debs,
                                  aptrepo.DOCKER_LAYOUT).fingerprint
    fpr = aptrepo.ensure_key(paths.gnupg, aptrepo.DOCKER_LAYOUT.key_uid,
                             aptrepo.DOCKER_LAYOUT.key_algo)
    if paths.docker_debs.is_dir() and any(paths.docker_debs.glob("*.deb")):
        aptrepo.build_repo(paths.services_data / "apt", paths.gnupg, paths.docker_debs,
                           aptrepo.DOCKER_LAYOUT)
    return fpr


# -- containers --------------------------------------------------------------------------------


def _get(c: docker.DockerClient, name: str, wait_s: float = 120.0):
    """The container ``name``, or None; one Docker is still removing (a ``down`` just before)
    counts as gone once it is: it cannot be started again."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            ctr = c.containers.get(name)
        except docker.errors.NotFound:
            return None
        if ctr.status != "removing":
            return ctr
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name}: Docker is still removing it after {wait_s:g}s; "
                               "try again once `docker ps -a` no longer lists it")
        time.sleep(1.0)


def _network(c: docker.DockerClient):
    """Our network by exact name (Docker's name filter also matches other instances')."""
    return next((n for n in c.networks.list(names=[layout.NETWORK])
                 if n.name == layout.NETWORK), None)


def ensure_network(c: docker.DockerClient) -> None:
    if _network(c) is not None:
        return
    ipam = docker.types.IPAMConfig(
        pool_configs=[docker.types.IPAMPool(subnet=layout.SUBNET, gateway=layout.GATEWAY)]
    )
    c.networks.create(layout.NETWORK, driver="bridge", ipam=ipam,
                      labels={layout.LABEL: layout.LABEL_VALUE})


def _create(
    c: docker.DockerClient,
    name: str,
    image: str,
    ip: str,
    aliases: Iterable[str],
    ports: dict[str, tuple[str, int]],
    labels: dict[str, str] | None = None,
    **host_config: Any,
):
    api = c.api
    networking = api.create_networking_config(
        {layout.NETWORK: api.create_endpoint_config(ipv4_address=ip, aliases=list(aliases))}
    )
    hc = api.create_host_config(
        port_bindings={k: v for k, v in ports.items()}, restart_policy={"Name": "always"},
        **host_config,
    )
    api.create_container(
        image, name=name, hostname=name.removeprefix("rigfleet-"), detach=True,
        ports=[int(p.split("/")[0]) for p in ports], host_config=hc,
        networking_config=networking, labels={layout.LABEL: layout.LABEL_VALUE, **(labels or {})},
    )
    return c.containers.get(name)


OWNER_LABEL = "io.rigfleet_testbed.owner"


def _current(c: docker.DockerClient, name: str, image: str, paths: Paths):
    """The container ``name``, or None when it is missing, runs another build than ``image``
    or was made for another state directory (then it is removed: the registry and services keep
    their data in bind mounts, of the state directory they were made for)."""
    ctr = _get(c, name)
    if ctr is not None and (ctr.image.id != c.images.get(image).id
                            or (ctr.labels or {}).get(OWNER_LABEL) != paths.owner()):
        ctr.remove(force=True)
        return None
    return ctr


def ensure_registry(c: docker.DockerClient, paths: Paths, log: Log, image: str) -> None:
    if (ctr := _current(c, layout.REGISTRY_CONTAINER, image, paths)) is None:
        ctr = _create(
            c, layout.REGISTRY_CONTAINER, image, layout.REGISTRY_IP,
            [layout.REGISTRY_ALIAS], {"5000/tcp": ("127.0.0.1", layout.REGISTRY_LOCAL_PORT)},
            # A directory, not a volume: pushed images survive `down`, so a second `up` is quick.
            binds={str(paths.root / "registry"): {"bind": "/var/lib/docker-registry",
                                                   "mode": "rw"}},
            labels={OWNER_LABEL: paths.owner()},
        )
    if ctr.status != "running":
        ctr.start()
    _wait_http(f"http://127.0.0.1:{layout.REGISTRY_LOCAL_PORT}/v2/", "registry")
    try:
        report = mirror.publish(c, f"http://127.0.0.1:{layout.REGISTRY_LOCAL_PORT}",
                                vllm_builds.BUILDS, log)
    except mirror.MirrorError as exc:
        raise TestbedError(str(exc)) from None
    log(f"mirror: {len(report.pushed) + len(report.unchanged)} vllm/vllm-openai tags served "
        f"({len(report.pushed)} pushed, "
        f"{len(report.deleted)} purged nightlies deleted)")


def _aliases(ctr) -> set[str]:
    nets = ctr.attrs.get("NetworkSettings", {}).get("Networks") or {}
    return set((nets.get(layout.NETWORK) or {}).get("Aliases") or [])


def ensure_services(c: docker.DockerClient, paths: Paths, image: str) -> None:
    ctr = _current(c, layout.SERVICES_CONTAINER, image, paths)
    if ctr is not None and not set(layout.SERVICES_ALIASES) <= _aliases(ctr):
        ctr.remove(force=True)  # made before a name was added (download.docker.rigfleet.test)
        ctr = None
    if ctr is None:
        ctr = _create(
            c, layout.SERVICES_CONTAINER, image, layout.SERVICES_IP,
            layout.SERVICES_ALIASES,
            {"8080/tcp": ("127.0.0.1", layout.HUB_LOCAL_PORT),
             "80/tcp": ("127.0.0.1", layout.APT_LOCAL_PORT),
             "8090/tcp": ("127.0.0.1", layout.GIT_LOCAL_PORT),
             f"{layout.PYPI_PORT}/tcp": ("127.0.0.1", layout.PYPI_LOCAL_PORT)},
            binds={str(paths.services_data): {"bind": "/srv/testbed", "mode": "ro"}},
            labels={OWNER_LABEL: paths.owner()},
        )
    if ctr.status != "running":
        ctr.start()
    _wait_http(f"http://127.0.0.1:{layout.APT_LOCAL_PORT}/libnvidia-container/gpgkey",
               "apt repositories")
    git = f"http://127.0.0.1:{layout.GIT_LOCAL_PORT}"
    _wait_http(f"{git}/{layout.GENESIS_URL.rsplit('/', 1)[-1]}/HEAD", "git")
    _wait_http(f"http://127.0.0.1:{layout.PYPI_LOCAL_PORT}/simple/", "pypi")


# The gate's CV bound on the testbed (inventory data gate_set; see inventory_text).
TESTBED_CV_MAX = 0.50
HOST_CONFIG_LABEL = "io.rigfleet_testbed.host-config"
HOST_OS_LABEL = "io.rigfleet_testbed.os"
# The NVIDIA character devices (devnodes): the host may open them, as root on a real machine can;
# with no driver behind them an open then fails with ENXIO instead of EPERM.
HOST_DEVICE_RULES = ("c 195:* rwm", "c 509:* rwm")


def ensure_host(c: docker.DockerClient, spec: HostSpec, paths: Paths, image: str) -> bool:
    """Create (or re-create, when what it is made of changed) and start one host from the
    pinned ``image``; True if new."""
    slot = spec.slot
    image_id = c.images.get(image).id
    wanted = spec.config_hash(image_id, paths.owner())
    ctr = _get(c, slot.container)
    if ctr is not None and (ctr.labels or {}).get(HOST_CONFIG_LABEL) != wanted:
        ctr.remove(force=True)  # a different machine now: new disk, new firmware
        _remove_volume(c, slot.docker_volume)
        ctr = None
    created = ctr is None
    if created:
        init_firmware(spec, paths)
        ctr = _create(
            c, slot.container, image, slot.ip, [slot.name],
            {"22/tcp": ("127.0.0.1", slot.ssh_port), "8000/tcp": ("127.0.0.1", slot.front_port)},
            labels={HOST_CONFIG_LABEL: wanted, HOST_OS_LABEL: spec.os.name},
            cap_add=list(layout.HOST_CAPS),
            security_opt=["seccomp=unconfined", "apparmor=unconfined"],
            cgroupns="host",
            tmpfs={"/run": "", "/run/lock": ""},
            device_cgroup_rules=list(HOST_DEVICE_RULES),
            binds={
                "/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "rw"},
                slot.docker_volume: {"bind": "/var/lib/docker", "mode": "rw"},
                str(paths.hardware(slot.name)): {"bind": "/etc/nvidia-sim/hardware.json",
                                                 "mode": "ro"},
                str(paths.firmware(slot.name)): {"bind": "/etc/nvidia-sim/firmware",
                                                 "mode": "rw"},
            },
        )
        pub = paths.ssh_key.with_suffix(".pub").read_bytes()
        if not spec.sudo:
            ctr.put_archive("/root/.ssh", images.tar_of({"authorized_keys": pub}))
        mok = paths.firmware(slot.name) / ".dkms-key"
        if mok.is_dir():  # mok_enrolled: the machine already has its DKMS key, enrolled
            ctr.put_archive("/var/lib", images.tar_of(
                {"dkms/mok.key": (mok / "mok.key").read_bytes(),
                 "dkms/mok.pub": (mok / "mok.pub").read_bytes()}))
    if ctr.status != "running":
        ctr.start()
    if created and spec.sudo:
        add_sudo_user(ctr, paths.ssh_key.with_suffix(".pub").read_text().strip())
    return created


BALANCER_CONFIG_VERSION = "1"


def ensure_balancer(c: docker.DockerClient, slot: BalancerSlot, paths: Paths,
                    image: str) -> bool:
    """Create (or re-create when its image changed) and start the balancer host: the host
    image (systemd, sshd), no GPU hardware, firmware or Docker volume; True if new."""
    wanted = hostspec.hashed({"v": BALANCER_CONFIG_VERSION, "image": c.images.get(image).id,
                              "owner": paths.owner()})
    ctr = _get(c, slot.container)
    if ctr is not None and (ctr.labels or {}).get(HOST_CONFIG_LABEL) != wanted:
        ctr.remove(force=True)
        ctr = None
    created = ctr is None
    if created:
        ctr = _create(
            c, slot.container, image, slot.ip, [slot.name],
            {"22/tcp": ("127.0.0.1", slot.ssh_port),
             f"{layout.BALANCER_PORT}/tcp": ("127.0.0.1", slot.port)},
            labels={HOST_CONFIG_LABEL: wanted, HOST_OS_LABEL: layout.DEFAULT_OS.name},
            cap_add=list(layout.HOST_CAPS),
            security_opt=["seccomp=unconfined", "apparmor=unconfined"],
            cgroupns="host", tmpfs={"/run": "", "/run/lock": ""},
            binds={"/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "rw"}},
        )
        ctr.put_archive("/root/.ssh", images.tar_of(
            {"authorized_keys": paths.ssh_key.with_suffix(".pub").read_bytes()}))
    if ctr.status != "running":
        ctr.start()
    return created


def init_firmware(spec: HostSpec, paths: Paths) -> None:
    """A new machine's NVRAM from its profile; with mok_enrolled, a DKMS key already enrolled."""
    sb = spec.profile.get("secure_boot") or {}
    nvram = paths.firmware(spec.name)
    enrolled: list[bytes] = []
    key = cert = None
    if sb.get("mok_enrolled"):
        key, cert = firmware.dkms_key_pair()
        enrolled.append(cert)
    firmware.init_nvram(nvram, bool(sb.get("enabled")), enrolled)
    if key is not None and cert is not None:
        # Kept beside the NVRAM (not in it) only to put it on the host's disk at creation.
        keep = nvram / ".dkms-key"
        keep.mkdir(mode=0o700)
        (keep / "mok.key").write_bytes(key)
        os.chmod(keep / "mok.key", 0o600)
        (keep / "mok.pub").write_bytes(cert)


def add_sudo_user(ctr, public_key: str) -> None:
    """The host's administrator ``rig``: key login, passwordless sudo, no root login by key."""
    script = (
        f"set -e; u={layout.SUDO_USER}; "
        'id "$u" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash --groups sudo "$u"; '
        'install -d -m 700 -o "$u" -g "$u" "/home/$u/.ssh"; '
        'printf "%s\n" "$KEY" > "/home/$u/.ssh/authorized_keys"; '
        'chown "$u:$u" "/home/$u/.ssh/authorized_keys"; '
        'chmod 600 "/home/$u/.ssh/authorized_keys"; '
        'printf "%s ALL=(ALL) NOPASSWD:ALL\n" "$u" > "/etc/sudoers.d/90-$u"; '
        'chmod 440 "/etc/sudoers.d/90-$u"'
    )
    rc, out = ctr.exec_run(["sh", "-c", script], environment={"KEY": public_key})
    if rc != 0:
        raise TestbedError(f"{ctr.name}: creating the sudo user failed: {out.decode()[-500:]}")


def _remove_volume(c: docker.DockerClient, name: str) -> None:
    with contextlib.suppress(docker.errors.NotFound):
        c.volumes.get(name).remove(force=True)


def host_key(c: docker.DockerClient, slot: HostSlot | BalancerSlot,
             timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ctr = _get(c, slot.container)
        if ctr is not None and ctr.status == "running":
            rc, out = ctr.exec_run(["cat", "/etc/ssh/ssh_host_ed25519_key.pub"])
            if rc == 0 and _port_open(slot.ssh_port):
                return out.decode().split()[0] + " " + out.decode().split()[1]
        time.sleep(0.5)
    raise TestbedError(f"{slot.name}: sshd did not come up within {timeout:.0f}s")


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        try:
            s.connect(("127.0.0.1", port))
            return s.recv(4).startswith(b"SSH")
        except OSError:
            return False


def _wait_http(url: str, what: str, timeout: float = 60) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=3):
                return
        except Exception as exc:  # connection refused while it starts
            if time.monotonic() > deadline:
                raise TestbedError(f"{what} at {url} did not answer: {exc}") from None
            time.sleep(0.3)


# -- generated inventory and pins ------------------------------------------------------------


def fixture_genesis(pin: GenesisPin, genesis: dict[str, Any]) -> GenesisPin:
    """The fixture repository's commit of the same Genesis release as ``pin`` (the same tag:
    v12.1.0 -> the fixture's v12.1.0; v7.72.2 -> its v7.72.2 on ``dev``), with the same
    layout: real Genesis cannot patch the simulator, so boots use the fixture's commits."""
    version = pin.version or ""
    for c in genesis["commits"]:
        if version and (c.get("tag") == version or f"release({version})" in c["title"]
                        or c["title"].startswith(f"release: {version}")):
            return GenesisPin(layout.GENESIS_URL, c["sha"], c.get("layout") or pin.layout,
                              pin.version)
    raise TestbedError(f"pins.yaml: Genesis {version or pin.commit[:12]} has no counterpart in "
                       "the testbed's Genesis fixture (its releases: "
                       + ", ".join(str(c.get("tag") or c["title"]) for c in genesis["commits"])
                       + ")")


def resolved_pins(pins: Pins, digests: Mapping[str, str], revision: str) -> Pins:
    """``pins`` with registry digests (stack -> digest) and the default model's revision filled
    in (``write_pins`` validates the result as the deploy reads it)."""
    model = replace(pins.model, revision=revision)
    return replace(
        pins, model=model,
        models={r: model if r == model.repo else m for r, m in pins.models.items()},
        stacks={n: replace(s, digest=digests.get(n, s.digest)) for n, s in pins.stacks.items()})


def write_pins(paths: Paths, fixtures: dict[str, Any], log: Log = print) -> None:
    """The fleet's pins with the testbed's own digests, model commit and Genesis repository.

    Digests come from the testbed mirror, the model commit from the hub (as ``rigfleet pins
    lock`` does). An image the mirror does not serve (a purged nightly: Docker Hub 404s it too)
    keeps ``unresolved``, so the deploy refuses those pins as it would on real hosts.
    """
    from rigfleet.pins import dump_pins, load_pins, parse_pins

    pins = load_pins(layout.REPO_ROOT / "pins.yaml", allow_unresolved=True)
    pins = replace(pins, path=str(paths.pins), history=[])
    reg = Registry(f"http://127.0.0.1:{layout.REGISTRY_LOCAL_PORT}")
    digests, missing = {}, []
    for name, stack in pins.stacks.items():
        try:
            digests[name] = reg.digest(stack.repository, stack.tag)
        except RegistryError:
            missing.append(name)
            log(f"pins: stacks.{name}: {stack.image_ref} is not on the mirror (Docker Hub has "
                f"no such tag today); left unresolved in {paths.pins}")
    # The hub's main has moved on to a re-quantised upload; the fleet stays locked at the
    # revision it was pinned at (what `rigfleet pins lock` resolved before that push).
    pins = resolved_pins(pins, digests, fixtures["model"]["revision"])
    pins = replace(pins, stacks={
        name: replace(s, genesis=fixture_genesis(s.genesis, fixtures["genesis"]))
        if s.genesis is not None else s
        for name, s in pins.stacks.items()})
    text = dump_pins(pins)
    # Never write pins the deploy refuses for any other reason.
    parse_pins(yaml.safe_load(text), str(paths.pins), allow_unresolved=bool(missing))
    paths.pins.write_text(
        "# Generated by `rigfleet testbed up` from pins.yaml with the testbed's digests, model\n"
        "# commit and Genesis repository. Git-ignored.\n" + text
    )


def _login(paths: Paths, port: int, user: str = "root") -> dict[str, Any]:
    """SSH data of a testbed host (absolute paths: the inventory works from any directory)."""
    return {"ssh_hostname": "127.0.0.1", "ssh_port": port, "ssh_user": user,
            "ssh_key": str(paths.ssh_key), "ssh_known_hosts_file": str(paths.known_hosts),
            "ssh_strict_host_key_checking": "yes"}


# A one-card rig's stack and cap (the second seed's setup: TP=1 fp8 KV + MTP at 330 W).
SINGLE_CARD_DATA = {"stack": "single-fp8-mtp", "gpu_count": 1, "power_caps_w": 330}


def inventory_text(specs: list[HostSpec], paths: Paths, docker_fpr: str,
                   balancers: list[BalancerSlot] | None = None,
                   tls: dict[str, dict[str, str]] | None = None) -> str:
    rel = str  # absolute paths: the inventory works from any working directory
    hosts = []
    for spec in specs:
        slot = spec.slot
        scheme = "https" if spec.name in (tls or {}) else "http"
        data: dict[str, Any] = {
            **_login(paths, slot.ssh_port, spec.ssh_user),
            "front_url": f"{scheme}://127.0.0.1:{slot.front_port}",
            # A balancer reaches the front on the testbed network, by the host's name.
            "balancer_front_address": f"{slot.name}:8000",
            "testbed_container": slot.container,
            # What `rigfleet check --online` asks the apt repositories for.
            "os": f"debian {spec.os.version_id}",
            # The stack files' tok/s references are a real rig's; the simulators run
            # sim_speedup times faster, so the gate judges them against references x that.
            "throughput_scale": float(spec.profile.get("sim_speedup") or 1.0),
            **(tls or {}).get(spec.name, {}),
        }
        if len(spec.profile.get("gpus") or ()) == 1:
            data.update(SINGLE_CARD_DATA)
        if spec.sudo:
            data["_sudo"] = True  # pyinfra: every operation through sudo
        hosts.append(f"    ({slot.name!r}, {pformat(data, indent=4, width=96)}),")
    common = {
        "pins_file": rel(paths.pins),
        "api_key_file": rel(paths.api_key),
        "docker_registry_mirror": layout.MIRROR_URL,
        "hf_endpoint": layout.HUB_URL,
        # Genesis' runtime packages come from the testbed's PyPI stand-in (a LAN index).
        "runtime_pip_index_url": layout.PYPI_URL,
        # The simulators answer in seconds: the gate's fast profile (same checks, smaller depths).
        "gate_profile": "fast",
        # The simulators decode sim_speedup (40) times faster than a rig, so a 1000-token run
        # lasts ~0.2 s and every host shares this machine's cores: the machine alone puts up
        # to ~20% (at times ~40%) run-to-run CV on a healthy stack while hosts swap at once (a
        # rig's cards: ~2-4%). The testbed's bound sits above that; an unstable build's
        # alternating decode speed (CV ~70-90%) still fails it. The margin (15% below the
        # baseline) is the stack file's.
        "gate_set": [f"throughput_cv_max={TESTBED_CV_MAX:g}"],
        # The control side reaches the mirror and the Genesis repository on loopback ports.
        "bump_registry": f"http://127.0.0.1:{layout.REGISTRY_LOCAL_PORT}",
        "bump_genesis_url": layout.GENESIS_URL.replace(layout.GIT_BASE_URL,
                                                       f"http://127.0.0.1:{layout.GIT_LOCAL_PORT}"),
        "apt_repos": {
            # NVIDIA's repositories as inventory/group_data/all.py names them: host names and
            # key fingerprints (the stand-in keys') differ.
            **nvidiarepo.apt_repos_data(paths.gnupg),
            # Docker's repository as a user points at download.docker.com; the stand-in has
            # Debian 12 (bookworm), where Debian itself has no Compose v2.
            "docker": {
                "url": layout.DOCKER_APT_URL,
                "key_url": layout.DOCKER_APT_KEY_URL,
                "suite": "{codename}", "components": ["stable"],
                "key_fingerprint": docker_fpr,
            },
        },
    }
    lines = [
        '"""The simulated fleet. Generated by `rigfleet testbed up`; git-ignored.',
        "",
        "Same deploy, same code paths as inventory/home.py; only addresses differ.",
        '"""',
        "",
        f"_testbed_data = {pformat(common, width=96, sort_dicts=False)}",
        "",
        "gpu_hosts = (",
        "    [",
        *["    " + h for h in hosts],
        "    ],",
        "    _testbed_data,",
        ")",
        "",
        f"canary = [{specs[0].name!r}]",
        "",
    ]
    if balancers:
        lbs = []
        for b in balancers:
            lb_data = {**_login(paths, b.ssh_port), "balancer_url": f"http://127.0.0.1:{b.port}",
                       "testbed_container": b.container,
                       # The fleet cache: the rigs reach it by its name on the testbed network;
                       # it pulls through from the twin's registry (Docker Hub's stand-in).
                       "cache_address": b.name, "cache_registry_upstream": layout.MIRROR_URL,
                       "monitor_alertmanager_file": rel(paths.alertmanager)}
            lbs.append(f"        ({b.name!r}, {pformat(lb_data, indent=4, width=96)}),")
        lines += ["# The fleet endpoint: HAProxy on a host of its own (no GPU, no Docker).",
                  "balancers = (", "    [", *lbs, "    ],", "    _testbed_data,", ")", "",
                  "# The monitor (Prometheus, Alertmanager) on the balancer's host.",
                  "monitors = (", "    [", *lbs, "    ],", "    _testbed_data,", ")", "",
                  "# The fleet cache (images and weights) on the balancer's host too.",
                  "caches = (", "    [", *lbs, "    ],", "    _testbed_data,", ")", ""]
    return "\n".join(lines)


def write_known_hosts(paths: Paths, keys: dict[HostSlot | BalancerSlot, str]) -> None:
    lines = [f"[127.0.0.1]:{slot.ssh_port} {key}" for slot, key in sorted(
        keys.items(), key=lambda kv: kv[0].ssh_port)]
    paths.known_hosts.write_text("\n".join(lines) + "\n")


# -- the commands ------------------------------------------------------------------------------


def up(options: UpOptions, log: Log = print) -> list[HostSlot]:
    if not 1 <= options.hosts <= 12:
        raise TestbedError(f"--hosts {options.hosts}: the testbed runs 1 to 12 hosts")
    try:
        specs = hostspec.host_specs(options.hosts, options.hardware_overrides, options.oses,
                                    options.sudo, options.sim_speedup)
    except ValueError as exc:
        raise TestbedError(str(exc)) from None
    paths = Paths()
    c = client()
    ensure_secrets(paths)
    t0 = time.monotonic()
    fixtures = build_service_data(paths, log)
    t1 = time.monotonic()
    refs, bases = build_images(c, paths, log, {s.os for s in specs}
                               | ({layout.DEFAULT_OS} if options.balancer else set()))
    docker_fpr = build_docker_repo(c, paths, bases, log)
    t2 = time.monotonic()
    ensure_network(c)
    ensure_registry(c, paths, log, refs["registry"])
    ensure_services(c, paths, refs["services"])
    log(f"service data {t1 - t0:.1f}s, images {t2 - t1:.1f}s, "
        f"registry+services {time.monotonic() - t2:.1f}s")
    for spec in specs:
        hw = paths.hardware(spec.name)
        hw.parent.mkdir(parents=True, exist_ok=True)
        hw.write_text(hardware.render(spec.profile))
        paths.host_meta(spec.name).write_text(json.dumps(spec.metadata(), indent=1) + "\n")
        extra = f", {spec.os.name}" + (f", user {spec.ssh_user} (sudo)" if spec.sudo else "")
        log(f"starting {spec.name} (ssh 127.0.0.1:{spec.slot.ssh_port}{extra})")
        ensure_host(c, spec, paths, refs[host_kind(spec.os)])
    lbs = [BalancerSlot(1)] if options.balancer else []
    for lb in lbs:
        log(f"starting {lb.name} (ssh 127.0.0.1:{lb.ssh_port}, balancer 127.0.0.1:{lb.port}, "
            "no GPU)")
        ensure_balancer(c, lb, paths, refs[host_kind(layout.DEFAULT_OS)])
        meta = paths.host_meta(lb.name)
        meta.parent.mkdir(parents=True, exist_ok=True)
        meta.write_text(json.dumps({"name": lb.name, "os": layout.DEFAULT_OS.name,
                                    "codename": layout.DEFAULT_OS.codename, "ssh_user": "root",
                                    "sudo": False, "balancer": True}, indent=1) + "\n")
    keys: dict[HostSlot | BalancerSlot, str] = {spec.slot: host_key(c, spec.slot)
                                                for spec in specs}
    keys |= {lb: host_key(c, lb) for lb in lbs}
    write_known_hosts(paths, keys)
    write_pins(paths, fixtures, log)
    unknown = sorted(set(options.tls) - {s.name for s in specs})
    if unknown:
        raise TestbedError(f"--tls {', '.join(unknown)}: no such host")
    tls = {h: ensure_tls(paths, h) for h in options.tls}
    options.inventory.write_text(inventory_text(specs, paths, docker_fpr, lbs, tls))
    return [s.slot for s in specs]


def mok_enroll(host: str, log: Log = print, reboot: bool = True, timeout: float = 180) -> None:
    """A person at ``host``'s console at the next boot, enrolling what ``mokutil --import``
    asked for (shim's MokManager, testbed-firmware-boot); with ``reboot`` the person also
    reboots the machine and waits until it is back."""
    paths = Paths()
    nvram = paths.firmware(host)
    if not nvram.is_dir():
        raise TestbedError(f"{host}: no such testbed host (no firmware at {nvram})")
    pending = firmware.pending_requests(nvram)
    if not pending:
        raise TestbedError(
            f"{host}: no MOK enrolment request is pending (`mokutil --list-new` is empty); "
            "run `mokutil --import /var/lib/dkms/mok.pub` on the host first")
    firmware.arm_console(nvram)
    log(f"{host}: a person will be at the console at the next boot to enrol "
        f"{len(pending)} key(s)")
    if not reboot:
        return
    c = client()
    slot = next((s for s in (HostSlot(i) for i in range(1, 13)) if s.name == host), None)
    ctr = _get(c, slot.container) if slot else None
    if slot is None or ctr is None or ctr.status != "running":
        raise TestbedError(f"{host}: its container is not running")
    before = firmware.boot_log(nvram)
    ctr.exec_run(["systemctl", "reboot"], detach=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(1)
        after = firmware.boot_log(nvram)
        if len(after) > len(before):
            host_key(c, slot, max(deadline - time.monotonic(), 1))
            for line in after[len(before):]:
                log(f"{host}: {line.split(' ', 1)[-1]}")
            return
    raise TestbedError(f"{host}: did not boot again within {timeout:.0f}s")


def _ours(c: docker.DockerClient) -> list:
    return c.containers.list(
        all=True, filters={"label": f"{layout.LABEL}={layout.LABEL_VALUE}"})


def down(log: Log = print) -> None:
    c = client()
    for ctr in _ours(c):
        log(f"removing {ctr.name}")
        ctr.remove(force=True, v=True)
    if (net := _network(c)) is not None:
        net.remove()
    prefix = layout.REGISTRY_VOLUME.removesuffix("registry-data")
    for vol in c.volumes.list():
        if vol.name == layout.REGISTRY_VOLUME or (
            vol.name.startswith(prefix + "host") and vol.name.endswith("-docker")
        ):
            vol.remove(force=True)
    for path in [layout.INVENTORY, Paths().root / "hosts"]:
        if path.is_file():
            path.unlink()
        elif path.is_dir():
            import shutil

            shutil.rmtree(path)


def status() -> list[dict[str, Any]]:
    """One row per testbed container: state, addresses, and for hosts the GPU driver state."""
    c = client()
    rows = []
    for ctr in sorted(_ours(c), key=lambda x: x.name):
        row: dict[str, Any] = {"name": ctr.name, "state": ctr.status}
        ports = ctr.attrs.get("NetworkSettings", {}).get("Ports") or {}
        row["ports"] = ", ".join(
            f"{b[0]['HostIp']}:{b[0]['HostPort']}->{p}" for p, b in ports.items() if b)
        if HOST_OS_LABEL in (ctr.labels or {}):
            row["os"] = ctr.labels[HOST_OS_LABEL]
        if ctr.name.rsplit("-", 1)[-1].startswith("host") and ctr.status == "running":
            rc, out = ctr.exec_run(["sh", "-c", "cat /run/nvidia-sim/loaded 2>/dev/null"])
            row["driver"] = out.decode().strip() if rc == 0 and out.strip() else "not loaded"
            rc, out = ctr.exec_run(["systemctl", "is-system-running"])
            row["systemd"] = out.decode().strip()
        rows.append(row)
    return rows
