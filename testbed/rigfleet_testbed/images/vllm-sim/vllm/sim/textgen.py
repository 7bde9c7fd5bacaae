"""Deterministic text: prose, code, lists and reasoning, seeded by the prompt.

Nothing here is meant to be *right*; it is meant to look like a healthy model's output to the
checks people run: varied words (unique/total of the first 200 words well above 0.3), no line
repeated over and over, no punctuation floods, code that looks like code, and lengths that
follow the request (a one-sentence answer, "about 100 words", a long essay).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable

from vllm.sim import tokenizer
from vllm.sim.facts import STOPWORDS

NOUNS = """
system model process structure pattern signal layer network function value result method
approach design interface memory cache request response buffer channel stream sequence
context token vector matrix gradient weight parameter module component service cluster node
queue schedule pipeline kernel thread resource budget limit threshold boundary constraint
estimate measure metric baseline benchmark experiment hypothesis theory principle argument
evidence example detail summary outline section chapter paragraph question problem solution
trade-off decision strategy goal plan step stage phase iteration cycle loop branch path
route map graph tree index key record table column field schema query filter operator
expression statement variable constant type object class instance library framework tool
platform device driver protocol packet frame header payload checksum version release
update change fix patch regression failure error warning exception fault recovery backup
snapshot history timeline origin evolution transition shift trend behaviour property feature
capability limitation risk cost benefit impact effect cause mechanism factor variable ratio
rate speed latency throughput capacity volume density frequency distribution average median
variance deviation sample population range scale dimension axis angle surface region area
""".split()
VERBS = """
shapes drives supports reduces improves explains reveals controls limits extends connects
separates combines transforms balances measures predicts describes captures tracks shares
stores retrieves computes evaluates compares produces consumes schedules allocates releases
validates verifies protects exposes hides simplifies complicates accelerates delays guides
determines influences reflects follows precedes enables prevents requires replaces preserves
organizes encodes decodes filters ranks groups splits merges maps reduces aligns adapts
""".split()
ADJECTIVES = """
careful simple robust fragile efficient costly narrow broad early late stable unstable
dynamic static local global partial complete explicit implicit central peripheral
practical theoretical modern classic reliable noisy clean hidden visible common rare
useful limited flexible rigid coherent independent shared private gradual sudden
consistent uneven accurate rough detailed abstract concrete direct indirect layered
compact sparse dense modest significant minor major careful deliberate natural formal
""".split()
ADVERBS = """
quickly slowly carefully gradually directly indirectly often rarely usually typically
clearly quietly steadily sharply roughly precisely mostly partly largely naturally
""".split()
OPENERS = [
    "In practice,", "At the same time,", "For this reason,", "As a result,", "In contrast,",
    "More importantly,", "Over time,", "In most cases,", "By comparison,", "Taken together,",
    "To see why,", "Put simply,", "On closer inspection,", "Historically,", "In short,",
    "Even so,", "Notably,", "Consequently,", "Meanwhile,", "Finally,",
]
TEMPLATES = [
    "{Op} the {adj} {n1} {v} the {n2} of the {topic}.",
    "The {topic} {v} how each {n1} handles its {n2}, which keeps the {n3} {adj2}.",
    "{Op} a {adj} {n1} {v} the {topic} when the {n2} is {adj2}.",
    "Every {n1} in the {topic} {v} a {adj} {n2}, and that {v2} the overall {n3}.",
    "A {adj} view of the {topic} treats the {n1} as a {n2} that {v} the {n3}.",
    "{Op} the {n1} {adv} {v} the {topic}, so the {n2} stays {adj}.",
    "When the {n1} grows, the {topic} {v} its {n2} and the {n3} becomes {adj}.",
    "The {adj} {n1} and the {adj2} {n2} together {v3} the {topic}.",
    "One {adj} {n1} is to let the {topic} {v3} the {n2} before the {n3} changes.",
    "This is why the {topic} {adv} {v} both the {n1} and the {n2}.",
    "{Op} we can think of the {topic} as a {n1} with a {adj} {n2}.",
    "The {n1} of the {topic} {v} the {n2}, while the {n3} {v2} the rest.",
    "Without a {adj} {n1}, the {topic} {v} far less of the {n2}.",
    "It helps to compare the {topic} with a {adj} {n1} that {v} a {n2}.",
    "{Op} the {topic} {v} {n1} and {n2} in a {adj} way.",
    "Each {n1} adds a {adj} {n2}, and the {topic} {v} them {adv}.",
]
REASONING_TEMPLATES = [
    "The user is asking about {topic}.",
    "Let me think about how the {n1} relates to the {topic}.",
    "I should check whether the {n1} {v} the {n2} here.",
    "The key point is the {adj} {n1} of the {topic}.",
    "I need to keep the answer {adj} and focused on the {n1}.",
    "Another angle: the {n1} {v} the {n2}, which matters for the {topic}.",
    "So the answer should cover the {n1}, the {n2} and the {topic}.",
    "Let me make sure the {n1} is consistent with the {n2}.",
]


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


_A_VOWEL = re.compile(r"\b([Aa]) (?=[aeiouAEIOU])")


def _articles(s: str) -> str:
    """"a early" -> "an early"."""
    return _A_VOWEL.sub(lambda m: m.group(1) + "n ", s)


# Words that say what to do rather than what about; never topics.
REQUEST_WORDS = frozenset("""
write explain explaining explained describe describing detailed detail essay implement
implementation prove proof step steps summarize summarise summary elaborate discuss create
generate produce compose draft make please help need want could would should answer
question questions response brief short long words word paragraph paragraphs sentences
sentence three five about using based include including following works work
""".split())


class Generator:
    """A seeded source of text built from the prompt's topic words plus general vocabulary."""

    def __init__(self, seed: int, topics: Iterable[str] = ()):
        self.rng = random.Random(seed)
        self.topics = [t for t in topics if t] or ["system", "design", "approach"]

    def _fill(self, template: str) -> str:
        r = self.rng
        return template.format(
            Op=r.choice(OPENERS), topic=r.choice(self.topics),
            adj=r.choice(ADJECTIVES), adj2=r.choice(ADJECTIVES), adv=r.choice(ADVERBS),
            n1=r.choice(NOUNS), n2=r.choice(NOUNS), n3=r.choice(NOUNS),
            v=r.choice(VERBS), v2=r.choice(VERBS), v3=r.choice(VERBS).rstrip("s"),
        )

    def sentence(self) -> str:
        return _articles(_cap(self._fill(self.rng.choice(TEMPLATES))))

    def reasoning_sentence(self) -> str:
        return _articles(_cap(self._fill(self.rng.choice(REASONING_TEMPLATES))))

    def paragraph(self, sentences: int | None = None) -> str:
        n = sentences or self.rng.randint(3, 6)
        return " ".join(self.sentence() for _ in range(n))

    def words(self, n: int) -> str:
        """Prose of about ``n`` words (whole sentences, trimmed to ``n``)."""
        out: list[str] = []
        while len(out) < n:
            out.extend(self.sentence().split())
        text = " ".join(out[:n])
        return text.rstrip(",;") + ("" if text.endswith(".") else ".")

    def prose(self, target_tokens: int, title: str | None = None, steps: bool = False) -> str:
        """Paragraphs (with headings for long texts) until about ``target_tokens`` tokens."""
        parts: list[str] = []
        used = 0
        if title and target_tokens > 300:
            parts.append(f"# {title}")
            used += tokenizer.count(title) + 2
        section = 0
        while used < target_tokens:
            if target_tokens > 400 and len(parts) % 4 == (1 if title else 0):
                section += 1
                head = (f"## Step {section}: {_cap(self.rng.choice(VERBS).rstrip('s'))} the "
                        f"{self.rng.choice(NOUNS)}" if steps else
                        f"## {section}. The {self.rng.choice(ADJECTIVES)} "
                        f"{self.rng.choice(NOUNS)} of the {self.rng.choice(self.topics)}")
                parts.append(head)
                used += tokenizer.count(head) + 2
            para = self.paragraph()
            parts.append(para)
            used += tokenizer.count(para) + 2
        return "\n\n".join(parts)

    def reasoning(self, target_tokens: int, lead: str = "") -> str:
        out = [lead] if lead else []
        used = tokenizer.count(lead)
        while used < target_tokens:
            s = self.reasoning_sentence() if self.rng.random() < 0.6 else self.sentence()
            out.append(s)
            used += tokenizer.count(s) + 1
        return " ".join(out)

    def code(self, target_tokens: int, language: str = "python") -> str:
        """Code-shaped text: several small functions using the prompt's words as names."""
        names = [re.sub(r"[^a-z0-9_]", "", t.lower()) for t in self.topics]
        names = [n for n in names if n and not n[0].isdigit()] or ["data"]
        r = self.rng
        blocks: list[str] = []
        used = 0
        i = 0
        while used < target_tokens:
            i += 1
            a, b = r.choice(names), r.choice(NOUNS).replace("-", "_")
            verb = r.choice(['compute', 'build', 'find', 'update', 'merge', 'check', 'load',
                             'split'])
            fname = f"{verb}_{a}_{b}"
            acc = f"{r.choice(NOUNS).replace('-', '_')}_{i}"
            item = r.choice(["item", "entry", "node", "value", "row", "elem"])
            limit = r.randint(2, 97)
            if language == "javascript":
                block = (
                    f"function {_camel(fname)}({a}, limit = {limit}) {{\n"
                    f"  // {self.sentence()}\n"
                    f"  let {_camel(acc)} = 0;\n"
                    f"  for (const {item} of {a}) {{\n"
                    f"    if ({item} > limit) {{\n"
                    f"      {_camel(acc)} += {item} % {r.randint(2, 13)};\n"
                    f"    }}\n"
                    f"  }}\n"
                    f"  return {_camel(acc)};\n"
                    f"}}")
            elif language == "rust":
                block = (
                    f"fn {fname}({a}: &[i64], limit: i64) -> i64 {{\n"
                    f"    // {self.sentence()}\n"
                    f"    let mut {acc} = 0;\n"
                    f"    for {item} in {a}.iter().filter(|x| **x > limit) {{\n"
                    f"        {acc} += {item} % {r.randint(2, 13)};\n"
                    f"    }}\n"
                    f"    {acc}\n"
                    f"}}")
            else:
                block = (
                    f"def {fname}({a}, limit={limit}):\n"
                    f'    """{self.sentence()}"""\n'
                    f"    {acc} = {r.choice(['0', '[]', '{}', 'None'])}\n"
                    f"    seen_{i} = set()\n"
                    f"    for index, {item} in enumerate({a}):\n"
                    f"        if {item} in seen_{i} or index > limit:\n"
                    f"            {r.choice(['continue', 'break'])}\n"
                    f"        seen_{i}.add({item})\n"
                    f"        {acc} = {_update(acc, item, r)}\n"
                    f"    return {acc}")
            blocks.append(block)
            used += tokenizer.count(block) + 2
        fence = {"javascript": "javascript", "rust": "rust"}.get(language, "python")
        intro = f"Here is an implementation of the {self.topics[0]} logic:"
        outro = self.paragraph(2)
        return f"{intro}\n\n```{fence}\n" + "\n\n\n".join(blocks) + f"\n```\n\n{outro}"


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def _update(acc: str, item: str, r: random.Random) -> str:
    return r.choice([
        f"{acc} if {acc} is not None else {item}",
        f"max({acc} or 0, len(str({item})))",
        f"({acc} or 0) + hash({item}) % {r.randint(3, 31)}",
        f"{item} if not {acc} else {acc}",
    ])


def topic_words(text: str, limit: int = 10) -> list[str]:
    """The prompt's salient words (content words, 4+ letters), most frequent first."""
    counts: dict[str, int] = {}
    order: dict[str, int] = {}
    for i, w in enumerate(re.findall(r"[A-Za-z][A-Za-z\-]{3,}", text[-20000:])):
        lw = w.lower().strip("-")
        if lw in STOPWORDS or lw in REQUEST_WORDS or len(lw) < 4:
            continue
        counts[lw] = counts.get(lw, 0) + 1
        order.setdefault(lw, i)
    ranked = sorted(counts, key=lambda w: (-counts[w], order[w]))
    return ranked[:limit]


def count_lines(start: int, end: int) -> str:
    step = 1 if end >= start else -1
    return "\n".join(str(i) for i in range(start, end + step, step))


def haiku(gen: Generator) -> str:
    r = gen.rng
    t = gen.topics
    return "\n".join([
        f"{_cap(r.choice(ADJECTIVES))} {r.choice(t)} waits,",
        f"the {r.choice(NOUNS)} {r.choice(VERBS)} the {r.choice(ADJECTIVES)} {r.choice(NOUNS)},",
        f"{r.choice(ADVERBS)} the {r.choice(NOUNS)} clears.",
    ])
