"""What a long command shows on the terminal while it works (stderr, so its output stays clean): the
search's progress, the step being measured, the calibration's benchmarks. Every layout fits 80 columns:
short fixed columns first, the free text last (it wraps rather than being cut).

On a terminal the display is live; elsewhere (a pipe, a log, a test) rich draws nothing until the end, so the
search writes a plain line instead when it finds its first plan and when a better one follows (at most one a
LOG_EVERY_S): a log shows that the search has a plan to keep, which Ctrl-C would then report.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Column

BAR_WIDTH = 12
LOG_EVERY_S = 5.0  # off a terminal: the least seconds between two lines of the search's progress


def _free_text(template: str) -> TextColumn:
    """A column of text that wraps at the screen's edge instead of being cut with an ellipsis."""
    return TextColumn(template, table_column=Column(overflow="fold"))


@contextmanager
def search_progress(first: str, searching: str, console: Console | None = None
                    ) -> Iterator[Callable[[int, int, float | None], None]]:
    """A spinner saying ``first`` (e.g. tracing the model) until the search reports, then a bar of outer
    choices visited, the best step time so far and the time spent. Yields the search's progress callback."""
    columns = (SpinnerColumn(), TimeElapsedColumn(), BarColumn(bar_width=BAR_WIDTH), MofNCompleteColumn(),
               _free_text("{task.description} {task.fields[best]}"))
    console = console or Console(stderr=True)
    logged: list[tuple[float, float]] = []  # (when, best) of the lines written off a terminal
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(first, total=None, best="")

        def show(visited: int, total: int, best: float | None) -> None:
            bar.update(task, description=searching, completed=visited, total=total,
                       best=f"(best {best:.4g} s per step)" if best is not None else "")
            if best is None or console.is_terminal:
                return
            now = time.monotonic()
            if not logged or (best < logged[-1][1] and now - logged[-1][0] >= LOG_EVERY_S):
                console.print(f"{searching}: {'a better' if logged else 'a first'} plan, {best:.4g} s per step "
                              f"({visited:,} of {total:,} choices settled)", markup=False, highlight=False,
                              soft_wrap=True)  # one line a log can be searched for
                logged.append((now, best))

        yield show


@contextmanager
def activity(text: str, console: Console | None = None) -> Iterator[Callable[[str], None]]:
    """A spinner with the time spent and what is being done; yields a function that changes the text."""
    columns = (SpinnerColumn(), TimeElapsedColumn(), _free_text("{task.description}"))
    with Progress(*columns, console=console or Console(stderr=True), transient=True) as bar:
        task = bar.add_task(text, total=None)
        yield lambda new: bar.update(task, description=new)


class CalibrationProgress:
    """One bar per benchmark group of `autopar calibrate`, fed by the workers' events; each row names the
    benchmark that just ran (e.g. ``all-reduce 64 MiB``)."""

    def __init__(self, console: Any, titles: dict[str, str]) -> None:
        self.titles = titles
        self.progress = Progress(TimeElapsedColumn(), BarColumn(bar_width=BAR_WIDTH), MofNCompleteColumn(),
                                 _free_text("{task.description}[dim]{task.fields[label]}"),
                                 console=console, transient=False)
        self.tasks: dict[str, Any] = {}
        self.starting = self.progress.add_task("starting torchrun workers", total=None, label="")

    def __enter__(self) -> "CalibrationProgress":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)

    def __call__(self, event: dict) -> None:
        if event.get("event") == "plan":
            self.progress.remove_task(self.starting)
            for group, total in event["groups"].items():
                if total:
                    title = self.titles.get(group, group)
                    self.tasks[group] = self.progress.add_task(title, total=total, label="")
        elif event.get("event") == "warning":
            self.progress.console.print(f"[yellow]warning:[/] {event['text']}")
        elif event.get("event") == "step" and event.get("group") in self.tasks:
            self.progress.update(self.tasks[event["group"]], advance=1, label=f": {event.get('label', '')}")
