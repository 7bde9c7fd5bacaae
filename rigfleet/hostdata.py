"""Host data: what the inventory says about one host, checked before anything runs.

``validate_host`` turns a host's pyinfra data (``host.data``: group data from
``inventory/group_data/*.py`` overlaid by the host's own tuple data) into a typed
``HostSettings``. It runs on the control side in pyinfra's prepare phase, so a bad value stops
the deploy before any host changes; the message names the host, the key, the value and what is
allowed. ``check_caps_against_gpus`` repeats the power-cap check against each card's real
limits once the GPUs have been read, and ``check_gpus`` the GPU count and each card's memory
(the preflight runs both while preparing when the driver answers; the roles again once it
does).

Example::

    from rigfleet.hostdata import validate_host

    settings = validate_host(host.name, host.data)   # host.data or a plain dict
    settings.power_caps_w    # (290, 290): one cap per card
    settings.spec.port       # 8011 for stack "int8"
"""

from __future__ import annotations

import difflib
import math
import os
import posixpath
import re
import ssl
import stat
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from rigfleet.catalog import (
    MAX_DRAIN_TIMEOUT_S,
    Catalog,
    CatalogError,
    StackSpec,
    builtin_catalog,
    load_catalog,
)
from rigfleet.hostside.supervise import Policy, parse_backoff
from rigfleet.hostside.verify.client import tls_context
from rigfleet.hostside.verify.profiles import PROFILES, ProfileError, resolve
from rigfleet.images.sources import DEFAULT_SOURCES, ImageSource, parse_sources
from rigfleet.validate import (
    SYSTEM_DIRS,
    Problems,
    ValidationError,
    escapes,
    has_control,
    is_int,
    is_system_dir,
)

# A sane absolute range for any single GPU's power cap; the card's real min..max is checked
# at deploy time (check_caps_against_gpus). An RTX 3090 reports 100..350 W (stock boards).
POWER_CAP_RANGE_W = (50, 600)

# The deploy installs the NVIDIA driver and the container toolkit from these apt repos.
REQUIRED_APT_REPOS = ("cuda", "nvidia-container-toolkit")

# Placeholders an apt repo URL/key URL/suite may use; the deploy fills them from the host's
# /etc/os-release. `$(ARCH)` (apt's own variable) is left for apt.
APT_PLACEHOLDERS = {
    "id": "os-release ID: ubuntu, debian",
    "version": "os-release VERSION_ID: 24.04, 12",
    "codename": "os-release VERSION_CODENAME: noble, bookworm",
    "distro": "NVIDIA's repo name: ubuntu2404, debian12",
}

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_REPO_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")
_NVIDIA_DISTRO = re.compile(r"[a-z]+[0-9]+")
_APT_REPO_KEYS = ("url", "key_url", "suite", "components", "key_fingerprint")
_FINGERPRINT = re.compile(r"[0-9A-F]{40}")
# apt suite and component names (a suite may hold placeholders and apt's $(ARCH)).
_APT_WORD = re.compile(r"[A-Za-z0-9._/{}$()+~-]+")
_MIN_API_KEY_CHARS = 16
_HOST_PORT = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})(?::[0-9]{1,5})?")
_HOST6_PORT = re.compile(r"\[[0-9A-Fa-f:.]+\](?::[0-9]{1,5})?")
_GIT_URL = re.compile(r"(?:https?|ssh|git|file)://\S+|[\w.-]+@[\w.-]+:\S+")


class HostDataError(ValidationError):
    """A host's data is wrong; one line per problem: ``<host>: <key>: ...; allowed: ...``."""


@dataclass(frozen=True)
class AptRepo:
    """One apt repository the deploy adds (``signed-by`` its own keyring).

    + name: short name, used for file names (``/etc/apt/sources.list.d/<name>.list``)
    + url: repository base URL; may hold ``{id}``, ``{version}``, ``{codename}``, ``{distro}``
    + key_url: the ASCII-armored signing key; same placeholders
    + suite: ``/`` for a flat repository (NVIDIA's), else a suite such as ``{codename}``
    + components: empty for a flat repository, else e.g. ``("stable",)``
    + key_fingerprint: optional 40-hex fingerprint the downloaded key must have
    + per_distro: NVIDIA distribution name (``debian13``) -> the whole entry for hosts of
      that distribution (host data: only the keys that differ; NVIDIA signs its ``debian13``
      repository with another key than the others)

    **Example:**

    .. code:: python

        repo = settings.apt_repos["cuda"].expand(os_id="ubuntu", version_id="24.04",
                                                 codename="noble")
        repo.source_line("/etc/apt/keyrings/cuda.gpg")
        # 'deb [signed-by=/etc/apt/keyrings/cuda.gpg] https://.../ubuntu2404/x86_64/ /'
    """

    name: str
    url: str
    key_url: str
    suite: str
    components: tuple[str, ...] = ()
    key_fingerprint: str | None = None
    per_distro: tuple[tuple[str, AptRepo], ...] = ()

    @property
    def flat(self) -> bool:
        """A flat repository (``deb URL /``) has no components."""
        return self.suite.endswith("/")

    def expand(self, *, os_id: str, version_id: str, codename: str) -> AptRepo:
        """Fill the placeholders for one host's OS (pure; the deploy reads os-release).

        + os_id: ``ID`` from os-release (``ubuntu``, ``debian``)
        + version_id: ``VERSION_ID`` (``24.04``, ``12``)
        + codename: ``VERSION_CODENAME`` (``noble``, ``bookworm``)
        """
        values = {
            "id": os_id,
            "version": version_id,
            "codename": codename,
            "distro": nvidia_distro(os_id, version_id),
        }
        chosen = dict(self.per_distro).get(values["distro"], self)
        return replace(
            chosen,
            name=self.name,
            per_distro=(),
            url=chosen.url.format(**values),
            key_url=chosen.key_url.format(**values),
            suite=chosen.suite.format(**values),
        )

    def source_line(self, keyring: str) -> str:
        """The one-line apt source for this repo, trusting only ``keyring``."""
        parts = ["deb", f"[signed-by={keyring}]", self.url, self.suite, *self.components]
        return " ".join(parts)


def nvidia_distro(os_id: str, version_id: str) -> str:
    """NVIDIA's repository name for an OS: ``ubuntu`` ``24.04`` -> ``ubuntu2404``."""
    return f"{os_id}{version_id.replace('.', '')}"


@dataclass(frozen=True)
class SwapSettings:
    """The gate and the time limits of one host's transactions (host data, validated)."""

    gate_profile: str = "full"
    gate_set: tuple[str, ...] = ()
    ready_timeout_s: float = 1200.0
    vram_timeout_s: float = 120.0
    gate_timeout_s: float = 7200.0
    retry_after_s: int = 30
    # Host data ``drain_timeout_s``: overrides every stack file's ``drain.timeout_s`` here.
    drain_timeout_s: float | None = None
    # The supervisor's policy (rigfleet.hostside.supervise.Policy; defaults there): the wait
    # before the 1st, 2nd, ... recreation, how many recreations within the window before it
    # gives up, and the window.
    supervise_backoff_s: tuple[float, ...] = Policy.backoff_s
    supervise_limit: int = Policy.limit
    supervise_window_s: float = Policy.window_s

    @property
    def follow_timeout_s(self) -> float:
        """How long the deploy follows a transaction before giving up (it keeps running)."""
        return 2 * (self.ready_timeout_s + self.vram_timeout_s) + self.gate_timeout_s + 600


