#!/usr/bin/env python3
"""Everything rigfleet needs to know about a Genesis tree, read from its source with ``ast``.

Stdlib only: the deploy installs this file on each host as
``/usr/local/lib/rigfleet/rigfleet-genesis-inspect.py`` (``roles/genesis.py``) and the gate runs
it on the exported tree a stack mounts; the control side (``rigfleet pins lock``, ``rigfleet
bump``) imports it and runs the same parsers on files read from its git mirror. Nothing is
imported or executed from the tree: only literal assignments are read. It reports the tree's
``layout`` (v7 or v12, from marker files), ``version``, ``allowlist``, patch ``registry`` and
switches, ``flags`` and ``errors`` as one JSON object (schema ``rigfleet-genesis-inspect/1``;
docs/genesis.md, "The host helper", shows it key by key).

Usage::

    rigfleet-genesis-inspect.py /opt/rigfleet/genesis-trees/66e37841a18f35a113ce10f831808faa4c858ced
    {"schema": "rigfleet-genesis-inspect/1", "layout": "v12", "version": "v12.1.0", ...}

From Python (the control side)::

    from rigfleet.genesis_inspect import DirSource, inspect
    inspect(DirSource("/tmp/genesis"))["layout"]          # 'v7'
"""

from __future__ import annotations

import ast
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

SCHEMA = "rigfleet-genesis-inspect/1"
KNOWN_GOOD = "KNOWN_GOOD_VLLM_PINS"
PENDING = "PROMOTION_PENDING_VLLM_PINS"
REGISTRY = "PATCH_REGISTRY"


@dataclass(frozen=True)
class TreeFiles:
    """Where one Genesis generation keeps what rigfleet reads, relative to the tree's root, and
    how that generation reads its switches.

    + generation: ``v7`` or ``v12``
    + package: the importable package directory (``vllm/_genesis``, ``sndr``)
    + check_file: the file whose presence marks this layout (the apply entry point)
    + allowlist_file: holds ``KNOWN_GOOD_VLLM_PINS`` (v12 also ``PROMOTION_PENDING_VLLM_PINS``)
    + registry_file: holds ``PATCH_REGISTRY``
    + version_file: where the tree declares its version
    + switch_prefixes: the environment prefixes a switch is read under. v7 reads each patch's
      ``env_flag`` literally (``os.environ.get(env_flag)``, ``vllm/_genesis/dispatcher.py``);
      v12 strips ``SNDR_ENABLE_``/``GENESIS_ENABLE_`` from ``env_flag`` and its
      ``env_flag_aliases`` and reads both prefixes (``sndr/dispatcher/decision.py``)
    + strips_prefix: v12 reads an ``env_flag`` that has none of ``switch_prefixes`` as a bare
      name under each prefix too (``_bare`` in ``decision.py``); v7 reads it literally only
    + retired_skipped: Genesis hard-skips a ``lifecycle: retired`` patch even when switched on
      unless ``GENESIS_ALLOW_RETIRED=1`` (v12's lifecycle gate); v7 never consults lifecycle
      when applying
    + flags_file: (v12) ``sndr/env.py``, whose ``Flags`` class lists the switch names Genesis
      reads, patches' and orchestration flags' alike
    """

    generation: str
    package: str
    check_file: str
    allowlist_file: str
    registry_file: str
    version_file: str
    switch_prefixes: tuple[str, ...]
    strips_prefix: bool
    retired_skipped: bool
    flags_file: str | None = None


