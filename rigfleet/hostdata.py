"""Host data, checked on the control side before any host changes; every key is described once,
in ``KEYS`` (``python -m rigfleet.hostdata docs/hostdata.md`` writes its tables)::

    settings = validate_host(host.name, host.data)   # host.data or a plain dict
    settings.power_caps_w    # (290, 290): one cap per card
    settings.spec.port       # 8011 for stack "int8"
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from rigfleet.aptrepos import OS_ALLOWED, AptRepo, check_apt_repos, os_named
from rigfleet.catalog import MAX_DRAIN_TIMEOUT_S, Catalog, StackSpec, builtin_catalog
from rigfleet.gpu import GpuInfo
from rigfleet.hostchecks import (
    MIN_API_KEY_CHARS,
    POWER_CAP_RANGE_W,
    REQUIRED,
    HostChecker,
    Key,
    by_name,
    flag_value,
    host_name_or_ip,
    number_check,
    url_host,
    valid_if,
)
from rigfleet.hostside.layout import HOST
from rigfleet.hostside.plan import GATE_TIMEOUT_S, READY_TIMEOUT_S, RETRY_AFTER_S, VRAM_TIMEOUT_S
from rigfleet.hostside.supervise import Policy
from rigfleet.hostside.verify.profiles import PROFILES
from rigfleet.image_sources import DEFAULT_SOURCES, KINDS, ImageSource, parse_sources
from rigfleet.inventory import HostKind
from rigfleet.keytable import write_docs
from rigfleet.tlsfiles import FrontTls, check_tls
from rigfleet.validate import (
    GIT_URL_ALLOWED,
    TOKEN_ALLOWED,
    URL_ALLOWED,
    Problems,
    ValidationError,
    is_int,
)

_FLAG = "true or false (on the command line: --data KEY=1)"
_SECRET = f"a file on this (control) machine, mode 0600, one line of {TOKEN_ALLOWED}"
_TLS = "a PEM file on this (control) machine"

_C = HostChecker
_url = by_name(HostChecker.url)
_port = number_check(1, 65535, integer=True)
_seconds = number_check(0.0, None, low_open=True)
_host = valid_if(host_name_or_ip)
_as_is = valid_if(lambda value: True)  # no check of its own (control characters aside)
_PORT = "a TCP port 1..65535"
_HOST_TEXT = "a host name or an IP address (no port)"
# What nginx's ``root`` (the model cache site) would split, end or expand as written.
_NOT_NGINX = re.compile(r"[\s;{}#$\"'\\]")


def _nginx_root(c: HostChecker, key: Key, value: Any) -> str | None:
    if isinstance(value, str) and _NOT_NGINX.search(value):
        c.bad(key.name, value, key.allowed, "cannot be nginx's root as written (the model cache "
              "site)")
        return None
    return c.model_dir(key, value)


# The order is the order of the checks (a key's check may read the keys before it).
KEYS: dict[str, Key] = {k.name: k for k in (
    Key("stacks_dir", _C.stacks_dir, None, "a directory of stack files on this (control) "
        "machine, e.g. 'inventory/stacks'", "user stack files, beside the built-in stacks "
        "(README.md, Swapping stacks)", on="any"),
    Key("stack", _C.stack, REQUIRED, "a stack of the catalog (built-in or in stacks_dir)",
        "the stack the host serves"),
    Key("gpu_count", _C.gpu_count, 2, "an integer 1..16 (the host's number of GPUs)",
        "the GPUs the host must have; checked against nvidia-smi once the driver answers"),
    Key("power_caps_w", _C.power_caps, REQUIRED, f"watts, {POWER_CAP_RANGE_W[0]}.."
        f"{POWER_CAP_RANGE_W[1]}: one for every card, or a list with one per card",
        "the power cap of each card (checked against the card's own range at deploy time)"),
    Key("model_dir", _C.model_dir, REQUIRED, "an absolute, normalised directory other than "
        "'/', e.g. '/srv/models'", "where the weights live, one directory per model revision; "
        "the deploy makes it root's (0755) and prunes it, so it must be a directory of its "
        "own (not a home, nor inside a system or rigfleet directory)"),
    Key("front_port", _C.front_port, REQUIRED, "a TCP port 1..65535 other than the stacks' "
        "loopback ports", "where the authenticating front (nginx) listens"),
    Key("api_key_file", _C.secret_file, REQUIRED, _SECRET + f", at least {MIN_API_KEY_CHARS} "
        "characters", "the API key clients send (the front's and the balancer's); it reaches "
        f"hosts as root-only files in {HOST.secrets_dir}", on="any", group="Secrets"),
    Key("hf_token_file", _C.secret_file, None, _SECRET, "a Hugging Face token for the weights' "
        f"download ({HOST.hf_token_file} on the host, root-only)",
        on="gpu,cache", group="Secrets"),
    Key("docker_registry_mirror", _url, None, URL_ALLOWED, "a Docker Hub pull-through cache for "
        "the host's dockerd", group="Sources"),
    Key("pip_index_url", _url, None, URL_ALLOWED, "the Python package index hosts install from "
        "(huggingface_hub, the Genesis entrypoint)", on="gpu,cache", group="Sources"),
    Key("runtime_pip_index_url", _url, None, URL_ALLOWED, "where a Genesis stack's pinned runtime "
        "packages are installed from when its image is built", group="Sources",
        shown_default="pip_index_url, else PyPI"),
    Key("hf_endpoint", _url, None, URL_ALLOWED, "a Hugging Face hub (mirror) the weights come "
        "from (HF_ENDPOINT): the upstream, after the fleet cache (docs/images.md)",
        on="gpu,cache", group="Sources", shown_default="huggingface.co"),
    Key("front_url", _url, None, URL_ALLOWED, "how clients reach the front (rigfleet endpoints, "
        "bench); https:// when the front serves TLS",
        shown_default="<scheme>://<ssh address>:<front_port>"),
    Key("apt_repos", by_name(check_apt_repos), REQUIRED, "a mapping name -> {url, key_url, "
        "suite, components, key_fingerprint}; cuda and nvidia-container-toolkit required",
        "the apt repositories of the driver, the container toolkit and Docker; URLs may "
        "hold {id}, {version}, {codename}, {distro} and apt's $(ARCH)", group="Sources"),
    Key("extra_env", _C.extra_env, {}, "a mapping stack -> {NAME: value}, e.g. {'int8': "
        "{'FOO': '1'}}", "extra container environment per stack (debugging, fault "
        "injection); written to the compose file, so names that look like secrets "
        "(*_KEY, *_TOKEN, *_SECRET, *PASSWORD*) are refused"),
    Key("pins_file", valid_if(lambda v: isinstance(v, str) and v.strip()), "pins.yaml",
        "a path to the pins file, e.g. 'pins.yaml'", "the pins file (relative to where pyinfra "
        "runs)", group="Sources"),
    Key("gate_profile", _C.gate_profile, "full", ", ".join(sorted(PROFILES)), "the gate's "
        "profile (full for real rigs, fast for the testbed)", group="Swap"),
    Key("gate_set", _C.gate_set, (), "a list of 'key=value' overrides of the gate profile, "
        "e.g. ['soak_sessions=4']", "overrides of the gate profile (--set), checked before "
        "the run", group="Swap"),
    Key("ready_timeout_s", _seconds, READY_TIMEOUT_S, "seconds > 0", "how long a stack may take "
        "to become ready", group="Swap"),
    Key("gate_timeout_s", _seconds, GATE_TIMEOUT_S, "seconds > 0", "how long the gate may run",
        group="Swap"),
    Key("drain_timeout_s", number_check(0.0, MAX_DRAIN_TIMEOUT_S), None, f"seconds in [0, "
        f"{MAX_DRAIN_TIMEOUT_S:g}] that accepted requests may take to finish before a stack "
        "stops", "overrides every stack file's drain.timeout_s on this host (0: stop at once)",
        group="Swap", shown_default="the stack file's drain.timeout_s"),
    Key("supervise_backoff_s", _C.backoff, Policy.backoff_s, "a non-empty list of seconds "
        ">= 0, e.g. [10, 30, 90] (the wait before the 1st, 2nd, ... recreation; the last one "
        "repeats)", "the supervisor's wait before each recreation of a dead engine (--data "
        "takes 10,30,90)", group="Swap"),
    Key("supervise_limit", number_check(1, 100, integer=True), Policy.limit, "an integer 1..100: "
        "recreations within supervise_window_s before the supervisor gives up", "recreations "
        "before the next death gives up (503 with the reason)", group="Swap"),
    Key("supervise_window_s", _seconds, Policy.window_s, "seconds > 0: the sliding window "
        "supervise_limit counts recreations in", "the window supervise_limit counts in",
        group="Swap"),
    Key("site_ca_files", _C.site_ca_files, None, "a list of PEM certificate files on this "
        "(control) machine", "CAs the host trusts besides the system's (a LAN mirror's)",
        on="any", group="Sources", shown_default="[]"),
    Key("bump_registry", _url, None, URL_ALLOWED, "the registry v2 rigfleet bump looks for "
        "candidates in", group="Bump", shown_default="Docker Hub"),
    Key("bump_genesis_url", lambda c, key, value: c.git_url(key.name, value, required=False), None,
        GIT_URL_ALLOWED,
        "where this machine fetches Genesis when the pinned URL is not reachable from it",
        group="Bump"),
    Key("bump_mirror", _url, None, URL_ALLOWED, "the registry rigfleet bump --push-mirror "
        "pushes to", group="Bump"),
    Key("throughput_scale", number_check(0.0, 1_000_000.0, low_open=True), 1.0,
        "a number > 0, at most 1000000: this host's decode speed relative to RTX 3090s "
        "(1.0), e.g. the testbed's sim_speedup", "multiplies the stack files' reference tok/s "
        "for the gate of a host without history (other hardware, the testbed)", group="Swap"),
    Key("stacks", _C.stacks, None, "a list of stack names the host may serve, e.g. "
        "['int8', 'tq3-mtp-genesis']", "the stacks the host may serve: it stages (images, "
        "compose files, disk) only these; must include stack",
        shown_default="every pinned stack the host's GPUs can run"),
    Key("image_sources", by_name(parse_sources), None, "a list of mappings, each with a kind: "
        + ", ".join(KINDS), "where the host gets its pinned images, in order "
        "(docs/images.md)", group="Sources", shown_default="[{'kind': 'hub'}]"),
    Key("front_tls_cert_file", _as_is, None, _TLS + ", the certificate (chain: the "
        "server's first)", "the front serves HTTPS on front_port with it", group="TLS"),
    Key("front_tls_key_file", _as_is, None, _TLS + ", its private key, unencrypted, mode "
        "0600", "the certificate's key (both or neither)", group="TLS"),
    Key("front_tls_ca_file", _as_is, None, _TLS + ", certificate(s)", "what clients of "
        "the front trust", group="TLS", shown_default="the certificate itself"),
    Key("ssh_hostname", _host, None, _HOST_TEXT, "pyinfra's SSH address; also where balancers "
        "reach the front (haproxy.cfg) unless balancer_front_address says otherwise", on="any",
        shown_default="the inventory name"),
    Key("balancer_front_address", _C.address, None, "a host name or address, optionally "
        "with :port, e.g. 'rig-a.lan:8000'", "where balancers and monitors reach this host's "
        "front", group="Balancer", shown_default="ssh_hostname and front_port"),
    Key("os", valid_if(os_named), None, f"one of: {OS_ALLOWED}", "the OS the host runs: what "
        "`rigfleet check --online` asks the apt repositories for (unset: every supported OS); "
        "the deploy refuses a host whose os-release says otherwise", on="any",
        shown_default="every supported OS"),
    Key("adopt_foreign_driver", _C.flag, False, _FLAG, "keep a driver no package installed "
        "(NVIDIA's .run installer; loaded, on the pinned branch)", group="Switches"),
    Key("rigfleet_stop_on_preflight", _C.flag, False, _FLAG, "a host refused by its "
        "preflight stops the whole run (also RIGFLEET_STOP_ON_PREFLIGHT=1)", on="any",
        group="Switches"),
    Key("balancer_port", _port, 8080, _PORT + " (clients call http(s)://<balancer>:<port>)",
        "HAProxy's port (not the host's front_port when it serves too)", on="balancer",
        group="Balancer"),
    Key("balancer_url", _url, None, URL_ALLOWED, "how clients and rigfleet status/endpoints reach "
        "the balancer", on="balancer", group="Balancer",
        shown_default="<scheme>://<ssh address>:<balancer_port>"),
    Key("balancer_tls_cert_file", _as_is, None, _TLS + ", the certificate", "the balancer "
        "serves HTTPS with it", on="balancer", group="Balancer"),
    Key("balancer_tls_key_file", _as_is, None, _TLS + ", its private key, unencrypted, "
        "mode 0600", "the certificate's key (both or neither)", on="balancer",
        group="Balancer"),
    Key("balancer_tls_ca_file", _as_is, None, _TLS + ", certificate(s)", "what clients of "
        "the balancer trust", on="balancer", group="Balancer",
        shown_default="the certificate itself"),
    Key("balancer_plain_fronts", _C.flag, False, _FLAG, "an HTTPS balancer may pass requests "
        "(and the API key) on to plain-HTTP fronts: the LAN between them is trusted, on "
        "purpose", on="balancer", group="Balancer"),
    Key("balancer_default_stack", _C.stack, None, "a stack some GPU host serves",
        "where plain /v1/... goes", on="balancer", group="Balancer",
        shown_default="the only stack, if one"),
    Key("balancer_check_interval_s", number_check(0.5, 30.0), 2, "seconds between "
        "readiness checks, 0.5..30", "how often HAProxy checks each front's "
        "readiness", on="balancer", group="Balancer"),
    Key("monitor_retention_days", number_check(1, 3650, integer=True), 30, "an integer "
        "1..3650", "how many days of metrics Prometheus keeps", on="monitor", group="Monitor"),
    Key("monitor_retention_gib", number_check(1, 1_000_000, integer=True), None, "an integer "
        "1..1000000 (GiB)", "the most disk Prometheus' metrics may take (the oldest go first)",
        on="monitor", group="Monitor", shown_default="16 MiB per GPU host and retention day, "
        "at least 2"),
    Key("monitor_alertmanager_file", _C.alertmanager_file, None, "a file on this (control) "
        "machine, mode 0600: Alertmanager's YAML config with route and receivers",
        "where alerts go (mail, chat): it replaces rigfleet's config, checked with amtool "
        "first, root:prometheus 0640 on the host", on="monitor", group="Monitor",
        shown_default="one receiver without integrations (alerts show in the UI and API)"),
    Key("balancer_retry_buffer_kib", number_check(16, 1024, integer=True), 128,
        "KiB, 16..1024 (HAProxy's buffer per direction and connection; a request "
        "up to this size can be retried on another host)", "requests up to this size are "
        "retried on another host after a 503 or a closed connection", on="balancer",
        group="Balancer"),
    Key("cache_address", _host, None, _HOST_TEXT, "where the fleet's hosts reach the cache over "
        "the LAN", on="cache", group="Cache",
        shown_default="ssh_hostname, else the inventory name"),
    Key("peer_port", _C.front_port, 8082, _PORT + " other than front_port and the stacks' "
        "loopback ports", "with no fleet cache: where "
        "this host serves its verified weights and pinned images to the fleet's other GPU hosts "
        "during their converge (reached at balancer_front_address's host, else ssh_hostname)",
        group="Cache"),
    Key("cache_registry_port", _port, 5000, _PORT, "the pull-through registry's port (every "
        "address: hosts pull from it)", on="cache", group="Cache"),
    Key("cache_registry_upstream", _url, "https://registry-1.docker.io", URL_ALLOWED,
        "the registry the cache pulls through from (the pinned images' registry)", on="cache",
        group="Cache"),
    Key("cache_model_port", _port, 8081, _PORT, "the model cache's port (nginx, read-only files "
        "of verified revisions)", on="cache", group="Cache"),
    Key("cache_model_dir", _nginx_root, "/srv/rigfleet-cache/models", "an absolute, normalised "
        "directory other than a system one, without spaces or any of ;{}#$\"'\\", "where the "
        "cache keeps verified model revisions (<repo>/<revision>/)", on="cache", group="Cache"),
)}
KEY_DEFAULTS: dict[str, Any] = {
    k.name: None if k.default is REQUIRED else k.default for k in KEYS.values()}


class HostDataError(ValidationError):
    """A host's data is wrong; one line per problem."""


