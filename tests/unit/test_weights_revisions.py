"""Weights per revision: names, what is kept, disk space, the config hash across the move, and a
rollback that mounts the old revision (the real host-side transaction on fakes).

Run: ``.venv/bin/python -m pytest tests/unit/test_weights_revisions.py -q``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from swap_fakes import FakeFront, FakeGate, FakeHost, journal, make_plan
from test_catalog_compose import REVISION, make_host, make_pins

from rigfleet.catalog import builtin_catalog
from rigfleet.compose import SERVICE, compose_document, config_hash, render_document
from rigfleet.desired import desired_stack
from rigfleet.hostside.active import write_active
from rigfleet.hostside.layout import CONFIG_HASH_LABEL, HOST, Layout
from rigfleet.hostside.plan import Active, StackRef
from rigfleet.hostside.transaction import Transaction
from rigfleet.retention import stale
from rigfleet.weights import (
    WeightsDirs,
    WeightsDirsState,
    WeightsEntry,
    retired_weights,
    revision_name,
    stale_weights,
)

LOCAL = "qwen3.6-27b-autoround-int4"
R, S, T = "1" * 40, "2" * 40, "3" * 40


def entries(*items: WeightsEntry) -> dict[str, WeightsEntry]:
    return {e.name: e for e in items}


def rev(revision: str, mtime: int = 100) -> WeightsEntry:
    return WeightsEntry(revision_name(LOCAL, revision), "dir", mtime)


# --- names and the pruning rule -----------------------------------------------------------------


def test_a_revisions_directory_is_named_by_the_layout():
    assert revision_name(LOCAL, R) == f"{LOCAL}@{R[:12]}"
    assert str(HOST.weights_dir("/srv/models", LOCAL, R)) == f"/srv/models/{LOCAL}@{R[:12]}"
    assert str(HOST.weights_legacy_dir("/srv/models", LOCAL)) == f"/srv/models/{LOCAL}"
    assert Layout(Path("/tmp/x")).weights_dir("/srv/models", LOCAL, R) == Path(
        f"/tmp/x/srv/models/{LOCAL}@{R[:12]}")


def test_only_the_pinned_revision_and_what_a_compose_file_names_are_kept():
    dirs = WeightsDirsState(entries(rev(R, 100), rev(S, 200), rev(T, 300)))
    # No compose file names anything: only the pin stays (no extra revision is kept).
    assert stale_weights(dirs, LOCAL, T) == [revision_name(LOCAL, R), revision_name(LOCAL, S)]
    # The active snapshot names R (what a rollback restarts): kept, however old.
    named = replace(dirs, referenced=frozenset({revision_name(LOCAL, R)}))
    assert stale_weights(named, LOCAL, T) == [revision_name(LOCAL, S)]
    # The pin need not be there yet (it downloads next): everything unnamed goes.
    assert stale_weights(named, LOCAL, "4" * 40) == [revision_name(LOCAL, S),
                                                     revision_name(LOCAL, T)]


def test_one_rule_for_genesis_trees_and_weights():
    import roles.genesis

    assert roles.genesis.stale is stale  # genesis_export prunes trees by the weights' rule
    trees = {"a": 1, "b": 2, "c": 3, "d": 4}
    assert stale(trees, "d", {"a"}, 1) == ["b", "c"]


def test_partial_downloads_links_and_foreign_directories():
    pinned_partial = WeightsEntry(f".{revision_name(LOCAL, S)}.partial", "partial", 50)
    old_partial = WeightsEntry(f".{revision_name(LOCAL, T)}.partial", "partial", 60)
    link = WeightsEntry(LOCAL, "link", 70, revision_name(LOCAL, R))
    other_model = WeightsEntry("other-model@0123456789ab", "dir", 1)
    odd = WeightsEntry(f"{LOCAL}@not-a-revision", "dir", 1)
    dirs = WeightsDirsState(entries(rev(R), pinned_partial, old_partial, link, other_model, odd))
    # The pinned revision's partial download resumes; another's goes; so does an unnamed link.
    assert stale_weights(dirs, LOCAL, S) == sorted(
        [LOCAL, old_partial.name, revision_name(LOCAL, R)])
    # A compose file still names the old path: the link and the directory it points to stay.
    named = replace(dirs, referenced=frozenset({LOCAL}))
    assert stale_weights(named, LOCAL, S) == [old_partial.name]
    # A real directory under the old name is never removed (unverified, or someone's copy).
    real = WeightsDirsState(entries(WeightsEntry(LOCAL, "dir", 1)))
    assert stale_weights(real, LOCAL, S) == []


def test_models_no_staged_stack_serves_go_unless_a_compose_file_mounts_them():
    old = "qwen3.5-27b-int4"
    retired = [WeightsEntry(f"{old}@{'a' * 12}", "dir", 10),
               WeightsEntry(f".{old}@{'b' * 12}.partial", "partial", 20),
               WeightsEntry(old, "link", 30, f"{old}@{'a' * 12}")]
    foreign = [WeightsEntry("notes", "dir", 1), WeightsEntry("hf@cache", "dir", 1),
               WeightsEntry("draft@v2", "dir", 1)]
    dirs = WeightsDirsState(entries(rev(R), rev(S), *retired, *foreign))
    # Served: LOCAL (its own rule, stale_weights, decides its revisions); the old model's
    # revision, partial download and old-name link go; foreign names stay.
    assert retired_weights(dirs, {LOCAL}) == sorted(e.name for e in retired)
    assert retired_weights(dirs, {LOCAL, old}) == []
    # The active snapshot still mounts the old model through its link: all of it stays but the
    # partial download nobody mounts.
    mounted = replace(dirs, referenced=frozenset({old}))
    assert retired_weights(mounted, {LOCAL}) == [f".{old}@{'b' * 12}.partial"]
    # Nothing served at all (a host whose stacks all moved away): every model is retired.
    assert retired_weights(dirs, set()) == sorted(
        [*(e.name for e in retired), revision_name(LOCAL, R), revision_name(LOCAL, S)])


def test_the_weights_dirs_fact_on_a_real_directory(tmp_path):
    models = tmp_path / "srv models.d"  # a space and a regex character in the model dir
    a, b = models / revision_name(LOCAL, R), models / revision_name(LOCAL, S)
    for d in (a, b):
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(b"x" * 4096)
    (models / f".{revision_name(LOCAL, T)}.partial").mkdir()
    (models / LOCAL).symlink_to(a.name)
    (models / "unrelated").mkdir()
    (models / "a file").write_text("not listed")
    staged, snapshot = tmp_path / "staged.yaml", tmp_path / "active.yaml"
    staged.write_text(f"    volumes:\n    - {b}:/root/.cache/huggingface/{LOCAL}:ro\n")
    snapshot.write_text("    volumes:\n"
                        f"    - {models}/{LOCAL}:/root/.cache/huggingface/{LOCAL}:ro\n"
                        f"    - /elsewhere{models}/{LOCAL}:/x:ro\n")  # fmt: skip
    fact = WeightsDirs()
    command = fact.command(model_dir=str(models),
                           compose_files=(str(staged), str(snapshot), str(tmp_path / "none")))
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    state = fact.process(out.stdout.splitlines())
    assert set(state.entries) == {a.name, b.name, f".{revision_name(LOCAL, T)}.partial", LOCAL,
                                  "unrelated"}
    assert state.entries[LOCAL].kind == "link" and state.entries[LOCAL].target == a.name
    assert state.entries[a.name].kind == "dir"
    assert state.entries[f".{revision_name(LOCAL, T)}.partial"].kind == "partial"
    assert state.referenced == {b.name, LOCAL}
    # Nothing there at all: no entries, and the command still succeeds.
    empty = fact.command(model_dir=str(tmp_path / "missing"))
    run = subprocess.run(["sh", "-c", empty], capture_output=True, text=True)
    assert run.returncode == 0 and fact.process(run.stdout.splitlines()) == WeightsDirsState()


def test_a_weights_mount_the_compose_file_quotes_is_still_read_as_mounted(tmp_path):
    """A model_dir with " #" is single-quoted in the rendered compose file (YAML would read a
    comment there); the revision it mounts stays mounted, never pruned under the engine."""
    from rigfleet.compose import _Dumper

    models = tmp_path / "srv #models"
    mounted = models / revision_name(LOCAL, R)
    mounted.mkdir(parents=True)
    compose = tmp_path / "active.yaml"
    compose.write_text(yaml.dump({"volumes": [f"{mounted}:/root/.cache/huggingface/{LOCAL}:ro"]},
                                 Dumper=_Dumper, default_flow_style=False, width=100))
    assert f"'{mounted}:" in compose.read_text()
    fact = WeightsDirs()
    command = fact.command(model_dir=str(models), compose_files=(str(compose),))
    out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True)
    assert fact.process(out.stdout.splitlines()).referenced == {mounted.name}


# --- the compose file and its config hash ---------------------------------------------------


def pre_revision_hash(doc: dict[str, Any]) -> str:
    """The config hash as rigfleet computed it before per-revision directories: sha256 of the
    canonical JSON of the document without its own label (written out here on purpose: an
    independent oracle for the hash a deployed host's container carries)."""
    copy = json.loads(json.dumps(doc))
    for service in copy["services"].values():
        service["labels"].pop(CONFIG_HASH_LABEL, None)
    canonical = json.dumps(copy, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def test_the_move_to_the_revisions_directory_keeps_the_config_hash():
    """A host converged before per-revision directories mounts ``<model_dir>/<local_dir>``;
    its container's hash is the old formula over that file. The new file names the revision's
    directory and carries the same hash: no swap for the move alone."""
    for stack in ("int8", "tq3-mtp-genesis"):
        doc = compose_document(builtin_catalog().get(stack), make_pins(), make_host(stack=stack))
        service = doc["services"][SERVICE]
        assert service["volumes"][0].startswith(f"/srv/models/{LOCAL}@{REVISION[:12]}:")
        old = json.loads(json.dumps(doc))
        old_service = old["services"][SERVICE]
        old_service["volumes"][0] = old_service["volumes"][0].replace(f"@{REVISION[:12]}:", ":")
        assert service["labels"][CONFIG_HASH_LABEL] == pre_revision_hash(old)
        assert config_hash(doc) == config_hash(old) == service["labels"][CONFIG_HASH_LABEL]


def test_another_revision_or_model_dir_still_changes_the_hash():
    def h(pins: Any = None, **host: Any) -> str:
        doc = compose_document(builtin_catalog().get("int8"), pins or make_pins(),
                               make_host(**host))
        return str(doc["services"][SERVICE]["labels"][CONFIG_HASH_LABEL])

    base = h()
    other = replace(make_pins(), model=replace(make_pins().model, revision="e" * 40))
    assert h(other) != base
    assert h(model_dir="/data/models") != base
    # Only a suffix naming the labelled revision is folded: a hand-edited mount is seen.
    doc = compose_document(builtin_catalog().get("int8"), make_pins(), make_host())
    edited = json.loads(json.dumps(doc))
    volumes = edited["services"][SERVICE]["volumes"]
    volumes[0] = volumes[0].replace(f"@{REVISION[:12]}:", f"@{'e' * 12}:")
    assert config_hash(edited) != config_hash(doc)


# --- a rollback mounts the old revision (the real transaction) ---------------------------------


class MountingHost(FakeHost):
    """A fake host that records the weights directory each ``docker compose up`` mounts."""

    mounted: list[str]

    def up(self, file: str, project: str) -> str | None:
        doc = yaml.safe_load(Path(file).read_text())
        source = next(v for v in doc["services"][SERVICE]["volumes"] if v.endswith(":ro"))
        self.__dict__.setdefault("mounted", []).append(source.split(":")[0])
        return super().up(file, project)


def test_a_rollback_restarts_the_old_snapshot_on_the_old_revisions_files(tmp_path):
    lay = Layout(tmp_path)
    settings, spec = make_host(), builtin_catalog().get("int8")
    pins_r = replace(make_pins(), model=replace(make_pins().model, revision=R))
    pins_s = replace(make_pins(), model=replace(make_pins().model, revision=S))
    old, new = desired_stack(spec, settings, pins_r), desired_stack(spec, settings, pins_s)
    assert old.config_hash != new.config_hash  # a revision change is a gated swap
    staged = lay.compose_file("int8")
    staged.parent.mkdir(parents=True)
    staged.write_text(new.text)
    snap = StackRef(**{**old.ref.to_dict(), "compose_file": str(lay.active_compose)})
    write_active(lay, Active(snap, "2026-11-29T10:00:00+00:00", "old", "alice@ctl",
                             {"result": "pass"}), old.text)
    host, front = MountingHost(), FakeFront()
    host.up(str(lay.active_compose), snap.project)
    host.t += 10
    front.serve(snap)
    desired = StackRef(**{**new.ref.to_dict(), "compose_file": str(staged)})
    plan = make_plan(lay, desired)
    out = Transaction(plan, lay, host, front, FakeGate(failed=("needles",)),
                      journal(lay, plan)).run()
    assert out.result == "rolled-back"
    dir_r = str(HOST.weights_dir("/srv/models", LOCAL, R))
    dir_s = str(HOST.weights_dir("/srv/models", LOCAL, S))
    assert host.mounted == [dir_r, dir_s, dir_r]  # served R, tried S, back on R's own files
    assert lay.active_compose.read_text() == old.text


def test_every_rendered_weights_mount_is_read_only():
    for stack in ("int8", "tq3-mtp-genesis"):
        text = render_document(compose_document(builtin_catalog().get(stack), make_pins(),
                                                make_host(stack=stack)))
        [line] = [x for x in text.splitlines() if f"/{LOCAL}@" in x]
        assert re.fullmatch(rf"    - /srv/models/{LOCAL}@{REVISION[:12]}:\S+:ro", line)
        assert os.path.basename(line.split(":")[0].split()[-1]) == revision_name(LOCAL, REVISION)
