"""`autopar calibrate`: the fits recover known parameters from synthetic data; a quick calibration at
--nproc 2 (gloo) writes a profile the cost model loads, that predicts a held-out GEMM and that estimate
accepts; bad input is one line, exit 2, nothing written."""
from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autopar.calibrate.build import predict_collective
from autopar.calibrate.fit import (
    CollectivePoint,
    GemmPoint,
    fit_collectives,
    fit_gemm,
    fit_memory,
    relative_errors,
    summarize,
)
from autopar.cli import app
from cost_models import comm, compute
from cost_models.hardware import hardware_from_dict, load_hardware
from helpers import ROOT

BASE = json.loads((ROOT / "cost_models/profiles/base/cpu.json").read_text())
runner = CliRunner()


def _profile(**fields: object) -> dict:
    return {**BASE, **fields}


# -- fits on synthetic data ---------------------------------------------------------------------------
WIDTHS = (64, 256, 1024, 4096)
ROWS = (16, 128, 1024, 8192)
EFF_W = (0.2, 0.55, 1.0, 0.8)      # by 2KN: rises, then falls (cache) — the fit must not assume a shape
EFF_R = (0.3, 0.7, 0.9, 1.0)


def _gemm_truth() -> dict:
    return _profile(peak_dense_tflops={"fp32": 0.15},
                    gemm_efficiency_by_mflop_per_token=[[2 * w * w / 1e6, e] for w, e in zip(WIDTHS, EFF_W)],
                    gemm_efficiency_by_rows=[[r, e] for r, e in zip(ROWS, EFF_R)])


def _gemm_points(hw, noise: float = 0.0, skip: set | None = None) -> list[GemmPoint]:
    rng = random.Random(0)
    return [GemmPoint(m, w, w, compute.gemm_time(2 * m * w * w, 2 * w * w, m, hw, "fp32") * (1 + rng.uniform(-noise, noise)))
            for m in ROWS for w in WIDTHS if (m, w) not in (skip or set())]


def test_gemm_fit_recovers_peak_and_both_tables() -> None:
    hw = hardware_from_dict(_gemm_truth())
    # a missing corner (too slow to measure) must not matter: the grid stays connected
    fit = fit_gemm(_gemm_points(hw, skip={(8192, 4096), (1024, 4096)}))
    assert fit.peak_flops == pytest.approx(0.15e12, rel=1e-9)
    assert [x for x, _ in fit.by_flops_per_token] == [2 * w * w for w in WIDTHS]
    assert [e for _, e in fit.by_flops_per_token] == pytest.approx(EFF_W, rel=1e-9)
    assert [r for r, _ in fit.by_rows] == list(ROWS)
    assert [e for _, e in fit.by_rows] == pytest.approx(EFF_R, rel=1e-9)


def test_gemm_fit_with_noise_predicts_within_the_noise() -> None:
    hw = hardware_from_dict(_gemm_truth())
    points = _gemm_points(hw, noise=0.05)
    fit = fit_gemm(points)
    assert all(0 < e <= 1 for _, e in fit.by_flops_per_token + fit.by_rows)
    fitted = hardware_from_dict(_profile(
        peak_dense_tflops={"fp32": fit.peak_flops / 1e12},
        gemm_efficiency_by_mflop_per_token=[[x / 1e6, e] for x, e in fit.by_flops_per_token],
        gemm_efficiency_by_rows=[[r, e] for r, e in fit.by_rows]))
    pred = [compute.gemm_time(p.flops, p.flops_per_token, p.m, fitted, "fp32") for p in points]
    errors = relative_errors(pred, [p.seconds for p in points])
    assert summarize(errors)["max_abs_rel_error"] < 0.1
    assert fit.peak_flops == pytest.approx(0.15e12, rel=0.1)


def test_memory_fit_matches_each_sizes_op_mix() -> None:
    # at each size a fast op (add) and a slow one (softmax); sizes differ in bandwidth (cache vs DRAM)
    sizes = [2**16, 2**20, 2**26]
    bandwidth = {("add", 2**16): 60e9, ("softmax", 2**16): 8e9, ("add", 2**20): 40e9, ("softmax", 2**20): 7e9,
                 ("add", 2**26): 6e9, ("softmax", 2**26): 1e9}
    moved, secs, size = [], [], []
    for (op, s), bw in bandwidth.items():
        moved.append((3 if op == "add" else 2) * s)
        secs.append(moved[-1] / bw)
        size.append(s)
    fit = fit_memory(moved, secs, size)
    assert fit.peak_bytes_per_s == 60e9 and 0 < fit.efficiency <= 1
    # least squares in log space over sizes: the mix's predicted/measured ratios multiply to 1
    ratios = [sum(m for m, z in zip(moved, size) if z == s) / (fit.peak_bytes_per_s * fit.efficiency)
              / sum(t for t, z in zip(secs, size) if z == s) for s in sizes]
    assert math.prod(ratios) == pytest.approx(1.0, rel=1e-9)
    one = fit_memory([3e6, 2e6], [3e6 / 20e9, 2e6 / 20e9], [1e6, 1e6])  # a single bandwidth is exact
    assert one.peak_bytes_per_s * one.efficiency == pytest.approx(20e9, rel=1e-12)