@dataclass(frozen=True)
class SwapSettings:
    """The gate and time limits of one host's transactions (``drain_timeout_s`` None: per stack)."""

    gate_profile: str = KEY_DEFAULTS["gate_profile"]
    gate_set: tuple[str, ...] = KEY_DEFAULTS["gate_set"]
    ready_timeout_s: float = KEY_DEFAULTS["ready_timeout_s"]
    vram_timeout_s: float = VRAM_TIMEOUT_S
    gate_timeout_s: float = KEY_DEFAULTS["gate_timeout_s"]
    retry_after_s: int = RETRY_AFTER_S
    drain_timeout_s: float | None = None
    supervise_backoff_s: tuple[float, ...] = KEY_DEFAULTS["supervise_backoff_s"]
    supervise_limit: int = KEY_DEFAULTS["supervise_limit"]
    supervise_window_s: float = KEY_DEFAULTS["supervise_window_s"]

    @property
    def follow_timeout_s(self) -> float:
        """How long the deploy follows a transaction before giving up (it keeps running)."""
        return 2 * (self.ready_timeout_s + self.vram_timeout_s) + self.gate_timeout_s + 600


@dataclass(frozen=True)
class HostSettings:
    """One GPU host's validated settings (docs/hostdata.md: each key's meaning)."""

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
    pins_file: str = KEY_DEFAULTS["pins_file"]
    runtime_pip_index_url: str | None = None
    gpu_count: int = KEY_DEFAULTS["gpu_count"]
    swap: SwapSettings = SwapSettings()
    site_ca_files: tuple[str, ...] = ()
    front_url: str | None = None
    stacks_dir: str | None = None
    bump_registry: str | None = None  # bump_*: where `rigfleet bump` looks (the canary's data)
    bump_genesis_url: str | None = None
    bump_mirror: str | None = None
    throughput_scale: float = KEY_DEFAULTS["throughput_scale"]
    stacks: tuple[str, ...] | None = None
    image_sources: tuple[ImageSource, ...] = DEFAULT_SOURCES
    front_tls: FrontTls | None = None
    balancer_front_address: str | None = None
    peer_port: int = KEY_DEFAULTS["peer_port"]
    adopt_foreign_driver: bool = False
    catalog: Catalog = field(default_factory=builtin_catalog, compare=False, repr=False)

    @property
    def front_scheme(self) -> str:
        return "https" if self.front_tls else "http"

    @property
    def spec(self) -> StackSpec:
        return self.catalog.get(self.stack)

    def env_for(self, stack: str) -> dict[str, str]:
        """Extra container environment for ``stack`` on this host (a fresh dict)."""
        return dict(self.extra_env.get(stack, {}))


