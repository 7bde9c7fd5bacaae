#!/usr/bin/env python3
"""Write the extract of a real Genesis registry that the fixture's unit test compares against.

``tests/fixtures/genesis/<release>-registry.json`` holds facts only (ids, flag names,
lifecycles, ``default_on``, categories, ``applies_to``'s conditions and v12's
``applies_to.vllm_version_range``), read from a real tree with
``rigfleet/genesis_inspect.py``: every patch the testbed's Genesis fixture models
(``rigfleet_testbed.genesis_patches``), every patch the built-in stack files switch or need, and
every switch name of those patches or of the stack files (``[]`` where the tree has none). Run
it on checkouts of the real history (``../shared/upstream/genesis-dev-and-v12.1.0.bundle``)
after a stack file's Genesis switches change::

    git clone -q ../shared/upstream/genesis-dev-and-v12.1.0.bundle /tmp/g
    git -C /tmp/g worktree add /tmp/g7 7b9fd3194ee6efa1644973383cd44ee5604a5d85
    git -C /tmp/g worktree add /tmp/g12 v12.1.0
    .venv/bin/python scripts/genesis-registry-extract.py /tmp/g7 v7.72.2 7b9fd319...
    .venv/bin/python scripts/genesis-registry-extract.py /tmp/g12 v12.1.0 66e37841...
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path
from typing import Any

from rigfleet_testbed import genesis_patches

from rigfleet.catalog import builtin_catalog
from rigfleet.genesis_inspect import REGISTRY, DirSource, inspect, literal_assignments

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "genesis"


def _order(pid: str) -> tuple[bool, int, str]:
    return pid.startswith("PN"), int("".join(c for c in pid if c.isdigit()) or 0), pid


def extract(tree: Path, release: str, commit: str) -> dict[str, Any]:
    report = inspect(DirSource(tree))
    if report["errors"]:
        raise SystemExit(f"{tree}: {'; '.join(report['errors'])}")
    layout, reg = report["layout"], report["registry"]
    raw = literal_assignments(ast.parse((tree / reg["file"]).read_text(encoding="utf-8")))
    entries = raw[REGISTRY]
    assert isinstance(entries, dict)
    specs = [s.genesis for s in builtin_catalog().stacks.values() if s.genesis is not None]
    names = {n for g in specs for on, off in g.switches.values() for n in (*on, *off)} | {"P4"}
    ids = {p.pid for p in genesis_patches.PATCHES} | {n for g in specs for n in g.needs}
    ids |= {t[0] for n in names for t in reg["switches"].get(n, [])}
    missing = sorted(ids - set(reg["patch_flags"]))
    if missing:
        raise SystemExit(f"{tree}: no patch {', '.join(missing)} in {reg['file']}")
    patches = {}
    for pid in sorted(ids, key=_order):
        flag, lifecycle, default_on = reg["patch_flags"][pid]
        entry: dict[str, Any] = {"env_flag": flag, "lifecycle": lifecycle,
                                 "default_on": default_on,
                                 "category": entries[pid].get("category")}
        conditions = {k: list(v) if isinstance(v, tuple) else v
                      for k, v in (entries[pid].get("applies_to") or {}).items()
                      if k != "vllm_version_range"}
        if conditions:
            entry["conditions"] = conditions
        if layout == "v12":
            r = (entries[pid].get("applies_to") or {}).get("vllm_version_range")
            entry["vllm_version_range"] = list(r) if isinstance(r, tuple) else r
        patches[pid] = entry
    switches = {s: t for s, t in reg["switches"].items() if any(x[0] in ids for x in t)}
    for name in names:
        switches.setdefault(name, reg["switches"].get(name, []))
    return {
        "source": f"Genesis {release} (commit {commit}), {reg['file']} PATCH_REGISTRY, from "
                  "../shared/upstream/genesis-dev-and-v12.1.0.bundle, written by "
                  "scripts/genesis-registry-extract.py: patch_flags and switches as "
                  "rigfleet/genesis_inspect.py reports them, category and applies_to's other "
                  "conditions (conditions) from the literal"
                  + (", applies_to.vllm_version_range from the literal" if layout == "v12" else "")
                  + ". Patches: those the testbed's Genesis fixture models, the stack files' "
                  "needs and every patch a stack file's switch names; switches: every switch of "
                  "those patches, and each stack file switch name (plus P4), [] where no patch "
                  "has it.",
        "genesis": release, "commit": commit, "layout": layout, "registry_file": reg["file"],
        "patches_in_registry": reg["patches"], "patches": patches,
        "switches": dict(sorted(switches.items())),
    }  # fmt: skip


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="genesis-registry-extract.py",
                                description=(__doc__ or "").splitlines()[0],
                                epilog="Writes tests/fixtures/genesis/<release>-registry.json.")
    p.add_argument("tree", type=Path, help="a checkout of the real Genesis tree")
    p.add_argument("release", help="its release name, e.g. v12.1.0")
    p.add_argument("commit", help="its commit (40 hex)")
    args = p.parse_args(argv[1:])
    out = OUT / f"{args.release}-registry.json"
    out.write_text(json.dumps(extract(args.tree, args.release, args.commit), indent=1) + "\n",
                   encoding="utf-8")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
