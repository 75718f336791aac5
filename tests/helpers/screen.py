"""What a reader sees at 80 columns: checks that no table cut a number (or a name) short."""
from __future__ import annotations

import re

WIDTH = 80
# rich ends a cell it had to cut with "…" right after the last character it kept; autopar's own ellipses
# ("wte … lm_head", "[0, 16, …, 48]") stand between spaces
CUT = re.compile(r"\S…")


def assert_nothing_cut(output: str, width: int = WIDTH) -> None:
    for line in output.splitlines():
        assert len(line) <= width, f"wider than {width} columns: {line!r}"
        assert not CUT.search(line), f"cut short: {line!r}"


def assert_whole(output: str, *numbers: str) -> None:
    """Each number appears whole on one line (not cut, not wrapped across lines)."""
    lines = output.splitlines()
    for number in numbers:
        assert any(re.search(rf"(?<![\d.,]){re.escape(number)}(?![\d,]|\.\d)", ln) for ln in lines), \
            f"{number!r} is not on any line whole:\n{output}"
