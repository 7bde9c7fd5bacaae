"""Print how long `rigfleet testbed up` takes: from nothing, and with images already built.

    python benchmarks/testbed_up.py [--hosts 2] [--cold]

--cold removes the testbed's images first (the debootstrapped base included), so the first
figure is "from nothing on this machine". Targets (issue 2): cold <= 300 s, warm <= 60 s.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RIGFLEET = str(Path(sys.executable).with_name("rigfleet"))


def timed(cmd: list[str]) -> float:
    started = time.monotonic()
    subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--cold", action="store_true")
    args = parser.parse_args()
    subprocess.run([RIGFLEET, "testbed", "down"], cwd=REPO, check=True,
                   stdout=subprocess.DEVNULL)
    if args.cold:
        import docker

        client = docker.from_env()
        for image in client.images.list():
            if any(t.startswith(("rigfleet/", "vllm/vllm-openai", "127.0.0.1:15000/"))
                   for t in image.tags):
                client.images.remove(image.id, force=True)
    up = [RIGFLEET, "testbed", "up", "--hosts", str(args.hosts)]
    first = timed(up)
    down = timed([RIGFLEET, "testbed", "down"])
    second = timed(up)
    label = "cold (images removed first)" if args.cold else "first (images as found)"
    print(f"testbed up --hosts {args.hosts}: {label}: {first:6.1f} s")
    print(f"testbed up --hosts {args.hosts}: images built:       {second:6.1f} s")
    print(f"testbed down:                                    {down:6.1f} s")


if __name__ == "__main__":
    main()
