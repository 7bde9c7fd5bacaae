"""Preflight: validate this host's data and the pins before any host changes.

Runs on the control side during pyinfra's prepare phase. Every problem raises
``PreflightError`` (or the data layer's ``HostDataError`` / ``PinsError`` /
``CatalogError``), naming the host, the key, the value and what is allowed; pyinfra then stops
before executing anything on any host. The result, ``HostContext``, is what every other role
takes: the host's ``DesiredHost`` (``rigfleet.desired``, the one model of what the deploy
makes of a host) plus what only the run knows (the OS it found, the secrets, who runs it).

Example::

    ctx = preflight()
    ctx.os.family                   # "debian" or "ubuntu"
    ctx.want.current.pins.image_ref # "vllm/vllm-openai:nightly-...@sha256:..."

A host whose lock (``Layout.lock_dir``) is held by a live transaction (a swap another deploy
started, a boot-time recreation) is refused here, naming who holds it, since when and why; a
stale lock (its process gone) is reported and taken over by the next transaction.
"""

from __future__ import annotations

import getpass
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path

from pyinfra import host
from pyinfra.api import deploy

from rigfleet.catalog import StackSpec
from rigfleet.commands import hosttool
from rigfleet.desired import DesiredHost, load_desired
from rigfleet.errors import RigfleetError
from rigfleet.facts import OsRelease, read_fact
from rigfleet.hostdata import AptRepo, HostSettings, SwapSettings
from rigfleet.hostside.records import describe
from rigfleet.images.deploy import preflight_images
from rigfleet.pins import GenesisPin, Pins
from rigfleet.swapfacts import SwapProbe
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

    + want: the host's ``DesiredHost`` (settings, pins, the staged stacks as rendered)
    + os: the host's OS
    + api_key, hf_token: secrets read from the control-side files (masked in any output)
    + by: who runs the deploy (``RIGFLEET_BY`` or ``user@control-host``), for the ledger
    """

    want: DesiredHost
    os: OsInfo
    api_key: Secret
    hf_token: Secret | None
    by: str

    @property
    def name(self) -> str:
        return self.want.name

    @property
    def settings(self) -> HostSettings:
        return self.want.settings

    @property
    def pins(self) -> Pins:
        return self.want.pins

    @property
    def stack(self) -> str:
        return self.want.stack

    @property
    def spec(self) -> StackSpec:
        """The desired stack's stack file."""
        return self.want.spec

    @property
    def specs(self) -> dict[str, StackSpec]:
        """The stack files of every staged stack."""
        return {name: s.spec for name, s in self.want.stacks.items()}

    @property
    def genesis(self) -> GenesisPin | None:
        """The Genesis pin to check out (``DesiredHost.genesis``)."""
        return self.want.genesis

    @property
    def swap(self) -> SwapSettings:
        return self.want.settings.swap

    @property
    def site_ca_files(self) -> tuple[str, ...]:
        return self.want.settings.site_ca_files

    def apt_repo(self, name: str) -> AptRepo:
        """An apt repository from host data, placeholders filled for this host's OS."""
        return self.settings.apt_repos[name].expand(
            os_id=self.os.id, version_id=self.os.version_id, codename=self.os.codename
        )


_TOKEN_CHARS = re.compile(r"[A-Za-z0-9._~+/=-]+")


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


def check_lock(name: str, holder: dict | None) -> str | None:
    """Refuse a host whose lock a live process holds; a note when a stale lock is there."""
    if holder is None:
        return None
    if holder.get("alive"):
        raise PreflightError(
            f"{name}: {describe(holder)}. Another deploy (or the host's boot-time recreation) "
            "is changing this host; wait for it to finish. Progress on the host: "
            f"{hosttool.tool('status')}"
        )
    return f"{name}: stale host lock ({describe(holder)}; holder gone): it will be taken over"


@deploy("Preflight")
def preflight() -> HostContext:
    """Validate host data, pins, stack files and OS; return the ``HostContext`` the roles take.

    Nothing on the host changes here; the remote commands read ``/etc/os-release`` and the
    host probe (the lock).
    """
    name = host.name
    want = load_desired(name, host.data)
    os_info = read_os(name, read_fact(OsRelease))
    lock = read_fact(SwapProbe).get("lock")
    stale = check_lock(name, lock if isinstance(lock, dict) else None)
    if stale:
        host.log(stale)
    preflight_images(want)  # every staged image has a source, and the disk has room for it
    settings = want.settings
    api_key = read_secret(name, "api_key_file", settings.api_key_file)
    hf_token = (
        read_secret(name, "hf_token_file", settings.hf_token_file)
        if settings.hf_token_file
        else None
    )
    return HostContext(want=want, os=os_info, api_key=api_key, hf_token=hf_token,
                       by=deployed_by())
