"""The generated sections of docs/stacks.md: the stack-file key reference and the table of the
built-in stack files. Regenerate after changing either::

    .venv/bin/python -m rigfleet.stack_docs docs/stacks.md
"""

from __future__ import annotations

import sys

from rigfleet.catalog import builtin_catalog
from rigfleet.catalog_keys import SHIPPED_BEGIN, SHIPPED_END, TABLE
from rigfleet.keytable import replace_section, write_docs


def shipped() -> str:
    """The Markdown table of the built-in stack files."""
    lines = [SHIPPED_BEGIN, "", "| file | summary | port | cards | KV cache | drafter | Genesis |",
             "|---|---|---|---|---|---|---|"]
    for name, s in sorted(builtin_catalog().stacks.items()):
        drafter = f"{s.speculative_method} n={s.num_speculative_tokens}" if (
            s.speculative_method) else "-"
        genesis = ", ".join(s.genesis.needs) if s.genesis else "-"
        lines.append(f"| [`{name}.yaml`](../rigfleet/stacks/{name}.yaml) | {s.summary} | "
                     f"{s.port} | {s.gpu_count} | `{s.kv_cache_dtype}` | {drafter} | {genesis} |")
    return "\n".join([*lines, "", SHIPPED_END])


def render_into(text: str) -> str:
    """``text`` (docs/stacks.md) with both generated sections replaced."""
    return replace_section(TABLE.render_into(text), SHIPPED_BEGIN, SHIPPED_END, shipped())


if __name__ == "__main__":
    sys.exit(write_docs(sys.argv, "python -m rigfleet.stack_docs docs/stacks.md", render_into))
