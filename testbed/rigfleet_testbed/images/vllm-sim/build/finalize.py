"""Image build step: make python3 find the simulator package at the real image's path.

python3 (3.13 on trixie) does not look in ``.../python3.12/dist-packages`` by itself, so a
``.pth`` file in its own site directory adds it. The per-build layer (images/vllm-build) adds
``vllm/_build_info.json`` and ``vllm-<version>.dist-info`` on top.
"""

import os
import site
import sys

SITE = "/usr/local/lib/python3.12/dist-packages"


def main() -> int:
    target = site.getsitepackages()[0]
    os.makedirs(target, exist_ok=True)
    with open(os.path.join(target, "vllm-sim.pth"), "w", encoding="utf-8") as fh:
        fh.write(SITE + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
