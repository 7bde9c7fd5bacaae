"""``FlexibleArgumentParser``: vLLM's argparse parser (``vllm/utils/argparse_utils.py`` in vLLM
0.19 and later, per the warnings it logs from that file).

What it does beyond argparse, as far as a ``vllm serve`` command line shows it: ``--max_model_len``
is ``--max-model-len`` (underscores in a flag's name are dashes), and the dotted sub-options of
the JSON configs (``-O.cudagraph_mode=...``, ``--compilation-config.mode=3``) are accepted; the
simulator ignores them. Unknown flags fail as argparse fails them: exit status 2 and
``<prog>: error: unrecognized arguments: ...``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

# Dotted sub-options vLLM accepts for its JSON configs: accepted and ignored here.
DOTTED_PREFIXES = ("-O.", "-cc.", "--compilation-config.", "--speculative-config.",
                   "--kv-transfer-config.", "--additional-config.")


def normalise(argv: Sequence[str]) -> list[str]:
    """``--a_b`` -> ``--a-b``; dotted JSON sub-options (and their values) dropped."""
    out: list[str] = []
    skip_next = False
    for i, arg in enumerate(argv):
        if skip_next:
            skip_next = False
            continue
        if arg.startswith(DOTTED_PREFIXES):
            if "=" not in arg and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
                skip_next = True
            continue
        if arg.startswith("--") and len(arg) > 2:
            name, eq, value = arg.partition("=")
            out.append(name.replace("_", "-") + eq + value)
        else:
            out.append(arg)
    return out


class FlexibleArgumentParser(argparse.ArgumentParser):
    """argparse with vLLM's spelling rules (see the module docstring); no abbreviations."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None
                         ) -> tuple[argparse.Namespace, list[str]]:
        import sys

        argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(normalise(argv), namespace)
