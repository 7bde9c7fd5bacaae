"""The hub fixture's two revisions, and what the simulator makes of each one's weights."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest
from rigfleet_testbed import model_fixture
from rigfleet_testbed.model_fixture import build_model_fixture

SIM_DIR = Path(__file__).resolve().parents[2] / "testbed/rigfleet_testbed/images/vllm-sim"
if str(SIM_DIR) not in sys.path:
    sys.path.insert(0, str(SIM_DIR))

from vllm.sim import weights  # noqa: E402
from vllm.sim.responder import Reply  # noqa: E402
from vllm_sim_helpers import (  # noqa: E402
    SimServer,
    make_gpu_root,
    make_package,
    needle_prompt,
)

# The testbed's fixture (shard_mib=2): the first commit is what fleets are pinned at and must
# never change; the second is deterministic too.
GOOD = "74647d5994d2218fd73cc88c4603cf486c18b464"
LATER = "916f239e2a878e7505eaa8056ac8f29a195232b6"
O_PROJ = "model.language_model.layers.{}.self_attn.o_proj.qweight"


@pytest.fixture(scope="module")
def fixture(tmp_path_factory: pytest.TempPathFactory) -> model_fixture.ModelFixture:
    return build_model_fixture(tmp_path_factory.mktemp("hub"), shard_mib=2)


def checkout(fx: model_fixture.HubRepo, files: dict[str, tuple[int, str]],
             dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for name, (_, sha) in files.items():
        (dest / name).write_bytes((fx.path / "blobs" / sha).read_bytes())
    return dest


def tensor(path: Path, name: str) -> bytes:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    begin, end = json.loads(raw[8:8 + n])[name]["data_offsets"]
    return raw[8 + n + begin:8 + n + end]


def test_two_deterministic_commits_main_at_the_later(fixture) -> None:
    assert (fixture.commit, fixture.later_commit) == (GOOD, LATER)
    repo = json.loads((fixture.path / "repo.json").read_text())
    assert repo["branches"] == {"main": LATER}
    assert repo["commits"][LATER]["parents"] == [GOOD]
    assert repo["commits"][GOOD]["parents"] == []
    assert repo["commits"][LATER]["date"] > repo["commits"][GOOD]["date"]
    changed = {n for n in fixture.files if fixture.files[n] != fixture.later_files[n]}
    assert changed == {"config.json", "README.md"} | {
        f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)}
    # Same layout and sizes: it downloads and loads like the first.
    assert {n: s for n, (s, _) in fixture.files.items() if n.endswith(".safetensors")} == \
        {n: s for n, (s, _) in fixture.later_files.items() if n.endswith(".safetensors")}


def test_the_later_upload_zeroes_every_full_attention_o_proj(fixture, tmp_path: Path) -> None:
    good = checkout(fixture, fixture.files, tmp_path / "good")
    bad = checkout(fixture, fixture.later_files, tmp_path / "bad")
    index = json.loads((good / "model.safetensors.index.json").read_text())["weight_map"]
    for i in (3, 63):
        name = O_PROJ.format(i)
        assert set(tensor(bad / index[name], name)) == {0x88}  # all int4 zero points
        assert len(set(tensor(good / index[name], name))) > 200
    linear = "model.language_model.layers.0.linear_attn.out_proj.qweight"
    assert tensor(bad / index[linear], linear) == tensor(good / index[linear], linear)
    assert json.loads((bad / "config.json").read_text())["quantization_config"]["iters"] == 0

    assert weights.inspect(good) == weights.AttentionHealth(16, ())
    health = weights.inspect(bad)
    assert health.dead_layers == tuple(range(3, 64, 4)) and health.recall_horizon == 4096


def test_recall_past_the_horizon_comes_back_wrong() -> None:
    from rigfleet.hostside.verify.prompts import recalled

    dead = weights.AttentionHealth(16, tuple(range(3, 64, 4)))
    half = weights.AttentionHealth(16, tuple(range(3, 32, 4)))
    assert half.recall_horizon == 8192
    reply = Reply(content="The hidden phrase is 'amber otter 42'.", kind="recall",
                  recall_value="amber otter 42", reasoning="It says 'amber otter 42'.")
    for seed in range(40):
        wrong = weights.recall_reply(reply, 8000, seed, dead)
        assert not recalled("amber otter 42", wrong.content), wrong.content
        assert "amber otter 42" not in wrong.reasoning
        assert wrong.content.startswith("The hidden phrase is '") and wrong.kind == "recall"
    assert weights.recall_reply(reply, 4000, 1, dead) is reply  # within the horizon
    assert weights.recall_reply(reply, 8000, 1, half) is reply
    assert weights.recall_reply(reply, 90000, 1, weights.AttentionHealth(16)) is reply
    essay = Reply(content="Long prose about amber otters.", kind="text")
    assert weights.recall_reply(essay, 90000, 1, dead) is essay  # only recall depends on it


def test_served_revisions_differ_only_in_long_context_recall(fixture, tmp_path: Path) -> None:
    """The simulator boots both revisions; only the later one misses a deep needle."""
    root = make_gpu_root(tmp_path)
    site = make_package(tmp_path)
    secret = "amber otter 42"
    deep = needle_prompt(200, 0.4, secret, "salt1")  # ~15K tokens, past the 4K horizon
    short = needle_prompt(20, 0.4, secret, "salt2")
    results = {}
    for name, files in (("good", fixture.files), ("later", fixture.later_files)):
        model = checkout(fixture, files, tmp_path / name / "qwen3.6-27b-autoround-int4")
        args = ["--served-model-name", "qwen3.6-27b-autoround", "--tensor-parallel-size", "2",
                "--max-model-len", "32768"]
        with SimServer(site, root, model, args) as srv:
            srv.wait_ready()
            answers = []
            for prompt in (short, deep):
                body = srv.chat([{"role": "user", "content": prompt}], max_tokens=30,
                                temperature=0.0,
                                chat_template_kwargs={"enable_thinking": False}).json()
                assert "choices" in body, body
                answers.append(body["choices"][0]["message"]["content"])
            results[name] = answers
            srv.stop()
    assert all(secret in a for a in results["good"])
    assert secret in results["later"][0]  # short context: fine
    assert not all(w in results["later"][1] for w in secret.split()), results["later"][1]


def test_the_gate_fails_the_later_revision_on_its_needles_only(fixture, tmp_path: Path) -> None:
    """rigfleet's verify-stress gate (fast profile) against the simulator serving revision 2."""
    from verify_sim import FAST_ENV, INT8_MTP

    from rigfleet.hostside.verify.profiles import resolve
    from rigfleet.hostside.verify.report import FAIL, PASS
    from rigfleet.hostside.verify.runner import run

    model = checkout(fixture, fixture.later_files, tmp_path / "qwen3.6-27b-autoround-int4")
    with SimServer(make_package(tmp_path), make_gpu_root(tmp_path), model, INT8_MTP,
                   env=FAST_ENV) as srv:
        srv.wait_ready()
        rep, _ = run(f"http://127.0.0.1:{srv.port}", resolve("fast", ["soak_sessions=3"]))
        srv.stop()
    status = {c.name: c.status for c in rep.checks}
    assert status["needles"] == FAIL and status["needles_deep"] == FAIL
    needles = next(c for c in rep.checks if c.name == "needles")
    assert {a["outcome"] for a in needles.details["attempts"]} == {"recall_miss"}
    assert {n for n, s in status.items() if s != PASS} == {"needles", "needles_deep"}, \
        [(c.name, c.summary) for c in rep.checks]


def test_the_next_model_is_its_own_repo_shaped_like_todays(fixture, tmp_path: Path) -> None:
    hub = fixture.path.parents[1]
    nxt = model_fixture.build_next_model_fixture(hub, shard_mib=2)
    assert nxt.repo == model_fixture.NEXT_MODEL_REPO and nxt.commit not in (GOOD, LATER)
    assert json.loads((nxt.path / "repo.json").read_text())["branches"] == {"main": nxt.commit}
    assert set(nxt.files) == set(fixture.files)
    weights_differ = {n for n in fixture.files if fixture.files[n] != nxt.files[n]}
    assert weights_differ == {f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)}
    assert weights.inspect(checkout(fixture, fixture.files, tmp_path / "today")) == \
        weights.inspect(checkout(nxt, nxt.files, tmp_path / "next"))
    assert build_model_fixture(hub, shard_mib=2).commit == GOOD  # the first repo is untouched
