import atexit
import functools
import json
import os
import shutil
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
# `--gpu cpu` prices this machine from its own calibration (cost_models/machine.py). Tests never read or write the
# developer's: they get a folder of their own holding the shipped calibration (cost_models/profiles/
# cpu-calibrated.json) as this machine's; subprocesses inherit it.
os.environ["AUTOPAR_CALIBRATION_DIR"] = tempfile.mkdtemp(prefix="autopar-test-calibrations-")
atexit.register(functools.partial(shutil.rmtree, os.environ["AUTOPAR_CALIBRATION_DIR"], ignore_errors=True))
from cost_models import machine  # noqa: E402

shutil.copy(Path(machine.__file__).resolve().parent / "profiles" / "cpu-calibrated.json",  # the installed package's
            machine.calibration_path())


import pytest  # noqa: E402


class NameLongTests:
    """Names a multi-process or slow test (markers: pyproject.toml) on the terminal as it starts, so a long run
    says what it is waiting for; -v names every test already. Under pytest-xdist the controller prints (its
    workers have no terminal) and has collected nothing: each worker writes what it collected to a file the
    controller named (``AUTOPAR_LONG_TESTS``, inherited), which the controller reads as the workers start tests."""

    WHY = {"dist": "several processes under torchrun", "slow": "over ~5 s"}
    GROUP = "@torchrun"  # the suffix pytest-xdist's loadgroup gives the nodeids of the dist tests

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.why: dict[str, str] = {}
        workers = not hasattr(config, "workerinput") and getattr(config.option, "numprocesses", None)
        self.shared = Path(tempfile.mkdtemp(prefix="autopar-long-")) if workers else None  # the controller's
        if self.shared is not None:
            os.environ["AUTOPAR_LONG_TESTS"] = str(self.shared)
            atexit.register(functools.partial(shutil.rmtree, self.shared, ignore_errors=True))

    def pytest_collection_finish(self, session: pytest.Session) -> None:  # after every plugin renamed the items
        for item in session.items:
            why = next((self.WHY[name] for name in self.WHY if item.get_closest_marker(name)), None)
            if why:
                self.why[item.nodeid] = why
        worker = getattr(self.config, "workerinput", None)
        if worker is not None and "AUTOPAR_LONG_TESTS" in os.environ:
            folder = Path(os.environ["AUTOPAR_LONG_TESTS"])
            part = folder / f".{worker['workerid']}.json"
            part.write_text(json.dumps(self.why))
            part.replace(folder / f"{worker['workerid']}.json")

    def check_grouped(self) -> None:
        """Under --dist loadgroup every dist test's nodeid carries the group (tests/conftest.py marks them): a pytest
        that drops the grouping silently (9.2: pytest-dev/pytest-xdist#1386) would run each torchrun job on both
        workers at once, twice as long and twice over; stop instead, saying why."""
        if not getattr(self.config.option, "numprocesses", None) or self.config.getoption("dist", None) != "loadgroup":
            return  # one process: nothing to group
        lost = [nodeid for nodeid, why in self.why.items() if why == self.WHY["dist"] and not nodeid.endswith(self.GROUP)]
        if lost:
            pytest.exit(f"pytest-xdist did not group the dist tests ({lost[0]}): pytest {pytest.__version__} drops "
                        "--dist loadgroup (pytest-dev/pytest-xdist#1386); install the dev extra's pytest (<9.2) or "
                        "run with -n 0", returncode=4)

    def pytest_unconfigure(self) -> None:
        if self.shared is not None:
            shutil.rmtree(self.shared, ignore_errors=True)

    def pytest_runtest_logstart(self, nodeid: str) -> None:  # outside the test's output capture
        if nodeid not in self.why and self.shared is not None:  # the workers' collections, as they arrive
            for part in self.shared.glob("*.json"):
                self.why.update(json.loads(part.read_text()))
            self.check_grouped()
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if nodeid in self.why and reporter is not None and self.config.get_verbosity() <= 0:
            reporter.write_line(f"  {nodeid.removesuffix(self.GROUP)}: {self.why[nodeid]} ...")


MARKS_PROBLEM = pytest.StashKey[str]()


