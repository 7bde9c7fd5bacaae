"""Issue 18 item 3 on the simulated fleet: a stack file passing a flag the pinned vLLM does not
know is refused when it is staged on a serving host, by the pinned image's own parser, before
any window opens; the front answers 200 throughout and nothing of the stack reaches the host.

The flag is a real removal: ``--max-num-partial-prefills`` is gone from vLLM 0.27.0
(runpod-workers/worker-vllm#324) and the host's stack runs v0.27.1. One converge of the first
fleet host, refused in the stacks role (no swap, no gate): about a minute.

    RIGFLEET_TESTBED_INSTANCE=2 RIGFLEET_TESTBED_HOSTS=1 RIGFLEET_TESTBED_EXTRAS=0 \
        RIGFLEET_KEEP_TESTBED=1 .venv/bin/python -m pytest tests/e2e/test_13_vllm_args.py -x -v
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from e2e_fleet import STATE, ledger, pyinfra
from test_04_swap import FAST, FrontProbe, front_answers, route_of

from rigfleet.catalog import BUILTIN_DIR
from rigfleet.hostside.layout import HOST

FLAG = "--max-num-partial-prefills=2"


def stack_with_flag(tmp_path: Path, base: str, branch: str) -> tuple[str, Path, Path, str]:
    """A user's copy of ``base`` (``stacks_dir``) passing ``FLAG``, pinned like it, on the
    driver ``branch`` the host runs. Returns (its name, stacks dir, pins file, the pinned vLLM
    version)."""
    name = f"{base}-partial"
    doc = yaml.safe_load((BUILTIN_DIR / f"{base}.yaml").read_text())
    doc.update(name=name, port=8017, summary=f"{base} with partial-prefill concurrency")
    doc["vllm"]["args"] = [*doc["vllm"]["args"], FLAG]
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    pins = yaml.safe_load((STATE / "pins.yaml").read_text())
    pins["stacks"][name] = dict(pins["stacks"][base])
    # Only the stack may differ: test_12 leaves the fleet on another branch than the testbed's
    # pins, and a driver change opens its own window before the stacks role is reached.
    pins["driver"]["branch"] = branch
    path = tmp_path / "pins-partial.yaml"
    path.write_text(yaml.safe_dump(pins, sort_keys=False))
    return name, stacks, path, str(pins["stacks"][base]["vllm_version"])


def driver_branch(host) -> str:
    rc, out = host.sh("nvidia-smi --query-gpu=driver_version --format=csv,noheader")
    assert rc == 0 and out.strip(), out
    return out.splitlines()[0].split(".")[0]


def serving_container(host) -> str:
    rc, out = host.sh("docker ps -q --no-trunc --filter label=io.rigfleet.stack")
    assert rc == 0, out
    return out.strip()


def test_a_flag_the_pinned_vllm_does_not_know_is_refused_at_staging(testbed, converged,
                                                                    tmp_path):
    host, key = testbed.fleet[0], testbed.api_key
    assert front_answers(host, key)
    route = route_of(host, key)
    base = route.split("/")[0]
    name, stacks, pins, version = stack_with_flag(tmp_path, base, driver_branch(host))
    before = (serving_container(host), len(ledger(host)))
    probe = FrontProbe(host, key)
    probe.start()
    try:
        proc = pyinfra("-y", *FAST, "--limit", host.name, "--data", f"stack={name}",
                       "--data", f"stacks_dir={stacks}", "--data", f"pins_file={pins}",
                       check=False)
    finally:
        answers = probe.stop().seen
    said = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0, said[-3000:]
    assert (f"{stacks / name}.yaml: vllm.args: unrecognized arguments: {FLAG} "
            f"(refused by the parser of vLLM {version} in vllm/vllm-openai:") in said, said[-3000:]
    assert "nothing on the host changed" in said
    # Refused before any window: the front answered 200 the whole time, from the same stack.
    assert answers and {a[1] for a in answers} == {200}, {str(a[1]) for a in answers}
    assert route_of(host, key) == route
    assert (serving_container(host), len(ledger(host))) == before
    rc, out = host.sh(f"test -e {HOST.stack_dir(name)} && echo staged || echo absent")
    assert out.strip() == "absent", out
    print(f"refused; {len(answers)} front answers, all 200: "
          f"{json.dumps(said[said.find('vllm.args'):][:200])}")