@dataclass(frozen=True)
class BumpSettings:
    """Where ``rigfleet bump`` looks for candidates (host data of the canary group)."""

    registry: str | None = None
    genesis_url: str | None = None
    mirror: str | None = None


@dataclass(frozen=True)
class FrontTls:
    """The front's certificate and key (control-side files), and what clients trust.

    + cert_file: PEM certificate (chain: the server's first) nginx presents
    + key_file: its PEM private key, unencrypted, mode 0600 (uploaded root-only)
    + ca_file: PEM certificate(s) clients verify the front against; the certificate itself
      when host data names no ``front_tls_ca_file`` (a self-signed front)
    """

    cert_file: str
    key_file: str
    ca_file: str

    def client_context(self) -> ssl.SSLContext:
        """An ``ssl`` context that trusts ``ca_file`` only (for the clients of the front).

        .. code:: python

            urllib.request.urlopen(url, context=settings.front_tls.client_context())
        """
        return tls_context(self.ca_file)


@dataclass(frozen=True)
class HostSettings:
    """One host's validated settings (see docs/converge.md for each field's meaning).

    ``power_caps_w`` always has one entry per card (a single int in the data applies to all
    ``gpu_count`` cards); ``api_key_file``, ``hf_token_file`` and ``site_ca_files`` are
    absolute control-side paths; ``extra_env`` maps a stack name to extra container
    environment for that stack; ``catalog`` holds the stacks this host's data can name;
    ``front_tls`` is set when the front serves HTTPS; ``adopt_foreign_driver`` lets the
    deploy keep a driver NVIDIA's ``.run`` installer put there (on the pinned branch);
    ``stop_on_preflight`` stops the whole run when any host fails its preflight.
    """

    name: str
    stack: str
    power_caps_w: tuple[int, ...]
    model_dir: str
    front_port: int
    api_key_file: str
    hf_token_file: str | None
    docker_registry_mirror: str | None
    apt_repos: dict[str, AptRepo]
    pip_index_url: str | None
    hf_endpoint: str | None
    extra_env: dict[str, dict[str, str]] = field(default_factory=dict)
    pins_file: str = "pins.yaml"
    # Where the deploy installs a Genesis stack's pinned runtime packages from when it bakes
    # them into the stack's image (default: pip_index_url, else PyPI).
    runtime_pip_index_url: str | None = None
    gpu_count: int = 2
    swap: SwapSettings = SwapSettings()
    site_ca_files: tuple[str, ...] = ()
    front_url: str | None = None
    stacks_dir: str | None = None
    bump: BumpSettings = BumpSettings()
    # The stack files' reference tok/s (RTX 3090s) times this is what the gate expects of a
    # host without history: other hardware, or the testbed (its sim_speedup).
    throughput_scale: float = 1.0
    # The stacks this host may serve and stages (None: every pinned stack its GPUs can run).
    stacks: tuple[str, ...] | None = None
    # Where the host gets its pinned images, in order (rigfleet/images/sources.py).
    image_sources: tuple[ImageSource, ...] = DEFAULT_SOURCES
    front_tls: FrontTls | None = None
    # Where a balancer reaches this host's front ("host" or "host:port"); None: the SSH
    # address and front_port (``rigfleet.balancer.plan.front_target``).
    balancer_front_address: str | None = None
    adopt_foreign_driver: bool = False
    stop_on_preflight: bool = False
    catalog: Catalog = field(default_factory=builtin_catalog, compare=False, repr=False)

    @property
    def front_scheme(self) -> str:
        """``https`` when the front serves TLS, else ``http``."""
        return "https" if self.front_tls else "http"

    @property
    def spec(self) -> StackSpec:
        """The catalog entry of the desired stack."""
        return self.catalog.get(self.stack)

    def env_for(self, stack: str) -> dict[str, str]:
        """Extra container environment for ``stack`` on this host (a fresh dict)."""
        return dict(self.extra_env.get(stack, {}))


# Every host-data key rigfleet reads, in one place, with its default (_REQUIRED: no default,
# must be set). Anything else in a host's data is pyinfra's or another tool's, except a key
# that is *almost* one of these: that is a typo, refused.
_REQUIRED = object()
KEY_DEFAULTS: dict[str, Any] = {
    "stack": _REQUIRED,
    "power_caps_w": _REQUIRED,
    "model_dir": _REQUIRED,
    "front_port": _REQUIRED,
    "api_key_file": _REQUIRED,
    "apt_repos": _REQUIRED,
    "hf_token_file": None,
    "docker_registry_mirror": None,
    "pip_index_url": None,
    "runtime_pip_index_url": None,
    "hf_endpoint": None,
    "extra_env": {},
    "pins_file": "pins.yaml",
    "gpu_count": 2,
    "gate_profile": "full",
    "gate_set": (),
    "ready_timeout_s": None,
    "gate_timeout_s": None,
    "drain_timeout_s": None,
    # The supervisor's policy (docs/swap.md, "When the engine dies"); None: Policy's defaults.
    "supervise_backoff_s": None,
    "supervise_limit": None,
    "supervise_window_s": None,
    "site_ca_files": None,
    "front_url": None,
    "stacks_dir": None,
    "bump_registry": None,
    "bump_genesis_url": None,
    "bump_mirror": None,
    "throughput_scale": 1.0,
    "stacks": None,
    "image_sources": None,
    "front_tls_cert_file": None,
    "front_tls_key_file": None,
    "front_tls_ca_file": None,
    # A GPU host, for the balancers: where they reach its front (see balancer_* below).
    "balancer_front_address": None,
    # A host of group `balancers` (validate_balancer; docs/balancer.md).
    "balancer_port": 8080,
    "balancer_url": None,
    "balancer_tls_cert_file": None,
    "balancer_tls_key_file": None,
    "balancer_tls_ca_file": None,
    "balancer_default_stack": None,
    "balancer_check_interval_s": 2,
    "balancer_retry_buffer_kib": 128,
    "adopt_foreign_driver": False,
    "rigfleet_stop_on_preflight": False,
}

# Spellings of a yes/no flag given on the command line (`--data key=1`) or in data.
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")
STOP_ENV = "RIGFLEET_STOP_ON_PREFLIGHT"


def flag_value(value: Any) -> bool | None:
    """A yes/no flag as data or ``--data`` gives it (True, 1, "1", "yes", ...); None when it
    is neither."""
    if isinstance(value, bool):
        return value
    if is_int(value) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    return None


def stop_on_preflight(data: Mapping[str, Any] | Any) -> bool:
    """Stop the whole run when a host fails its preflight?

    Host data ``rigfleet_stop_on_preflight`` (``--data rigfleet_stop_on_preflight=1``) or the
    environment variable ``RIGFLEET_STOP_ON_PREFLIGHT=1``; read leniently, before (and even
    when) the rest of the host's data fails validation. Default: the other hosts go on.
    """
    if flag_value(os.environ.get(STOP_ENV, "")):
        return True
    return bool(flag_value(data.get("rigfleet_stop_on_preflight", None)))


