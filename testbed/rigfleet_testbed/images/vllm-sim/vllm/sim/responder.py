"""The rule-based "model": decides what a healthy model would answer to a request.

General rules, applied to whatever the request says:

1. Tools: with tools offered and ``tool_choice`` auto/required/named, a user request that a
   tool fits (its words overlap the tool's name, description or parameter names) becomes a
   tool call with arguments filled from the request; a tool result is answered in text.
2. Recall: a question whose words match a fact stated in the context is answered with the
   fact's value (at any depth of the prompt).
3. Knowledge and arithmetic for common sanity questions.
4. Otherwise deterministic text whose length and shape follow the request.

What happens to the answer on the way out (token budget, KV-cache corruption, spec-decode
regressions) is the engine's business, not this module's.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from vllm.sim import textgen
from vllm.sim.chat import Message
from vllm.sim.facts import (
    STOPWORDS,
    arithmetic,
    best_fact,
    content_words,
    extract_facts,
    find_question,
    knowledge,
    stem,
)

_NUMBER_WORDS = {
    "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
    "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "fifteen": 15, "twenty": 20, "a": 1,
    "single": 1, "a few": 3, "several": 4, "fifty": 50, "hundred": 100, "a hundred": 100,
}
_NUM = r"(\d+|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|fifteen|twenty|" \
       r"fifty|a hundred|hundred|a few|several|single|a)"
_LONG_RE = re.compile(
    r"\b(write|explain|prove|proof|implement|essay|step[- ]by[- ]step|detailed|describe|"
    r"elaborate|tutorial|refactor|analy[sz]e|derive|discuss|guide|report|article|walk me "
    r"through|in depth|comprehensive|thorough)\b", re.IGNORECASE)
_CODE_RE = re.compile(
    r"\b(code|function|implement|program|script|class|refactor|python|javascript|typescript|"
    r"rust|golang|algorithm|leetcode|subarray|bug|compile|def)\b|```", re.IGNORECASE)
_SUMMARY_RE = re.compile(
    r"\b(summari[sz]e|summary|themes?|based on|according to|above|results?|findings|"
    r"what did|key points|takeaways|overview)\b", re.IGNORECASE)
_GENERIC_TOOL_WORDS = frozenset({"get", "set", "do", "run", "call", "tool", "function", "make",
                                 "use", "the", "a", "an", "to", "for", "of", "and", "or",
                                 "fetch", "current", "given", "specified", "return", "returns"})
# A few everyday synonyms, so "forecast" finds get_weather and "open" finds read_file.
_SYNONYMS = {
    "weather": {"forecast", "temperature", "rain", "sunny", "climate", "humid", "humidity"},
    "file": {"open", "contents", "content", "source"},
    "read": {"open", "show", "view", "contents", "cat", "look"},
    "search": {"find", "lookup", "look", "query", "google"},
    "news": {"headlines", "articles", "stories", "happening"},
    "time": {"clock", "hour", "date"},
    "calculate": {"compute", "sum", "multiply", "add", "math"},
    "email": {"mail", "message", "send"},
    "stock": {"price", "share", "ticker", "market"},
    "list": {"show", "ls", "directory", "files"},
}
_LOCATION_PARAMS = {"city", "location", "place", "town", "country", "region", "address", "area"}
_PATH_PARAMS = {"path", "file", "filename", "file_path", "filepath", "dir", "directory",
                "target_file", "file_name"}
_QUERY_PARAMS = {"query", "q", "search", "text", "prompt", "question", "keywords", "keyword",
                 "topic", "term", "terms", "input", "message", "content", "description"}
_UNIT_WORDS = ("celsius", "fahrenheit", "kelvin", "metric", "imperial")


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    id: str = ""

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass
class Reply:
    """What the model would produce, before budgets and failure modes apply."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    kind: str = "text"  # text | recall | knowledge | tool_call | tool_summary | code
    recall_value: str = ""  # for kind "recall": the fact's value as the reply states it


@dataclass
class ChatTask:
    """A request as the responder sees it."""

    messages: list[Message]
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: Any = "none"
    thinking: bool = False
    seed: int = 0


def seed_of(text: str, extra: int | None = None) -> int:
    h = int.from_bytes(hashlib.sha256(text.encode("utf-8", "replace")).digest()[:8], "big")
    return h ^ (extra or 0)


# --- tools --------------------------------------------------------------------------------

def _split_name(name: str) -> list[str]:
    parts = re.split(r"[_\-\s.]+|(?<=[a-z])(?=[A-Z])", name)
    return [p.lower() for p in parts if p]


