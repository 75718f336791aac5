"""`autopar launch` / `autopar validate` before torchrun starts: the trust model (a plan file runs no code unless
the user chose it), one-line errors for bad options, the token file's per-rank slices, checkpoint discovery,
and how a failed run is reduced to one line. No torchrun here (tests/integration/test_runtime_dist.py runs it)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

import autopar
from autopar.cli import app
from autopar.errors import AutoparError
from autopar.plan import parse_run_plan
from helpers import ROOT
from helpers.runtime_worker import plan

GPT = str(ROOT / "examples" / "gpt.py")
runner = CliRunner()

EVIL = """from pathlib import Path
Path(__file__).with_name("ran.txt").write_text("module-level code ran")
from examples_gpt_copy import *  # noqa
"""


@pytest.fixture()
def foreign_plan(tmp_path: Path) -> tuple[Path, Path]:
    """A full plan (as `autopar solve` writes it) whose model.source is a file that, imported, writes a marker."""
    (tmp_path / "evil.py").write_text(EVIL)
    small = {"n_layer": "2", "n_embd": "32", "n_head": "4", "vocab_size": "64", "block_size": "16"}
    made = autopar.estimate(GPT, gpus=2, gpus_per_node=2, tp=1, pp=1, micro_batch_size=2, global_batch_size=4, seq_len=16,
                            overrides=small, gpu="cpu", dtype="fp32")
    raw = json.loads(made.model_dump_json())
    raw["model"]["source"] = str(tmp_path / "evil.py")
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(raw))
    return path, tmp_path / "ran.txt"


def _one_line_error(result, *parts: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for part in parts:
        assert part in lines[0], lines[0]


def test_a_plan_file_runs_no_code_unless_the_user_chooses_it(foreign_plan: tuple[Path, Path]) -> None:
    from autopar.runtime.launch import RunOptions, prepare

    path, marker = foreign_plan
    wants = f"the plan wants to run {path.parent / 'evil.py'}"
    for command in (["launch", str(path)], ["launch", str(path), "--dry-run"], ["launch", str(path), "--nnodes", "2"],
                    ["validate", str(path)]):
        _one_line_error(runner.invoke(app, command), wants, "--trust-plan-model")
    assert not marker.exists()
    # naming the model file runs that file, never the plan's (prepare checks the model: it imports it)
    cmd, _ = prepare(path, GPT, RunOptions(steps=1), workdir=path.parent)
    assert cmd[cmd.index("--model") + 1] == GPT and not marker.exists()
    # --trust-plan-model is the consent: now the plan's file is imported
    with pytest.raises(AutoparError):
        prepare(path, None, RunOptions(steps=1), trust_plan_model=True, workdir=path.parent)
    assert marker.read_text() == "module-level code ran"


def test_per_rank_entry_point_refuses_the_plan_model_too(foreign_plan: tuple[Path, Path]) -> None:
    from autopar.runtime.launch import main

    path, marker = foreign_plan
    assert main([str(path)]) == 2  # before any process group: the same one line torchrun would show
    assert not marker.exists()


def _tokens(tmp_path: Path, count: int, dtype: str = "uint16") -> Path:
    path = tmp_path / f"tokens_{dtype}.bin"
    np.arange(count, dtype=dtype).tofile(path)
    return path


@pytest.mark.parametrize("extra,message", [
    (["--resume"], "--resume and --save-every need --checkpoint-dir"),
    (["--save-every", "2"], "need --checkpoint-dir"),
    (["--steps", "0"], "--steps 0: must be at least 1"),
    (["--checkpoint-dir", "{tmp}/none", "--resume"], "no checkpoint in"),
    (["--checkpoint-dir", "{tmp}/ck", "--resume", "--weights", "{tmp}"], "a resumed run takes its weights"),
    (["--checkpoint-dir", "{tmp}/ck", "--resume", "--steps", "2"], "is already at step 2; ask for more --steps"),
    (["--data", "{tmp}/missing.bin"], "data file not found"),
    (["--data", "{tmp}/odd.bin", "--data-dtype", "uint32"], "not a whole number of uint32 tokens"),
    (["--data", "{tmp}/short.bin"], "holds 10 tokens, fewer than one global batch (8 samples of seq_len 16 = 128 "
                                     "tokens)"),
    (["--weights", "{tmp}/nothing.safetensors"], "weights not found"),
])
def test_bad_options_fail_before_torchrun_in_one_line(tmp_path: Path, extra: list[str], message: str) -> None:
    (tmp_path / "odd.bin").write_bytes(b"\0" * 6)
    _tokens(tmp_path, 10).rename(tmp_path / "short.bin")
    step = tmp_path / "ck" / "step-00000002"
    step.mkdir(parents=True)
    (step / ".metadata").write_bytes(b"")
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan("gpt", dp=2)))
    result = runner.invoke(app, ["launch", str(path), GPT, *[e.format(tmp=tmp_path) for e in extra]])
    _one_line_error(result, message)


@pytest.mark.parametrize("model, degrees, message", [
    ("gpt", {"dp": 2, "ep": 2}, "ep 2: the model has no mixture-of-experts layer; re-plan with ep 1"),
    ("moe", {"dp": 3, "ep": 3}, "ep(3) does not divide the model's 8 routed experts; pick an ep that divides 8"),
    ("moe", {"tp": 2, "dp": 2, "ep": 2, "layer_tp": {"layers.1": 1}},
     "layer layers.1: tp 1 but the experts' etp 2 is the plan's tp (2)"),
])
def test_expert_parallel_plans_that_cannot_run_fail_before_torchrun(tmp_path: Path, model: str, degrees: dict,
                                                                     message: str) -> None:
    from helpers.runtime_worker import MODELS

    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan(model, **degrees)))
    _one_line_error(runner.invoke(app, ["launch", str(path), str(ROOT / MODELS[model][0])]), message)


def test_expert_parallelism_names_a_moe_module_it_cannot_run() -> None:
    """transformers' Mixtral runs under expert parallelism (autopar.runtime.hf_experts); its experts with another
    layout (here a bias beside the stacked weights) are one line."""
    import torch

    from autopar.capture import load_spec
    from autopar.runtime.ep import check_moe_module, moe_modules
    from autopar.runtime.init import build_meta

    tiny = {"hidden_size": "32", "num_hidden_layers": "1", "num_attention_heads": "4", "num_key_value_heads": "2",
            "intermediate_size": "64", "vocab_size": "64", "max_position_embeddings": "16", "num_local_experts": "4"}
    model = build_meta(load_spec(str(ROOT / "examples" / "hf" / "mixtral-8x7b-v0.1.json"), tiny).build)
    moe, experts, found = moe_modules(model.get_submodule("hf.model.layers.0"))
    check_moe_module("hf.model.layers.0", moe, experts, found.num_experts)
    experts.register_parameter("bias", torch.nn.Parameter(torch.zeros(4, 32, device="meta")))
    with pytest.raises(AutoparError, match=r"MixtralExperts \(gate_up_proj, down_proj, bias\) does not: run this "
                                           r"model with ep 1"):
        check_moe_module("hf.model.layers.0", moe, experts, found.num_experts)


def test_token_data_needs_a_model_of_token_ids(tmp_path: Path) -> None:
    """An encoder-decoder takes two inputs: a token file cannot feed it (said before torchrun starts)."""
    from autopar.capture import capture_model
    from autopar.runtime.launch import RunOptions, preflight

    source = str(ROOT / "examples" / "encdec.py")
    overrides = {"n_enc_layer": "1", "n_dec_layer": "1", "d_model": "32", "n_head": "4", "vocab_size": "64"}
    profile = capture_model(source, overrides, batch_size=1, seq_len=16)
    raw = {**plan("gpt", dp=2), "model": {"source": source, "overrides": overrides, "seq_len": 16, "dtype": "fp32"},
           "layers": [{"name": layer.name, "stage": 0, "tp": 1} for layer in profile.layers]}
    with pytest.raises(AutoparError, match="--data feeds token ids to a model with one input; this model takes 2"):
        preflight(parse_run_plan(raw), source, RunOptions(data=str(_tokens(tmp_path, 8 * 16))))


def test_dualpipev_on_a_model_of_two_inputs_is_refused_before_torchrun() -> None:
    """solve and estimate keep DualPipeV off a model of several inputs (autopar.runtime.support); a plan written by
    hand reaches launch, which says so in one line before torchrun (on the ranks T5 failed in a weight pass)."""
    from autopar.capture import capture_model
    from autopar.runtime.launch import RunOptions, preflight

    source = str(ROOT / "examples" / "encdec.py")
    overrides = {"n_enc_layer": "2", "n_dec_layer": "2", "d_model": "32", "n_head": "4", "vocab_size": "64"}
    profile = capture_model(source, overrides, batch_size=1, seq_len=16)
    names = [layer.name for layer in profile.layers]
    chunk = [min(3, i * 4 // len(names)) for i in range(len(names))]
    raw = {**plan("gpt", pp=2, mb=1, m=4, schedule="dualpipev", v=2),
           "model": {"source": source, "overrides": overrides, "seq_len": 16, "dtype": "fp32"},
           "layers": [{"name": n, "stage": c, "tp": 1} for n, c in zip(names, chunk)]}
    with pytest.raises(AutoparError, match=r"^the model takes 2 inputs .* torch's DualPipeV splits each backward .*; "
                                           r"re-plan with --schedule 1f1b$"):
        preflight(parse_run_plan(raw), source, RunOptions())


def test_each_data_parallel_rank_reads_its_slice_of_the_global_batch(tmp_path: Path) -> None:
    from autopar.runtime.data import TokenFile

    spec = parse_run_plan(plan("gpt", dp=2, mb=2, m=2))  # global batch 8, 4 samples per rank, seq 16
    for dtype in ("uint16", "uint32"):
        count = 10 * 16 + 7  # 10 samples and a tail that is never read
        tokens = TokenFile(_tokens(tmp_path, count, dtype), spec, dtype)
        assert tokens.windows == 10
        for step in range(3):  # step 1 wraps around the end of the file
            whole = tokens.samples(step * 8, 8)
            expected = [((step * 8 + i) % 10) * 16 for i in range(8)]
            assert whole[:, 0].tolist() == expected and whole.dtype.is_floating_point is False
            ranks = [tokens.local(step, r)[0] for r in range(2)]
            assert [t.shape for t in ranks] == [(4, 16), (4, 16)]
            assert (ranks[0] == whole[:4]).all() and (ranks[1] == whole[4:]).all()
    with pytest.raises(AutoparError, match="choose uint16 or uint32"):
        TokenFile(tmp_path / "tokens_uint16.bin", spec, "int8")


def test_latest_checkpoint_is_the_newest_complete_one(tmp_path: Path) -> None:
    from autopar.runtime.checkpoint import latest

    assert latest(tmp_path) is None
    for step, complete in ((2, True), (10, True), (12, False)):
        folder = tmp_path / f"step-{step:08d}"
        folder.mkdir()
        if complete:
            (folder / ".metadata").write_bytes(b"")
    (tmp_path / "step-latest").mkdir()
    assert latest(tmp_path) == tmp_path / "step-00000010"


SIGNAL_DEATH = """error: [rank 0] RuntimeError: [gloo/transport/tcp/pair.cc:537] Connection reset by peer
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : -11 (pid: 23943)  (SIGSEGV)"""


def test_a_failed_run_is_one_line_naming_the_rank() -> None:
    from autopar.runtime.failure import failure_reason

    interleaved = ("noise\nerror: [rank 1] the model does not match the plan: layer 3error: [rank 0] the model does "
                   "not match the plan: layer 3\n[rank0]: Traceback (most recent call last):\nChildFailedError:\n")
    assert failure_reason(interleaved) == "[rank 1] the model does not match the plan: layer 3"
    # a rank killed by a signal is the root cause; the others' broken connections only follow from it
    reason = failure_reason(SIGNAL_DEATH)
    assert "died by a signal" in reason and "SIGSEGV" in reason and "rank : 1" in reason
    assert failure_reason("[rank1]: ValueError: shapes do not match\nChildFailedError:\n") == \
        "[rank1]: ValueError: shapes do not match"


def test_every_option_reaches_the_ranks() -> None:
    """What `autopar launch` takes is what each rank's entry point parses from the torchrun command."""
    from autopar.runtime.launch import RunOptions, _parse

    options = RunOptions(steps=7, lr=0.5, as_json=True, data="t.bin", data_dtype="uint32", checkpoint_dir="ck",
                         save_every=3, resume=True, weights=None, verbose=True, model_layers="layers.json")
    args = _parse(["plan.json", "--model", "m.py", *options.argv()])
    assert (args.steps, args.lr, args.json, args.data, args.data_dtype, args.checkpoint_dir, args.save_every,
            args.resume, args.weights, args.verbose, args.model_layers, args.model) == \
        (7, 0.5, True, "t.bin", "uint32", "ck", 3, True, None, True, "layers.json", "m.py")