@dataclass(frozen=True)
class BalancerSettings:
    """A balancer host's validated settings (host data ``balancer_*``; docs/balancer.md)."""

    name: str
    port: int
    api_key_file: str
    tls: FrontTls | None = None
    url: str | None = None
    default_stack: str | None = None
    check_interval_s: float = float(KEY_DEFAULTS["balancer_check_interval_s"])
    retry_buffer_kib: int = KEY_DEFAULTS["balancer_retry_buffer_kib"]
    site_ca_files: tuple[str, ...] = ()
    plain_fronts: bool = False
    catalog: Catalog = field(default_factory=builtin_catalog, compare=False, repr=False)

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"


def validate_host(name: str, data: Mapping[str, Any] | Any) -> HostSettings:
    """``data``: ``host.data`` or a mapping; raises ``HostDataError`` listing every problem."""
    c = HostChecker(name)
    v = c.check_keys(data, "gpu", KEYS)
    tls = check_tls(c, v, "front", "front_url")
    if v["peer_port"] is not None and v["peer_port"] == v["front_port"]:
        c.bad("peer_port", v["peer_port"], "a port other than front_port",
              "is this host's front_port too")
    return _settings(c, HostSettings, "", name=name, swap=_settings(c, SwapSettings, ""),
                     front_tls=tls, catalog=c.catalog)


