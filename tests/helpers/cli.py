"""The CLI as a test drives it: a command that must fail in one line."""
from __future__ import annotations

from typer.testing import CliRunner

from autopar.cli import app

runner = CliRunner()


def one_line_error(*args: str, env: dict[str, str] | None = None) -> str:
    """The one line ``autopar ARGS`` writes to stderr, asserting exit 2, one "error: " line and no traceback."""
    result = runner.invoke(app, list(args), env=env)
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output, result.output
    return lines[0]
