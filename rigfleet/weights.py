"""Model weights on a host: one read-only directory per revision (docs/converge.md), the
``WeightsDirs`` fact and what to prune::

    dirs = read_fact(WeightsDirs, model_dir="/srv/models",
                     compose_files=("/var/lib/rigfleet/active/compose.yaml",))
    stale_weights(dirs, "qwen", revision)        # ['qwen@0123456789ab']
    retired_weights(dirs, {"qwen"})              # ['old-model@89abcdef0123']
    prunable(dirs, [("qwen", revision)])         # both
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Set
from dataclasses import dataclass, field

from pyinfra.api import FactBase
from typing_extensions import override

from rigfleet.hostside.layout import HOST, WEIGHTS_REVISION_CHARS, WEIGHTS_REVISION_MARK
from rigfleet.retention import stale

PARTIAL_SUFFIX = ".partial"


def revision_name(local_dir: str, revision: str) -> str:
    """The revision's directory name (``Layout.weights_dir``): ``<local_dir>@<rev[:12]>``."""
    return HOST.weights_dir("/", local_dir, revision).name


@dataclass(frozen=True)
class WeightsEntry:
    """One entry of the model directory: ``kind`` ``dir``, ``partial`` (not yet verified) or
    ``link`` (the old name, adopted: ``target`` is the revision's name)."""

    name: str
    kind: str
    mtime: int
    target: str | None = None


@dataclass(frozen=True)
class WeightsDirsState:
    """The entries of one ``local_dir`` (by name) and the names compose files mount."""

    entries: dict[str, WeightsEntry] = field(default_factory=dict)
    referenced: frozenset[str] = frozenset()


class WeightsDirs(FactBase[WeightsDirsState]):
    """The entries of ``<model_dir>`` (``WeightsEntry``) and the names compose files mount."""

    default = WeightsDirsState

    @override
    def command(self, model_dir: str, compose_files: tuple[str, ...] = ()) -> str:
        d = shlex.quote(model_dir.rstrip("/"))
        command = (
            f"for e in {d}/* {d}/.*{WEIGHTS_REVISION_MARK}*{PARTIAL_SUFFIX}; do "
            'if [ -L "$e" ]; then '
            'echo "link $(stat -c %Y "$e") $(basename "$e") $(readlink "$e")"; '
            'elif [ -d "$e" ]; then echo "dir $(stat -c %Y "$e") $(basename "$e")"; '
            "fi; done"
        )
        if compose_files:
            literal = re.sub(r"([.\[\]()*+?{}|^$\\])", r"\\\1", model_dir.rstrip("/"))  # in an ERE
            # after a space, or the quote YAML opens a scalar with (" #" in the path)
            pattern = shlex.quote(f"[[:space:]']{literal}/[^/[:space:]:]+:")
            command += (f"; cat {shlex.join(compose_files)} 2>/dev/null | grep -oE {pattern} "
                        "| sort -u | sed 's|^.*/|ref |; s|:$||'")
        return command + "; true"

    @override
    def process(self, output: list[str]) -> WeightsDirsState:
        entries: dict[str, WeightsEntry] = {}
        referenced: set[str] = set()
        for line in output:
            match line.split():
                case ["ref", name]:
                    referenced.add(name)
                case ["dir", mtime, name] if mtime.isdigit():
                    partial = name.startswith(".") and name.endswith(PARTIAL_SUFFIX)
                    entries[name] = WeightsEntry(name, "partial" if partial else "dir", int(mtime))
                case ["link", mtime, name, *to] if mtime.isdigit() and len(to) <= 1:
                    entries[name] = WeightsEntry(name, "link", int(mtime), to[0] if to else None)
        return WeightsDirsState(entries, frozenset(referenced))


def _owner(entry: WeightsEntry) -> str | None:
    """The ``local_dir`` of a revision directory, its partial download or its old-name link;
    None for anything else (a real directory under the old name is someone's: never pruned)."""
    name = entry.name
    if entry.kind == "link":
        return name
    if entry.kind == "partial":
        name = name[1:].removesuffix(PARTIAL_SUFFIX)
    head, mark, rev = name.rpartition(WEIGHTS_REVISION_MARK)
    revision = re.fullmatch(f"[0-9a-f]{{{WEIGHTS_REVISION_CHARS}}}", rev)
    return head if mark and head and revision else None


def _mounted(dirs: WeightsDirsState) -> set[str]:
    """Every name a compose file mounts and, for a mounted link, the directory it points to."""
    entries = [dirs.entries.get(name) for name in dirs.referenced]
    return {*dirs.referenced, *(e.target.rstrip("/").rsplit("/", 1)[-1] for e in entries
                                if e is not None and e.kind == "link" and e.target)}


def stale_weights(dirs: WeightsDirsState, local_dir: str, revision: str) -> list[str]:
    """The names of ``local_dir``'s revisions to remove (sorted): all but the pinned revision and
    those a compose file mounts (``dirs`` read with every compose file; docs/converge.md)."""
    candidates = {e.name: float(e.mtime) for e in dirs.entries.values() if _owner(e) == local_dir}
    pinned = revision_name(local_dir, revision)  # kept whatever its age, with its download
    return stale(candidates, pinned, {f".{pinned}{PARTIAL_SUFFIX}", *_mounted(dirs)}, keep=1)


def retired_weights(dirs: WeightsDirsState, served: Set[str]) -> list[str]:
    """The revisions, partial downloads and old-name links of every model that no staged stack
    serves (``served``: the ``local_dir`` of those that are), unless a compose file mounts them."""
    # A model is retired by its revisions; an old-name link alone does not name one.
    retired = {m for e in dirs.entries.values()
               if e.kind != "link" and (m := _owner(e)) and m not in served}
    mounted = _mounted(dirs)
    return sorted(e.name for e in dirs.entries.values()
                  if e.name not in mounted and _owner(e) in retired)


def prunable(dirs: WeightsDirsState, pinned: Iterable[tuple[str, str]]) -> list[str]:
    """``stale_weights`` of each ``pinned`` (local_dir, revision) and ``retired_weights``."""
    pins = tuple(pinned)
    return sorted({*(n for local_dir, revision in pins
                     for n in stale_weights(dirs, local_dir, revision)),
                   *retired_weights(dirs, {local_dir for local_dir, _ in pins})})
