"""The patches that edit vLLM's source files (the others rebind in memory).

Each anchor is the exact vLLM source text the patch replaces; the replacement carries the
``[Genesis <id>`` marker. See :mod:`vllm._genesis.kernel.textpatch` for what happens when the
anchor is missing or the file is read-only.
"""

from __future__ import annotations

from vllm._genesis.kernel.textpatch import TextPatch

TEXT_PATCHES: dict[str, TextPatch] = {}  # genesis-fixture: text-patches