def _tool_fn(tool: dict[str, Any]) -> dict[str, Any]:
    fn = tool.get("function") if isinstance(tool, dict) else None
    return fn if isinstance(fn, dict) else (tool if isinstance(tool, dict) else {})


def _request_terms(text: str) -> set[str]:
    terms = content_words(text)
    for key, syns in _SYNONYMS.items():
        if terms & {stem(s) for s in syns} or stem(key) in terms:
            terms.add(stem(key))
    return terms


def score_tool(tool: dict[str, Any], request: str) -> float:
    """How well ``tool`` fits the request: name words count most, then description/params."""
    fn = _tool_fn(tool)
    terms = _request_terms(request)
    name_parts = {stem(p) for p in _split_name(str(fn.get("name", "")))} - {
        stem(g) for g in _GENERIC_TOOL_WORDS}
    desc = content_words(str(fn.get("description", ""))) - _GENERIC_TOOL_WORDS
    props = ((fn.get("parameters") or {}).get("properties") or {}) if isinstance(
        fn.get("parameters"), dict) else {}
    param_parts = {stem(p) for k in props for p in _split_name(k)}
    return 3.0 * len(terms & name_parts) + 1.0 * len(terms & desc) + 0.5 * len(
        terms & param_parts)


def pick_tool(tools: list[dict[str, Any]], request: str, required: bool) -> dict[str, Any] | None:
    scored = [(score_tool(t, request), i, t) for i, t in enumerate(tools)]
    scored.sort(key=lambda x: (-x[0], x[1]))
    if not scored:
        return None
    best_score, _, best = scored[0]
    if best_score >= 2.0 or required:
        return best
    return None


_CAP_PHRASE = re.compile(
    r"\b(?:in|for|at|near|of|from|to)\s+((?:[A-Z][\w'\-]*)(?:\s+[A-Z][\w'\-]*)*)"
)
_ANY_CAP = re.compile(r"(?<![.!?]\s)(?<!^)\b([A-Z][a-z][\w'\-]*(?:\s+[A-Z][a-z][\w'\-]*)*)")
_PATH_RE = re.compile(r"(?:[\w.\-]*/)+[\w.\-]+|\b[\w\-]+\.(?:py|js|ts|rs|go|md|txt|json|yaml|yml|"
                      r"toml|c|cc|cpp|h|java|sh|cfg|ini|csv|html|css)\b")
_URL_RE = re.compile(r"https?://\S+")
_QUOTED_RE = re.compile(r"[\"'\u201c\u2018]([^\"'\u201d\u2019\n]{1,200})[\"'\u201d\u2019]")
_NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?")


def _query_text(request: str) -> str:
    ws = [w for w in re.findall(r"[\w'\-]+", request) if w.lower() not in STOPWORDS]
    return " ".join(ws[:12]) or request.strip()[:100]


def fill_arguments(fn: dict[str, Any], request: str) -> dict[str, Any]:
    """Arguments for ``fn`` taken from the request's words where possible."""
    params = fn.get("parameters") if isinstance(fn.get("parameters"), dict) else {}
    props = params.get("properties") or {}
    required = set(params.get("required") or [])
    args: dict[str, Any] = {}
    low = request.lower()
    for name, spec in props.items():
        spec = spec if isinstance(spec, dict) else {}
        typ = spec.get("type")
        if isinstance(typ, list):
            typ = next((t for t in typ if t != "null"), "string")
        enum = spec.get("enum")
        lname = name.lower()
        value: Any = None
        if isinstance(enum, list) and enum:
            value = next((e for e in enum if str(e).lower() in low), None)
            if value is None and name in required:
                value = spec.get("default", enum[0])
        elif typ in ("integer", "number"):
            m = _NUMBER_RE.search(request)
            if m:
                value = int(float(m.group(0))) if typ == "integer" else float(m.group(0))
            elif name in required:
                value = spec.get("default", 1)
        elif typ == "boolean":
            value = spec.get("default", False) if name in required else None
        elif typ == "array":
            if name in required:
                value = [_query_text(request)] if (spec.get("items") or {}).get(
                    "type") == "string" else []
        elif typ == "object":
            value = {} if name in required else None
        else:
            if lname in _LOCATION_PARAMS or any(p in lname for p in ("city", "location")):
                m = _CAP_PHRASE.search(request) or _ANY_CAP.search(request)
                value = m.group(1) if m else None
            elif lname in _PATH_PARAMS or "path" in lname or "file" in lname:
                m = _PATH_RE.search(request)
                value = m.group(0) if m else None
            elif "url" in lname or "link" in lname:
                m = _URL_RE.search(request)
                value = m.group(0) if m else None
            elif "unit" in lname:
                value = next((u for u in _UNIT_WORDS if u in low), None)
            elif lname in _QUERY_PARAMS:
                m = _QUOTED_RE.search(request)
                value = m.group(1) if m else _query_text(request)
            else:
                m = _QUOTED_RE.search(request) or _CAP_PHRASE.search(request)
                value = m.group(1) if m else None
            if value is None and name in required:
                value = spec.get("default") or _query_text(request)
        if value is not None:
            args[name] = value
    return args


