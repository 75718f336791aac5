import os

os.environ.setdefault("OMP_NUM_THREADS", "1")


import pytest  # noqa: E402

# What a marked test is doing, shown on the terminal as it starts (markers: pyproject.toml).
WHY = {"dist": "several processes under torchrun", "slow": "over ~5 s"}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Name a multi-process or slow test when it starts, so a long run says what it is waiting for (in -v
    mode pytest names every test already)."""
    why = next((WHY[name] for name in WHY if item.get_closest_marker(name)), None)
    reporter = item.config.pluginmanager.get_plugin("terminalreporter")
    if why and reporter is not None and item.config.get_verbosity() <= 0:
        reporter.write_line(f"  {item.nodeid}: {why} ...")


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
