"""Text patches: replace an anchor in a vLLM source file, leaving a ``[Genesis <id>`` marker.

Genesis edits vLLM's installed sources in place (in a container: its writable layer). A patch
names its target file (relative to the vllm package directory), the exact text it replaces and
the text it writes. What can happen:

- applied: the anchor is there once; the file is rewritten;
- skipped: the target file does not exist in this vLLM (removed upstream), an upstream drift
  marker says the fix is already upstream, or the anchor is gone without a Genesis marker
  (upstream changed the code);
- failed: the anchor is gone and the file carries this patch's marker: an earlier apply in the
  same container patched it already (``docker stop`` + ``start`` re-runs the entrypoint against
  the patched writable layer); or the file cannot be written (``[Errno 30] Read-only file
  system`` when it is bind-mounted read-only); or the anchor is ambiguous.

Stdlib only; shared by both layouts of this fixture repository::

    outcome = apply_text_patch("/usr/local/lib/python3.12/dist-packages/vllm", patch)
    outcome.status, outcome.reason     # ("applied", "text-patched config/vllm.py")
"""

from __future__ import annotations

import os
from dataclasses import dataclass

RECREATE_HINT = ("recreate the container (docker compose down && docker compose up -d) instead "
                 "of restarting it")


@dataclass(frozen=True)
class TextPatch:
    """One text patch (see the module docstring)."""

    patch_id: str
    target: str
    anchor: str
    replacement: str
    drift_marker: str = ""

    @property
    def marker(self) -> str:
        return f"[Genesis {self.patch_id}"


@dataclass(frozen=True)
class Outcome:
    status: str  # "applied" | "skipped" | "failed"
    reason: str


def apply_text_patch(vllm_dir: str, patch: TextPatch, write: bool = True) -> Outcome:
    """Apply ``patch`` under ``vllm_dir``; with ``write=False`` only say what would happen."""
    path = os.path.join(vllm_dir, patch.target)
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        return Outcome("skipped", f"target {patch.target} is not in this vLLM (removed upstream)")
    except OSError as exc:
        return Outcome("failed", f"cannot read {patch.target}: {exc}")
    if patch.drift_marker and patch.drift_marker in text:
        return Outcome("skipped", f"upstream drift marker {patch.drift_marker!r} in "
                                  f"{patch.target}: the fix is upstream")
    count = text.count(patch.anchor)
    if count == 0:
        if patch.marker in text:
            return Outcome("failed", f"anchor not found in {patch.target}: already patched (the "
                                     f"file carries '{patch.marker}]' from an earlier apply in "
                                     f"this container's writable layer); {RECREATE_HINT}")
        return Outcome("skipped", f"required anchor missing in {patch.target} (upstream drift: "
                                  "upstream may have absorbed this fix)")
    if count > 1:
        return Outcome("failed", f"anchor matches {count} times in {patch.target}; refusing an "
                                 "ambiguous patch")
    if not write:
        return Outcome("applied", f"would text-patch {patch.target}")
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text.replace(patch.anchor, patch.replacement, 1))
    except OSError as exc:
        return Outcome("failed", f"cannot write {patch.target}: {exc}")
    return Outcome("applied", f"text-patched {patch.target}")