GENERATIONS: dict[str, TreeFiles] = {
    "v7": TreeFiles(
        generation="v7",
        package="vllm/_genesis",
        check_file="vllm/_genesis/patches/apply_all.py",
        allowlist_file="vllm/_genesis/guards.py",
        registry_file="vllm/_genesis/dispatcher.py",
        version_file="vllm/_genesis/__version__.py",
        switch_prefixes=("GENESIS_ENABLE_",),
        strips_prefix=False,
        retired_skipped=False,
    ),
    "v12": TreeFiles(
        generation="v12",
        package="sndr",
        check_file="sndr/apply/__main__.py",
        allowlist_file="sndr/engines/vllm/detection/guards.py",
        registry_file="sndr/dispatcher/registry.py",
        version_file="pyproject.toml",
        switch_prefixes=("GENESIS_ENABLE_", "SNDR_ENABLE_"),
        strips_prefix=True,
        retired_skipped=True,
        flags_file="sndr/env.py",
    ),
}
# Genesis v8.0-v11.x (2026-05-07 .. 06-03) kept the package at vllm/sndr_core next to a
# vllm/_genesis shim (upstream-2026.md section 3.1/3.2): neither layout rigfleet mounts.
UNSUPPORTED: dict[str, str] = {"vllm/sndr_core": "a Genesis v8-v11 tree (vllm/sndr_core)"}
MARKERS: tuple[str, ...] = (*(f.check_file for f in GENERATIONS.values()), *UNSUPPORTED)
# Lifecycle as Genesis derives it (compat/lifecycle.py get_state, in both generations).
DEFAULT_LIFECYCLE = "stable"
_TAG_VERSION = re.compile(r"v?(\d+(?:\.\d+)+(?:[.-]?[A-Za-z0-9]+)*)")


class InspectError(ValueError):
    """A file of the tree could not be read as rigfleet expects; the message names it."""


class Source(Protocol):
    """Read access to one Genesis tree: a directory on a host, or a commit in a git mirror."""

    def exists(self, rel: str) -> bool:
        """Whether ``rel`` (a file or directory) is in the tree."""
        ...

    def read(self, rel: str) -> str | None:
        """The text of file ``rel`` (None when absent)."""
        ...