SIZES = [4096 * 4**i for i in range(8)]
COLL_EFF = [0.05, 0.12, 0.25, 0.45, 0.65, 0.8, 0.92, 1.0]


def test_collective_fit_recovers_latency_bandwidth_and_table() -> None:
    truth = hardware_from_dict(_profile(intra_node_latency_us=60.0, nvlink_bandwidth_bidirectional_gbytes_per_s=5.0,
                                        collective_efficiency_by_mbytes=[[s / 1e6, e] for s, e in zip(SIZES, COLL_EFF)]))
    link = comm.Link(truth.intra_node_bytes_per_s, truth.intra_node_latency_s, inter_node=False)
    points = [CollectivePoint(op, n, s, predict_collective(op, n, s, link, truth))
              for n in (2, 4) for s in SIZES for op in ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
              if op != "send_recv" or n == 2]
    fit = fit_collectives(points)
    assert fit.latency_s == pytest.approx(60e-6, rel=1e-3)
    assert fit.bytes_per_s == pytest.approx(2.5e9, rel=1e-3)     # one direction = bidirectional / 2
    assert [x for x, _ in fit.efficiency] == SIZES
    assert [e for _, e in fit.efficiency] == pytest.approx(COLL_EFF, abs=2e-3)


def test_reduce_scatter_ratio_is_recovered_from_the_measured_collectives() -> None:
    """A backend whose reduce-scatter runs at 0.4 of its all-gather bandwidth: the shared fit leaves it out
    and the ratio comes back."""
    from autopar.calibrate.build import _reduce_scatter_ratio

    raw = _profile(intra_node_latency_us=60.0, nvlink_bandwidth_bidirectional_gbytes_per_s=5.0,
                   collective_efficiency_by_mbytes=[[s / 1e6, e] for s, e in zip(SIZES, COLL_EFF)],
                   reduce_scatter_relative_bandwidth=0.4)
    truth = hardware_from_dict(raw)
    link = comm.Link(truth.intra_node_bytes_per_s, truth.intra_node_latency_s, inter_node=False)
    points = [{"op": op, "group_size": n, "bytes": s, "seconds": predict_collective(op, n, s, link, truth)}
              for n in (2, 4) for s in SIZES for op in ("all_gather", "reduce_scatter")]
    assert points[1]["seconds"] > points[0]["seconds"]
    ratio, used = _reduce_scatter_ratio(points, {**raw, "reduce_scatter_relative_bandwidth": 1.0})
    assert used == sum(s >= 1 << 20 for s in SIZES) * 2 and used > 0
    assert ratio == pytest.approx(0.4, rel=1e-6)


def test_each_collectives_scale_is_recovered_from_the_measured_collectives() -> None:
    """A backend whose all-gather takes 2-3x the ring model's time (growing with size) and whose send/recv
    takes half of it: the per-op scale table brings every point back, and the all-reduce stays at 1."""
    from autopar.calibrate.build import _collective_scales

    raw = _profile(intra_node_latency_us=60.0, nvlink_bandwidth_bidirectional_gbytes_per_s=5.0,
                   collective_efficiency_by_mbytes=[[s / 1e6, e] for s, e in zip(SIZES, COLL_EFF)])
    ring = hardware_from_dict(raw)
    link = comm.Link(ring.intra_node_bytes_per_s, ring.intra_node_latency_s, inter_node=False)
    slow = {"all_gather": lambda s: 2.0 + SIZES.index(s) / 7, "send_recv": lambda s: 0.5}
    points = [{"op": op, "group_size": 2, "bytes": s,
               "seconds": predict_collective(op, 2, s, link, ring) * slow.get(op, lambda _: 1.0)(s)}
              for s in SIZES for op in ("all_reduce", "all_gather", "send_recv")]
    table = _collective_scales(points, ring)
    assert [f for _, f in table["all_reduce"]] == pytest.approx([1.0] * len(SIZES))
    assert [f for _, f in table["send_recv"]] == pytest.approx([0.5] * len(SIZES))
    scaled = hardware_from_dict({**raw, "collective_time_scale_by_op_mbytes": table})
    for p in points:
        assert predict_collective(p["op"], 2, p["bytes"], link, scaled) == pytest.approx(p["seconds"], rel=1e-3)
    between = math.sqrt(SIZES[3] * SIZES[4])  # halfway in log size: halfway between the two factors
    assert scaled.collective_time_scale("all_gather", between) == pytest.approx(2.0 + 3.5 / 7, rel=1e-3)
    inter = comm.Link(link.bytes_per_s, link.latency_s, inter_node=True)   # measured inside a node only
    assert comm.all_gather_time(SIZES[4], 2, inter, scaled) == comm.all_gather_time(SIZES[4], 2, inter, ring)


