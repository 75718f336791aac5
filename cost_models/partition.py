"""Which layers each pipeline model chunk holds, when the caller does not say.

Megatron-LM splits the transformer blocks evenly across model chunks (``get_num_layers_to_build``) and
puts the embedding on the first chunk, the final norm and LM head on the last. When the blocks do not
divide evenly, the first chunks get one more block (our choice; Megatron would refuse). A model without
repeated blocks (or with fewer blocks than chunks) is split so that layer counts are as even as possible.
Chunk c of pp × v runs on device c mod pp (Megatron's interleaved assignment).

Under the interleaved schedule the chunks hold equal numbers of blocks, to one (``interleaved_balance``):
its bubble, (p − 1)/v of a device's time per micro-batch (Narayanan et al. 2021 §2.2.2), is that of chunks
each 1/v of their device's work. Megatron-LM requires it (its layers divide evenly over pp × v chunks); the
formula does not see uneven chunks, so without the rule the solver chose one-block chunks around a few
heavy ones, a bubble the schedule does not have.
"""
from __future__ import annotations

from typing import Sequence

from cost_models.model import LayerLike, decoder_blocks, is_decoder_block


def stage_layer_counts(layers: Sequence[LayerLike], chunks: int) -> tuple[int, ...]:
    """Layers per chunk, in order, summing to len(layers), no cut after a layer one chunk holds with the next
    (``off_held``)."""
    n = len(layers)
    blocks = decoder_blocks(layers)
    if len(blocks) < chunks or blocks != list(range(blocks[0], blocks[-1] + 1)):
        return off_held(layers, _even(n, chunks))
    per_chunk = _even(len(blocks), chunks)
    counts = list(per_chunk)
    counts[0] += blocks[0]                 # embedding and anything before the first block
    counts[-1] += n - 1 - blocks[-1]       # MTP layers, final norm, head, anything after the last block
    return off_held(layers, tuple(counts))


def forbidden_cuts(layers: Sequence[LayerLike]) -> frozenset[int]:
    """Cut positions p (after layer p − 1) no pipeline may take: after a layer whose ``pipeline_cut_after`` is False
    (a vision tower that one chunk holds whole: autopar.capture.towers)."""
    return frozenset(i + 1 for i, layer in enumerate(layers) if not getattr(layer, "pipeline_cut_after", True))


def off_held(layers: Sequence[LayerLike], counts: tuple[int, ...]) -> tuple[int, ...]:
    """``counts`` with each cut after a layer whose ``pipeline_cut_after`` is False (a vision tower one chunk holds
    whole: autopar.capture.towers) moved to the next position allowed after the previous cut, else the last one
    before it; unchanged where no such layout exists (the launcher refuses it)."""
    n, forbidden = len(layers), forbidden_cuts(layers)
    if not forbidden:
        return counts
    allowed = [p for p in range(1, n) if p not in forbidden]
    cuts, start = [], 0
    for size in counts[:-1]:
        start += size
        prev = cuts[-1] if cuts else 0
        later = [p for p in allowed if p >= start and p > prev]
        earlier = [p for p in allowed if prev < p < start]
        if not later and not earlier:
            return counts
        cuts.append(later[0] if later else earlier[-1])
    bounds = [0, *cuts, n]
    return tuple(b - a for a, b in zip(bounds, bounds[1:]))


def chunk_blocks(layers: Sequence[LayerLike], counts: Sequence[int]) -> list[int]:
    """The model's own blocks in each chunk of a layout (layers per chunk, in order; MTP layers not counted)."""
    out, start = [], 0
    for c in counts:
        out.append(sum(1 for layer in layers[start:start + c] if is_decoder_block(layer)))
        start += c
    return out


def interleaved_balance(layers: Sequence[LayerLike], chunks: int) -> tuple[int, int] | None:
    """(fewest, most) blocks a chunk may hold under the interleaved schedule: equal to one; None where the
    model's blocks are fewer than the chunks or not contiguous (no even split exists: any layout goes). An MTP
    layer is not counted: Megatron-LM places it on the last chunk on top of that chunk's share."""
    blocks = decoder_blocks(layers)
    if len(blocks) < chunks or blocks != list(range(blocks[0], blocks[-1] + 1)):
        return None
    return len(blocks) // chunks, -(-len(blocks) // chunks)


def chunk_ranges(counts: Sequence[int]) -> list[range]:
    ranges, start = [], 0
    for c in counts:
        ranges.append(range(start, start + c))
        start += c
    return ranges


def _even(n: int, parts: int) -> tuple[int, ...]:
    base, extra = divmod(n, parts)
    return tuple(base + (1 if i < extra else 0) for i in range(parts))
