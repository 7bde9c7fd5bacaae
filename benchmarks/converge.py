"""Print converge figures on the simulated fleet (issue 3).

    python benchmarks/converge.py                 # bare -> serving per role, on the current testbed
    python benchmarks/converge.py --noop 1 2 4    # no-op re-run time and commands per host
    python benchmarks/converge.py --noop 1 --runs 5 --save /tmp/noop.log   # median of 5
    python benchmarks/converge.py --noop 1 --as-is   # the testbed as it is (no up, no converge)

Per-role time is read from pyinfra's own progress lines ("Starting operation: <Role> | ..."),
stamped as they stream. Commands per host are read from pyinfra's -vv output (one
"[host] >>> ..." line per shell command it sends, a multi-line command continuing on the lines
after it), so the figure is what went over SSH; a command a host was sent more than once in
the run is printed with its count.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from collections import Counter, OrderedDict, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
START = re.compile(r"--> Starting operation: (?P<role>[^|]+?) \|")
COMMAND = re.compile(r"^\s*\[(?P<host>[^\]]+)\] >>> (?P<command>.*)$")
# A line pyinfra prints itself (a host's line, a stage line): not a command's continuation.
SUCCESS = re.compile(r"^\s*\[[^\]]+\] Success$")
OWN_LINE = re.compile(r"^\s*(\[[^\]\s]+\] |--> |<end>$)")


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


def commands(lines: list[tuple[float, str]]) -> dict[str, list[str]]:
    """Every shell command each host was sent, in order (from -vv's ``>>>`` lines)."""
    sent: dict[str, list[str]] = defaultdict(list)
    current: list[str] | None = None
    for _, line in lines:
        if m := COMMAND.match(line):
            sent[m.group("host")].append(m.group("command"))
            current = sent[m.group("host")]
        elif current is not None and line and not OWN_LINE.match(line):
            current[-1] += "\n" + line
        else:
            current = None
    return sent


def noop(instance: int, hosts: int, runs: int, save: Path | None, as_is: bool) -> None:
    env = {"RIGFLEET_TESTBED_INSTANCE": str(instance)}
    inv = str(inventory(instance))
    if not as_is:
        subprocess.run([BIN / "rigfleet", "testbed", "up", "--hosts", str(hosts)],
                       env={**os.environ, **env}, check=True, stdout=subprocess.DEVNULL)
        stream([str(BIN / "pyinfra"), inv, "deploy.py", "-y"], env)  # converge (new hosts)
    times: list[float] = []
    for _ in range(runs):
        lines = stream([str(BIN / "pyinfra"), inv, "deploy.py", "-y", "-vv"], env)
        times.append(lines[-1][0])
        if any(SUCCESS.match(line) for _, line in lines):
            print("  (an operation of this run changed something: not a no-op)")
    if save:
        save.write_text("\n".join(line for _, line in lines) + "\n")
    sent = commands(lines)
    per_host = sum(len(c) for c in sent.values()) / max(len(sent), 1)
    spread = f" (runs: {', '.join(f'{t:.1f}' for t in times)})" if runs > 1 else ""
    print(f"no-op re-run, {hosts} host(s): {statistics.median(times):6.1f} s{spread}, "
          f"{per_host:.0f} commands per host")
    for name, sent_to in sorted(sent.items()):
        twice = {c: n for c, n in Counter(sent_to).items() if n > 1}
        print(f"  {name}: {len(sent_to)} commands, {len(set(sent_to))} distinct, "
              f"{sum(twice.values()) - len(twice)} repeats")
        for command, n in sorted(twice.items(), key=lambda kv: -kv[1]):
            shown = command.replace("\n", " ")
            print(f"    {n}x {shown[:150]}{'...' if len(shown) > 150 else ''}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--instance", type=int, default=int(os.environ.get(
        "RIGFLEET_TESTBED_INSTANCE", "0")))
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--noop", type=int, nargs="*", metavar="HOSTS")
    parser.add_argument("--runs", type=int, default=1, help="no-op runs per size (median)")
    parser.add_argument("--save", type=Path, help="write the last no-op run's -vv output here")
    parser.add_argument("--as-is", action="store_true",
                        help="the testbed as it is: no `testbed up`, no converge first")
    args = parser.parse_args()
    if args.noop:
        for n in args.noop:
            noop(args.instance, n, args.runs, args.save, args.as_is)
    else:
        bare_to_serving(args.instance, args.hosts)


if __name__ == "__main__":
    main()
