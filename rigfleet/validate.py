"""One way to check data people write (pins, host data, stack files): a ``Problems`` collects
every problem in one pass, one line each (``<where>: <key>: <value> <what is wrong>; allowed:
<what would do>``); ``load_yaml`` reads YAML strictly (UTF-8 only, no duplicate keys)::

    p = Problems("pins.yaml", pin_keys.TABLE)
    top = p.mapping("", data)
    serial = p.integer("serial", top.get("serial"), low=1)
    p.raise_if_any(PinsError)
"""

from __future__ import annotations

import difflib
import fnmatch
import math
import os
import posixpath
import re
from collections.abc import Hashable, Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from rigfleet.errors import RigfleetError
from rigfleet.hostside.layout import (
    CACHE_ROOT,
    ETC_ROOT,
    HOST,
    LIB_ROOT,
    OPT_ROOT,
    STATE_ROOT,
)
from rigfleet.keytable import KeyTable

# Control characters (C0 and C1 but tab): nothing a person means to write holds them.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")
_PRINTABLE = "printable text (no line breaks, escapes or other control characters)"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# The words YAML 1.1 (PyYAML) reads as booleans, unquoted, in any of its cases.
_YAML_BOOLS = {True: ("on", "yes", "true"), False: ("off", "no", "false")}
# A secret (API key, HF token) ends up in an env file, an HTTP header file and an nginx regex:
# token characters (RFC 6750 b64token) keep all three safe; host data, preflight and the hub.
TOKEN_CHARS = re.compile(r"[A-Za-z0-9._~+/=-]+")
TOKEN_ALLOWED = "letters, digits and -._~+/="
GIT_URL = re.compile(r"(?:https?|ssh|git|file)://\S+|[\w.-]+@[\w.-]+:\S+")
GIT_URL_ALLOWED = ("a git URL without a password (https://, http://, ssh://, git://, file:// or "
                   "user@host:path; a private repository's credential goes in git's credential "
                   "helper or an SSH key)")
URL_ALLOWED = "an http:// or https:// URL with a host, e.g. 'http://mirror.lan:5000'"
# scheme://user:password@rest: the password would reach git's command line and progress lines
_URL_PASSWORD = re.compile(r"([a-z][a-z0-9+.-]*://)[^/@\s]*:[^/@\s]*@(\S*)", re.IGNORECASE)

# Directories a path from the inventory must never be (the deploy would own or chmod them).
SYSTEM_DIRS = frozenset({
    "/", "/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32",
    "/media", "/mnt", "/opt", "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr",
    "/usr/bin", "/usr/lib", "/usr/local", "/usr/local/bin", "/usr/local/lib", "/usr/sbin",
    "/usr/share", "/var", "/var/lib", "/var/log", "/var/cache", "/var/tmp", "/var/run",
    "/var/lib/docker", ETC_ROOT, STATE_ROOT, OPT_ROOT, CACHE_ROOT, LIB_ROOT,
})  # fmt: skip

# Environment names that look like a secret's (secrets reach hosts only as root-only files).
SECRET_NAMES = ("*_KEY", "*_TOKEN", "*_SECRET", "*PASSWORD*")
SECRET_NAME_ALLOWED = (
    f"a name that does not look like a secret's ({', '.join(SECRET_NAMES)}); secrets reach "
    f"hosts only as root-only files in {HOST.secrets_dir}: the API key from host data "
    f"api_key_file (the stacks read VLLM_API_KEY from {HOST.vllm_env_file}), a Hugging Face "
    f"token from host data hf_token_file ({HOST.hf_token_file})")


def secret_like(name: str) -> bool:
    """Does an environment name look like a secret's (``SECRET_NAMES``, any case)?"""
    return any(fnmatch.fnmatchcase(name.upper(), pattern) for pattern in SECRET_NAMES)


