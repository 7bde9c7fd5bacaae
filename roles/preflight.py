"""Preflight: validate this host's data and the pins before any host changes.

Runs on the control side during pyinfra's prepare phase. Every problem raises
``PreflightError`` (or the data layer's ``HostDataError`` / ``PinsError``), naming the host,
the key, the value and what is allowed; pyinfra then stops before executing anything on any
host. The result, ``HostContext``, is what every other role takes.

Example::

    ctx = preflight()
    ctx.os.family          # "debian" or "ubuntu"
    ctx.desired.image_ref  # "vllm/vllm-openai:nightly-...@sha256:..."

A host whose lock (``/var/lib/rigfleet/lock``) is held by a live transaction (a swap another
deploy started, a boot-time recreation) is refused here, naming who holds it, since when and
why; a stale lock (its process gone) is reported and taken over by the next transaction.
"""

from __future__ import annotations

import getpass
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyinfra import host
from pyinfra.api import deploy

from rigfleet.catalog import STACKS, StackSpec, get_stack
from rigfleet.errors import RigfleetError
from rigfleet.facts import OsRelease
from rigfleet.hostdata import AptRepo, HostSettings, validate_host
from rigfleet.hostside.lock import describe
from rigfleet.hostside.verify.profiles import PROFILES, ProfileError, resolve
from rigfleet.pins import GenesisPin, Pins, PinsError, StackPins, load_pins
from rigfleet.swapfacts import HostLockHolder
from rigfleet.swapplan import SwapSettings
from roles.ops import Secret

# (ID, VERSION_ID) pairs the roles know how to provision.
SUPPORTED_OS = {
    ("debian", "12"): "bookworm",
    ("debian", "13"): "trixie",
    ("ubuntu", "22.04"): "jammy",
    ("ubuntu", "24.04"): "noble",
}


class PreflightError(RigfleetError, ValueError):
    """This host cannot be provisioned as its data says; the message says why."""


@dataclass(frozen=True)
class OsInfo:
    """The host's OS as the roles need it."""

    id: str  # "debian" | "ubuntu"
    version_id: str  # "12", "13", "22.04", "24.04"
    codename: str
    kernel: str  # uname -r

    @property
    def family(self) -> str:
        return self.id

    @property
    def label(self) -> str:
        return f"{self.id} {self.version_id}"


@dataclass(frozen=True)
class HostContext:
    """Everything the roles need for one host, validated.

    + settings: ``rigfleet.hostdata.HostSettings``
    + pins: ``rigfleet.pins.Pins``
    + os: the host's OS
    + specs: catalog entries of every stack that is pinned (both compose files are rendered)
    + api_key, hf_token: secrets read from the control-side files (masked in any output)
    + site_ca_files: control-side PEM files the host should trust (host data
      ``site_ca_files``, optional)
    + by: who runs the deploy (``RIGFLEET_BY`` or ``user@control-host``), for the ledger
    + swap: the gate profile and time limits of this host's swap transactions
    """

    name: str
    settings: HostSettings
    pins: Pins
    os: OsInfo
    specs: dict[str, StackSpec]
    api_key: Secret
    hf_token: Secret | None
    site_ca_files: tuple[str, ...]
    by: str
    swap: SwapSettings = SwapSettings()

    @property
    def stack(self) -> str:
        return self.settings.stack

    @property
    def spec(self) -> StackSpec:
        """The desired stack's catalog entry."""
        return self.specs[self.settings.stack]

    @property
    def desired(self) -> StackPins:
        """The desired stack's pins."""
        return self.pins.stacks[self.settings.stack]

    @property
    def genesis(self) -> GenesisPin | None:
        """The Genesis pin to check out: the desired stack's, else any pinned stack's (so a
        later switch to a Genesis stack finds the tree ready)."""
        if self.desired.genesis is not None:
            return self.desired.genesis
        for name in self.specs:
            if self.pins.stacks[name].genesis is not None:
                return self.pins.stacks[name].genesis
        return None

    def apt_repo(self, name: str) -> AptRepo:
        """An apt repository from host data, placeholders filled for this host's OS."""
        return self.settings.apt_repos[name].expand(
            os_id=self.os.id, version_id=self.os.version_id, codename=self.os.codename
        )


