"""How sure a prediction is: every hardware-profile field that prices time carries a relative uncertainty (the
profile's ``uncertainty``: from its source, or from a calibration's fit residuals), and a profile can be moved to
either end of it.

The fields fall in two groups, compute (peak, GEMM and kernel efficiencies, HBM) and communication (links,
latencies, collective efficiencies, overlap); ``perturbed(hw, compute, communication)`` moves each group to its
fast (−1) or slow (+1) end or leaves it (0). A step time only grows when a speed falls or a cost rises, so over
the whole box of uncertainties a plan is fastest at the all-fast corner and slowest at the all-slow one: its range
is those two evaluations, and the plan with the best worst case is the optimum at the all-slow corner.
Memory fields (capacity, reserve, fragmentation) keep their values: a range of step times, not of feasibility.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Mapping

from cost_models.hardware import EfficiencyTable, HardwareProfile, KernelCosts, LockstepCosts, LogTable

COMPUTE, COMMUNICATION = "compute", "communication"
# Scenario names → (compute, communication) direction: −1 fast end, +1 slow end.
CORNERS: dict[str, tuple[int, int]] = {
    "all fast": (-1, -1), "all slow": (1, 1),
    "fast compute, slow communication": (-1, 1), "slow compute, fast communication": (1, -1),
}


def _speed(x: float, u: float, d: int) -> float:
    """A quantity that makes a step faster as it grows (bandwidth, efficiency) at direction d."""
    return x * (1.0 - d * u)


def _cost(x: float, u: float, d: int) -> float:
    """A quantity that makes a step slower as it grows (latency, overhead, slowdown) at direction d."""
    return x * (1.0 + d * u)


def _fraction(x: float, u: float, d: int) -> float:
    """An efficiency or overlap share: a speed kept in [0, 1] (to 3 decimals, as the solver reads shares)."""
    return round(min(1.0, max(0.0, _speed(x, u, d))), 3)


def _eff_table(t: EfficiencyTable, u: float, d: int) -> EfficiencyTable:
    return EfficiencyTable(tuple((x, min(1.0, max(1e-6, _speed(e, u, d)))) for x, e in t.points))


def _cost_table(t: LogTable, u: float, d: int) -> LogTable:
    return LogTable(tuple((x, _cost(v, u, d)) for x, v in t.points))


def _maybe(f: Callable[[float, float, int], float]) -> Callable[[float | None, float, int], float | None]:
    return lambda x, u, d: None if x is None else f(x, u, d)


def _lockstep(ls: LockstepCosts, u: float, d: int) -> LockstepCosts:
    return replace(ls, module_s=_cost(ls.module_s, u, d), op_s=_cost(ls.op_s, u, d),
                   collective_s=_cost(ls.collective_s, u, d))


def _kernels(k: KernelCosts, field: str, u: float, d: int) -> KernelCosts:
    if field == "heavy":
        return replace(k, heavy=tuple((n, _fraction(e, u, d) or 1e-3) for n, e in k.heavy))
    if field == "backward":
        return replace(k, backward=tuple((n, _cost(r, u, d)) for n, r in k.backward))
    if field == "attention":
        return replace(k, attention=_maybe(_fraction)(k.attention, u, d) or k.attention)
    return replace(k, attention_backward=_cost(k.attention_backward, u, d))


# Profile-file field → (group, how it moves the HardwareProfile).
Mover = Callable[[HardwareProfile, float, int], HardwareProfile]
FIELDS: Mapping[str, tuple[str, Mover]] = {
    "peak_dense_tflops": (COMPUTE, lambda hw, u, d: replace(
        hw, peak_flops={k: _speed(v, u, d) for k, v in hw.peak_flops.items()})),
    "hbm_bandwidth_gbytes_per_s": (COMPUTE, lambda hw, u, d: replace(hw, hbm_bytes_per_s=_speed(hw.hbm_bytes_per_s, u, d))),
    "gemm_efficiency_by_mflop_per_token": (COMPUTE, lambda hw, u, d: replace(
        hw, gemm_efficiency=_eff_table(hw.gemm_efficiency, u, d))),
    "fp8_gemm_efficiency_by_mflop_per_token": (COMPUTE, lambda hw, u, d: replace(
        hw, fp8_gemm_efficiency=_eff_table(hw.fp8_gemm_efficiency, u, d) if hw.fp8_gemm_efficiency else None)),
    "fp8_rowwise_gemm_efficiency": (COMPUTE, lambda hw, u, d: replace(
        hw, fp8_rowwise_gemm_efficiency=_fraction(hw.fp8_rowwise_gemm_efficiency, u, d) or hw.fp8_rowwise_gemm_efficiency)),
    "fp8_blockwise_gemm_efficiency": (COMPUTE, lambda hw, u, d: replace(
        hw, fp8_blockwise_gemm_efficiency=_fraction(hw.fp8_blockwise_gemm_efficiency, u, d)
        or hw.fp8_blockwise_gemm_efficiency)),
    "gemm_efficiency_by_rows": (COMPUTE, lambda hw, u, d: replace(
        hw, gemm_rows_efficiency=_eff_table(hw.gemm_rows_efficiency, u, d))),
    "memory_bandwidth_efficiency": (COMPUTE, lambda hw, u, d: replace(
        hw, memory_efficiency=_fraction(hw.memory_efficiency, u, d) or hw.memory_efficiency)),
    "heavy_op_bandwidth_efficiency": (COMPUTE, lambda hw, u, d: replace(
        hw, heavy_memory_efficiency=_maybe(_fraction)(hw.heavy_memory_efficiency, u, d) or hw.heavy_memory_efficiency)),
    "optimizer_bandwidth_efficiency": (COMPUTE, lambda hw, u, d: replace(
        hw, optimizer_efficiency=_maybe(_fraction)(hw.optimizer_efficiency, u, d) or hw.optimizer_efficiency)),
    "dtensor_overhead_us": (COMPUTE, lambda hw, u, d: replace(hw, lockstep=_lockstep(hw.lockstep, u, d))),
    "heavy_op_bandwidth_efficiency_by_kernel": (COMPUTE, lambda hw, u, d: replace(
        hw, kernels=_kernels(hw.kernels, "heavy", u, d))),
    "backward_over_forward_by_kernel": (COMPUTE, lambda hw, u, d: replace(
        hw, kernels=_kernels(hw.kernels, "backward", u, d))),
    "attention_efficiency": (COMPUTE, lambda hw, u, d: replace(hw, kernels=_kernels(hw.kernels, "attention", u, d))),
    "attention_backward_over_forward": (COMPUTE, lambda hw, u, d: replace(
        hw, kernels=_kernels(hw.kernels, "attention_backward", u, d))),
    "flash_attention_efficiency_by_seq": (COMPUTE, lambda hw, u, d: replace(
        hw, flash_attention={k: (_eff_table(t, u, d), r) for k, (t, r) in hw.flash_attention.items()},
        flash_attention_head_dim_64={k: _eff_table(t, u, d) for k, t in hw.flash_attention_head_dim_64.items()})),
    "flash_attention_backward_over_forward": (COMPUTE, lambda hw, u, d: replace(
        hw, flash_attention={k: (t, _cost(r, u, d)) for k, (t, r) in hw.flash_attention.items()})),
    "nvlink_bandwidth_bidirectional_gbytes_per_s": (COMMUNICATION, lambda hw, u, d: replace(
        hw, intra_node_bytes_per_s=_speed(hw.intra_node_bytes_per_s, u, d))),
    "mesh_link_bandwidth_bidirectional_gbytes_per_s": (COMMUNICATION, lambda hw, u, d: replace(
        hw, mesh_link_bytes_per_s=_speed(hw.mesh_link_bytes_per_s, u, d) if hw.mesh_link_bytes_per_s else None)),
    "intra_node_latency_us": (COMMUNICATION, lambda hw, u, d: replace(
        hw, intra_node_latency_s=_cost(hw.intra_node_latency_s, u, d))),
    "nic_bandwidth_gbits_per_s": (COMMUNICATION, lambda hw, u, d: replace(
        hw, inter_node_bytes_per_s=_speed(hw.inter_node_bytes_per_s, u, d))),
    "inter_node_latency_us": (COMMUNICATION, lambda hw, u, d: replace(
        hw, inter_node_latency_s=_cost(hw.inter_node_latency_s, u, d))),
    "host_link_bandwidth_gbytes_per_s": (COMMUNICATION, lambda hw, u, d: replace(
        hw, host_link_bytes_per_s=_speed(hw.host_link_bytes_per_s, u, d))),
    "collective_efficiency_by_mbytes": (COMMUNICATION, lambda hw, u, d: replace(
        hw, collective_efficiency=_eff_table(hw.collective_efficiency, u, d))),
    "comm_compute_overlap": (COMMUNICATION, lambda hw, u, d: replace(hw, comm_overlap=_fraction(hw.comm_overlap, u, d))),
    "zero3_comm_compute_overlap": (COMMUNICATION, lambda hw, u, d: replace(
        hw, zero3_comm_overlap=_maybe(_fraction)(hw.zero3_comm_overlap, u, d))),
    "reduce_scatter_relative_bandwidth": (COMMUNICATION, lambda hw, u, d: replace(
        hw, reduce_scatter_bandwidth_ratio=_speed(hw.reduce_scatter_bandwidth_ratio, u, d))),
    "collective_sync_overhead_us_by_compute_us": (COMMUNICATION, lambda hw, u, d: replace(
        hw, lockstep=replace(hw.lockstep, sync=_cost_table(hw.lockstep.sync, u, d) if hw.lockstep.sync else None))),
    "lockstep_noise_per_rank": (COMMUNICATION, lambda hw, u, d: replace(
        hw, lockstep=replace(hw.lockstep, noise_per_rank=_cost(hw.lockstep.noise_per_rank, u, d)))),
    "collective_time_scale_by_op_mbytes": (COMMUNICATION, lambda hw, u, d: replace(
        hw, collective_scale={op: _cost_table(t, u, d) for op, t in hw.collective_scale.items()})),
    "overlap_compute_slowdown": (COMMUNICATION, lambda hw, u, d: replace(
        hw, overlap_slowdown=_cost(hw.overlap_slowdown, u, d))),
    "collective_base_latency_us": (COMMUNICATION, lambda hw, u, d: replace(
        hw, collective_base_latency_s=_cost(hw.collective_base_latency_s, u, d))),
}


def perturbed(hw: HardwareProfile, compute: int = 0, communication: int = 0) -> HardwareProfile:
    """``hw`` with each field of the compute group moved to the fast (−1) or slow (+1) end of its uncertainty
    (0: left), and likewise the communication group."""
    direction = {COMPUTE: compute, COMMUNICATION: communication}
    out = hw
    for name, u in hw.uncertainty.items():
        if name in FIELDS and u > 0:
            group, move = FIELDS[name]
            if direction[group]:
                out = move(out, u, direction[group])
    return out


def corner(hw: HardwareProfile, name: str) -> HardwareProfile:
    """``hw`` at a named corner of its uncertainty box (CORNERS)."""
    return perturbed(hw, *CORNERS[name])
