"""Host-data checks and ``Key``, a row of ``hostdata.KEYS``. A check returns the value, or
records the problem and returns None; keys go in table order, so a check may read earlier ones::

    c = HostChecker("rig-a")
    values = c.check_keys(host.data, "gpu", KEYS)   # {"stack": "int8", ...}
    c.raise_if_any(HostDataError)
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import posixpath
import re
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from rigfleet.catalog import CatalogError, builtin_catalog, load_catalog
from rigfleet.hostside.layout import CACHE_ROOT, ETC_ROOT, LIB_ROOT, OPT_ROOT, STATE_ROOT
from rigfleet.hostside.supervise import parse_backoff
from rigfleet.hostside.verify.profiles import PROFILES, ProfileError, resolve
from rigfleet.tlsfiles import cert_file, local_text
from rigfleet.validate import (
    SYSTEM_DIRS,
    TOKEN_ALLOWED,
    TOKEN_CHARS,
    Problems,
    env_vars,
    escapes,
    finite,
    is_int,
    is_system_dir,
)

# Any GPU's sane power cap; the card's own min..max is checked at deploy time.
POWER_CAP_RANGE_W = (50, 600)
MIN_API_KEY_CHARS = 16
_ADDRESS = re.compile(r"(?:[A-Za-z0-9][A-Za-z0-9.-]{0,252}|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?")
_HOST_NAME = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,252})")
# model_dir is root's and pruned: never a home, nor inside the system's or rigfleet's trees.
_RIGFLEET_TREES = (ETC_ROOT, STATE_ROOT, OPT_ROOT, CACHE_ROOT, LIB_ROOT)
_NOT_INSIDE = _RIGFLEET_TREES + (
    "/proc", "/sys", "/dev", "/run", "/var/run", "/tmp", "/var/tmp", "/boot", "/etc", "/bin",
    "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/usr/bin", "/usr/sbin", "/usr/lib",
    "/usr/libexec", "/usr/include", "/usr/share", "/usr/src", "/var/log", "/var/cache",
    "/var/spool", "/var/lib/apt", "/var/lib/dpkg", "/var/lib/systemd", "/var/lib/docker",
    "/var/lib/containerd",
)  # fmt: skip
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")

REQUIRED: Any = object()  # a key's default when it has none: the host's data must set it
Check = Callable[["HostChecker", "Key", Any], Any]


@dataclass(frozen=True)
class Key:
    """A row of ``hostdata.KEYS`` (``on``: the host kinds, joined by ``,``, or ``any``)."""

    name: str
    check: Check
    default: Any
    allowed: str
    doc: str
    on: str = "gpu"
    group: str = "Serving"
    shown_default: str | None = None


class HostChecker(Problems):
    """One host's checks; ``values`` holds each key checked so far."""

    unset = "set it in inventory/group_data/all.py (fleet default) or in the host's data"

    def __init__(self, host: str) -> None:
        super().__init__(host)
        self.catalog = builtin_catalog()
        self.values: dict[str, Any] = {}

    def check_keys(self, data: Mapping[str, Any] | Any, on: str,
                   keys: Mapping[str, Key]) -> dict[str, Any]:
        """Check every key of ``keys`` for hosts ``on`` (``gpu``, ``balancer``...) in order."""
        self.typos(data, keys)
        for key in keys.values():
            if key.on != "any" and on not in key.on.split(","):
                continue
            value = data.get(key.name, None)
            if value is None and key.default is REQUIRED:
                self.missing(key.name)
            elif value is not None and self.control_chars(key.name, value):
                value = None  # named; the key's own check sees it unset (no second message)
            if value is None:
                value = None if key.default is REQUIRED else key.default
            self.values[key.name] = key.check(self, key, value)
        return self.values

    def typos(self, data: Any, keys: Mapping[str, Key]) -> None:
        """Unknown keys are fine (pyinfra's, other roles'); one *almost* ours is a typo."""
        for key in data if isinstance(data, Mapping) else data.dict():  # or pyinfra's host data
            if key in keys or not isinstance(key, str) or key.startswith("ssh_"):
                continue
            if close := difflib.get_close_matches(key, list(keys), n=1, cutoff=0.85):
                self.bad(key, key, f"{close[0]!r}",
                         f"is not a rigfleet key (did you mean {close[0]!r}?)")

    def stacks_dir(self, key: Key, value: Any) -> str | None:
        """Also loads the catalog the later keys are checked against (else the built-in one)."""
        if (checked := self.string(key.name, value, None, key.allowed, required=False)) is None:
            return None
        path = Path(os.path.expanduser(checked))
        try:
            is_dir = path.is_dir()
        except OSError as e:  # not ENOENT: a name too long, a parent it may not search
            self.bad(key.name, value, key.allowed, f"cannot be read ({e.strerror or e})")
            return None
        if not is_dir:
            self.bad(key.name, value, key.allowed, "is not a directory")
        elif is_system_dir(str(path.resolve())):
            self.bad(key.name, value, key.allowed + " (a directory of its own)",
                     "is a system directory")
        elif escaping := [e for e in sorted(path.glob("*.yaml")) if escapes(e, path)]:
            for entry in escaping:
                self.bad(f"stacks_dir: {entry.name}", str(entry),
                         f"stack files inside {str(path.absolute())!r}",
                         f"leads outside the directory (to {os.path.realpath(entry)!r})")
        else:
            try:
                self.catalog = load_catalog([path.absolute()])
            except CatalogError as e:
                self.lines += [f"{self.where}: stacks_dir: {line}" for line in e.problems]
            return str(path.absolute())
        return None

    def stack(self, key: Key, value: Any) -> str | None:
        """A stack of the catalog (``stack``, ``balancer_default_stack``)."""
        if value is not None and (not isinstance(value, str) or value not in self.catalog):
            self.bad(key.name, value, ", ".join(self.catalog.names),
                     "is not a stack in the catalog")
            return None
        return value

    def gpu_count(self, key: Key, value: Any) -> int | None:
        """At least the stack's ``gpus.count`` (the catalog keeps tensor-parallel-size within);
        None when not valid (the keys after it then check nothing against a count)."""
        if self.integer(key.name, value, 1, 16, key.allowed) is None:
            return None
        stack = self.values.get("stack")
        if stack is not None and value < (spec := self.catalog.get(stack)).gpu_count:
            self.bad(key.name, value, f"at least {spec.gpu_count}",
                     f"is too few for stack {stack} (tensor-parallel-size "
                     f"{spec.tensor_parallel_size}, {spec.gpu_count} GPU(s))")
        return int(value)

    def power_caps(self, key: Key, value: Any) -> tuple[int, ...]:
        low, high = POWER_CAP_RANGE_W
        count = self.values["gpu_count"]
        allowed = (f"an integer number of watts ({low}..{high}; the card's own range is "
                   f"checked at deploy time) or a list{f' of {count}' if count else ''}, one "
                   "per card, e.g. [290, 290]")
        if value is None:
            return ()
        if is_int(value):
            caps = [value] * (count or 1)
        elif isinstance(value, list | tuple) and count in (None, len(value)):
            caps = list(value)
        else:
            what = (f"has {len(value)} cap(s) but gpu_count is {count}"
                    if isinstance(value, list | tuple) else "is not valid")
            self.bad(key.name, value, allowed, what)
            return ()
        before = len(self.lines)
        for i, cap in enumerate(caps):
            name = key.name if is_int(value) else f"{key.name}[{i}]"
            if not is_int(cap):
                self.bad(name, cap, allowed, "is not a whole number of watts")
            elif not low <= cap <= high:
                self.bad(name, cap, allowed, "W is outside any GPU's sane range")
        return tuple(caps) if len(self.lines) == before else ()

    def model_dir(self, key: Key, value: Any) -> str | None:
        own = " (a directory of its own: not a home, not inside a system or rigfleet directory)"
        if value is None:
            return None
        if (not isinstance(value, str) or not value.startswith("/") or value == "/"
                or posixpath.normpath(value) != value):
            self.bad(key.name, value, key.allowed)
        elif ":" in value or "," in value:
            # Compose's short volume syntax splits on ':'.
            self.bad(key.name, value, key.allowed + " without ':' or ','")
        elif value in SYSTEM_DIRS or value in _NOT_INSIDE:
            # The deploy creates the directory and sets its owner and mode.
            self.bad(key.name, value, key.allowed + " (a directory of its own, not a system "
                     "directory)", "is a system directory")
        elif posixpath.dirname(value) in ("/home", "/var/home"):
            self.bad(key.name, value, key.allowed + own, "is a home directory (the deploy "
                     "would make it root's, mode 0755)")
        elif tree := next((t for t in _NOT_INSIDE if value.startswith(t + "/")), None):
            whose = "rigfleet's own" if tree in _RIGFLEET_TREES else "system directory"
            self.bad(key.name, value, key.allowed + own, f"is inside {whose} {tree}")
        elif held := next((d for d in sorted(SYSTEM_DIRS) + list(_NOT_INSIDE)
                           if d.startswith(value + "/")), None):
            self.bad(key.name, value, key.allowed + own, f"holds system directory {held}")
        else:
            return value
        return None

    def front_port(self, key: Key, value: Any) -> int | None:
        """A port of the host's own (``front_port``, ``peer_port``): no stack's loopback port."""
        taken = self.catalog.ports()
        allowed = f"{key.allowed} " + ", ".join(f"{p} ({n})" for p, n in taken.items())
        port = self.integer(key.name, value, 1, 65535, allowed, required=False)
        if port in taken:
            self.bad(key.name, value, allowed, f"is stack {taken[port]}'s loopback port")
            return None
        return port

    def secret_file(self, key: Key, value: Any) -> str | None:
        name = key.name
        if self.string(name, value, None, "a path on this (control) machine",
                       required=False) is None:
            return None
        path = Path(os.path.expanduser(value)).absolute()
        make = (f"umask 077; mkdir -p {path.parent}; "
                + ("openssl rand -hex 32" if name == "api_key_file" else 'printf %s "$TOKEN"')
                + f" > {path}")
        # The content is a secret: describe it, never show it.
        allowed = f"a file holding the secret, mode 0600; create it: {make}"
        if (found := local_text(self, name, value, allowed, "")) is None:
            return None
        secret = found[1].strip()
        least = MIN_API_KEY_CHARS if name == "api_key_file" else 1
        if not secret:
            self.bad(name, value, allowed, "is empty")
        elif not TOKEN_CHARS.fullmatch(secret):
            odd = any(ch.isspace() for ch in secret) or not secret.isprintable()
            self.bad(name, value, f"one line of {TOKEN_ALLOWED} (it becomes NAME=value in "
                     "an env file and an HTTP header)",
                     "holds whitespace or control characters" if odd
                     else "holds characters outside the allowed set")
        elif len(secret) < least:
            self.bad(name, value, f"at least {least} characters: {make}",
                     f"holds only {len(secret)} characters")
        else:
            return str(path)
        return None

    def alertmanager_file(self, key: Key, value: Any) -> str | None:
        """Alertmanager's config on this machine: private (it may hold credentials), YAML with
        ``route`` and ``receivers``; amtool checks the rest on the monitor."""
        if value is None or (found := local_text(self, key.name, value, key.allowed,
                                                 " (it may hold credentials)")) is None:
            return None
        path, text = found
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as e:
            self.bad(key.name, value, key.allowed, f"is not YAML ({type(e).__name__})")
            return None
        if not isinstance(doc, dict) or not {"route", "receivers"} <= doc.keys():
            self.bad(key.name, value, "Alertmanager's configuration: a YAML mapping with "
                     "'route' and 'receivers'", "is not one")
            return None
        return str(path)

    def extra_env(self, key: Key, value: Any) -> dict[str, dict[str, str]]:
        if not isinstance(value, Mapping):
            self.bad(key.name, value, key.allowed)
            return {}
        out: dict[str, dict[str, str]] = {}
        for stack, env in value.items():
            base = f"{key.name}.{stack}"
            if stack not in self.catalog:
                self.bad(base, stack, ", ".join(self.catalog.names),
                         "is not a stack in the catalog")
                continue
            if not isinstance(env, Mapping):
                self.bad(base, env, key.allowed)
                continue
            out[stack] = env_vars(self, base, env, key.allowed, " (extra_env is written to the "
                                  "stack's compose file, which every user of the host can read)")
        return out

    def gate_profile(self, key: Key, value: Any) -> str | None:
        return self.choice(key.name, value, sorted(PROFILES))

    def gate_set(self, key: Key, value: Any) -> tuple[str, ...]:
        sets = [value] if isinstance(value, str) else value
        if not isinstance(sets, list | tuple) or not all(isinstance(x, str) for x in sets):
            self.bad(key.name, sets, key.allowed)
            return ()
        profile = self.values.get("gate_profile")
        if profile is not None:
            try:
                resolve(profile, list(sets))
            except ProfileError as e:
                self.add(f"{key.name}: {e}")
        return tuple(sets)

    def backoff(self, key: Key, value: Any) -> tuple[float, ...] | None:
        """A list of seconds >= 0 (``--data`` may give ``10,30,90``)."""
        if isinstance(value, str):
            with suppress(ValueError):
                return parse_backoff(value)
        elif isinstance(value, list | tuple) and value and all(
                isinstance(v, int | float) and not isinstance(v, bool) and finite(v)
                and v >= 0 for v in value):
            return tuple(float(v) for v in value)
        self.bad(key.name, value, key.allowed)
        return None

    def site_ca_files(self, key: Key, value: Any) -> tuple[str, ...]:
        """Control-side PEM certificate files the host should trust."""
        if value is None:
            return ()
        value = [value] if isinstance(value, str) else value
        if not isinstance(value, list | tuple):
            self.bad(key.name, value, "a list of PEM file paths")
            return ()
        found = [cert_file(self, f"{key.name}[{i}]", path) for i, path in enumerate(value)]
        return tuple(path for path in found if path is not None)

    def stacks(self, key: Key, value: Any) -> tuple[str, ...] | None:
        """Each must fit the host's GPUs, and the one it serves must be among them."""
        if value is None:
            return None
        allowed = ("a list of stack names (" + ", ".join(self.catalog.names) + ") the host "
                   "may serve, e.g. ['int8', 'tq3-mtp-genesis']")
        value = [value] if isinstance(value, str) else value
        if not isinstance(value, list | tuple) or not value:
            self.bad(key.name, value, allowed)
            return None
        out: list[str] = []
        count, stack = self.values["gpu_count"], self.values.get("stack")
        for i, name in enumerate(value):
            if not isinstance(name, str) or name not in self.catalog:
                self.bad(f"stacks[{i}]", name, allowed, "is not a stack in the catalog")
            elif count is not None and (needs := self.catalog.get(name).gpu_count) > count:
                self.bad(f"stacks[{i}]", name, f"stacks that run on {count} GPU(s)",
                         f"needs {needs} GPUs (gpu_count is {count})")
            elif name not in out:
                out.append(name)
        if stack is not None and stack not in value:
            self.bad(key.name, list(value), f"a list that includes {stack!r}",
                     "leaves out the stack the host serves (stack)")
        return tuple(out)

    def address(self, key: Key, value: Any) -> str | None:
        """``host`` or ``host:port`` (IPv6 in brackets)."""
        if (checked := self.string(key.name, value, _ADDRESS, key.allowed, required=False)) is None:
            return None
        port = checked.rpartition("]")[2] if checked.startswith("[") else checked
        if ":" in port and not 1 <= int(port.rpartition(":")[2]) <= 65535:
            self.bad(key.name, value, key.allowed, "has a port outside 1..65535")
            return None
        return checked

    def flag(self, key: Key, value: Any) -> bool:
        checked = flag_value(value)
        if checked is None:
            self.bad(key.name, value, key.allowed)
        return bool(checked)


