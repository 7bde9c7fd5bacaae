"""Apply the enabled Genesis patches to the vLLM installation this interpreter imports.

    python3 -m vllm._genesis.patches.apply_all [--dry-run] [--verify-rebinds]

Needs its runtime dependencies (``pip install xxhash pandas scipy`` in the container first):
without them it stops at once with ``ModuleNotFoundError``.

Order: the pin gate first (:func:`vllm._genesis.guards.assert_vllm_pin_allowed`), then the typo
guard, then every registered patch (:mod:`vllm._genesis.dispatcher`) whose env switch is truthy.
Text patches (:mod:`vllm._genesis.patches.text_patches`) edit vLLM's files in place, in the
container's writable layer, and leave ``[Genesis <id>`` markers: a second apply in the same
container (``docker stop`` + ``start``, a restart policy) finds their anchors gone and FAILS
(exit 1). Always recreate the container (``docker compose down`` + ``up``). P87 edits the
Marlin kernel file; when that is a read-only bind mount it FAILS with
``[Errno 30] Read-only file system``.

Exit status: 0 = no patch failed; 1 = at least one patch FAILED; 2 = orchestrator setup error
(vllm package not locatable, strict typo guard); the pin gate in strict mode exits 2 itself.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas  # noqa: F401  (runtime dependencies, as the real package imports them)
import scipy  # noqa: F401
import xxhash  # noqa: F401
from vllm._genesis.__version__ import VERSION
from vllm._genesis.dispatcher import ENV_FLAGS, decide_all
from vllm._genesis.guards import assert_vllm_pin_allowed
from vllm._genesis.kernel.orchestrate import Results, cli_main, run_apply
from vllm._genesis.patches.text_patches import TEXT_PATCHES

PROG = "python3 -m vllm._genesis.patches.apply_all"


def run(apply: bool = True, env: Mapping[str, str] | None = None) -> Results:
    """Gate, decide and apply; returns the tallies. Raises SetupError; strict gate exits 2."""
    return run_apply(f"[Genesis] apply_all {VERSION} starting (apply={apply})",
                     assert_vllm_pin_allowed, ENV_FLAGS, decide_all, TEXT_PATCHES,
                     "mount vllm/_genesis into <site-packages>/vllm/_genesis", apply, env)


def main(argv: list[str] | None = None) -> int:
    return cli_main(PROG, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
