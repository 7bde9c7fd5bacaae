"""Apply the enabled Genesis patches to the vLLM installation this interpreter imports.

    python3 -m vllm._genesis.patches.apply_all [--dry-run] [--verify-rebinds]

Order: the pin gate first (:func:`vllm._genesis.guards.assert_vllm_pin_allowed`), then the typo
guard, then every registered patch (:mod:`vllm._genesis.dispatcher`) whose env flag is truthy.
Applied patches are recorded in ``<vllm package dir>/_genesis_applied.json``::

    {"genesis_version": "v7.72.2", "applied": ["P58", "P67"]}

That file lives next to the (read-only mounted) ``_genesis`` package, i.e. in the container's
writable layer, like the text patches themselves: it survives ``docker stop``/``start`` and is
gone when the container is recreated. A patch already recorded there is skipped ("already
applied"), so running twice in one container is safe. P87 also edits its target file
(``model_executor/kernels/linear/mixed_precision/marlin.py``); when that path is read-only (a
bind-mounted overlay) the patch FAILS with ``[Errno 30] Read-only file system``.

Exit status: 0 = no patch failed; 1 = at least one patch FAILED; 2 = orchestrator setup error
(vllm package not locatable, strict typo guard); the pin gate in strict mode exits 2 itself.
Log lines: ``[Genesis] applied: P67 ...``, ``[Genesis] FAILED: P87 ...``,
``Genesis Results: <a> applied, <s> skipped, <f> failed``, ``[Genesis] apply_all elapsed <t>s``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from vllm._genesis.__version__ import VERSION
from vllm._genesis.dispatcher import (
    REGISTRY,
    TRUTHY,
    TYPO_GUARD_STRICT_ENV,
    Decision,
    decide_all,
    unknown_enable_flags,
)
from vllm._genesis.guards import (
    KNOWN_GOOD_VLLM_PINS,
    assert_vllm_pin_allowed,
    get_vllm_full_version_string,
)

MARKER_NAME = "_genesis_applied.json"
# Patches whose application edits their target file on disk (the rest are recorded only).
TEXT_PATCHES = frozenset({"P87"})
_SENTINEL_TAG = "# [Genesis {patch_id}]"


class SetupError(Exception):
    """The orchestrator cannot run at all (exit status 2)."""


@dataclass
class Results:
    applied: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    would_apply: list[str] = field(default_factory=list)


def _out(line: str) -> None:
    print(line, flush=True)


def _err(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def vllm_package_dir() -> str | None:
    """Directory of the imported vllm package (where ``_genesis`` is mounted), or None."""
    try:
        import vllm
    except Exception:
        return None
    path = getattr(vllm, "__file__", None)  # None for a namespace package (no __init__.py)
    return os.path.dirname(os.path.abspath(path)) if path else None


def read_marker(vllm_dir: str) -> list[str]:
    """Patch ids recorded by earlier runs in this vllm directory ([] if none or unreadable)."""
    try:
        with open(os.path.join(vllm_dir, MARKER_NAME), encoding="utf-8") as fh:
            data = json.load(fh)
        return [str(p) for p in data.get("applied", [])]
    except (OSError, ValueError, AttributeError):
        return []


def write_marker(vllm_dir: str, applied: list[str]) -> None:
    """Record ``applied`` (registry order), atomically: a reader never sees half a file."""
    order = {p.patch_id: i for i, p in enumerate(REGISTRY)}
    ids = sorted(set(applied), key=lambda pid: (order.get(pid, len(order)), pid))
    path = os.path.join(vllm_dir, MARKER_NAME)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"genesis_version": VERSION, "applied": ids}, fh, indent=1)
        fh.write("\n")
    os.replace(tmp, path)


def _text_patch(vllm_dir: str, decision: Decision) -> None:
    """Edit the patch's target file (append the Genesis sentinel); raises OSError on failure."""
    target = os.path.join(vllm_dir, decision.patch.target)
    tag = _SENTINEL_TAG.format(patch_id=decision.patch.patch_id)
    if os.path.exists(target):
        with open(target, encoding="utf-8", errors="replace") as fh:
            if tag in fh.read():
                return  # patched earlier in this container's writable layer
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target, "a", encoding="utf-8") as fh:
        fh.write(f"{tag} applied by Genesis {VERSION}\n")


