"""Interchangeable chunks: one device's chunks inside a run of identical blocks may trade sizes, so the inner model
keeps them in size order; the optimum must not move."""
from __future__ import annotations

import random
from dataclasses import replace

from autopar.search.cpsat import MODES, InnerModel, solve_inner
from autopar.search.cuts import Segment, canonical, interchangeable_chunks
from cost_models import CostModel, ParallelConfig
from cost_models.partition import stage_layer_counts
from helpers.builders import A100 as HW
from helpers.builders import random_profile


def test_pairs_lie_in_one_run_whatever_the_cuts() -> None:
    # embedding, 20 identical blocks, head; pp 2 × v 3 = 6 chunks: cut c lies in [c, 16 + c]
    segs = [Segment(0, 1), Segment(1, 20), Segment(21, 1)]
    assert interchangeable_chunks(segs, pp=2, chunks=6, n_layers=22) == [(1, 3), (2, 4)]
    # chunk 3 and chunk 5 could reach the head: not interchangeable; a run split in two kinds: none
    assert interchangeable_chunks([Segment(0, 1), Segment(1, 10), Segment(11, 10), Segment(21, 1)],
                                  pp=2, chunks=6, n_layers=22) == []


def test_canonical_sorts_each_pair() -> None:
    assert canonical((1, 2, 3, 4, 5, 6), [(1, 3), (2, 4)]) == (1, 4, 5, 2, 3, 6)
    assert canonical((1, 3, 3, 1), []) == (1, 3, 3, 1)


def _one_kind(seed: int, blocks: int):  # noqa: ANN202 - a ModelProfile
    """A random model whose blocks are all alike (one long run)."""
    profile = random_profile(random.Random(seed), blocks)
    block = next(lp for lp in profile.layers if lp.kind == "block")
    layers = [profile.layers[0], *(block.model_copy(update={"index": i + 1, "name": f"blocks.{i}"})
                                   for i in range(blocks)), profile.layers[-1].model_copy(update={"index": blocks + 1})]
    return profile.model_copy(update={"layers": layers})


def test_breaking_symmetry_keeps_the_optimum() -> None:
    """The optimum with the size order equals the optimum without it, on interleaved choices where memory makes
    devices differ (1F1B's first devices hold more micro-batches), for several seeds and depths."""
    compared = recomputing = 0
    for seed in range(8):
        rng = random.Random(seed)
        profile = _one_kind(seed, rng.choice([18, 22, 26]))
        single = CostModel(profile, HW).evaluate(ParallelConfig(tp=1, pp=1, dp=1, micro_batch_size=1, num_microbatches=8,
                                                                recompute="none"))
        hw = replace(HW, memory_bytes=int(HW.memory_reserve_bytes + (single.peak_memory_bytes - HW.memory_reserve_bytes)
                                          * rng.uniform(0.35, 0.6)))
        cost = CostModel(profile, hw)
        pp, v = rng.choice([(2, 3), (2, 4), (3, 2), (4, 2)])
        cfg = ParallelConfig(tp=1, pp=pp, dp=1, micro_batch_size=1, num_microbatches=2 * pp, recompute="none",
                             schedule="interleaved", virtual_stages=v)
        kept = solve_inner(cost, cfg, modes=MODES, time_limit_s=30, threads=2,
                           hint=stage_layer_counts(profile.layers, cfg.chunks))
        plain = InnerModel(cost, cfg, MODES, None).solve(30, 2)
        assert kept.status == plain.status, (seed, kept.status, plain.status)
        if plain.objective_s is None:
            continue
        broken = InnerModel(cost, cfg, MODES, None)
        broken.break_symmetry()
        assert broken.symmetric, (seed, pp, v)  # the check is not vacuous
        assert kept.status == "OPTIMAL" and abs(kept.objective_s - plain.objective_s) <= 1e-9 * plain.objective_s, \
            (seed, kept.objective_s, plain.objective_s)
        compared += 1
        recomputing += any(mode != "none" for mode in kept.layer_recompute)
    assert compared >= 6 and recomputing >= 3, (compared, recomputing)  # memory binds in most


def test_the_default_split_keeps_off_layers_one_chunk_holds() -> None:
    """Where no plan gives the layout (autopar estimate, the solver's first pass), the even split moves a cut that
    falls inside a vision tower one chunk holds whole (LayerProfile.pipeline_cut_after) to the next allowed position."""
    profile = random_profile(random.Random(0), n_blocks=8)
    even = stage_layer_counts(profile.layers, 2)
    held = {sum(even[:1]) - 2, sum(even[:1]) - 1}  # the layers before the even cut and the one before that
    layers = [lp.model_copy(update={"pipeline_cut_after": False}) if i in held else lp
              for i, lp in enumerate(profile.layers)]
    counts = stage_layer_counts(layers, 2)
    assert sum(counts) == len(layers) and all(counts)
    assert counts[0] == even[0] + 1  # the cut moved past the held layers, to the first allowed position
    every = [lp.model_copy(update={"pipeline_cut_after": False}) for lp in profile.layers]
    assert stage_layer_counts(every, 2) == even  # no allowed layout: unchanged (the launcher refuses it)
