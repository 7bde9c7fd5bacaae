"""The patches that edit vLLM's source files (the others rebind in memory).

Each anchor is the exact vLLM source text the patch replaces; the replacement carries the
``[Genesis <id>`` marker; a ``drift_marker`` found in the target means the fix is upstream and
the patch self-skips (P87: ``marlin_padded_nk``, upstream from 0.22.1rc1.dev491).
"""

from __future__ import annotations

from sndr.kernel.textpatch import TextPatch

TEXT_PATCHES: dict[str, TextPatch] = {}  # genesis-fixture: text-patches