class DirSource:
    """A tree on disk (a checkout or an exported tree)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def exists(self, rel: str) -> bool:
        return (self.root / rel).exists()

    def read(self, rel: str) -> str | None:
        path = self.root / rel
        return path.read_text(encoding="utf-8") if path.is_file() else None


# --- layout ------------------------------------------------------------------------------------


def detect_layout(present: set[str] | frozenset[str]) -> tuple[str | None, str | None]:
    """(generation, None) from the marker files present, or (None, why not).

    + present: which of ``MARKERS`` the tree has
    """
    found = [g for g, f in GENERATIONS.items() if f.check_file in present]
    unsupported = [what for marker, what in UNSUPPORTED.items() if marker in present]
    wanted = ", ".join(f"{f.check_file} ({g})" for g, f in GENERATIONS.items())
    if len(found) > 1:
        return None, f"it has the marker files of several layouts ({wanted})"
    if found == ["v12"]:
        return "v12", None
    if unsupported:
        return None, (f"it is {unsupported[0]}, a layout rigfleet does not mount; pin a v7.x "
                      "or v12.x commit")
    if found:
        return found[0], None
    return None, f"it has none of {wanted}"


def markers(source: Source) -> frozenset[str]:
    """Which of ``MARKERS`` the tree has."""
    return frozenset(m for m in MARKERS if source.exists(m))


# --- parsing -----------------------------------------------------------------------------------


def literal_assignments(module: ast.Module) -> dict[str, object]:
    """Module-level ``NAME = <literal>`` and ``NAME: T = <literal>`` assignments."""
    out: dict[str, object] = {}
    for node in module.body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name):
                try:
                    out[target.id] = ast.literal_eval(value)
                except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    continue
    return out


def _parse(text: str, where: str) -> ast.Module:
    try:
        return ast.parse(text, where)
    except SyntaxError as e:
        raise InspectError(f"{where}: not valid Python: {e.msg} (line {e.lineno})") from None


def strings(value: object) -> list[str]:
    """The string items of a literal list/tuple/set (anything else: empty)."""
    if isinstance(value, list | tuple | set | frozenset):
        return [v for v in value if isinstance(v, str)]
    return []


def parse_allowlist(text: str, where: str) -> tuple[list[str], list[str]]:
    """(``KNOWN_GOOD_VLLM_PINS``, ``PROMOTION_PENDING_VLLM_PINS``) of a guards file.

    Raises ``InspectError`` when there is no ``KNOWN_GOOD_VLLM_PINS`` literal.
    """
    values = literal_assignments(_parse(text, where))
    if KNOWN_GOOD not in values:
        raise InspectError(f"{where}: no literal {KNOWN_GOOD}")
    return strings(values[KNOWN_GOOD]), strings(values.get(PENDING))


def lifecycle(meta: dict[str, Any]) -> str:
    """A registry entry's lifecycle as Genesis derives it: the explicit ``lifecycle``, else
    ``deprecated`` for a ``deprecated: True`` entry, else ``stable``."""
    explicit = meta.get("lifecycle")
    if isinstance(explicit, str) and explicit:
        return explicit
    return "deprecated" if meta.get("deprecated") else DEFAULT_LIFECYCLE


def switch_suffix(flag: str, files: TreeFiles) -> str | None:
    """The ``<prefix>`` suffix under which ``files``' generation reads env flag ``flag``.

    v7 reads ``flag`` literally: only a ``GENESIS_ENABLE_*`` flag is a switch by that prefix
    (``GENESIS_LEGACY_P4`` is not). v12 strips ``SNDR_ENABLE_``/``GENESIS_ENABLE_`` when present
    and reads the rest under both prefixes.
    """
    for prefix in files.switch_prefixes:
        if flag.startswith(prefix):
            return flag[len(prefix):]
    return flag if files.strips_prefix else None


def registry_literal(text: str, where: str) -> dict[str, dict[str, Any]]:
    """The ``PATCH_REGISTRY`` literal of a registry file: patch id -> its entry, as written.

    Raises ``InspectError`` when there is no ``PATCH_REGISTRY`` dict literal or an entry is not
    a dict.
    """
    registry = literal_assignments(_parse(text, where)).get(REGISTRY)
    if not isinstance(registry, dict):
        raise InspectError(f"{where}: no literal {REGISTRY} dict")
    for pid, meta in registry.items():
        if not isinstance(pid, str) or not isinstance(meta, dict):
            raise InspectError(f"{where}: {REGISTRY}[{pid!r}] is not a patch entry (a dict)")
    return registry


def parse_registry(text: str, where: str, files: TreeFiles) -> dict[str, Any]:
    """The registry report of a ``PATCH_REGISTRY`` file (see the module docstring).

    Raises ``InspectError`` when there is no ``PATCH_REGISTRY`` dict literal.
    """
    registry = registry_literal(text, where)
    switches: dict[str, list[list[str]]] = {}
    patches: dict[str, list[Any]] = {}
    lifecycles: dict[str, int] = {}
    for pid, meta in registry.items():
        state = lifecycle(meta)
        lifecycles[state] = lifecycles.get(state, 0) + 1
        flag = meta.get("env_flag")
        patches[pid] = [flag if isinstance(flag, str) else None, state,
                        bool(meta.get("default_on"))]  # fmt: skip
        named = [(flag, "env_flag")] if isinstance(flag, str) and flag else []
        named += [(a, "alias") for a in strings(meta.get("env_flag_aliases"))]
        for name, via in named:
            suffix = switch_suffix(name, files)
            if suffix:
                switches.setdefault(suffix, []).append([pid, state, via])
    return {
        "file": files.registry_file,
        "patches": len(registry),
        "lifecycles": dict(sorted(lifecycles.items())),
        "switch_prefixes": list(files.switch_prefixes),
        "retired_skipped": files.retired_skipped,
        "switches": dict(sorted(switches.items())),
        "patch_flags": patches,
    }


def parse_flags(text: str, where: str, registry: dict[str, Any]) -> list[str]:
    """(v12) ``Flags`` names no patch owns: orchestration flags Genesis reads by the same
    prefixes (``BUNDLE_*``, ``NO_PATCH_CACHE``, ...). A name that is a legacy patch's id (its
    ``env_flag`` is ``GENESIS_LEGACY_<name>``) is left out: that patch is switched by the
    ``GENESIS_LEGACY_`` prefix, never by ``GENESIS_ENABLE_<name>``."""
    module = _parse(text, where)
    names: set[str] = set()
    for node in module.body:
        if isinstance(node, ast.ClassDef) and node.name == "Flags":
            for item in node.body:
                if isinstance(item, ast.Assign | ast.AnnAssign) and isinstance(
                    item.value, ast.Constant
                ) and isinstance(item.value.value, str):
                    names.add(item.value.value)
    legacy = {
        flag.split("_LEGACY_", 1)[1]
        for flag, _, _ in registry["patch_flags"].values()
        if isinstance(flag, str) and "_LEGACY_" in flag
    }
    return sorted(names - set(registry["switches"]) - legacy)


def parse_version(text: str, files: TreeFiles) -> str | None:
    """The version the tree declares, as ``v<version>`` (None when it declares none)."""
    raw: object = None
    if files.version_file.endswith(".toml"):
        section = ""
        for line in text.splitlines():
            stripped = line.strip()
            if stripped.startswith("["):
                section = stripped
            elif section == "[project]":
                m = re.fullmatch(r"""version\s*=\s*["']([^"']+)["']\s*(#.*)?""", stripped)
                if m:
                    raw = m.group(1)
                    break
    else:
        values = literal_assignments(_parse(text, files.version_file))
        raw = values.get("__version__", values.get("VERSION"))
    if not isinstance(raw, str) or not (m := _TAG_VERSION.fullmatch(raw.strip())):
        return None
    return f"v{m.group(1)}"


# --- the report --------------------------------------------------------------------------------


def inspect(source: Source, *, registry: bool = True) -> dict[str, Any]:
    """The report of one tree (see the module docstring); ``registry=False`` skips the patch
    registry (the bump's search reads only layouts and allowlists)."""
    present = markers(source)
    layout, why = detect_layout(present)
    out: dict[str, Any] = {"schema": SCHEMA, "layout": layout, "markers": sorted(present),
                           "version": None, "version_file": None, "allowlist": None,
                           "registry": None, "flags": [], "errors": []}  # fmt: skip
    if layout is None:
        out["errors"].append(f"no Genesis layout rigfleet knows: {why}")
        return out
    files = GENERATIONS[layout]
    out["version_file"] = files.version_file
    version_text = source.read(files.version_file)
    if version_text is not None:
        try:
            out["version"] = parse_version(version_text, files)
        except InspectError:
            out["version"] = None  # a version is for people; its absence blocks nothing
    text = source.read(files.allowlist_file)
    try:
        if text is None:
            raise InspectError(f"{files.allowlist_file}: missing (where the {layout} layout "
                               "keeps KNOWN_GOOD_VLLM_PINS)")
        known, pending = parse_allowlist(text, files.allowlist_file)
        out["allowlist"] = {"file": files.allowlist_file, "known_good": known, "pending": pending}
    except InspectError as e:
        out["errors"].append(str(e))
    if not registry:
        return out
    text = source.read(files.registry_file)
    try:
        if text is None:
            raise InspectError(f"{files.registry_file}: missing (where the {layout} layout "
                               "keeps PATCH_REGISTRY)")
        out["registry"] = parse_registry(text, files.registry_file, files)
    except InspectError as e:
        out["errors"].append(str(e))
    if out["registry"] is not None and files.flags_file:
        text = source.read(files.flags_file)
        if text is not None:
            try:
                out["flags"] = parse_flags(text, files.flags_file, out["registry"])
            except InspectError as e:
                out["errors"].append(str(e))
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1].startswith("-"):
        print("usage: rigfleet-genesis-inspect.py <genesis tree or checkout>", file=sys.stderr)
        return 2
    root = Path(argv[1])
    if not root.is_dir():
        print(f"{root}: not a directory", file=sys.stderr)
        return 1
    report = inspect(DirSource(root))
    print(json.dumps(report, separators=(",", ":")))
    for error in report["errors"]:
        print(f"{root}: {error}", file=sys.stderr)
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
