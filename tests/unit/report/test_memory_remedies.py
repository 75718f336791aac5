"""The "does not fit" note suggests only what the plan does not already do (autopar/pricing.memory_remedies)."""
from __future__ import annotations

from autopar.pricing import memory_remedies
from cost_models import ParallelConfig


def test_the_note_leaves_out_what_the_plan_already_does(llama):
    base = dict(tp=1, pp=1, dp=2, num_microbatches=1)
    assert memory_remedies(ParallelConfig(**base, micro_batch_size=2, recompute="none", zero_stage=1), llama) == (
        "raise --tp or --pp, use --recompute full, a higher --zero-stage, or a smaller --micro-batch-size")
    assert memory_remedies(ParallelConfig(**base, micro_batch_size=1, recompute="full", zero_stage=3), llama) == (
        "raise --tp or --pp")
    assert memory_remedies(ParallelConfig(**base, micro_batch_size=1, recompute="full", zero_stage=1), llama) == (
        "raise --tp or --pp, or a higher --zero-stage")
