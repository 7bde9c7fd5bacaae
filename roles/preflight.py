"""Preflight: host data, pins and facts checked before any change; a problem refuses that host
alone (docs/converge.md). Its ``HostContext`` is what every other role takes."""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, deploy, operation
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.state import BaseStateCallback, State

from rigfleet.aptrepos import OS_ALLOWED, SUPPORTED_OS
from rigfleet.balancer.plan import BalancerPlan, GpuHost, fleet_plan
from rigfleet.catalog import StackSpec
from rigfleet.check import Online, deploy_verdict, online_pass, os_disagrees
from rigfleet.commands import hosttool
from rigfleet.commands import nvidia as nvidia_commands
from rigfleet.desired import DesiredHost, load_desired
from rigfleet.errors import RigfleetError
from rigfleet.factmemo import read_host_once
from rigfleet.facts import (
    GpuQuery,
    GpuState,
    ModuleRejections,
    OsRelease,
    Platform,
    PlatformState,
    SwapProbe,
    read_fact,
    read_services,
)
from rigfleet.hostdata import (
    AptRepo,
    BalancerSettings,
    HostDataError,
    HostSettings,
    check_caps_against_gpus,
    check_gpus,
    stop_on_preflight,
)
from rigfleet.hostside.layout import STACK_UNIT, SUPERVISE_UNIT
from rigfleet.hostside.records import describe, live_holder
from rigfleet.images.deploy import preflight_images
from rigfleet.oporder import fast_operation_order
from rigfleet.packages import OsInfo
from rigfleet.resources import deployed_by
from rigfleet.scrape import METRICS_UNIT, NODE_EXPORTER
from rigfleet.validate import TOKEN_ALLOWED, TOKEN_CHARS, secret_text
from roles.ops import Secret

# The units the roles check (systemd.service, unit_started), read in one round trip.
GPU_HOST_UNITS = ("chrony.service", "docker.service", "nvidia-persistenced.service",
                  "rigfleet-power-caps.service", "nginx.service", STACK_UNIT,
                  SUPERVISE_UNIT, f"{NODE_EXPORTER}.service", f"{METRICS_UNIT}.timer")

# How long a deploy waits for the host's own units to let go of the host lock before refusing.
OWN_UNITS_WAIT_S = 30.0


class PreflightError(RigfleetError, ValueError):
    """This host cannot be provisioned as its data says; the message says why."""


class HostRefused(RigfleetError):
    """The host got its one failing operation instead of the roles (``run_deploy``)."""


@dataclass(frozen=True)
class HostContext:
    """One host's ``DesiredHost`` plus what only the run knows (OS, secrets, who runs it)."""

    want: DesiredHost
    os: OsInfo
    api_key: Secret
    hf_token: Secret | None
    by: str
    platform: PlatformState = field(default_factory=PlatformState)
    driver_adopted: bool = False  # a .run-installed driver on the pinned branch, kept
    tls_key: Secret | None = None  # the front's private key (host data front_tls_key_file)

    @property
    def settings(self) -> HostSettings:
        return self.want.settings

    def apt_repo(self, name: str) -> AptRepo:
        """An apt repository from host data, placeholders filled for this host's OS."""
        return self.want.settings.apt_repos[name].expand(
            os_id=self.os.id, version_id=self.os.version_id, codename=self.os.codename)


@dataclass(frozen=True)
class BalancerContext:
    """What ``roles/balancer.py`` (and ``base``) need for a host of group ``balancers``."""

    plan: BalancerPlan
    api_key: Secret
    tls_key: Secret | None = None

    @property
    def settings(self) -> BalancerSettings:
        return self.plan.settings


# How the pinned things' sources are asked (tests put None or a fake here), once a run.
SOURCES: Callable[[], Online] | None = online_pass
_ONLINE: weakref.WeakKeyDictionary[State, Online] = weakref.WeakKeyDictionary()

# Per run (State): refused hosts and why, for the summary at the end.
_REFUSED: weakref.WeakKeyDictionary[State, dict[str, str]] = weakref.WeakKeyDictionary()


