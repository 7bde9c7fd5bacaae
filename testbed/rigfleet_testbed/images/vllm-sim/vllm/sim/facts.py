"""Recall: find what the question asks for among facts stated anywhere in the prompt.

Facts are collected from the whole context, at any depth, in the forms people write them:
``X is 'Y'`` / ``X is "Y"`` (quoted values rank highest), ``X: Y`` / ``X = Y`` lines, and
short ``X is Y.`` sentences. The question is the last question sentence of the final user
turn; the fact whose key words best overlap the question's words wins. Without a matching
fact, a tiny built-in fact table and integer arithmetic answer common sanity questions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

STOPWORDS = frozenset("""
a an the and or but if then else of to in on at by for with from into onto about as is are was
were be been being am do does did done have has had having it its it's this that these those
there here what which who whom whose where when why how whats what's please reply respond
answer only just exactly nothing else other me my mine you your yours we our us i he she they
them their his her can could would should will shall may might must tell give say state write
repeat recall remember provide show find return output print word words sentence sentences
one short brief simply plain text exact value precisely again earlier above below previously
mentioned given following not no yes so very also any some all each every more most than too
now ok okay hey hi hello thanks thank let lets let's know think use using used like
""".split())

_WORD_RE = re.compile(r"[A-Za-z0-9]+(?:'[a-z]+)?")


def stem(word: str) -> str:
    """A light stemmer: enough to match "phrases" with "phrase" and "cities" with "city"."""
    w = word.lower()
    if len(w) > 4 and w.endswith("ies"):
        return w[:-3] + "y"
    if len(w) > 5 and w.endswith("ing"):
        return w[:-3]
    if len(w) > 4 and w.endswith("ed") and not w.endswith("eed"):
        return w[:-2]
    if len(w) > 3 and w.endswith("s") and not w.endswith(("ss", "us", "is")):
        return w[:-1]
    return w


def words(text: str) -> list[str]:
    return [w.lower() for w in _WORD_RE.findall(text)]


def content_words(text: str) -> set[str]:
    return {stem(w) for w in words(text) if w not in STOPWORDS and len(w) > 1}


@dataclass(frozen=True)
class Fact:
    key: str
    value: str
    quoted: bool
    start: int
    key_words: frozenset[str]


_QUOTED_RE = re.compile(
    r"(?:\b(?:is|was|are|were|equals|reads|becomes|be)\b|\bset to\b|\bcalled\b|\bnamed\b|[=:])"
    r"[ \t]*(?P<open>['\"\u2018\u201c`])"
    r"(?P<val>[^'\"\u2018\u2019\u201c\u201d`\n]{1,200}?)"
    r"(?P<close>['\"\u2019\u201d`])",
    re.IGNORECASE,
)
_LINE_RE = re.compile(
    r"^[ \t]*(?:[-*\u2022][ \t]*)?(?P<key>[A-Za-z][\w \-/().]{0,60}?)[ \t]*[:=][ \t]*"
    r"(?P<val>[^\n]{1,200})$",
    re.MULTILINE,
)
# Linear-time sentence split (a bounded repeat here would backtrack on long sentences).
_SENTENCE_RE = re.compile(r"[^.!?\n]+[.!?\n]?")
_IS_RE = re.compile(r"^(?P<key>.{2,80}?)\s+(?:is|are|was|were|equals)\s+(?P<val>.{1,100})$",
                    re.IGNORECASE)
_BOUNDARY = re.compile(r"[.!?;:\n\"'\u201c\u201d]")


def _key_before(text: str, pos: int) -> str:
    """The words right before ``pos`` in the same sentence: the fact's subject."""
    window = text[max(0, pos - 160):pos]
    cut = None
    for m in _BOUNDARY.finditer(window):
        cut = m.end()
    if cut is not None:
        window = window[cut:]
    ws = window.split()
    return " ".join(ws[-8:])


def extract_facts(text: str) -> list[Fact]:
    """All facts stated in ``text``, in order of appearance."""
    facts: list[Fact] = []
    for m in _QUOTED_RE.finditer(text):
        key = _key_before(text, m.start())
        kw = content_words(key)
        if kw:
            facts.append(Fact(key, m.group("val").strip(), True, m.start(), frozenset(kw)))
    for m in _LINE_RE.finditer(text):
        key, val = m.group("key").strip(), m.group("val").strip().strip("'\"")
        kw = content_words(key)
        if kw and val and len(key.split()) <= 6:
            facts.append(Fact(key, val.rstrip("."), False, m.start(), frozenset(kw)))
    for s in _SENTENCE_RE.finditer(text):
        raw = s.group(0)
        if len(raw) > 200 or len(raw) < 4 or "?" in raw:
            continue
        sentence = raw.strip().rstrip(".!?")
        if len(sentence.split()) > 14:
            continue
        m2 = _IS_RE.match(sentence)
        if not m2:
            continue
        kw = content_words(m2.group("key"))
        val = m2.group("val").strip().strip("'\"")
        if kw and val:
            facts.append(Fact(m2.group("key").strip(), val, False, s.start(), frozenset(kw)))
    return facts


@dataclass(frozen=True)
class Question:
    """The question being asked and how the answer should be shaped."""

    text: str
    start: int
    words: frozenset[str]
    value_only: bool


_SENT_SPLIT = re.compile(r"(?<=[.!?])\s+|\n+")
_ASKING = re.compile(r"^\s*(?:what|which|who|whom|where|when|how|name|tell|give|recall|repeat|"
                     r"state|list|provide|remind|do you remember|can you|could you)\b",
                     re.IGNORECASE)