def _settings(c: HostChecker, cls: Any, prefix: str, **given: Any) -> Any:
    """``cls`` of ``c``'s values (else HostDataError): ``f`` from key ``<prefix>f``, else ``f``."""
    c.raise_if_any(HostDataError)
    keys = {f.name: prefix + f.name if prefix + f.name in c.values else f.name
            for f in fields(cls) if f.name not in given}
    return cls(**given, **{name: c.values[key] for name, key in keys.items() if key in c.values})


def validate_balancer(name: str, data: Mapping[str, Any] | Any, *,
                      gpu_host: bool = False) -> BalancerSettings:
    """Check a balancer host's data (``gpu_host``: it serves too); raises ``HostDataError``."""
    c = HostChecker(name)
    v = c.check_keys(data, "balancer", KEYS)
    port, front_port = v["balancer_port"], data.get("front_port", None)
    stacks = c.catalog.ports()  # a host that serves too: its stacks' loopback ports
    if gpu_host and port is not None and port == front_port:
        c.bad("balancer_port", port, f"a port other than front_port {front_port}",
              "is this host's front_port too (the host serves and balances)")
    elif gpu_host and port in stacks:
        c.bad("balancer_port", port, "a port other than the stacks' loopback ports " + ", ".join(
            f"{p} ({n})" for p, n in stacks.items()), f"is stack {stacks[port]}'s loopback "
            "port (the host serves and balances)")
    tls = check_tls(c, v, "balancer", "balancer_url")
    return _settings(c, BalancerSettings, "balancer_", name=name, tls=tls, catalog=c.catalog)