def env_vars(p: Problems, key: str, env: Any, allowed: str, secret: str = "") -> dict[str, str]:
    """Container environment ``NAME: value`` (None: empty); ``secret``: why secrets are refused."""
    if not isinstance(env, Mapping):
        if env is not None:
            p.bad(key, env, allowed)
        return {}
    out: dict[str, str] = {}
    for name, v in env.items():
        if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
            p.bad(f"{key}.{name}", name, "an environment name [A-Za-z_][A-Za-z0-9_]*")
        elif secret_like(name):
            p.bad(f"{key}.{name}", name, SECRET_NAME_ALLOWED, "looks like a secret's name" + secret)
        elif isinstance(v, bool) or not isinstance(v, str | int | float):
            p.bad(f"{key}.{name}", v, "a string or number (write booleans as '1'/'0')")
        elif has_control(str(v)):
            p.bad(f"{key}.{name}", v, "a value without control characters",
                  "holds control characters")
        else:
            out[name] = str(v)
    return out


class ValidationError(RigfleetError, ValueError):
    """Data that does not validate; ``problems`` holds one line per problem."""

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


def has_control(value: str) -> bool:
    return bool(_CONTROL.search(value))


def shown(value: Any) -> str:
    """A value as a message shows it: ``repr`` (control characters escaped), cut short."""
    text = repr(value)
    return text if len(text) <= 160 else text[:150] + "...'"


