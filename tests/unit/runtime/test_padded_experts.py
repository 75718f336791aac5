"""The model-file experts' padded batch (autopar.runtime.dispatch.run_padded) on a rank that received no token: its
experts get zero gradients and the (empty) tokens a gradient, so its backward runs the dispatch's all-to-all as its
ep peers' do. A world-8 pipeline with ep 2 had crashed there ("cannot reshape tensor of 0 elements into shape
[-1, 0, 32]"). One process, a 1-rank gloo group."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from helpers import ROOT


@pytest.fixture
def mesh():  # noqa: ANN201 - a DeviceMesh
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,), mesh_dim_names=("ep",))
    finally:
        dist.destroy_process_group()


def test_a_rank_that_receives_no_token_runs_its_padded_experts_on_nothing(mesh) -> None:  # noqa: ANN001
    from autopar.capture import load_spec
    from autopar.runtime.dispatch import Route, run_padded
    from autopar.runtime.ep import moe_modules, shard_experts

    spec = load_spec(str(ROOT / "examples/moe.py"), {"n_layer": "2", "dim": "32", "n_head": "4", "n_kv_head": "2",
                                                      "vocab_size": "64", "max_seq_len": "16", "n_experts": "4",
                                                      "top_k": "2", "expert_hidden": "16", "style": "mixtral"})
    _, experts, _ = moe_modules(spec.build().get_submodule("layers.0"))
    shard_experts(experts, mesh, 32)
    route = Route(experts=experts, num_experts=4, mesh=mesh, ep_group=mesh.get_group("ep"), tp_group=None,
                  share=False, sequence_parallel=False)
    inbound = torch.zeros(0, 32, requires_grad=True)
    out = run_padded(inbound, torch.zeros(1, 4, dtype=torch.long), route)
    out.sum().backward()
    assert out.shape == (0, 32) and inbound.grad is not None and inbound.grad.shape == (0, 32)
    assert all(p.grad is not None and p.grad.to_local().abs().sum() == 0 for p in experts.parameters())