@dataclass(frozen=True)
class MonitorSettings:
    """A monitor host's validated settings (host data ``monitor_*``; docs/monitoring.md)."""

    name: str
    api_key_file: str
    retention_days: int = KEY_DEFAULTS["monitor_retention_days"]
    retention_gib: int | None = None
    site_ca_files: tuple[str, ...] = ()
    alertmanager_file: str | None = None


# Loopback ports on the monitor host (and the node exporter's on every host): docs/monitoring.md.
# A cache on the monitor host keeps clear of them; 9094 is Alertmanager's cluster port.
PROMETHEUS_PORT = 9090
ALERTMANAGER_PORT = 9093
NODE_EXPORTER_PORT = 9100
MONITOR_PORTS = (PROMETHEUS_PORT, ALERTMANAGER_PORT, 9094, NODE_EXPORTER_PORT)


def validate_monitor(name: str, data: Mapping[str, Any] | Any) -> MonitorSettings:
    """Check a monitor host's data; raises ``HostDataError``."""
    c = HostChecker(name)
    c.check_keys(data, "monitor", KEYS)
    return _settings(c, MonitorSettings, "monitor_", name=name)


@dataclass(frozen=True)
class CacheSettings:
    """A cache host's validated settings (host data ``cache_*``; docs/images.md)."""

    name: str
    address: str
    registry_port: int = KEY_DEFAULTS["cache_registry_port"]
    registry_upstream: str = KEY_DEFAULTS["cache_registry_upstream"]
    model_port: int = KEY_DEFAULTS["cache_model_port"]
    model_dir: str = KEY_DEFAULTS["cache_model_dir"]
    hf_endpoint: str | None = None
    hf_token_file: str | None = None
    pip_index_url: str | None = None
    site_ca_files: tuple[str, ...] = ()

    @property
    def model_url(self) -> str:
        return f"http://{url_host(self.address)}:{self.model_port}"

    @property
    def registry_url(self) -> str:
        return f"http://{url_host(self.address)}:{self.registry_port}"


