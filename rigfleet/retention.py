"""What a host keeps of things it stages per pin (Genesis trees, model revisions): the pinned
entry, every entry a compose file on the host names (however old), and the ``keep`` newest by
mtime (the pinned one counts as the newest); everything else is stale::

    stale({"a": 1, "b": 2, "c": 3}, pinned="c", referenced={"a"}, keep=1)    # ['b']
    stale({"a": 1, "b": 2, "c": 3}, pinned="d", referenced=set(), keep=2)    # ['a', 'b']
"""

from __future__ import annotations

from collections.abc import Mapping, Set


def stale(entries: Mapping[str, float], pinned: str, referenced: Set[str], keep: int) -> list[str]:
    """The entries (name -> mtime) to remove, sorted; ``pinned`` need not exist yet."""
    others = sorted((n for n in entries if n != pinned), key=lambda n: (entries[n], n),
                    reverse=True)
    kept = {pinned, *others[: max(keep - 1, 0)], *referenced}
    return sorted(n for n in entries if n not in kept)
