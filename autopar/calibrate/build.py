"""Turn the workers' raw measurements into a hardware profile (cost_models/profiles/*.json format).

Every field gets a ``sources`` line saying how it was measured, numbers included. A ``calibration``
block (ignored by ``cost_models.hardware.hardware_from_dict``, which reads only the fields it knows)
keeps the raw medians, the fits' residuals and the held-out GEMM shapes, so `validate` and fidelity
tables can show them. Residuals are computed with the cost model's own functions on the profile as
written (rounded), so they are exactly what a plan would see.
"""
from __future__ import annotations

import datetime
import math
import statistics
from dataclasses import dataclass
from typing import Any, Mapping

from autopar.calibrate.fit import (
    CollectiveFit,
    CollectivePoint,
    GemmFit,
    GemmPoint,
    MemoryFit,
    fit_collectives,
    fit_gemm,
    fit_memory,
    relative_errors,
    summarize,
)
from autopar.calibrate.kernel_fit import LIGHT, kernel_fields, light_points
from autopar.calibrate.layer_check import check_layers
from autopar.calibrate.lockstep_fit import lockstep_fields
from autopar.calibrate.uncertainty import calibration_uncertainty
from cost_models import comm, compute
from cost_models.hardware import GIB, HardwareProfile, hardware_from_dict

INTER_NODE_FIELDS = ("nic_bandwidth_gbits_per_s", "nics_per_node", "inter_node_latency_us")


def sig(x: float, digits: int = 4) -> float:
    """Round to ``digits`` significant digits (profiles are read by people)."""
    return float(f"{x:.{digits}g}") if x else 0.0


def _table(points: tuple[tuple[float, float], ...], scale: float) -> list[list[float]]:
    return [[sig(x / scale), sig(e)] for x, e in points]


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def build_profile(results: Mapping[str, Any], base: Mapping[str, Any], *, name: str, nproc: int,
                  gpus_per_node: int | None = None) -> dict[str, Any]:
    """The profile dict (with ``sources`` and ``calibration``) for ``results`` from autopar.calibrate.bench."""
    f = _fit(results, nproc, gpus_per_node or nproc)
    kernel, kernel_src = kernel_fields(results["memory"], results.get("attention", []), f.memory.peak_bytes_per_s,
                                       f.peaks[f.primary], f.who)
    lock_fields, lock_src, lock_raw = lockstep_fields(results, f.who)
    profile, ring_hw, rs_points = _fields(f, base, name, kernel, lock_fields)
    residuals, layers = _profile_residuals(f, profile, ring_hw)
    base_name = base.get("name", "base")
    profile["sources"] = _sources(f, base_name, residuals, rs_points, kernel_src, lock_src)
    profile["uncertainty"] = calibration_uncertainty(profile, residuals, base, f.overlap)
    profile["calibration"] = _calibration_record(f, base_name, residuals, layers, lock_raw)
    return profile


@dataclass(frozen=True)
class _Fits:
    """One calibration run's measurements and the fits the profile's fields and sources are made of."""
    results: Mapping[str, Any]
    nproc: int
    gpus_per_node: int
    who: str  # how many processes measured at once, and over which backend
    primary: str  # the dtype the GEMM tables are fitted in
    cuda: bool
    fitted: list[Mapping[str, Any]]  # the GEMM shapes fitted (the rest are held out)
    gemm: GemmFit
    rate: dict[str, float]  # FLOP/s of each dtype at the reference shape
    peaks: dict[str, float]
    light: list[Mapping[str, Any]]  # the light element-wise points the bandwidth is fitted to
    memory: MemoryFit
    coll_points: list[CollectivePoint]
    coll: CollectiveFit | None
    host_bw: float | None
    memory_gib: float
    overlap: Mapping[str, Any] | None
    adam: Mapping[str, Any] | None


