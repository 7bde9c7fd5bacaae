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

from vllm._genesis.kernel.orchestrate import pin_gate, vllm_version

KNOWN_GOOD_VLLM_PINS: tuple[str, ...] = ()  # genesis-fixture: pins

GUARDS_FILE = "vllm/_genesis/guards.py"


def get_vllm_full_version_string() -> str | None:
    """``vllm.__version__`` of the running interpreter, or None if vllm is not importable."""
    return vllm_version()


def assert_vllm_pin_allowed(policy: str | None = None) -> str:
    """Check the running vLLM against the allowlist: ``"ok"``, ``"unknown"`` or ``"missing"``.

    In strict mode anything but ``"ok"`` ends the process with ``sys.exit(2)``.
    """
    return pin_gate(get_vllm_full_version_string(), KNOWN_GOOD_VLLM_PINS, (), GUARDS_FILE,
                    "KNOWN_GOOD_VLLM_PINS", policy)
