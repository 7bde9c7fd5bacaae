"""Each fact of a host asked once per run while nothing changed on it (pyinfra 3.x does not
cache facts); ``prime`` lets one merged read answer for many (docs/architecture.md, "Read a
host once")::

    read_host_once()                                  # run_deploy does this
    host.get_fact(File, path="/etc/x")                # asked
    host.get_fact(File, path="/etc/x")                # kept: nothing was sent since
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from pyinfra.api.host import Host
from pyinfra.api.state import State

T = TypeVar("T")


@dataclass
class _HostMemo:
    """One host's answers in one run, and what would make them stale."""

    answers: dict[tuple[Any, ...], tuple[tuple[int, int], Any]] = field(default_factory=dict)
    sent: int = 0  # commands and uploads sent to the host that were not reads
    reading: int = 0  # reads under way (a read's own command changes nothing)


_MEMO: weakref.WeakKeyDictionary[State, dict[str, _HostMemo]] = weakref.WeakKeyDictionary()


def _memo(on: Host) -> _HostMemo:
    return _MEMO.setdefault(on.state, {}).setdefault(on.name, _HostMemo())


def _mark(on: Host) -> tuple[int, int]:
    """What has changed on the host so far: operations executed, commands sent."""
    ops = on.state.ops.get(on, {})
    return sum(1 for data in ops.values() if data.operation_meta.executed), _memo(on).sent


def read_once(on: Host, key: tuple[Any, ...], read: Callable[[], T], fresh: bool = False) -> T:
    """``read()`` of host ``on``, kept under ``key`` while nothing changed (``fresh``: read)."""
    memo = _memo(on)
    mark = _mark(on)
    kept = memo.answers.get(key)
    if not fresh and kept is not None and kept[0] == mark:
        return cast(T, kept[1])
    memo.reading += 1
    try:
        value = read()
    finally:
        memo.reading -= 1
    memo.answers[key] = (mark, value)
    return value


_GET_FACT = Host.get_fact


def _counted(send: Callable[..., Any]) -> Callable[..., Any]:
    """``send``, counting each call outside a read as a change to the host."""

    def counted(self: Host, *args: Any, **kwargs: Any) -> Any:
        memo = _memo(self)
        if not memo.reading:
            memo.sent += 1
        return send(self, *args, **kwargs)

    return counted


def read_host_once() -> None:
    """Patch ``Host`` (idempotent): facts go through ``read_once``, other sends count as changes."""
    if Host.get_fact is not _get_fact_once:
        Host.get_fact = _get_fact_once  # type: ignore[method-assign]
        Host.run_shell_command = _counted(Host.run_shell_command)  # type: ignore[method-assign]
        Host.put_file = _counted(Host.put_file)  # type: ignore[method-assign]


def fact_key(fact: Any, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
    return ("fact", fact, tuple(repr(a) for a in args),
            tuple(sorted((k, repr(v)) for k, v in kwargs.items())))


def _get_fact_once(self: Host, name_or_cls: Any, *args: Any, **kwargs: Any) -> Any:
    fresh = kwargs.pop("_rigfleet_fresh", False)
    key = fact_key(name_or_cls, *args, **kwargs)
    return read_once(self, key, lambda: _GET_FACT(self, name_or_cls, *args, **kwargs), fresh)


def prime(on: Host, key: tuple[Any, ...], value: Any) -> None:
    """Keep ``value`` under ``key`` (``fact_key``) for host ``on``, as if just read."""
    _memo(on).answers[key] = (_mark(on), value)
