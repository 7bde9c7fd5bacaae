#!/usr/bin/env python3
"""Everything rigfleet needs to know about a Genesis tree, read from its source with ``ast``
(nothing in it runs), and the one table of the Genesis layouts (``GENERATIONS``). Stdlib only:
hosts run it as ``rigfleet-genesis-inspect.py`` (docs/genesis.md, "The host helper")::

    rigfleet-genesis-inspect.py /opt/rigfleet/genesis-trees/<commit>   # {"layout": "v12", ...}
    inspect(DirSource("/tmp/genesis"))["layout"]                      # 'v7'
"""

from __future__ import annotations

import ast
import json
import re
import sys
from collections import Counter
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

SCHEMA = "rigfleet-genesis-inspect/1"
KNOWN_GOOD = "KNOWN_GOOD_VLLM_PINS"
PENDING = "PROMOTION_PENDING_VLLM_PINS"
REGISTRY = "PATCH_REGISTRY"


# The official vllm/vllm-openai image keeps vLLM in dist-packages (Python 3.12).
SITE_PACKAGES_IN_CONTAINER = "/usr/local/lib/python3.12/dist-packages"
TREE_IN_CONTAINER = "/opt/genesis"
_SNDR_IN_SITE = f"{SITE_PACKAGES_IN_CONTAINER}/sndr"


def refuse_if(test: str, why: str) -> tuple[str, ...]:
    """Shell lines that stop a container's boot with ``rigfleet: <why>`` when ``test`` holds."""
    return (f"if {test}; then", f'  echo "rigfleet: {why}" >&2', "  exit 1", "fi")


@dataclass(frozen=True)
class GenesisLayout:
    """One Genesis generation (docs/genesis.md's table). ``mount``: the part of the tree mounted
    at ``mount_target`` (``""``: all); ``strips_prefix``: an unprefixed ``env_flag`` is a bare
    switch name (v12); ``flags_file``: whose ``Flags`` class names every switch Genesis reads."""

    check_file: str
    allowlist_file: str
    registry_file: str
    version_file: str
    switch_prefixes: tuple[str, ...]
    mount: str
    mount_target: str
    apply_command: str
    strips_prefix: bool = False
    retired_skipped: bool = False
    flags_file: str | None = None
    prepare: tuple[str, ...] = ()

    def mount_source(self, tree: str) -> str:
        root = tree.rstrip("/")
        return f"{root}/{self.mount}" if self.mount else root

    @property
    def check_path_in_container(self) -> str:
        return f"{self.mount_target}/{self.check_file.removeprefix(f'{self.mount}/')}"


GENERATIONS: dict[str, GenesisLayout] = {
    "v7": GenesisLayout(
        check_file="vllm/_genesis/patches/apply_all.py",
        allowlist_file="vllm/_genesis/guards.py",
        registry_file="vllm/_genesis/dispatcher.py",
        version_file="vllm/_genesis/__version__.py",
        switch_prefixes=("GENESIS_ENABLE_",),
        mount="vllm/_genesis",
        mount_target=f"{SITE_PACKAGES_IN_CONTAINER}/vllm/_genesis",
        apply_command="python3 -m vllm._genesis.patches.apply_all",
    ),
    # v12 is mounted whole, linked into site-packages (docs/genesis.md says why).
    "v12": GenesisLayout(
        check_file="sndr/apply/__main__.py",
        allowlist_file="sndr/engines/vllm/detection/guards.py",
        registry_file="sndr/dispatcher/registry.py",
        version_file="pyproject.toml",
        switch_prefixes=("GENESIS_ENABLE_", "SNDR_ENABLE_"),
        strips_prefix=True,
        retired_skipped=True,
        mount="",
        mount_target=TREE_IN_CONTAINER,
        apply_command="python3 -m sndr.apply",
        flags_file="sndr/env.py",
        prepare=(
            *refuse_if(f"[ -e {_SNDR_IN_SITE} ] && [ ! -L {_SNDR_IN_SITE} ]",
                       f"this image already has a sndr package ({_SNDR_IN_SITE}); refusing to "
                       "mix it with the pinned Genesis tree"),
            f"ln -sfn {TREE_IN_CONTAINER}/sndr {_SNDR_IN_SITE}",
        ),
    ),
}
# Genesis v8.0-v11.x kept the package at vllm/sndr_core: neither layout rigfleet mounts.
UNSUPPORTED: dict[str, str] = {"vllm/sndr_core": "a Genesis v8-v11 tree (vllm/sndr_core)"}
MARKERS: tuple[str, ...] = (*(f.check_file for f in GENERATIONS.values()), *UNSUPPORTED)
_TAG_VERSION = re.compile(r"v?(\d+(?:\.\d+)+(?:[.-]?[A-Za-z0-9]+)*)")
_TOML_VERSION = re.compile(r"""version\s*=\s*["']([^"']+)["']\s*(#.*)?""")