def _fit(results: Mapping[str, Any], nproc: int, gpus_per_node: int) -> _Fits:
    """Fit the GEMM, memory-bandwidth and collective models to the measured medians."""
    dev = results["device"]
    primary = results["primary_dtype"]
    cuda = results["device_type"] == "cuda"
    fitted = [p for p in results["gemm"] if not p["holdout"]]
    gemm = fit_gemm([GemmPoint(p["m"], p["k"], p["n"], p["seconds"]) for p in fitted])
    rate = {p["dtype"]: 2 * p["m"] * p["k"] * p["n"] / p["seconds"] for p in results["dtypes"]}
    light = light_points(results["memory"])
    memory = fit_memory([p["bytes"] for p in light], [p["seconds"] for p in light], [p["tensor_bytes"] for p in light])
    coll_points = [CollectivePoint(p["op"], p["group_size"], p["bytes"], p["seconds"]) for p in results["collectives"]]
    # reduce-scatter gets its own bandwidth ratio (see _fields), so the shared fit leaves it out when it can
    shared = [p for p in coll_points if p.op != "reduce_scatter"] or coll_points
    link = dev.get("host_link")
    total = dev["memory_total_bytes"]
    return _Fits(
        results=results, nproc=nproc, gpus_per_node=gpus_per_node,
        who=f"{nproc} process{'es' if nproc > 1 else ''} at once ({results['backend']})",
        primary=primary, cuda=cuda, fitted=fitted, gemm=gemm, rate=rate,
        peaks={d: gemm.peak_flops * rate[d] / rate[primary] for d in rate},
        light=light, memory=memory, coll_points=coll_points, coll=fit_collectives(shared) if coll_points else None,
        host_bw=(link["bytes"] / ((link["h2d_s"] + link["d2h_s"]) / 2)) if link else None,
        memory_gib=total / GIB if cuda else total / GIB / nproc,
        overlap=results.get("overlap"), adam=(results.get("optimizer") or [None])[0])


def _fields(f: _Fits, base: Mapping[str, Any], name: str, kernel: Mapping[str, Any],
            lock_fields: Mapping[str, Any]) -> tuple[dict[str, Any], HardwareProfile, int]:
    """The profile's hardware fields (rounded as written); the shared ring fit alone as a HardwareProfile,
    and how many reduce-scatters its bandwidth ratio is the median of."""
    dev, coll = f.results["device"], f.coll
    profile: dict[str, Any] = {
        "name": name,
        "description": f"{dev['name']} calibrated by `autopar calibrate` on {datetime.date.today().isoformat()}: "
                       f"{f.who}, torch {dev['torch']}",
        "peak_dense_tflops": {d: sig(f.peaks[d] / 1e12) for d in ("bf16", "fp16", "fp32") if d in f.peaks},
        "memory_gib": sig(f.memory_gib),
        "memory_reserve_gib": math.ceil(100 * dev["reserve_bytes"] / GIB) / 100,
        "hbm_bandwidth_gbytes_per_s": sig(f.memory.peak_bytes_per_s / 1e9),
        "gpus_per_node": f.gpus_per_node,
        "nvlink_bandwidth_bidirectional_gbytes_per_s": sig(2 * coll.bytes_per_s / 1e9) if coll else
        base["nvlink_bandwidth_bidirectional_gbytes_per_s"],
        "intra_node_latency_us": sig(coll.latency_s * 1e6) if coll else base["intra_node_latency_us"],
        **{k: base[k] for k in INTER_NODE_FIELDS},
        "host_link_bandwidth_gbytes_per_s": sig(f.host_bw / 1e9) if f.host_bw else
        base["host_link_bandwidth_gbytes_per_s"],
        "gemm_efficiency_by_mflop_per_token": _table(f.gemm.by_flops_per_token, 1e6),
        "gemm_efficiency_by_rows": _table(f.gemm.by_rows, 1.0),
        "memory_bandwidth_efficiency": sig(f.memory.efficiency),
        "collective_efficiency_by_mbytes": _table(coll.efficiency, 1e6) if coll else
        base["collective_efficiency_by_mbytes"],
    }
    rs_ratio, rs_points = _reduce_scatter_ratio(f.results["collectives"], profile) if coll else (1.0, 0)
    profile["reduce_scatter_relative_bandwidth"] = sig(rs_ratio)
    ring_hw = hardware_from_dict(profile)  # the shared ring fit alone, before each op's own scale
    if coll:
        profile["collective_time_scale_by_op_mbytes"] = _collective_scales(f.results["collectives"], ring_hw)
    profile["comm_compute_overlap"] = (round(f.overlap["overlap"], 3) if f.overlap else
                                       base.get("comm_compute_overlap", 1.0))
    if not f.cuda:  # no streams: FSDP2's all-gathers and reduce-scatters block the host thread that computes
        profile["zero3_comm_compute_overlap"] = 0.0
    profile.update({k: {op: sig(x) for op, x in v.items()} if isinstance(v, dict) else sig(v) for k, v in kernel.items()})
    if f.adam:
        profile["optimizer_bandwidth_efficiency"] = sig(min(1.0, f.adam["bytes"] / f.adam["seconds"] /
                                                            (profile["hbm_bandwidth_gbytes_per_s"] * 1e9)))
    profile.update(lock_fields)
    return profile, ring_hw, rs_points


