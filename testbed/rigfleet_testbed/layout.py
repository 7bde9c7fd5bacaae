"""Names, addresses and ports of the simulated fleet (see docs/architecture.md).

Everything the testbed creates carries the ``rigfleet-`` prefix or the ``io.rigfleet_testbed``
label, so ``testbed down`` can find and remove exactly what ``testbed up`` made.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
IMAGES_DIR = Path(__file__).resolve().parent / "images"

# Several testbeds can run side by side on one machine (RIGFLEET_TESTBED_INSTANCE=0..9): each has
# its own names, subnet, published ports, state directory and inventory file. 0 is the default.
INSTANCE = int(os.environ.get("RIGFLEET_TESTBED_INSTANCE", "0"))
if not 0 <= INSTANCE <= 9:
    raise ValueError(f"RIGFLEET_TESTBED_INSTANCE={INSTANCE}: allowed 0..9")
_SFX = "" if INSTANCE == 0 else f"-{INSTANCE}"
_NET = f"10.213.{7 + INSTANCE}"
_PORTS = INSTANCE * 100

STATE_DIR = REPO_ROOT / f".testbed{_SFX}"
INVENTORY = REPO_ROOT / "inventory" / f"testbed{_SFX}.py"

LABEL = "io.rigfleet_testbed"
LABEL_VALUE = str(INSTANCE)
NETWORK = f"rigfleet-testbed{_SFX}"
SUBNET = f"{_NET}.0/24"
GATEWAY = f"{_NET}.1"

REGISTRY_CONTAINER = f"rigfleet{_SFX}-registry"
REGISTRY_VOLUME = f"rigfleet{_SFX}-registry-data"
REGISTRY_ALIAS = "registry.rigfleet.test"
REGISTRY_IP = f"{_NET}.2"
REGISTRY_LOCAL_PORT = 15000 + _PORTS  # control side: http://127.0.0.1:15000

SERVICES_CONTAINER = f"rigfleet{_SFX}-services"
# download.docker.rigfleet.test stands in for download.docker.com (the Docker CE repository
# stand-in, served from the same web root as the NVIDIA one: /linux/debian/...).
# developer.download.nvidia.rigfleet.test and nvidia.github.rigfleet.test stand in for NVIDIA's
# CUDA repositories and the container toolkit's (same paths as NVIDIA's).
SERVICES_ALIASES = ("apt.rigfleet.test", "hub.rigfleet.test", "git.rigfleet.test",
                    "pypi.rigfleet.test", "download.docker.rigfleet.test",
                    "developer.download.nvidia.rigfleet.test", "nvidia.github.rigfleet.test")
SERVICES_IP = f"{_NET}.3"
HUB_LOCAL_PORT = 18080 + _PORTS  # control side: the hub and its fault switch
APT_LOCAL_PORT = 18081 + _PORTS
PYPI_LOCAL_PORT = 18082 + _PORTS
GIT_LOCAL_PORT = 18090 + _PORTS
PYPI_PORT = 3141  # in the services container (devpi's customary port)

BASE_IMAGE = "rigfleet/trixie-base:latest"
HOST_IMAGE = "testbed/rigfleet_testbed-host:latest"
REGISTRY_IMAGE = "testbed/rigfleet_testbed-registry:latest"
SERVICES_IMAGE = "testbed/rigfleet_testbed-services:latest"
# The part every vllm/vllm-openai:<tag> simulator shares (images/vllm-sim); each build adds a
# layer (images/vllm-build, rigfleet_testbed.vllm_builds).
SIM_BASE_IMAGE = "testbed/rigfleet_testbed-vllm-sim:latest"
SIM_IMAGE_REPO = "vllm/vllm-openai"

# Shaped like https://developer.download.nvidia.com/compute/cuda/repos/{distro}/x86_64/ and
# https://nvidia.github.io/libnvidia-container/...: only the host names differ.
CUDA_APT_BASE = "http://developer.download.nvidia.rigfleet.test/compute/cuda/repos"
TOOLKIT_APT_BASE = "http://nvidia.github.rigfleet.test/libnvidia-container"
# Shaped like https://download.docker.com/linux/{id} and its /gpg key (docs.docker.com's apt
# instructions): the deploy fills {id} and {codename} from the host's /etc/os-release.
DOCKER_APT_URL = "http://download.docker.rigfleet.test/linux/{id}"
DOCKER_APT_KEY_URL = "http://download.docker.rigfleet.test/linux/{id}/gpg"
HUB_URL = "http://hub.rigfleet.test:8080"
# ``--reach`` / RIGFLEET_REACH pairs by which the control machine reaches the hub and the apt
# repositories (named in the inventory as the hosts see them) on their published loopback ports.
CONTROL_REACH = (f"{HUB_URL}=http://127.0.0.1:{HUB_LOCAL_PORT}",
                 *(f"{base.split('/', 3)[0]}//{base.split('/', 3)[2]}=http://127.0.0.1:"
                   f"{APT_LOCAL_PORT}" for base in (CUDA_APT_BASE, TOOLKIT_APT_BASE)))
# The Genesis repository under its canonical (renamed) name, the old name GitHub redirects, and
# the real history from ../shared/upstream (when that bundle is there).
GIT_BASE_URL = "http://git.rigfleet.test:8090"
GENESIS_URL = f"{GIT_BASE_URL}/sndr_core_engine.git"
GENESIS_OLD_URL = f"{GIT_BASE_URL}/genesis-vllm-patches.git"
GENESIS_REAL_URL = f"{GIT_BASE_URL}/real/sndr_core_engine.git"
GENESIS_BUNDLE = REPO_ROOT.parent / "shared" / "upstream" / "genesis-dev-and-v12.1.0.bundle"
PYPI_URL = f"http://pypi.rigfleet.test:{PYPI_PORT}/simple/"
MIRROR_URL = f"http://{REGISTRY_ALIAS}:5000"

# Capabilities that systemd as PID 1 plus a nested Docker engine need (TESTBED-FACTS.md);
# --privileged is refused on our machines.
HOST_CAPS = (
    "SYS_ADMIN", "NET_ADMIN", "MKNOD", "SYS_PTRACE", "SYS_MODULE", "NET_RAW", "SYS_CHROOT",
    "AUDIT_WRITE", "SETFCAP", "DAC_READ_SEARCH", "LINUX_IMMUTABLE", "IPC_LOCK", "SYS_NICE",
    "SYS_TIME",
)


@dataclass(frozen=True)
class HostOS:
    """A Debian release a simulated host can run: its base and host images."""

    name: str  # what --os takes: debian13, debian12
    codename: str  # debootstrap suite and VERSION_CODENAME
    version_id: str

    @property
    def base_image(self) -> str:
        return f"rigfleet/{self.codename}-base:latest"

    @property
    def host_image(self) -> str:
        tag = "latest" if self is DEFAULT_OS else self.codename
        return f"testbed/rigfleet_testbed-host:{tag}"


HOST_OSES: dict[str, HostOS] = {
    "debian13": HostOS("debian13", "trixie", "13"),
    "debian12": HostOS("debian12", "bookworm", "12"),
}
DEFAULT_OS = HOST_OSES["debian13"]
# The non-root administrator of a host chosen with --sudo-user (key login, passwordless sudo).
SUDO_USER = "rig"


@dataclass(frozen=True)
class HostSlot:
    """Where host number ``index`` (1-based) lives on the testbed."""

    index: int

    @property
    def name(self) -> str:
        return f"host{self.index}"

    @property
    def container(self) -> str:
        return f"rigfleet{_SFX}-{self.name}"

    @property
    def ip(self) -> str:
        return f"{_NET}.{10 + self.index}"

    @property
    def ssh_port(self) -> int:
        return 2220 + _PORTS + self.index

    @property
    def front_port(self) -> int:
        return 18000 + _PORTS + self.index

    @property
    def docker_volume(self) -> str:
        return f"rigfleet{_SFX}-{self.name}-docker"


# The port HAProxy listens on inside a balancer container (host data balancer_port's default).
BALANCER_PORT = 8080


@dataclass(frozen=True)
class BalancerSlot:
    """Where balancer number ``index`` lives (``testbed up --balancer``): a plain Debian host
    (systemd, sshd, no GPU hardware) in the inventory group ``balancers``."""

    index: int = 1

    @property
    def name(self) -> str:
        return f"lb{self.index}"

    @property
    def container(self) -> str:
        return f"rigfleet{_SFX}-{self.name}"

    @property
    def ip(self) -> str:
        return f"{_NET}.{60 + self.index}"

    @property
    def ssh_port(self) -> int:
        return 2269 + _PORTS + self.index

    @property
    def port(self) -> int:
        """HAProxy's port published on 127.0.0.1 for the control side."""
        return 18049 + _PORTS + self.index
