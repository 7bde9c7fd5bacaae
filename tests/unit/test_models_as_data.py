"""Models as data (issue 17 item 4): a stack file names the model it serves, the pins hold a
revision per model, each model has its own weights; today's model renders as before."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_catalog_compose import make_host, make_pins
from test_pins import REVISION, good

from rigfleet.catalog import BUILTIN_DIR, Catalog, CatalogError, builtin_catalog, parse_stack
from rigfleet.compose import compose_document
from rigfleet.desired import build_desired
from rigfleet.pins import ModelPin, PinsError, StackPins, dump_pins, parse_pins

SECOND = "Lorbus/Qwen3.8-27B-int4-AutoRound"
OTHER_REV = "fedcba9876543210fedcba9876543210fedcba98"


def with_second(data: dict[str, Any], **entry: Any) -> dict[str, Any]:
    data["models"] = {SECOND: {"revision": OTHER_REV, **entry}}
    return data


def second_stack(name: str = "int8", model: str = SECOND) -> Any:
    doc = yaml.safe_load((BUILTIN_DIR / "int8.yaml").read_text())
    doc.update(name=name, port=8031, served_model_name="qwen3.8-27b", model=model)
    return parse_stack(doc, f"stacks/{name}.yaml")


def test_a_pins_file_of_today_loads_and_dumps_as_it_was() -> None:
    pins = parse_pins(good())
    assert pins.models == {} and pins.model.key == "model"
    assert list(pins.all_models) == ["Lorbus/Qwen3.6-27B-int4-AutoRound"]
    assert "models" not in yaml.safe_load(dump_pins(pins))
    assert yaml.safe_load(dump_pins(pins))["model"] == good()["model"]


def test_models_pins_a_second_model_with_its_own_directory() -> None:
    pins = parse_pins(with_second(good()))
    assert pins.model.repo == "Lorbus/Qwen3.6-27B-int4-AutoRound"
    second = pins.model_for(SECOND)
    assert second == ModelPin(SECOND, OTHER_REV, "qwen3.8-27b-int4-autoround",
                              f"models.{SECOND}")
    assert pins.model_for(None) == pins.model
    again = parse_pins(yaml.safe_load(dump_pins(pins)))
    assert again.all_models == pins.all_models
    with pytest.raises(PinsError, match=r"models.Org/other: not pinned; pinned: Lorbus/Qwen3.6"):
        pins.model_for("Org/other")


def test_models_alone_makes_its_first_the_default() -> None:
    data = good()
    first = data.pop("model")
    data["models"] = {first["repo"]: {"revision": "unresolved", "local_dir": first["local_dir"]},
                      SECOND: {"revision": OTHER_REV}}
    pins = parse_pins(data, allow_unresolved=True)
    assert pins.model.repo == first["repo"] and pins.model.local_dir == first["local_dir"]
    assert pins.unresolved() == [f"models.{first['repo']}.revision"]
    model = replace(pins.model, revision=REVISION)
    resolved = replace(pins, model=model, models={**pins.models, model.repo: model})
    assert resolved.model.revision == REVISION and resolved.unresolved() == []
    assert "model" not in yaml.safe_load(dump_pins(resolved))


@pytest.mark.parametrize("change, expected", [
    (lambda d: d["models"].update({"Lorbus/Qwen3.6-27B-int4-AutoRound": {"revision": "a" * 40}}),
     "models.Lorbus/Qwen3.6-27B-int4-AutoRound: 'Lorbus/Qwen3.6-27B-int4-AutoRound' is pinned "
     "under model too"),
    (lambda d: d["models"][SECOND].update(local_dir="qwen3.6-27b-autoround-int4"),
     f"models.{SECOND}.local_dir: 'qwen3.6-27b-autoround-int4' is model's too"),
    (lambda d: d["models"][SECOND].update(revision="abc1234"),
     f"models.{SECOND}.revision: 'abc1234' is a short hash"),
    (lambda d: d["models"].update({"no-owner": {"revision": "a" * 40}}),
     "models.no-owner: 'no-owner' is not valid; allowed: a hub repo id"),
    (lambda d: d["models"][SECOND].update(revison="a" * 40),
     f"models.{SECOND}.revison: 'revison' is an unknown key (did you mean 'revision'?)"),
    (lambda d: d.update(models=["x"]), "models: ['x'] is not a mapping"),
    (lambda d: d.update(models={}) or d.pop("model"), "model: missing; allowed: a mapping"),
])
def test_a_bad_models_entry_is_refused_naming_its_key(change: Any, expected: str) -> None:
    data = with_second(good())
    change(data)
    with pytest.raises(PinsError) as e:
        parse_pins(data, "pins.yaml")
    assert f"pins.yaml: {expected}" in str(e.value)


def test_a_stack_files_model_must_be_pinned() -> None:
    spec = second_stack("int8-next")
    catalog = Catalog({**builtin_catalog().stacks, spec.name: spec})
    data = good()
    data["stacks"]["int8-next"] = dict(data["stacks"]["int8"])
    with pytest.raises(PinsError) as e:
        parse_pins(data, "pins.yaml", catalog=catalog)
    assert (f"pins.yaml: stacks.int8-next: 'int8-next' serves {SECOND} (stacks/int8-next.yaml: "
            "model), which is not pinned under model or models") in str(e.value)
    assert parse_pins(with_second(data), catalog=catalog).stacks["int8-next"]
    with pytest.raises(CatalogError, match=r"stacks/x.yaml: model: 'qwen' is not valid"):
        second_stack("x", model="qwen")


def test_todays_stacks_render_as_before_and_a_second_model_gets_its_own_mount() -> None:
    pins, host = make_pins(), make_host()
    today = compose_document(builtin_catalog().get("int8"), pins, host)
    both = replace(pins, models={SECOND: ModelPin(SECOND, OTHER_REV, "qwen3.8",
                                                  f"models.{SECOND}")})
    assert compose_document(builtin_catalog().get("int8"), both, host) == today
    doc = compose_document(second_stack(), both, host)["services"]["vllm"]
    assert doc["volumes"][0] == (f"/srv/models/qwen3.8@{OTHER_REV[:12]}"
                                 ":/root/.cache/huggingface/qwen3.8:ro")
    assert doc["command"][:4] == ["--model", "/root/.cache/huggingface/qwen3.8",
                                  "--served-model-name", "qwen3.8-27b"]
    assert doc["labels"]["io.rigfleet.model-revision"] == OTHER_REV


def test_the_desired_host_fetches_every_model_its_stacks_serve(tmp_path: Path) -> None:
    spec = second_stack("int8-next")
    base = make_host(tmp_path)
    catalog = Catalog({**base.catalog.stacks, spec.name: spec})
    pins = make_pins()
    release = StackPins("int8", "vllm/vllm-openai:v0.27.1", "sha256:" + "c" * 64, "0.27.1")
    staged = {"int8": release, "int8-next": replace(release, name="int8-next")}
    pins = replace(pins, stacks=staged,
                   models={SECOND: ModelPin(SECOND, OTHER_REV, "qwen3.8", f"models.{SECOND}")})
    want = build_desired(replace(base, catalog=catalog, stack="int8-next"), pins)
    assert [m.repo for m in want.models] == [pins.model.repo, SECOND]
    assert want.model_path == f"/srv/models/qwen3.8@{OTHER_REV[:12]}"
    assert want.current.tracked["model_repo"] == SECOND
    assert want.stacks["int8"].tracked["model_revision"] == pins.model.revision
    only_today = build_desired(replace(base, catalog=catalog, stacks=("int8",)), pins)
    assert [m.repo for m in only_today.models] == [pins.model.repo]


def test_host_data_stacks_naming_an_unpinned_stack_is_refused(tmp_path: Path) -> None:
    """`stacks` says what the host stages: a name pins.yaml lacks is not dropped silently."""
    spec = second_stack("int8-next")
    base = make_host(tmp_path)
    catalog = Catalog({**base.catalog.stacks, spec.name: spec})
    pins = make_pins()
    settings = replace(base, catalog=catalog, stacks=("int8", "int8-next"))
    with pytest.raises(PinsError) as e:
        build_desired(settings, pins)
    assert (f"{base.name}: stacks: 'int8-next' is not pinned in {pins.path} (it has no "
            "stacks.int8-next entry); allowed: a pinned stack") in str(e.value)
    assert "rigfleet pins lock" in str(e.value)
    from rigfleet.check import _agree
    assert any("stacks: 'int8-next' is not pinned" in p for p in _agree(settings, pins))


def test_an_unpinned_stack_reads_the_same_to_the_deploy_and_to_check(tmp_path: Path) -> None:
    """`stack` naming a stack pins.yaml lacks: one wording for the deploy and for check."""
    spec = second_stack("int8-next")
    base = make_host(tmp_path)
    pins = make_pins()
    settings = replace(base, catalog=Catalog({**base.catalog.stacks, spec.name: spec}),
                       stack="int8-next")
    line = (f"{base.name}: stack: 'int8-next' is not pinned in {pins.path} (it has no "
            f"stacks.int8-next entry); allowed: a pinned stack ({', '.join(pins.stacks)}): pin "
            "it there (docs/stacks.md) and run `rigfleet pins lock`")
    with pytest.raises(PinsError) as e:
        build_desired(settings, pins)
    assert e.value.problems == [line]
    from rigfleet.check import _agree
    assert line in _agree(settings, pins)
