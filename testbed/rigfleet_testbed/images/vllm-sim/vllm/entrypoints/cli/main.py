"""The ``vllm`` command: ``vllm serve [model_tag] [options]`` and ``vllm --version``."""

from __future__ import annotations

import sys

_SUBCOMMANDS = ("chat", "complete", "serve", "bench", "collect-env", "run-batch")
_USAGE = "usage: vllm [-h] [-v] {" + ",".join(_SUBCOMMANDS) + "} ..."


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_USAGE)
        print("\nvLLM CLI (simulator). Only `serve` is available.")
        return 0 if args else 2
    if args[0] in ("-v", "--version"):
        import vllm

        print(vllm.__version__)
        return 0
    if args[0] == "serve":
        from vllm.sim.boot import serve

        return serve(args[1:])
    print(_USAGE, file=sys.stderr)
    if args[0] in _SUBCOMMANDS:
        print(f"vllm: error: the '{args[0]}' subcommand is not available in this build",
              file=sys.stderr)
    else:
        print(f"vllm: error: argument subparser: invalid choice: '{args[0]}' (choose from "
              + ", ".join(f"'{c}'" for c in _SUBCOMMANDS) + ")", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