class InspectError(ValueError):
    """A file of the tree could not be read as rigfleet expects; the message names it."""


class Source(Protocol):
    """Read access to one Genesis tree: a directory on a host, or a commit in a git mirror."""

    def markers(self) -> frozenset[str]:
        """Which of ``MARKERS`` the tree has."""

    def read(self, rel: str) -> str | None: ...


class DirSource:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def markers(self) -> frozenset[str]:
        return frozenset(m for m in MARKERS if (self.root / m).exists())

    def read(self, rel: str) -> str | None:
        path = self.root / rel
        return path.read_text(encoding="utf-8") if path.is_file() else None


def detect_layout(present: set[str] | frozenset[str]) -> tuple[str | None, str | None]:
    """(generation, None) from the ``MARKERS`` present, or (None, why not)."""
    found = [g for g, f in GENERATIONS.items() if f.check_file in present]
    unsupported = [what for marker, what in UNSUPPORTED.items() if marker in present]
    wanted = ", ".join(f"{f.check_file} ({g})" for g, f in GENERATIONS.items())
    if len(found) > 1:
        return None, f"it has the marker files of several layouts ({wanted})"
    if found and (found == ["v12"] or not unsupported):  # a v12 tree wins over vllm/sndr_core
        return found[0], None
    if unsupported:
        return None, (f"it is {unsupported[0]}, a layout rigfleet does not mount; pin a v7.x "
                      "or v12.x commit")
    return None, f"it has none of {wanted}"