def read_os(name: str, release: dict[str, str]) -> OsInfo:
    """The host's OS, when ``SUPPORTED_OS`` has it."""
    os_id = release.get("ID", "")
    version = release.get("VERSION_ID", "")
    if (os_id, version) not in SUPPORTED_OS:
        raise PreflightError(f"{name}: os: {f'{os_id} {version}'.strip() or 'unknown'!r} is "
                             f"not supported; allowed: {OS_ALLOWED}")
    codename = release.get("VERSION_CODENAME") or SUPPORTED_OS[(os_id, version)]
    return OsInfo(os_id, version, codename, release.get("KERNEL_RELEASE", ""))


def read_secret(name: str, key: str, path: str, token: bool = True) -> Secret:
    """A secret from a control-side file: a token, or (not ``token``) a PEM key as it is."""
    try:
        value = secret_text(path, strip=token)
    except (OSError, UnicodeDecodeError) as e:
        raise PreflightError(f"{name}: {key}: {path!r} cannot be read "
                             f"({getattr(e, 'strerror', None) or e})") from None
    # The same rule as host data's check (rigfleet check): TOKEN_CHARS says why.
    if token and not TOKEN_CHARS.fullmatch(value):
        raise PreflightError(f"{name}: {key}: the secret in {path!r} (content not shown, "
                             f"{len(value)} chars) holds characters outside the allowed set; "
                             f"allowed: {TOKEN_ALLOWED}")
    return Secret(value)


@dataclass(frozen=True)
class FactChecks:
    """What the host's facts say: refusals, checks waiting for the driver, notes."""

    problems: list[str]
    waiting: list[str]
    adopt: bool = False
    notes: list[str] = field(default_factory=list)


def check_init(name: str, platform: PlatformState) -> list[str]:
    """systemd must be PID 1."""
    if platform.systemd and platform.pid1 in ("systemd", "init", ""):
        return []
    return [f"{name}: os: PID 1 is {platform.pid1 or 'unknown'!r} and /run/systemd/system is "
            f"{'there' if platform.systemd else 'missing'}: systemd does not run this host; "
            "allowed: a host booted with systemd as init (rigfleet manages systemd units: "
            "docker, nginx, nvidia-persistenced, its own)"]


def loaded_as_pinned(loaded: str | None, branch: str, version: str | None) -> bool:
    """Is ``loaded`` (``580.105.08``; None: none) on the pinned branch (and version)?"""
    return bool(loaded and loaded.startswith(f"{branch}.") and (not version or loaded == version))


def check_driver_origin(name: str, settings: HostSettings, branch: str, version: str | None,
                        platform: PlatformState, gpu: GpuState) -> tuple[list[str], bool]:
    """(problems, adopt) for a driver no package installed: refused, or kept when adopted and
    pinned."""
    if not platform.foreign_driver:
        return [], False
    run = platform.run_uninstaller  # else no package owns nvidia-smi: no telling what put it
    evidence = (f"{nvidia_commands.RUN_UNINSTALLER} exists" if run
                else f"no dpkg package owns {platform.smi}")
    remove = f"sudo {nvidia_commands.RUN_UNINSTALLER}" if run else "the way it was installed"
    loaded = gpu.driver_version if gpu.loaded else None
    if settings.adopt_foreign_driver and loaded_as_pinned(loaded, branch, version):
        return [], True
    what = f"driver {loaded}" if loaded else "a driver (not loaded now)"
    pinned = version or f"branch {branch}"
    if settings.adopt_foreign_driver:
        kind = ".run-installed" if run else "unpackaged"
        return [f"{name}: adopt_foreign_driver: True, but the {kind} {what} is not the pinned "
                f"{pinned}; allowed: adopt only a loaded driver on the pinned branch, or remove "
                f"it ({remove}), reboot, then deploy"], False
    origin = f"NVIDIA's .run installer put {what} on this host" if run else \
        f"{what} on this host came from no package"
    return [f"{name}: driver: {origin} ({evidence}); rigfleet installs the driver from packages "
            f"and would fight it. Allowed: remove it ({remove}, then reboot) and deploy again; "
            f"or, when it is loaded and on the pinned {pinned}, keep it: set "
            "adopt_foreign_driver: True in the host's data"], False


def secure_boot_watch(os: OsInfo, platform: PlatformState) -> bool:
    """Can Secure Boot refuse the module here? Debian's DKMS one (Ubuntu's are Canonical's)."""
    return os.id == "debian" and platform.secure_boot == "enabled"


