"""The bench's request shapes (seed 004's bench, so a figure stands beside a stack file's
reference), and a context-depth shape: a long salted prompt, then a short continuation."""

from __future__ import annotations

from dataclasses import dataclass

from ..verify import prompts


@dataclass(frozen=True)
class Shape:
    """One request shape: the user ``prompt``, its answer budget and sampling temperature."""

    name: str
    prompt: str
    max_tokens: int
    temperature: float = 0.6

    def messages(self) -> prompts.Messages:
        return [{"role": "user", "content": self.prompt}]


NARRATIVE = Shape(
    "narrative",
    "Write an 800-word essay about the history of lighthouses: how they were built, how "
    "their lights were made to reach ships far out at sea, and the lives of the keepers who "
    "tended them through storms and long winters.",
    max_tokens=1000,
)
CODE = Shape(
    "code",
    "Implement quicksort in Python. Comment every step: how the pivot is chosen, how the "
    "list is partitioned around it, why the recursion ends, and what the running time is in "
    "the best and the worst case.",
    max_tokens=800,
)
SHAPES: tuple[Shape, ...] = (NARRATIVE, CODE)
BY_NAME = {s.name: s for s in SHAPES}

DEPTH_MAX_TOKENS = 256
DEPTH_INSTRUCTION = "Continue this history of computing in about 300 words."


def depth_messages(salt: str, units: int) -> prompts.Messages:
    """``units`` filler paragraphs (the needle checks' haystack), then the instruction; the
    salt makes each prompt unique, so no cached prefix stands in for the prefill."""
    text = f"SESSION-{salt}. {prompts.filler(units)}\n\n{DEPTH_INSTRUCTION}"
    return [{"role": "user", "content": text}]
