"""Output-health detectors for every reply the gate receives (a broken KV read path still
answers 200 quickly: the text gives it away); ``scan`` runs them with the ``health_*`` limits::

    scan(content="...", reasoning="", tool_calls=[], finish_reason="stop", prof=FULL)
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from dataclasses import asdict, dataclass, replace
from typing import Any

from .profiles import Profile


@dataclass(frozen=True)
class Finding:
    """Something wrong with one reply (or request); ``name`` is stable, for machines."""

    name: str
    message: str
    where: str = ""  # "content", "reasoning", a depth, a turn ...
    evidence: str = ""  # a short excerpt

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v != ""}


_FENCE = re.compile(r"```.*?(?:```|\Z)", re.DOTALL)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
# LaTeX math ($...$, $$...$$, \[...\], \(...\)): braces and carets are its syntax.
_MATH = re.compile(r"\$\$.*?\$\$|\\\[.*?\\\]|\\\(.*?\\\)|\$[^$\n]+\$", re.DOTALL)
_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)?")
# Markdown syntax in healthy answers (lists, tables, headings, rules, emphasis): never a flood.
_MARKUP = set("-*#|_`>~=+<[]/\\")
_MIXED_FLOOD = re.compile(r"(?:[" + re.escape("!?.,;:¡¿") + r"]\s*){12,}")


def _excerpt(text: str, start: int = 0) -> str:
    return text[max(0, start):][:80].replace("\n", "\\n")


def _prose(text: str) -> str:
    """``text`` without fenced code, inline code or LaTeX math: those are punctuation-heavy
    and repetitive (keywords, indices) by nature, and judged by the line detector instead."""
    return _MATH.sub(" ", _INLINE_CODE.sub(" ", _FENCE.sub("\n", text)))


def detect_empty(content: str, tool_calls: list[Any] | None = None, reasoning: str = "",
                 finish_reason: str | None = None) -> Finding | None:
    """No text and no tool call; still thinking at max_tokens (finish "length") is not empty."""
    if content.strip() or tool_calls or (reasoning.strip() and finish_reason == "length"):
        return None
    return Finding("empty", "empty reply: no content and no tool call",
                   evidence=f"finish_reason={finish_reason}")


def detect_punctuation_flood(text: str, prof: Profile) -> Finding | None:
    """``!!!!``-style runs, long mixed runs, or prose over ``health_punct_ratio`` punctuation."""
    prose = _prose(text)
    if run := re.search(r"([!?¡¿])\1{" + str(prof.health_punct_run - 1) + ",}", prose):
        return Finding("punctuation_flood", f"a run of {len(run.group(0))} '{run.group(1)}'",
                       evidence=_excerpt(prose, run.start() - 20))
    if mixed := _MIXED_FLOOD.search(prose):
        return Finding("punctuation_flood", "a long run of punctuation",
                       evidence=_excerpt(prose, mixed.start() - 20))
    # Table rows (mostly cells and separators by design) and markup do not count.
    chars = [ch for line in prose.splitlines() if not line.lstrip().startswith("|")
             for ch in line if not ch.isspace() and ch not in _MARKUP]
    punct = sum(not ch.isalnum() and (unicodedata.category(ch).startswith("P") or ch in "$%^&@")
                for ch in chars)
    counted = punct + sum(ch.isalnum() for ch in chars)
    if counted >= prof.health_punct_min_chars and punct / counted > prof.health_punct_ratio:
        return Finding("punctuation_flood", f"{punct / counted:.0%} of the text is punctuation "
                       f"(limit {prof.health_punct_ratio:.0%})", evidence=_excerpt(prose))
    return None


def detect_first_word_repetition(text: str, prof: Profile) -> Finding | None:
    """The first word repeated right away ("The The The"), or making up half the reply."""
    words = [w.lower() for w in _WORD.findall(text[:20_000])]
    if not words:
        return None
    first = words[0]
    run = next((i for i, w in enumerate(words) if w != first), len(words))
    if run >= prof.health_first_word_repeats:
        return Finding("first_word_repetition",
                       f"the first word {first!r} repeats {run} times in a row",
                       evidence=_excerpt(text.lstrip()))
    head = words[: prof.health_lexical_window]
    if len(head) >= 10 and head.count(first) / len(head) >= 0.5:
        return Finding("first_word_repetition", f"the first word {first!r} is "
                       f"{head.count(first)} of the first {len(head)} words",
                       evidence=_excerpt(text.lstrip()))
    return None


def detect_repeated_line(text: str, prof: Profile) -> Finding | None:
    """Any line repeated ``health_line_repeats`` times in a row; lines without a letter or
    digit (``}``, ``---``, fences) legitimately stack up in code and markdown and are skipped."""
    lines = [s for s in map(str.strip, text.splitlines()) if any(ch.isalnum() for ch in s)]
    n = max(prof.health_line_repeats, 2)  # one line on its own does not repeat
    for s, run in itertools.groupby(lines):
        if (count := len(list(run))) >= n:
            return Finding("repeated_line", f"the line {s[:60]!r} repeats {count} times in a row",
                           evidence=s[:80])
    return None


def detect_low_variety(text: str, prof: Profile) -> Finding | None:
    """Unique/total of the first words of prose below ``health_lexical_min`` (verify-full's)."""
    words = [w.lower() for w in _WORD.findall(_prose(text[:50_000]))][: prof.health_lexical_window]
    if len(words) < prof.health_lexical_min_words:
        return None  # a short answer ("blue tiger 42") says nothing about variety
    ratio = len(set(words)) / len(words)
    if ratio < prof.health_lexical_min:
        return Finding("low_lexical_variety", f"lexical variety {ratio:.2f} over the first "
                       f"{len(words)} words (limit {prof.health_lexical_min:.2f})",
                       evidence=_excerpt(text))
    return None


def detect_tool_call_leak(text: str) -> Finding | None:
    """A ``<tool_call>`` written into the content: the tool parser did not get it (truncated
    call, MTP x TurboQuant cascade, or a missing --tool-call-parser)."""
    if m := re.search(r"</?tool_call>", text, re.IGNORECASE):
        return Finding("tool_call_in_content", "<tool_call> markup leaked into the content",
                       evidence=_excerpt(text, m.start() - 20))
    return None


_TEXT_DETECTORS = (detect_punctuation_flood, detect_first_word_repetition, detect_repeated_line,
                   detect_low_variety)


def scan(content: str, reasoning: str, tool_calls: list[Any], finish_reason: str | None,
         prof: Profile) -> list[Finding]:
    """The empty check, the text detectors over each non-blank text, the leak over the content."""
    found = [("content", detect_empty(content, tool_calls, reasoning, finish_reason))]
    for where, text in (("content", content), ("reasoning", reasoning)):
        if text.strip():
            found += [(where, detect(text, prof)) for detect in _TEXT_DETECTORS]
            if where == "content":
                found.append((where, detect_tool_call_leak(text)))
    return [replace(f, where=where) for where, f in found if f is not None]