def secure_boot_block(name: str, os: OsInfo, platform: PlatformState,
                      rejections: list[str]) -> str | None:
    """Why Secure Boot keeps a reboot from loading the DKMS module, with the steps; None: it may."""
    if not secure_boot_watch(os, platform):
        return None
    cert = platform.mok_cert or nvidia_commands.DKMS_MOK_CERT
    if platform.mok == "pending":
        return (f"{name}: driver: Secure Boot is on and the enrolment of {cert} (the key "
                "DKMS signs the NVIDIA module with) is requested but not confirmed yet, so "
                "the kernel refuses the module. Allowed: reboot the host with a screen and "
                "keyboard attached and confirm it in the blue MOK manager (Enroll MOK, "
                "Continue, Yes, the one-time password, Reboot), then deploy again; the "
                "deploy does not reboot for you: nobody would be at the console")
    steps = (f"rebooting again would not help. Allowed: enrol the key once, at the machine:"
             f"\n{nvidia_commands.mok_enrol_steps(cert)}")
    seen = f" (this boot's log: {rejections[0]})" if rejections else ""
    if platform.mok == "not-enrolled":
        return (f"{name}: driver: Secure Boot is on and {cert} (the key DKMS signs the NVIDIA "
                f"module with) is not enrolled, so the kernel refuses the module (\"Key was "
                f"rejected by service\"){seen}; {steps}")
    if rejections:
        return (f"{name}: driver: Secure Boot is on and the kernel refused a module this boot"
                f"{seen}: the key DKMS signs the NVIDIA module with ({cert}) is not enrolled; "
                f"{steps}")
    return None


def blocked_by_secure_boot(os: OsInfo) -> str | None:
    """``secure_boot_block`` from the host's facts now (after DKMS built the module)."""
    platform = read_fact(Platform)
    rejections = read_fact(ModuleRejections) if secure_boot_watch(os, platform) else []
    return secure_boot_block(host.name, os, platform, rejections)


def check_facts(name: str, settings: HostSettings, spec: StackSpec, os: OsInfo,
                branch: str, version: str | None, platform: PlatformState,
                gpu: GpuState, rejections: list[str]) -> FactChecks:
    """Every check that needs host facts (pure); the card checks wait for the driver."""
    origin, adopt = check_driver_origin(name, settings, branch, version, platform, gpu)
    problems = check_init(name, platform) + origin
    if gpu.loaded:  # an adopted driver is a loaded one
        try:
            check_caps_against_gpus(name, settings.power_caps_w, gpu.gpus)
        except HostDataError as e:
            problems += e.problems
        problems += check_gpus(name, settings.gpu_count, spec, gpu.gpus)
        notes = [f"{name}: keeping the .run-installed driver {gpu.driver_version} "
                 "(adopt_foreign_driver): no driver packages, no reboot for the driver"]
        return FactChecks(problems, [], adopt, notes if adopt else [])
    blocked = None if origin else secure_boot_block(name, os, platform, rejections)
    problems += [blocked] if blocked else []
    waiting = ["power caps against each card's range",
               f"the GPU count (gpu_count {settings.gpu_count})"]
    if spec.gpu_memory_mib:
        waiting.append(f"each card's memory (>= {spec.gpu_memory_mib} MiB for stack {spec.name})")
    notes = []
    if secure_boot_watch(os, platform) and platform.mok == "unknown":
        notes.append(f"{name}: Secure Boot is on: once DKMS has built the NVIDIA module, the "
                     "deploy checks that its signing key is enrolled before it reboots")
    return FactChecks(problems, waiting, adopt, notes)


def failing_command(message: str) -> FunctionCommand:
    """A command that fails this host with ``message`` (in red, no traceback)."""

    def _fail(state: Any, host: Any) -> bool:
        for line in message.splitlines():
            host.log_styled(line, fg="red", log_func=logger.error)
        return False

    _fail.__name__ = "rigfleet_refused"
    return FunctionCommand(_fail, (), {})


@operation(is_idempotent=False)
def refused(reason: str):
    """Fail this host with its preflight's ``reason`` (never a secret)."""
    yield failing_command(reason)