def run(apply: bool = True, env: Mapping[str, str] | None = None) -> Results:
    """Gate, decide and apply; returns the tallies. Raises SetupError; strict gate exits 2."""
    env = os.environ if env is None else env
    started = time.monotonic()
    _out(f"[Genesis] apply_all {VERSION} starting (apply={apply})")
    pin = get_vllm_full_version_string()
    _out(f"[Genesis pin-gate] running vllm pin = {pin if pin is not None else 'missing'}")
    allowed = list(KNOWN_GOOD_VLLM_PINS)
    _out(f"[Genesis pin-gate] allowlist ({len(allowed)} entries): {allowed}")
    assert_vllm_pin_allowed()

    typos = unknown_enable_flags(env)
    for key, close in typos:
        hint = f" — did you mean {close}?" if close else ""
        _err(f"WARNING [Genesis typo-guard] {key} is not a registered patch flag{hint}")
    if typos and env.get(TYPO_GUARD_STRICT_ENV, "").strip().lower() in TRUTHY:
        raise SetupError(f"unknown GENESIS_ENABLE_* flags with {TYPO_GUARD_STRICT_ENV}=1")

    vllm_dir = vllm_package_dir()
    if vllm_dir is None:
        raise SetupError(
            "cannot locate the vllm package directory (vllm not importable); mount "
            "vllm/_genesis into <site-packages>/vllm/_genesis"
        )

    decisions = decide_all(env)
    enabled = [d.patch.patch_id for d in decisions if d.apply]
    _out(
        f"[Genesis Dispatcher] {len(decisions)} patches registered, {len(enabled)} enabled: "
        + (", ".join(enabled) if enabled else "(none)")
    )
    results = Results()
    recorded = read_marker(vllm_dir)
    for d in decisions:
        pid = d.patch.patch_id
        if not d.apply:
            results.skipped.append(pid)
            if d.explicit:
                _out(f"[Genesis] skipped: {pid} ({d.reason})")
            continue
        if pid in recorded:
            results.skipped.append(pid)
            _out(f"[Genesis] skipped: {pid} (already applied — idempotency marker)")
            continue
        if not apply:
            results.would_apply.append(pid)
            _out(f"[Genesis] dry-run: would apply {pid} — {d.patch.title}")
            continue
        try:
            if pid in TEXT_PATCHES:
                _text_patch(vllm_dir, d)
            write_marker(vllm_dir, [*recorded, pid])
        except OSError as exc:
            results.failed.append(pid)
            _err(f"[Genesis] FAILED: {pid} — {d.patch.title}: {exc}")
            continue
        recorded.append(pid)
        results.applied.append(pid)
        _out(f"[Genesis] applied: {pid} — {d.patch.title}")

    summary = (
        f"Genesis Results: {len(results.applied)} applied, {len(results.skipped)} skipped, "
        f"{len(results.failed)} failed"
    )
    if not apply:
        summary += f" (dry-run: {len(results.would_apply)} would apply)"
    _out(summary)
    _out(f"[Genesis] apply_all elapsed {time.monotonic() - started:.2f}s")
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m vllm._genesis.patches.apply_all")
    parser.add_argument("--dry-run", action="store_true", help="diagnose only, change nothing")
    parser.add_argument(
        "--verify-rebinds", action="store_true", help="check monkey-patch rebinds are live"
    )
    args = parser.parse_args(argv)
    try:
        results = run(apply=not args.dry_run)
    except SetupError as exc:
        _err(f"[Genesis] orchestrator setup error: {exc}")
        return 2
    if args.verify_rebinds:
        # This release's patches are all text patches: there is no in-memory rebind to check.
        _out("[Genesis] verify-rebinds: 0 rebinds registered, nothing to verify")
    return 1 if results.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
