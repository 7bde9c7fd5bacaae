"""Print the swap's 503 window against the simulator's boot time, and the swap's own overhead.

    python benchmarks/swap_window.py                      # boots of 3, 10 and 20 s, host1
    python benchmarks/swap_window.py --boot 5 30 --host host2 --profile full

On the simulated fleet (``RIGFLEET_TESTBED_INSTANCE`` picks the testbed; it must be converged),
for each simulated boot time (``SIM_BOOT_SECONDS``, set on both stacks through host data
``extra_env``) the host swaps int8 -> tq3-mtp-genesis -> int8 with the real converge, while a
client asks the front every 20 ms. Per swap it prints:

- window (client): from the first 503 the client saw to the first 200 after it;
- window (host): the transaction's own measure (front to 503 ... front to the new stack);
- boot: ``docker compose up`` until ``/health`` and ``/v1/models`` answer;
- gate: the verify-stress run;
- overhead: window - boot - gate: what the swap itself costs (stopping the old stack, waiting
  until nvidia-smi shows the cards' memory released, the front switches);
- and the answers the client got (only 200 and 503 + Retry-After are allowed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rigfleet_testbed import layout  # noqa: E402
from rigfleet_testbed.layout import HostSlot  # noqa: E402

BIN = Path(sys.executable).parent
ROUTE_HEADER = "X-Rigfleet-Route"


class Probe(threading.Thread):
    def __init__(self, url: str, key: str, interval: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.url, self.key, self.interval = url, key, interval
        self.seen: list[tuple[float, int | str, str | None, str | None]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            t = time.monotonic()
            req = urllib.request.Request(f"{self.url}/v1/models",
                                         headers={"Authorization": f"Bearer {self.key}"})
            try:
                with urllib.request.urlopen(req, timeout=5) as resp:
                    code, headers = resp.status, dict(resp.headers.items())
            except urllib.error.HTTPError as e:
                code, headers = e.code, dict(e.headers.items())
            except Exception as e:  # refused, reset: exactly what must not happen
                code, headers = type(e).__name__, {}
            self.seen.append((t, code, headers.get(ROUTE_HEADER), headers.get("Retry-After")))
            time.sleep(self.interval)

    def window(self) -> float | None:
        first = next((t for t, c, _, _ in self.seen if c == 503), None)
        if first is None:
            return None
        after = next((t for t, c, _, _ in self.seen if t > first and c == 200), None)
        return (after - first) if after else None

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for _, code, _, retry in self.seen:
            key = f"{code}" + ("" if code != 503 or retry else " (no Retry-After!)")
            out[key] = out.get(key, 0) + 1
        return out


def ssh(slot: HostSlot, command: str) -> str:
    state = layout.STATE_DIR / "ssh"
    return subprocess.run(
        ["ssh", "-q", "-i", str(state / "id_ed25519"), "-o",
         f"UserKnownHostsFile={state / 'known_hosts'}", "-p", str(slot.ssh_port),
         "root@127.0.0.1", command], capture_output=True, text=True, check=True).stdout


def converge(slot: HostSlot, stack: str, boot: float, profile: str) -> float:
    env = {s: {"SIM_BOOT_SECONDS": f"{boot:g}"} for s in ("int8", "tq3-mtp-genesis")}
    cmd = [str(BIN / "pyinfra"), str(layout.INVENTORY), "deploy.py", "-y", "--limit",
           slot.name, "--data", f"stack={stack}", "--data", f"gate_profile={profile}",
           "--data", "extra_env=" + json.dumps(env)]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return time.monotonic() - t0


def last_result(slot: HostSlot) -> dict:
    out = ssh(slot, "cat \"$(ls -1td /var/lib/rigfleet/swap/2* | head -n 1)/result.json\"")
    return json.loads(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="host1")
    parser.add_argument("--boot", type=float, nargs="+", default=[3.0, 10.0, 20.0],
                        metavar="SECONDS", help="simulated boot times (SIM_BOOT_SECONDS)")
    parser.add_argument("--profile", default="fast", choices=("fast", "full"))
    args = parser.parse_args()
    slot = HostSlot(int(args.host.removeprefix("host")))
    key = (layout.STATE_DIR / "secrets" / "api-key").read_text().strip()
    url = f"http://127.0.0.1:{slot.front_port}"
    print(f"testbed instance {layout.INSTANCE}, {slot.name}, gate profile {args.profile}")
    header = (f"{'sim boot':>8} {'swap':<24} {'window':>8} {'(host)':>8} {'boot':>7} "
              f"{'gate':>7} {'overhead':>9} {'stop':>6} {'vram':>6} {'converge':>9}  answers")
    print(header)
    print("-" * len(header))
    for boot in args.boot:
        converge(slot, "int8", boot, args.profile)  # start from int8 at this boot time
        for stack in ("tq3-mtp-genesis", "int8"):
            probe = Probe(url, key)
            probe.start()
            wall = converge(slot, stack, boot, args.profile)
            time.sleep(0.5)
            probe.done.set()
            probe.join()
            r = last_result(slot)
            t = r.get("timings") or {}
            booted = t.get("up_s", 0.0) + t.get("ready_s", 0.0)
            window = t.get("window_s") or r.get("window_s") or 0.0
            overhead = window - booted - t.get("gate_s", 0.0)
            seen = probe.window()
            name = f"{'int8' if stack != 'int8' else 'tq3'} -> {stack}"
            print(f"{boot:>7g}s {name:<24} {seen or 0:>7.1f}s {window:>7.1f}s {booted:>6.1f}s "
                  f"{t.get('gate_s', 0):>6.1f}s {overhead:>8.1f}s {t.get('stop_s', 0):>5.1f}s "
                  f"{t.get('vram_s', 0):>5.1f}s {wall:>8.1f}s  {probe.counts()}")
    print("\nwindow = first 503 -> first 200 as a client saw it; overhead = window - boot - gate"
          " (stop the old stack, wait for GPU memory, front switches).")


if __name__ == "__main__":
    os.chdir(REPO)
    main()
