"""Print ``rigfleet bump`` rollout times on the simulated fleet (issue 5).

    RIGFLEET_TESTBED_INSTANCE=4 python benchmarks/bump_rollout.py          # 1-3 hosts, batch 1, 2
    RIGFLEET_TESTBED_INSTANCE=4 python benchmarks/bump_rollout.py --hosts 1 2 --batch 2

Needs a testbed with at least as many hosts as asked (``rigfleet testbed up --hosts 3``); it
converges it first. Each run bumps int8 on the first N hosts between two releases (the pinned
v0.27.1 -> v0.28.0, then back), so every run is a real swap and gate on every host, both
directions are timed, and the fleet ends where it started. The bumps
work on a scratch pins file and scratch inventories (git-ignored); the testbed's own pins are
not touched.

Rollout times are the batches (pyinfra + swap + gate per batch, outcomes read back); "total"
adds the command's own work (registry, version probe, Genesis, pins, image prune).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
GOOD = "v0.27.1"  # the int8 stack's pin
NEWER = "v0.28.0"  # the newest release the twin's mirror serves


def paths(instance: int) -> tuple[Path, Path, Path]:
    sfx = "" if instance == 0 else f"-{instance}"
    return (REPO / f".testbed{sfx}", REPO / "inventory" / f"testbed{sfx}.py",
            REPO / "inventory" / f"testbed{sfx}-bench.py")  # fmt: skip


def write_inventory(inventory: Path, bench: Path, pins: Path, hosts: int, instance: int) -> None:
    from rigfleet_testbed import layout

    bench.write_text(f'''"""benchmarks/bump_rollout.py: {hosts} host(s) of testbed {instance}."""
import runpy

_tb = runpy.run_path({str(inventory)!r})
_hosts, _data = _tb["gpu_hosts"]
_data = {{**_data, "pins_file": {str(pins)!r},
         "bump_registry": "http://127.0.0.1:{layout.REGISTRY_LOCAL_PORT}",
         "bump_genesis_url": "http://127.0.0.1:{layout.GIT_LOCAL_PORT}/genesis-vllm-patches.git"}}
gpu_hosts = (_hosts[:{hosts}], _data)
canary = ["host1"]
''')


def bump(bench: Path, image: str, batch: int, env: dict[str, str], *extra: str) -> dict:
    cmd = [str(BIN / "python"), "-m", "rigfleet.bump.cli", "--inventory", str(bench),
           "--image", image, "--stack", "int8", "--batch-size", str(batch), "--yes", "--json",
           *extra]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    total = time.monotonic() - started
    try:
        summary = json.loads(proc.stdout)
    except ValueError:
        raise SystemExit(f"bump failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}") from None
    summary["total"] = total
    return summary


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--instance", type=int,
                        default=int(os.environ.get("RIGFLEET_TESTBED_INSTANCE", "0")))
    parser.add_argument("--hosts", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    env = {**os.environ, "RIGFLEET_TESTBED_INSTANCE": str(args.instance), "COLUMNS": "160"}
    os.environ.update(env)
    state, inventory, bench = paths(args.instance)
    subprocess.run([BIN / "rigfleet", "testbed", "up", "--hosts", str(max(args.hosts))],
                   env=env, check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    subprocess.run([BIN / "pyinfra", str(inventory), "deploy.py", "-y"], cwd=REPO, env=env,
                   check=True, capture_output=True)  # fmt: skip
    main_pins = (state / "pins.yaml").read_text()
    scratch = state / "bench-pins.yaml"
    rows = []
    try:
        for hosts in args.hosts:
            for batch in args.batch:
                write_inventory(inventory, bench, scratch, hosts, args.instance)
                scratch.write_text(main_pins)  # every host of this run is on GOOD
                there = bump(bench, NEWER, batch, env)
                back = bump(bench, GOOD, batch, env)
                rows.append((hosts, batch, there, back))
                print(f"{hosts} host(s), batch {batch}: {there['outcome']} in "
                      f"{there['seconds']:.1f} s, back {back['outcome']} in "
                      f"{back['seconds']:.1f} s", flush=True)  # fmt: skip
                for s in (there, back):
                    if s["outcome"] != "promoted":
                        raise SystemExit(json.dumps(s["hosts"], indent=2))
    finally:
        bench.unlink(missing_ok=True)
        scratch.unlink(missing_ok=True)
    print()
    print(f"rigfleet bump rollout times, testbed {args.instance} "
          "(per host: pyinfra converge + swap + verify-stress gate)")  # fmt: skip
    print(f"{'hosts':>5} {'batch':>5} {'batches':>7}  {'to v0.28.0 s':>14} "
          f"{'back to v0.27.1 s':>18} {'mean s':>7} {'total (cmd) s':>13}")  # fmt: skip
    for hosts, batch, there, back in rows:
        batches = 1 + -(-(hosts - 1) // batch)
        mean = (there["seconds"] + back["seconds"]) / 2
        total = (there["total"] + back["total"]) / 2
        print(f"{hosts:>5} {batch:>5} {batches:>7}  {there['seconds']:>14.1f} "
              f"{back['seconds']:>18.1f} {mean:>7.1f} {total:>13.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