class _Summary(BaseStateCallback):
    """Logs the refused hosts after the last operation (or once only refused hosts are left)."""

    def __init__(self) -> None:
        self.last: str | None = None
        self.done = False
        self.failed: set[str] = set()

    def operation_host_error(self, state: State, host: Any, *_: Any) -> None:  # type: ignore[override]
        self.failed.add(host.name)
        active = {h.name for h in state.inventory.get_active_hosts()}
        if active <= set(_REFUSED.get(state) or {}) <= self.failed:
            self.log(state)

    def operation_end(self, state: State, op_hash: Any) -> None:  # type: ignore[override]
        if self.last is None:
            self.last = (state.get_op_order() or [""])[-1]
        if op_hash == self.last:
            self.log(state)

    def log(self, state: State) -> None:
        """``rigfleet: N host(s) failed preflight`` and each host's reason, once."""
        refusals = _REFUSED.get(state) or {}
        if self.done or not refusals:
            return
        self.done = True
        others = len(state.activated_hosts) > len(refusals)
        logger.error(f"--> rigfleet: {len(refusals)} host(s) failed preflight (nothing changed "
                     f"on them{'; the others went on' if others else ''}):")
        for _name, reason in sorted(refusals.items()):
            for i, line in enumerate(reason.splitlines()):
                logger.error(("    " if i == 0 else "      ") + line)


def refuse(reason: str) -> None:
    """Refuse the current host: one failing operation instead of the roles."""
    state = host.state
    if state not in _REFUSED:
        _REFUSED[state] = {}
        state.add_callback_handler(_Summary())
    _REFUSED[state][host.name] = reason
    for line in reason.splitlines():
        host.log_styled(line, fg="red", log_func=logger.error)
    refused(name="Refused (the reason is above; nothing runs on this host)", reason=reason)
    state.failed_hosts.add(host)


def run_deploy(converge: Callable[[], Any]) -> None:
    """``deploy.py``'s body: a refused host gets only its refusal; other problems stop the run."""
    read_host_once()
    fast_operation_order()
    try:
        converge()
    except HostRefused:
        return
    except RigfleetError as error:
        raise PyinfraError(f"rigfleet refused the run:\n{error}") from None


_T = TypeVar("_T")


def preflight_of(title: str, check: Callable[[str, bool], _T]) -> Callable[..., _T]:
    """``check(name, gpu_host)`` as a ``@deploy``; a ``RigfleetError`` refuses the host."""

    def run(gpu_host: bool = False) -> _T:
        try:
            return check(host.name, gpu_host)
        except RigfleetError as error:
            if stop_on_preflight(host.data):
                raise PreflightError(f"{error}\n(rigfleet_stop_on_preflight: the whole run "
                                     "stops; without it only this host would)") from None
            refuse(str(error))
            raise HostRefused(str(error)) from None

    return cast(Callable[..., _T], deploy(title)(run))  # @deploy returns what run returns


def _own_unit(holder: Any) -> dict[str, Any] | None:
    """``holder`` when it is one of the host's own units, alive (not a maintenance window)."""
    live = live_holder(holder)
    units = (STACK_UNIT, SUPERVISE_UNIT)
    return live if live and not live.get("window") and live.get("who") in units else None


def _check_lock(name: str) -> None:
    """Refuse a host whose lock is held; the host's own units (the stack unit's ``ensure`` just
    after a first converge, the supervisor) are waited for up to ``OWN_UNITS_WAIT_S`` first."""
    holder = read_fact(SwapProbe).get("lock")
    if (own := _own_unit(holder)) is not None:
        host.log(f"{name}: {describe(own)}; waiting for it (at most {OWN_UNITS_WAIT_S:g} s)")
    deadline = time.monotonic() + OWN_UNITS_WAIT_S
    while _own_unit(holder) and time.monotonic() < deadline:
        time.sleep(OWN_UNITS_WAIT_S / 30)
        holder = read_fact(SwapProbe, fresh=True).get("lock")
    if live := live_holder(holder):
        raise PreflightError(f"{name}: {describe(live)}. Another deploy (or the host's "
                             "boot-time recreation) is changing this host; wait for it to "
                             f"finish. Progress on the host: {hosttool.tool('status')}")
    if isinstance(holder, dict):
        host.log(f"{name}: stale host lock ({describe(holder)}; holder gone): it will be taken "
                 "over")


