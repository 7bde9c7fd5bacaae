"""Stand-in ``nvidia-container-runtime``: runc with the NVIDIA prestart hook added when needed.

Registered as Docker's ``nvidia`` runtime by ``nvidia-ctk runtime configure``. Like the real
one in its legacy mode: on ``create``, when the bundle's process asks for GPUs through
``NVIDIA_VISIBLE_DEVICES`` and no NVIDIA hook is present yet (``--gpus`` adds one itself), it
adds ``nvidia-container-runtime-hook prestart`` to the OCI spec; then it execs ``runc`` with the
same arguments. Anything it cannot read is left to runc, unchanged.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

HOOK = "/usr/bin/nvidia-container-runtime-hook"


def _bundle(args: Sequence[str]) -> Path | None:
    if "create" not in args:
        return None
    for i, a in enumerate(args):
        if a in ("--bundle", "-b") and i + 1 < len(args):
            return Path(args[i + 1])
        if a.startswith("--bundle="):
            return Path(a.split("=", 1)[1])
    return Path(".")


def add_hook(config: dict) -> bool:
    """Add the prestart hook to an OCI config that asks for GPUs; True when it changed."""
    env = config.get("process", {}).get("env", []) or []
    wants = any(e.startswith("NVIDIA_VISIBLE_DEVICES=") and e.split("=", 1)[1] not in ("", "void")
                for e in env)
    hooks = config.setdefault("hooks", {})
    prestart = hooks.setdefault("prestart", [])
    if not wants or any(h.get("path", "").endswith("nvidia-container-runtime-hook")
                        for h in prestart):
        return False
    prestart.append({"path": HOOK, "args": ["nvidia-container-runtime-hook", "prestart"]})
    return True


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    bundle = _bundle(args)
    if bundle is not None:
        spec = bundle / "config.json"
        try:
            config = json.loads(spec.read_text())
            if add_hook(config):
                spec.write_text(json.dumps(config))
        except (OSError, ValueError):
            pass  # runc reports a broken bundle better than we can
    os.execvp("runc", ["runc", *args])
    return 127  # not reached
