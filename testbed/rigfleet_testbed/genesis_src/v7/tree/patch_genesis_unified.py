"""Back-compat shim for composes that still run ``python3 /patches/patch_genesis_unified.py``.

It calls :func:`vllm._genesis.patches.apply_all.main`; when ``vllm._genesis`` is not importable
it says where to mount it and exits 1.
"""

import sys
import warnings

if __name__ == "__main__":
    warnings.warn("patch_genesis_unified.py is deprecated: run "
                  "`python3 -m vllm._genesis.patches.apply_all`", DeprecationWarning, stacklevel=1)
    try:
        from vllm._genesis.patches.apply_all import main
    except ImportError as exc:
        if not str(getattr(exc, "name", "") or "").startswith("vllm"):
            raise  # a missing runtime dependency (xxhash, pandas, scipy): say so as it is
        print(f"ERROR: cannot import vllm._genesis.patches.apply_all ({exc}). Mount the "
              "repository's vllm/_genesis at <site-packages>/vllm/_genesis.", file=sys.stderr)
        sys.exit(1)
    sys.exit(main())
