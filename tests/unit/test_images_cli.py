"""``rigfleet images status|export|import`` (rigfleet/images/cli.py) with fake hosts
(``FakeRemote`` over ``FakeEngine``s) and a fake registry: the rows, the JSON, the files."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from images_fakes import (
    FakeEngine,
    FakeHub,
    FakeRemote,
    docker_save_tar,
    fleet_data,
    image_config,
    pins_text,
)
from rich.console import Console

import rigfleet.images.cli as images_cli
import rigfleet.ssh
from rigfleet.cli import main
from rigfleet.images.archive import archive_name, read_sidecar
from rigfleet.images.checks import SourceChecker
from rigfleet.images.cli import as_json, exit_status, fleet_images, table
from rigfleet.inventory import InventoryHost

IMAGE = "vllm/vllm-openai:v0.27.1"
DIGEST = "sha256:" + "d" * 64
CONFIG = image_config(b"v0.27.1")
IMAGE_ID = "sha256:" + hashlib.sha256(CONFIG).hexdigest()


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch) -> dict[str, Any]:
    pins = tmp_path / "pins.yaml"
    pins.write_text(pins_text(f'int8: {{image: "{IMAGE}", digest: "{DIGEST}", vllm_version: '
                              f'0.27.1, image_id: "{IMAGE_ID}"}}\n'))
    common = fleet_data(tmp_path, pins_file=str(pins))
    hosts = [InventoryHost(f"host{i}", ("gpu_hosts",), dict(common)) for i in (1, 2, 3)]
    has = FakeEngine()
    has.add(IMAGE_ID, digests={f"vllm/vllm-openai@{DIGEST}"}, tags={IMAGE}, config=CONFIG)
    remote = FakeRemote(engines={"host1": has, "host2": FakeEngine(), "host3": FakeEngine()})
    monkeypatch.setattr(images_cli, "_hosts", lambda inventory: hosts)
    monkeypatch.setattr(rigfleet.ssh, "SshRemote", lambda **_: remote)
    monkeypatch.setattr(images_cli, "SourceChecker", checker)
    return {"hosts": hosts, "remote": remote, "tmp": tmp_path}


def checker(known: bool = True) -> SourceChecker:
    return SourceChecker(lambda url: FakeHub(url, {DIGEST: (IMAGE_ID, 9 * 1024**3)}
                                             if known else {}))  # type: ignore[arg-type, return-value]


def test_status_rows_say_what_is_there_and_where_it_would_come_from(fleet) -> None:
    fleet["remote"].down = {"host3"}
    rows = fleet_images(fleet["hosts"], fleet["remote"])
    console = Console(width=200, record=True)
    table(rows).print(console)
    text = console.export_text()
    lines = {line.split()[0]: line for line in text.splitlines() if line.startswith("host")}
    assert "yes (digest)" in lines["host1"] and IMAGE_ID[7:19] in lines["host1"]
    assert "[0] hub" in lines["host2"] and " no " in lines["host2"]
    assert "host2: vllm/vllm-openai:v0.27.1 (stacks int8); image_sources[0] (hub): " in text
    assert "connection refused" in text
    data = as_json(rows)
    by = {h["host"]: h for h in data["hosts"]}
    assert by["host1"]["images"][0]["present"] is True
    assert by["host2"]["images"][0]["action"] == "fetch"
    assert by["host2"]["images"][0]["tried"][0]["ok"] is True
    assert by["host3"]["error"].startswith("host3: ssh") and data["ok"] is False
    assert exit_status(rows) == 1


def test_status_exit_1_when_a_host_cannot_get_an_image(fleet, monkeypatch) -> None:
    monkeypatch.setattr(images_cli, "SourceChecker", lambda: checker(known=False))
    rows = fleet_images(fleet["hosts"][:2], fleet["remote"])
    assert exit_status(rows) == 1
    host2 = as_json(rows)["hosts"][1]
    assert host2["images"][0]["action"] == "refused"
    assert any("no source can provide it" in p for p in host2["problems"])
    monkeypatch.setattr(images_cli, "SourceChecker", checker)
    assert exit_status(fleet_images(fleet["hosts"][:1], fleet["remote"])) == 0


def test_export_through_the_cli(fleet, capsys) -> None:
    out = fleet["tmp"] / "saved"
    rc = main(["images", "export", "--host", "host1", "--to", str(out), "--json"])
    assert rc == 0
    result = json.loads(capsys.readouterr().out)
    [saved] = result["saved"]
    assert saved["image_id"] == IMAGE_ID and saved["stacks"] == ["int8"]
    assert Path(saved["path"]) == out / archive_name(IMAGE)
    assert read_sidecar(out / archive_name(IMAGE))["vllm_version"] == "0.27.1"
    with pytest.raises(SystemExit):
        main(["images", "export", "--host", "host1"])  # --to is required
    assert main(["images", "export", "--host", "nope", "--to", str(out)]) == 2  # usage
    assert "--host 'nope': not in inventory/home.py" in " ".join(capsys.readouterr().err.split())


def test_import_into_an_archive_source_and_onto_hosts(fleet, capsys) -> None:
    saved = fleet["tmp"] / "from-a-friend.tar"
    image_id = docker_save_tar(saved, [IMAGE], payload=b"friend")
    into = fleet["tmp"] / "archive"
    rc = main(["images", "import", str(saved), "--into", str(into), "--host", "host2",
               "--digest", DIGEST, "--json"])
    result = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert result["hosts"] == {"host2": "loaded"}
    assert result["pin"] == {"image": IMAGE, "digest": DIGEST, "image_id": image_id}
    kept = into / archive_name(IMAGE)
    assert kept.read_bytes() == saved.read_bytes()
    side = read_sidecar(kept)
    assert side["image_id"] == image_id and side["digest"] == DIGEST
    assert side["sha256"] == hashlib.sha256(saved.read_bytes()).hexdigest()
    assert fleet["remote"].engines["host2"].find(IMAGE).id == image_id  # type: ignore[union-attr]
    # Importing again: the host has it, nothing is streamed.
    loads = fleet["remote"].commands.count("docker load")
    assert main(["images", "import", str(kept), "--host", "host2"]) == 0
    assert fleet["remote"].commands.count("docker load") == loads


def test_a_host_named_twice_is_loaded_and_shown_once(fleet, capsys) -> None:
    saved = fleet["tmp"] / "from-a-friend.tar"
    docker_save_tar(saved, [IMAGE], payload=b"friend")
    assert main(["images", "import", str(saved), "--host", "host2", "--host", "host3", "--host",
                 "host2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert list(result["hosts"].items()) == [("host2", "loaded"), ("host3", "loaded")]
    assert fleet["remote"].commands.count("docker load") == 2  # one per host
    assert main(["images", "import", str(saved), "--host", "x", "--host", "x"]) == 2
    assert "--host 'x': not in inventory/home.py" in " ".join(capsys.readouterr().err.split())


def test_import_needs_a_destination_and_a_name(fleet, capsys) -> None:
    saved = fleet["tmp"] / "untagged.tar"
    docker_save_tar(saved, None)
    assert main(["images", "import", str(saved)]) == 2  # usage errors, as argparse's
    assert "say where it goes: --host NAME" in capsys.readouterr().err
    assert main(["images", "import", str(saved), "--host", "host2", "--host", "x", "--host",
                 "y"]) == 2  # every unknown name, in the same words as export's
    assert "--host 'x', 'y': not in inventory/home.py" in " ".join(capsys.readouterr().err.split())
    assert main(["images", "import", str(saved), "--into", str(fleet["tmp"] / "a")]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "its name is unknown (tags: none); allowed: --image" in err
    assert main(["images", "import", str(saved), "--into", str(fleet["tmp"] / "a"),
                 "--image", IMAGE]) == 0


def test_status_table_at_80_columns_keeps_hosts_and_presence(fleet, monkeypatch) -> None:
    """In a pipe (COLUMNS=80, no terminal) each row still says whose it is and whether the
    image is there; nothing is cut to "…"."""
    fleet["remote"].down = {"host3"}
    rows = fleet_images(fleet["hosts"], fleet["remote"])
    monkeypatch.setenv("COLUMNS", "80")
    buf = io.StringIO()
    console = Console(file=buf)
    assert console.width == 80 and not console.is_terminal
    table(rows).print(console)
    text = buf.getvalue()
    assert "…" not in text and max(len(x.rstrip()) for x in text.splitlines()) <= 80
    lines = {line.split()[0]: line for line in text.splitlines() if line.startswith("host")}
    assert "yes" in lines["host1"] and " no " in lines["host2"] and "?" in lines["host3"]


def test_unusable_to_and_into_are_usage_errors_before_any_host(fleet, capsys) -> None:
    """A --to/--into that is a file (or cannot be created) is refused naming the flag, exit 2,
    before SSH; it used to escape as an OSError traceback (export: after asking the host)."""
    blocker = fleet["tmp"] / "a-file"
    blocker.write_text("not a directory")
    assert main(["images", "export", "--host", "host1", "--to", str(blocker)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"--to {blocker}:" in err and "allowed: a directory" in err
    assert main(["images", "export", "--host", "host1", "--to", str(blocker / "sub")]) == 2
    assert "--to " in capsys.readouterr().err
    assert fleet["remote"].commands == []
    saved = fleet["tmp"] / "saved.tar"
    docker_save_tar(saved, [IMAGE], payload=b"x")
    assert main(["images", "import", str(saved), "--into", str(blocker), "--host", "host2"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"--into {blocker}:" in err and "allowed: a directory" in err
    assert fleet["remote"].commands == []


@pytest.mark.parametrize("action", ["status", "export", "import"])
def test_timeout_help_says_what_it_limits(action: str, capsys) -> None:
    """--timeout limits the SSH connect only (reading a host's images may take 120 s, a
    transfer much longer); the help said "seconds per host"."""
    with pytest.raises(SystemExit):
        main(["images", action, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--timeout S seconds per SSH connect (default 20)" in out
