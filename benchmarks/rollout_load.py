"""Print what clients see during rollouts: a single-host swap, and a 3-host bump behind lb1.

    rigfleet testbed up --hosts 3 --balancer && pyinfra inventory/testbed.py deploy.py -y
    python benchmarks/rollout_load.py                     # 1 request/s, bump batch 2
    python benchmarks/rollout_load.py --rate 2 --batch 1

On the simulated fleet (``RIGFLEET_TESTBED_INSTANCE`` picks the testbed; host1..3 converged on
int8, lb1 in the inventory), with ``benchmarks/loadgen.py`` sending chat requests (streaming
and not, short and long prompts) the whole time:

1. **single host**: host1 re-rolls int8 (one harmless container variable more, a new config
   hash) while the load asks host1's own front: its 503 window is what clients see there;
2. **3-host bump**: ``rigfleet bump --image v0.28.0 --stack int8`` across host1..3 (canary
   first, then batches), then the bump back to the pinned release, while the load asks lb1.

Per rollout it prints each swapped host's 503 window and drain (from its swap result) and the
load generator's figures: requests sent, completed, failed (by status), cut mid-stream, and
latency percentiles. Behind lb1 a swapping host leaves rotation, so the figures to read are
"failed 0, cut 0". The bumps work on a scratch pins file (git-ignored); the testbed's own pins
are not touched, and the fleet ends where it started.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import loadgen  # noqa: E402
from rigfleet_testbed import layout  # noqa: E402
from rigfleet_testbed.layout import HostSlot  # noqa: E402
from swap_window import last_result  # noqa: E402

BIN = Path(sys.executable).parent
NEWER = "v0.28.0"
MARK = {"int8": {"RIGFLEET_BENCH_ROLL": "1"}}  # read by nothing: a new config hash, same stack


def under_load(url: str, key: str, rate: float, path: str, action) -> loadgen.Report:
    """Run ``action()`` while the load generator asks ``url``; its report."""
    cfg = loadgen.LoadConfig(url, key, rate=rate, duration_s=loadgen.MAX_DURATION_S,
                             max_tokens=32, timeout_s=120, path=path).checked()
    return loadgen.during(cfg, action)


def run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "160"})
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return proc


def host_line(slot: HostSlot) -> str:
    r = last_result(slot)
    window = (r.get("timings") or {}).get("window_s") or r.get("window_s") or 0.0
    drain = r.get("drain") or {}
    return (f"  {slot.name}: {r.get('result')}, 503 window {window:.1f} s, drain "
            f"{drain.get('result', '-')} {drain.get('seconds', 0):.1f} s "
            f"(cut {drain.get('cut', 0)})")


def write_bump_inventory(path: Path, pins: Path) -> None:
    path.write_text(
        f'''"""benchmarks/rollout_load.py: testbed {layout.INSTANCE} with a scratch pins file."""
import runpy

_tb = runpy.run_path({str(layout.INVENTORY)!r})
_hosts, _data = _tb["gpu_hosts"]
_data = {{**_data, "pins_file": {str(pins)!r},
         "bump_registry": "http://127.0.0.1:{layout.REGISTRY_LOCAL_PORT}",
         "bump_genesis_url": "http://127.0.0.1:{layout.GIT_LOCAL_PORT}/genesis-vllm-patches.git"}}
gpu_hosts = (_hosts, _data)
balancers = _tb.get("balancers", ([], {{}}))
canary = ["host1"]
''')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=1.0, help="requests/s (default 1)")
    parser.add_argument("--batch", type=int, default=2, help="bump batch size (default 2)")
    args = parser.parse_args()
    key = (layout.STATE_DIR / "secrets" / "api-key").read_text().strip()
    slots = [HostSlot(i) for i in (1, 2, 3)]
    lb = layout.BalancerSlot()
    lb_url = f"http://127.0.0.1:{lb.port}"
    if "balancers" not in layout.INVENTORY.read_text():
        raise SystemExit("needs the testbed's balancer: rigfleet testbed up --hosts 3 --balancer")
    print(f"testbed instance {layout.INSTANCE}: load {args.rate:g} request/s, kinds "
          f"{', '.join(loadgen.KINDS)}")

    # 1. one host, its own front: the 503 window is what its clients see.
    h1 = slots[0]
    base = [str(BIN / "pyinfra"), str(layout.INVENTORY), "deploy.py", "-y", "--limit", h1.name]
    report = under_load(f"http://127.0.0.1:{h1.front_port}", key, args.rate,
                        "/v1/chat/completions",
                        lambda: run([*base, "--data", "extra_env=" + json.dumps(MARK)]))
    print(f"\n1. single-host swap ({h1.name} re-rolls int8), the load on its front")
    print(host_line(h1))
    print("\n".join("  " + line for line in report.lines()))
    run(base)  # back to the inventory's own settings

    # 2. three hosts behind lb1: a bump to NEWER and back.
    scratch = layout.STATE_DIR / "bench-rollout-pins.yaml"
    inventory = layout.INVENTORY.with_name(layout.INVENTORY.stem + "-rollout.py")
    scratch.write_text((layout.STATE_DIR / "pins.yaml").read_text())
    write_bump_inventory(inventory, scratch)
    back = yaml.safe_load(scratch.read_text())["stacks"]["int8"]["image"].rpartition(":")[2]
    bump = [str(BIN / "python"), "-m", "rigfleet.bump.cli", "--inventory", str(inventory),
            "--stack", "int8", "--batch-size", str(args.batch), "--yes", "--json"]
    try:
        for tag in (NEWER, back):
            t0 = time.monotonic()
            out: dict[str, Any] = {}
            report = under_load(lb_url, key, args.rate, "/stacks/int8/v1/chat/completions",
                                lambda t=tag, o=out: o.update(json.loads(
                                    run([*bump, "--image", t]).stdout)))
            print(f"\n2. rigfleet bump int8 -> {tag} across host1..3 (batch {args.batch}), "
                  f"the load on lb1: {out.get('outcome')} in {time.monotonic() - t0:.0f} s")
            for slot in slots:
                print(host_line(slot))
            print("\n".join("  " + line for line in report.lines()))
    finally:
        scratch.unlink(missing_ok=True)
        inventory.unlink(missing_ok=True)
    print("\nBehind lb1 a swapping host leaves rotation (its front's readiness) and what it "
          "refused before any byte is retried on another host: read failed and cut.")


if __name__ == "__main__":
    os.chdir(REPO)
    main()
