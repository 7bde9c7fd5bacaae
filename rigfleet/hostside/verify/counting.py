"""Request bodies (thinking off) and prompt-token counting, shared by the gate and the bench.

    body = chat_body("qwen3.6-27b-autoround", msgs, max_tokens=30, temperature=0.0)
    count = TokenCounter(client, "qwen3.6-27b-autoround", timeout=30, chat_timeout=300)
    count(msgs, None)            # prompt tokens as the server counts them, or None
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .client import Client

Messages = list[dict[str, Any]]
Tools = list[dict[str, Any]] | None


def chat_body(model: str, messages: Messages, max_tokens: int, temperature: float,
              tools: Tools = None, tool_choice: Any = None) -> dict[str, Any]:
    """A ``/v1/chat/completions`` body with thinking off."""
    out: dict[str, Any] = {
        "model": model, "messages": messages, "max_tokens": max_tokens,
        "temperature": temperature, "chat_template_kwargs": {"enable_thinking": False},
    }
    if tools:
        out["tools"] = tools
        out["tool_choice"] = tool_choice or "auto"
    return out


@dataclass
class TokenCounter:
    """Prompt tokens by ``/tokenize``, else (``mode`` "chat") by 1-token completions' usage."""

    client: Client
    model: str
    timeout: float
    chat_timeout: float
    note: Callable[[str], None] = lambda _: None
    mode: str = "tokenize"

    def __call__(self, messages: Messages, tools: Tools) -> int | None:
        if self.mode == "tokenize":
            body: dict[str, Any] = {"model": self.model, "messages": messages,
                                    "add_generation_prompt": True,
                                    "chat_template_kwargs": {"enable_thinking": False}}
            if tools:
                body["tools"] = tools
            r = self.client.request("POST", "/tokenize", body, timeout=self.timeout)
            data = r.json() if r.status == 200 else None
            if isinstance(data, dict) and isinstance(data.get("count"), int):
                return data["count"]
            if r.status in (401, 403, 404, 405, 501):
                self.mode = "chat"  # no /tokenize here (or a front hides it)
                self.note("/tokenize unavailable; counting with 1-token completions")
            else:
                return None
        res = self.client.chat(chat_body(self.model, messages, 1, 0.0, tools,
                                         "none" if tools else None),
                               timeout=self.chat_timeout)
        return res.prompt_tokens if res.ok else None