_PINS_CACHE: dict[str, Pins] = {}
_TOKEN_CHARS = re.compile(r"[A-Za-z0-9._~+/=-]+")


def _load_pins_once(path: str) -> Pins:
    # Every host reads the same file; parse it once per run (it does not change mid-run).
    key = str(Path(path).absolute())
    if key not in _PINS_CACHE:
        _PINS_CACHE[key] = load_pins(path)
    return _PINS_CACHE[key]


def read_os(name: str, release: dict[str, str]) -> OsInfo:
    """Check the host's os-release against ``SUPPORTED_OS``; raises ``PreflightError``."""
    os_id = release.get("ID", "")
    version = release.get("VERSION_ID", "")
    if (os_id, version) not in SUPPORTED_OS:
        allowed = ", ".join(f"{i} {v}" for i, v in SUPPORTED_OS)
        raise PreflightError(
            f"{name}: os: {f'{os_id} {version}'.strip() or 'unknown'!r} is not supported; "
            f"allowed: {allowed}"
        )
    codename = release.get("VERSION_CODENAME") or SUPPORTED_OS[(os_id, version)]
    return OsInfo(os_id, version, codename, release.get("KERNEL_RELEASE", ""))


def check_pins(name: str, settings: HostSettings, pins: Pins) -> dict[str, StackSpec]:
    """The pinned stacks' specs; the desired stack must be pinned (and Genesis-pinned when it
    needs Genesis)."""
    problems: list[str] = []
    if settings.stack not in pins.stacks:
        problems.append(
            f"{name}: stack: {settings.stack!r} is not pinned in {pins.path}; "
            f"allowed: {', '.join(pins.stacks) or '(no stacks pinned)'}"
        )
    specs = {s: get_stack(s) for s in pins.stacks if s in STACKS}
    for stack, spec in specs.items():
        if spec.needs_genesis and pins.stacks[stack].genesis is None:
            problems.append(
                f"{name}: {pins.path}: stacks.{stack}.genesis: missing; allowed: "
                "{repo: <git url>, commit: <40-hex>} (the stack needs Genesis)"
            )
    unresolved = pins.unresolved()
    if unresolved:
        problems.append(
            f"{name}: {pins.path}: {', '.join(unresolved)}: 'unresolved'; allowed: a resolved "
            "value (run `rigfleet pins lock`)"
        )
    if problems:
        raise PreflightError("\n".join(problems))
    return specs


def read_secret(name: str, key: str, path: str) -> Secret:
    """A secret from a control-side file (validated by hostdata), never shown."""
    try:
        value = Path(path).read_text(encoding="utf-8").strip()
    except OSError as e:
        raise PreflightError(f"{name}: {key}: {path!r} cannot be read ({e.strerror})") from None
    # The key ends up in an env file, an HTTP header file and an nginx regex: only token
    # characters (RFC 6750 b64token) keep all three simple and safe.
    if not _TOKEN_CHARS.fullmatch(value):
        raise PreflightError(
            f"{name}: {key}: the secret in {path!r} (content not shown, {len(value)} chars) "
            "holds characters outside the allowed set; allowed: letters, digits and -._~+/="
        )
    return Secret(value)


def site_ca_files(name: str, value: object) -> tuple[str, ...]:
    """Host data ``site_ca_files``: control-side PEM certificate files to trust on the host."""
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple):
        raise PreflightError(
            f"{name}: site_ca_files: {value!r} is not valid; allowed: a list of PEM file paths"
        )
    out = []
    for i, path in enumerate(value):
        p = Path(os.path.expanduser(str(path)))
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            text = ""
        if "-----BEGIN CERTIFICATE-----" not in text:
            raise PreflightError(
                f"{name}: site_ca_files[{i}]: {str(path)!r} is not a readable PEM certificate; "
                "allowed: a file holding '-----BEGIN CERTIFICATE-----'"
            )
        out.append(str(p.absolute()))
    return tuple(out)


