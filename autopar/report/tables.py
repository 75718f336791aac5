"""The one look of autopar's tables, and the rule that keeps them honest at 80 columns: a number is never
cut. Numeric columns never wrap and are kept short (abbreviated counts: 131.1 M); names and free text wrap
(fold) instead of ending in an ellipsis; headers are short words that may wrap. Each table fits 80 columns
(tests/unit/cli/test_cli_width.py renders them at COLUMNS=80 and looks for a cut)."""
from __future__ import annotations

import os
import sys

from rich import box
from rich.console import Console
from rich.table import Table

MS = 1e3           # seconds → milliseconds in tables
PIPE_WIDTH = 160   # columns when writing to a file or pipe (rich's default there, 80, wraps more than needed)
_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"))


def console() -> Console:
    """A console for tables: the terminal's width, or PIPE_WIDTH when writing to a file or pipe; COLUMNS
    still wins."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return Console()
    return Console(width=PIPE_WIDTH)


def table(title: str | None = None, caption: str | None = None) -> Table:
    return Table(title=title, caption=caption, title_justify="left", caption_justify="left", box=box.SIMPLE_HEAD,
                 show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))  # columns 2 apart: padding + divider


def numbers(t: Table, *headers: str) -> None:
    """Right-aligned columns of numbers: never wrapped, so never split."""
    for header in headers:
        t.add_column(header, justify="right", no_wrap=True)


def text(t: Table, *headers: str, min_width: int | None = None) -> None:
    """Left-aligned columns of names or words: wrapped (folded inside a long word) at the column's edge."""
    for header in headers:
        t.add_column(header, justify="left", overflow="fold", min_width=min_width)


def count(n: float) -> str:
    """A count in at most 7 characters: exact with thousands separators below a million, else 4 significant
    digits and a prefix (131.1 M, 5.933 G, 1.727 T)."""
    if abs(n) < 1e6:  # whole above a thousand (4 significant digits would print 4.891e+05)
        return f"{n:,.0f}" if float(n).is_integer() or abs(n) >= 1e3 else f"{n:,.4g}"
    for scale, prefix in _PREFIXES:
        if abs(n) >= scale:
            return f"{n / scale:.4g} {prefix}"
    return f"{n:.4g}"  # pragma: no cover (the loop covers every |n| ≥ 1e6)


def _ranks(group: list[int]) -> str:
    """One group's ranks: 0–7, 0, 2, …, 14 (every 2), or listed."""
    if len(group) == 1:
        return str(group[0])
    step = group[1] - group[0]
    if len(group) > 2 and all(b - a == step for a, b in zip(group, group[1:])):
        return f"{group[0]}–{group[-1]}" if step == 1 else f"{group[0]}, {group[1]}, …, {group[-1]} (every {step})"
    return ", ".join(map(str, group))


def group_ranks(groups: list[list[int]]) -> str:
    """Groups of ranks in a few words: the first two and the last, each as a range or a stride."""
    shown = [_ranks(g) for g in (groups if len(groups) <= 3 else groups[:2] + groups[-1:])]
    if len(groups) > 3:
        shown.insert(2, "…")
    return "; ".join(f"[{g}]" if g != "…" else g for g in shown)
