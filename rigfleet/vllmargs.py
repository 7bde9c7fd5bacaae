"""A stack's ``vllm serve`` arguments and ``VLLM_*`` settings, checked by the pinned image's own
vLLM (releases rename and drop flags): :data:`CHECK_SCRIPT` runs there with no network and no
GPU (docs/stacks.md)::

    cmd = check_command(image, spec.command(local_dir), environment)
    verdict = parse_output(ok, stdout_lines, stderr_lines)
    problem = refusal(verdict, spec, image)      # None when the image accepts everything
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rigfleet.catalog import StackSpec

MARKER = "RIGFLEET-VLLM-ARGS "
# docker's words when its runtime could not start the container at all. A loaded host's runc
# fails so now and then ("read init-p: connection reset by peer"): the check is asked again.
START_FAILED = "OCI runtime create failed"

# Runs inside the image. make_arg_parser: vllm.entrypoints.launchers.cli_args from vLLM 0.29,
# vllm.entrypoints.openai.cli_args before; FlexibleArgumentParser: vllm.utils in older releases.
CHECK_SCRIPT = r"""
import contextlib, io, json, sys
names, argv = json.loads(sys.argv[1]), sys.argv[2:]
out = {"version": "", "rc": 0, "error": "", "unknown_env": [], "problem": ""}
try:
    import vllm
    out["version"] = str(getattr(vllm, "__version__", ""))
    try:
        from vllm.entrypoints.launchers import cli_args
    except ImportError:
        from vllm.entrypoints.openai import cli_args
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser
    import vllm.envs as envs
    known = set(getattr(envs, "environment_variables", {}))
    out["unknown_env"] = sorted(n for n in names if n.startswith("VLLM_") and n not in known)
    parser = FlexibleArgumentParser(prog="vllm serve")
    parser.add_argument("model_tag", nargs="?")
    parser = cli_args.make_arg_parser(parser)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(argv)
    except SystemExit as e:
        out["rc"] = e.code if isinstance(e.code, int) else 2
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        out["error"] = lines[-1] if lines else "argument parsing failed"
    else:
        validate = getattr(cli_args, "validate_parsed_serve_args", None)
        if validate is not None:
            try:
                validate(ns)
            except (TypeError, ValueError) as e:
                out["rc"], out["error"] = 2, str(e)
except Exception as e:
    out["problem"] = type(e).__name__ + ": " + str(e)
print("RIGFLEET-VLLM-ARGS " + json.dumps(out), flush=True)
"""


@dataclass(frozen=True)
class Verdict:
    """What the image's vLLM said about a command line (``problem``: the check could not run)."""

    version: str
    error: str = ""
    unknown_env: tuple[str, ...] = ()
    problem: str = ""


def check_command(image: str, argv: Sequence[str], env_names: Iterable[str]) -> str:
    """The shell command that asks ``image``'s vLLM about ``argv`` and ``env_names``."""
    names = json.dumps(sorted(set(env_names)), separators=(",", ":"))
    return shlex.join(["docker", "run", "--rm", "--pull", "never", "--network", "none",
                       "--entrypoint", "python3", "-e", "NVIDIA_VISIBLE_DEVICES=void", image,
                       "-c", CHECK_SCRIPT, names, *argv])


def start_failed(ok: bool, stdout: Sequence[str], stderr: Sequence[str]) -> bool:
    """Whether docker could not start the check's container (no answer from vLLM at all)."""
    return not ok and not any(ln.startswith(MARKER) for ln in stdout) and \
        any(START_FAILED in ln for ln in [*stdout, *stderr])


def parse_output(ok: bool, stdout: Sequence[str], stderr: Sequence[str]) -> Verdict:
    """The check's answer (its marked line), or a problem naming what went wrong."""
    for line in reversed(stdout):
        if line.startswith(MARKER):
            try:
                data = json.loads(line[len(MARKER):])
            except ValueError:
                break
            if not isinstance(data, dict):
                break
            error = str(data.get("error") or "") if data.get("rc") else ""
            return Verdict(
                version=str(data.get("version") or ""),
                error=error.split(": error: ", 1)[-1].strip(),  # argparse's "<prog>: error: ..."
                unknown_env=tuple(str(n) for n in data.get("unknown_env") or ()),
                problem=str(data.get("problem") or ""),
            )
    tail = " | ".join(ln.strip() for ln in [*stderr, *stdout][-3:] if ln.strip())
    status = "exited non-zero" if not ok else "gave no answer"
    return Verdict(version="", problem=f"the check {status}: {tail or 'no output'}")


def refusal(verdict: Verdict, spec: StackSpec, image: str) -> str | None:
    """The deploy's error for ``verdict`` on stack ``spec`` (None when all is accepted)."""
    vllm = f"vLLM {verdict.version}" if verdict.version else "its vLLM"
    untouched = "nothing on the host changed (what serves keeps serving)"
    if verdict.problem:
        return (f"{spec.source}: vllm: could not be checked with {image}'s own vLLM parser "
                f"({verdict.problem}); {untouched}. The image must be staged and carry vLLM's "
                "make_arg_parser (vllm.entrypoints.openai or .launchers cli_args)")
    problems = [
        f"{spec.source}: vllm.args: {verdict.error} (refused by the parser of {vllm} in {image}); "
        f"allowed: the options `docker run --rm --entrypoint vllm {image} serve --help` "
        "lists; fix the stack file's vllm.args or knobs, or pin an image whose vLLM "
        "has the option"] if verdict.error else []
    problems += [
        f"{spec.source}: env: {name}: not a setting of {vllm} in {image} (its vllm.envs does not "
        "define it, so it would do nothing); allowed: the VLLM_* names of that version's "
        "vllm/envs.py; rename or remove it in the stack file" for name in verdict.unknown_env]
    return "; ".join([*problems, untouched]) if problems else None
