"""The apply loop both layouts share: pin gate, typo guard, per-patch lines, the results line.

Each layout decides per patch (``Decision``) with its own rules (v7: the env switch alone;
v12: plus lifecycle and version range; in both a legacy patch, ``env_flag``
``GENESIS_LEGACY_<id>``, applies on every apply) and hands the decisions to
:func:`run_patches`::

    status = pin_gate(pin, KNOWN_GOOD, PENDING, guards_rel="vllm/_genesis/guards.py")
    results = run_patches(decisions, TEXT_PATCHES, vllm_dir, apply=True)

Log lines (people and tools grep them):

- ``[Genesis pin-gate] running vllm pin = <pin>``, ``... allowlist (N entries): [...]``,
  ``... OK — ...``, ``WARNING [Genesis pin-gate] UNKNOWN — ...``, ``... STRICT FAIL: ...``;
- one line per patch whose switch is set, and per legacy patch:
  ``[Genesis] P67 [ON] <title> — text-patched <file>``,
  ``[OFF]`` (switched off), ``[SKIP]`` (retired, out of range, drift), ``[FAIL]``,
  ``[DRY]`` (``--dry-run``);
- ``Genesis Results: <a> applied, <s> skipped, <f> failed``.
"""

from __future__ import annotations

import difflib
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from .textpatch import TextPatch, apply_text_patch

TRUTHY = frozenset({"1", "true", "yes", "on"})
FALSY = frozenset({"0", "false", "no", "off", ""})
PIN_POLICY_ENV = "GENESIS_VLLM_PIN_POLICY"
LEGACY_PREFIX = "GENESIS_LEGACY_"
TYPO_GUARD_STRICT_ENV = "GENESIS_TYPO_GUARD_STRICT"


def out(line: str) -> None:
    print(line, flush=True)


