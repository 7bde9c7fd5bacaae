"""Image build step: bake the build arguments into the simulator package.

Writes ``vllm/_build_info.json`` (version, commit, regressions), a ``.pth`` file so python3
finds the package at the real image's path, and a minimal ``vllm-<version>.dist-info`` so
``pip show vllm`` and ``importlib.metadata.version("vllm")`` answer like the real image.
Run by the Dockerfile with the build arguments in the environment.
"""

import json
import os
import site
import sys

SITE = "/usr/local/lib/python3.12/dist-packages"


def main() -> int:
    version = os.environ.get("VLLM_VERSION", "").strip()
    commit = os.environ.get("VLLM_COMMIT", "").strip()
    regressions = [r.strip() for r in os.environ.get("VLLM_REGRESSIONS", "").split(",")
                   if r.strip()]
    if not version:
        print("VLLM_VERSION build argument is required", file=sys.stderr)
        return 1
    with open(f"{SITE}/vllm/_build_info.json", "w", encoding="utf-8") as fh:
        json.dump({"version": version, "commit": commit, "regressions": regressions}, fh)
        fh.write("\n")
    # python3 (3.13 on trixie) does not look in .../python3.12/dist-packages by itself.
    target = site.getsitepackages()[0]
    os.makedirs(target, exist_ok=True)
    with open(os.path.join(target, "vllm-sim.pth"), "w", encoding="utf-8") as fh:
        fh.write(SITE + "\n")
    dist = f"{SITE}/vllm-{version}.dist-info"
    os.makedirs(dist, exist_ok=True)
    with open(f"{dist}/METADATA", "w", encoding="utf-8") as fh:
        fh.write(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"
                 "Summary: A high-throughput and memory-efficient inference and serving engine "
                 "for LLMs (rigfleet simulator)\nHome-page: https://github.com/vllm-project/vllm\n"
                 "License: Apache 2.0\n")
    with open(f"{dist}/INSTALLER", "w", encoding="utf-8") as fh:
        fh.write("pip\n")
    with open(f"{dist}/RECORD", "w", encoding="utf-8") as fh:
        fh.write("")
    print(f"vllm simulator {version} (commit {commit or '?'}, regressions {regressions or '-'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