_CACHE_ONLY = HostKind(gpu=False, balancer=False, cache=True)


def ports_taken(p: Problems, ports: Mapping[str, Any], kind: HostKind, *others: Any) -> None:
    """Refuse each of ``ports`` (key: port) that another service of a ``kind`` host takes: a
    monitor's, a GPU host's node exporter, ``others`` (one that is no integer: left out)."""
    used = sorted({*(MONITOR_PORTS if kind.monitor else ()),
                   *((NODE_EXPORTER_PORT,) if kind.gpu else ()),
                   *(port for port in others if is_int(port))})
    for key, port in ports.items():
        if port is not None and port in used:
            p.bad(key, port, f"a port none of this host's other services use ({used})",
                  "is taken by another service of this host")


def validate_cache(name: str, data: Mapping[str, Any] | Any,
                   kind: HostKind = _CACHE_ONLY) -> CacheSettings:
    """Check a cache host's data (``kind``: the host's other roles, whose ports it must not
    take); raises ``HostDataError``."""
    c = HostChecker(name)
    v = c.check_keys(data, "cache", KEYS)
    ports = {key: v[key] for key in ("cache_registry_port", "cache_model_port")}
    registry, model = ports.values()
    if registry is not None and registry == model:
        c.bad("cache_model_port", model, "a port other than cache_registry_port",
              "is cache_registry_port too")
    balancer = data.get("balancer_port") or KEY_DEFAULTS["balancer_port"]
    ports_taken(c, ports, kind, *([balancer] if kind.balancer else ()),
                *([data.get("front_port"), *c.catalog.ports()] if kind.gpu else ()))
    c.raise_if_any(HostDataError)  # before the values are used
    address = v["cache_address"] or data.get("ssh_hostname", None) or name
    return _settings(c, CacheSettings, "cache_", name=name, address=address,
                     registry_upstream=v["cache_registry_upstream"].rstrip("/"))


