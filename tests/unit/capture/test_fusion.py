"""The memory-bound traffic of a layer as torch.compile runs it (autopar/capture/fusion.py): hand-checked on small
graphs, and what it leaves of a Llama block's."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from autopar.capture import capture_graph

CHAIN = textwrap.dedent('''
    import torch, torch.nn as nn
    class Blk(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(8, 16, bias=False)
            self.fc2 = nn.Linear(16, 8, bias=False)
        def forward(self, x):
            return self.fc2(BODY)
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blk = Blk()
            self.out = nn.Linear(8, 2, bias=False)
        def forward(self, x):
            return self.out(self.blk(x))
    def build_model():
        return Net()
    def example_inputs(batch_size, seq_len):
        return (torch.randn(batch_size, 8),)
''')


@pytest.mark.parametrize("body, fused", [
    # sin, ×3, +1 on fc1's 16 fp32 features (64 B): eager reads and writes each (3 × 128 B); fused, one read of fc1's
    # output and one write of what fc2 reads (sin saves its input, fc1's output, already in memory)
    ("torch.sin(self.fc1(x)) * 3.0 + 1.0", 128.0),
    # the second sin saves the first one's output for its backward: not written, recomputed from the run's input
    ("torch.sin(torch.sin(self.fc1(x))) + 1.0", 128.0),
])
def test_a_run_of_element_wise_ops_moves_its_inputs_and_outputs_once(tmp_path: Path, body: str, fused: float) -> None:
    path = tmp_path / "chain.py"
    path.write_text(CHAIN.replace("BODY", body))
    blk = capture_graph(str(path), dtype="fp32").profile.layers[0]
    assert blk.name == "blk"
    assert blk.fwd_memory_bytes_per_sample == 384.0
    assert blk.fwd_fused_memory_bytes_per_sample == fused


def test_a_residual_add_after_a_gemm_does_not_fuse_with_the_ops_before_it(tmp_path: Path) -> None:
    """h = 2x feeds fc1 and the residual add after fc2: the add runs after two GEMMs the multiply runs before, so
    they are separate kernels, each moving what eager moves (32 B a tensor): the multiply 64, sin 128, the add 96."""
    path = tmp_path / "residual.py"
    path.write_text(CHAIN.replace("return self.fc2(BODY)", "h = x * 2.0\n        return h + self.fc2(torch.sin(self.fc1(h)))"))
    blk = capture_graph(str(path), dtype="fp32").profile.layers[0]
    assert blk.fwd_memory_bytes_per_sample == blk.fwd_fused_memory_bytes_per_sample == 288.0


def test_a_llama_block_fused_moves_less_than_eager_and_at_least_its_input_and_output(llama) -> None:
    """Fusion never adds traffic; a block still reads its input and writes its output at least once."""
    for layer in llama.layers:
        assert layer.fwd_fused_memory_bytes_per_sample <= layer.fwd_memory_bytes_per_sample
    block = next(lp for lp in llama.layers if lp.kind == "block")
    assert block.fwd_fused_memory_bytes_per_sample < 0.6 * block.fwd_memory_bytes_per_sample
    assert block.fwd_fused_memory_bytes_per_sample >= 2 * block.input_bytes_per_sample
