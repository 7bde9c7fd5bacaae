"""What the gate's checks share (``Context``), in a module of its own so each check module
can take it without importing the list of checks (``checks.CHECKS``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ..bench.measure import Progress
from ..records import ThroughputRecord
from . import metrics, prompts
from .client import Client
from .profiles import Profile


@dataclass
class Context:
    """The client, the profile, what preflight learned, what throughput measured."""

    client: Client
    profile: Profile
    progress: Progress = field(default_factory=Progress)
    model: str = ""
    version: str = ""
    max_model_len: int | None = None
    metrics_before: list[metrics.Sample] | None = None
    throughput_record: ThroughputRecord | None = None

    @cached_property
    def sizer(self) -> prompts.Sizer:
        """Sizes prompts in the server's own tokens; made on first use, after preflight."""
        return prompts.server_sizer(
            self.client, self.model, max(self.profile.preflight_timeout_s, 30.0),
            self.profile.needle_timeout_s, self.progress.note, self.profile.size_tolerance)

    def body(self, messages: prompts.Messages, max_tokens: int, temperature: float,
             tools: prompts.Tools = None, tool_choice: Any = None) -> dict[str, Any]:
        return prompts.chat_body(self.model, messages, max_tokens, temperature, tools, tool_choice)
