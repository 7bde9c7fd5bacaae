#!/usr/bin/env python3
"""Print the vLLM versions a Genesis checkout accepts, read from its source with ``ast``.

Installed by rigfleet (roles/stacks.py) at /usr/local/lib/rigfleet/. Nothing is imported or
executed from the checkout: ``guards.py`` is parsed and only literal assignments are read.

    rigfleet-genesis-allowlist.py /opt/rigfleet/genesis
    {"guards": "vllm/_genesis/guards.py", "known_good": ["0.20.2rc1.dev9+g01d4d1ad3", ...],
     "pending": []}

Exit 1 (message on stderr) when no guards file or no ``KNOWN_GOOD_VLLM_PINS`` literal exists.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

# v7.x layout first; later Genesis (sndr) moved the guards.
GUARDS = ("vllm/_genesis/guards.py", "sndr/engines/vllm/detection/guards.py")
KNOWN_GOOD = "KNOWN_GOOD_VLLM_PINS"
PENDING = "PROMOTION_PENDING_VLLM_PINS"


def literal_assignments(tree: ast.Module) -> dict[str, object]:
    """Module-level ``NAME = <literal>`` and ``NAME: T = <literal>`` assignments."""
    out: dict[str, object] = {}
    for node in tree.body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name):
                try:
                    out[target.id] = ast.literal_eval(value)
                except ValueError:
                    continue
    return out


def versions(value: object) -> list[str]:
    if isinstance(value, list | tuple | set | frozenset):
        return [str(v) for v in value if isinstance(v, str)]
    return []


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: rigfleet-genesis-allowlist.py <genesis checkout>", file=sys.stderr)
        return 2
    root = Path(argv[1])
    for rel in GUARDS:
        path = root / rel
        if path.is_file():
            break
    else:
        print(
            f"no Genesis guards file under {root} (looked for {', '.join(GUARDS)})", file=sys.stderr
        )
        return 1
    values = literal_assignments(ast.parse(path.read_text(encoding="utf-8"), str(path)))
    if KNOWN_GOOD not in values:
        print(f"{path}: no literal {KNOWN_GOOD}", file=sys.stderr)
        return 1
    print(
        json.dumps(
            {
                "guards": rel,
                "known_good": versions(values[KNOWN_GOOD]),
                "pending": versions(values.get(PENDING)),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