def literal_assignments(scope: ast.Module | ast.ClassDef) -> dict[str, object]:
    """``NAME = <literal>`` and ``NAME: T = <literal>`` assignments directly in ``scope``."""
    out: dict[str, object] = {}
    for node in scope.body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name):
                with suppress(ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                    out[target.id] = ast.literal_eval(value)
    return out


def _parse(text: str, where: str) -> ast.Module:
    try:
        return ast.parse(text, where)
    except SyntaxError as e:
        raise InspectError(f"{where}: not valid Python: {e.msg} (line {e.lineno})") from None


def strings(value: object) -> list[str]:
    """The string items of a literal list/tuple/set (anything else: empty)."""
    items = value if isinstance(value, list | tuple | set | frozenset) else ()
    return [v for v in items if isinstance(v, str)]


def parse_allowlist(text: str, where: str) -> tuple[list[str], list[str]]:
    """(``KNOWN_GOOD_VLLM_PINS``, ``PROMOTION_PENDING_VLLM_PINS``) of a guards file."""
    if KNOWN_GOOD not in (values := literal_assignments(_parse(text, where))):
        raise InspectError(f"{where}: no literal {KNOWN_GOOD}")
    return strings(values[KNOWN_GOOD]), strings(values.get(PENDING))


def lifecycle(meta: Mapping[str, Any]) -> str:
    """A registry entry's lifecycle as Genesis derives it (compat/lifecycle.py get_state)."""
    if isinstance(explicit := meta.get("lifecycle"), str) and explicit:
        return explicit
    return "deprecated" if meta.get("deprecated") else "stable"


def switch_names(meta: Mapping[str, Any], files: GenesisLayout) -> list[tuple[str, str]]:
    """(switch suffix, ``env_flag``/``alias``) of each name that turns a registry entry on."""
    flag = meta.get("env_flag")
    named = [(flag, "env_flag")] if isinstance(flag, str) and flag else []
    named += [(a, "alias") for a in strings(meta.get("env_flag_aliases"))]
    out = []
    for name, via in named:
        prefix = next((p for p in files.switch_prefixes if name.startswith(p)), "")
        suffix = name[len(prefix):] if prefix or files.strips_prefix else ""
        if suffix:
            out.append((suffix, via))
    return out


def registry_literal(text: str, where: str) -> dict[str, dict[str, Any]]:
    """The ``PATCH_REGISTRY`` literal of a registry file: patch id -> its entry, as written."""
    if not isinstance(registry := literal_assignments(_parse(text, where)).get(REGISTRY), dict):
        raise InspectError(f"{where}: no literal {REGISTRY} dict")
    for pid, meta in registry.items():
        if not isinstance(pid, str) or not isinstance(meta, dict):
            raise InspectError(f"{where}: {REGISTRY}[{pid!r}] is not a patch entry (a dict)")
    return registry


def parse_registry(text: str, where: str, files: GenesisLayout) -> dict[str, Any]:
    """The ``registry`` part of the report, from a ``PATCH_REGISTRY`` file."""
    registry = registry_literal(text, where)
    switches: dict[str, list[list[str]]] = {}
    patches: dict[str, list[Any]] = {}
    for pid, meta in registry.items():
        state = lifecycle(meta)
        flag = meta.get("env_flag")
        patches[pid] = [flag if isinstance(flag, str) else None, state,
                        bool(meta.get("default_on"))]  # fmt: skip
        for suffix, via in switch_names(meta, files):
            switches.setdefault(suffix, []).append([pid, state, via])
    return {
        "file": files.registry_file,
        "patches": len(registry),
        "lifecycles": dict(sorted(Counter(state for _, state, _ in patches.values()).items())),
        "switch_prefixes": list(files.switch_prefixes),
        "retired_skipped": files.retired_skipped,
        "switches": dict(sorted(switches.items())),
        "patch_flags": patches,
    }


def parse_flags(text: str, where: str, registry: dict[str, Any]) -> list[str]:
    """(v12) ``Flags`` names no patch owns (orchestration flags), legacy patch ids left out."""
    names = {value for node in _parse(text, where).body
             if isinstance(node, ast.ClassDef) and node.name == "Flags"
             for value in literal_assignments(node).values() if isinstance(value, str)}
    legacy = {flag.split("_LEGACY_", 1)[1] for flag, _, _ in registry["patch_flags"].values()
              if isinstance(flag, str) and "_LEGACY_" in flag}
    return sorted(names - set(registry["switches"]) - legacy)


def parse_version(text: str, files: GenesisLayout) -> str | None:
    """The version the tree declares, as ``v<version>`` (None when it declares none)."""
    raw: object = None
    if files.version_file.endswith(".toml"):
        section = ""
        for stripped in map(str.strip, text.splitlines()):
            if stripped.startswith("["):
                section = stripped
            elif section == "[project]" and (m := _TOML_VERSION.fullmatch(stripped)):
                raw = m.group(1)
                break
    else:
        values = literal_assignments(_parse(text, files.version_file))
        raw = values.get("__version__", values.get("VERSION"))
    if not isinstance(raw, str) or not (m := _TAG_VERSION.fullmatch(raw.strip())):
        return None
    return f"v{m.group(1)}"


def inspect(source: Source, *, registry: bool = True) -> dict[str, Any]:
    """The report of one tree; ``registry=False`` skips the patch registry."""
    present = source.markers()
    layout, why = detect_layout(present)
    out: dict[str, Any] = {"schema": SCHEMA, "layout": layout, "markers": sorted(present),
                           "version": None, "version_file": None, "allowlist": None,
                           "registry": None, "flags": [], "errors": []}  # fmt: skip
    if layout is None:
        out["errors"].append(f"no Genesis layout rigfleet knows: {why}")
        return out
    files = GENERATIONS[layout]
    out["version_file"] = files.version_file
    if (version_text := source.read(files.version_file)) is not None:
        with suppress(InspectError):  # a version is for people; its absence blocks nothing
            out["version"] = parse_version(version_text, files)
    try:
        known, pending = parse_allowlist(read_file(source, files.allowlist_file, layout,
                                                   KNOWN_GOOD), files.allowlist_file)
        out["allowlist"] = {"file": files.allowlist_file, "known_good": known, "pending": pending}
    except InspectError as e:
        out["errors"].append(str(e))
    if not registry:
        return out
    try:
        out["registry"] = parse_registry(read_file(source, files.registry_file, layout, REGISTRY),
                                         files.registry_file, files)
        if files.flags_file and (text := source.read(files.flags_file)) is not None:
            out["flags"] = parse_flags(text, files.flags_file, out["registry"])
    except InspectError as e:
        out["errors"].append(str(e))
    return out


def read_file(source: Source, rel: str, layout: str, holds: str) -> str:
    if (text := source.read(rel)) is None:
        raise InspectError(f"{rel}: missing (where the {layout} layout keeps {holds})")
    return text


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[1].startswith("-"):
        print("usage: rigfleet-genesis-inspect.py <genesis tree or checkout>", file=sys.stderr)
        return 2
    if not (root := Path(argv[1])).is_dir():
        print(f"{root}: not a directory", file=sys.stderr)
        return 1
    report = inspect(DirSource(root))
    print(json.dumps(report, separators=(",", ":")))
    for error in report["errors"]:
        print(f"{root}: {error}", file=sys.stderr)
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
