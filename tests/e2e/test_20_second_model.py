"""Issue 17 item 4 on the simulated fleet: a second model, served by a user's stack file on one
host while the other host serves today's model.

The twin's hub serves a second model repo (``next_model`` in the testbed's fixtures.json). The
first fleet host gets a stack file naming it (``model``) and pins holding its revision
(``models``); one converge of that host fetches it into its own directory and swaps to it
through the gate. The other host, its container and today's weights stay as they were.
About five minutes after test_02.

    RIGFLEET_TESTBED_INSTANCE=4 RIGFLEET_TESTBED_HOSTS=2 .venv/bin/python -m pytest \
        tests/e2e/test_01_testbed.py tests/e2e/test_02_converge.py \
        tests/e2e/test_20_second_model.py -x -v
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import yaml
from e2e_fleet import STATE, last_ledger, pyinfra
from test_04_swap import FAST, route_of
from test_13_vllm_args import driver_branch, serving_container

from rigfleet.catalog import BUILTIN_DIR

SERVED = "qwen3.8-27b-autoround"
TODAY = "qwen3.6-27b-autoround"


def next_model_stack(tmp_path: Path, base: str, branch: str) -> tuple[str, Path, Path, dict]:
    """A user's copy of ``base`` serving the twin's second model, and pins that pin it (the
    driver ``branch`` the host runs). Returns (its name, stacks dir, pins file, the model)."""
    model = json.loads((STATE / "fixtures.json").read_text())["next_model"]
    name = f"{base}-next"
    doc = yaml.safe_load((BUILTIN_DIR / f"{base}.yaml").read_text())
    doc.update(name=name, port=8027, summary=f"{base} serving {model['repo']}",
               served_model_name=SERVED, model=model["repo"])
    stacks = tmp_path / "stacks"
    stacks.mkdir()
    (stacks / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    pins = yaml.safe_load((STATE / "pins.yaml").read_text())
    pins["stacks"][name] = dict(pins["stacks"][base])
    pins["models"] = {model["repo"]: {"revision": model["revision"]}}
    pins["driver"]["branch"] = branch
    path = tmp_path / "pins-next.yaml"
    path.write_text(yaml.safe_dump(pins, sort_keys=False))
    return name, stacks, path, model


def served_models(host, key: str) -> list[str]:
    """The model ids the host's front lists (``/v1/models``)."""
    req = urllib.request.Request(f"{host.front_url}/v1/models",
                                 headers={"Authorization": f"Bearer {key}"})
    with host.urlopen(req, timeout=10) as resp:
        return [m["id"] for m in json.loads(resp.read())["data"]]


def chat(host, key: str, model: str) -> str:
    body = json.dumps({"model": model, "max_tokens": 8,
                       "messages": [{"role": "user", "content": "Capital of France?"}]})
    req = urllib.request.Request(f"{host.front_url}/v1/chat/completions", data=body.encode(),
                                 headers={"Authorization": f"Bearer {key}",
                                          "Content-Type": "application/json"})
    with host.urlopen(req, timeout=60) as resp:
        return str(json.loads(resp.read())["model"])


def weights_mount(host, container: str) -> str:
    rc, out = host.sh("docker inspect -f '{{range .Mounts}}{{.Source}} {{end}}' " + container)
    assert rc == 0, out
    found = [m for m in out.split() if "@" in m.rsplit("/", 1)[-1]]
    assert len(found) == 1, out
    return found[0]


def test_one_host_serves_a_second_model_while_the_other_serves_todays(testbed, converged,
                                                                      tmp_path):
    host, other, key = testbed.fleet[0], testbed.fleet[1], testbed.api_key
    assert served_models(host, key) == [TODAY] and served_models(other, key) == [TODAY]
    base = route_of(host, key).split("/")[0]
    today_dir = weights_mount(host, serving_container(host))
    other_before = serving_container(other)
    name, stacks, pins, model = next_model_stack(tmp_path, base, driver_branch(host))
    # What a model this host served before left (no staged stack serves it): its revision's
    # directory and a partial download go with this converge; a directory of someone's stays.
    model_dir = today_dir.rsplit("/", 1)[0]
    retired = [f"{model_dir}/qwen3.5-27b-int4@{'9' * 12}",
               f"{model_dir}/.qwen3.5-27b-int4@{'8' * 12}.partial"]
    foreign = f"{model_dir}/notes@home"
    rc, out = host.sh(" && ".join(f"mkdir -p {d} && echo x > {d}/model.safetensors"
                                  for d in (*retired, foreign)))
    assert rc == 0, out

    proc = pyinfra("-y", *FAST, "--limit", host.name, "--data", f"stack={name}",
                   "--data", f"stacks_dir={stacks}", "--data", f"pins_file={pins}",
                   check=False)
    said = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, said

    # The host serves the second model, from its own revision's directory.
    assert served_models(host, key) == [SERVED], said
    assert route_of(host, key).startswith(f"{name}/")
    assert chat(host, key, SERVED) == SERVED
    mount = weights_mount(host, serving_container(host))
    assert mount == f"{model_dir}/qwen3.8-27b-int4-autoround@{model['revision'][:12]}"
    rc, out = host.sh(f"cat {mount}/.rigfleet-manifest.json")
    assert rc == 0 and json.loads(out)["repo"] == model["repo"], out
    assert json.loads(out)["revision"] == model["revision"]
    line = last_ledger(host)
    assert (line["stack"], line["model_repo"], line["model_revision"]) == \
        (name, model["repo"], model["revision"]), line
    # Today's weights stay where they were (the staged built-in stacks still mount them).
    assert host.sh(f"test -d {today_dir}")[0] == 0
    assert [d for d in retired if host.sh(f"test -e {d}")[0] == 0] == [], said
    assert host.sh(f"test -f {foreign}/model.safetensors")[0] == 0
    host.sh(f"rm -rf {foreign}")

    # The other host was not touched and still serves today's model.
    assert serving_container(other) == other_before
    assert served_models(other, key) == [TODAY]
    assert chat(other, key, TODAY) == TODAY