def validate_host(name: str, data: Mapping[str, Any] | Any,
                  catalog: Catalog | None = None) -> HostSettings:
    """Check one host's data and return its ``HostSettings``; raises ``HostDataError``.

    All problems are reported at once. Secret files are checked (exist, readable, non-empty,
    mode 0600 or stricter) but their content never appears in a message.

    + name: the host's inventory name (named in every message)
    + data: ``host.data`` (anything with ``.get``) or a plain mapping
    + catalog: the stacks to check ``stack`` against (default: the built-in stacks plus those
      in the data's ``stacks_dir``)

    **Example:**

    .. code:: python

        settings = validate_host("rig-a", {"stack": "int8", "power_caps_w": [290, 290], ...})
    """
    c = _Checker(name)
    c.typos(data)
    get = _getter(c, data)
    catalog = c.load_catalog(get("stacks_dir"), catalog)
    stacks_dir = c.stacks_dir_path
    stack = c.stack(get("stack"))
    gpu_count = c.gpu_count(get("gpu_count"), stack)
    caps = c.power_caps(get("power_caps_w"), gpu_count)
    model_dir = c.model_dir(get("model_dir"))
    front_port = c.front_port(get("front_port"))
    api_key_file = c.secret_file("api_key_file", get("api_key_file"), _MIN_API_KEY_CHARS)
    hf_token_raw = get("hf_token_file")
    hf_token_file = None if hf_token_raw is None else c.secret_file("hf_token_file", hf_token_raw)
    mirror = c.url("docker_registry_mirror", get("docker_registry_mirror"))
    pip_index_url = c.url("pip_index_url", get("pip_index_url"))
    runtime_pip_index_url = c.url("runtime_pip_index_url", get("runtime_pip_index_url"))
    hf_endpoint = c.url("hf_endpoint", get("hf_endpoint"))
    front_url = c.url("front_url", get("front_url"))
    apt_repos = c.apt_repos(get("apt_repos"))
    extra_env = c.extra_env(get("extra_env"))
    pins_file = get("pins_file")
    if not isinstance(pins_file, str) or not pins_file.strip() or has_control(pins_file):
        c.bad("pins_file", pins_file, "a path to the pins file, e.g. 'pins.yaml'")
    swap = c.swap(get)
    site_ca = c.site_ca_files(get("site_ca_files"))
    bump = BumpSettings(
        registry=c.url("bump_registry", get("bump_registry")),
        genesis_url=c.git_url("bump_genesis_url", get("bump_genesis_url")),
        mirror=c.url("bump_mirror", get("bump_mirror")),
    )
    throughput_scale = c.number(
        "throughput_scale", get("throughput_scale"), 0.0, 1_000_000.0, low_open=True,
        allowed="a number > 0: this host's decode speed relative to RTX 3090s (1.0), e.g. the "
                "testbed's sim_speedup")
    stacks = c.stacks(get("stacks"), stack, gpu_count)
    image_sources = parse_sources(c, "image_sources", get("image_sources"))
    front_tls = c.tls("front", get("front_tls_cert_file"), get("front_tls_key_file"),
                      get("front_tls_ca_file"))
    balancer_front = c.address("balancer_front_address", get("balancer_front_address"))
    if front_tls is not None and front_url and front_url.startswith("http://"):
        c.bad("front_url", front_url, "an https:// URL (or no front_url)",
              "is plain HTTP, but the front serves TLS (front_tls_cert_file is set)")
    adopt = c.flag("adopt_foreign_driver", get("adopt_foreign_driver"))
    stop = c.flag("rigfleet_stop_on_preflight", get("rigfleet_stop_on_preflight"))
    c.raise_if_any(HostDataError)
    # No problems: every required value above is set.
    assert stack and model_dir and front_port and api_key_file and swap is not None
    return HostSettings(
        name=name,
        stack=stack,
        power_caps_w=caps,
        model_dir=model_dir,
        front_port=front_port,
        api_key_file=api_key_file,
        hf_token_file=hf_token_file,
        docker_registry_mirror=mirror,
        apt_repos=apt_repos,
        pip_index_url=pip_index_url,
        runtime_pip_index_url=runtime_pip_index_url,
        hf_endpoint=hf_endpoint,
        extra_env=extra_env,
        pins_file=pins_file,
        gpu_count=gpu_count,
        swap=swap,
        site_ca_files=site_ca,
        front_url=front_url,
        stacks_dir=stacks_dir,
        bump=bump,
        throughput_scale=throughput_scale or 1.0,
        stacks=stacks,
        image_sources=image_sources,
        front_tls=front_tls,
        balancer_front_address=balancer_front,
        adopt_foreign_driver=adopt,
        stop_on_preflight=stop,
        catalog=catalog,
    )


def _getter(c: _Checker, data: Mapping[str, Any] | Any) -> Any:
    """``get(key)``: the key's value in ``data``, its default when unset (a missing required
    key and a value holding control characters are recorded in ``c``)."""

    def get(key: str) -> Any:
        value = data.get(key, None)
        default = KEY_DEFAULTS[key]
        if value is None:
            if default is _REQUIRED:
                c.missing(key)
            return None if default is _REQUIRED else default
        if c.control_chars(key, value):
            # Named above; the key's own checks see it as unset (no second message).
            return None if default is _REQUIRED else default
        return value

    return get


# What a balancer's health checks may be tuned to (seconds between checks) and how large a
# request HAProxy keeps for a retry on another host (KiB; tune.bufsize).
CHECK_INTERVAL_RANGE_S = (0.5, 30.0)
RETRY_BUFFER_RANGE_KIB = (16, 1024)


@dataclass(frozen=True)
class BalancerSettings:
    """A balancer host's validated settings (host data ``balancer_*``; docs/balancer.md).

    + port: where HAProxy listens for clients (``balancer_port``, default 8080)
    + api_key_file: the key clients must send (the fronts' key: it is passed on to them)
    + tls: the certificate HAProxy serves (``balancer_tls_*_file``), None: plain HTTP
    + url: how clients reach it, when not ``<scheme>://<ssh address>:<port>`` (``balancer_url``)
    + default_stack: the stack ``/v1/...`` without ``/stacks/<stack>`` goes to
    + check_interval_s: seconds between readiness checks of each GPU host's front
    + retry_buffer_kib: requests up to this size are retried on another host after a 503 or
      a connection closed without an answer (HAProxy's ``tune.bufsize``)
    """

    name: str
    port: int
    api_key_file: str
    tls: FrontTls | None = None
    url: str | None = None
    default_stack: str | None = None
    check_interval_s: float = 2.0
    retry_buffer_kib: int = 128
    site_ca_files: tuple[str, ...] = ()
    catalog: Catalog = field(default_factory=builtin_catalog, compare=False, repr=False)

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"


