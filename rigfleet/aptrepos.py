"""The apt repositories of host data ``apt_repos``, with per-host placeholders::

    repo = settings.apt_repos["cuda"].expand(os_id="ubuntu", version_id="24.04",
                                             codename="noble")    # its URL: .../ubuntu2404/...
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from rigfleet.validate import Problems

REQUIRED_APT_REPOS = ("cuda", "nvidia-container-toolkit")  # the driver's and the toolkit's

# Placeholders an apt repo URL/key URL/suite may use; the deploy fills them from the host's
# /etc/os-release. `$(ARCH)` (apt's own variable) is left for apt.
APT_PLACEHOLDERS = {
    "id": "os-release ID: ubuntu, debian",
    "version": "os-release VERSION_ID: 24.04, 12",
    "codename": "os-release VERSION_CODENAME: noble, bookworm",
    "distro": "NVIDIA's repo name: ubuntu2404, debian12",
}
_REPO_NAME = re.compile(r"[a-z0-9][a-z0-9-]*")
_FINGERPRINT = re.compile(r"[0-9A-F]{40}")
# apt suite and component names (a suite may hold placeholders and apt's $(ARCH)).
_APT_WORD = re.compile(r"[A-Za-z0-9._/{}$()+~-]+")
_ENTRY_KEYS = ("url", "key_url", "suite", "components", "key_fingerprint")
_NVIDIA_DISTRO = re.compile(r"[a-z]+[0-9]+")


@dataclass(frozen=True)
class AptRepo:
    """One apt repository the deploy adds (its keys: docs/hostdata.md, ``apt_repos``);
    ``per_distro``: NVIDIA's distribution name -> the whole entry for hosts of it."""

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
        """Fill the placeholders from one host's os-release."""
        values = {"id": os_id, "version": version_id, "codename": codename,
                  "distro": nvidia_distro(os_id, version_id)}
        chosen = dict(self.per_distro).get(values["distro"], self)
        return replace(chosen, name=self.name, per_distro=(),
                       url=chosen.url.format(**values), key_url=chosen.key_url.format(**values),
                       suite=chosen.suite.format(**values))


# The OSes the roles provision: (ID, VERSION_ID) of os-release -> codename.
SUPPORTED_OS: dict[tuple[str, str], str] = {
    ("debian", "12"): "bookworm", ("debian", "13"): "trixie",
    ("ubuntu", "22.04"): "jammy", ("ubuntu", "24.04"): "noble"}
OS_ALLOWED = ", ".join(f"{i} {v}" for i, v in SUPPORTED_OS)


def os_named(value: Any) -> tuple[str, str, str] | None:
    """The supported OS host data ``os`` names (``debian 13``, ``ubuntu24.04``, ``trixie``) as
    (ID, VERSION_ID, codename); None when it names none."""
    text = str(value).strip().lower().replace("-", " ")
    for (os_id, version), codename in SUPPORTED_OS.items():
        if text in (f"{os_id} {version}", f"{os_id}{version}", nvidia_distro(os_id, version),
                    codename):
            return os_id, version, codename
    return None


def nvidia_distro(os_id: str, version_id: str) -> str:
    """NVIDIA's repository name for an OS: ``ubuntu`` ``24.04`` -> ``ubuntu2404``."""
    return f"{os_id}{version_id.replace('.', '')}"


