"""The vLLM pin allowlist and the pin gate.

Entries are ``vllm.__version__`` strings in every form Genesis has met: release strings
(``0.21.0``), setuptools-scm forms with a 9-12 character sha (``0.23.1rc1.dev748+g2dfaae752``)
and docker-tag forms (``nightly-<sha>``); matching is exact. ``KNOWN_GOOD_VLLM_PINS`` are
validated, ``PROMOTION_PENDING_VLLM_PINS`` are tolerated with a caveat until promoted; both are
accepted by default. ``GENESIS_VLLM_PIN_POLICY=strict`` makes an unknown pin fatal (exit 2).
"""

from __future__ import annotations

from sndr.kernel.orchestrate import pin_gate, vllm_version

KNOWN_GOOD_VLLM_PINS: tuple[str, ...] = ()  # genesis-fixture: pins

PROMOTION_PENDING_VLLM_PINS: tuple[str, ...] = ()  # genesis-fixture: pending

# Validated Genesis patcher commits (prefixes of dev-branch commits).
KNOWN_GOOD_GENESIS_PINS: tuple[str, ...] = ()  # genesis-fixture: genesis-pins

GUARDS_FILE = "sndr/engines/vllm/detection/guards.py"


def get_vllm_full_version_string() -> str | None:
    """The full vllm version (``0.20.2rc1.dev9+g01d4d1ad3``), or None without vllm."""
    return vllm_version()


def assert_vllm_pin_allowed(policy: str | None = None) -> str:
    """``"ok"`` | ``"unknown"`` | ``"missing"``; strict policy exits 2 unless ok."""
    return pin_gate(get_vllm_full_version_string(), KNOWN_GOOD_VLLM_PINS,
                    PROMOTION_PENDING_VLLM_PINS, GUARDS_FILE,
                    "KNOWN_GOOD_VLLM_PINS (or PROMOTION_PENDING_VLLM_PINS for a not-yet-validated "
                    "candidate)", policy)