def err(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def truthy(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() in TRUTHY


class SetupError(Exception):
    """The orchestrator cannot run at all (exit status 2)."""


@dataclass(frozen=True)
class Decision:
    """Whether one registered patch applies, and why (``explicit``: its switch is set)."""

    patch_id: str
    title: str
    apply: bool
    reason: str
    explicit: bool
    state: str = ""  # the bracketed state when not applied: OFF or SKIP
    note: str = ""  # a caveat printed with the outcome ("[lifecycle research]")


def env_decision(patch_id: str, title: str, env_flag: str, env: Mapping[str, str]) -> Decision:
    """Opt-in: a truthy switch applies, unset skips, falsy or unknown values switch it off."""
    raw = env.get(env_flag)
    if raw is None:
        return Decision(patch_id, title, False, "opt-in not set", False, "OFF")
    value = raw.strip().lower()
    if value in TRUTHY:
        return Decision(patch_id, title, True, f"{env_flag}={raw}", True)
    if value in FALSY:
        return Decision(patch_id, title, False, f"disabled by {env_flag}={raw}", True, "OFF")
    return Decision(patch_id, title, False, f"unrecognised value {env_flag}={raw!r}", True, "OFF")


def is_legacy(env_flag: str) -> bool:
    """A legacy patch: its ``GENESIS_LEGACY_<id>`` flag is no switch; its hook always runs."""
    return env_flag.startswith(LEGACY_PREFIX)


def legacy_decision(patch_id: str, title: str, env_flag: str, note: str = "") -> Decision:
    """A legacy patch applies on every apply, whatever the environment says (its text patch
    still skips itself where vLLM has the fix: the anchor is gone)."""
    return Decision(patch_id, title, True, f"legacy patch, applied on every apply ({env_flag} "
                    "is no switch)", True, note=note)


def unknown_enable_flags(env: Mapping[str, str], flags: Iterable[str]
                         ) -> list[tuple[str, str | None]]:
    """``GENESIS_ENABLE_*`` variables no patch registers, each with the closest registered one."""
    known = sorted(set(flags))
    found = []
    for key in sorted(env):
        if key.startswith("GENESIS_ENABLE_") and key not in known:
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            found.append((key, close[0] if close else None))
    return found


def typo_guard(env: Mapping[str, str], flags: Iterable[str]) -> None:
    """Warn about unregistered switches; ``GENESIS_TYPO_GUARD_STRICT=1`` makes it an error."""
    typos = unknown_enable_flags(env, flags)
    for key, close in typos:
        hint = f" — did you mean {close}?" if close else " (no such patch in this Genesis)"
        err(f"WARNING [Genesis typo-guard] {key} is not a registered patch flag{hint}")
    if typos and truthy(env, TYPO_GUARD_STRICT_ENV):
        raise SetupError(f"unknown GENESIS_ENABLE_* flags with {TYPO_GUARD_STRICT_ENV}=1")


def vllm_version() -> str | None:
    """``vllm.__version__`` of this interpreter's vllm, or None when vllm is not importable."""
    try:
        import vllm
    except Exception:  # any import failure means "no usable vllm" for the gate
        return None
    version = getattr(vllm, "__version__", None)
    return str(version) if version else None


def vllm_package_dir() -> str | None:
    """Directory of the imported vllm package (the files text patches edit), or None."""
    try:
        import vllm
    except Exception:
        return None
    path = getattr(vllm, "__file__", None)  # None for a namespace package (no __init__.py)
    return os.path.dirname(os.path.abspath(path)) if path else None


def pin_gate(pin: str | None, known_good: tuple[str, ...], pending: tuple[str, ...],
             guards_rel: str, accept_hint: str, policy: str | None = None,
             env: Mapping[str, str] | None = None) -> str:
    """Check the running vLLM against the allowlist: ``"ok"``, ``"unknown"`` or ``"missing"``.

    Policy: argument > ``$GENESIS_VLLM_PIN_POLICY`` > ``"warn"`` (any other value is warn). In
    strict mode anything but ok ends the process with ``sys.exit(2)``.
    """
    env = os.environ if env is None else env
    value = (policy if policy is not None else env.get(PIN_POLICY_ENV, "warn")) or "warn"
    strict = value.strip().lower() == "strict"
    allowed = list(known_good) + list(pending)  # both accepted, counted as Genesis counts
    out(f"[Genesis pin-gate] running vllm pin = {pin if pin is not None else 'missing'}")
    out(f"[Genesis pin-gate] allowlist ({len(allowed)} entries): {allowed}")
    if pin is not None and pin in known_good:
        out(f"[Genesis pin-gate] OK — vllm pin {pin} is on the Genesis allowlist")
        return "ok"
    if pin is not None and pin in pending:
        out(f"[Genesis pin-gate] OK (CAVEAT) — vllm pin {pin} is PROMOTION_PENDING: accepted, "
            "not yet bench-validated")
        return "ok"
    if pin is None:
        status, message = "missing", (
            "MISSING — vllm is not importable (or has no __version__), so its pin cannot be "
            f"checked against the Genesis known-good list ({len(allowed)} entries).")
    else:
        status, message = "unknown", (
            f"UNKNOWN — vllm pin '{pin}' is NOT on the Genesis known-good list ({len(allowed)} "
            f"entries). Allowed pins: {allowed}. To accept this pin, add it to {accept_hint} in "
            f"{guards_rel} and document the validation in CHANGELOG.")
    if strict:
        err(f"[Genesis pin-gate] STRICT FAIL: {message}")
        sys.exit(2)
    err(f"WARNING [Genesis pin-gate] {message}")
    return status


@dataclass
class Results:
    applied: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    would_apply: list[str] = field(default_factory=list)

    def line(self) -> str:
        text = (f"Genesis Results: {len(self.applied)} applied, {len(self.skipped)} skipped, "
                f"{len(self.failed)} failed")
        return text + (f" (dry-run: {len(self.would_apply)} would apply)"
                       if self.would_apply else "")


def _line(pid: str, state: str, text: str) -> str:
    return f"[Genesis] {pid:<5} [{state}] {text}"


def run_patches(decisions: list[Decision], text_patches: Mapping[str, TextPatch],
                vllm_dir: str, apply: bool = True) -> Results:
    """Apply what the decisions enable; text patches edit files, the rest are rebinds."""
    started = time.monotonic()
    enabled = [d.patch_id for d in decisions if d.apply]
    out(f"[Genesis Dispatcher] {len(decisions)} patches registered, {len(enabled)} enabled: "
        + (", ".join(enabled) if enabled else "(none)"))
    results = Results()
    for d in decisions:
        if not d.apply:
            results.skipped.append(d.patch_id)
            if d.explicit:
                out(_line(d.patch_id, d.state or "SKIP", f"{d.title} — {d.reason}"))
            continue
        patch = text_patches.get(d.patch_id)
        if patch is None:
            outcome_status, reason = "applied", "rebind (in memory)"
            if not apply:
                outcome_status, reason = "applied", "would rebind"
        else:
            o = apply_text_patch(vllm_dir, patch, write=apply)
            outcome_status, reason = o.status, o.reason
        if outcome_status == "applied" and not apply:
            results.would_apply.append(d.patch_id)
            out(_line(d.patch_id, "DRY", f"{d.title} — {reason}"))
        elif outcome_status == "applied":
            results.applied.append(d.patch_id)
            out(_line(d.patch_id, "ON", f"{d.title} — {reason}{d.note}"))
        elif outcome_status == "skipped":
            results.skipped.append(d.patch_id)
            out(_line(d.patch_id, "SKIP", f"{d.title} — {reason}"))
        else:
            results.failed.append(d.patch_id)
            err(_line(d.patch_id, "FAIL", f"{d.title} — {reason}"))
    out(results.line())
    out(f"[Genesis] apply elapsed {time.monotonic() - started:.2f}s")
    return results


_REGISTERED: list[bool] = []


def plugin_register(load_run: Callable[[], Callable[..., Results]], env: Mapping[str, str]
                    | None = None) -> None:
    """The ``vllm.general_plugins`` hook: run the apply once per process, never raise.

    ``GENESIS_DISABLE=1`` turns it off, ``GENESIS_WIRING_APPLY=0`` diagnoses without applying.
    ``SystemExit`` from the strict pin gate is not an ``Exception`` and still stops vLLM.
    """
    env = os.environ if env is None else env
    if truthy(env, "GENESIS_DISABLE"):
        out("[Genesis plugin] GENESIS_DISABLE set: not loading Genesis")
        return
    if _REGISTERED:
        out("[Genesis plugin] register() complete: already applied in this process")
        return
    apply = env.get("GENESIS_WIRING_APPLY", "1").strip().lower() not in ("0", "false", "no")
    try:
        results = load_run()(apply=apply)
    except Exception:  # a plugin must never take vLLM down with an ordinary error
        err("[Genesis plugin] register() failed:")
        traceback.print_exc()
        return
    _REGISTERED.append(True)
    out(f"[Genesis plugin] register() complete: {len(results.applied)} applied, "
        f"{len(results.skipped)} skipped, {len(results.failed)} failed (apply={apply})")


def run_apply(banner: str, gate: Callable[[], str], flags: Iterable[str],
              decide: Callable[[Mapping[str, str]], list[Decision]],
              text_patches: Mapping[str, TextPatch], mount_hint: str, apply: bool = True,
              env: Mapping[str, str] | None = None) -> Results:
    """Banner, pin gate, typo guard, then the patches. Raises SetupError; strict gate exits 2."""
    env = os.environ if env is None else env
    out(banner)
    gate()
    typo_guard(env, flags)
    vllm_dir = vllm_package_dir()
    if vllm_dir is None:
        raise SetupError(f"cannot locate the vllm package directory (vllm not importable); "
                         f"{mount_hint}")
    return run_patches(decide(env), text_patches, vllm_dir, apply=apply)


def cli_main(prog: str, run: Callable[..., Results], argv: list[str] | None = None) -> int:
    """``[--dry-run] [--verify-rebinds]``; exit 0 (no patch failed), 1 (a patch FAILED) or 2
    (orchestrator setup error; the strict pin gate exits 2 by itself)."""
    import argparse

    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--dry-run", action="store_true", help="diagnose only, change nothing")
    parser.add_argument("--verify-rebinds", action="store_true",
                        help="check monkey-patch rebinds are live")
    args = parser.parse_args(argv)
    try:
        results = run(apply=not args.dry_run)
    except SetupError as exc:
        err(f"[Genesis] orchestrator setup error: {exc}")
        return 2
    if args.verify_rebinds:
        # Rebinds made by this process are gone once it exits; the plugin path makes them live.
        out("[Genesis] verify-rebinds: rebinds live only in the process that made them (use "
            "the vLLM general plugin)")
    return 1 if results.failed else 0
