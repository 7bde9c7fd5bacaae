"""The simulator's per-version argument table answering rigfleet.vllmargs' check script (each
simulated vLLM package parses as the version it stands for)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from vllm_sim_helpers import make_package

from rigfleet.catalog import builtin_catalog
from rigfleet.vllmargs import CHECK_SCRIPT, Verdict, parse_output

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
    for tag in ("v0.24.0", "v0.27.1", "v0.21.0",
                "nightly-f090c883507d730ae76900d4ae60b673430b4bbf"):
        out[tag] = make_package(tmp_path_factory.mktemp(tag.replace(".", "_")[:20]), tag)
    return out


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
