"""``rigfleet bump``'s flags, checked, as one typed object::

    opts = BumpOptions.from_args(parser.parse_args(argv))   # ValueError names the flag
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BumpOptions:
    """``rigfleet bump``'s flags (``rigfleet.bump.cli.add_parser``)."""

    inventory: str
    deploy: str
    image: str | None = None
    latest: bool = False
    genesis: str | None = None
    stacks: tuple[str, ...] = ()
    batch_size: int = 1
    max_failures: int = 1
    registry: str | None = None
    genesis_url: str | None = None
    push_mirror: str | None = None
    save_dir: Path | None = None
    no_prune: bool = False
    dry: bool = False
    yes: bool = False
    json: bool = False
    rollback_to: int | None = None  # ``rigfleet rollback``: the earlier pins serial it goes to

    def __post_init__(self) -> None:
        if self.rollback_to is None and not (self.image or self.latest or self.genesis):
            raise ValueError("give --image TAG, --latest or --genesis COMMIT")
        if self.batch_size < 1:
            raise ValueError(f"--batch-size: {self.batch_size} is not allowed; allowed: 1 or "
                             "more hosts per batch")
        if self.max_failures < 1:
            raise ValueError(f"--max-failures: {self.max_failures} is not allowed; allowed: 1 "
                             "or more (the rollout stops at that many failed hosts)")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> BumpOptions:
        return cls(
            inventory=args.inventory, deploy=args.deploy, image=args.image, latest=args.latest,
            genesis=args.genesis, stacks=tuple(args.stack), batch_size=args.batch_size,
            max_failures=args.max_failures, registry=args.registry,
            genesis_url=args.genesis_url, push_mirror=args.push_mirror,
            save_dir=args.save_dir, no_prune=args.no_prune, dry=args.dry, yes=args.yes,
            json=args.json,
        )
