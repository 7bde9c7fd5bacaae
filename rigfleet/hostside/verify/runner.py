"""Runs the gate: preflight, then the selected checks in order; progress; reports; exit status
(docs/bench.md). The CLI is ``main``; from Python::

    report, paths = run("http://127.0.0.1:8001", profile=resolve("fast"), api_key=None,
                        report_dir=Path("/tmp/r"), progress=ConsoleProgress(sys.stderr))
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import threading
import time
from pathlib import Path
from typing import NoReturn, TextIO

from ..atomic import append_line, write_json
from ..bench.measure import Progress
from ..layout import THROUGHPUT_HISTORY_NAME, THROUGHPUT_LAST_NAME
from ..records import ThroughputRecord, now_iso
from . import checks, report
from .client import Client, check_ca_file, redact_url
from .profiles import PROFILES, Profile, resolve
from .report import FAIL, SKIP, CheckResult, Report

EXIT_USAGE, EXIT_REPORT, EXIT_INTERRUPTED = 101, 102, 130


class ConsoleProgress(Progress):
    """A line as each check starts and ends; dots (a count every ten) while one sends many."""

    def __init__(self, stream: TextIO | None = sys.stderr):
        self.stream = stream
        self._lock = threading.Lock()
        self._ticks = 0

    def _write(self, text: str) -> None:
        if self.stream is not None:
            self.stream.write(text)
            self.stream.flush()

    def _line(self, text: str) -> None:
        """``text`` on a line of its own, after the count that closes a line of dots."""
        with self._lock:
            if self._ticks:
                self._write(f" {self._ticks}\n")
                self._ticks = 0
            self._write(f"{text}\n")

    def header(self, url: str, prof: Profile) -> None:
        extra = f" overrides={prof.overrides}" if prof.overrides else ""
        self._write(f"verify: {url} profile={prof.name}{extra}\n")

    def start(self, idx: int, total: int, name: str, title: str) -> None:
        self._line(f"[{idx:>2}/{total}] {name}: {title} ...")

    def end(self, idx: int, total: int, res: CheckResult) -> None:
        self._line(f"[{idx:>2}/{total}] {res.name}: {res.status.upper()} in "
                   f"{res.seconds:.1f}s  {res.summary}")

    def tick(self, mark: str) -> None:
        with self._lock:
            if not self._ticks:
                self._write("        ")
            self._ticks += 1
            self._write(str(self._ticks) if self._ticks % 10 == 0 else mark)

    def note(self, text: str) -> None:
        self._line(f"        note: {text}")

    def footer(self, rep: Report, paths: tuple[Path, Path] | None) -> None:
        c = rep.counts()
        self._write(f"verify: {c['pass']} passed, {c['fail']} failed, {c['skip']} skipped "
                    f"in {rep.seconds:.1f}s -> exit {rep.exit_status()}\n")
        if paths:
            self._write(f"verify: reports {paths[0]} {paths[1]}\n")


def run(url: str, profile: Profile, api_key: str | None = None,
        only: list[str] | None = None, report_dir: Path | None = None,
        progress: ConsoleProgress | None = None,
        ca_file: str | None = None) -> tuple[Report, tuple[Path, Path] | None]:
    """Runs the gate: the report and the paths written (None without ``report_dir``)."""
    progress = progress or ConsoleProgress(None)
    t0 = time.monotonic()
    rep = Report(url=redact_url(url), profile=profile.name, overrides=dict(profile.overrides),
                 profile_values={k: v for k, v in vars(profile).items() if k != "overrides"})
    ctx = checks.Context(Client(url, api_key, ca_file=ca_file), profile, progress)
    selected = [(check.__name__, title, check) for check, title in checks.CHECKS
                if check.__name__ in {*(only or checks.CHECK_NAMES), "preflight"}]
    progress.header(rep.url, profile)
    aborted = ""
    for idx, (name, title, fn) in enumerate(selected, 1):
        if aborted:
            res = CheckResult(name, title, SKIP, summary=f"not run: {aborted}")
        else:
            progress.start(idx, len(selected), name, title)
            started = time.monotonic()
            try:
                res = fn(ctx, CheckResult(name, title))
            except Exception as exc:
                res = CheckResult(name, title, FAIL,
                                  summary=f"internal error: {type(exc).__name__}: {exc}")
            res.seconds = time.monotonic() - started
        rep.checks.append(res)
        progress.end(idx, len(selected), res)
        if name == "preflight":
            rep.model, rep.version, rep.max_model_len = ctx.model, ctx.version, ctx.max_model_len
            if res.status == FAIL:
                aborted = "preflight failed (server down or not serving)"
    rep.finished = now_iso(suffix="Z")
    rep.seconds = time.monotonic() - t0
    paths = report.write_pair(report_dir, "verify", json.dumps(
        rep.as_dict(), indent=2, ensure_ascii=False) + "\n", rep.markdown()) if report_dir else None
    keep_throughput(ctx, rep, paths[0] if paths else None, progress)
    progress.footer(rep, paths)
    return rep, paths


def keep_throughput(ctx: checks.Context, rep: Report, report_json: Path | None,
                    progress: ConsoleProgress) -> None:
    """The throughput check's record: ``last.json`` always, the verified history only when the
    whole gate passed; one that cannot be written is a note, not a failed gate."""
    prof = ctx.profile
    record = ctx.throughput_record
    if record is None or not prof.throughput_stack or not prof.throughput_history_dir:
        return
    record = dataclasses.replace(record, report=str(report_json) if report_json else None)
    directory = Path(prof.throughput_history_dir)
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o755)
        write_json(directory / THROUGHPUT_LAST_NAME, record.to_dict())
        if rep.exit_status() == 0:
            append_history(directory, record)
            progress.note(f"throughput recorded in {directory} (verified history of "
                          f"{record.stack})")
    except OSError as exc:
        progress.note(f"cannot write the throughput record to {directory}: {exc}")


def append_history(directory: Path, record: ThroughputRecord) -> None:
    """Append ``record`` to the host's throughput history (not secret: 0755 and 0644)."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o755)
    append_line(directory / THROUGHPUT_HISTORY_NAME, json.dumps(record.to_dict(), sort_keys=True))