# --- text answers -------------------------------------------------------------------------

def _num(s: str) -> int:
    s = s.lower()
    return int(s) if s.isdigit() else _NUMBER_WORDS.get(s, 1)


def _sentences(gen: textgen.Generator, n: int, lead: str = "") -> str:
    out = [lead] if lead else []
    while len(out) < n:
        out.append(gen.sentence())
    return " ".join(out[:n])


def _language(text: str) -> str:
    low = text.lower()
    if "rust" in low:
        return "rust"
    if "javascript" in low or "typescript" in low or " js " in low:
        return "javascript"
    return "python"


def plan_text(request: str, gen: textgen.Generator, lead: str = "") -> tuple[str, str]:
    """Text shaped by what the request asks for: (text, kind)."""
    low = request.lower()
    r = gen.rng
    m = re.search(r"count (?:from )?(-?\d+) to (-?\d+)", low)
    if m:
        return textgen.count_lines(int(m.group(1)), int(m.group(2))), "text"
    if "haiku" in low:
        return textgen.haiku(gen), "text"
    m = re.search(_NUM + r"[- ]words?\b", low) or re.search(
        r"\b(?:in|about|around|roughly|approximately|under|at most|within)\s+" + _NUM +
        r"\s+words", low)
    if m:
        n = _num(m.group(1))
        if n >= 200:
            return gen.prose(int(n * 1.35), title=_title(gen)), "text"
        return ((lead + " ") if lead else "") + gen.words(max(n - len(lead.split()), 1)), "text"
    m = re.search(_NUM + r"[- ](?:short )?sentences?\b", low)
    if m:
        return _sentences(gen, _num(m.group(1)), lead), "text"
    m = re.search(_NUM + r"[- ]paragraphs?\b", low)
    if m:
        return "\n\n".join(gen.paragraph() for _ in range(_num(m.group(1)))), "text"
    if re.search(r"\b(one|single|a) word\b", low):
        return (gen.topics[0] if gen.topics else "Yes").capitalize() + ".", "text"
    long_req = bool(_LONG_RE.search(request))
    if _CODE_RE.search(request) and (long_req or "```" in request or "def " in request):
        return gen.code(r.randint(900, 1800), _language(request)), "code"
    if long_req:
        steps = bool(re.search(r"step[- ]by[- ]step|steps", low))
        return gen.prose(r.randint(1200, 2600), title=_title(gen), steps=steps), "text"
    if request.strip().endswith("?") and len(request.split()) < 40:
        return _sentences(gen, r.randint(1, 2), lead), "text"
    return ((lead + "\n\n") if lead else "") + gen.prose(r.randint(120, 400)), "text"


def _title(gen: textgen.Generator) -> str:
    return " and ".join(t.capitalize() for t in gen.topics[:2])


def _last(messages: list[Message], role: str) -> Message | None:
    for m in reversed(messages):
        if m.role == role:
            return m
    return None


def _tool_name_for(messages: list[Message], tool_msg: Message) -> str:
    if tool_msg.name:
        return tool_msg.name
    for m in reversed(messages):
        for call in m.tool_calls:
            name = (call.get("function") or {}).get("name")
            if name:
                return str(name)
    return "tool"


def _summary(messages: list[Message], tool_msg: Message, request: str,
             gen_seed: int) -> Reply:
    topics = textgen.topic_words(tool_msg.text, limit=8) or textgen.topic_words(request)
    gen = textgen.Generator(gen_seed, topics)
    name = _tool_name_for(messages, tool_msg)
    themes = topics[:3] or ["the results"]
    lead = (f"Based on the {name} results, the main themes are "
            f"{', '.join(themes[:-1]) + ' and ' + themes[-1] if len(themes) > 1 else themes[0]}.")
    m = re.search(r"\b(?:in|about|around|roughly|under)\s+" + _NUM + r"\s+words", request.lower())
    n_words = _num(m.group(1)) if m else gen.rng.randint(60, 140)
    body = gen.words(max(n_words - len(lead.split()), 20))
    return Reply(content=f"{lead} {body}", kind="tool_summary")


