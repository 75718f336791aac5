"""Sequence blocks of unequal length (a ViT's 197 tokens over tp 2: 99 and 98): the runtime's blocks are the ones
DTensor's ``Shard`` holds, so that a block wrapped as a DTensor of the whole sequence's length gathers back to the
sequence. Each rank is played in this process on a fake process group (no communication). Training under tp + SP
against one process: tests/integration/test_hf_plans.py (the ``vit`` family, 17 tokens)."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.testing._internal.distributed.fake_pg import FakeStore

from autopar.runtime.sequence import _block, block_sizes


@pytest.mark.parametrize("total,parts", [(16, 2), (17, 2), (197, 2), (197, 4), (17, 4), (5, 4), (577, 8)])
def test_blocks_are_dtensors_shards(total: int, parts: int) -> None:
    sizes = block_sizes(total, parts)
    assert sum(sizes) == total and all(size >= 0 for size in sizes)
    x = torch.arange(2 * total, dtype=torch.float32).reshape(2, total, 1)
    start = 0
    for rank in range(parts):
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=parts)
        try:
            mesh = init_device_mesh("cpu", (parts,))
            shard = distribute_tensor(torch.empty(2, total, 1), mesh, [Shard(1)], src_data_rank=None)
            assert shard.to_local().shape[1] == sizes[rank], (rank, sizes)
            block = _block(x, dist.group.WORLD)
        finally:
            dist.destroy_process_group()
        assert torch.equal(block, x[:, start:start + sizes[rank]])
        start += sizes[rank]


def test_equal_blocks_where_the_sequence_divides() -> None:
    assert block_sizes(16, 4) == [4, 4, 4, 4]
    assert block_sizes(17, 2) == [9, 8]
    assert block_sizes(5, 4) == [2, 2, 1, 0]  # torch.chunk's blocks, the last rank's empty