def check_apt_repos(p: Problems, key: str, value: Any) -> dict[str, AptRepo]:
    """Host data ``apt_repos`` as ``AptRepo`` values; every problem is recorded in ``p``."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        p.bad(key, value, "a mapping name -> {url, key_url, suite, components}")
        return {}
    repos = {name: _apt_repo(p, f"{key}.{name}", name, entry) for name, entry in value.items()}
    for name in REQUIRED_APT_REPOS:
        if name not in value:
            p.missing(f"{key}.{name}")
    return {name: repo for name, repo in repos.items() if repo is not None}


def _apt_repo(p: Problems, base: str, name: Any, entry: Any) -> AptRepo | None:
    if not isinstance(name, str) or not _REPO_NAME.fullmatch(name):
        p.bad(base, name, "lowercase letters, digits and '-' (used in file names)")
        return None
    if not isinstance(entry, Mapping):
        p.bad(base, entry, f"a mapping with keys {', '.join(_ENTRY_KEYS)}, per_distro")
        return None
    overrides = entry.get("per_distro", {})
    common = {k: v for k, v in entry.items() if k != "per_distro"}
    repo = _apt_repo_fields(p, base, name, common)
    if not isinstance(overrides, Mapping):
        p.bad(f"{base}.per_distro", overrides,
              "a mapping NVIDIA distribution name (e.g. 'debian13') -> keys that differ")
        return None
    if repo is None:
        return None  # the shared keys' problems are listed once, under base
    variants = []
    for distro, override in overrides.items():
        key = f"{base}.per_distro.{distro}"
        if not isinstance(distro, str) or not _NVIDIA_DISTRO.fullmatch(distro):
            p.bad(key, distro, "an NVIDIA distribution name: debian12, ubuntu2404, ...")
        elif not isinstance(override, Mapping):
            p.bad(key, override, f"a mapping with some of {', '.join(_ENTRY_KEYS)}")
        elif (variant := _apt_repo_fields(p, key, name, {**common, **override})) is not None:
            variants.append((distro, variant))
    return replace(repo, per_distro=tuple(variants)) if len(variants) == len(overrides) else None


def _apt_repo_fields(p: Problems, base: str, name: str, entry: Mapping[str, Any]) -> AptRepo | None:
    ok = True
    for k in entry:
        if k not in _ENTRY_KEYS:
            p.bad(f"{base}.{k}", k, ", ".join(_ENTRY_KEYS), "is an unknown key")
            ok = False
    url = _templated_url(p, f"{base}.url", entry.get("url"))
    key_url = _templated_url(p, f"{base}.key_url", entry.get("key_url"))
    suite = entry.get("suite")
    if not isinstance(suite, str) or not _APT_WORD.fullmatch(suite):
        p.bad(f"{base}.suite", suite,
              "'/' for a flat repo (NVIDIA's) or a suite name such as '{codename}'")
        suite = None
    elif not _placeholders(p, f"{base}.suite", suite):
        suite = None
    components = entry.get("components", [])
    if not isinstance(components, list | tuple) or not all(
            isinstance(x, str) and _APT_WORD.fullmatch(x) for x in components):
        p.bad(f"{base}.components", components,
              "a list of component names (letters, digits and ._-/)")
        components = None
    elif suite is not None:
        flat = suite.endswith("/")
        if flat and components:
            p.bad(f"{base}.components", components, "[] with a flat suite ending in '/'",
                  f"is not empty, but suite {suite!r} is a flat repository")
            components = None
        elif not flat and not components:
            p.bad(f"{base}.components", components, "at least one, e.g. ['main']",
                  f"is empty, but suite {suite!r} is not flat")
            components = None
    fingerprint = entry.get("key_fingerprint")
    if fingerprint is not None:
        normal = fingerprint.replace(" ", "").upper() if isinstance(fingerprint, str) else ""
        if not _FINGERPRINT.fullmatch(normal):
            p.bad(f"{base}.key_fingerprint", fingerprint, "40 hex digits (spaces ok)")
            ok = False
        fingerprint = normal
    if ok and url and key_url and suite and components is not None:
        return AptRepo(name, url, key_url, suite, tuple(components), fingerprint or None)
    return None


def _templated_url(p: Problems, key: str, value: Any) -> str | None:
    allowed = "an http(s) URL; it may use the placeholders below and apt's $(ARCH)"
    if value is None:
        p.missing(key)
        return None
    if not isinstance(value, str):
        p.bad(key, value, allowed)
        return None
    if not _placeholders(p, key, value):
        return None
    # Checked as it will be once the placeholders are filled for some host.
    sample = value.replace("$(ARCH)", "amd64").format(
        id="ubuntu", version="24.04", codename="noble", distro="ubuntu2404")
    return p.url(key, value, allowed, sample, "apt reads a repository's from "
                 "/etc/apt/auth.conf.d")


def _placeholders(p: Problems, key: str, value: str) -> bool:
    allowed = ", ".join(f"{{{k}}} ({v})" for k, v in APT_PLACEHOLDERS.items())
    try:
        fields = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(value)
                  if f is not None]
    except ValueError:
        p.bad(key, value, f"placeholders {allowed}", "has unbalanced braces")
        return False
    if unknown := [f for f, _, _ in fields if f not in APT_PLACEHOLDERS]:
        p.bad(key, value, f"placeholders {allowed}", f"uses unknown {{{unknown[0]}}}")
        return False
    # str.format would apply (or raise on) a conversion or format spec: {distro!z}, {id:d}
    if odd := [f"{{{f}{'!' + conv if conv else ''}{':' + spec if spec else ''}}}"
               for f, spec, conv in fields if spec or conv]:
        p.bad(key, value, f"placeholders {allowed}", f"uses {odd[0]}, which is none of them")
        return False
    return True
