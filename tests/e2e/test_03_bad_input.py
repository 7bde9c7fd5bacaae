"""Bad inventory data and bad pins are refused before anything on a host changes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from conftest import INVENTORY, STATE, run

PYINFRA = str(Path(sys.executable).with_name("pyinfra"))


def deploy(*data: str):
    args = [PYINFRA, str(INVENTORY), "deploy.py", "-y"]
    for item in data:
        args += ["--data", item]
    return run(args, check=False, timeout=600)


def ledger_lines(host) -> str:
    return host.sh("cat /var/lib/rigfleet/ledger.jsonl 2>/dev/null | wc -l; "
                   "stat -c %Y /etc/rigfleet 2>/dev/null || echo none")[1]


@pytest.mark.parametrize(
    ("data", "named"),
    [
        (["stack=int9"], ["int9", "tq3-mtp-genesis"]),
        (["power_caps_w=[250, 999]"], ["999"]),
        (["power_caps_w=[250]"], ["power_caps_w"]),
        (["front_port=8011"], ["8011"]),
        (["model_dir=relative/models"], ["relative/models"]),
    ],
)
def test_bad_host_data_is_refused_before_any_change(testbed, data, named):
    before = [ledger_lines(h) for h in testbed.hosts]
    proc = deploy(*data)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    for word in named:
        assert word in out, out[-3000:]
    assert "Starting operation" not in out, "an operation ran despite bad data"
    assert [ledger_lines(h) for h in testbed.hosts] == before


def test_bad_pins_are_refused_before_any_change(testbed, tmp_path):
    pins = yaml.safe_load((STATE / "pins.yaml").read_text())
    pins["stacks"]["int8"]["digest"] = "sha256:1234"
    pins["model"]["revision"] = pins["model"]["revision"][:9]
    bad = tmp_path / "pins.yaml"
    bad.write_text(yaml.safe_dump(pins))
    proc = deploy(f"pins_file={bad}")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "sha256:1234" in out and "stacks.int8.digest" in out, out[-3000:]
    assert "model.revision" in out and "40" in out, out[-3000:]
    assert "Starting operation" not in out
