"""The bench's progress as a rich progress bar on stderr (one task per target)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from rigfleet.bench import fleet


class RichProgress(fleet.Progress):
    """The bench's progress on a rich progress bar."""

    def __init__(self, console: Console):
        self.console = console
        self.bar = Progress(TextColumn("[bold]{task.fields[host]}[/bold]"), BarColumn(),
                            MofNCompleteColumn(), TextColumn("{task.description}"),
                            TimeElapsedColumn(), console=console, transient=False)
        self.task: TaskID | None = None
        self.host = ""

    def __enter__(self) -> RichProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()

    def target(self, host: str) -> None:
        self.host = host
        self.task = self.bar.add_task("starting", total=None, host=host)

    def begin(self, total: int) -> None:
        if self.task is not None:
            self.bar.update(self.task, total=total, description="warm-up")

    def step(self, label: str) -> None:
        if self.task is not None:
            self.bar.update(self.task, advance=1, description=label)

    def note(self, text: str) -> None:
        self.console.print(f"[yellow]{self.host}:[/yellow] {text}")
