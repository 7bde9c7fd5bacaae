"""A bump's journal as the rollout keeps it: started before any host changes, read back for a
resumed rollout, removed once the pins file records the bump::

    result = rollout(plan, runner, pins_file, journal=journal, resume=resume_of(journal))
"""

from __future__ import annotations

from rigfleet.bump.candidate import Candidate
from rigfleet.bump.journal import BumpJournal
from rigfleet.bump.output import by, log
from rigfleet.bump.plan_record import Plan
from rigfleet.bump.record import outcome_of
from rigfleet.bump.rollout import HostOutcome, Resume, RolloutResult, probe_of_record
from rigfleet.pins import Pins


def start_journal(plan: Plan, candidate: Candidate | None, version: str,
                  journal_id: str) -> BumpJournal:
    cand = None if candidate is None else {
        "repository": candidate.repository, "tag": candidate.tag, "digest": candidate.digest,
        "created": candidate.created}  # fmt: skip
    journal = BumpJournal.start(plan, journal_id, by(), cand, version)
    log(f"journal {journal.path} (kept until the pins file records this bump)")
    return journal


def resume_of(journal: BumpJournal) -> Resume:
    before = (journal.deploying or {}).get("before") or {}
    return Resume(
        done={h: HostOutcome.from_record(h, o) for h, o in journal.outcomes.items()},
        in_flight={h: probe_of_record(before.get(h)) for h in journal.in_flight},
    )


def end_journal(journal: BumpJournal, result: RolloutResult, saved: Pins | None) -> None:
    """Remove the journal once the pins file records the bump (or nothing promoted)."""
    if saved is None and outcome_of(result) != "failed":
        log(f"[yellow]kept {journal.path}[/yellow]: the pins file does not record this bump, "
             "so converges keep reading the journal (or refuse, now that the pins file moved "
             "on); merge the result, then `rigfleet bump --abandon` records it")  # fmt: skip
        return
    journal.remove()
