"""Which layers each pipeline model chunk holds, when the caller does not say.

Megatron-LM splits the transformer blocks evenly across model chunks (``get_num_layers_to_build``) and
puts the embedding on the first chunk, the final norm and LM head on the last. When the blocks do not
divide evenly, the first chunks get one more block (our choice; Megatron would refuse). A model without
repeated blocks (or with fewer blocks than chunks) is split so that layer counts are as even as possible.
Chunk c of pp × v runs on device c mod pp (Megatron's interleaved assignment).
"""
from __future__ import annotations

from typing import Sequence

from cost_models.model import LayerLike


def stage_layer_counts(layers: Sequence[LayerLike], chunks: int) -> tuple[int, ...]:
    """Layers per chunk, in order, summing to len(layers)."""
    n = len(layers)
    blocks = [i for i, layer in enumerate(layers) if layer.kind == "block"]
    if len(blocks) < chunks or blocks != list(range(blocks[0], blocks[-1] + 1)):
        return _even(n, chunks)
    per_chunk = _even(len(blocks), chunks)
    counts = list(per_chunk)
    counts[0] += blocks[0]                 # embedding and anything before the first block
    counts[-1] += n - 1 - blocks[-1]       # final norm, head, anything after the last block
    return tuple(counts)


def chunk_ranges(counts: Sequence[int]) -> list[range]:
    ranges, start = [], 0
    for c in counts:
        ranges.append(range(start, start + c))
        start += c
    return ranges


def _even(n: int, parts: int) -> tuple[int, ...]:
    base, extra = divmod(n, parts)
    return tuple(base + (1 if i < extra else 0) for i in range(parts))