_VALUE_ONLY = re.compile(r"\b(?:only|just)\b|nothing else|no other text|no explanation|verbatim",
                         re.IGNORECASE)


def find_question(text: str) -> Question | None:
    """The last question in ``text`` (the final user turn)."""
    tail_start = max(0, len(text) - 4000)  # questions come at the end; keep this O(1)
    tail = text[tail_start:]
    spans = []
    pos = 0
    for part in _SENT_SPLIT.split(tail):
        idx = tail.find(part, pos)
        if part.strip():
            spans.append((idx, part.strip()))
        pos = idx + len(part)
    chosen = None
    for idx, s in reversed(spans):
        if s.endswith("?"):
            chosen = (idx, s)
            break
    if chosen is None:
        for idx, s in reversed(spans[-4:]):
            if _ASKING.match(s):
                chosen = (idx, s)
                break
    if chosen is None:
        return None
    idx, sentence = chosen
    after = tail[idx:]
    return Question(text=sentence, start=tail_start + idx,
                    words=frozenset(content_words(sentence)),
                    value_only=bool(_VALUE_ONLY.search(after)))


def best_fact(question: Question, facts: list[Fact]) -> Fact | None:
    """The fact the question asks for, or None when nothing matches well enough."""
    best: tuple[float, Fact] | None = None
    q = question.words
    if not q:
        return None
    for f in facts:
        if question.start <= f.start < question.start + len(question.text):
            continue  # the question itself is not a fact
        overlap = len(q & f.key_words)
        if overlap == 0:
            continue
        coverage = overlap / len(f.key_words)
        if coverage < 0.5 and overlap < 2:
            continue
        score = 2.0 * overlap + coverage + (1.5 if f.quoted else 0.0) \
            - 0.1 * len(f.key_words - q)
        # Later statements win ties: a value restated later supersedes the earlier one.
        if best is None or score >= best[0]:
            best = (score, f)
    return best[1] if best else None


# --- a tiny world-knowledge table, for sanity checks like "capital of France" -------------

_CAPITALS = {
    "france": "Paris", "germany": "Berlin", "italy": "Rome", "spain": "Madrid",
    "portugal": "Lisbon", "japan": "Tokyo", "china": "Beijing", "india": "New Delhi",
    "canada": "Ottawa", "australia": "Canberra", "brazil": "Brasília", "russia": "Moscow",
    "egypt": "Cairo", "kenya": "Nairobi", "mexico": "Mexico City", "netherlands": "Amsterdam",
    "belgium": "Brussels", "sweden": "Stockholm", "norway": "Oslo", "poland": "Warsaw",
    "greece": "Athens", "turkey": "Ankara", "argentina": "Buenos Aires",
    "england": "London", "united kingdom": "London", "uk": "London",
    "united states": "Washington, D.C.", "usa": "Washington, D.C.", "ireland": "Dublin",
    "austria": "Vienna", "switzerland": "Bern", "finland": "Helsinki", "denmark": "Copenhagen",
    "south korea": "Seoul", "korea": "Seoul", "thailand": "Bangkok", "vietnam": "Hanoi",
}
_KNOWLEDGE = [
    ({"largest", "planet"}, "Jupiter is the largest planet in the Solar System."),
    ({"boil", "water"}, "Water boils at 100 °C (212 °F) at sea level."),
    ({"wrote", "hamlet"}, "William Shakespeare wrote Hamlet."),
    ({"speed", "light"}, "The speed of light in vacuum is 299,792,458 metres per second."),
    ({"chemical", "symbol", "gold"}, "The chemical symbol for gold is Au."),
    ({"color", "sky"}, "The sky looks blue because air scatters short (blue) wavelengths "
                       "of sunlight more than long ones."),
]
_ARITH_RE = re.compile(
    r"(-?\d+(?:\.\d+)?)\s*(\+|-|\*|/|x|×|÷|plus|minus|times|multiplied by|divided by)\s*"
    r"(-?\d+(?:\.\d+)?)", re.IGNORECASE)


def _fmt_number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.6g}"


def arithmetic(question: str) -> tuple[str, str] | None:
    """Evaluate ``a op b`` in a question: (expression, result)."""
    m = _ARITH_RE.search(question)
    if not m:
        return None
    a, op, b = float(m.group(1)), m.group(2).lower(), float(m.group(3))
    if op in ("+", "plus"):
        r = a + b
    elif op in ("-", "minus"):
        r = a - b
    elif op in ("*", "x", "×", "times", "multiplied by"):
        r = a * b
    else:
        if b == 0:
            return None
        r = a / b
    return m.group(0), _fmt_number(r)


def knowledge(question: str) -> str | None:
    """Answer a common general-knowledge question from the built-in table."""
    low = question.lower()
    m = re.search(r"capital (?:city )?of (?:the )?([a-z .]+?)[?.!,]|capital (?:city )?of "
                  r"(?:the )?([a-z .]+)$", low)
    if m:
        country = (m.group(1) or m.group(2) or "").strip()
        city = _CAPITALS.get(country)
        if city:
            return f"The capital of {country.title() if len(country) > 3 else country.upper()} " \
                   f"is {city}."
    cw = content_words(question)
    for keys, answer in _KNOWLEDGE:
        if {stem(k) for k in keys} <= cw:
            return answer
    return None