def stop_on_preflight(data: Mapping[str, Any] | Any) -> bool:
    """Stop the whole run when a host fails its preflight? Read leniently (the rest may not)."""
    return bool(flag_value(os.environ.get("RIGFLEET_STOP_ON_PREFLIGHT", ""))
                or flag_value(data.get("rigfleet_stop_on_preflight", None)))


def check_caps_against_gpus(host: str, caps: Sequence[int], gpus: Sequence[GpuInfo]) -> None:
    """A cap outside its card's own range raises ``HostDataError`` (boards may keep the old)."""
    p = Problems(host)
    ordered = sorted(gpus, key=lambda g: g.index)
    if len(caps) != len(ordered):
        p.bad("power_caps_w", list(caps), "one cap per card (and gpu_count set to the number of "
              "cards)", f"has {len(caps)} cap(s) but the host has {_listed(ordered)}")
    for pos, (cap, gpu) in enumerate(zip(caps, ordered, strict=False)):
        low, high = gpu.power_min_limit_w, gpu.power_max_limit_w
        if low is None or high is None:
            p.bad(f"power_caps_w[{pos}]", cap, "a card whose limit can be set",
                  f"W cannot be applied: {_card(gpu)} reports no power limit range ([N/A])")
        elif not low <= cap <= high:
            p.bad(f"power_caps_w[{pos}]", cap, f"{low:g}..{high:g} W",
                  f"W is outside {_card(gpu)}'s range")
    p.raise_if_any(HostDataError)


