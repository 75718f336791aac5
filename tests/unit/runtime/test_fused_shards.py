"""Fused column-parallel linears (Phi-3's q|k|v and gate|up rows): each tp rank holds its block of every projection
(``_StridedShard``), and the runtime places full values into such a shard (initialisation, weight files) as DTensor
places them. Each rank is played in this process on a fake process group (no communication). Training under tp
against one process: tests/integration/test_hf_plans.py (the ``phi3`` family)."""
from __future__ import annotations

import contextlib
from typing import Iterator

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.distributed.tensor.placement_types import _StridedShard
from torch.testing._internal.distributed.fake_pg import FakeStore

from autopar.errors import AutoparError
from autopar.profile import fused_parts
from autopar.runtime.init import local_box, local_part


@contextlib.contextmanager
def _rank(rank: int, world: int) -> Iterator[None]:
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _shard(shape: tuple[int, ...], mesh_shape: tuple[int, ...], placements: tuple) -> torch.Tensor:
    mesh = init_device_mesh("cpu", mesh_shape)
    return distribute_tensor(torch.empty(shape), mesh, placements, src_data_rank=None)


@pytest.mark.parametrize("parts,ranks", [(3, 2), (2, 2), (3, 4), (2, 4)])
def test_a_strided_shard_holds_its_block_of_each_projection(parts: int, ranks: int) -> None:
    full = torch.arange(parts * ranks * 3 * 5, dtype=torch.float32).reshape(-1, 5)
    rows = full.shape[0] // (parts * ranks)
    for rank in range(ranks):
        with _rank(rank, ranks):
            got = local_part(_shard(tuple(full.shape), (ranks,), (_StridedShard(0, split_factor=parts),)), full)
        # projection p's rows [p·R·rows, (p+1)·R·rows): this rank's block of each, in order
        expected = torch.cat([full[(p * ranks + rank) * rows:(p * ranks + rank + 1) * rows] for p in range(parts)])
        assert torch.equal(got, expected)


def test_each_rank_gets_its_heads_of_q_k_and_v() -> None:
    """4 heads of width 2, q|k|v rows, over tp 2: rank 1 holds heads 2 and 3 of each."""
    rows = torch.arange(3 * 4 * 2).float()  # q rows 0-7, k 8-15, v 16-23
    with _rank(1, 2):
        got = local_part(_shard((24,), (2,), (_StridedShard(0, split_factor=3),)), rows)
    assert got.tolist() == [4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23]


def test_fsdp2_over_a_strided_shard_holds_its_input_features_of_the_tp_ranks_rows() -> None:
    """FSDP2 over tp (dp 2 × tp 2) shards a fused weight on its input features (autopar.runtime.data_parallel): dp
    rank 1 of tp rank 0 holds the second half of the columns of heads 0-1's q|k|v rows; the four parts hold every
    element once, and each is what DTensor's own placements select."""
    full = torch.arange(24 * 4).float().reshape(24, 4)  # q rows 0-7, k 8-15, v 16-23: heads of width 2
    placements = (Shard(1), _StridedShard(0, split_factor=3))
    parts = {}
    for rank in range(4):
        with _rank(rank, 4):
            shard = _shard((24, 4), (2, 2), placements)
            parts[rank] = local_part(shard, full)
            assert torch.equal(parts[rank], distribute_tensor(full, shard.device_mesh, placements,
                                                              src_data_rank=None).to_local())
    rows = [0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19]
    assert torch.equal(parts[2], full[rows][:, 2:])  # (dp, tp) = (1, 0)
    assert sorted(torch.cat([p.flatten() for p in parts.values()]).tolist()) == full.flatten().tolist()


def test_a_box_is_refused_for_a_strided_shard() -> None:
    with _rank(0, 2):
        with pytest.raises(AutoparError, match="local_part"):
            local_box(_shard((12,), (2,), (_StridedShard(0, split_factor=3),)))


def test_the_fused_linears_are_phi_3s_only() -> None:
    """By the module's class and the linear's name: another model's ``qkv_proj`` (CodeGen's groups, a model file's
    per-head interleave) is one projection to the runtime (a strided shard would mix its heads)."""
    import torch.nn as nn

    Phi3Attention = type("Phi3Attention", (nn.Module,), {})
    attention = Phi3Attention()
    attention.qkv_proj = nn.Linear(2, 6)
    other = nn.Module()
    other.qkv_proj = nn.Linear(2, 6)
    root = nn.ModuleDict({"a": attention, "b": other})
    assert fused_parts(root, "a.qkv_proj") == 3 and fused_parts(root, "b.qkv_proj") == 1
    assert fused_parts(attention, "qkv_proj") == 3


def test_a_checkpoint_holds_each_projection_of_a_fused_weight_as_its_own_entry() -> None:
    """The same keys under every plan (one process here; under tp each entry is the projection's rows sharded on
    tp): views of the weight and of its optimizer state, the step count kept by each."""
    from autopar.runtime.checkpoint import projections

    qkv, o = torch.arange(12.0).reshape(6, 2), torch.ones(2, 2)
    state = projections({"l.attn.qkv_proj.weight": qkv, "l.attn.o_proj.weight": o}, {"l.attn.qkv_proj.weight": 3})
    assert sorted(state) == ["l.attn.o_proj.weight", "l.attn.qkv_proj.weight/0", "l.attn.qkv_proj.weight/1",
                             "l.attn.qkv_proj.weight/2"]
    assert state["l.attn.qkv_proj.weight/1"].tolist() == [[4.0, 5.0], [6.0, 7.0]]
    state["l.attn.qkv_proj.weight/2"].zero_()  # a load writes into the weight
    assert qkv[4:].abs().sum() == 0
    step = torch.tensor(3.0)
    optim = projections({"l.mlp.gate_up_proj.weight": {"exp_avg": torch.zeros(4, 2), "step": step}},
                        {"l.mlp.gate_up_proj.weight": 2})
    assert sorted(optim) == ["l.mlp.gate_up_proj.weight/0", "l.mlp.gate_up_proj.weight/1"]
    assert all(part["exp_avg"].shape == (2, 2) and part["step"] is step for part in optim.values())