@pytest.mark.parametrize("setting, message", [
    ({"moe_dispatcher": "flex"}, "the plan sets moe_dispatcher flex, but autopar's runtime dispatches experts' tokens"),
    ({"tp_comm_overlap": True}, "the plan sets tp_comm_overlap True, but autopar's runtime does not overlap"),
    ({"overlap_grad_reduce": False}, "the plan sets overlap_grad_reduce False, but autopar's runtime reduces"),
    ({"recompute_modules": ["core_attn", "mlp"]}, "the plan sets recompute_modules core_attn,mlp, but autopar's"),
    ({"compile": True}, "runs the blocks eagerly, without torch.compile; re-plan for autopar's runtime (autopar "
                        "solve --engine autopar) or export the plan to the engine it was made for (autopar export "
                        "--to torchtitan)"),
])
def test_a_setting_the_runtime_runs_one_way_only_is_refused_before_torchrun(tmp_path: Path, setting: dict,
                                                                             message: str) -> None:
    """A plan made for another engine (Megatron-Core's DeepEP dispatcher, TE's tensor-parallel overlap, ...) is
    refused in one line naming the setting and what the runtime does instead (autopar/runtime/settings.py)."""
    spec = plan("gpt", dp=2)
    spec["parallelism"].update(setting)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(spec))
    _one_line_error(runner.invoke(app, ["launch", str(path), GPT]), message)
