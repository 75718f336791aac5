"""The README's two newcomer commands exist, and CI runs exactly the README's test command."""
from helpers import ROOT


def test_ci_runs_the_readme_test_command() -> None:
    readme = ROOT / "README.md"
    blocks = readme.read_text().split("```bash\n")[1:]
    commands = [b.split("```")[0].strip() for b in blocks]
    assert len(commands) == 2, "the README gives exactly two commands for a newcomer"
    install_and_run, install_and_test = commands
    assert "autopar " in install_and_run and "pytest" in install_and_test
    ci_lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert install_and_test in ci_lines