def test_kernel_fit_recovers_each_kernels_efficiency_and_backward_ratio() -> None:
    """Synthetic element-wise and attention timings with known per-kernel efficiencies and backward ratios
    (noise-free, three sizes) come back exactly; light ops do not enter the heavy fits."""
    from autopar.calibrate.kernel_fit import kernel_fields

    hbm, peak = 50e9, 90e9
    truth = {"gelu_tanh": (0.04, 1.1), "layer_norm": (0.2, 2.0), "softmax": (0.12, 0.8)}
    memory = []
    for size in (2**16, 2**20, 2**24):
        memory.append(dict(op="add", tensor_bytes=size, bytes=3 * size, seconds=3 * size / (0.9 * hbm), backward=False))
        for op, (eff, ratio) in truth.items():
            fwd = 2 * size / (eff * hbm)
            memory += [dict(op=op, tensor_bytes=size, bytes=2 * size, seconds=fwd, backward=False),
                       dict(op=op, tensor_bytes=size, bytes=2 * size, seconds=fwd * (1 + ratio), backward=True)]
    attention = []
    for b, h, s, d in ((4, 8, 128, 32), (2, 8, 256, 48)):
        flops = 4 * b * h * s * s * d
        t = flops / (0.5 * peak)
        attention += [dict(batch=b, heads=h, seq_len=s, head_dim=d, flops=flops, seconds=t, backward=False),
                      dict(batch=b, heads=h, seq_len=s, head_dim=d, flops=flops, seconds=t * 3.8, backward=True)]
    fields, src = kernel_fields(memory, attention, hbm, peak, "test")
    assert fields["heavy_op_bandwidth_efficiency_by_kernel"] == pytest.approx({op: e for op, (e, _) in truth.items()})
    assert fields["backward_over_forward_by_kernel"] == pytest.approx({op: r for op, (_, r) in truth.items()})
    assert min(e for e, _ in truth.values()) < fields["heavy_op_bandwidth_efficiency"] < 0.2
    assert fields["attention_efficiency"] == pytest.approx(0.5) and fields["attention_backward_over_forward"] == pytest.approx(2.8)
    assert set(fields) <= set(src)


# -- end to end ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def quick_profile(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    from autopar.calibrate.run import calibrate, check_request

    out = tmp_path_factory.mktemp("calibrate") / "quick.json"
    events: list[dict] = []
    calibrate(check_request(out, nproc=2, backend="gloo", quick=True), events.append)
    assert events[0]["event"] == "plan" and sum(e["event"] == "step" for e in events) == sum(events[0]["groups"].values())
    return out, json.loads(out.read_text())


def cal_residual(raw: dict, key: str) -> float:
    return raw["calibration"]["residuals"][key]["median_abs_rel_error"]