def deployed_by() -> str:
    """Who runs this deploy, for the ledger: ``RIGFLEET_BY`` or ``user@control-host``."""
    explicit = os.environ.get("RIGFLEET_BY")
    if explicit:
        return explicit
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry (containers)
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


def swap_settings(name: str, data: Any) -> SwapSettings:
    """Host data ``gate_profile`` (``full``: real rigs, default; ``fast``: the testbed),
    ``gate_set`` (``key=value`` overrides of the profile), ``ready_timeout_s``,
    ``gate_timeout_s``; checked here so a typo stops the run before any host changes."""
    get = data.get
    profile = get("gate_profile") or "full"
    if profile not in PROFILES:
        raise PreflightError(
            f"{name}: gate_profile: {profile!r} is not a gate profile; allowed: "
            + ", ".join(sorted(PROFILES))
        )
    sets = get("gate_set") or ()
    if isinstance(sets, str):
        sets = [sets]
    if not isinstance(sets, list | tuple) or not all(isinstance(x, str) for x in sets):
        raise PreflightError(
            f"{name}: gate_set: {sets!r} is not valid; allowed: a list of 'key=value' "
            "overrides of the gate profile, e.g. ['soak_sessions=4']"
        )
    try:
        resolve(profile, list(sets))
    except ProfileError as e:
        raise PreflightError(f"{name}: gate_set: {e}") from None
    timeouts = {}
    for key in ("ready_timeout_s", "gate_timeout_s"):
        value = get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise PreflightError(f"{name}: {key}: {value!r} is not valid; allowed: seconds > 0")
        timeouts[key] = float(value)
    return SwapSettings(gate_profile=profile, gate_set=tuple(sets), **timeouts)


def check_lock(name: str, holder: dict | None) -> str | None:
    """Refuse a host whose lock a live process holds; a note when a stale lock is there."""
    if holder is None:
        return None
    if holder.get("alive"):
        raise PreflightError(
            f"{name}: {describe(holder)}. Another deploy (or the host's boot-time recreation) "
            "is changing this host; wait for it to finish. Progress on the host: "
            "python3 /usr/local/lib/rigfleet/rigfleet-host.pyz status"
        )
    return f"{name}: stale host lock ({describe(holder)}; holder gone): it will be taken over"


@deploy("Preflight")
def preflight() -> HostContext:
    """Validate host data, pins and OS; return the ``HostContext`` the roles take.

    Nothing on the host changes here; the remote commands read ``/etc/os-release`` and the
    host lock.
    """
    name = host.name
    settings = validate_host(name, host.data)
    try:
        # The host's own pins: a rollout that left this host on other pins (the pins file's
        # ``hosts`` section) must not be undone by the next converge.
        pins = _load_pins_once(settings.pins_file).for_host(name)
    except PinsError as e:
        raise PreflightError(f"{name}: pins_file: {e}") from None
    specs = check_pins(name, settings, pins)
    os_info = read_os(name, host.get_fact(OsRelease))
    swap = swap_settings(name, host.data)
    stale = check_lock(name, host.get_fact(HostLockHolder))
    if stale:
        host.log(stale)
    api_key = read_secret(name, "api_key_file", settings.api_key_file)
    hf_token = (
        read_secret(name, "hf_token_file", settings.hf_token_file)
        if settings.hf_token_file
        else None
    )
    return HostContext(
        name=name,
        settings=settings,
        pins=pins,
        os=os_info,
        specs=specs,
        api_key=api_key,
        hf_token=hf_token,
        site_ca_files=site_ca_files(name, host.data.get("site_ca_files")),
        by=deployed_by(),
        swap=swap,
    )
