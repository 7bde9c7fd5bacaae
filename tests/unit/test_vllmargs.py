"""A stack's vLLM arguments checked by the image's own parser (``rigfleet.vllmargs``), and the
simulator's per-version argument table that answers it in the testbed."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from vllm_sim_helpers import make_package

from rigfleet.catalog import builtin_catalog
from rigfleet.vllmargs import CHECK_SCRIPT, MARKER, Verdict, check_command, parse_output, refusal

REPO = Path(__file__).resolve().parents[2]
IMAGE = "vllm/vllm-openai:v0.27.1"


def ask(site: Path, argv: list[str], env_names: list[str] = ()) -> Verdict:  # type: ignore[assignment]
    """Run the check script as the image would (its python3, its vllm package)."""
    proc = subprocess.run(
        [sys.executable, "-c", CHECK_SCRIPT, json.dumps(list(env_names)), *argv],
        capture_output=True, text=True, timeout=60, cwd=site,
        env={**os.environ, "PYTHONPATH": str(site)},
    )
    return parse_output(proc.returncode == 0, proc.stdout.splitlines(), proc.stderr.splitlines())


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for tag in ("v0.24.0", "v0.27.1", "v0.21.0", "nightly-f090c883507d730ae76900d4ae60b673430b4bbf"):
        out[tag] = make_package(tmp_path_factory.mktemp(tag.replace(".", "_")[:20]), tag)
    return out


# --- the command and its answer -----------------------------------------------------------------


def test_command_runs_the_pinned_image_offline_without_a_gpu_and_quotes_every_argument():
    argv = ["--model", "/models/q", "--default-chat-template-kwargs", '{"enable_thinking": false}']
    cmd = check_command(IMAGE, argv, {"VLLM_X": "1", "NCCL_P2P_DISABLE": "1"})
    words = shlex.split(cmd)
    assert words[:2] == ["docker", "run"]
    for pair in (["--pull", "never"], ["--network", "none"], ["--entrypoint", "python3"],
                 ["-e", "NVIDIA_VISIBLE_DEVICES=void"]):
        i = words.index(pair[0])
        assert words[i:i + 2] == pair
    i = words.index(IMAGE)
    assert words[i + 1:i + 3] == ["-c", CHECK_SCRIPT]
    assert json.loads(words[i + 3]) == ["NCCL_P2P_DISABLE", "VLLM_X"]  # names only, no values
    assert words[i + 4:] == argv


def test_output_parsing_reads_the_marked_line_among_vllm_logs():
    line = MARKER + json.dumps({"version": "0.27.1", "rc": 2, "unknown_env": ["VLLM_NOPE"],
                                "error": "vllm serve: error: unrecognized arguments: --nope"})
    v = parse_output(True, ["INFO 12-03 vLLM is starting", line], [])
    assert v == Verdict("0.27.1", "unrecognized arguments: --nope", ("VLLM_NOPE",), "")
    ok = parse_output(True, [MARKER + json.dumps({"version": "0.27.1", "rc": 0})], [])
    assert ok == Verdict("0.27.1")


def test_output_without_an_answer_is_a_problem_naming_what_docker_said():
    v = parse_output(False, [], ["Unable to find image 'x:y' locally",
                                 "docker: Error response from daemon: No such image: x:y."])
    assert v.version == "" and "exited non-zero" in v.problem and "No such image: x:y" in v.problem


def test_refusal_names_the_file_the_flag_the_version_and_what_to_do():
    spec = builtin_catalog().get("int8")
    text = refusal(Verdict("0.27.1", "unrecognized arguments: --no-such-flag"), spec, IMAGE)
    assert text is not None
    assert text.startswith(f"{spec.source}: vllm.args: unrecognized arguments: --no-such-flag")
    assert "vLLM 0.27.1" in text and IMAGE in text and "serve --help" in text
    assert "nothing on the host changed" in text
    env = refusal(Verdict("0.27.1", unknown_env=("VLLM_NO_SUCH",)), spec, IMAGE)
    assert env is not None and f"{spec.source}: env: VLLM_NO_SUCH: not a setting of vLLM 0.27.1" in env
    assert refusal(Verdict("0.27.1"), spec, IMAGE) is None
    broken = refusal(Verdict("", problem="the check exited non-zero: no python3"), spec, IMAGE)
    assert broken is not None and "could not be checked" in broken and "no python3" in broken


# --- the simulator answers with its version's table ---------------------------------------------


def _stack_argv(name: str) -> tuple[list[str], list[str]]:
    spec = builtin_catalog().get(name)
    return spec.command("Qwen3.6-27B"), sorted(spec.environment("v12" if spec.genesis else None))


@pytest.mark.parametrize("stack, tag", [("int8", "v0.27.1"), ("single-fp8-mtp", "v0.27.1"),
                                        ("tq3-mtp-genesis", "v0.21.0"), ("tq3-nomtp", "v0.21.0"),
                                        ("turbo", "v0.21.0")])
def test_every_shipped_stack_passes_the_parser_of_its_pinned_version(sites, stack, tag):
    pins = (REPO / "pins.yaml").read_text()
    assert f"image: vllm/vllm-openai:{tag}" in pins
    argv, names = _stack_argv(stack)
    v = ask(sites[tag], argv, names)
    assert v == Verdict(tag.removeprefix("v")), v


def test_an_unknown_flag_is_refused_naming_it(sites):
    argv, _ = _stack_argv("int8")
    v = ask(sites["v0.27.1"], [*argv, "--no-such-flag"])
    assert (v.version, v.error) == ("0.27.1", "unrecognized arguments: --no-such-flag")


def test_flags_removed_upstream_are_refused_by_the_versions_without_them(sites):
    # v0.27.0 removed --max-num-partial-prefills (runpod-workers/worker-vllm#324).
    assert ask(sites["v0.24.0"], ["--max-num-partial-prefills", "2"]) == Verdict("0.24.0")
    # ("2" goes to the positional model_tag, as with `vllm serve`.)
    assert ask(sites["v0.27.1"], ["--max-num-partial-prefills", "2"]).error == \
        "unrecognized arguments: --max-num-partial-prefills"
    # Gone long before any simulated build (vllm#29402, vllm#36216).
    for tag in ("v0.21.0", "v0.27.1"):
        assert "unrecognized arguments: --disable-log-requests" in \
            ask(sites[tag], ["--disable-log-requests"]).error
        assert "--swap-space" in ask(sites[tag], ["--swap-space", "4"]).error
    # Its replacement (vllm#21739) is there, with argparse's --no- form.
    assert ask(sites["v0.27.1"], ["--no-enable-log-requests"]) == Verdict("0.27.1")


def test_malformed_values_and_unknown_settings_are_refused(sites):
    site = sites["v0.27.1"]
    assert "--speculative-config" in ask(site, ["--speculative-config", "{bad"]).error
    assert "invalid choice: 'int4'" in ask(site, ["--kv-cache-dtype", "int4"]).error
    assert "requires --tool-call-parser" in ask(site, ["--enable-auto-tool-choice"]).error
    v = ask(site, [], ["VLLM_NO_SUCH_SETTING", "VLLM_USE_FLASHINFER_SAMPLER", "NCCL_P2P_DISABLE"])
    assert v.unknown_env == ("VLLM_NO_SUCH_SETTING",) and not v.error
    assert ask(site, ["--max_model_len", "4096"]) == Verdict("0.27.1")  # vLLM's spelling rule


def test_the_parser_lives_where_the_version_keeps_it(sites):
    # From 0.29 make_arg_parser is in vllm.entrypoints.launchers.cli_args (worker-vllm#338).
    nightly = sites["nightly-f090c883507d730ae76900d4ae60b673430b4bbf"]
    assert (nightly / "vllm/entrypoints/launchers/cli_args.py").is_file()
    assert not (nightly / "vllm/entrypoints/openai/cli_args.py").exists()
    assert (sites["v0.27.1"] / "vllm/entrypoints/openai/cli_args.py").is_file()
    argv, _ = _stack_argv("int8")
    assert ask(nightly, argv).version.startswith("0.32.1rc1.dev")
    assert ask(nightly, argv).error == ""


# --- the stacks role asks only when the compose file changes ------------------------------------


def test_the_role_asks_the_pinned_image_only_for_a_compose_file_it_would_change(tmp_path,
                                                                                monkeypatch):
    import hashlib

    from test_swap_plan import desired

    import roles.stacks as role
    from rigfleet.facts import FileInfo

    staged = desired(tmp_path, stack="int8").current
    asked: list[str] = []
    answer = MARKER + json.dumps({"version": "0.27.1", "rc": 2,
                                  "error": "vllm serve: error: unrecognized arguments: --x"})
    monkeypatch.setattr(role, "run_on_host", lambda cmd: (asked.append(cmd), (True, [answer],
                                                                              []))[1])
    same = FileInfo("0644", "root", "root", hashlib.sha256(staged.text.encode()).hexdigest())
    monkeypatch.setattr(role, "read_fact", lambda fact, path: same)
    assert role.vllm_args_refusal(staged) is None and asked == []

    monkeypatch.setattr(role, "read_fact", lambda fact, path: None)  # not staged yet
    text = role.vllm_args_refusal(staged)
    assert text is not None and "vllm.args: unrecognized arguments: --x" in text
    words = shlex.split(asked[0])
    i = words.index(staged.pins.local_image)
    # The exact command line of the compose file ('$$' back to '$'), this PINS' local_dir.
    assert words[i + 4:] == staged.spec.command("qwen3.6-27b-autoround-int4")
    assert set(json.loads(words[i + 3])) == set(staged.spec.environment())