class Problems:
    """Problems found in one file or one host's data (``where``), in the order found; with a
    ``table``, a check's ``allowed`` text and a mapping's keys default to the table's."""

    def __init__(self, where: str, table: KeyTable | None = None) -> None:
        self.where = where
        self.table = table
        self.lines: list[str] = []

    def bad(self, key: str, value: Any, allowed: str, what: str = "is not valid") -> None:
        self.lines.append(f"{self.where}: {key or 'top level'}: {shown(value)} {what}; "
                          f"allowed: {allowed}")

    # What a ``missing`` without ``allowed`` says (host data: where to set the key).
    unset = "set it"

    def missing(self, key: str, allowed: str | None = None) -> None:
        self.lines.append(f"{self.where}: {key}: missing; "
                          + (f"allowed: {allowed}" if allowed else self.unset))

    def add(self, line: str) -> None:
        """A problem already phrased (it must still name the key and what is allowed)."""
        self.lines.append(f"{self.where}: {line}")

    def control_chars(self, key: str, value: Any) -> bool:
        """Record each string (nested, keys too) with a control character; True if any."""
        before = len(self.lines)
        if isinstance(value, str) and has_control(value):
            self.bad(key, value, _PRINTABLE, "holds control characters")
        elif isinstance(value, dict):
            for k, v in value.items():
                if isinstance(k, str) and has_control(k):
                    self.bad(key, k, _PRINTABLE, "is a key holding control characters")
                else:
                    self.control_chars(f"{key}.{k}" if key else str(k), v)
        elif isinstance(value, list | tuple):
            for i, item in enumerate(value):
                self.control_chars(f"{key}[{i}]", item)
        return len(self.lines) > before

    def section(self, key: str) -> str:
        assert self.table is not None
        return self.table.section(key)

    def allowed(self, key: str, given: str | None = None) -> str | None:
        """``given``, else the table's text for ``key``."""
        if given is not None or self.table is None:
            return given
        return self.table.allowed(self.section(key))

    def raise_if_any(self, error: type[ValidationError]) -> None:
        if self.lines:
            raise error(self.lines)

    def mapping(self, key: str, value: Any, keys: Iterable[str] | None = None,
                required: bool = True) -> dict[Any, Any] | None:
        """A mapping whose keys are all in ``keys`` (default: the table's for ``key``)."""
        if keys is None:
            assert self.table is not None
            keys = self.table.keys_of(self.section(key))
        allowed = list(keys)
        shape = f"a mapping with keys {', '.join(allowed)}"
        if self.absent(key or "top level", value, shape, required):
            return None
        if not isinstance(value, dict):
            self.bad(key, value, shape, "is not a mapping")
            return None
        for k in (k for k in value if k not in allowed):
            self.unknown_key(f"{key}.{k}" if key else str(k), k, allowed)
        return value

    def named(self, key: str, value: Any) -> dict[Any, Any]:
        """A mapping of named entries (None: none); anything else recorded as not a mapping."""
        if value is not None and not isinstance(value, dict):
            self.bad(key, value, self.allowed(key) or "", "is not a mapping")
        return value if isinstance(value, dict) else {}

    def unknown_key(self, key: str, name: Any, allowed: list[str],
                    what: str = "is an unknown key") -> None:
        """``name`` is not one of ``allowed``: ``what``, with a typo's likely fix (or the word
        YAML read as a boolean: an unquoted ``on`` is true)."""
        words = _YAML_BOOLS.get(name) if isinstance(name, bool) else None
        if word := next((w for w in allowed if words and w.lower() in words), None):
            what += f" (YAML reads an unquoted {word} as {str(name).lower()}: write \"{word}\")"
        elif close := difflib.get_close_matches(str(name), allowed, n=1, cutoff=0.8):
            what += f" (did you mean {close[0]!r}?)"
        self.bad(key, name, ", ".join(allowed), what)

    def absent(self, key: str, value: Any, allowed: str, required: bool) -> bool:
        """``value`` is None (recorded as missing when ``required``)."""
        if value is None and required:
            self.missing(key, allowed)
        return value is None

    def string(self, key: str, value: Any, pattern: re.Pattern[str] | None = None,
               allowed: str | None = None, required: bool = True) -> str | None:
        """A string matching ``pattern`` (any non-empty string when None), no control chars."""
        allowed = self.allowed(key, allowed) or ""
        if self.absent(key, value, allowed, required):
            return None
        if isinstance(value, str) and has_control(value):
            self.bad(key, value, allowed, "holds control characters")
            return None
        if not isinstance(value, str) or not (
                pattern.fullmatch(value) if pattern else value.strip()):
            self.bad(key, value, allowed)
            return None
        return value

    def integer(self, key: str, value: Any, low: float | None = None, high: float | None = None,
                allowed: str | None = None, required: bool = True) -> int | None:
        """An integer (never a bool) within ``low..high``."""
        bounds = (f" {low}..{high}" if low is not None and high is not None else f" >= {low}"
                  if low is not None else f" <= {high}" if high is not None else "")
        allowed = self.allowed(key, allowed) or f"an integer{bounds}"
        if value is not None and not is_int(value):
            self.bad(key, value, allowed)
            return None
        return None if self.number(key, value, low, high, allowed, required) is None else value

    def number(self, key: str, value: Any, low: float | None = None, high: float | None = None,
               allowed: str | None = None, required: bool = True,
               low_open: bool = False) -> float | None:
        """A number (int or float, never a bool) within ``low..high`` (``(low`` when open)."""
        allowed = self.allowed(key, allowed) or "a number"
        if self.absent(key, value, allowed, required):
            return None
        if not (isinstance(value, int | float) and not isinstance(value, bool)
                and finite(value)
                and (low is None or (value > low if low_open else value >= low))
                and (high is None or value <= high)):
            self.bad(key, value, allowed)
            return None
        return float(value)

    def boolean(self, key: str, value: Any) -> bool | None:
        if self.absent(key, value, "true or false", required=True):
            return None
        if not isinstance(value, bool):
            self.bad(key, value, "true or false")
            return None
        return value

    def choice(self, key: str, value: Any, choices: Iterable[str]) -> str | None:
        allowed = list(choices)
        if self.absent(key, value, ", ".join(allowed), required=True):
            return None
        if not isinstance(value, str) or value not in allowed:
            self.unknown_key(key, value, allowed, "is not allowed")
            return None
        return value

    def git_url(self, key: str, value: Any, allowed: str = GIT_URL_ALLOWED,
                required: bool = True) -> str | None:
        """A ``GIT_URL`` without a password (one is shown masked, here too)."""
        if isinstance(value, str) and (m := _URL_PASSWORD.match(value)):
            self.bad(key, f"{m.group(1)}***@{m.group(2)}", allowed,
                     "carries a password (user:password@)")
            return None
        return self.string(key, value, GIT_URL, allowed, required)

    def url(self, key: str, value: Any, allowed: str = URL_ALLOWED, checked: str | None = None,
            creds: str = "an index or mirror on the LAN that needs none") -> str | None:
        """An http(s) URL with a host and no credentials (None: unset or refused); ``checked``:
        the URL as it will be (placeholders filled), ``creds``: what to use instead of them."""
        if value is None:
            return None
        checked = checked or value
        try:  # urlsplit refuses a broken [IPv6] host; .port a port not 0..65535 or not digits
            parts = urlsplit(checked) if isinstance(value, str) else None
            port_ok = parts is not None and parts.port != 0
        except ValueError:
            parts, port_ok = None, False
        if (parts is None or not port_ok or parts.scheme not in ("http", "https")
                or not parts.hostname or has_control(checked)
                or any(ch.isspace() for ch in checked)):
            self.bad(key, value, allowed)
            return None
        if parts.username is not None or parts.password is not None:
            # Named without them: in the URL they would reach process arguments, an image's
            # history or a world-readable file (this message is logged).
            self.bad(key, re.sub(r"//[^/]*@", "//***@", value, count=1),
                     f"a URL without credentials ({creds})", "carries credentials (user:password@)")
            return None
        return str(value)

    def strings(self, key: str, value: Any, pattern: re.Pattern[str] | None = None,
                allowed: str | None = None, required: bool = False) -> list[str] | None:
        """A list of strings, each checked like ``string``."""
        allowed = self.allowed(key, allowed) or ""
        if self.absent(key, value, f"a list of {allowed}", required):
            return None if required else []
        if not isinstance(value, list | tuple):
            self.bad(key, value, f"a list of {allowed}")
            return None
        checked = [self.string(f"{key}[{i}]", item, pattern, allowed)
                   for i, item in enumerate(value)]
        out = [item for item in checked if item is not None]
        return out if len(out) == len(checked) else None

    def posix_path(self, key: str, value: Any, allowed: str = "an absolute, normalised directory",
                   required: bool = True) -> str | None:
        """An absolute, normalised POSIX path that is not a system directory."""
        if (checked := self.string(key, value, None, allowed, required)) is None:
            return None
        if not checked.startswith("/") or posixpath.normpath(checked) != checked:
            self.bad(key, value, allowed, "is not an absolute, normalised path")
            return None
        if is_system_dir(checked):
            self.bad(key, value, allowed + " (not a system directory)", "is a system directory")
            return None
        return checked