@pytest.mark.dist
def test_quick_calibration_writes_a_loadable_profile(quick_profile: tuple[Path, dict]) -> None:
    path, raw = quick_profile
    hw = load_hardware(path)
    assert hw.name == "quick" and hw.gpus_per_node == 2
    assert all(hw.peak(d) > 0 for d in ("bf16", "fp16", "fp32"))
    assert hw.hbm_bytes_per_s > 0 and 0 < hw.memory_efficiency <= 1 and hw.intra_node_bytes_per_s > 0
    assert 0 < hw.memory_reserve_bytes < hw.memory_bytes
    fields = set(raw) - {"name", "description", "sources", "calibration", "uncertainty"}
    assert fields <= set(raw["sources"]), f"fields without a source: {fields - set(raw['sources'])}"
    # the fitted fields carry the uncertainty of their fit, with where it comes from
    unc = raw["uncertainty"]
    assert {"peak_dense_tflops", "gemm_efficiency_by_mflop_per_token", "memory_bandwidth_efficiency",
            "collective_time_scale_by_op_mbytes"} <= set(unc) and set(hw.uncertainty) == set(unc)
    assert all(0 <= u["relative"] <= 0.9 and u["source"] for u in unc.values())
    assert unc["gemm_efficiency_by_mflop_per_token"]["relative"] == pytest.approx(min(0.9, max(
        cal_residual(raw, "gemm"), cal_residual(raw, "gemm_holdout"))), abs=1e-3)
    cal = raw["calibration"]
    assert cal["collective_impl"]["reduce_scatter"] and cal["residuals"]["collectives"]["points"] > 0
    # each op's scale over the shared ring fit: the measured collectives come back (in sample, one group size)
    assert set(raw["collective_time_scale_by_op_mbytes"]) == {"all_reduce", "all_gather", "reduce_scatter", "send_recv"}
    assert cal["residuals"]["collectives"]["median_abs_rel_error"] <= 0.01
    assert cal["residuals"]["collectives_ring_fit"]["points"] == cal["residuals"]["collectives"]["points"]
    for field in ("nic_bandwidth_gbits_per_s", "nics_per_node", "inter_node_latency_us"):
        assert raw[field] == BASE[field] and "kept from cpu-base" in raw["sources"][field]
    from autopar.calibrate.kernels import HEAVY_KERNELS

    assert {k for k, _ in hw.kernels.heavy} == set(HEAVY_KERNELS) == {k for k, _ in hw.kernels.backward}
    assert hw.kernels.attention and 0 < hw.kernels.attention <= 1
    assert len(cal["layers"]) == 3 and all(r["predicted_s"] > 0 and r["measured_s"] > 0 for r in cal["layers"])


@pytest.mark.dist
def test_quick_calibration_predicts_a_held_out_gemm(quick_profile: tuple[Path, dict]) -> None:
    path, raw = quick_profile
    hw = load_hardware(path)
    cal = raw["calibration"]
    fitted = {(p["m"], p["k"], p["n"]) for p in cal["gemm"] if not p["holdout"]}
    held_out = [p for p in cal["gemm"] if p["holdout"]]
    assert held_out
    knots_w = {x for x, _ in raw["gemm_efficiency_by_mflop_per_token"]}
    knots_r = {r for r, _ in raw["gemm_efficiency_by_rows"]}
    for p in held_out:
        assert (p["m"], p["k"], p["n"]) not in fitted
        assert p["m"] not in knots_r and round(2 * p["k"] * p["n"] / 1e6, 6) not in knots_w  # interpolated
        predicted = compute.gemm_time(2 * p["m"] * p["k"] * p["n"], 2 * p["k"] * p["n"], p["m"], hw, "fp32")
        # how close the prediction comes to the measured time depends on the load on the machine during the
        # calibration: benchmarks/calibrate.py prints it; a test checks only that it is a prediction
        assert 0 < predicted < math.inf, (p, predicted)