class CheckMarks:
    """Every test is measured, so its marks say what it costs: one that starts torchrun must be marked ``dist``, one
    whose call takes more than SLOW_CPU_S of CPU time (its own and its child processes': load on the machine does
    not change it, as wall-clock time would, nor another pytest-xdist worker beside it) must be marked ``slow`` or
    ``dist``. A test that breaks either fails, the reason its failure."""

    SLOW_CPU_S = float(os.environ.get("AUTOPAR_SLOW_CPU_S", "5"))
    STARTS_TORCHRUN = {"launch", "validate", "calibrate"}
    warmed = False

    @staticmethod
    def warm_up() -> None:
        """What a process pays once, whichever test comes first, paid before the first test is measured: capture's
        and the runtime's imports (torch.export, torch.distributed's pipelining and tensor packages) and the first
        export's initialisation of TorchDynamo (together 2.5 s of CPU of a first capture's 2.9 here, over 5 s on
        CI's machine: an unmarked test that happened to come first failed the check)."""
        import torch

        import autopar.capture  # noqa: F401
        import autopar.runtime.pp  # noqa: F401

        torch.export.export(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU()), (torch.ones(2, 4),))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item):  # noqa: ANN201 - a hook wrapper
        import resource
        import subprocess

        marks = {m.name for m in item.iter_markers()}
        if not self.warmed and not marks & {"slow", "dist"}:
            self.warmed = True  # one plugin per process (each pytest-xdist worker its own)
            self.warm_up()
        commands: list[list[str]] = []
        original = subprocess.Popen.__init__

        def record(popen: object, args: object, *rest: object, **kw: object) -> None:
            commands.append([str(a) for a in args] if isinstance(args, (list, tuple)) else str(args).split())
            original(popen, args, *rest, **kw)  # type: ignore[arg-type]

        def cpu() -> float:
            own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
            return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

        subprocess.Popen.__init__ = record  # type: ignore[method-assign]
        start = cpu()
        try:
            yield
        finally:
            subprocess.Popen.__init__ = original  # type: ignore[method-assign]
        used = cpu() - start
        if "dist" not in marks and any(map(self.starts_torchrun, commands)):
            item.stash[MARKS_PROBLEM] = "it starts torchrun: mark it dist"
        elif not marks & {"slow", "dist"} and used > self.SLOW_CPU_S:
            item.stash[MARKS_PROBLEM] = f"it took {used:.1f} s of CPU: mark it slow"

    @classmethod
    def starts_torchrun(cls, args: list[str]) -> bool:
        """A command that runs torchrun itself, or an autopar command that starts it (launch, validate, calibrate
        in a child process). A shell script that merely names torchrun (an export's text) does not count."""
        if not args:
            return False
        program = Path(args[0]).name
        as_module = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "-m"]
        return (program == "torchrun" or "torch.distributed.run" in as_module
                or (program == "autopar" or "autopar" in as_module) and bool(set(args) & cls.STARTS_TORCHRUN))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):  # noqa: ANN201 - a hook wrapper
        """A passing test whose marks are wrong fails, the reason its report (so it reaches pytest-xdist's
        controller from a worker, and the run's summary names it)."""
        outcome = yield
        report = outcome.get_result()
        problem = item.stash.get(MARKS_PROBLEM, None)
        if call.when == "call" and problem and report.passed:
            report.outcome = "failed"
            report.longrepr = f"MARKS: {item.nodeid}: {problem}"


MISSING_FRAMEWORK = "is not installed"  # how a test that needs a framework says it skips (pytest.importorskip reason)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):  # noqa: ANN201 - a hook wrapper
    """Under CI (CI=true, as .ci/run sets it, which installs every framework the exports are checked by), a test
    that skips because a framework is missing fails: a parser test that skips proves nothing. Run by hand without
    the frameworks, it still skips."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get("CI", "").lower() == "true" and MISSING_FRAMEWORK in str(report.longrepr):
        report.outcome = "failed"
        report.longrepr = f"CI=true but a framework is missing: {report.longrepr}"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test marked ``dist`` runs on one pytest-xdist worker (--dist loadgroup, pyproject.toml): torchrun jobs
    one at a time, as they were sized (tests/helpers/runtime_jobs.py), and each world size's job shared by the two
    files that read it started once (the ``runtime_jobs`` fixture lives in one worker's session)."""
    for item in items:
        if item.get_closest_marker("dist"):
            item.add_marker(pytest.mark.xdist_group("torchrun"))


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(NameLongTests(config), "autopar-name-long-tests")
    config.pluginmanager.register(CheckMarks(), "autopar-check-marks")


@pytest.fixture(autouse=True)
def narrow_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test sees an 80-column terminal: what autopar prints must read right there (tests/helpers/screen.py)."""
    monkeypatch.setenv("COLUMNS", "80")


@pytest.fixture(scope="session")
def megatron_profiles() -> dict:
    """The GPT shapes of the Megatron scaling table (Narayanan et al. 2021, Table 1), captured once per test session."""

    from autopar.capture import capture_model
    from helpers import EX
    from helpers.megatron_table import ROWS, SEQ, VOCAB

    gpt = EX / "gpt.py"
    return {name: capture_model(str(gpt), overrides={"n_layer": str(layers), "n_embd": str(hidden),
                                                    "n_head": str(heads), "vocab_size": str(VOCAB),
                                                    "block_size": str(SEQ)}, seq_len=SEQ, dtype="bf16")
            for name, heads, hidden, layers, *_ in ROWS}


@pytest.fixture(scope="session")
def llama():
    """A small Llama (examples/llama.py: 8 query heads, 2 key/value heads of width 32) captured at 4096 tokens."""
    from autopar.capture import capture_model
    from helpers.builders import LLAMA, LLAMA_SEQ, LLAMA_SHAPE

    return capture_model(LLAMA, LLAMA_SHAPE, seq_len=LLAMA_SEQ)


@pytest.fixture(scope="session")
def runtime_jobs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    """``runtime_jobs(world)``: the results of the world size's torchrun job that test_runtime_dist.py and
    test_hf_plans.py share (tests/helpers/runtime_jobs.py)."""
    from helpers.runtime_jobs import RuntimeJobs

    return RuntimeJobs(request.session, tmp_path_factory.getbasetemp())