def validate_balancer(name: str, data: Mapping[str, Any] | Any, *, gpu_host: bool = False,
                      catalog: Catalog | None = None) -> BalancerSettings:
    """Check a balancer host's data (``balancer_*``, ``api_key_file``, ``site_ca_files``);
    raises ``HostDataError`` naming host, key, value and what is allowed.

    + gpu_host: the host serves too (``gpu_hosts``): its ``balancer_port`` must not be its
      ``front_port``

    .. code:: python

        settings = validate_balancer("lb1", {"api_key_file": "~/.config/rigfleet/api-key"})
        settings.port            # 8080
    """
    c = _Checker(name)
    c.typos(data)
    get = _getter(c, data)
    catalog = c.load_catalog(get("stacks_dir"), catalog)
    port = c.integer("balancer_port", get("balancer_port"), 1, 65535,
                     "a TCP port 1..65535 (clients call http(s)://<balancer>:<port>)")
    front_port = data.get("front_port", None)
    if gpu_host and port is not None and port == front_port:
        c.bad("balancer_port", port, f"a port other than front_port {front_port}",
              "is this host's front_port too (the host serves and balances)")
    api_key_file = c.secret_file("api_key_file", get("api_key_file"), _MIN_API_KEY_CHARS)
    tls = c.tls("balancer", get("balancer_tls_cert_file"), get("balancer_tls_key_file"),
                get("balancer_tls_ca_file"))
    url = c.url("balancer_url", get("balancer_url"))
    if tls is not None and url and url.startswith("http://"):
        c.bad("balancer_url", url, "an https:// URL (or no balancer_url)",
              "is plain HTTP, but the balancer serves TLS (balancer_tls_cert_file is set)")
    default = get("balancer_default_stack")
    if default is not None and (not isinstance(default, str) or default not in catalog):
        c.bad("balancer_default_stack", default, ", ".join(catalog.names),
              "is not a stack in the catalog")
        default = None
    low, high = CHECK_INTERVAL_RANGE_S
    interval = c.number("balancer_check_interval_s", get("balancer_check_interval_s"), low,
                        high, f"seconds between readiness checks, {low:g}..{high:g}")
    low_k, high_k = RETRY_BUFFER_RANGE_KIB
    buffer = c.integer("balancer_retry_buffer_kib", get("balancer_retry_buffer_kib"), low_k,
                       high_k, f"KiB, {low_k}..{high_k} (HAProxy's buffer per direction and "
                       "connection; a request up to this size can be retried on another host)")
    site_ca = c.site_ca_files(get("site_ca_files"))
    c.raise_if_any(HostDataError)
    assert port is not None and api_key_file and interval is not None and buffer is not None
    return BalancerSettings(name=name, port=port, api_key_file=api_key_file, tls=tls, url=url,
                            default_stack=default, check_interval_s=float(interval),
                            retry_buffer_kib=buffer, site_ca_files=site_ca, catalog=catalog)


class GpuPowerLimits(Protocol):
    """What ``check_caps_against_gpus`` needs of a GPU (``rigfleet.gpu.GpuInfo`` has it).

    The power range may be named ``power_min_w``/``power_max_w`` or
    ``power_min_limit_w``/``power_max_limit_w``; None when the card reports ``[N/A]``.
    """

    index: int


def check_caps_against_gpus(host: str, caps: Sequence[int], gpus: Sequence[GpuPowerLimits]) -> None:
    """Check each cap against its card's real min..max limit; raises ``HostDataError``.

    Caps apply to cards in index order (``caps[0]`` to the lowest index). ``nvidia-smi -pl``
    refuses an out-of-range value, and some boards silently keep the old one, so check first.

    + host: the host's inventory name
    + caps: ``HostSettings.power_caps_w``
    + gpus: the cards read from the host (``rigfleet.gpu.GpuInfo``)

    **Example:**

    .. code:: python

        check_caps_against_gpus("rig-a", settings.power_caps_w, gpus)
    """
    problems: list[str] = []
    ordered = sorted(gpus, key=lambda g: g.index)
    if len(caps) != len(ordered):
        indexes = ", ".join(str(g.index) for g in ordered) or "none"
        problems.append(
            f"{host}: power_caps_w: {list(caps)!r} has {len(caps)} cap(s) but the host has "
            f"{len(ordered)} GPU(s) (indexes: {indexes}); allowed: one cap per card "
            "(and gpu_count set to the number of cards)"
        )
    for pos, (cap, gpu) in enumerate(zip(caps, ordered, strict=False)):
        low, high = _power_range(gpu)
        name = getattr(gpu, "name", None)
        card = f"card {gpu.index}" + (f" ({name})" if name else "")
        if low is None or high is None:
            problems.append(
                f"{host}: power_caps_w[{pos}]: {cap!r} W cannot be applied: {card} reports no "
                "power limit range ([N/A]); allowed: a card whose limit can be set"
            )
        elif not low <= cap <= high:
            problems.append(
                f"{host}: power_caps_w[{pos}]: {cap!r} W is outside {card}'s range; "
                f"allowed: {_w(low)}..{_w(high)} W"
            )
    if problems:
        raise HostDataError(problems)


def check_gpus(host: str, gpu_count: int, spec: StackSpec, gpus: Sequence[Any]) -> list[str]:
    """What is wrong with the cards the host reports, for its data and its stack.

    The number of cards must be ``gpu_count``; each card needs the stack's
    ``gpus.memory_mib`` (``StackSpec.gpu_memory_mib``, when the stack file sets it). Returns
    one line per problem (empty: all is well); the preflight runs it while preparing when the
    driver answers, the driver role again once it does.

    + host: the host's inventory name
    + gpu_count: ``HostSettings.gpu_count``
    + spec: the desired stack's stack file
    + gpus: the cards read from the host (``rigfleet.gpu.GpuInfo``)

    **Example:**

    .. code:: python

        check_gpus("rig-a", 2, settings.spec, read_fact(GpuQuery).gpus)   # [] when fine
    """
    problems: list[str] = []
    ordered = sorted(gpus, key=lambda g: g.index)
    if len(ordered) != gpu_count:
        indexes = ", ".join(str(g.index) for g in ordered) or "none"
        problems.append(
            f"{host}: gpu_count: {gpu_count} but nvidia-smi lists {len(ordered)} GPU(s) "
            f"(indexes: {indexes}); allowed: gpu_count set to the cards the host has "
            "(a card missing from the list: check its seating and power)")
    need = spec.gpu_memory_mib
    if need:
        for gpu in ordered:
            have = getattr(gpu, "memory_total_mib", None)
            if have is not None and have < need:
                name = getattr(gpu, "name", None)
                card = f"card {gpu.index}" + (f" ({name})" if name else "")
                problems.append(
                    f"{host}: stack: {spec.name!r} needs {need} MiB per card "
                    f"(gpus.memory_mib in {spec.source or 'its stack file'}) but {card} has "
                    f"{have} MiB; allowed: a stack whose cards fit, or cards with enough memory")
    return problems


def _power_range(gpu: Any) -> tuple[float | None, float | None]:
    for low_name, high_name in (
        ("power_min_w", "power_max_w"),
        ("power_min_limit_w", "power_max_limit_w"),
    ):
        if hasattr(gpu, low_name) or hasattr(gpu, high_name):
            return getattr(gpu, low_name, None), getattr(gpu, high_name, None)
    return None, None


def _w(value: float) -> str:
    return f"{value:g}"


