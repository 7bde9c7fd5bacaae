"""A stack's vLLM arguments checked by the image's own parser (``rigfleet.vllmargs``), and the
simulator's per-version argument table that answers it in the testbed."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from rigfleet.catalog import builtin_catalog
from rigfleet.vllmargs import CHECK_SCRIPT, MARKER, Verdict, check_command, parse_output, refusal

REPO = Path(__file__).resolve().parents[2]
IMAGE = "vllm/vllm-openai:v0.27.1"
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
    assert env is not None and (
        f"{spec.source}: env: VLLM_NO_SUCH: not a setting of vLLM 0.27.1" in env)
    assert refusal(Verdict("0.27.1"), spec, IMAGE) is None
    broken = refusal(Verdict("", problem="the check exited non-zero: no python3"), spec, IMAGE)
    assert broken is not None and "could not be checked" in broken and "no python3" in broken


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
    i = words.index(staged.pins.image)
    # The exact command line of the compose file ('$$' back to '$'), this PINS' local_dir.
    assert words[i + 4:] == staged.spec.command("qwen3.6-27b-autoround-int4")
    assert set(json.loads(words[i + 3])) == set(staged.spec.environment())


def test_the_role_asks_again_once_when_docker_could_not_start_the_check(tmp_path, monkeypatch):
    from test_swap_plan import desired

    import roles.stacks as role

    staged = desired(tmp_path, stack="int8").current
    runc = ("docker: Error response from daemon: failed to create task for container: failed to "
            "create shim task: OCI runtime create failed: runc create failed: unable to start "
            "container process: waiting for init preliminary setup: read init-p: connection "
            "reset by peer: unknown.")
    good = MARKER + json.dumps({"version": "0.27.1", "rc": 0})
    answers = [(False, [], [runc]), (True, [good], [])]
    monkeypatch.setattr(role, "read_fact", lambda fact, path: None)
    monkeypatch.setattr(role, "run_on_host", lambda cmd: answers.pop(0))
    assert role.vllm_args_refusal(staged) is None and answers == []

    answers = [(False, [], [runc])] * 3  # a runtime that keeps failing is reported, not looped
    text = role.vllm_args_refusal(staged)
    assert text is not None and "read init-p" in text and len(answers) == 1
    answers = [(False, [], ["python3: not found"])] * 2  # anything else is not asked again
    assert "could not be checked" in (role.vllm_args_refusal(staged) or "") and len(answers) == 1