def _reasoning(gen: textgen.Generator, lead: str, long_task: bool) -> str:
    target = gen.rng.randint(150, 400) if long_task else gen.rng.randint(30, 70)
    return gen.reasoning(target, lead)


def respond(task: ChatTask) -> Reply:
    """Decide the healthy answer to a chat request."""
    msgs = task.messages
    last = msgs[-1]
    user = _last(msgs, "user")
    request = user.text if user else last.text
    tool_choice = task.tool_choice
    tools = task.tools or []
    named = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, dict) else None
    gen_seed = task.seed

    reply: Reply | None = None
    if tools and tool_choice != "none":
        fn = None
        if named:
            fn = next((_tool_fn(t) for t in tools if _tool_fn(t).get("name") == named), None)
        elif last.role in ("tool", "function") and tool_choice != "required":
            fn = None  # answer the tool result in text
        elif last.role == "user":
            earlier_tool = _last(msgs, "tool")
            refers_back = earlier_tool is not None and _SUMMARY_RE.search(request)
            if not refers_back or tool_choice == "required":
                chosen = pick_tool(tools, request, required=tool_choice == "required")
                fn = _tool_fn(chosen) if chosen else None
        elif tool_choice == "required":
            fn = _tool_fn(tools[0])
        if fn:
            call = ToolCall(name=str(fn.get("name", "")), arguments=fill_arguments(fn, request),
                            id="chatcmpl-tool-" + hashlib.sha256(
                                f"{gen_seed}/{fn.get('name')}".encode()).hexdigest()[:32])
            reply = Reply(tool_calls=[call], kind="tool_call")
            if task.thinking:
                gen = textgen.Generator(gen_seed, textgen.topic_words(request))
                reply.reasoning = gen.reasoning(
                    gen.rng.randint(25, 60),
                    f"The user wants something the {call.name} tool can provide, so I will call "
                    f"it with {call.arguments_json}.")
            return reply

    tool_msg = last if last.role in ("tool", "function") else None
    if tool_msg is None and _last(msgs, "tool") is not None and _SUMMARY_RE.search(request):
        tool_msg = _last(msgs, "tool")
    if tool_msg is not None:
        reply = _summary(msgs, tool_msg, request, gen_seed)
    else:
        reply = _answer_text(msgs, request, gen_seed)
    if task.thinking:
        gen = textgen.Generator(gen_seed ^ 0x5EED, textgen.topic_words(request))
        lead = _reasoning_lead(reply, request)
        reply.reasoning = _reasoning(gen, lead, long_task=reply.kind in ("code",) or len(
            reply.content) > 2000)
    return reply


def _reasoning_lead(reply: Reply, request: str) -> str:
    if reply.kind == "recall":
        return ("The user asks about something stated earlier in the context. Searching the "
                f"conversation, I find it: {reply.content.strip()}")
    if reply.kind == "knowledge":
        return f"This is a factual question. {reply.content.strip()}"
    q = request.strip().split("\n")[-1][:160]
    return f'The user wrote: "{q}". Let me work out what a good answer needs.'


def _answer_text(msgs: list[Message], request: str, seed: int) -> Reply:
    question = find_question(request)
    if question is not None:
        # Search the whole conversation, in order, for the fact asked about.
        full = "\n".join(m.text for m in msgs)
        offset = full.rfind(request)
        facts = extract_facts(full)
        shifted = question
        if offset >= 0:
            shifted = type(question)(question.text, question.start + offset, question.words,
                                     question.value_only)
        fact = best_fact(shifted, facts)
        if fact is not None:
            if shifted.value_only:
                return Reply(content=fact.value, kind="recall", recall_value=fact.value)
            key = fact.key[:1].upper() + fact.key[1:]
            return Reply(content=f"{key} is '{fact.value}'.", kind="recall",
                         recall_value=fact.value)
        known = knowledge(question.text)
        if known:
            return Reply(content=known, kind="knowledge")
        arith = arithmetic(question.text)
        if arith:
            expr, result = arith
            content = result if question.value_only else f"{expr.strip()} = {result}."
            return Reply(content=content, kind="knowledge")
    gen = textgen.Generator(seed, textgen.topic_words(request))
    text, kind = plan_text(request, gen)
    return Reply(content=text, kind=kind)


def respond_completion(prompt: str, seed: int) -> Reply:
    """A raw completion: recall/knowledge if the prompt ends in a question, else text."""
    reply = _answer_text([Message(role="user", text=prompt)], prompt, seed)
    if reply.kind == "text" and not prompt.rstrip().endswith("?"):
        reply.content = " " + reply.content.lstrip()
    return reply