class _Checker(Problems):
    """The host-data checks on top of ``rigfleet.validate.Problems``."""

    def __init__(self, host: str) -> None:
        super().__init__(host)
        self.host = host
        self.catalog: Catalog = builtin_catalog()

    def missing(self, key: str, allowed: str | None = None) -> None:
        self.lines.append(
            f"{self.host}: {key}: missing; "
            + (f"allowed: {allowed}" if allowed else "set it in inventory/group_data/all.py "
               "(fleet default) or in the host's data")
        )

    def typos(self, data: Any) -> None:
        # pyinfra data is open-ended (ssh_*, other roles' keys), so unknown keys are fine;
        # a key that is *almost* one of ours is a typo that would silently use a default.
        keys = _data_keys(data)
        for key in keys:
            if key in KEY_DEFAULTS or not isinstance(key, str) or key.startswith("ssh_"):
                continue
            # Flag it even when the right key is also set: a host's typo would otherwise lose
            # silently to the fleet default from group_data/all.py.
            close = difflib.get_close_matches(key, list(KEY_DEFAULTS), n=1, cutoff=0.85)
            if close:
                self.bad(
                    key, key, f"{close[0]!r}", f"is not a rigfleet key (did you mean {close[0]!r}?)"
                )

    stacks_dir_path: str | None = None

    def load_catalog(self, stacks_dir: Any, catalog: Catalog | None) -> Catalog:
        """The stacks the data may name: ``catalog`` when given, else the built-in ones plus
        those in ``stacks_dir`` (checked; its path kept in ``stacks_dir_path``)."""
        self.stacks_dir_path = self.stacks_dir(stacks_dir)
        if catalog is None:
            found = self.stacks_dir_path
            try:
                catalog = load_catalog([found] if found else [])
            except CatalogError as e:
                self.lines += [f"{self.host}: stacks_dir: {line}" for line in e.problems]
                catalog = builtin_catalog()
        self.catalog = catalog
        return catalog

    def stacks_dir(self, value: Any) -> str | None:
        if value is None:
            return None
        allowed = "a directory of stack files on this (control) machine, e.g. 'inventory/stacks'"
        checked = self.string("stacks_dir", value, None, allowed)
        if checked is None:
            return None
        path = Path(os.path.expanduser(checked))
        if not path.is_dir():
            self.bad("stacks_dir", value, allowed, "is not a directory")
            return None
        if is_system_dir(str(path.resolve())):
            self.bad("stacks_dir", value, allowed + " (a directory of its own)",
                     "is a system directory")
            return None
        ok = True
        for entry in sorted(path.glob("*.yaml")):
            if escapes(entry, path):
                target = os.path.realpath(entry)
                self.bad(f"stacks_dir: {entry.name}", str(entry),
                         f"stack files inside {str(path.absolute())!r}",
                         f"leads outside the directory (to {target!r})")
                ok = False
        return str(path.absolute()) if ok else None

    def stack(self, value: Any) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or value not in self.catalog:
            self.bad("stack", value, ", ".join(self.catalog.names), "is not a stack in the catalog")
            return None
        return value

    def stacks(self, value: Any, stack: str | None, gpu_count: int) -> tuple[str, ...] | None:
        """``stacks``: the stacks this host may serve (and so stages); each must fit the
        host's GPUs, and the one it serves must be among them. None: the default (every
        pinned stack its GPUs can run)."""
        if value is None:
            return None
        allowed = ("a list of stack names (" + ", ".join(self.catalog.names) + ") the host "
                   "may serve, e.g. ['int8', 'tq3-mtp-genesis']")
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list | tuple) or not value:
            self.bad("stacks", value, allowed)
            return None
        out: list[str] = []
        for i, name in enumerate(value):
            if not isinstance(name, str) or name not in self.catalog:
                self.bad(f"stacks[{i}]", name, allowed, "is not a stack in the catalog")
                continue
            spec = self.catalog.get(name)
            need = max(spec.tensor_parallel_size, spec.gpu_count)
            if need > gpu_count:
                self.bad(f"stacks[{i}]", name, f"stacks that run on {gpu_count} GPU(s)",
                         f"needs {need} GPUs (gpu_count is {gpu_count})")
                continue
            if name not in out:
                out.append(name)
        if stack is not None and stack not in value:
            self.bad("stacks", list(value), f"a list that includes {stack!r}",
                     "leaves out the stack the host serves (stack)")
        return tuple(out)

    def gpu_count(self, value: Any, stack: str | None) -> int:
        if not is_int(value) or not 1 <= value <= 16:
            self.bad("gpu_count", value, "an integer 1..16 (the host's number of GPUs)")
            return 2
        if stack is not None:
            spec = self.catalog.get(stack)
            need = max(spec.tensor_parallel_size, spec.gpu_count)
            if value < need:
                self.bad(
                    "gpu_count",
                    value,
                    f"at least {need}",
                    f"is too few for stack {stack} (tensor-parallel-size "
                    f"{spec.tensor_parallel_size}, {spec.gpu_count} GPU(s))",
                )
        return int(value)

    def power_caps(self, value: Any, gpu_count: int) -> tuple[int, ...]:
        low, high = POWER_CAP_RANGE_W
        allowed = (
            f"an integer number of watts ({low}..{high}; the card's own range is checked at "
            f"deploy time) or a list of {gpu_count}, one per card, e.g. [290, 290]"
        )
        if value is None:
            return ()
        if is_int(value):
            caps = [value] * gpu_count
        elif isinstance(value, list | tuple):
            caps = list(value)
            if len(caps) != gpu_count:
                self.bad(
                    "power_caps_w",
                    value,
                    allowed,
                    f"has {len(caps)} cap(s) but gpu_count is {gpu_count}",
                )
                return ()
        else:
            self.bad("power_caps_w", value, allowed)
            return ()
        ok = True
        for i, cap in enumerate(caps):
            key = "power_caps_w" if is_int(value) else f"power_caps_w[{i}]"
            if not is_int(cap):
                self.bad(key, cap, allowed, "is not a whole number of watts")
                ok = False
            elif not low <= cap <= high:
                self.bad(key, cap, allowed, "W is outside any GPU's sane range")
                ok = False
        return tuple(caps) if ok else ()

    def model_dir(self, value: Any) -> str | None:
        allowed = "an absolute, normalised directory other than '/', e.g. '/srv/models'"
        if value is None:
            return None
        if (not isinstance(value, str) or not value.startswith("/") or value == "/"
                or posixpath.normpath(value) != value):
            self.bad("model_dir", value, allowed)
        elif ":" in value or "," in value:
            # Compose's short volume syntax splits on ':'.
            self.bad("model_dir", value, allowed + " without ':' or ','")
        elif has_control(value):
            self.bad("model_dir", value, allowed, "holds control characters")
        elif value in SYSTEM_DIRS:
            # The deploy creates the directory and sets its owner and mode.
            self.bad("model_dir", value, allowed + " (a directory of its own, not a system "
                     "directory)", "is a system directory")
        else:
            return value
        return None

    def front_port(self, value: Any) -> int | None:
        taken = self.catalog.ports()
        allowed = "a TCP port 1..65535 other than the stacks' loopback ports " + ", ".join(
            f"{p} ({n})" for p, n in taken.items()
        )
        if value is None:
            return None
        if not is_int(value) or not 1 <= value <= 65535:
            self.bad("front_port", value, allowed)
            return None
        if value in taken:
            self.bad("front_port", value, allowed, f"is stack {taken[value]}'s loopback port")
            return None
        return value

    def secret_file(self, key: str, value: Any, min_chars: int = 1) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            self.bad(key, value, "a path on this (control) machine")
            return None
        path = Path(os.path.expanduser(value)).absolute()
        make = (
            f"umask 077; mkdir -p {path.parent}; "
            + ("openssl rand -hex 32" if key == "api_key_file" else 'printf %s "$TOKEN"')
            + f" > {path}"
        )
        try:
            st = path.stat()
        except FileNotFoundError:
            self.bad(key, value, f"an existing file; create it: {make}", "does not exist")
            return None
        except OSError as e:
            self.bad(key, value, "a readable file", f"cannot be read ({e.strerror})")
            return None
        if not stat.S_ISREG(st.st_mode):
            self.bad(key, value, "a regular file", "is not a regular file")
            return None
        if st.st_mode & 0o077:
            self.bad(
                key,
                value,
                f"mode 0600 or stricter: chmod 600 {path}",
                f"is readable by others (mode {stat.S_IMODE(st.st_mode):04o})",
            )
            return None
        try:
            content = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            self.bad(key, value, "a readable UTF-8 file", f"cannot be read ({e})")
            return None
        secret = content.strip()
        # The content is a secret: describe it, never show it.
        if not secret:
            self.bad(key, value, f"a file holding the secret; create it: {make}", "is empty")
        elif any(ch.isspace() for ch in secret) or not secret.isprintable():
            self.bad(
                key,
                value,
                "one line, printable, no spaces (it becomes NAME=value in an env file)",
                "holds whitespace or control characters",
            )
        elif len(secret) < min_chars:
            self.bad(
                key,
                value,
                f"at least {min_chars} characters: {make}",
                f"holds only {len(secret)} characters",
            )
        else:
            return str(path)
        return None

    def url(self, key: str, value: Any) -> str | None:
        if value is None:
            return None
        allowed = "an http:// or https:// URL with a host, e.g. 'http://mirror.lan:5000'"
        if not isinstance(value, str) or any(ch.isspace() for ch in value) or has_control(value):
            self.bad(key, value, allowed)
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            self.bad(key, value, allowed)
            return None
        if parts.username is not None or parts.password is not None:
            # Named without the credentials: this message is logged. In the URL they would
            # reach process arguments, an image's history or a world-readable file.
            shown = parts._replace(netloc=f"***@{parts.netloc.rpartition('@')[2]}").geturl()
            self.bad(key, shown, "a URL without credentials (an index or mirror on the LAN "
                     "that needs none)", "carries credentials (user:password@)")
            return None
        return value

    def apt_repos(self, value: Any) -> dict[str, AptRepo]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            self.bad("apt_repos", value, "a mapping name -> {url, key_url, suite, components}")
            return {}
        out: dict[str, AptRepo] = {}
        for name, entry in value.items():
            repo = self.apt_repo(name, entry)
            if repo is not None:
                out[name] = repo
        for name in REQUIRED_APT_REPOS:
            if name not in value:
                self.missing(f"apt_repos.{name}")
        return out

    def apt_repo(self, name: Any, entry: Any) -> AptRepo | None:
        base = f"apt_repos.{name}"
        if not isinstance(name, str) or not _REPO_NAME.fullmatch(name):
            self.bad(base, name, "lowercase letters, digits and '-' (used in file names)")
            return None
        if not isinstance(entry, Mapping):
            self.bad(base, entry, f"a mapping with keys {', '.join(_APT_REPO_KEYS)}, per_distro")
            return None
        overrides = entry.get("per_distro", {})
        common = {k: v for k, v in entry.items() if k != "per_distro"}
        repo = self.apt_repo_fields(base, name, common)
        allowed = "a mapping NVIDIA distribution name (e.g. 'debian13') -> keys that differ"
        if not isinstance(overrides, Mapping):
            self.bad(f"{base}.per_distro", overrides, allowed)
            return None
        if repo is None:
            return None  # the shared keys' problems are listed once, under base
        variants = []
        for distro, override in overrides.items():
            key = f"{base}.per_distro.{distro}"
            if not isinstance(distro, str) or not _NVIDIA_DISTRO.fullmatch(distro):
                self.bad(key, distro, "an NVIDIA distribution name: debian12, ubuntu2404, ...")
                continue
            if not isinstance(override, Mapping):
                self.bad(key, override, f"a mapping with some of {', '.join(_APT_REPO_KEYS)}")
                continue
            variant = self.apt_repo_fields(key, name, {**common, **override})
            if variant is not None:
                variants.append((distro, variant))
        if len(variants) != len(overrides):
            return None
        return replace(repo, per_distro=tuple(variants))

    def apt_repo_fields(self, base: str, name: str, entry: Mapping[str, Any]) -> AptRepo | None:
        keys = _APT_REPO_KEYS
        ok = True
        for k in entry:
            if k not in keys:
                self.bad(f"{base}.{k}", k, ", ".join(keys), "is an unknown key")
                ok = False
        url = self.templated_url(f"{base}.url", entry.get("url"))
        key_url = self.templated_url(f"{base}.key_url", entry.get("key_url"))
        suite = entry.get("suite")
        suite_allowed = "'/' for a flat repo (NVIDIA's) or a suite name such as '{codename}'"
        if (not isinstance(suite, str) or not suite or any(ch.isspace() for ch in suite)
                or not _APT_WORD.fullmatch(suite)):
            self.bad(f"{base}.suite", suite, suite_allowed)
            suite = None
        elif not self.placeholders(f"{base}.suite", suite):
            suite = None
        components = entry.get("components", [])
        if not isinstance(components, list | tuple) or not all(
            isinstance(x, str) and _APT_WORD.fullmatch(x) for x in components
        ):
            self.bad(f"{base}.components", components,
                     "a list of component names (letters, digits and ._-/)")
            components = None
        elif suite is not None:
            flat = suite.endswith("/")
            if flat and components:
                self.bad(
                    f"{base}.components",
                    components,
                    "[] with a flat suite ending in '/'",
                    f"is not empty, but suite {suite!r} is a flat repository",
                )
                components = None
            elif not flat and not components:
                self.bad(
                    f"{base}.components",
                    components,
                    "at least one, e.g. ['main']",
                    f"is empty, but suite {suite!r} is not flat",
                )
                components = None
        fingerprint = entry.get("key_fingerprint")
        if fingerprint is not None:
            normal = fingerprint.replace(" ", "").upper() if isinstance(fingerprint, str) else ""
            if not _FINGERPRINT.fullmatch(normal):
                self.bad(f"{base}.key_fingerprint", fingerprint, "40 hex digits (spaces ok)")
                ok = False
            fingerprint = normal
        if ok and url and key_url and suite and components is not None:
            return AptRepo(name, url, key_url, suite, tuple(components), fingerprint or None)
        return None

    def templated_url(self, key: str, value: Any) -> str | None:
        allowed = "an http(s) URL; it may use the placeholders below and apt's $(ARCH)"
        if value is None:
            self.missing(key)
            return None
        if not isinstance(value, str):
            self.bad(key, value, allowed)
            return None
        if not self.placeholders(key, value):
            return None
        # Check the URL as it will be once the placeholders are filled for some host.
        sample = value.replace("$(ARCH)", "amd64").format(
            id="ubuntu", version="24.04", codename="noble", distro="ubuntu2404"
        )
        parts = urlsplit(sample)
        if (parts.scheme not in ("http", "https") or not parts.hostname
                or any(ch.isspace() for ch in sample) or has_control(sample)):
            self.bad(key, value, allowed)
            return None
        return value

    def placeholders(self, key: str, value: str) -> bool:
        allowed = ", ".join(f"{{{k}}} ({v})" for k, v in APT_PLACEHOLDERS.items())
        try:
            fields = [f for _, f, _, _ in string.Formatter().parse(value) if f is not None]
        except ValueError:
            self.bad(key, value, f"placeholders {allowed}", "has unbalanced braces")
            return False
        unknown = [f for f in fields if f not in APT_PLACEHOLDERS]
        if unknown:
            self.bad(key, value, f"placeholders {allowed}", f"uses unknown {{{unknown[0]}}}")
            return False
        return True

    def extra_env(self, value: Any) -> dict[str, dict[str, str]]:
        allowed_shape = "a mapping stack -> {NAME: value}, e.g. {'int8': {'FOO': '1'}}"
        if not isinstance(value, Mapping):
            self.bad("extra_env", value, allowed_shape)
            return {}
        out: dict[str, dict[str, str]] = {}
        for stack, env in value.items():
            key = f"extra_env.{stack}"
            if stack not in self.catalog:
                self.bad(key, stack, ", ".join(self.catalog.names), "is not a stack in the catalog")
                continue
            if not isinstance(env, Mapping):
                self.bad(key, env, allowed_shape)
                continue
            out[stack] = {}
            for name, v in env.items():
                if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
                    self.bad(f"{key}.{name}", name, "an environment name [A-Za-z_][A-Za-z0-9_]*")
                elif isinstance(v, bool) or not isinstance(v, str | int | float):
                    self.bad(f"{key}.{name}", v, "a string or number (write booleans as '1'/'0')")
                elif has_control(str(v)):
                    self.bad(f"{key}.{name}", v, "printable text", "holds control characters")
                else:
                    out[stack][name] = str(v)
        return out


    def swap(self, get: Any) -> SwapSettings | None:
        """``gate_profile`` (``full``: real rigs, default; ``fast``: the testbed), ``gate_set``
        (``key=value`` overrides of the profile), ``ready_timeout_s``, ``gate_timeout_s``,
        ``drain_timeout_s`` (0 allowed: stop at once)."""
        profile = self.choice("gate_profile", get("gate_profile"), sorted(PROFILES))
        sets = get("gate_set")
        if isinstance(sets, str):
            sets = [sets]
        if not isinstance(sets, list | tuple) or not all(
                isinstance(x, str) and not has_control(x) for x in sets):
            self.bad("gate_set", sets, "a list of 'key=value' overrides of the gate profile, "
                     "e.g. ['soak_sessions=4']")
            sets = ()
        elif profile is not None:
            try:
                resolve(profile, list(sets))
            except ProfileError as e:
                self.add(f"gate_set: {e}")
        timeouts: dict[str, float] = {}
        for key in ("ready_timeout_s", "gate_timeout_s"):
            value = get(key)
            if value is None:
                continue
            checked = self.number(key, value, 0.0, None, "seconds > 0", low_open=True)
            if checked is not None:
                timeouts[key] = checked
        drain = get("drain_timeout_s")
        if drain is not None:
            checked = self.number("drain_timeout_s", drain, 0.0, MAX_DRAIN_TIMEOUT_S,
                                  f"seconds in [0, {MAX_DRAIN_TIMEOUT_S:g}] that accepted "
                                  "requests may take to finish before a stack stops")
            if checked is not None:
                timeouts["drain_timeout_s"] = checked
        backoff = self.backoff("supervise_backoff_s", get("supervise_backoff_s"))
        limit_value = get("supervise_limit")
        limit = None if limit_value is None else self.integer(
            "supervise_limit", limit_value, 1, 100,
            "an integer 1..100: recreations within supervise_window_s before the supervisor "
            "gives up")
        window_value = get("supervise_window_s")
        window = None if window_value is None else self.number(
            "supervise_window_s", window_value, 0.0, None,
            "seconds > 0: the sliding window supervise_limit counts recreations in",
            low_open=True)
        if profile is None:
            return None
        defaults = SwapSettings()
        return SwapSettings(
            gate_profile=profile, gate_set=tuple(sets),
            ready_timeout_s=timeouts.get("ready_timeout_s", defaults.ready_timeout_s),
            gate_timeout_s=timeouts.get("gate_timeout_s", defaults.gate_timeout_s),
            drain_timeout_s=timeouts.get("drain_timeout_s"),
            supervise_backoff_s=backoff or defaults.supervise_backoff_s,
            supervise_limit=limit or defaults.supervise_limit,
            supervise_window_s=window or defaults.supervise_window_s,
        )

    def backoff(self, key: str, value: Any) -> tuple[float, ...] | None:
        """A list of seconds >= 0 (``[10, 30, 90]``; ``--data`` may give ``10,30,90``); None
        when unset or bad (bad is recorded)."""
        if value is None:
            return None
        allowed = ("a non-empty list of seconds >= 0, e.g. [10, 30, 90] (the wait before the "
                   "1st, 2nd, ... recreation; the last one repeats)")
        if isinstance(value, str):
            try:
                return parse_backoff(value)
            except ValueError:
                self.bad(key, value, allowed)
                return None
        if not isinstance(value, list | tuple) or not value or not all(
                isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
                and v >= 0 for v in value):
            self.bad(key, value, allowed)
            return None
        return tuple(float(v) for v in value)

    def site_ca_files(self, value: Any) -> tuple[str, ...]:
        """Control-side PEM certificate files the host should trust (optional)."""
        if value is None:
            return ()
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list | tuple):
            self.bad("site_ca_files", value, "a list of PEM file paths")
            return ()
        out = []
        for i, path in enumerate(value):
            p = Path(os.path.expanduser(str(path)))
            try:
                text = p.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                text = ""
            if "-----BEGIN CERTIFICATE-----" not in text:
                self.bad(f"site_ca_files[{i}]", str(path),
                         "a file holding '-----BEGIN CERTIFICATE-----'",
                         "is not a readable PEM certificate")
                continue
            out.append(str(p.absolute()))
        return tuple(out)

    def flag(self, key: str, value: Any) -> bool:
        """A yes/no flag (``True``/``False``, or 1/0, "yes"/"no" from ``--data``)."""
        checked = flag_value(value)
        if checked is None:
            self.bad(key, value, "true or false (on the command line: --data KEY=1)")
            return False
        return checked

    def tls(self, prefix: str, cert: Any, key: Any, ca: Any) -> FrontTls | None:
        """``<prefix>_tls_cert_file`` + ``<prefix>_tls_key_file`` (+ ``<prefix>_tls_ca_file``):
        PEM files on this machine; the key private (0600), unencrypted and the certificate's
        own; the certificate must verify against the CA file (itself when none is given).
        ``prefix``: ``front`` (nginx on a GPU host) or ``balancer`` (HAProxy)."""
        cert_key, key_key, ca_key = (f"{prefix}_tls_{k}_file" for k in ("cert", "key", "ca"))
        if cert is None and key is None:
            if ca is not None:
                self.bad(ca_key, ca, f"only together with {cert_key} and {key_key}",
                         f"is set but the {prefix} has no certificate")
            return None
        if cert is None or key is None:
            missing = key_key if key is None else cert_key
            self.missing(missing, f"both {cert_key} and {key_key} (PEM files on this machine), "
                         f"or neither (the {prefix} serves plain HTTP)")
            return None
        cert_path = self.pem_file(cert_key, cert, "CERTIFICATE")
        key_path = self.tls_key_file(key, key_key)
        ca_path = cert_path if ca is None else self.pem_file(ca_key, ca, "CERTIFICATE")
        if not (cert_path and key_path and ca_path):
            return None
        problem = tls_pair_problem(cert_path, key_path, ca_path, cert_key)
        if problem:
            which, what, allowed = problem
            if which == "key":
                self.bad(key_key, key, allowed, what)
            elif ca is not None:
                self.bad(ca_key, ca, allowed, what)
            else:
                self.bad(cert_key, cert, allowed + f" (set {ca_key} to the CA when the "
                         "certificate is not self-signed)", what)
            return None
        return FrontTls(cert_path, key_path, ca_path)

    def address(self, key: str, value: Any) -> str | None:
        """``host`` or ``host:port`` (an IPv6 address in brackets), as a server line takes it."""
        if value is None:
            return None
        allowed = "a host name or address, optionally with :port, e.g. 'rig-a.lan:8000'"
        if not isinstance(value, str) or not (_HOST_PORT.fullmatch(value)
                                              or _HOST6_PORT.fullmatch(value)):
            self.bad(key, value, allowed)
            return None
        port = value.rpartition("]")[2] if value.startswith("[") else value
        if ":" in port and not 1 <= int(port.rpartition(":")[2]) <= 65535:
            self.bad(key, value, allowed, "has a port outside 1..65535")
            return None
        return value

    def local_text(self, key: str, value: Any,
                   allowed: str) -> tuple[Path, str, os.stat_result] | None:
        """A UTF-8 file on this (control) machine: (absolute path, text, stat) or None."""
        if not isinstance(value, str) or not value.strip():
            self.bad(key, value, allowed)
            return None
        path = Path(os.path.expanduser(value)).absolute()
        try:
            st = path.stat()
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            self.bad(key, value, allowed, "does not exist")
            return None
        except (OSError, UnicodeDecodeError) as e:
            self.bad(key, value, allowed, f"cannot be read ({getattr(e, 'strerror', None) or e})")
            return None
        return path, text, st

    def pem_file(self, key: str, value: Any, label: str) -> str | None:
        allowed = f"a readable PEM file on this (control) machine holding '-----BEGIN {label}'"
        found = self.local_text(key, value, allowed)
        if found is None:
            return None
        path, text, _ = found
        if f"-----BEGIN {label}-----" not in text:
            self.bad(key, value, allowed, "is not a PEM certificate")
            return None
        return str(path)

    def tls_key_file(self, value: Any, key: str = "front_tls_key_file") -> str | None:
        allowed = "a PEM private key on this (control) machine, mode 0600, unencrypted"
        found = self.local_text(key, value, allowed)
        if found is None:
            return None
        path, text, st = found
        # The content is a secret: describe it, never show it.
        if st.st_mode & 0o077:
            self.bad(key, value, f"mode 0600 or stricter: chmod 600 {path}",
                     f"is readable by others (mode {stat.S_IMODE(st.st_mode):04o})")
            return None
        if "ENCRYPTED" in text:
            self.bad(key, value, f"{allowed} (nginx cannot ask for a passphrase at boot; "
                     f"decrypt it: openssl pkey -in {path} -out <new file>)",
                     "is an encrypted key")
            return None
        if not re.search(r"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----", text):
            self.bad(key, value, allowed, "holds no PEM private key (content not shown)")
            return None
        return str(path)

    def git_url(self, key: str, value: Any) -> str | None:
        if value is None:
            return None
        return self.string(key, value, _GIT_URL, "a git URL (https://, http://, ssh://, "
                           "git://, file:// or user@host:path)")


