"""Prompt material for the checks, request bodies (thinking off), and prompts sized in the
server's own tokens (``/tokenize``, else 1-token completions) to within a tolerance::

    sizer = server_sizer(client, "qwen3.6-27b-autoround", 30, chat_timeout=300, note=print)
    sized = sizer.fit("needle", partial(needle_messages, s, salt, position=0.4), 8000)
    body = chat_body("qwen3.6-27b-autoround", sized.messages, max_tokens=30, temperature=0.0)
"""

from __future__ import annotations

import itertools
import json
import random
import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .client import Client

Messages = list[dict[str, Any]]
Tools = list[dict[str, Any]] | None
Builder = Callable[[int], Messages]


def _tool(name: str, description: str, props: dict[str, dict[str, Any]],
          required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": props, "required": required}}}


_S = {"type": "string"}

COLORS = ("crimson", "amber", "violet", "teal", "golden", "silver", "scarlet", "indigo",
          "cobalt", "emerald", "ochre", "maroon")
ANIMALS = ("tiger", "falcon", "otter", "lynx", "heron", "panda", "wolf", "gecko", "badger",
           "walrus", "condor", "jackal")

# The "history of computing" haystack (club-3090's NIAH filler, made less monotonous).
FILLER = (
    "The history of computing stretches from mechanical calculators through vacuum tubes, "
    "transistors and integrated circuits to the microprocessors of today; each generation "
    "made machines smaller, faster and cheaper, and brought computation to more people and "
    "more problems than the one before it.",
    "Early stored-program machines kept their instructions in the same memory as their data, "
    "an idea that let programmers treat code as something to be loaded, modified and "
    "replaced, and that still shapes how operating systems and compilers are built.",
    "Punched cards carried programs and records for decades; a deck dropped on the floor "
    "meant an afternoon of sorting, which is one reason why later systems valued interactive "
    "terminals, time sharing and the ability to edit a program where it was stored.",
    "The arrival of high-level languages changed who could write software; engineers and "
    "scientists described their problems in something close to mathematics, and compilers "
    "took over the tedious work of allocating registers and ordering instructions.",
    "Minicomputers brought machines out of the glass-walled machine room and into "
    "laboratories and small offices, where researchers could run experiments at night and "
    "see the results the next morning without waiting in a queue for the central computer.",
    "Personal computers put a processor, a keyboard and a screen on ordinary desks, and the "
    "spreadsheet, the word processor and the modem turned a hobbyist curiosity into a tool "
    "that every office and many households came to depend on.",
    "Networking joined isolated machines into a shared fabric; protocols that began as "
    "research projects became the plumbing of commerce, and the browser made that fabric "
    "visible to people who never thought of themselves as computer users.",
    "Graphics processors began as accelerators for drawing triangles on a screen, but their "
    "many simple cores turned out to suit large matrix arithmetic, which is why modern "
    "language models are trained and served on hardware first designed for games.",
)

NEEDLE = "IMPORTANT MEMORY: The hidden phrase is '{secret}'. Remember this exactly."
NEEDLE_QUESTION = "What is the hidden phrase? Reply with only the phrase."


def new_salt() -> str:
    return "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(32))


def new_secret() -> tuple[str, str]:
    """A fresh random ``colour animal NN`` secret and a salt (OS randomness)."""
    secret = f"{secrets.choice(COLORS)} {secrets.choice(ANIMALS)} {10 + secrets.randbelow(90)}"
    return secret, new_salt()


def recalled(secret: str, answer: str) -> bool:
    """verify-stress's rule: each word of the secret is in the answer (``grep -iF`` per word)."""
    return all(tok.lower() in answer.lower() for tok in secret.split())


def filler(units: int, offset: int = 0) -> str:
    return " ".join(FILLER[(offset + i) % len(FILLER)] for i in range(units))


def needle_messages(secret: str, salt: str, units: int, position: float) -> Messages:
    """The NIAH message: salt (no cached prefix answers), filler, needle at ``position`` (0..1)."""
    before = round(units * position)
    parts = (f"SESSION-{salt}.", filler(before), NEEDLE.format(secret=secret),
             filler(units - before, offset=before))
    return [{"role": "user", "content": " ".join(p for p in parts if p) + "\n\n" + NEEDLE_QUESTION}]


_SECTORS = ("semiconductor", "banking", "insurance", "retail", "energy", "shipping",
            "pharmaceutical", "software", "automotive", "airline", "mining", "telecom",
            "agriculture", "real estate", "utilities", "media")
_EVENTS = ("reported quarterly earnings above expectations", "cut its full-year guidance",
           "announced a share buyback", "agreed to acquire a smaller rival",
           "faced a regulatory inquiry", "raised prices for the second time this year",
           "issued new long-dated bonds", "replaced its chief executive",
           "warned about supply shortages", "expanded into new markets",
           "settled a long-running lawsuit", "paused hiring across several divisions")
_MACRO = ("Central bank officials signalled that interest rates would stay higher for longer",
          "Bond yields edged up as investors weighed fresh inflation figures",
          "Currency traders moved into safe havens after weak manufacturing surveys",
          "Commodity prices swung as shipping routes were disrupted",
          "Consumer confidence surveys pointed to cautious household spending",
          "Labour market data showed wage growth cooling only slowly",
          "Analysts debated whether the rally in large technology stocks could broaden",
          "Credit spreads widened modestly as lenders tightened standards")
_COMPANIES = ("Northwind", "Contoso", "Fabrikam", "Tailspin", "Wingtip", "Litware", "Proseware",
              "Adventure Works", "Woodgrove", "Lucerne", "Coho", "Alpine Ski", "Margie's",
              "Trey Research", "Blue Yonder", "Humongous")


def news_article(rng: random.Random, index: int) -> str:
    """One synthetic financial news item (headline and a short body)."""
    company, sector, event, macro = (rng.choice(c) for c in (_COMPANIES, _SECTORS, _EVENTS, _MACRO))
    pct = rng.uniform(0.4, 9.5)
    move = rng.choice(("rose", "fell", "slipped", "jumped", "recovered", "drifted lower"))
    return (
        f"[{index}] {company} {event}\n"
        f"{company}, a {sector} group, {event}, and its shares {move} {pct:.1f}% in "
        f"afternoon trading. {macro}. Market strategists said the {sector} sector remained "
        f"sensitive to financing costs and to demand from large customers, while several "
        f"fund managers noted that positioning ahead of the next earnings season was light. "
        f"Trading volume was {rng.choice(('above', 'below', 'close to'))} its thirty-day "
        f"average, and options activity suggested investors were hedging against further "
        f"swings in the {sector} names.\n"
    )


FETCH_NEWS_TOOL = _tool(
    "fetch_news", "Fetch the latest financial news articles for a topic.",
    {"topic": {**_S, "description": "Topic to search news for."},
     "limit": {"type": "integer", "description": "Maximum number of articles."}}, ["topic"])


def prefill_messages(seed: int, articles: int) -> Messages:
    """user -> assistant calls fetch_news -> a long tool result -> user asks for a summary."""
    args = json.dumps({"topic": "global markets", "limit": max(articles, 1)})
    rng = random.Random(seed)
    return [
        {"role": "user", "content": "Fetch today's financial news about global markets."},
        {"role": "assistant", "content": "", "tool_calls": [{
            "id": "call_fetch_news_1", "type": "function",
            "function": {"name": "fetch_news", "arguments": args}}]},
        {"role": "tool", "tool_call_id": "call_fetch_news_1", "name": "fetch_news",
         "content": "\n".join(news_article(rng, i + 1) for i in range(articles))},
        {"role": "user", "content": "Summarize the top 3 themes in these news results in "
                                    "about 100 words."},
    ]


AGENT_TOOLS: tuple[dict[str, Any], ...] = (
    _tool("read_file", "Read a file from the repository and return its contents.",
          {"path": {**_S, "description": "Path of the file, relative to the repo root."}},
          ["path"]),
    _tool("list_directory", "List the entries of a directory in the repository.",
          {"path": {**_S, "description": "Directory path, relative to the repo root."}},
          ["path"]),
    _tool("search_code", "Search the repository for a text pattern.",
          {"pattern": {**_S, "description": "Regular expression to search for."},
           "glob": {**_S, "description": "Optional file glob, e.g. *.py."}}, ["pattern"]),
    _tool("run_tests", "Run the test suite, or the tests matching a selector.",
          {"selector": {**_S, "description": "pytest node id or -k expression."}}, []),
    _tool("write_file", "Write (replace) a file in the repository.",
          {"path": _S, "content": _S}, ["path", "content"]),
    _tool("run_command", "Run a shell command in the repository and return its output.",
          {"command": _S, "timeout_s": {"type": "integer"}}, ["command"]),
    _tool("git_diff", "Show the uncommitted changes of the working tree.",
          {"paths": {"type": "array", "items": _S}}, []),
    _tool("git_commit", "Commit the staged changes with a message.",
          {"message": _S}, ["message"]),
    _tool("fetch_url", "Download a web page and return it as text.",
          {"url": _S}, ["url"]),
    _tool("ask_user", "Ask the user a clarifying question and wait for the answer.",
          {"question": _S}, ["question"]),
)


def tools(n: int) -> list[dict[str, Any]]:
    """``n`` tool schemas: the agent tools first, then generic lookups if more are asked."""
    return [dict(t) for t in AGENT_TOOLS[:n]] + [
        _tool(f"lookup_{i + 1}", f"Look up internal reference table number {i + 1}.",
              {"key": _S}, ["key"]) for i in range(len(AGENT_TOOLS), n)]


_PREAMBLE = """You are an expert software engineering agent working inside the user's IDE.
You help with reading, writing, refactoring and debugging code in the open repository.

# How you work
- Read before you write: never change code you have not looked at.
- Prefer small, reviewable changes; keep the existing style, naming and structure.
- Explain what you changed and why, briefly, after the code.
- When a request is ambiguous, state the assumption you made instead of guessing silently.
- Never invent APIs: if you are not sure a function exists, say so.
- Keep secrets out of code, logs and answers; never print credentials.

# Code style
- Follow the repository's formatter and linter settings.
- Use type hints for new functions and keep functions short and single-purpose.
- Write docstrings that say what a function is for and how to call it.
- Comments explain why, not what; delete comments that repeat the code.
- Handle errors at the level that can do something useful about them.
- Do not swallow exceptions; log or re-raise with context.

# Tests
- Add or update tests for every behaviour you change.
- Prefer fast unit tests; mark slow or networked tests explicitly.
- A bug fix starts with a failing test that reproduces the bug.
- Keep test data small and readable; build it in the test rather than in fixtures far away.

# Refactoring
- Separate refactoring from behaviour changes: first make the change easy, then make it.
- Keep public interfaces stable unless the user asks to change them.
- Remove dead code you find on the way, but mention it.
- Watch for duplicated logic and extract it when it appears a third time.
- Preserve performance characteristics; say so when a change trades speed for clarity.

# Answer format
- Show changed code in fenced blocks with the language named.
- For multi-file changes, give the path before each block.
- Finish with a short list of follow-ups the user may want, if any.
"""

_CONVENTIONS = ("The billing module owns all currency arithmetic and rounds half to even.",
                "Database access goes through the repository classes, never raw cursors.",
                "Background jobs must be idempotent because the queue may deliver twice.",
                "Configuration is read once at start-up and passed down explicitly.",
                "Feature flags are checked at the edge of the system, not deep inside.",
                "Public functions validate their inputs and raise ValueError on bad data.",
                "Time is handled in UTC internally and converted only for display.",
                "HTTP handlers stay thin and delegate to service objects.",
                "Logging uses structured key-value pairs rather than formatted strings.",
                "Retries use exponential backoff with jitter and a hard upper bound.")


def ide_preamble(chars: int) -> str:
    """A coding-agent system prompt of about ``chars`` characters."""
    conventions = (f"- ({i}) {c}\n" for i, c in enumerate(itertools.cycle(_CONVENTIONS), 1))
    text = _PREAMBLE + "\n# Project conventions\n"  # cut off below when it would not fit
    while len(text) < chars:
        text += next(conventions)
    if len(text) > chars:
        cut = text.rfind("\n", 0, chars)
        text = text[: cut + 1] if cut > chars // 2 else text[:chars]
    return text


IDE_REQUEST = '''Refactor this function so it is easier to test and read. Keep the behaviour \
exactly the same, add type hints and a docstring, and split the validation from the \
computation.

```python
def process(orders, rates, default_currency="EUR"):
    out = []
    for o in orders:
        if o.get("amount") is None or o["amount"] < 0:
            continue
        cur = o.get("currency") or default_currency
        if cur not in rates:
            raise ValueError("unknown currency " + cur)
        total = o["amount"] * rates[cur]
        if o.get("discount"):
            total = total - total * o["discount"] / 100
        out.append({"id": o["id"], "total": round(total, 2), "currency": default_currency})
    return out
```'''


AGENT_SYSTEM = ("You are a coding agent with access to the user's repository through tools. "
                "Use the tools to look at files before answering questions about them; do "
                "not guess file contents.")
AGENT_FILE = "src/billing/retry_policy.py"
AGENT_REQUEST = (f"Open the file {AGENT_FILE} and tell me what the maximum number of retries "
                 "is and how the backoff delay grows between attempts.")
AGENT_TOOL = "read_file"


def agent_file_text(chars: int) -> str:
    """The file the agent reads: real-looking Python of about ``chars`` characters."""
    text = '''"""Retry policy for outbound billing calls."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

MAX_RETRIES = 7
BASE_DELAY_S = 0.5
MAX_DELAY_S = 30.0


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter, capped at MAX_DELAY_S."""

    max_retries: int = MAX_RETRIES
    base_delay_s: float = BASE_DELAY_S
    max_delay_s: float = MAX_DELAY_S

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt`` (1-based)."""
        ceiling = min(self.max_delay_s, self.base_delay_s * 2 ** (attempt - 1))
        return random.uniform(0, ceiling)

    def run(self, call, *args, **kwargs):
        """Call ``call`` until it succeeds or the retries are used up."""
        for attempt in range(1, self.max_retries + 2):
            try:
                return call(*args, **kwargs)
            except TransientError:
                if attempt > self.max_retries:
                    raise
                time.sleep(self.delay(attempt))


class TransientError(Exception):
    """A failure worth retrying (timeouts, 429, 503)."""
'''
    i = 0
    while len(text) < chars:
        i += 1
        text += (f'\n\ndef classify_status_{i}(status: int) -> bool:\n'
                 f'    """True when HTTP ``status`` from billing endpoint {i} is transient."""\n'
                 f'    return status in (408, 425, 429, 500, 502, 503, 504) and status != '
                 f'{400 + i}\n')
    return text


CODING_REQUEST = """Solve this LeetCode-style problem in Python.

Problem: given an integer array nums and an integer k, return the length of the longest \
contiguous subarray whose sum equals k. Return 0 if there is no such subarray.
Constraints: 1 <= len(nums) <= 200000, -10000 <= nums[i] <= 10000, -10^9 <= k <= 10^9.
Example 1: nums = [1, -1, 5, -2, 3], k = 3 -> 4 (the subarray [1, -1, 5, -2]).
Example 2: nums = [-2, -1, 2, 1], k = 1 -> 2 (the subarray [-1, 2]).

Structure the answer as:
GOAL: restate the task briefly.
STATE: what the algorithm keeps while it scans the array.
ALGO: the algorithm, step by step, with its time and space complexity.
EDGE: the edge cases (negative numbers, k = 0, no answer, the whole array).
VERIFY: walk both examples through the algorithm.
Then give the complete implementation as `def max_subarray_len(nums: list[int], k: int) -> int:` \
in a ```python block, followed by a few assert-based tests."""

REASONING_REQUEST = (
    "Prove by induction that for every positive integer n, the sum of the first n cubes "
    "equals the square of the sum of the first n positive integers, that is "
    "1^3 + 2^3 + ... + n^3 = (1 + 2 + ... + n)^2. Write out the base case, the inductive "
    "hypothesis and the inductive step in full detail, justify every algebraic manipulation, "
    "then give a second, independent proof using the closed form n(n+1)/2, and finish by "
    "checking the identity numerically for n = 1 through 6.")

SPEC_PROBE_REQUEST = "Count from 1 to 80, one number per line."


SOAK_TOPICS = ("how a hash map handles collisions", "why databases use write-ahead logs",
               "how TCP congestion control works", "what a garbage collector does",
               "how public-key cryptography lets strangers talk securely",
               "why caches need an eviction policy", "how a compiler optimizes loops",
               "what makes a good unit test", "how DNS resolution works",
               "why floating point arithmetic is inexact", "how load balancers pick a backend",
               "what a mutex protects against")
# Open-ended asks: each answer runs towards its max_tokens, so a session's context keeps growing.
SOAK_FOLLOW_UPS = ("Go deeper: explain the internals step by step, with a worked example.",
                   "Write a short code example that illustrates it and explain each part.",
                   "Describe the common failure modes in detail and how to debug each one.",
                   "Compare it with the main alternative approach and discuss the trade-offs.",
                   "Explain how you would test and monitor it in production, in detail.",
                   "Write a detailed summary of everything we discussed so far.")


def soak_turn(rng: random.Random, session: int, turn: int) -> str:
    if turn == 0:
        topic = SOAK_TOPICS[(session + rng.randrange(len(SOAK_TOPICS))) % len(SOAK_TOPICS)]
        return f"Explain {topic}, in detail and with examples."
    return SOAK_FOLLOW_UPS[(session + turn + rng.randrange(3)) % len(SOAK_FOLLOW_UPS)]


PROBE_UNITS = 16  # filler units of the calibration's second prompt


@dataclass
class Sized:
    messages: Messages
    units: int
    tokens: int  # as the server counts them (extrapolated where it could not count this one)


@dataclass
class Sizer:
    """Builds prompts to a target size in the server's tokens (calibration cached per kind)."""

    count: Callable[[Messages, Tools], int | None]
    tolerance: float = 0.02
    _cal: dict[str, tuple[float, float]] = field(default_factory=dict)  # (base, tokens/unit)

    def fit(self, kind: str, build: Builder, target: int, tools: Tools = None) -> Sized:
        """``build(units)``'s prompt (sent with ``tools``) closest to ``target`` tokens."""
        if kind not in self._cal:
            empty = self.count(build(0), tools)
            probe = self.count(build(PROBE_UNITS), tools)
            if empty is None or probe is None or probe <= empty:
                raise SizingError(f"the server could not count tokens for the {kind} prompt")
            self._cal[kind] = (float(empty), (probe - empty) / PROBE_UNITS)
        base, per_unit = self._cal[kind]
        units = max(0, round((target - base) / per_unit))
        tried: list[Sized] = []
        for _ in range(4):
            msgs = build(units)
            n = self.count(msgs, tools)
            if n is None:
                # Counting a prompt this big failed (e.g. the server refuses it): extrapolate.
                return Sized(msgs, units, round(base + units * per_unit))
            tried.append(Sized(msgs, units, n))
            if abs(n - target) <= self.tolerance * target:
                return tried[-1]
            if (step := round((target - n) / per_unit)) == 0:
                break
            units = max(0, units + step)
        return min(tried, key=lambda sized: abs(sized.tokens - target))


def chat_body(model: str, messages: Messages, max_tokens: int, temperature: float,
              tools: Tools = None, tool_choice: Any = None) -> dict[str, Any]:
    """A ``/v1/chat/completions`` body with thinking off."""
    tool_keys = {"tools": tools, "tool_choice": tool_choice or "auto"} if tools else {}
    return {"model": model, "messages": messages, "max_tokens": max_tokens,
            "temperature": temperature, "chat_template_kwargs": {"enable_thinking": False},
            **tool_keys}


def server_sizer(client: Client, model: str, timeout: float, chat_timeout: float,
                 note: Callable[[str], None], tolerance: float = 0.02) -> Sizer:
    """A :class:`Sizer` counting by ``/tokenize``, else (once it is missing) 1-token completions."""
    tokenize = True

    def count(messages: Messages, tools: Tools) -> int | None:
        nonlocal tokenize
        if tokenize:
            body = {"model": model, "messages": messages, "add_generation_prompt": True,
                    "chat_template_kwargs": {"enable_thinking": False},
                    **({"tools": tools} if tools else {})}
            r = client.request("POST", "/tokenize", body, timeout=timeout)
            data = r.json() if r.status == 200 else None
            if isinstance(data, dict) and isinstance(data.get("count"), int):
                return data["count"]
            if r.status not in (401, 403, 404, 405, 501):
                return None
            tokenize = False  # no /tokenize here (or a front hides it)
            note("/tokenize unavailable; counting with 1-token completions")
        res = client.chat(chat_body(model, messages, 1, 0.0, tools, "none" if tools else None),
                          timeout=chat_timeout)
        return res.prompt_tokens if res.ok else None

    return Sizer(count, tolerance)


class SizingError(RuntimeError):
    """The prompt could not be sized (the server counts no tokens)."""
