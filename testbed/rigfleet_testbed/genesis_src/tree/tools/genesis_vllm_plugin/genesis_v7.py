"""vLLM general plugin: run Genesis in every vLLM process (API server and spawned workers).

Install inside the container (the mount is read-only, editable installs need a writable copy)::

    cp -r /plugin /tmp/genesis_vllm_plugin && pip install --no-deps -e /tmp/genesis_vllm_plugin

vLLM calls :func:`register` from ``load_general_plugins()``, possibly several times per process,
so it must be idempotent (the apply marker makes it so). ``GENESIS_DISABLE=1`` turns it off,
``GENESIS_WIRING_APPLY=0`` runs the diagnosis without applying. Errors are logged, never raised;
``SystemExit`` from the strict pin gate is not an ``Exception`` and still stops the process.
"""

from __future__ import annotations

import os
import sys
import traceback

_OFF = ("1", "true", "yes")


def register() -> None:
    if os.environ.get("GENESIS_DISABLE", "").strip().lower() in _OFF:
        print("[Genesis plugin] GENESIS_DISABLE set: not loading Genesis", flush=True)
        return
    apply = os.environ.get("GENESIS_WIRING_APPLY", "1").strip().lower() not in ("0", "false", "no")
    try:
        from vllm._genesis.patches.apply_all import run

        results = run(apply=apply)
    except Exception:  # a plugin must never take vLLM down with an ordinary error
        print("[Genesis plugin] register() failed:", file=sys.stderr, flush=True)
        traceback.print_exc()
        return
    print(
        f"[Genesis plugin] register() complete: {len(results.applied)} applied, "
        f"{len(results.skipped)} skipped, {len(results.failed)} failed (apply={apply})",
        flush=True,
    )