def _data_keys(data: Any) -> list[Any]:
    # pyinfra's HostData is not a Mapping but has .dict(); tests pass plain dicts.
    if isinstance(data, Mapping):
        return list(data.keys())
    as_dict = getattr(data, "dict", None)
    if callable(as_dict):
        try:
            return list(as_dict().keys())
        except Exception:  # a data source that cannot list itself: skip the typo check
            return []
    return []


def _no_password() -> str:
    # An encrypted key would otherwise make OpenSSL prompt on the terminal.
    raise ValueError("the key is encrypted")


def tls_pair_problem(cert: str, key: str, ca: str,
                     cert_key: str = "front_tls_cert_file") -> tuple[str, str, str] | None:
    """Does ``key`` belong to ``cert``, and does ``cert`` verify against ``ca``? Checked with
    the standard library: an in-memory TLS handshake between a server holding cert + key and
    a client trusting only ``ca`` (dates included). Returns (which: "key" | "verify", what
    is wrong, what is allowed), or None when all is well. Nothing is shown of the key.
    """
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        server.load_cert_chain(cert, key, password=_no_password)
    except (ssl.SSLError, ValueError, OSError) as e:
        reason = getattr(e, "reason", None) or type(e).__name__
        return ("key", f"does not load with the certificate ({reason}: the key is not the "
                "certificate's, or not a key nginx can use)",
                f"the private key that belongs to {cert_key}")
    try:
        client = tls_context(ca)
    except (ssl.SSLError, OSError) as e:
        return ("verify", f"cannot be loaded as trusted certificates ({e})",
                f"PEM certificate(s) of the CA that signed {cert_key}")
    client.check_hostname = False
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    c = client.wrap_bio(c_in, c_out)
    srv = server.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(20):
        for name, side in (("client", c), ("server", srv)):
            if done[name]:
                continue
            try:
                side.do_handshake()
                done[name] = True
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLCertVerificationError as e:
                ca_key = cert_key.replace("_cert_", "_ca_")
                who = cert_key.partition("_tls_")[0]
                return ("verify", f"does not verify the {who}'s certificate "
                        f"({e.verify_message})",
                        f"the CA that signed {cert_key} ({ca_key}), or a "
                        "certificate that is valid now")
            except ssl.SSLError as e:
                if name == "server":
                    break  # the client's error says why
                return ("verify", f"fails a TLS handshake ({e.reason or e})",
                        "a certificate and key nginx can serve")
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            return None
    return ("verify", "fails a TLS handshake (no result)", "a certificate and key nginx can serve")
