"""Long runs say what they are doing: the search, validate's timed run and calibrate's benchmarks on the
terminal (80 columns, nothing cut), and pytest, whose multi-process tests are marked `dist` (the fast loop is
`-m "not dist"`) and named as they start; torch's jit deprecation warnings are filtered, only those."""
from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

import autopar.report.progress as progress
from autopar.calibrate.run import GROUP_TITLES
from autopar.cli import app
from helpers import ROOT
from helpers.screen import assert_nothing_cut, assert_whole

pytest_plugins = ["pytester"]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")


def terminal() -> Console:
    """An 80-column terminal whose output is kept (live displays draw only on a terminal)."""
    return Console(file=io.StringIO(), force_terminal=True, width=80, color_system=None)


def frames(console: Console) -> str:
    return ANSI.sub("\n", console.file.getvalue())  # type: ignore[attr-defined]


def test_calibration_names_each_benchmark_without_cutting_numbers() -> None:
    screen = terminal()
    with progress.CalibrationProgress(screen, GROUP_TITLES) as bar:
        bar({"event": "plan", "groups": {"gemm": 20, "collectives": 24, "device": 16}})
        for i in range(20):
            bar({"event": "step", "group": "gemm", "label": f"mm {1024 * (i + 1)}x1024x1024"})
        bar({"event": "step", "group": "collectives", "label": "all-reduce 65536 KiB"})
        bar.progress.refresh()
    shown = frames(screen)
    assert_nothing_cut(shown)
    assert_whole(shown, "20/20", "1/24", "0/16", "mm 20480x1024x1024", "all-reduce 65536 KiB")
    for group in ("gemm", "collectives", "device"):
        assert GROUP_TITLES[group] in " ".join(shown.split())


def test_the_search_shows_choices_visited_and_the_best_so_far() -> None:
    screen = terminal()
    with progress.search_progress("tracing gpt.py", "CP-SAT on 100000 GPUs", screen) as show:
        show(1234, 56789, 0.02281)
    shown = frames(screen)
    assert_nothing_cut(shown)
    assert_whole(shown, "1234/56789", "0.02281")
    assert "CP-SAT on 100000 GPUs" in shown


def test_validate_says_what_it_measures(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from autopar.calibrate import validate as validation

    screen = terminal()
    monkeypatch.setattr(progress, "Console", lambda **_: screen)
    measured = validation.Validation(plan="plan.json", hardware="cpu", device="cpu", world_size=2, steps=5,
                                     predicted_step_s=0.5, measured_step_s=0.55, measured_min_s=0.5,
                                     measured_max_s=0.6, stages=[], losses=[1.0])
    monkeypatch.setattr(validation, "validate", lambda *a, **k: measured)  # the torchrun job itself: test_validate
    result = CliRunner().invoke(app, ["validate", str(tmp_path / "plan.json"), "--steps", "5", "--warmup", "2"])
    assert result.exit_code == 0, result.output
    assert "running plan.json under torchrun: 2 warm-up + 5 timed steps" in " ".join(frames(screen).split())


@pytest.mark.slow  # a pytest of its own that imports torch.distributed.optim
def test_pytest_names_marked_tests_and_hides_only_torchs_jit_warnings(pytester: pytest.Pytester) -> None:
    pytester.makepyprojecttoml((ROOT / "pyproject.toml").read_text())
    pytester.makeconftest((ROOT / "tests" / "conftest.py").read_text())
    pytester.makepyfile(test_example='''
        import warnings
        import pytest

        @pytest.mark.dist
        def test_many_processes():
            import torch.distributed.optim  # 66 torch.jit.script deprecation warnings (torch 2.13)

        def test_our_own_deprecation():
            warnings.warn("autopar's own deprecation", DeprecationWarning)
    ''')
    result = pytester.runpytest_subprocess("test_example.py", "-p", "no:cacheprovider")
    out = result.stdout.str()
    assert "test_example.py::test_many_processes: several processes under torchrun ..." in out
    assert "test_example.py::test_our_own_deprecation:" not in out  # unmarked: a dot, as ever
    assert "jit.script" not in out and "jit.interface" not in out
    assert "autopar's own deprecation" in out  # other warnings still show
    result.assert_outcomes(passed=2, warnings=1)
    fast = pytester.runpytest("test_example.py", "-p", "no:cacheprovider", "-m", "not dist", "--collect-only", "-o",
                              "addopts=")
    assert "test_our_own_deprecation" in fast.stdout.str() and "test_many_processes" not in fast.stdout.str()


@pytest.mark.slow  # a pytest of its own
def test_a_test_that_costs_more_than_its_marks_say_fails_the_session(pytester: pytest.Pytester,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The marks are checked on every test by measuring it (tests/conftest.py CheckMarks): an unmarked test that
    starts torchrun, or takes more CPU than the limit, fails the run, named; a marked one does not."""
    pytester.makepyprojecttoml((ROOT / "pyproject.toml").read_text())
    pytester.makeconftest((ROOT / "tests" / "conftest.py").read_text())
    pytester.makepyfile(test_marks='''
        import subprocess, sys, time
        import pytest

        def burn():
            end = time.process_time() + 0.5
            while time.process_time() < end:
                pass

        def test_unmarked_and_heavy():
            burn()

        @pytest.mark.slow
        def test_marked_and_heavy():
            burn()

        def test_starts_torchrun():  # `python -c pass` ignores the rest: what is checked is the command
            subprocess.run([sys.executable, "-c", "pass", "-m", "torch.distributed.run"], check=True)

        def test_starts_autopar_launch():
            subprocess.run([sys.executable, "-c", "pass", "-m", "autopar", "launch", "plan.json"], check=True)

        def test_names_torchrun_in_a_script():
            subprocess.run(["bash", "-c", "true # torchrun --nproc-per-node 8 pretrain_gpt.py"], check=True)

        @pytest.mark.dist
        def test_marked_torchrun():
            subprocess.run([sys.executable, "-c", "pass", "-m", "torch.distributed.run"], check=True)
    ''')
    monkeypatch.setenv("AUTOPAR_SLOW_CPU_S", "0.3")
    result = pytester.runpytest_subprocess("test_marks.py", "-p", "no:cacheprovider")
    out = result.stdout.str()
    assert "MARKS: test_marks.py::test_unmarked_and_heavy: it took" in out and "mark it slow" in out
    assert "MARKS: test_marks.py::test_starts_torchrun: it starts torchrun: mark it dist" in out
    assert "MARKS: test_marks.py::test_starts_autopar_launch: it starts torchrun: mark it dist" in out
    assert "MARKS: test_marks.py::test_names_torchrun_in_a_script" not in out
    assert "MARKS: test_marks.py::test_marked" not in out
    result.assert_outcomes(passed=3, failed=3)  # every test ran to its end; three of them had the wrong marks
