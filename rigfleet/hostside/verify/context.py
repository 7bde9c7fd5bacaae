"""What the gate's checks share (``Context``), in a module of its own so each check module
can take it without importing the list of checks (``checks.CHECKS``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from ..bench.measure import SilentProgress
from ..records import ThroughputRecord
from . import metrics, prompts
from .client import Client
from .counting import TokenCounter, chat_body
from .profiles import Profile


class Progress(Protocol):
    def tick(self, mark: str) -> None: ...

    def note(self, text: str) -> None: ...


@dataclass
class Context:
    """The client, the profile, what preflight learned, what throughput measured."""

    client: Client
    profile: Profile
    progress: Progress = field(default_factory=SilentProgress)
    model: str = ""
    version: str = ""
    max_model_len: int | None = None
    metrics_before: list[metrics.Sample] | None = None
    counter: TokenCounter | None = None  # /tokenize, else 1-token completions
    throughput_record: ThroughputRecord | None = None
    sizer: prompts.Sizer | None = None

    def get_sizer(self) -> prompts.Sizer:
        if self.sizer is None:
            self.sizer = prompts.Sizer(self.count_tokens, self.profile.size_tolerance)
        return self.sizer

    def body(self, messages: prompts.Messages, max_tokens: int, temperature: float,
             tools: prompts.Tools = None, tool_choice: Any = None) -> dict[str, Any]:
        return chat_body(self.model, messages, max_tokens, temperature, tools, tool_choice)

    def count_tokens(self, messages: prompts.Messages, tools: prompts.Tools) -> int | None:
        """Prompt tokens as the server counts them (chat template included)."""
        if self.counter is None:
            self.counter = TokenCounter(
                self.client, self.model, timeout=max(self.profile.preflight_timeout_s, 30.0),
                chat_timeout=self.profile.needle_timeout_s, note=self.progress.note)
        return self.counter(messages, tools)