class UsageParser(argparse.ArgumentParser):
    """Usage errors exit with ``EXIT_USAGE`` (argparse's 2 would read as "two checks failed")."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """The gate's command line; ``prog`` names it in usage lines (``rigfleet verify``)."""
    p = UsageParser(
        prog=prog or "python3 -m rigfleet.hostside.verify",
        description="verify-stress gate for an OpenAI-compatible (vLLM) server. Exit status: "
                    "number of failed checks (0 = pass, capped at 100); 101 usage error; "
                    "102 report not written.")
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8001")
    p.add_argument("--api-key-file", metavar="FILE",
                   help="file holding the API key ('-' reads it from stdin); the key is never "
                        "taken as an argument value")
    p.add_argument("--ca-file", metavar="PEM",
                   help="trust these certificates for https:// (default: $RIGFLEET_CA_FILE, "
                        "else the system's trust store)")
    p.add_argument("--profile", default="full", choices=sorted(PROFILES),
                   help="full: real hardware (default); fast: testbed sizes")
    p.add_argument("--set", dest="sets", action="extend", nargs="+", default=[],
                   metavar="KEY=VALUE", help="override one profile value (repeatable)")
    p.add_argument("--report-dir", type=Path, default=Path("."),
                   help="where verify-<timestamp>.json/.md go (default: current directory)")
    p.add_argument("--only", metavar="CHECK,...",
                   help="run only these checks (preflight always runs): "
                        + ",".join(checks.CHECK_NAMES))
    p.add_argument("--quiet", action="store_true", help="no progress output")
    args = p.parse_args(argv)
    only = None
    try:  # each a usage error, in this order (ProfileError is a ValueError)
        prof = resolve(args.profile, args.sets)
        if args.only:
            only = [c.strip() for c in args.only.split(",") if c.strip()]
            bad = [c for c in only if c not in checks.CHECK_NAMES]
            if bad or not only:
                raise ValueError(f"--only {args.only}: unknown check(s) "
                                 f"{', '.join(bad) or '(none)'}; "
                                 f"allowed: {', '.join(checks.CHECK_NAMES)}")
        if not args.url.startswith(("http://", "https://")):
            raise ValueError(f"--url {args.url}: expected http://HOST:PORT or https://...")
        key = read_api_key(args.api_key_file) if args.api_key_file else None
        check_ca_file(args.ca_file)
        try:  # before the gate runs, not after its checks' hour is spent
            args.report_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"--report-dir {args.report_dir}: {exc.strerror or exc}") from None
    except ValueError as exc:
        p.error(str(exc))
    progress = ConsoleProgress(None if args.quiet else sys.stderr)
    try:
        rep, _ = run(args.url, prof, key, only, args.report_dir, progress, args.ca_file)
    except KeyboardInterrupt:
        print("verify: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except OSError as exc:
        print(f"verify: cannot write the report to {args.report_dir}: {exc}", file=sys.stderr)
        return EXIT_REPORT
    return rep.exit_status()


def read_api_key(spec: str) -> str:
    """The key from a file, or from stdin for ``-``; surrounding whitespace is dropped."""
    try:
        key = sys.stdin.readline() if spec == "-" else Path(spec).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read --api-key-file {spec}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"--api-key-file {spec}: not UTF-8 text") from None
    key = key.strip()
    if not key:
        raise ValueError(f"--api-key-file {spec}: empty")
    if any(ch.isspace() for ch in key):
        raise ValueError(f"--api-key-file {spec}: the key must be one line without spaces")
    return key

