"""vLLM general plugin: run Genesis in every vLLM process (API server and spawned workers).

Install inside the container (the mount is read-only, editable installs need a writable copy)::

    cp -r /plugin /tmp/genesis_vllm_plugin && pip install --no-deps -e /tmp/genesis_vllm_plugin

vLLM calls :func:`register` from ``load_general_plugins()``, possibly several times per process;
it applies once per process. ``GENESIS_DISABLE=1`` turns it off, ``GENESIS_WIRING_APPLY=0``
runs the diagnosis without applying. Errors are logged, never raised; ``SystemExit`` from the
strict pin gate is not an ``Exception`` and still stops the process.
"""

from __future__ import annotations


def register() -> None:
    try:
        from vllm._genesis.kernel.orchestrate import plugin_register
    except Exception:
        print("[Genesis plugin] vllm._genesis package not importable — skipping.", flush=True)
        return

    def load_run():
        from vllm._genesis.patches.apply_all import run

        return run

    plugin_register(load_run)
