"""Bring the simulated fleet up, show it, take it down.

``up`` is idempotent: it builds what is missing, starts what is stopped, and rewrites the
generated inventory and pins. The pieces (see docs/architecture.md):

- ``rigfleet-registry``: the pull mirror holding ``vllm/vllm-openai:nightly-<sha>`` simulators;
- ``rigfleet-services``: signed apt repositories (the NVIDIA stand-ins; Docker CE's stand-in
  when a host runs Debian 12), Hugging Face-compatible hub, Genesis git repo;
- ``rigfleet-hostN``: bare Debian 13 (or 12) hosts with systemd, sshd, simulated dual-3090
  hardware and UEFI firmware (Secure Boot, MOK list), logged into as root or a sudo user.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from pprint import pformat
from typing import Any

import docker
import docker.errors
import yaml

from rigfleet.registry import Registry
from rigfleet_testbed import firmware, hardware, hostspec, images, layout
from rigfleet_testbed.hostspec import HostSpec
from rigfleet_testbed.layout import HostOS, HostSlot

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
    def pins(self) -> Path:
        return self.root / "pins.yaml"

    @property
    def fixtures(self) -> Path:
        return self.root / "fixtures.json"

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


def build_service_data(paths: Paths, log: Log) -> dict[str, Any]:
    """The apt repository, the model on the hub and the Genesis repository, on disk."""
    from rigfleet_testbed import aptrepo, genesis_fixture, model_fixture, packages

    data = paths.services_data
    log("building stand-in packages and the signed apt repository")
    debs = paths.root / "debs"
    packages.build_all(debs)
    aptrepo.build_repo(data / "apt", paths.gnupg, debs)
    log("building the model fixture and the Genesis repository")
    model = model_fixture.build_model_fixture(data / "hub")
    genesis = genesis_fixture.build_genesis_fixture(data / "git")
    fixtures = {
        # revision: the known-good commit the fleet is pinned at; main has moved on to
        # later_revision, the re-quantised upload that fails verify-stress's needles.
        "model": {"repo": model.repo, "revision": model.commit,
                  "later_revision": model.later_commit},
        "genesis": {"url": layout.GENESIS_URL,
                    "commits": [{"sha": c[0], "title": c[1], "allowlist": list(c[2])}
                                for c in genesis.commits]},
    }
    paths.fixtures.write_text(json.dumps(fixtures, indent=2) + "\n")
    return fixtures


def build_images(c: docker.DockerClient, log: Log,
                 oses: set[HostOS] | None = None) -> dict[str, str]:
    """All images; returns the base image of each Debian suite that was needed."""
    oses = oses or {layout.DEFAULT_OS}
    bases = {o.codename: images.ensure_base(c, log, o.codename)
             for o in sorted(oses | {layout.DEFAULT_OS}, key=lambda o: o.name)}
    ca = images.site_ca_files()
    jobs = [
        (layout.IMAGES_DIR / "host", o.host_image,
         {"BASE": o.base_image, "MOKUTIL_VERSION": MOKUTIL_VERSIONS[o.codename]}, ca)
        for o in sorted(oses, key=lambda o: o.name)
    ] + [
        (layout.IMAGES_DIR / "registry", layout.REGISTRY_IMAGE, None, None),
        (layout.IMAGES_DIR / "services", layout.SERVICES_IMAGE, None, None),
    ]
    # The simulators share every layer but the last, so build one first, then the rest.
    sims = [
        (layout.IMAGES_DIR / "vllm-sim", n.image,
         {"VLLM_VERSION": n.version, "VLLM_COMMIT": n.sha,
          "VLLM_REGRESSIONS": ",".join(n.regressions)}, None)
        for n in layout.NIGHTLIES
    ]
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = [pool.submit(images.build, c, ctx, tag, log, args, extra)
                   for ctx, tag, args, extra in jobs + sims[:1]]
        for f in futures:
            f.result()
        for f in [pool.submit(images.build, c, ctx, tag, log, args, extra)
                  for ctx, tag, args, extra in sims[1:]]:
            f.result()
    return bases


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
    fpr = aptrepo.ensure_key(paths.gnupg, aptrepo.DOCKER_LAYOUT.key_uid)
    if paths.docker_debs.is_dir() and any(paths.docker_debs.glob("*.deb")):
        aptrepo.build_repo(paths.services_data / "apt", paths.gnupg, paths.docker_debs,
                           aptrepo.DOCKER_LAYOUT)
    return fpr


# -- containers --------------------------------------------------------------------------------


def _get(c: docker.DockerClient, name: str):
    try:
        return c.containers.get(name)
    except docker.errors.NotFound:
        return None


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
    c.networks.create(layout.NETWORK, driver="bridge", ipam=ipam, labels={layout.LABEL: layout.LABEL_VALUE})


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


def ensure_registry(c: docker.DockerClient, paths: Paths, log: Log) -> None:
    if (ctr := _get(c, layout.REGISTRY_CONTAINER)) is None:
        ctr = _create(
            c, layout.REGISTRY_CONTAINER, layout.REGISTRY_IMAGE, layout.REGISTRY_IP,
            [layout.REGISTRY_ALIAS], {"5000/tcp": ("127.0.0.1", layout.REGISTRY_LOCAL_PORT)},
            # A directory, not a volume: pushed images survive `down`, so a second `up` is quick.
            binds={str(paths.root / "registry"): {"bind": "/var/lib/docker-registry",
                                                   "mode": "rw"}},
        )
    if ctr.status != "running":
        ctr.start()
    _wait_http(f"http://127.0.0.1:{layout.REGISTRY_LOCAL_PORT}/v2/", "registry")
    reg = Registry(f"http://127.0.0.1:{layout.REGISTRY_LOCAL_PORT}")
    for nightly in layout.NIGHTLIES:
        local = c.images.get(nightly.image)
        try:
            pushed = reg.digest(layout.SIM_IMAGE_REPO, nightly.tag)
        except Exception:
            pushed = None
        if pushed and pushed in {d.split("@")[-1] for d in local.attrs.get("RepoDigests", [])}:
            continue
        target = f"127.0.0.1:{layout.REGISTRY_LOCAL_PORT}/{layout.SIM_IMAGE_REPO}"
        local.tag(target, nightly.tag)
        log(f"pushing {nightly.image} to the mirror")
        for line in c.images.push(target, nightly.tag, stream=True, decode=True):
            if "error" in line:
                raise TestbedError(f"push of {nightly.image} failed: {line['error']}")


def _aliases(ctr) -> set[str]:
    nets = ctr.attrs.get("NetworkSettings", {}).get("Networks") or {}
    return set((nets.get(layout.NETWORK) or {}).get("Aliases") or [])


def ensure_services(c: docker.DockerClient, paths: Paths) -> None:
    ctr = _get(c, layout.SERVICES_CONTAINER)
    if ctr is not None and not set(layout.SERVICES_ALIASES) <= _aliases(ctr):
        ctr.remove(force=True)  # made before a name was added (download.docker.rigfleet.test)
        ctr = None
    if ctr is None:
        ctr = _create(
            c, layout.SERVICES_CONTAINER, layout.SERVICES_IMAGE, layout.SERVICES_IP,
            layout.SERVICES_ALIASES,
            {"8080/tcp": ("127.0.0.1", layout.HUB_LOCAL_PORT),
             "80/tcp": ("127.0.0.1", layout.APT_LOCAL_PORT),
             "8090/tcp": ("127.0.0.1", layout.GIT_LOCAL_PORT)},
            binds={str(paths.services_data): {"bind": "/srv/testbed", "mode": "ro"}},
        )
    if ctr.status != "running":
        ctr.start()
    _wait_http(f"http://127.0.0.1:{layout.APT_LOCAL_PORT}/rigfleet-testbed.asc", "apt repo")
    _wait_http(f"http://127.0.0.1:{layout.GIT_LOCAL_PORT}/genesis-vllm-patches.git/HEAD", "git")


HOST_CONFIG_LABEL = "io.rigfleet_testbed.host-config"
HOST_OS_LABEL = "io.rigfleet_testbed.os"
# The NVIDIA character devices (devnodes): the host may open them, as root on a real machine can;
# with no driver behind them an open then fails with ENXIO instead of EPERM.
HOST_DEVICE_RULES = ("c 195:* rwm", "c 509:* rwm")


def ensure_host(c: docker.DockerClient, spec: HostSpec, paths: Paths) -> bool:
    """Create (or re-create, when what it is made of changed) and start one host; True if new."""
    slot = spec.slot
    image_id = c.images.get(spec.os.host_image).id
    wanted = spec.config_hash(image_id)
    ctr = _get(c, slot.container)
    if ctr is not None and (ctr.labels or {}).get(HOST_CONFIG_LABEL) != wanted:
        ctr.remove(force=True)  # a different machine now: new disk, new firmware
        _remove_volume(c, slot.docker_volume)
        ctr = None
    created = ctr is None
    if created:
        init_firmware(spec, paths)
        ctr = _create(
            c, slot.container, spec.os.host_image, slot.ip, [slot.name],
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
    try:
        c.volumes.get(name).remove(force=True)
    except docker.errors.NotFound:
        pass


def host_key(c: docker.DockerClient, slot: HostSlot, timeout: float = 90) -> str:
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


def write_pins(paths: Paths, fixtures: dict[str, Any]) -> None:
    """The fleet's pins with the testbed's own digests, model commit and Genesis repository.

    Resolved through the same code as ``rigfleet pins lock``, against the testbed mirror and hub.
    """
    from dataclasses import replace

    from rigfleet.pinlock import resolve, with_genesis
    from rigfleet.pins import dump_pins, load_pins, parse_pins

    pins = load_pins(layout.REPO_ROOT / "pins.yaml", allow_unresolved=True)
    pins = replace(pins, path=str(paths.pins), history=[])
    pins = resolve(pins, Registry(f"http://127.0.0.1:{layout.REGISTRY_LOCAL_PORT}"),
                   f"http://127.0.0.1:{layout.HUB_LOCAL_PORT}", refresh=True)
    pins = with_genesis(pins, layout.GENESIS_URL, fixtures["genesis"]["commits"][0]["sha"])
    # The hub's main has moved on to a re-quantised upload; the fleet stays locked at the
    # revision it was pinned at (what `rigfleet pins lock` resolved before that push).
    pins = replace(pins, model=replace(pins.model, revision=fixtures["model"]["revision"]))
    text = dump_pins(pins)
    parse_pins(yaml.safe_load(text), str(paths.pins))  # never write pins the deploy refuses
    paths.pins.write_text(
        "# Generated by `rigfleet testbed up` from pins.yaml with the testbed's digests, model\n"
        "# commit and Genesis repository. Git-ignored.\n" + text
    )


def gpg_fingerprint(gnupg_home: Path) -> str:
    out = subprocess.run(
        ["gpg", "--homedir", str(gnupg_home), "--batch", "--with-colons", "--list-keys"],
        check=True, capture_output=True, text=True,
    ).stdout
    fprs = [line.split(":")[9] for line in out.splitlines() if line.startswith("fpr:")]
    if not fprs:
        raise TestbedError(f"no signing key in {gnupg_home}")
    return fprs[0]


def inventory_text(specs: list[HostSpec], paths: Paths, docker_fpr: str) -> str:
    rel = str  # absolute paths: the inventory works from any working directory
    hosts = []
    for spec in specs:
        slot = spec.slot
        data: dict[str, Any] = {
            "ssh_hostname": "127.0.0.1",
            "ssh_port": slot.ssh_port,
            "ssh_user": spec.ssh_user,
            "ssh_key": rel(paths.ssh_key),
            "ssh_known_hosts_file": rel(paths.known_hosts),
            "ssh_strict_host_key_checking": "yes",
            "front_url": f"http://127.0.0.1:{slot.front_port}",
            "testbed_container": slot.container,
        }
        if spec.sudo:
            data["_sudo"] = True  # pyinfra: every operation through sudo
        hosts.append(f"    ({slot.name!r}, {pformat(data, indent=4, width=96)}),")
    testbed_repo = {"url": layout.APT_URL, "key_url": layout.APT_KEY_URL, "suite": "stable",
                    "components": ["main"], "key_fingerprint": gpg_fingerprint(paths.gnupg)}
    common = {
        "pins_file": rel(paths.pins),
        "api_key_file": rel(paths.api_key),
        "docker_registry_mirror": layout.MIRROR_URL,
        "hf_endpoint": layout.HUB_URL,
        # The simulators answer in seconds: the gate's fast profile (same checks, smaller depths).
        "gate_profile": "fast",
        # The control side reaches the mirror and the Genesis repository on loopback ports.
        "bump_registry": f"http://127.0.0.1:{layout.REGISTRY_LOCAL_PORT}",
        "bump_genesis_url": f"http://127.0.0.1:{layout.GIT_LOCAL_PORT}/genesis-vllm-patches.git",
        "apt_repos": {
            # The stand-in NVIDIA packages live in one signed repository on the testbed.
            "cuda": testbed_repo,
            "nvidia-container-toolkit": testbed_repo,
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
    return "\n".join(lines)


def write_known_hosts(paths: Paths, keys: dict[HostSlot, str]) -> None:
    lines = [f"[127.0.0.1]:{slot.ssh_port} {key}" for slot, key in sorted(
        keys.items(), key=lambda kv: kv[0].index)]
    paths.known_hosts.write_text("\n".join(lines) + "\n")


# -- the commands ------------------------------------------------------------------------------


def up(options: UpOptions, log: Log = print) -> list[HostSlot]:
    if not 1 <= options.hosts <= 12:
        raise TestbedError(f"--hosts {options.hosts}: the testbed runs 1 to 12 hosts")
    try:
        specs = hostspec.host_specs(options.hosts, options.hardware_overrides, options.oses,
                                    options.sudo)
    except ValueError as exc:
        raise TestbedError(str(exc)) from None
    paths = Paths()
    c = client()
    ensure_secrets(paths)
    t0 = time.monotonic()
    fixtures = build_service_data(paths, log)
    t1 = time.monotonic()
    bases = build_images(c, log, {s.os for s in specs})
    docker_fpr = build_docker_repo(c, paths, bases, log)
    t2 = time.monotonic()
    ensure_network(c)
    ensure_registry(c, paths, log)
    ensure_services(c, paths)
    log(f"service data {t1 - t0:.1f}s, images {t2 - t1:.1f}s, "
        f"registry+services {time.monotonic() - t2:.1f}s")
    for spec in specs:
        hw = paths.hardware(spec.name)
        hw.parent.mkdir(parents=True, exist_ok=True)
        hw.write_text(hardware.render(spec.profile))
        paths.host_meta(spec.name).write_text(json.dumps(spec.metadata(), indent=1) + "\n")
        extra = f", {spec.os.name}" + (f", user {spec.ssh_user} (sudo)" if spec.sudo else "")
        log(f"starting {spec.name} (ssh 127.0.0.1:{spec.slot.ssh_port}{extra})")
        ensure_host(c, spec, paths)
    keys = {spec.slot: host_key(c, spec.slot) for spec in specs}
    write_known_hosts(paths, keys)
    write_pins(paths, fixtures)
    options.inventory.write_text(inventory_text(specs, paths, docker_fpr))
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
