"""``vllm.general_plugins`` entry point (``genesis_v7 = sndr.plugin:register``).

Importable without vLLM; applies once per process (vLLM may call it again); never raises on an
ordinary error. ``GENESIS_DISABLE=1`` turns it off, ``GENESIS_WIRING_APPLY=0`` only diagnoses.
"""

from __future__ import annotations

from sndr.kernel.orchestrate import plugin_register


def _load_run():
    from sndr.apply import run

    return run


def register() -> None:
    plugin_register(_load_run)