def _profile_residuals(f: _Fits, profile: Mapping[str, Any],
                       ring_hw: HardwareProfile) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The residuals of the profile as written (plus the ring fit's alone), and the layer checks."""
    residuals = _residuals(f.results, hardware_from_dict(profile), f.primary)
    if f.coll:
        residuals["collectives_ring_fit"] = _collective_residuals(f.results["collectives"], ring_hw)
    layers = check_layers(f.results["layer"], profile) if f.results.get("layer") else []
    if layers:
        residuals["layers"] = summarize(relative_errors([r["predicted_s"] for r in layers], [r["measured_s"] for r in layers]))
    return residuals, layers


def _sources(f: _Fits, base_name: str, residuals: Mapping[str, Any], rs_points: int,
             kernel_src: Mapping[str, str], lock_src: Mapping[str, str]) -> dict[str, str]:
    """Each field's ``sources`` line: how it was measured, numbers included."""
    src = _measured_sources(f, base_name, residuals)
    for field in INTER_NODE_FIELDS:
        src[field] = f"kept from {base_name}: one host, nothing measured between nodes"
    src.update(_comm_sources(f, base_name, residuals, rs_points))
    if not f.cuda:
        src["zero3_comm_compute_overlap"] = (
            "0 on a device without streams: FSDP2 issues a layer's all-gather before its forward and its "
            "reduce-scatter after its backward as blocking collectives on the host thread that computes")
    src.update(kernel_src)
    src.update(lock_src)
    if f.adam:
        adam = f.adam
        src["optimizer_bandwidth_efficiency"] = (
            f"torch.optim.AdamW(fused=True).step() over {adam['params'] / 2**20:g} Mi fp32 parameters, {f.who}: "
            f"{adam['seconds'] * 1e3:.3g} ms, {adam['bytes'] / adam['seconds'] / 1e9:.3g} GB/s of 28 bytes per "
            "parameter (parameter and both moments read and written, gradient read), over the fitted bandwidth")
    return src


def _measured_sources(f: _Fits, base_name: str, residuals: Mapping[str, Any]) -> dict[str, str]:
    """The sources of the compute, memory and host-link fields."""
    results, primary, who, rate, peaks, dev = f.results, f.primary, f.who, f.rate, f.peaks, f.results["device"]
    rm, rk, rn = (next(p for p in results["dtypes"] if p["dtype"] == primary)[x] for x in ("m", "k", "n"))
    best = max(f.fitted, key=lambda p: 2 * p["m"] * p["k"] * p["n"] / p["seconds"])
    mem_best = max(f.light, key=lambda p: p["bytes"] / p["seconds"])
    mem_ops = sorted({p["op"] for p in f.light})
    sizes = sorted({p["tensor_bytes"] for p in f.light})
    cuda, total, link = f.cuda, dev["memory_total_bytes"], dev.get("host_link")
    return {
        "peak_dense_tflops": (
            f"fitted asymptote of torch.mm {primary} over {len(f.fitted)} shapes (rows {_list(f.gemm.by_rows)}, "
            f"K=N weights; median of the samples of {_rounds(results)} shuffled rounds), {who}: {peaks[primary] / 1e9:.4g} GFLOP/s per process (best measured "
            f"{2 * best['m'] * best['k'] * best['n'] / best['seconds'] / 1e9:.4g} at {best['m']}x{best['k']}x{best['n']}); "
            + "; ".join(f"{d} = {primary} peak x measured {d}/{primary} throughput at {rm}x{rk}x{rn} "
                        f"({rate[d] / 1e9:.4g} vs {rate[primary] / 1e9:.4g} GFLOP/s)" for d in peaks if d != primary)),
        "memory_gib": (f"torch.cuda.mem_get_info total: {total / GIB:.2f} GiB" if cuda else
                       f"host RAM (sysconf) {total / GIB:.2f} GiB shared by the {f.nproc} processes of one host: "
                       f"{f.memory_gib:.2f} GiB each"),
        "memory_reserve_gib": (f"largest over ranks of GPU memory outside the caching allocator after the benchmarks "
                               f"(CUDA context, NCCL, cuBLAS workspaces): {dev['reserve_bytes'] / GIB:.3f} GiB" if cuda
                               else f"largest over ranks of peak RSS after import torch + init_process_group: "
                                    f"{dev['reserve_bytes'] / GIB:.3f} GiB"),
        "hbm_bandwidth_gbytes_per_s": (
            f"highest bandwidth per process of {', '.join(mem_ops)} on {_bytes(sizes[0])}..{_bytes(sizes[-1])} "
            f"tensors, {who}: {mem_best['op']} {_bytes(mem_best['tensor_bytes'])} "
            f"{mem_best['bytes'] / mem_best['seconds'] / 1e9:.4g} GB/s (bytes = inputs read + output written)"),
        "memory_bandwidth_efficiency": (
            f"light element-wise ops: fitted to the summed time of the {len(mem_ops)} kernels at each of {len(sizes)} "
            f"tensor sizes (least squares of log time; heavy kernels have their own, below): mix residuals "
            f"median {_pct(residuals['memory_mix']['median_abs_rel_error'])}, max "
            f"{_pct(residuals['memory_mix']['max_abs_rel_error'])}; single kernels median "
            f"{_pct(residuals['memory']['median_abs_rel_error'])}, max {_pct(residuals['memory']['max_abs_rel_error'])} "
            f"({_worst(residuals['memory'])})"),
        "gpus_per_node": f"processes per node of the calibration run ({f.nproc})" if f.gpus_per_node == f.nproc else
        "given on the command line",
        "host_link_bandwidth_gbytes_per_s": (f"{link['method']} of {_bytes(link['bytes'])}: "
                                             f"{f.host_bw / 1e9:.4g} GB/s (mean of both directions)" if link else
                                             f"kept from {base_name}"),
        "gemm_efficiency_by_mflop_per_token": (
            f"joint least-squares fit with the rows table (log space) of torch.mm {primary} times, x = 2*K*N/1e6 of "
            f"one GEMM (the cost model reads it at a layer's summed matmul FLOPs per token); "
            f"residuals median {_pct(residuals['gemm']['median_abs_rel_error'])}, "
            f"max {_pct(residuals['gemm']['max_abs_rel_error'])} over {residuals['gemm']['points']} shapes; held-out "
            f"shapes {_pct(residuals['gemm_holdout']['median_abs_rel_error'])} median; tables shared by all dtypes"),
        "gemm_efficiency_by_rows": "joint fit with gemm_efficiency_by_mflop_per_token (see there), x = rows M",
    }


def _comm_sources(f: _Fits, base_name: str, residuals: Mapping[str, Any], rs_points: int) -> dict[str, str]:
    """The sources of the collective fields and the communication/compute overlap."""
    src: dict[str, str] = {}
    coll, coll_points, overlap = f.coll, f.coll_points, f.overlap
    if coll:
        impl = f.results.get("collective_impl", {})
        counts = sorted({p.n for p in coll_points})
        ring = residuals["collectives_ring_fit"]
        fit_note = (f"Levenberg-Marquardt fit of t = steps*latency + volume/(bandwidth*eff(volume)) (cost_models/comm.py) "
                    f"to the medians of all_reduce, all_gather ({impl.get('all_gather', '?')}), reduce_scatter "
                    f"({impl.get('reduce_scatter', '?')}), send/recv ping-pong; {_bytes(min(p.nbytes for p in coll_points))}"
                    f"..{_bytes(max(p.nbytes for p in coll_points))}, groups of {counts} ranks, all groups at once; "
                    f"residuals median {_pct(ring['median_abs_rel_error'])}, "
                    f"max {_pct(ring['max_abs_rel_error'])} ({_worst(ring)})")
        src["intra_node_latency_us"] = f"{coll.latency_s * 1e6:.4g} us per ring step: {fit_note}"
        src["nvlink_bandwidth_bidirectional_gbytes_per_s"] = (
            f"2 x the fitted one-direction bandwidth {coll.bytes_per_s / 1e9:.4g} GB/s (the best bus bandwidth "
            f"over message sizes; {f.results['backend']} between processes of this host)")
        src["collective_efficiency_by_mbytes"] = f"fitted bus bandwidth / link bandwidth by transferred MB: {fit_note}"
        src["collective_time_scale_by_op_mbytes"] = (
            "per op and message MB: measured median time / the ring fit's (latency, bandwidth, efficiency and "
            "reduce-scatter ratio above), median over group sizes; applied inside a node only. After it the "
            f"collectives' residuals are {_pct(residuals['collectives']['median_abs_rel_error'])} median (in sample)")
    else:
        for field in ("intra_node_latency_us", "nvlink_bandwidth_bidirectional_gbytes_per_s",
                      "collective_efficiency_by_mbytes"):
            src[field] = f"kept from {base_name}: one process, no collective to measure"
    src["reduce_scatter_relative_bandwidth"] = (
        f"median over {rs_points} reduce-scatters of at least 1 MiB of the fitted all-gather bandwidth time / the "
        f"measured time less its latency steps" if rs_points else "no reduce-scatter of 1 MiB or more measured: 1")
    if overlap:
        first = overlap["samples"][0]
        src["comm_compute_overlap"] = (
            f"20 torch.mm {f.primary} alone, an all-reduce of {_bytes(overlap['message_bytes'])} alone "
            f"(e.g. {first['gemm_s'] * 1e3:.3g} and {first['all_reduce_s'] * 1e3:.3g} ms), then both at once (the "
            f"all-reduce async, e.g. {first['both_s'] * 1e3:.3g} ms), {f.who}: hidden share of the shorter, median of "
            f"{len(overlap['samples'])}")
    else:
        src["comm_compute_overlap"] = f"kept from {base_name}: one process, no collective to overlap"
    return src


def _calibration_record(f: _Fits, base_name: str, residuals: Mapping[str, Any], layers: list[dict[str, Any]],
                        lock_raw: Mapping[str, Any]) -> dict[str, Any]:
    """The ``calibration`` block: the command, raw medians, residuals and fits behind the fields."""
    results, coll = f.results, f.coll
    return {
        "command": f"autopar calibrate --nproc {f.nproc} --backend {results['backend']}"
                   + (" --quick" if results.get("quick") else ""),
        "base": base_name,
        "device": results["device"],
        "primary_dtype": f.primary,
        "collective_impl": results.get("collective_impl", {}),
        "residuals": residuals,
        "collective_fit": {"latency_us": coll.latency_s * 1e6, "bandwidth_gbytes_per_s": coll.bytes_per_s / 1e9,
                           "iterations": coll.iterations} if coll else None,
        "sweep": results.get("sweep", {}),
        "wall_s": results.get("wall_s", {}),
        "gemm": [_raw(p, "m", "k", "n", "holdout") for p in results["gemm"]],
        "dtypes": [_raw(p, "dtype", "m", "k", "n") for p in results["dtypes"]],
        "memory": [{**_raw(p, "op", "tensor_bytes", "bytes"), "backward": bool(p.get("backward"))}
                   for p in results["memory"]],
        "attention": [_raw(p, "batch", "heads", "seq_len", "head_dim", "flops", "backward")
                      for p in results.get("attention", [])],
        "collectives": [_raw(p, "op", "group_size", "bytes") for p in results["collectives"]],
        "layers": layers,
        "overlap": f.overlap,
        **lock_raw,
    }


def _reduce_scatter_ratio(points: list[Mapping[str, Any]], profile: Mapping[str, Any]) -> tuple[float, int]:
    """Reduce-scatter bandwidth / all-gather bandwidth: for each reduce-scatter of ≥ 1 MiB, the fitted
    all-gather bandwidth term over the measured time less the latency steps; the median, and how many."""
    hw = hardware_from_dict(profile)
    link = comm.intra_node_link(hw)
    ratios = []
    for p in points:
        if p["op"] == "reduce_scatter" and p["bytes"] >= 1 << 20:
            latency = (p["group_size"] - 1) * hw.intra_node_latency_s
            ratios.append((comm.all_gather_time(p["bytes"], p["group_size"], link, hw) - latency)
                          / max(p["seconds"] - latency, 1e-9))
    if not ratios:
        return 1.0, 0
    ratios.sort()
    return min(4.0, max(0.05, ratios[len(ratios) // 2])), len(ratios)


def _residuals(results: Mapping[str, Any], hw: HardwareProfile, dtype: str) -> dict[str, Any]:
    """Cost-model prediction vs measured median, per suite (and per op where one number serves many ops),
    for the profile as written."""
    out: dict[str, Any] = {}
    for key, holdout in (("gemm", False), ("gemm_holdout", True)):
        pts = [p for p in results["gemm"] if p["holdout"] == holdout]
        pred = [compute.gemm_time(2 * p["m"] * p["k"] * p["n"], 2 * p["k"] * p["n"], p["m"], hw, dtype) for p in pts]
        out[key] = summarize(relative_errors(pred, [p["seconds"] for p in pts]))
    mem = results["memory"]
    out["memory"] = _by_op(mem, [_memory_prediction(p, hw) for p in mem])
    light = light_points(mem)
    mix = [[p for p in light if p["tensor_bytes"] == s] for s in sorted({p["tensor_bytes"] for p in light})]
    out["memory_mix"] = summarize(relative_errors([compute.memory_time(sum(p["bytes"] for p in ps), hw) for ps in mix],
                                                  [sum(p["seconds"] for p in ps) for ps in mix]))
    attention = results.get("attention", [])
    if attention and hw.kernels.attention:
        out["attention"] = summarize(relative_errors(
            [compute.attention_time(p["flops"], hw, dtype) * (1 + (hw.kernels.attention_backward if p["backward"] else 0))
             for p in attention], [p["seconds"] for p in attention]))
    out["collectives"] = _collective_residuals(results["collectives"], hw)
    return out


def _collective_residuals(points: list[Mapping[str, Any]], hw: HardwareProfile) -> dict[str, Any]:
    link = comm.intra_node_link(hw)
    return _by_op(points, [predict_collective(p["op"], p["group_size"], p["bytes"], link, hw) for p in points])


def _collective_scales(points: list[Mapping[str, Any]], hw: HardwareProfile) -> dict[str, list[list[float]]]:
    """Per op and message size: measured time / the ring fit's (median over group sizes), as the profile's
    ``collective_time_scale_by_op_mbytes`` (MB, factor) table, each factor kept within [0.1, 10]."""
    link = comm.intra_node_link(hw)
    ratios: dict[str, dict[float, list[float]]] = {}
    for p in points:
        predicted = predict_collective(p["op"], p["group_size"], p["bytes"], link, hw)
        ratios.setdefault(p["op"], {}).setdefault(p["bytes"], []).append(p["seconds"] / predicted)
    return {op: [[sig(nbytes / 1e6), sig(min(10.0, max(0.1, statistics.median(r))))]
                 for nbytes, r in sorted(by_size.items())] for op, by_size in sorted(ratios.items())}


def _memory_prediction(p: Mapping[str, Any], hw: HardwareProfile) -> float:
    """The cost model's time for one element-wise kernel point (forward, or forward + backward)."""
    mix = None if p["op"] in LIGHT else {p["op"]: 1.0}
    fwd, bwd = compute.memory_times(p["bytes"], hw, mix)
    return fwd + bwd if p.get("backward") else fwd


def _by_op(points: list[Mapping[str, Any]], predicted: list[float]) -> dict[str, Any]:
    errors = relative_errors(predicted, [p["seconds"] for p in points])
    ops = sorted({p["op"] for p in points})
    return {**summarize(errors),
            "by_op": {op: summarize([e for e, p in zip(errors, points) if p["op"] == op]) for op in ops}}


def predict_collective(op: str, n: int, nbytes: float, link: comm.Link, hw: HardwareProfile) -> float:
    """The cost model's time for one measured collective."""
    if op == "all_reduce":
        return comm.all_reduce_time(nbytes, n, link, hw)
    if op == "all_gather":
        return comm.all_gather_time(nbytes, n, link, hw)
    if op == "reduce_scatter":
        return comm.reduce_scatter_time(nbytes, n, link, hw)
    if op == "send_recv":
        return comm.p2p_time(nbytes, link, hw)
    raise ValueError(f"unknown collective {op}")


def _raw(p: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {**{k: p[k] for k in keys}, "seconds": sig(p["seconds"], 5), "per_rank": [sig(s, 5) for s in p["per_rank"]]}


def _worst(res: Mapping[str, Any]) -> str:
    """The ops the one-size-fits-all model fits worst, by median error."""
    ops = sorted(res["by_op"].items(), key=lambda kv: -kv[1]["median_abs_rel_error"])
    return "median by op: " + ", ".join(f"{op} {_pct(r['median_abs_rel_error'])}" for op, r in ops)


def _rounds(results: Mapping[str, Any]) -> str:
    return str(results.get("sweep", {}).get("rounds", "?"))


def _list(points: tuple[tuple[float, float], ...]) -> str:
    return ",".join(f"{x:g}" for x, _ in points)


def _bytes(n: float) -> str:
    for unit, size in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n:g} B"