def finite(value: float) -> bool:
    """Not inf or nan, and small enough for a float (``float(10**400)`` overflows)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def secret_text(path: str, *, strip: bool = True, errors: str = "strict") -> str:
    """A secret file on this (control) machine: a token (stripped) or a PEM key (not); raises
    ``OSError`` and ``UnicodeDecodeError``, each caller says it its own way."""
    text = Path(os.path.expanduser(path)).read_text(encoding="utf-8", errors=errors)
    return text.strip() if strip else text


def escapes(entry: Path, root: Path) -> bool:
    """True when ``entry`` (a file in ``root``), once symlinks are followed, lies outside it."""
    try:
        return not entry.resolve(strict=True).is_relative_to(root.resolve(strict=True))
    except OSError:
        return True


def is_system_dir(path: str) -> bool:
    """``path`` (normalised, trailing ``/`` ignored) is one of ``SYSTEM_DIRS``."""
    return bool(path) and posixpath.normpath(path) in SYSTEM_DIRS


class YamlError(RigfleetError, ValueError):
    """A YAML file that cannot be used; the message names the file and the line."""


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (a key beside a ``<<`` merge
    overrides the merged one, as YAML says)."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode,
                       deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        if not isinstance(key := loader.construct_object(key_node, deep=deep), Hashable):
            continue  # SafeLoader reports unhashable keys itself
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark,
                f"found duplicate key {key!r} (first at line {seen[key] + 1}); a YAML mapping "
                "keeps only the last value, so remove one", key_node.start_mark)
        seen[key] = key_node.start_mark.line
    loader.flatten_mapping(node)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_yaml(text: str, where: str) -> Any:
    """Parse ``text`` strictly (duplicate keys refused); errors name ``where`` and the line."""
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise YamlError(f"{where}:{line}: not valid YAML: {e.problem or e}"
                        + (f" ({e.context})" if e.context and e.problem else "")) from None
    except yaml.YAMLError as e:
        raise YamlError(f"{where}: not valid YAML: {e}") from None


def load_yaml(path: str | Path, what: str, hint: str = "") -> Any:
    """A YAML file people write, read strictly (``what``, ``hint``: for a missing one)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise YamlError(f"{path}: no such file ({what}){'; ' + hint if hint else ''}") from None
    except OSError as e:
        raise YamlError(f"{path}: cannot be read ({e.strerror or e})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise YamlError(f"{path}: line {line}: byte {data[e.start]:#04x} is not UTF-8; allowed: "
                        "a UTF-8 text file (re-save it as UTF-8)") from None
    return parse_yaml(text, str(path))
