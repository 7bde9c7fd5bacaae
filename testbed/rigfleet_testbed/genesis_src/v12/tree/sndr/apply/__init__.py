"""Apply the enabled Genesis patches to the vLLM this interpreter imports.

    python3 -m sndr.apply [--dry-run] [--verify-rebinds]

Needs its runtime dependencies (``pip install pandas==2.2.3 scipy==1.14.1 xxhash==3.5.0``, what
``SNDR_DEV_INSTALL_RUNTIME_DEPS=1`` does in the rendered bootstrap); without them it stops at
once with ``ModuleNotFoundError``.

Order: the pin gate (``sndr/engines/vllm/detection/guards.py``: ``KNOWN_GOOD_VLLM_PINS`` and
``PROMOTION_PENDING_VLLM_PINS`` are both accepted), the typo guard, then every patch of
``sndr/dispatcher/registry.py`` whose ``GENESIS_ENABLE_*`` switch is truthy, subject to
``sndr/dispatcher/decision.py`` (retired patches are hard-skipped unless
``GENESIS_ALLOW_RETIRED=1``; ``vllm_version_range`` is enforced only with
``GENESIS_ENFORCE_VERSION_RANGE=1``). Text patches edit vLLM's files in the container's writable
layer: a second apply in the same container finds their anchors gone and FAILS (exit 1).

Exit status: 0 = no patch failed; 1 = a patch FAILED; 2 = setup error (no vllm, an engine other
than ``SNDR_ENGINE=vllm``, strict typo guard); the strict pin gate exits 2 itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import pandas  # noqa: F401  (runtime dependencies)
import scipy  # noqa: F401
import xxhash  # noqa: F401

from sndr.dispatcher.decision import ENV_FLAGS, decide_all
from sndr.engines.vllm.detection.guards import assert_vllm_pin_allowed
from sndr.engines.vllm.patches.text_patches import TEXT_PATCHES
from sndr.kernel.orchestrate import Results, SetupError, cli_main, run_apply
from sndr.version import __version__

PROG = "python3 -m sndr.apply"


def run(apply: bool = True, env: Mapping[str, str] | None = None) -> Results:
    """Gate, decide and apply; returns the tallies. Raises SetupError; strict gate exits 2."""
    env = os.environ if env is None else env
    engine = env.get("SNDR_ENGINE", "vllm").strip() or "vllm"
    if engine != "vllm":
        raise SetupError(f"SNDR_ENGINE={engine}: this installation carries the vllm engine only")
    return run_apply(f"[Genesis] sndr.apply {__version__} starting (engine=vllm, apply={apply})",
                     assert_vllm_pin_allowed, ENV_FLAGS, decide_all, TEXT_PATCHES,
                     "install sndr into the vLLM interpreter: -v <repo>/sndr:/usr/local/lib/"
                     "python3.12/dist-packages/sndr:ro", apply, env)


def main(argv: list[str] | None = None) -> int:
    return cli_main(PROG, run, argv)