def check_gpus(host: str, gpu_count: int, spec: StackSpec, gpus: Sequence[GpuInfo]) -> list[str]:
    """What is wrong with the cards the host reports (their count, each one's memory)."""
    p = Problems(host)
    ordered = sorted(gpus, key=lambda g: g.index)
    if len(ordered) != gpu_count:
        p.bad("gpu_count", gpu_count, "gpu_count set to the cards the host has (a card missing "
              "from the list: check its seating and power)", f"but nvidia-smi lists "
              f"{_listed(ordered)}")
    need = spec.gpu_memory_mib
    for gpu in ordered:
        if need and (have := gpu.memory_total_mib) is not None and have < need:
            p.bad("stack", spec.name, "a stack whose cards fit, or cards with enough memory",
                  f"needs {need} MiB per card (gpus.memory_mib in {spec.source}) but "
                  f"{_card(gpu)} has {have} MiB")
    return p.lines


def _listed(ordered: Sequence[GpuInfo]) -> str:
    return f"{len(ordered)} GPU(s) (indexes: {', '.join(str(g.index) for g in ordered) or 'none'})"


def _card(gpu: GpuInfo) -> str:
    return f"card {gpu.index}" + (f" ({gpu.name})" if gpu.name else "")


GROUPS = {
    "Serving": "What the host serves and how",
    "Secrets": "Secrets (files on this machine; never in the inventory itself)",
    "Sources": "Where hosts get software, images and weights",
    "Swap": "The swap, the gate and the supervisor (docs/swap.md)",
    "TLS": "TLS at the front",
    "Balancer": "Balancers (docs/balancer.md)",
    "Monitor": "Monitors (docs/monitoring.md)",
    "Cache": "The fleet cache (docs/images.md)",
    "Bump": "rigfleet bump (docs/bump.md)",
    "Switches": "Switches",
}
_ON = {"gpu": "GPU hosts", "balancer": "balancers", "monitor": "monitors", "cache": "caches",
       "any": "all hosts"}


def render_doc(page: str) -> str:
    """docs/hostdata.md's text ``page``: its own opening, then one table per group of ``KEYS``."""

    def cell(text: str) -> str:  # Markdown would take these for a column, emphasis or HTML
        return re.sub(r"([|*<])", r"\\\1", text)

    def default(key: Key) -> str:
        if key.shown_default is not None:
            return cell(key.shown_default)
        if key.default is REQUIRED or key.default is None:
            return "(required)" if key.default is REQUIRED else "none"
        value = list(key.default) if isinstance(key.default, tuple) else key.default
        return f"`{value!r}`"

    out = [page.partition("\n## ")[0]]
    for group, title in GROUPS.items():
        out += [f"## {title}", "", "| key | hosts | allowed | default | meaning |",
                "|---|---|---|---|---|"]
        out += [f"| `{k.name}` | {', '.join(_ON[o] for o in k.on.split(','))} | "
                f"{cell(k.allowed)} | {default(k)} | {cell(k.doc)} |"
                for k in KEYS.values() if k.group == group]
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(write_docs(sys.argv, "python -m rigfleet.hostdata docs/hostdata.md", render_doc))
