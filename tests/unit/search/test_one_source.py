"""One source of truth: the CP-SAT model and the cost model are the same composition (cost_models/composition.py).

Point-wise, not only at the optimum: random configurations with every flag (ZeRO 0-3, sequence parallelism,
activation offload, GPipe / 1F1B / interleaved, tied weights across stages, per-layer tp degrees and
recomputation, mixture-of-experts layers under expert parallelism, context parallelism with either exchange, lock-step
costs, partial overlap) have their cuts and per-layer options fixed in the solver by
constraint; the solver's value of every term must equal the cost model's evaluation of that configuration.
"""
from __future__ import annotations

import dataclasses
import random
from dataclasses import replace

import pytest

from autopar.errors import ModelMismatch
from autopar.profile import CaptureInfo, LayerProfile, ModelProfile, TPPair, TPPattern
from autopar.search.brute import compositions
from autopar.search.cpsat import MODES, InnerResult, block_degrees, solve_inner
from autopar.search.guard import check_solution, rounding_tolerance_s
from autopar.search.space import Pins, expert_choices
from cost_models import CostModel, ParallelConfig, load_hardware
from cost_models.composition import LARGEST, TIME, term_unit
from cost_models.hardware import LockstepCosts, LogTable
from cost_models.partition import chunk_blocks, interleaved_balance
from helpers.builders import with_experts

HW = load_hardware("a100-80gb")
LOCKSTEP = LockstepCosts(sync=LogTable(((1e-4, 2e-5), (1e-2, 1e-4))), module_s=3e-5, op_s=5e-6, collective_s=2e-5)


def tied_profile(rng: random.Random) -> ModelProfile:
    """Embedding, blocks of two kinds, a final norm and an LM head tied to the embedding (as GPT-2's)."""
    hidden, heads, vocab, seq = 1024, 8, 32000, 512
    act = seq * hidden * 2
    block_tp = TPPattern(pairs=[TPPair(kind="attention", columnwise=["q", "k", "v"], rowwise="o",
                                       inner_features=3 * hidden, heads=heads, kv_heads=heads),
                                TPPair(kind="mlp", columnwise=["fc1"], rowwise="fc2", inner_features=4 * hidden)],
                         plan={"q": "colwise", "k": "colwise", "v": "colwise", "o": "rowwise", "fc1": "colwise",
                               "fc2": "rowwise"}, divisors=[heads, 4 * hidden])

    def layer(name: str, kind: str, block_id: str, params: int, tp: TPPattern, tied: int = 0) -> LayerProfile:
        flops = 2.0 * (params + tied) * seq * rng.uniform(0.8, 1.2)
        return LayerProfile(index=0, name=name, kind=kind, module_type=kind, block_id=block_id, params=params,
                            tied_params=tied, param_bytes=2 * params, fwd_flops_per_sample=flops,
                            fwd_matmul_flops_per_sample=flops, fwd_memory_bytes_per_sample=rng.uniform(5, 30) * act,
                            saved_bytes_per_sample=int(rng.uniform(2, 30) * act), input_bytes_per_sample=act,
                            cut_bytes_per_sample=act, tp=tp)

    kinds = {k: layer("", "block", k, int(rng.uniform(0.5, 2.0) * 12 * hidden * hidden), block_tp) for k in "ab"}
    if rng.random() < 0.4:  # blocks of kind b are mixtures of experts
        kinds["b"] = with_experts(kinds["b"], rng, hidden=hidden, seq=seq)
    layers = [layer("wte", "embedding", "wte", vocab * hidden, TPPattern(plan={"": "rowwise"}, divisors=[vocab]))]
    layers += [kinds[rng.choice("ab")].model_copy(update={"name": f"h.{n}"}) for n in range(rng.randint(2, 5))]
    layers += [layer("ln_f", "norm", "ln_f", 2 * hidden, TPPattern(plan={"": "sequence_parallel"})),
               layer("lm_head", "head", "lm_head", 0, TPPattern(plan={"": "colwise"}, divisors=[vocab]),
                     tied=vocab * hidden).model_copy(update={"cut_bytes_per_sample": 0})]
    layers = [lp.model_copy(update={"index": i}) for i, lp in enumerate(layers)]
    return ModelProfile(name="tied", source="", dtype="bf16", seq_len=seq, params=sum(lp.params for lp in layers),
                        param_bytes=sum(lp.param_bytes for lp in layers), layers=layers,
                        capture=CaptureInfo(method="torch.export", graph_nodes=0, traced_layers=len(layers), wall_s=0))


