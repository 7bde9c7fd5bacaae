"""``rigfleet-host.pyz bench`` (``python3 -m rigfleet.hostside.bench``): the bench on a host.

Exit status: 0 measured, 1 nothing measured, 2 usage or no active stack (docs/bench.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..active import load_active
from ..argtypes import count, positive
from ..layout import Layout
from ..plan import PlanError
from ..records import SOURCE_ACCEPTED, now_iso
from ..stackctl import read_api_key
from ..verify.client import Client, check_ca_file
from ..verify.runner import append_history
from ..verify.runner import read_api_key as read_key_file
from . import report
from .measure import Bench, BenchSettings, Progress

EXIT_OK, EXIT_NOTHING = 0, 1


class LineProgress(Progress):
    """One line per request on stderr: ``bench [3/16] narrative`` (--quiet: a mute Progress)."""

    total = done = 0

    def begin(self, total: int) -> None:
        self.total = total

    def step(self, label: str) -> None:
        self.done += 1
        print(f"bench [{self.done}/{self.total}] {label}", file=sys.stderr, flush=True)

    def note(self, text: str) -> None:
        print(f"bench note: {text}", file=sys.stderr, flush=True)


# Argument types (``rigfleet bench`` on the control side uses them too).
def token_counts(text: str) -> tuple[int, ...]:
    """``16000,32000`` -> (16000, 32000)."""
    try:
        out = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        out = ()
    if not out or min(out) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: comma-separated token counts "
                                         "> 0, e.g. 16000,32000")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="rigfleet-host bench", description=__doc__.splitlines()[0])
    p.add_argument("--root", default="/", help=argparse.SUPPRESS)
    p.add_argument("--url", help="the server (default: the active stack on 127.0.0.1)")
    p.add_argument("--api-key-file", metavar="FILE",
                   help="(--url) file holding the API key, '-' for stdin")
    p.add_argument("--runs", type=count, default=5, help="measured runs per shape (5)")
    p.add_argument("--warmup", type=count, default=3, help="warm-up rounds first (3)")
    p.add_argument("--timeout-s", type=positive, default=300.0, help="per request (300)")
    p.add_argument("--concurrency", type=count, default=0,
                   help="streams of the concurrency run (the stack's max-num-seqs; 0: none)")
    p.add_argument("--depths", type=token_counts, default=(),
                   help="context depths, e.g. 16000,32000")
    p.add_argument("--accept-baseline", action="store_true",
                   help="record the measurement as the active stack's baseline on this host")
    p.add_argument("--scale", type=positive, default=1.0,
                   help="the host's throughput_scale, recorded with the baseline (1)")
    p.add_argument("--by", default="", help="(--accept-baseline) who accepts it")
    p.add_argument("--report-dir", type=Path, help="write bench-<ts>.json/.md here")
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    args = p.parse_args(argv)
    lay = Layout(Path(args.root))
    stack = None
    if args.url:
        if args.accept_baseline:
            p.error("--accept-baseline benches the active stack; leave out --url")
        try:
            key = read_key_file(args.api_key_file) if args.api_key_file else None
            check_ca_file()
        except ValueError as e:
            p.error(str(e))
        url = args.url
    else:
        try:
            active = load_active(lay)
        except PlanError as e:
            p.error(str(e))
        if active is None:
            p.error("nothing verified is active on this host; give --url")
        stack = active.ref.stack
        url = f"http://127.0.0.1:{active.ref.port}"
        key = read_api_key(lay.api_key_file, lay.vllm_env_file) or None
    if args.report_dir:
        try:  # before the bench runs, not after its minutes are spent
            args.report_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            p.error(f"--report-dir {args.report_dir}: {e.strerror or e}")
    settings = BenchSettings(runs=args.runs, warmup=args.warmup, timeout_s=args.timeout_s,
                             concurrency=args.concurrency, depths=args.depths)
    started = now_iso(suffix="Z")
    result = Bench(Client(url, key), settings, Progress() if args.quiet else LineProgress()).run()
    measured = any(s.figures() for s in result.shapes.values())
    # A baseline from a run that lost requests would move the gate's median by chance.
    short = [f"{name}: {len(s.decode)} of {len(s.runs)} runs measured"
             for name, s in result.shapes.items() if not s.runs or s.failed]
    record = None
    if args.accept_baseline and measured and stack and not short:
        record = result.record(stack, source=SOURCE_ACCEPTED, scale=args.scale,
                               baseline={"source": f"accepted by {args.by or 'hand'}"},
                               version=result.version)
        append_history(lay.throughput_dir, record)
    paths = (report.write([report.Entry(stack or result.url, stack, result, scale=args.scale)],
                          args.report_dir, started) if args.report_dir else None)
    if args.json:
        print(json.dumps({"stack": stack, "bench": result.to_dict(),
                          "accepted": record.to_dict() if record else None,
                          "reports": [str(path) for path in paths] if paths else None},
                         sort_keys=True))
    elif not args.quiet:
        for name, s in result.shapes.items():
            decode = "-" if s.decode_mean is None else f"{s.decode_mean:.1f} tok/s"
            cv = "n/a" if s.decode_cv is None else f"{s.decode_cv:.1%}"
            print(f"bench: {name}: decode {decode}, CV {cv}, acceptance "
                  + (("/".join(f"{x:.0%}" for x in s.acceptance.per_position)
                      or str(s.acceptance)) if s.acceptance else s.acceptance_note or "unknown"),
                  file=sys.stderr)
        if record:
            print(f"bench: accepted as {stack}'s baseline in {lay.throughput_history}",
                  file=sys.stderr)
    if result.error:
        print(f"bench: {result.error}", file=sys.stderr)
    if args.accept_baseline and short:
        print(f"bench: not accepted as {stack}'s baseline ({'; '.join(short)}): a baseline "
              "needs every run measured; bench again when the host is quiet", file=sys.stderr)
        return EXIT_NOTHING
    return EXIT_OK if measured else EXIT_NOTHING
