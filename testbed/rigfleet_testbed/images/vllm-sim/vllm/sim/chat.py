"""The chat template: messages (+ tools) to the prompt text the model sees.

A Qwen3-style ChatML rendering, so prompt token counts include the real template's overhead
(role markers, the tools block, tool-call and tool-response wrappers, the empty think block
when thinking is off).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

TOOLS_PREAMBLE = (
    "# Tools\n\nYou have access to the following functions:\n\n<tools>\n")
TOOLS_POSTAMBLE = (
    "</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO "
    "suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>"
    "\nvalue_1\n</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function "
    "calls MUST follow the specified format\n- Required parameters MUST be specified\n- You "
    "may provide optional reasoning for your function call in natural language BEFORE the "
    "function call, but NOT after\n</IMPORTANT>")


class ChatFormatError(ValueError):
    """A request whose messages cannot be rendered (vLLM answers 400)."""


@dataclass(frozen=True)
class Message:
    """A normalised chat message."""

    role: str
    text: str
    name: str = ""
    tool_calls: tuple[dict[str, Any], ...] = ()


def content_text(content: Any) -> str:
    """OpenAI content: a string, None, or a list of parts (text parts are kept)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict):
                if part.get("type") in ("text", "input_text", None) and "text" in part:
                    out.append(str(part.get("text") or ""))
                elif part.get("type") in ("image_url", "input_image", "image"):
                    out.append("<|vision_start|><|image_pad|><|vision_end|>")
            else:
                raise ChatFormatError(f"Unsupported content part: {part!r}")
        return "".join(out)
    raise ChatFormatError(f"Unsupported message content type: {type(content).__name__}")


def normalise(messages: Any) -> list[Message]:
    if not isinstance(messages, list) or not messages:
        raise ChatFormatError("messages must be a non-empty list")
    out = []
    for m in messages:
        if not isinstance(m, dict) or "role" not in m:
            raise ChatFormatError("each message needs a 'role'")
        role = str(m["role"])
        if role not in ("system", "developer", "user", "assistant", "tool", "function"):
            raise ChatFormatError(f"Unknown message role: {role!r}")
        calls = tuple(c for c in (m.get("tool_calls") or []) if isinstance(c, dict))
        out.append(Message(role="system" if role == "developer" else role,
                           text=content_text(m.get("content")), name=str(m.get("name") or ""),
                           tool_calls=calls))
    return out


def render_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """A tool call as the model writes it (qwen3_coder XML format)."""
    parts = [f"<tool_call>\n<function={name}>\n"]
    for key, value in arguments.items():
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        parts.append(f"<parameter={key}>\n{text}\n</parameter>\n")
    parts.append("</function>\n</tool_call>")
    return "".join(parts)


def _call_args(call: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    fn = call.get("function") or {}
    args = fn.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except ValueError:
            args = {"arguments": args}
    return str(fn.get("name") or ""), args if isinstance(args, dict) else {}


def render(messages: list[Message], tools: list[dict[str, Any]] | None = None,
           add_generation_prompt: bool = True, enable_thinking: bool = True) -> str:
    """The prompt text (ChatML)."""
    out: list[str] = []
    system = ""
    rest = messages
    if messages and messages[0].role == "system":
        system, rest = messages[0].text, messages[1:]
    if tools:
        block = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        sys_text = (system + "\n\n" if system else "") + TOOLS_PREAMBLE + block + "\n" \
            + TOOLS_POSTAMBLE
        out.append(f"<|im_start|>system\n{sys_text}<|im_end|>\n")
    elif system:
        out.append(f"<|im_start|>system\n{system}<|im_end|>\n")
    i = 0
    while i < len(rest):
        m = rest[i]
        if m.role in ("tool", "function"):
            # Consecutive tool results share one user turn, as in Qwen's template.
            out.append("<|im_start|>user")
            while i < len(rest) and rest[i].role in ("tool", "function"):
                out.append(f"\n<tool_response>\n{rest[i].text}\n</tool_response>")
                i += 1
            out.append("<|im_end|>\n")
            continue
        if m.role == "assistant":
            body = m.text
            for call in m.tool_calls:
                name, args = _call_args(call)
                body += ("\n\n" if body else "") + render_tool_call(name, args)
            out.append(f"<|im_start|>assistant\n{body}<|im_end|>\n")
        else:
            role = "system" if m.role == "system" else "user"
            out.append(f"<|im_start|>{role}\n{m.text}<|im_end|>\n")
        i += 1
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
        if not enable_thinking:
            out.append("<think>\n\n</think>\n\n")
    return "".join(out)
