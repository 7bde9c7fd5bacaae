"""Gate results: the JSON report (schema ``rigfleet-verify/1``), the Markdown report and the
exit status (the failed checks, capped at 100)::

    report = Report(url=..., profile=prof.name, ...)
    report.checks.append(CheckResult("needles", "Needles", PASS, seconds=3.2, details={...}))
    paths = write_pair(Path("/var/lib/rigfleet/verify"), "verify", json_text, report.markdown())
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..atomic import write_atomic
from ..records import VERIFY_SCHEMA, encode, now_iso
from .health import Finding

PASS, FAIL, SKIP = "pass", "fail", "skip"
MAX_EXIT = 100
BADGES = {PASS: "✅ pass", FAIL: "❌ **FAIL**", SKIP: "⏭ skip"}


@dataclass
class CheckResult:
    name: str
    title: str
    status: str = PASS
    seconds: float = 0.0
    summary: str = ""  # one line, for the progress output and the table
    details: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "seconds": round(self.seconds, 3),
                "findings": [f.as_dict() for f in self.findings]}


@dataclass
class Report:
    url: str
    profile: str
    profile_values: dict[str, Any] = field(default_factory=dict)
    overrides: dict[str, Any] = field(default_factory=dict)
    model: str = ""
    version: str = ""
    max_model_len: int | None = None
    started: str = field(default_factory=lambda: now_iso(suffix="Z"))
    finished: str = ""
    seconds: float = 0.0
    checks: list[CheckResult] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {status: sum(c.status == status for c in self.checks)
                for status in (PASS, FAIL, SKIP)}

    def failed(self) -> list[CheckResult]:
        return [c for c in self.checks if c.status == FAIL]

    def exit_status(self) -> int:
        return min(len(self.failed()), MAX_EXIT)

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema": VERIFY_SCHEMA, "url": self.url, "model": self.model, "version": self.version,
            "max_model_len": self.max_model_len,
            "profile": {"name": self.profile, "overrides": encode(self.overrides),
                        "values": encode(self.profile_values)},
            "started": self.started, "finished": self.finished,
            "seconds": round(self.seconds, 3), "summary": self.counts(),
            "exit_status": self.exit_status(),
            "checks": [c.as_dict() for c in self.checks],
        }

    def markdown(self) -> str:
        c = self.counts()
        verdict = "PASS" if not c[FAIL] else f"FAIL ({c[FAIL]} failed)"
        lines = [
            f"# verify-stress gate: {verdict}", "",
            f"- URL: `{self.url}`",
            f"- Model: `{self.model or '?'}`  version: `{self.version or '?'}`  "
            f"max_model_len: `{self.max_model_len if self.max_model_len else '?'}`",
            f"- Profile: `{self.profile}`"
            + (f" (overrides: {', '.join(f'{k}={v}' for k, v in self.overrides.items())})"
               if self.overrides else ""),
            f"- Started {self.started}, finished {self.finished} ({self.seconds:.1f} s)",
            f"- Checks: {c[PASS]} passed, {c[FAIL]} failed, {c[SKIP]} skipped; "
            f"exit status {self.exit_status()}",
            "", "| # | Check | Status | Time | Summary |", "|---|---|---|---|---|",
        ]
        for i, chk in enumerate(self.checks, 1):
            lines.append(f"| {i} | {chk.title} (`{chk.name}`) | {BADGES[chk.status]} | "
                         f"{chk.seconds:.1f} s | {_cell(chk.summary)} |")
        if failed := self.failed():
            lines += ["", "## Failed checks"]
            for chk in failed:
                lines += ["", f"### {chk.title} (`{chk.name}`)", "", chk.summary or "failed", ""]
                for f in chk.findings:
                    where = f" [{f.where}]" if f.where else ""
                    code = f.evidence.replace("`", "'")[:120]
                    ev = f" — `{code}`" if f.evidence else ""
                    lines.append(f"- **{f.name}**{where}: {f.message}{ev}")
                lines += _detail_lines(chk.details)
        if skipped := [chk for chk in self.checks if chk.status == SKIP]:
            lines += ["", "## Skipped checks", ""]
            lines += [f"- {chk.title} (`{chk.name}`): {chk.summary}" for chk in skipped]
        return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _detail_lines(details: dict[str, Any]) -> list[str]:
    """The needle checks' attempts (a dict per depth) as a small table; the rest as JSON."""
    out: list[str] = []
    if rows := details.get("attempts"):
        keys = list(dict.fromkeys(k for r in rows for k in r
                                  if not isinstance(r[k], dict | list)))
        out += ["", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        out += ["| " + " | ".join(_cell(str(r.get(k, ""))) for k in keys) + " |" for r in rows]
    if rest := {k: v for k, v in details.items() if k != "attempts"}:
        out += ["", "```json", json.dumps(rest, indent=2, ensure_ascii=False)[:4000], "```"]
    return out


def write_pair(directory: Path, prefix: str, json_text: str, md_text: str) -> tuple[Path, Path]:
    """``<prefix>-<UTC timestamp>[-n].json`` and ``.md`` in ``directory``, each atomic."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    stem, n = f"{prefix}-{stamp}", 1
    while (directory / f"{stem}.json").exists() or (directory / f"{stem}.md").exists():
        n += 1
        stem = f"{prefix}-{stamp}-{n}"
    paths = (directory / f"{stem}.json", directory / f"{stem}.md")
    write_atomic(paths[0], json_text)
    write_atomic(paths[1], md_text)
    return paths