def random_counts(rng: random.Random, n: int, parts: int) -> tuple[int, ...]:
    cuts = sorted(rng.sample(range(1, n), parts - 1))
    bounds = (0, *cuts, n)
    return tuple(bounds[i + 1] - bounds[i] for i in range(parts))


def random_config(rng: random.Random, profile: ModelProfile) -> ParallelConfig:
    """Degrees, schedule, every flag, cuts, per-layer recomputation and (without ZeRO or SP) tp degrees."""
    L = len(profile.layers)
    tp, pp, dp = rng.choice([1, 2, 4]), rng.choice([1, 2, 3]), rng.choice([1, 2, 4])
    zero = rng.choice([0, 1, 2, 3]) if dp > 1 else 0
    sp = tp > 1 and rng.random() < 0.4
    schedule, v = rng.choice(["1f1b", "gpipe"]), 1
    if pp > 1 and rng.random() < 0.4 and pp * 2 <= L:
        schedule, v = "interleaved", rng.choice([v for v in (2, 3) if pp * v <= L])
    m = pp * rng.choice([1, 2]) if schedule == "interleaved" else rng.choice([1, 2, 4])
    ep, etp = rng.choice(expert_choices(profile, tp=tp, dp=dp, pins=Pins()))
    cfg = ParallelConfig(tp=tp, pp=pp, dp=dp, micro_batch_size=rng.choice([1, 2]), num_microbatches=m, zero_stage=zero,
                         sequence_parallel=sp, schedule=schedule, virtual_stages=v,  # type: ignore[arg-type]
                         offload_activations=rng.random() < 0.3, gpus_per_node=rng.choice([4, 8]), ep=ep, etp=etp,
                         moe_imbalance=rng.choice([None, 1.0, 1.5]))
    blocks = [i for i, lp in enumerate(profile.layers) if lp.kind == "block"]
    modes = ["none"] * L
    degrees = [tp] * L
    choices = block_degrees(CostModel(profile, HW), cfg, cfg.gpus_per_node)
    for i in blocks:
        modes[i] = rng.choice(MODES)
        degrees[i] = rng.choice(choices)
    layer_tp = tuple(degrees) if any(t != tp for t in degrees) else None
    # context parallelism (drawn last, so the draws above are those of every seed before it): per-layer degrees
    # run without it; the experts' ep, dividing tp·dp, divides tp·cp·dp too
    cp = rng.choice([1, 2, 4]) if layer_tp is None else 1
    counts = random_counts(rng, L, cfg.chunks)
    cp_comm = rng.choice(["all_gather", "ring"])
    balance = interleaved_balance(profile.layers, cfg.chunks) if cfg.schedule == "interleaved" else None
    if balance is not None:  # a layout the interleaved schedule allows (cost_models/partition.py)
        allowed = [c for c in compositions(L, cfg.chunks)
                   if balance[0] <= min(chunk_blocks(profile.layers, c)) <= max(chunk_blocks(profile.layers, c))
                   <= balance[1]]
        counts = rng.choice(allowed)
    return replace(cfg, stage_layers=counts, layer_recompute=tuple(modes), layer_tp=layer_tp, cp=cp, cp_comm=cp_comm)


def random_hardware(rng: random.Random, fits: bool):  # noqa: ANN201
    hw = replace(HW, comm_overlap=rng.choice([1.0, 0.0, 0.375]), zero3_comm_overlap=rng.choice([None, 0.0, 0.25]),
                 lockstep=rng.choice([LockstepCosts(), LOCKSTEP]), host_link_bytes_per_s=rng.choice([25e9, 12.3e9]))
    # the overlap slowdown and the allocator's fragmentation: GPU profiles have both, a calibrated CPU neither
    hw = replace(hw, overlap_slowdown=rng.choice([0.0, 0.189]), allocator_fragmentation=rng.choice([0.0, 0.05]))
    return hw if fits else replace(hw, memory_bytes=hw.memory_reserve_bytes + 2**30)