def valid_if(test: Callable[[Any], Any]) -> Check:
    """A ``Key.check``: the value as given when ``test`` accepts it (or it is unset)."""

    def check(c: HostChecker, key: Key, value: Any) -> Any:
        if value is None or test(value):
            return value
        c.bad(key.name, value, key.allowed)
        return None

    return check


def by_name(check: Callable[[Any, str, Any], Any]) -> Check:
    """A ``Key.check`` from a check that takes the key's name (``url``, ``parse_sources``)."""
    return lambda c, key, value: check(c, key.name, value)


def number_check(low: float | None, high: float | None, *, integer: bool = False,
                 low_open: bool = False) -> Check:
    """A ``Key.check``: a number (an integer) within ``low..high`` (``(low`` when open)."""

    def check(c: HostChecker, key: Key, value: Any) -> Any:
        checked = c.integer if integer else partial(c.number, low_open=low_open)
        return None if value is None else checked(key.name, value, low, high, key.allowed)

    return check


def url_host(name: str) -> str:
    """A host name or address as a URL or ``host:port`` names it (IPv6 in brackets)."""
    return f"[{name}]" if ":" in name else name


def host_name_or_ip(value: Any) -> bool:
    """A host name (letters, digits, ``.-_``) or an IP address: nothing a config file parses."""
    if not isinstance(value, str):
        return False
    with suppress(ValueError):
        ipaddress.ip_address(value)
        return True
    return bool(_HOST_NAME.fullmatch(value))


def flag_value(value: Any) -> bool | None:
    """A yes/no flag as data or ``--data`` gives it (True, 1, "yes", ...); None: neither."""
    if isinstance(value, bool):
        return value
    if is_int(value) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    return None
