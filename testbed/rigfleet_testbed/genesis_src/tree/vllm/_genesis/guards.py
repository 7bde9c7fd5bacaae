"""Boot-time guards: the vLLM pin gate.

Genesis is validated against specific vLLM builds. ``KNOWN_GOOD_VLLM_PINS`` lists them as the
full ``vllm.__version__`` string (PEP 440 with the local ``+g<abbrev sha>``), compared by exact
string membership. ``apply_all`` calls :func:`assert_vllm_pin_allowed` before any patch.

Policy (argument > env ``GENESIS_VLLM_PIN_POLICY`` > ``"warn"``; any other value is ``"warn"``):

- ``warn``: an unknown pin is logged as a WARNING and boot continues;
- ``strict``: an unknown (or undeterminable) pin prints ``STRICT FAIL`` and exits with status 2.

To accept a new pin, add it to ``KNOWN_GOOD_VLLM_PINS`` and document the validation in
CHANGELOG.md.
"""

from __future__ import annotations

import os
import sys

KNOWN_GOOD_VLLM_PINS: tuple[str, ...] = ()  # genesis-fixture: pins

PIN_POLICY_ENV = "GENESIS_VLLM_PIN_POLICY"
POLICIES = ("warn", "strict")


def _out(line: str) -> None:
    print(line, flush=True)


def _err(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def get_vllm_full_version_string() -> str | None:
    """``vllm.__version__`` of the running interpreter, or None if vllm is not importable."""
    try:
        import vllm
    except Exception:  # any import failure means "no usable vllm" for the gate
        return None
    version = getattr(vllm, "__version__", None)
    return str(version) if version else None


def resolve_pin_policy(policy: str | None = None) -> str:
    """The effective policy: argument, else ``$GENESIS_VLLM_PIN_POLICY``, else ``"warn"``."""
    value = policy if policy is not None else os.environ.get(PIN_POLICY_ENV, "warn")
    value = (value or "warn").strip().lower()
    return value if value in POLICIES else "warn"


def assert_vllm_pin_allowed(policy: str | None = None) -> str:
    """Check the running vLLM against the allowlist: ``"ok"``, ``"unknown"`` or ``"missing"``.

    In strict mode anything but ``"ok"`` ends the process with ``sys.exit(2)``.
    """
    effective = resolve_pin_policy(policy)
    pin = get_vllm_full_version_string()
    allowed = list(KNOWN_GOOD_VLLM_PINS)
    if pin is not None and pin in KNOWN_GOOD_VLLM_PINS:
        _out(f"[Genesis pin-gate] OK — vllm pin {pin} is on the Genesis allowlist")
        return "ok"
    if pin is None:
        status = "missing"
        message = (
            "MISSING — vllm is not importable (or has no __version__), so its pin cannot be "
            f"checked against the Genesis known-good list ({len(allowed)} entries). "
            f"Allowed pins: {allowed}."
        )
    else:
        status = "unknown"
        message = (
            f"UNKNOWN — vllm pin '{pin}' is NOT on the Genesis known-good list "
            f"({len(allowed)} entries). Allowed pins: {allowed}. To accept this pin, add it to "
            "KNOWN_GOOD_VLLM_PINS in vllm/_genesis/guards.py and document the validation in "
            "CHANGELOG."
        )
    if effective == "strict":
        _err(f"[Genesis pin-gate] STRICT FAIL: {message}")
        sys.exit(2)
    _err(f"WARNING [Genesis pin-gate] {message}")
    return status