@pytest.mark.dist
def test_estimate_accepts_the_calibrated_profile(quick_profile: tuple[Path, dict]) -> None:
    path, _ = quick_profile
    result = runner.invoke(app, ["estimate", str(ROOT / "examples/gpt.py"), "--set", "n_layer=2", "--set", "n_embd=64",
                                 "--set", "n_head=4", "--seq-len", "64", "--gpus", "2", "--gpus-per-node", "2",
                                 "--tp", "1", "--pp", "1", "--micro-batch-size", "1", "--global-batch-size", "4", "--dtype", "fp32",
                                 "--hardware", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["prediction"]["step_time_s"] > 0


# -- errors -------------------------------------------------------------------------------------------
def _fails(tmp_path: Path, *args: str, message: str) -> None:
    result = runner.invoke(app, ["calibrate", *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not list(tmp_path.rglob("*.json"))


def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    out = str(tmp_path / "p.json")
    _fails(tmp_path, "-o", out, "--nproc", "0", message="--nproc 0")
    _fails(tmp_path, "-o", out, "--backend", "mpi", message="choose gloo")
    blocker = tmp_path / "file"
    blocker.write_text("")
    _fails(tmp_path, "-o", str(blocker / "p.json"), message="cannot write there")
    _fails(tmp_path, "-o", str(tmp_path / "p.yaml"), message="must be a .json file")
    _fails(tmp_path, "-o", out, "--base", "tpu-v9", message="unknown hardware 'tpu-v9'")
    _fails(tmp_path, "--quick", message="--quick is for tests and is not recorded as this machine's calibration")


def test_a_cpu_calibration_is_recorded_as_this_machines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without -o a gloo calibration goes where --gpu cpu reads (cost_models/machine.py), named cpu; with -o it goes
    there too (calibrate() writes both), but never from --quick."""
    from autopar.calibrate.run import check_request
    from autopar.errors import AutoparError
    from cost_models import machine

    monkeypatch.setenv(machine.CALIBRATION_ENV, str(tmp_path))
    req = check_request(None, nproc=2, backend="gloo")
    assert req.output == machine.calibration_path() and req.output.parent == tmp_path and req.name == "cpu"
    assert req.base["name"] == "cpu-base"
    with pytest.raises(AutoparError, match="--quick is for tests"):
        check_request(None, backend="gloo", quick=True)


def test_nccl_without_cuda_is_refused(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    _fails(tmp_path, "-o", str(tmp_path / "p.json"), "--backend", "nccl", message="--backend nccl needs CUDA")


# torchrun's report when rank 1 died by SIGSEGV: rank 0 then fails on the broken connection, a consequence
SIGNAL_REPORT = """[rank0]: RuntimeError: [gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:24987: Connection reset by peer.
  File "torch/distributed/launcher/api.py", line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 23942)  (SIGTERM)
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : -11 (pid: 23943)  (SIGSEGV)
  error_file: <N/A>"""


def test_worker_error_names_the_root_cause() -> None:
    from autopar.runtime.failure import worker_error

    died = worker_error(SIGNAL_REPORT.splitlines())
    assert "SIGSEGV" in died and "rank : 1" in died and "SIGTERM" not in died
    raised = SIGNAL_REPORT.replace("-11 (pid: 23943)  (SIGSEGV)", "1 (pid: 23943)").splitlines()
    raised[0] = "[rank1]: ValueError: shapes do not match"  # a Python error: the worker's own line says it
    assert worker_error(raised) == "[rank1]: ValueError: shapes do not match"
    assert worker_error(raised[1:]) == "rank : 1 (local_rank: 1); exitcode : 1 (pid: 23943)"
    # killed by a signal: Python's fault handler (on in the workers) says where, and what C++ threw
    fault = ["terminate called after throwing an instance of 'gloo::IoException'",
             "  what():  [gloo/transport/tcp/pair.cc:1089] Connection closed by peer",
             "Fatal Python error: Aborted", "", "Current thread 0x00007f2480296b80 (most recent call first):",
             '  File "/x/autopar/calibrate/bench.py", line 266 in main', '  File "<frozen runpy>", line 88 in _run_code']
    died = worker_error(fault + SIGNAL_REPORT.splitlines())
    assert "Fatal Python error: Aborted" in died and "Connection closed by peer" in died
    assert died.endswith('at File "/x/autopar/calibrate/bench.py", line 266 in main')


# a stand-in for the torchrun job: one progress event, the raw file if asked, then an abort (SIGABRT)
FAKE_WORKERS = """import json, os, sys
from autopar.calibrate.bench import PROGRESS_PREFIX
print(PROGRESS_PREFIX + json.dumps({"event": "step", "group": "lockstep", "label": "DTensor dispatch"}), flush=True)
if sys.argv[2] == "write":
    open(sys.argv[1], "w").write(json.dumps({"measured": 1}))
os.abort()
"""


@pytest.mark.parametrize("written", [True, False])
def test_a_worker_crash_after_the_last_measurement_keeps_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            written: bool) -> None:
    import sys

    import autopar.calibrate.run as run
    from autopar.errors import AutoparError

    script = tmp_path / "fake.py"
    script.write_text(FAKE_WORKERS)
    monkeypatch.setattr(run, "worker_command", lambda req, out: [sys.executable, str(script), str(out),
                                                                  "write" if written else "no"])
    events: list[dict] = []
    req = run.check_request(tmp_path / "p.json", nproc=2, backend="gloo")
    if written:  # every measurement was written before the crash: used, with a warning
        assert run.run_workers(req, events.append) == {"measured": 1}
        assert "exited with -6 while shutting down" in events[-1]["text"]
        return
    with pytest.raises(AutoparError) as err:
        run.run_workers(req, events.append)
    message = str(err.value)
    assert "during lockstep DTensor dispatch" in message and "(exit -6)" in message
    log = Path(message.rsplit("their output is in ", 1)[1])
    assert "Fatal Python error: Aborted" in log.read_text()
    log.unlink()
