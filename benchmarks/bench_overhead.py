"""Print the bench's own overhead (wall time outside the requests) and how faithfully it
measures, against a server paced at a known decode speed.

    python benchmarks/bench_overhead.py                     # speedups 10 and 40, idle CPU
    python benchmarks/bench_overhead.py --speedups 1 40 --busy 2    # 2 busy processes
    python benchmarks/bench_overhead.py --url http://127.0.0.1:8015  # any endpoint

The paced server (``tests/unit/bench_fakes.py``) streams like an MTP engine at seed 000's
tq3-mtp-genesis figure (89.2 narrative tok/s on two 3090s) times the speedup (the testbed
runs ``sim_speedup`` = 40 times faster than a real rig). Per speedup it prints the gate's
throughput measurement (1 warm-up round, 5 runs per shape): the bench's wall time, the time
inside requests, the overhead (scrapes of /metrics, the bench's own work), the measured
decode tok/s against the paced truth, and each shape's CV. ``--busy N`` runs N CPU-bound
processes alongside, as on a shared 2-core CI machine, to show how scheduling noise grows the
CV when a 1000-token run lasts a fraction of a second.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "unit")]

from bench_fakes import Pace, PacedServer, expected_tok_s  # noqa: E402

from rigfleet.hostside.bench.measure import Bench, BenchResult, BenchSettings  # noqa: E402
from rigfleet.hostside.verify.client import Client  # noqa: E402

# seed 000's Genesis TQ3+MTP narrative figure over the fake's narrative acceptance length.
REAL_STEP_RATE = 89.2 / expected_tok_s(Pace(step_rate=1.0), "narrative")


def _burn(stop_at: float) -> None:
    x = 0
    while time.time() < stop_at:
        x += 1


def measure(url: str, runs: int, warmup: int) -> BenchResult:
    return Bench(Client(url), BenchSettings(runs=runs, warmup=warmup)).run()


def line(label: str, r: BenchResult, truth: dict[str, float] | None) -> str:
    inside = r.request_seconds
    parts = [f"{label:>10}  wall {r.seconds:7.2f} s  in requests {inside:7.2f} s  "
             f"overhead {r.overhead_s:6.3f} s ({r.overhead_s / r.seconds:5.1%})"]
    for name, s in r.shapes.items():
        m, cv = s.decode_mean or 0.0, s.decode_cv or 0.0
        err = f" ({m / truth[name] - 1:+.1%} vs paced)" if truth else ""
        parts.append(f"{name} {m:8.1f} tok/s{err} CV {cv:5.1%}")
    return "  ".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--speedups", type=float, nargs="+", default=[10.0, 40.0])
    p.add_argument("--busy", type=int, default=0, help="CPU-bound processes alongside")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--url", help="bench this endpoint instead of the paced server")
    args = p.parse_args(argv)
    burners = []
    if args.busy:
        stop_at = time.time() + 3600
        burners = [multiprocessing.Process(target=_burn, args=(stop_at,), daemon=True)
                   for _ in range(args.busy)]
        for b in burners:
            b.start()
    try:
        if args.url:
            print(line("endpoint", measure(args.url, args.runs, args.warmup), None))
            return 0
        for speedup in args.speedups:
            pace = Pace(step_rate=REAL_STEP_RATE * speedup, prefill_s=0.2 / speedup)
            truth = {s: expected_tok_s(pace, s) for s in ("narrative", "code")}
            with PacedServer(pace) as srv:
                print(line(f"x{speedup:g}", measure(srv.url, args.runs, args.warmup), truth),
                      flush=True)
    finally:
        for b in burners:
            b.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
