"""Print converge figures on the simulated fleet (issue 3).

    python benchmarks/converge.py                 # bare -> serving per role, on the current testbed
    python benchmarks/converge.py --noop 1 2 4    # no-op re-run time and commands per host

Per-role time is read from pyinfra's own progress lines ("Starting operation: <Role> | ..."),
stamped as they stream. Commands per host are counted from pyinfra's -vv output (one
"[host] >>> ..." line per shell command it sends), so the figure is what went over SSH.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from collections import OrderedDict, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
START = re.compile(r"--> Starting operation: (?P<role>[^|]+?) \|")
COMMAND = re.compile(r"^\s*\[(?P<host>[^\]]+)\] >>> ")


def stream(cmd: list[str], env: dict[str, str] | None = None) -> list[tuple[float, str]]:
    """Run ``cmd``; return (seconds since start, line) for every output line."""
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, **(env or {})})
    assert proc.stdout is not None
    lines = [(time.monotonic() - started, line.rstrip("\n")) for line in proc.stdout]
    if proc.wait() != 0:
        tail = "\n".join(line for _, line in lines[-40:])
        raise SystemExit(f"{' '.join(cmd)} failed:\n{tail}")
    lines.append((time.monotonic() - started, "<end>"))
    return lines


def per_role(lines: list[tuple[float, str]]) -> OrderedDict[str, float]:
    marks = [(t, m.group("role").strip()) for t, line in lines if (m := START.search(line))]
    marks.append((lines[-1][0], "<end>"))
    times: OrderedDict[str, float] = OrderedDict()
    for (t, role), (t_next, _) in zip(marks, marks[1:], strict=False):
        times[role] = times.get(role, 0.0) + (t_next - t)
    return times


def inventory(instance: int) -> Path:
    return REPO / "inventory" / ("testbed.py" if instance == 0 else f"testbed-{instance}.py")


def bare_to_serving(instance: int, hosts: int) -> None:
    env = {"RIGFLEET_TESTBED_INSTANCE": str(instance)}
    subprocess.run([BIN / "rigfleet", "testbed", "down"], env={**os.environ, **env}, check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run([BIN / "rigfleet", "testbed", "up", "--hosts", str(hosts)],
                   env={**os.environ, **env}, check=True, stdout=subprocess.DEVNULL)
    lines = stream([str(BIN / "pyinfra"), str(inventory(instance)), "deploy.py", "-y"], env)
    print(f"bare -> serving, {hosts} host(s): {lines[-1][0]:.1f} s")
    for role, seconds in per_role(lines).items():
        print(f"  {role:<28} {seconds:7.1f} s")


def noop(instance: int, hosts: int) -> None:
    env = {"RIGFLEET_TESTBED_INSTANCE": str(instance)}
    subprocess.run([BIN / "rigfleet", "testbed", "up", "--hosts", str(hosts)],
                   env={**os.environ, **env}, check=True, stdout=subprocess.DEVNULL)
    inv = str(inventory(instance))
    stream([str(BIN / "pyinfra"), inv, "deploy.py", "-y"], env)  # converge (new hosts)
    lines = stream([str(BIN / "pyinfra"), inv, "deploy.py", "-y", "-vv"], env)
    counts: dict[str, int] = defaultdict(int)
    for _, line in lines:
        if m := COMMAND.match(line):
            counts[m.group("host")] += 1
    per_host = sum(counts.values()) / max(len(counts), 1)
    print(f"no-op re-run, {hosts} host(s): {lines[-1][0]:6.1f} s, "
          f"{per_host:.0f} commands per host ({dict(counts)})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--instance", type=int, default=int(os.environ.get(
        "RIGFLEET_TESTBED_INSTANCE", "0")))
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--noop", type=int, nargs="*", metavar="HOSTS")
    args = parser.parse_args()
    if args.noop:
        for n in args.noop:
            noop(args.instance, n)
    else:
        bare_to_serving(args.instance, args.hosts)


if __name__ == "__main__":
    main()
