"""The generated sections of docs/stacks.md: the stack-file key reference
(``rigfleet.catalog_keys.reference``) and the table of the built-in stack files.

A unit test fails when docs/stacks.md and these differ. Regenerate after changing the key table
or a built-in stack file::

    .venv/bin/python -m rigfleet.stack_docs docs/stacks.md
"""

from __future__ import annotations

import sys
from pathlib import Path

from rigfleet.catalog import builtin_catalog
from rigfleet.catalog_keys import BEGIN, END, SHIPPED_BEGIN, SHIPPED_END, reference


def shipped() -> str:
    """The Markdown table of the built-in stack files (the docs' examples)."""
    lines = [SHIPPED_BEGIN, "", "| file | summary | port | cards | KV cache | drafter | Genesis |",
             "|---|---|---|---|---|---|---|"]
    for name in builtin_catalog().names:
        s = builtin_catalog().get(name)
        drafter = f"{s.speculative_method} n={s.num_speculative_tokens}" if (
            s.speculative_method) else "-"
        genesis = ", ".join(s.genesis.needs) if s.genesis else "-"
        lines.append(f"| [`{name}.yaml`](../rigfleet/stacks/{name}.yaml) | {s.summary} | "
                     f"{s.port} | {s.gpu_count} | `{s.kv_cache_dtype}` | {drafter} | {genesis} |")
    return "\n".join([*lines, "", SHIPPED_END])


def _replace(text: str, begin: str, end: str, body: str) -> str:
    head, sep, rest = text.partition(begin)
    _, sep2, tail = rest.partition(end)
    if not sep or not sep2:
        raise ValueError(f"no generated section ({begin} ... {end})")
    return head + body + tail


def render_into(text: str) -> str:
    """``text`` (docs/stacks.md) with its generated sections replaced: ``reference()`` and
    ``shipped()``."""
    return _replace(_replace(text, BEGIN, END, reference()), SHIPPED_BEGIN, SHIPPED_END,
                    shipped())


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m rigfleet.stack_docs docs/stacks.md", file=sys.stderr)
        return 2
    path = Path(argv[1])
    path.write_text(render_into(path.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
