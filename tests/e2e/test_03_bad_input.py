"""Bad inventory data and bad pins are refused before anything on a host changes.

A refused host gets one operation, the refusal (``Preflight | Refused``): nothing else runs on
it, the run exits 1 naming host, key, value and what is allowed, and the other hosts go on
(``rigfleet_stop_on_preflight`` stops them all instead).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
import yaml
from e2e_fleet import INVENTORY, STATE, run

PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
REFUSAL = "Preflight | Refused"
ONE_BAD_INVENTORY = INVENTORY.with_name(INVENTORY.stem + "-onebad.py")


def deploy(*data: str, inventory: Path = INVENTORY, env: dict[str, str] | None = None):
    """The GPU hosts' converge (the balancer's data are another matter) with ``data``."""
    args = [PYINFRA, str(inventory), "deploy.py", "-y", "--limit", "gpu_hosts"]
    for item in data:
        args += ["--data", item]
    return run(args, check=False, timeout=900, env={**os.environ, **(env or {})})


def operations(out: str) -> list[str]:
    """The operations pyinfra started, in order."""
    return re.findall(r"--> Starting operation: (.+?)\s*$", out, flags=re.M)


def host_state(host) -> str:
    """What a deploy would have changed: the ledger, /etc/rigfleet, the card limits."""
    return host.sh("cat /var/lib/rigfleet/ledger.jsonl 2>/dev/null | wc -l; "
                   "stat -c %Y /etc/rigfleet 2>/dev/null || echo none; "
                   "nvidia-smi --query-gpu=power.limit --format=csv,noheader 2>&1")[1]


@pytest.mark.parametrize(
    ("data", "named"),
    [
        (["stack=int9"], ["stack: 'int9'", "allowed: int8, single-fp8-mtp, tq3-mtp-genesis"]),
        (["power_caps_w=[250, 999]"], ["power_caps_w", "999"]),
        (["power_caps_w=[250, 250, 250]"], ["power_caps_w"]),  # no host has three cards
        (["front_port=8011"], ["front_port", "8011"]),
        (["model_dir=relative/models"], ["model_dir", "relative/models"]),
        (["runtime_pip_index_url=http://u:hunter2@pypi.lan/simple/"],
         ["runtime_pip_index_url", "carries credentials"]),
    ],
)
def test_bad_host_data_is_refused_before_any_change(testbed, data, named):
    before = [host_state(h) for h in testbed.hosts]
    proc = deploy(*data)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    for word in named:
        assert word in out, out[-3000:]
    assert "hunter2" not in out  # a credential is never echoed back
    ops = operations(out)
    assert ops and all(op.startswith(REFUSAL) for op in ops), ops
    assert f"rigfleet: {len(testbed.hosts)} host(s) failed preflight" in out
    assert [host_state(h) for h in testbed.hosts] == before


def test_bad_pins_are_refused_before_any_change(testbed, tmp_path):
    pins = yaml.safe_load((STATE / "pins.yaml").read_text())
    pins["stacks"]["int8"]["digest"] = "sha256:1234"
    pins["model"]["revision"] = pins["model"]["revision"][:9]
    bad = tmp_path / "pins.yaml"
    bad.write_text(yaml.safe_dump(pins))
    before = [host_state(h) for h in testbed.hosts]
    proc = deploy(f"pins_file={bad}")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "sha256:1234" in out and "stacks.int8.digest" in out, out[-3000:]
    assert "model.revision" in out and "40" in out, out[-3000:]
    assert all(op.startswith(REFUSAL) for op in operations(out))
    assert [host_state(h) for h in testbed.hosts] == before


def test_a_pinned_image_the_stack_file_does_not_allow_is_refused(testbed, tmp_path):
    """int8 and single-fp8-mtp run releases (their stack files' image rules): a nightly is
    refused on every host that stages either."""
    pins = yaml.safe_load((STATE / "pins.yaml").read_text())
    for stack in ("int8", "single-fp8-mtp"):
        pins["stacks"][stack].update(
            image="vllm/vllm-openai:nightly-f090c883507d730ae76900d4ae60b673430b4bbf",
            vllm_version="0.32.1rc1.dev761+gf090c8835")
    bad = tmp_path / "pins.yaml"
    bad.write_text(yaml.safe_dump(pins))
    proc = deploy(f"pins_file={bad}")
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode != 0
    assert "stacks.int8: image vllm/vllm-openai:nightly-" in out
    assert "is a nightly tag; the stack runs release tags" in out, out[-3000:]
    assert all(op.startswith(REFUSAL) for op in operations(proc.stdout + proc.stderr))


def write_one_bad_inventory(bad_host: str) -> None:
    """The testbed inventory with one host's power caps out of its cards' range."""
    ONE_BAD_INVENTORY.write_text(f'''"""Testbed inventory, {bad_host} with a bad cap."""
import runpy

_tb = runpy.run_path({str(INVENTORY)!r})
_hosts, _data = _tb["gpu_hosts"]
gpu_hosts = ([(n, {{**d, "power_caps_w": [250, 400]}} if n == {bad_host!r} else d)
              for n, d in _hosts], _data)
''')


def test_one_bad_host_is_refused_alone_and_the_flag_stops_them_all(testbed):
    bad = testbed.fleet[-1]
    write_one_bad_inventory(bad.name)
    try:
        before = host_state(bad)
        proc = deploy(inventory=ONE_BAD_INVENTORY)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 1
        assert (f"{bad.name}: power_caps_w[1]: 400 W is outside card 1 "
                "(NVIDIA GeForce RTX 3090)'s range; allowed: 100..350 W") in out, out[-3000:]
        assert "rigfleet: 1 host(s) failed preflight" in out
        assert "the others went on" in out
        ops = operations(out)
        assert any(not op.startswith(REFUSAL) for op in ops)  # the good hosts converged
        assert f"[{bad.name}] Success" not in out
        assert host_state(bad) == before

        proc = deploy(inventory=ONE_BAD_INVENTORY, env={"RIGFLEET_STOP_ON_PREFLIGHT": "1"})
        out = proc.stdout + proc.stderr
        assert proc.returncode != 0
        assert "rigfleet refused the run" in out and "rigfleet_stop_on_preflight" in out
        assert operations(out) == []
        assert host_state(bad) == before
    finally:
        ONE_BAD_INVENTORY.unlink(missing_ok=True)