@pytest.mark.parametrize("chunk", range(4))
def test_solver_value_equals_the_cost_model_term_by_term(chunk: int) -> None:
    """60 random configurations, every decision fixed: the same step time, and the same value of every term."""
    infeasible = 0
    for seed in range(chunk * 15, chunk * 15 + 15):
        rng = random.Random(seed)
        profile = tied_profile(rng)
        cfg = random_config(rng, profile)
        cost = CostModel(profile, random_hardware(rng, fits=seed % 5 != 0))
        est = cost.evaluate(cfg)
        degrees = sorted(set(cfg.layer_tp or ()) | {cfg.tp})
        inner = solve_inner(cost, replace(cfg, stage_layers=None, layer_recompute=None, layer_tp=None), modes=MODES,
                            time_limit_s=20, threads=2, degrees=degrees, fix=cfg)
        if not est.fits:
            assert inner.status == "INFEASIBLE", f"seed {seed}: the solver fits what the cost model says does not"
            infeasible += 1
            continue
        assert inner.status == "OPTIMAL", f"seed {seed}"
        tol = rounding_tolerance_s(cfg, len(profile.layers))
        assert inner.objective_s == pytest.approx(est.step_time_s, abs=tol, rel=1e-6), f"seed {seed}"
        for name, value in est.terms.items():
            solved = inner.terms[name]
            if name.rsplit("_", 1)[0] in LARGEST or name.startswith("memory") or name.startswith("dp_tail"):
                # relaxed to "at least" where the step does not reach (largest layer, a device that is not last)
                assert solved >= value - 1e-6 * abs(value) - 1, f"seed {seed}: {name}"
                continue
            unit_tol = tol if term_unit(name) == TIME else 16.0 * len(profile.layers)
            assert solved == pytest.approx(value, abs=unit_tol, rel=1e-6), f"seed {seed}: {name}"
    assert infeasible >= 1 or chunk > 0  # the first chunk holds at least one configuration that does not fit


def test_guard_names_a_term_the_solver_lacks() -> None:
    """A solution whose solver value misses a term the cost model has is an internal error naming that term,
    never a plan (the guard that runs after every inner solve)."""
    rng = random.Random(3)
    profile = tied_profile(rng)
    cost = CostModel(profile, HW)
    cfg = replace(random_config(rng, profile), offload_activations=False)
    est = cost.evaluate(cfg)
    terms = dict(est.terms)
    bad = next(name for name in terms if name.startswith("tp_") and terms[name] > 0)
    terms[bad] = 0.0  # as if the solver's model had no tensor-parallel term on that device
    lacking = InnerResult("OPTIMAL", est.step_time_s * 0.5, est.step_time_s * 0.5, cfg.stage_layers or (),
                          terms=terms)
    with pytest.raises(ModelMismatch, match=f"first term that differs: {bad}"):
        check_solution(lacking, est, len(profile.layers))
    check_solution(replace(lacking, objective_s=est.step_time_s, terms=dict(est.terms)), est, len(profile.layers))


def test_every_field_of_a_layer_cost_reaches_the_step() -> None:
    """A layer cost is records of fields, each naming the composition leaf it adds to (cost_models/layer_cost.py):
    raising any one field of one layer moves some named term of the composed step, so no term is dropped between
    the cost model and the step. The fields that name no leaf are read elsewhere, and exactly these."""
    from cost_models.algebra import FloatAlgebra
    from cost_models.composition import compose, named_terms
    from cost_models.layer_cost import RECORDS
    from cost_models.partition import chunk_ranges

    rng = random.Random(7)
    profile = tied_profile(rng)
    cfg = ParallelConfig(tp=2, pp=2, dp=2, micro_batch_size=1, num_microbatches=4, zero_stage=3, recompute="none",
                         offload_activations=True)
    cost = CostModel(profile, random_hardware(rng, fits=True))
    costs = cost.layer_costs(cfg)
    ranges = chunk_ranges(cfg.stage_layers or (len(profile.layers) - 2, 2))
    tp_link, _, pp_link = cost.links(cfg)

    def terms(layer_costs: list) -> tuple:
        """Every named term of the step, and each device's parameter count (a leaf the step reports, not a term)."""
        leaves = [cost.device_leaves(d, replace(cfg, stage_layers=tuple(len(r) for r in ranges)), ranges, layer_costs,
                                     tp_link, pp_link) for d in range(cfg.pp)]
        step = named_terms(leaves, compose(FloatAlgebra(), leaves, cost.step_shape(cfg)))
        return step, [q["params"] for q in leaves]

    base, unread = terms(costs), set()
    last = len(profile.layers) - 1  # the head: on the last device, holding the tied embedding's copy
    for kind in RECORDS:
        for f in dataclasses.fields(kind):
            if f.metadata["leaf"] is None:
                unread.add(f.name)
                continue
            bumped = list(costs)
            c = bumped[last]
            records = {rec: getattr(c, rec) for rec in ("compute", "traffic", "held", "step")}
            name = next(rec for rec, value in records.items() if isinstance(value, kind))
            records[name] = dataclasses.replace(records[name], **{f.name: getattr(records[name], f.name) + 1e9})
            bumped[last] = type(c)(**records)
            assert terms(bumped) != base, f"{kind.__name__}.{f.name} reaches no term of the step"
    assert unread == {"executed_flops", "model_flops", "expert_params_per_gpu"}  # MFU's FLOPs; the step work's split
