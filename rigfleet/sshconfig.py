"""Where rigfleet's own SSH connects: the inventory's data over an ssh_config file, as pyinfra's
converge does (docs/operations.md says which keywords, and which data keys win)::

    t = resolve("rig1", {"ssh_config_file": "~/.ssh/fleet.conf"})
    t.hostname, t.port, t.user, t.key_files, t.jumps     # ("10.0.0.5", 2222, "ops", ...)
"""

from __future__ import annotations

import glob
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko

DEFAULT_CONFIG = "~/.ssh/config"
DEFAULT_USER = "root"  # rigfleet's default login when neither the data nor the file says
_KEYWORD = re.compile(r"\s*(\w+)(?:\s*=\s*|\s+)(.*)")


class SshConfigError(ValueError):
    """The ssh_config file named by the data is missing or cannot be read."""


@dataclass(frozen=True)
class SshTarget:
    """One hop: where to connect, as whom, with which keys; ``jumps`` go first, in order."""

    hostname: str
    port: int
    user: str
    key_files: tuple[str, ...] = ()  # empty: the agent and ~/.ssh/id_* (look_for_keys)
    known_hosts: tuple[str, ...] = ()  # empty: ~/.ssh/known_hosts
    jumps: tuple[SshTarget, ...] = ()
    proxy_command: str | None = None
    connect_timeout: float | None = None

    def where(self) -> str:
        via = "".join(f" via {j.user}@{j.hostname}:{j.port}" for j in self.jumps)
        return f"{self.user}@{self.hostname}:{self.port}{via}"


def _lines(path: Path, seen: tuple[Path, ...] = ()) -> list[str]:
    """The file's lines with ``Include`` expanded (relative, globs; a loop refused)."""
    if path in seen:
        raise SshConfigError(f"{seen[-1]}: Include: {path}: includes itself (a loop)")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SshConfigError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") \
            from None
    out: list[str] = []
    for line in text.splitlines():
        m = _KEYWORD.match(line)
        if not m or m.group(1).lower() != "include":
            out.append(line)
            continue
        for pattern in m.group(2).split():
            full = path.parent / Path(pattern.strip('"')).expanduser()  # relative: to the file's
            for name in sorted(glob.glob(str(full))):
                if Path(name).is_file():
                    out.extend(_lines(Path(name), (*seen, path)))
    return out


def load_config(data: dict[str, Any], host: str) -> paramiko.SSHConfig | None:
    """The ssh_config the data names, else ``~/.ssh/config``; None when there is none."""
    named = data.get("ssh_config_file")
    path = Path(str(named or DEFAULT_CONFIG)).expanduser()
    if not path.is_file():
        if named:
            raise SshConfigError(f"{host}: ssh_config_file: {named}: no such file; allowed: "
                                 "an ssh_config file (or leave the key out for ~/.ssh/config)")
        return None
    try:
        return paramiko.SSHConfig.from_text("\n".join(_lines(path)))
    except SshConfigError as e:
        raise SshConfigError(f"{host}: ssh_config_file: {e}") from None
    except Exception as e:  # paramiko's parser: a bad line
        raise SshConfigError(f"{host}: ssh_config_file: {path}: {e}") from None


def _hop(config: paramiko.SSHConfig | None, spec: str, known: tuple[str, ...]) -> SshTarget:
    """A ``ProxyJump`` entry (``[user@]host[:port]``, IPv6 in brackets), looked up in the same
    file."""
    user, _, hostport = spec.strip().rpartition("@")
    if hostport.startswith("["):
        host, _, port = hostport[1:].partition("]")
        port = port.removeprefix(":")
    else:
        host, _, port = hostport.partition(":") if hostport.count(":") == 1 else (hostport, "", "")
    return _target(config.lookup(host) if config is not None else {}, host, port, user, known)


def _paths(paths: Iterable[str]) -> tuple[str, ...]:
    return tuple(str(Path(p).expanduser()) for p in paths)


def _known(found: dict[str, Any]) -> tuple[str, ...]:
    return _paths(str(found.get("userknownhostsfile", "")).split())


def _target(found: dict[str, Any], alias: str, port: Any, user: Any, known: tuple[str, ...],
            key: Any = None, **more: Any) -> SshTarget:
    """The hop ``alias`` from its ssh_config entry ``found``; the arguments given win."""
    return SshTarget(
        hostname=str(found.get("hostname") or alias),
        port=int(port or found.get("port") or 22),
        user=str(user or found.get("user") or DEFAULT_USER),
        key_files=_paths([str(key)] if key else found.get("identityfile", [])),
        known_hosts=known or _known(found),
        connect_timeout=float(found["connecttimeout"]) if "connecttimeout" in found else None,
        **more,
    )


def resolve(name: str, data: dict[str, Any]) -> SshTarget:
    """Where host ``name`` with host ``data`` is reached; raises ``SshConfigError``."""
    alias = str(data.get("ssh_hostname") or name)
    config = load_config(data, name)
    found: dict[str, Any] = dict(config.lookup(alias)) if config is not None else {}
    named = data.get("ssh_known_hosts_file")
    known = _paths([str(named)]) if named else _known(found)
    jumps: tuple[SshTarget, ...] = ()
    proxy = found.get("proxycommand")
    if proxy and str(proxy).lower() == "none":
        proxy = None
    if not proxy and found.get("proxyjump") and str(found["proxyjump"]).lower() != "none":
        jumps = tuple(_hop(config, spec, known) for spec in str(found["proxyjump"]).split(","))
    return _target(found, alias, data.get("ssh_port"), data.get("ssh_user"), known,
                   data.get("ssh_key"), jumps=jumps, proxy_command=str(proxy) if proxy else None)
