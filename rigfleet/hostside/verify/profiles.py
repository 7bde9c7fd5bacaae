"""Gate profiles: every threshold, prompt size, timeout and count the checks use. ``FULL``
follows club-3090's numbers for dual-3090 rigs, ``FAST`` keeps the checks at testbed sizes; bad
names or values raise :class:`ProfileError` before any request is sent::

    prof = resolve("fast", ["needle_depths=8000,12000", "soak_sessions=4"])
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, get_type_hints


class ProfileError(ValueError):
    """An unknown profile, an unknown key or a value outside what the key allows."""


@dataclass(frozen=True)
class Profile:
    """All numbers of one gate run (sizes are in the server's tokens unless named _chars)."""

    name: str

    health_wait_s: float = 60.0  # keep polling /health this long before calling the server down
    preflight_timeout_s: float = 10.0  # per /health, /v1/models, /version request
    warmup_timeout_s: float = 180.0  # the first generated token (compile caches, cudagraphs)

    needle_depths: tuple[int, ...] = (10_000, 30_000)  # check 1: prompt sizes
    needle_deep_depths: tuple[int, ...] = (60_000, 90_000)  # check 7 ("Cliff 2 territory")
    needle_max_tokens: int = 30
    needle_timeout_s: float = 300.0
    size_tolerance: float = 0.02  # built prompts land within this fraction of the target

    prefill_tokens: int = 25_000
    prefill_max_tokens: int = 500
    prefill_min_chars: int = 50  # a shorter text answer (and no tool call) is a failure
    prefill_timeout_s: float = 240.0

    ide_preamble_chars: int = 5_000
    ide_tools: int = 10
    ide_max_tokens: int = 2_000
    ide_timeout_s: float = 180.0

    agent_tools: int = 4
    agent_tool_reply_chars: int = 3_000
    agent_max_tokens: int = 1_500
    agent_timeout_s: float = 180.0

    coding_max_tokens: int = 4_096
    coding_timeout_s: float = 240.0

    reasoning_max_tokens: int = 8_192
    reasoning_min_tokens: int = 500  # fewer: spec-decode AL collapse or an early stop
    reasoning_timeout_s: float = 600.0

    soak_sessions: int = 20
    soak_turns: int = 5
    soak_concurrency: int = 2
    soak_turn_min_tokens: int = 350
    soak_turn_max_tokens: int = 1_500
    soak_request_timeout_s: float = 600.0
    soak_timeout_s: float = 1_800.0  # the whole soak; unfinished turns make it fail
    soak_silent_empty_min_s: float = 1.0  # club-3090's definition: 200 + 0 tokens + >= 1 s
    soak_fail_rate: float = 0.05  # silent-empty or unhealthy turns at/above this rate fail
    soak_warn_rate: float = 0.0  # above this (and below fail) the soak passes with a warning

    spec_min_acceptance_length: float = 2.0  # club-3090 MTP_ACCEPT_MIN; healthy MTP n=3 ~3.5
    spec_min_drafts: int = 50  # fewer drafts than this in the gate's traffic: send a probe
    spec_probe_max_tokens: int = 500
    spec_probe_timeout_s: float = 120.0
    spec_settle_s: float = 3.0  # let the engine publish its last counters before scraping

    throughput_runs: int = 5  # measured runs per shape (mean, CV)
    throughput_warmup: int = 3  # unmeasured rounds first (seed 004: "after 3 warmup rounds")
    throughput_timeout_s: float = 300.0  # per request
    throughput_stack: str = ""  # whose history is the baseline; "": none, nothing recorded
    throughput_history_dir: str = ""  # the host's history.jsonl and last.json; "": none
    throughput_history_n: int = 5  # the baseline: rolling median over this many verified gates
    throughput_history_min: int = 3  # ... once it holds this many (or an accepted baseline)
    throughput_reference_narrative: float = 0.0  # the stack file's tok/s on 3090s; 0: none
    throughput_reference_code: float = 0.0
    throughput_scale: float = 1.0  # host data throughput_scale: other hardware, the testbed
    throughput_margin: float = 0.15  # fail below the baseline by more than this fraction
    throughput_cv_max: float = 0.10  # fail when a shape's CV over its runs is above this
    throughput_acceptance_floor: tuple[float, ...] = ()  # per draft position, code shape

    health_punct_run: int = 4  # "!!!!": a run of this many ! or ? is a flood
    health_punct_ratio: float = 0.30
    health_punct_min_chars: int = 40  # the ratio needs this much text to mean anything
    health_first_word_repeats: int = 3  # "The The The"
    health_line_repeats: int = 5  # the same non-empty line this many times in a row
    health_lexical_min: float = 0.30  # unique/total of the first health_lexical_window words
    health_lexical_window: int = 200
    health_lexical_min_words: int = 40  # shorter replies are too short to judge variety

    overrides: dict[str, Any] = field(default_factory=dict, compare=False)


FULL = Profile(name="full")

FAST = Profile(
    name="fast",
    health_wait_s=5.0, preflight_timeout_s=5.0, warmup_timeout_s=30.0,
    needle_depths=(8_000, 12_000), needle_deep_depths=(16_000, 24_000), needle_timeout_s=60.0,
    prefill_tokens=10_000, prefill_timeout_s=60.0,
    ide_max_tokens=1_000, ide_timeout_s=60.0,
    agent_max_tokens=800, agent_timeout_s=60.0,
    coding_max_tokens=2_048, coding_timeout_s=60.0,
    reasoning_max_tokens=2_048, reasoning_timeout_s=120.0,
    soak_sessions=6, soak_turns=4, soak_concurrency=3, soak_turn_min_tokens=120,
    soak_turn_max_tokens=300, soak_request_timeout_s=60.0, soak_timeout_s=300.0,
    spec_min_drafts=20, spec_probe_timeout_s=30.0, spec_settle_s=0.2,
    throughput_warmup=1, throughput_timeout_s=60.0,
)

PROFILES: dict[str, Profile] = {p.name: p for p in (FULL, FAST)}

# Keys whose value is a fraction (0..1]; everything numeric else must be > 0 unless listed.
_FRACTIONS = {"size_tolerance", "soak_fail_rate", "health_punct_ratio", "health_lexical_min",
              "throughput_margin", "throughput_cv_max", "throughput_acceptance_floor"}
_ZERO_OK = {"spec_settle_s", "health_wait_s", "soak_warn_rate", "soak_silent_empty_min_s",
            "throughput_warmup", "throughput_reference_narrative",
            "throughput_reference_code"}
# Free text (a stack name, a directory on the host): no control characters.
_TEXT = {"throughput_stack", "throughput_history_dir"}
_SETTABLE = [f.name for f in fields(Profile) if f.name not in ("name", "overrides")]
_ALLOWED_KEYS = "allowed keys: " + ", ".join(_SETTABLE)
_TYPES = get_type_hints(Profile)
# type -> (what the error message calls it, the parser)
_KINDS: dict[Any, tuple[str, Callable[[str], Any]]] = {
    int: ("an integer", lambda t: int(t.replace("_", ""))),
    float: ("a number", float),
    tuple[float, ...]: ("comma-separated numbers, e.g. 0.76,0.67,0.6",
                        lambda t: tuple(float(p) for p in t.split(",") if p.strip())),
    tuple[int, ...]: ("comma-separated integers, e.g. 8000,12000",
                      lambda t: tuple(int(p.replace("_", "")) for p in t.split(",") if p.strip())),
}


def _describe(key: str) -> str:
    if key in _TEXT:
        return "text without control characters (may be empty)"
    typ = _TYPES[key]
    allowed = _KINDS[typ][0]
    if key in _FRACTIONS:
        return f"{allowed} above 0 and at most 1"
    if key in _ZERO_OK:
        return f"{allowed} >= 0"
    return f"{allowed} > 0" if typ in (int, float) else f"{allowed} (each > 0)"


def _in_range(key: str, v: float) -> bool:
    finite = v == v and v not in (math.inf, -math.inf)  # an int may be too big for isfinite
    above = v >= 0 if key in _ZERO_OK else v > 0
    return finite and above and (key not in _FRACTIONS or v <= 1.0)


def _parse_value(key: str, raw: str) -> Any:
    bad = ProfileError(f"--set {key}={raw}: invalid value {raw!r} for {key}; "
                       f"allowed: {_describe(key)}")
    if key in _TEXT:
        if any(not ch.isprintable() for ch in raw):
            raise bad
        return raw.strip()
    try:
        value = _KINDS[_TYPES[key]][1](raw.strip())
    except ValueError:
        raise bad from None
    items = value if isinstance(value, tuple) else (value,)
    if not items or not all(_in_range(key, v) for v in items):
        raise bad
    return value


_ORDERED = (("soak_turn_min_tokens", "soak_turn_max_tokens", "min <= max"),
            ("soak_warn_rate", "soak_fail_rate", "warn <= fail"),
            ("reasoning_min_tokens", "reasoning_max_tokens",
             "min <= max (else the check can never pass)"))


def _check_consistency(p: Profile) -> None:
    for low, high, allowed in _ORDERED:
        if getattr(p, low) > getattr(p, high):
            raise ProfileError(f"{low}={getattr(p, low)} is above {high}={getattr(p, high)}; "
                               f"allowed: {allowed}")
    if p.health_punct_run < 2:
        raise ProfileError(f"health_punct_run={p.health_punct_run}: allowed: an integer >= 2 "
                           "(1 would call every exclamation mark a flood)")


def resolve(name: str, assignments: list[str] | tuple[str, ...] = ()) -> Profile:
    """The profile ``name`` with ``key=value`` overrides applied and validated."""
    if (base := PROFILES.get(name)) is None:
        raise ProfileError(f"unknown profile {name!r}; allowed: {', '.join(PROFILES)}")
    changes: dict[str, Any] = {}
    for item in assignments:
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ProfileError(f"--set {item!r}: expected key=value; {_ALLOWED_KEYS}")
        if key not in _SETTABLE:
            raise ProfileError(f"--set {item}: unknown key {key!r}; {_ALLOWED_KEYS}")
        changes[key] = _parse_value(key, raw)
    prof = dataclasses.replace(base, **changes, overrides=dict(changes))
    _check_consistency(prof)
    return prof
