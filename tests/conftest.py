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

shutil.copy(Path(__file__).resolve().parents[1] / "cost_models" / "profiles" / "cpu-calibrated.json",
            machine.calibration_path())


import pytest  # noqa: E402


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