def _check_host(name: str) -> HostContext:
    want = load_desired(name, host.data)
    os_info = read_os(name, read_fact(OsRelease))
    _check_lock(name)
    # Refused together: the OS named, the pinned things' sources, every staged image's source.
    os_key = (os_info.id, os_info.version_id, os_info.codename)
    disagrees = os_disagrees(name, host.data.get("os"), os_key)
    refusals = [disagrees] if disagrees else []
    if not disagrees and SOURCES is not None:
        if host.state not in _ONLINE:  # once a run; a bad RIGFLEET_REACH is the run's, not a host's
            try:
                _ONLINE[host.state] = SOURCES()
            except ValueError as e:
                raise PyinfraError(f"rigfleet refused the run:\n{e}") from None
        refusals, warnings = deploy_verdict(want.settings, want.pins, os_key, _ONLINE[host.state])
        for line in warnings:
            host.log_styled(line, fg="yellow", log_func=logger.warning)
    try:
        preflight_images(want)
    except RigfleetError as e:
        refusals.append(str(e))
    if refusals:
        raise PreflightError("\n".join(refusals))
    settings, pins = want.settings, want.pins
    platform = read_fact(Platform)
    gpu = read_fact(GpuQuery)
    read_services(GPU_HOST_UNITS)
    rejections = (read_fact(ModuleRejections)
                  if not gpu.loaded and secure_boot_watch(os_info, platform) else [])
    facts = check_facts(name, settings, want.spec, os_info, pins.driver_branch,
                        pins.driver_version, platform, gpu, rejections)
    if facts.problems:
        raise PreflightError("\n".join(facts.problems))
    if facts.waiting:
        host.log(f"{name}: the NVIDIA driver is not loaded yet; checked once it is (after its "
                 f"install and reboot): {'; '.join(facts.waiting)}")
    for note in facts.notes:
        host.log(note)
    return HostContext(
        want=want, os=os_info, api_key=read_secret(name, "api_key_file", settings.api_key_file),
        hf_token=(read_secret(name, "hf_token_file", settings.hf_token_file)
                  if settings.hf_token_file else None),
        tls_key=(read_secret(name, "front_tls_key_file", settings.front_tls.key_file, token=False)
                 if settings.front_tls else None),
        by=deployed_by(), platform=platform, driver_adopted=facts.adopt)


def fleet_key(name: str, path: str, gpu: list[GpuHost]) -> Secret:
    """The host's ``api_key_file``: every front must take the key the balancer passes on."""
    key = read_secret(name, "api_key_file", path)
    if differ := [g.name for g in gpu
                  if read_secret(g.name, "api_key_file", g.settings.api_key_file) != key]:
        raise PreflightError(
            f"{name}: api_key_file: the key it holds (not shown) is not the key of "
            f"{', '.join(differ)}; allowed: the same key for the balancer and every GPU host "
            "(the balancer checks the client's key and passes it on to the front), e.g. one "
            "api_key_file in inventory/group_data/all.py")
    return key


def check_service_os(name: str) -> None:
    """A service host's OS: supported, and booted with systemd."""
    read_os(name, read_fact(OsRelease))
    if problems := check_init(name, read_fact(Platform)):
        raise PreflightError("\n".join(problems))


def _check_balancer(name: str, gpu_host: bool) -> BalancerContext:
    """A balancer host: its data, every GPU host's, the key, the OS, systemd."""
    plan = fleet_plan(host, host.inventory)
    settings = plan.settings
    check_service_os(name)
    read_services(("chrony.service", "haproxy.service"))
    api_key = fleet_key(name, settings.api_key_file, list(plan.hosts))
    tls_key = (read_secret(name, "balancer_tls_key_file", settings.tls.key_file, token=False)
               if settings.tls else None)
    if gpu_host:
        host.log(f"{name}: this host is a GPU host and the fleet's balancer: while it is in "
                 "maintenance (a reboot, a driver or Docker change) the fleet endpoint is down "
                 "with it; a balancer on a small host of its own avoids that")
    return BalancerContext(plan=plan, api_key=api_key, tls_key=tls_key)


preflight = preflight_of("Preflight", lambda name, _: _check_host(name))
preflight_balancer = preflight_of("Preflight (balancer)", _check_balancer)
