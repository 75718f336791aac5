"""How one MoE layer's tokens reach their experts and come back (autopar.runtime.ep builds the route; transformers'
experts run their own grouped GEMMs on what arrives, autopar.runtime.hf_experts): the router's pairs sorted by
owner, one all-to-all over the ep group each way (PyTorch's autograd-aware functional collective), the received
tokens through the local experts, and the weighted sum of each token's kept experts."""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard


@dataclasses.dataclass(frozen=True)
class Route:
    """How one MoE layer's tokens reach its experts from this rank."""

    experts: nn.Module  # the stacked routed experts (this rank's E/ep of them)
    num_experts: int
    mesh: DeviceMesh  # the experts' weights: "ep", or ("ep", "etp")
    ep_group: dist.ProcessGroup
    tp_group: dist.ProcessGroup | None  # the layer's tensor-parallel group, when tp > 1
    share: bool  # etp = 1 < tp: each tp rank dispatches its sequence block of the tokens
    sequence_parallel: bool  # the layer's input is sequence-sharded over tp

    @property
    def ep(self) -> int:
        return self.mesh.size(0)

    @property
    def placements(self) -> tuple[Placement, ...]:
        """Tokens grouped by local expert: sharded over ep like the experts, the same on every etp rank."""
        return (Shard(0),) + (Replicate(),) * (self.mesh.ndim - 1)


def _slots(counts: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Where each received token goes in the (local experts, width) padded batch, and the width (the busiest
    local expert's count). ``counts[r, j]``: tokens source r sent for local expert j, received in (r, j) order."""
    local = counts.shape[1]
    width = int(counts.sum(0).max()) if counts.numel() else 0
    first = torch.arange(local, device=counts.device) * width + (counts.cumsum(0) - counts)  # segment (r, j)
    sizes = counts.reshape(-1)
    starts = sizes.cumsum(0) - sizes
    within = torch.arange(int(sizes.sum()), device=counts.device) - starts.repeat_interleave(sizes)
    return first.reshape(-1).repeat_interleave(sizes) + within, width


def dispatch_combine(tokens: torch.Tensor, weights: torch.Tensor, route: Route, *, routed: torch.Tensor | None = None,
                     run: Callable[[torch.Tensor, torch.Tensor, Route], torch.Tensor] | None = None) -> torch.Tensor:
    """Σ over each token's kept experts of weight · expert(token), the experts running on their owners.
    ``tokens`` (n, hidden), ``weights`` (n, E); ``routed`` (n, E) the pairs that run (default: weight not 0);
    ``run(received tokens, counts (ep, local), route)`` the local experts (default: the model's experts module on
    a padded batch, ``run_padded``; transformers' experts: grouped GEMMs, autopar.runtime.hf_experts)."""
    n, dim = tokens.shape
    ep, local = route.ep, route.num_experts // route.ep
    routed = weights != 0 if routed is None else routed
    expert, token = routed.t().nonzero(as_tuple=True)  # the pairs, sorted by expert: by owner
    counts = routed.sum(0)
    received = torch.empty_like(counts) if ep > 1 else counts
    if ep > 1:  # ep 1 (experts over etp only): every pair stays here
        dist.all_to_all_single(received, counts, group=route.ep_group)
    send = counts.view(ep, local).sum(1).tolist()
    recv = received.view(ep, local).sum(1).tolist()
    inbound = _exchange(tokens[token], recv, send, route)
    done = (run or run_padded)(inbound, received.view(ep, local), route)
    back = _exchange(done, send, recv, route)
    weight = weights[token, expert].unsqueeze(-1).to(tokens.dtype)  # as the model's forward: in the tokens' dtype
    return tokens.new_zeros(n, dim).index_add(0, token, back * weight)


def run_padded(inbound: torch.Tensor, counts: torch.Tensor, route: Route) -> torch.Tensor:
    """The received tokens through the model's experts module, padded to the busiest local expert's count."""
    dim = inbound.shape[-1]
    slots, width = _slots(counts)
    # (local experts, width, dim): width 0 where no token came (a view of -1 would be ambiguous)
    local = counts.shape[1]
    padded = inbound.new_zeros(local * width, dim).index_copy(0, slots, inbound).view(local, width, dim)
    return run_experts(padded, route).reshape(-1, dim)[slots]


def _exchange(x: torch.Tensor, receive: list[int], send: list[int], route: Route) -> torch.Tensor:
    """All-to-all over the ep group: ``send[r]`` rows of ``x`` to rank r, ``receive[r]`` rows from it."""
    if route.ep == 1:
        return x
    return wait_tensor(all_to_all_single_autograd(x, receive, send, route.ep_group))


def run_experts(x: torch.Tensor, route: Route) -> torch.Tensor:
    """The model's experts module on (local experts, width, hidden) tokens: a DTensor on the experts' mesh, so
    the weight shards compute where they are (with etp > 1 DTensor sums the partial outputs over etp)."""
    out = route.experts(DTensor.from_local(x, route.mesh, route.placements, run_check=False))
    return out.redistribute(route.mesh, route.placements).to_local() if isinstance(out, DTensor) else out
