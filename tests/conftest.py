import os
import shutil
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
# `--gpu cpu` prices this machine from its own calibration (cost_models/machine.py). Tests never read or write the
# developer's: they get a folder of their own holding the shipped calibration (cost_models/profiles/
# cpu-calibrated.json) as this machine's; subprocesses inherit it.
os.environ["AUTOPAR_CALIBRATION_DIR"] = tempfile.mkdtemp(prefix="autopar-test-calibrations-")
from cost_models import machine  # noqa: E402

shutil.copy(Path(machine.__file__).resolve().parent / "profiles" / "cpu-calibrated.json",  # the installed package's
            machine.calibration_path())


import pytest  # noqa: E402

class NameLongTests:
    """Names a multi-process or slow test (markers: pyproject.toml) on the terminal as it starts, so a long run
    says what it is waiting for; -v names every test already."""

    WHY = {"dist": "several processes under torchrun", "slow": "over ~5 s"}

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.why: dict[str, str] = {}

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            why = next((self.WHY[name] for name in self.WHY if item.get_closest_marker(name)), None)
            if why:
                self.why[item.nodeid] = why

    def pytest_runtest_logstart(self, nodeid: str) -> None:  # outside the test's output capture
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if nodeid in self.why and reporter is not None and self.config.get_verbosity() <= 0:
            reporter.write_line(f"  {nodeid}: {self.why[nodeid]} ...")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(NameLongTests(config), "autopar-name-long-tests")


@pytest.fixture(autouse=True)
def narrow_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test sees an 80-column terminal: what autopar prints must read right there (tests/screen.py)."""
    monkeypatch.setenv("COLUMNS", "80")


@pytest.fixture(scope="session")
def megatron_profiles() -> dict:
    """The GPT shapes of the Megatron scaling table (Narayanan et al. 2021, Table 1), captured once per test session."""
    from pathlib import Path

    from autopar.capture import capture_model
    from test_megatron_table import ROWS, SEQ, VOCAB

    gpt = Path(__file__).resolve().parents[1] / "examples" / "gpt.py"
    return {name: capture_model(str(gpt), overrides={"n_layer": str(layers), "n_embd": str(hidden),
                                                    "n_head": str(heads), "vocab_size": str(VOCAB),
                                                    "block_size": str(SEQ)}, seq_len=SEQ, dtype="bf16")
            for name, heads, hidden, layers, *_ in ROWS}
