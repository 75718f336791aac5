"""A layer's share of the per-step work: data-parallel gradient sync, optimizer step, ZeRO state and traffic, the
copies FSDP makes on the compute stream and the buffers it gathers into (comm.py, memory.py, compute.py hold the
terms; this module adds them up for ``own`` parameters on one GPU and ``copy`` parameters of a tied copy)."""
from __future__ import annotations

from cost_models import comm
from cost_models.compute import memory_time, optimizer_time_per_param
from cost_models.hardware import HardwareProfile
from cost_models.layer_cost import StepWork
from cost_models.memory import model_state_bytes
from cost_models.precision import Precision


def layer_step_work(own: float, copy: float, *, dp: int, zero_stage: int, precision: Precision, link: comm.Link,
                    accumulating: bool, hw: HardwareProfile, gather_overlap: bool = False) -> StepWork:
    """The step work of ``own`` parameters on one GPU and ``copy`` tied ones, reduced and sharded over ``dp`` GPUs
    joined by ``link``; ``accumulating``: the step holds whole gradients (memory.accumulates_unsharded). Its lock-step
    sync and tied-copy sync, which need the layer's compute and the pipeline's link, are the caller's.
    ``gather_overlap``: ZeRO-1/2's gather of the updated parameters runs beside the next step's forward (Megatron-Core
    --overlap-param-gather, layer by layer as the forward reaches it), priced as hidden like the gradient sync: under
    the same share of compute (an approximation: the forward it hides behind is not the last backward)."""
    over, exposed = comm.dp_step_rates(dp=dp, zero_stage=zero_stage, param_bytes=precision.param_bytes,
                                       grad_bytes=precision.grad_bytes, link=link, hw=hw)
    if gather_overlap:
        over, exposed = over + exposed, 0.0
    opt = optimizer_time_per_param(precision.optimizer_traffic_bytes, hw) / (dp if zero_stage >= 1 else 1)
    state = model_state_bytes(own, precision, dp=dp, zero_stage=zero_stage, accumulating=accumulating)
    tied = model_state_bytes(copy, precision, dp=dp, zero_stage=zero_stage, accumulating=accumulating)
    zero3 = zero3_tied = edge = 0.0
    copies = (0.0, 0.0)
    if zero_stage == 3:
        zero3, zero3_tied = (comm.zero3_layer_time(n, dp=dp, param_bytes=precision.param_bytes,
                                                   grad_bytes=precision.grad_bytes, link=link, hw=hw) for n in (own, copy))
        edge = comm.zero3_edge_time(own, dp=dp, param_bytes=precision.param_bytes, grad_bytes=precision.grad_bytes,
                                    link=link, hw=hw)
        if dp > 1:
            copies = zero3_copy_times(own, precision, hw)
    return StepWork(state_params_bytes=state[0], state_grads_bytes=state[1], state_optimizer_bytes=state[2],
                    tied_state_params_bytes=tied[0], tied_state_grads_bytes=tied[1], tied_state_optimizer_bytes=tied[2],
                    dp_overlappable_s=over * own, dp_exposed_s=exposed * own, optimizer_s=opt * own,
                    tied_dp_overlappable_s=over * copy, tied_dp_exposed_s=exposed * copy, tied_optimizer_s=opt * copy,
                    zero3_s=zero3, zero3_tied_s=zero3_tied, zero3_edge_s=edge, zero3_copy_fwd_s=copies[0],
                    zero3_copy_bwd_s=copies[1])


def zero3_copy_times(params_per_gpu: float, precision: Precision, hw: HardwareProfile) -> tuple[float, float]:
    """(forward, backward) seconds a layer's ZeRO-3 copies take on the compute stream (hardware.ZERO3_COPIES).
    FSDP2 (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py): each all-gather's output copied out into the
    parameters, before the forward and again before the backward (foreach_all_gather_copy_out: the gathered bytes
    read and written); after the backward, the unsharded gradients copied into the reduce-scatter's input (foreach_
    reduce_scatter_copy_in, before the reduce-scatter stream waits on the compute stream: read in the compute dtype,
    written in the gradient dtype). FSDP1 (torch/distributed/fsdp/_flat_param.py): the parameters are torch.split
    views of the flat parameter, whose backward concatenates their gradients into the flat gradient (read and
    written in the gradient dtype); its all-gather writes into the flat parameter itself."""
    if hw.zero3_copies == "per_parameter":
        out = memory_time(2 * params_per_gpu * precision.param_bytes, hw)
        return out, out + memory_time(params_per_gpu * (precision.param_bytes + precision.grad_bytes), hw)
    if hw.zero3_copies == "flat":
        return 0.0, memory_time(2 * params_per_gpu * precision.grad_bytes, hw)
    return 0.0, 0.0


def zero3_buffer_bytes(params_per_gpu: float, precision: Precision) -> float:
    """ZeRO-3's unsharded buffers of a layer at its peak, in its backward: its gathered parameters and the
    next one's, prefetched; its unsharded gradients in the compute dtype and the reduce-scatter's input in the
    gradient dtype (PyTorch FSDP2 ``foreach_reduce``, torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:
    the reduce-scatter input is allocated in the reduce dtype)."""
    return params_per_gpu * (3 * precision.param_bytes + precision.grad_bytes)
