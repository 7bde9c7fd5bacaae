"""Fault injection for the hub's file downloads (``/_testbed/faults``).

``POST /_testbed/faults`` replaces the whole fault set with a JSON document::

    {"corrupt": ["model-00002-of-00004.safetensors"],
     "cut_after_bytes": {"model-00003-of-00004.safetensors": 100000},
     "cut_times": 1}

- ``corrupt``: downloads of these files get altered bytes (same size, every 64 KiB-th byte and the
  last byte inverted, consistently across ranges) while every piece of metadata (ETag,
  X-Linked-Etag, API sha256) still advertises the true content, as a bad disk or proxy would.
  Stays until cleared.
- ``cut_after_bytes``: the first ``cut_times`` (default 1) GET responses of the file stop after
  that many body bytes and the connection is closed, as a dropped connection would look; later
  requests (a client's resume with ``Range``) are served normally.

Names match a file's path in the repository, or its last path component. ``GET`` shows the set
with counters (``cuts_left``, ``served``), ``DELETE`` clears it::

    curl -X POST -d '{"corrupt": ["model-00002-of-00004.safetensors"]}' \
        http://127.0.0.1:8080/_testbed/faults
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

_KEYS = {"corrupt", "cut_after_bytes", "cut_times"}
# Every this-many-th byte is inverted in a corrupted download (plus the last byte).
CORRUPT_STRIDE = 64 * 1024


class FaultSpecError(ValueError):
    """The posted fault document is not valid; the message says why."""


def _matches(name: str, path: str) -> bool:
    return name == path or path.rsplit("/", 1)[-1] == name


def corrupt_chunk(offset: int, chunk: bytes, size: int) -> bytes:
    """Invert the bytes of ``chunk`` (starting at file ``offset``) that a corrupted copy
    differs in."""
    data = bytearray(chunk)
    end = offset + len(chunk)
    first = offset + (
        -(offset + 1) % CORRUPT_STRIDE
    )  # first o >= offset with o % STRIDE == STRIDE-1
    for o in range(first, end, CORRUPT_STRIDE):
        data[o - offset] ^= 0xFF
    if offset <= size - 1 < end and (size - 1) % CORRUPT_STRIDE != CORRUPT_STRIDE - 1:
        data[size - 1 - offset] ^= 0xFF
    return bytes(data)


@dataclass
class Faults:
    """The current fault set and its counters; thread-safe."""

    corrupt: list[str] = field(default_factory=list)
    cut_after_bytes: dict[str, int] = field(default_factory=dict)
    cut_times: int = 1
    cuts_left: dict[str, int] = field(default_factory=dict)
    served: dict[str, dict[str, int]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def replace(self, spec: Any) -> None:
        """Validate and install a new fault set (counters start afresh)."""
        if not isinstance(spec, dict):
            raise FaultSpecError("fault spec must be a JSON object")
        unknown = set(spec) - _KEYS
        if unknown:
            raise FaultSpecError(f"unknown keys {sorted(unknown)}; allowed: {sorted(_KEYS)}")
        corrupt = spec.get("corrupt", [])
        if not isinstance(corrupt, list) or not all(isinstance(n, str) and n for n in corrupt):
            raise FaultSpecError("'corrupt' must be a list of file names")
        cuts = spec.get("cut_after_bytes", {})
        if not isinstance(cuts, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
            for k, v in cuts.items()
        ):
            raise FaultSpecError("'cut_after_bytes' must map file names to byte counts >= 0")
        times = spec.get("cut_times", 1)
        if not isinstance(times, int) or isinstance(times, bool) or times < 0:
            raise FaultSpecError("'cut_times' must be an integer >= 0")
        with self._lock:
            self.corrupt = list(corrupt)
            self.cut_after_bytes = dict(cuts)
            self.cut_times = times
            self.cuts_left = {name: times for name in cuts}
            self.served = {}

    def clear(self) -> None:
        self.replace({})

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "corrupt": list(self.corrupt),
                "cut_after_bytes": dict(self.cut_after_bytes),
                "cut_times": self.cut_times,
                "cuts_left": dict(self.cuts_left),
                "served": {k: dict(v) for k, v in self.served.items()},
            }

    def plan(self, path: str) -> tuple[bool, int | None]:
        """For one GET of ``path``: (corrupt?, cut after N body bytes or None). Consumes a cut."""
        with self._lock:
            corrupt = any(_matches(n, path) for n in self.corrupt)
            cut = None
            for name, after in self.cut_after_bytes.items():
                if _matches(name, path) and self.cuts_left.get(name, 0) > 0:
                    self.cuts_left[name] -= 1
                    cut = after
                    break
            if corrupt or cut is not None:
                counters = self.served.setdefault(path, {"corrupt": 0, "cut": 0})
                counters["corrupt"] += int(corrupt)
                counters["cut"] += int(cut is not None)
            return corrupt, cut
