"""The planner: exact against brute force, consistent with the cost model, deterministic, pinnable."""
from __future__ import annotations

import random
from dataclasses import replace

import pytest

from autopar.errors import AutoparError
from autopar.profile import CaptureInfo, LayerProfile, ModelProfile, MoEProfile, TPPair, TPPattern
from autopar.search.brute import brute_force
from autopar.search.cpsat import solve_inner
from autopar.search.engine import search
from autopar.search.space import Pins
from cost_models import CostModel, ParallelConfig, load_hardware
from cost_models.hardware import LockstepCosts, LogTable

HW = load_hardware("a100-80gb")
LOCKSTEP = LockstepCosts(sync=LogTable(((1e-4, 2e-5), (1e-2, 1e-4))), module_s=3e-5, op_s=5e-6, collective_s=2e-5)


def random_profile(rng: random.Random, n_blocks: int) -> ModelProfile:
    """A small model with random costs: embedding, n blocks of one or two kinds, head."""
    hidden, heads, vocab, seq = rng.choice([512, 1024]), rng.choice([4, 8]), rng.choice([8000, 32000]), 512
    block_tp = TPPattern(pairs=[TPPair(kind="attention", columnwise=["q", "k", "v"], rowwise="o", inner_features=3 * hidden,
                                       heads=heads, kv_heads=heads),
                                TPPair(kind="mlp", columnwise=["fc1"], rowwise="fc2", inner_features=4 * hidden)],
                         plan={"q": "colwise", "k": "colwise", "v": "colwise", "o": "rowwise", "fc1": "colwise",
                               "fc2": "rowwise"}, divisors=[heads, 4 * hidden])
    act = seq * hidden * 2

    def layer(i: int, name: str, kind: str, block_id: str, tp: TPPattern, scale: float) -> LayerProfile:
        params = int(rng.uniform(0.2, 1.0) * scale * 12 * hidden * hidden)
        flops = 2.0 * params * seq * rng.uniform(0.5, 1.5)
        return LayerProfile(index=i, name=name, kind=kind, module_type=kind, block_id=block_id, params=params,
                            param_bytes=2 * params, fwd_flops_per_sample=flops if kind != "embedding" else 0.0,
                            fwd_matmul_flops_per_sample=flops if kind != "embedding" else 0.0,
                            fwd_memory_bytes_per_sample=rng.uniform(5, 30) * act,
                            saved_bytes_per_sample=int(rng.uniform(2, 30) * act), input_bytes_per_sample=act,
                            cut_bytes_per_sample=int(act * rng.choice([1, 1, 2])), tp=tp)

    kinds = [rng.choice("ab") for _ in range(n_blocks)]
    block_cost = {k: (rng.uniform(0.5, 2.0), rng.random()) for k in "ab"}
    moe_kind = rng.choice(["", "", "b"])  # a third of the models: blocks of kind b are mixtures of experts
    layers = [layer(0, "emb", "embedding", "emb", TPPattern(plan={"": "rowwise"}, divisors=[vocab]),
                    vocab / (12 * hidden))]
    for n, kind in enumerate(kinds):
        template = layer(0, "", "block", kind, block_tp, block_cost[kind][0])
        if kind == moe_kind:
            template = with_experts(template, rng, hidden=hidden, seq=seq)
        if any(lp.block_id == kind for lp in layers):  # identical blocks share every number
            template = next(lp for lp in layers if lp.block_id == kind)
        layers.append(template.model_copy(update={"index": n + 1, "name": f"blocks.{n}"}))
    layers.append(layer(n_blocks + 1, "head", "head", "head", TPPattern(plan={"": "colwise"}, divisors=[vocab]),
                        vocab / (12 * hidden)))
    layers[-1] = layers[-1].model_copy(update={"cut_bytes_per_sample": 0})
    return ModelProfile(name="random", source="", dtype="bf16", seq_len=seq, params=sum(lp.params for lp in layers),
                        param_bytes=sum(lp.param_bytes for lp in layers), layers=layers,
                        capture=CaptureInfo(method="torch.export", graph_nodes=0, traced_layers=len(layers), wall_s=0))


def with_experts(layer: LayerProfile, rng: random.Random, *, hidden: int, seq: int) -> LayerProfile:
    """The block as a mixture of experts: a random share of its work, weights and activations is routed
    experts (E of them, top-k per token, with or without a capacity factor), the rest stays dense."""
    share, experts, k = rng.uniform(0.3, 0.7), rng.choice([4, 8]), rng.choice([1, 2])
    cf = rng.choice([None, None, 1.25])
    per_sample = seq * k * (cf or 1.0)
    moe = MoEProfile(num_experts=experts, top_k=k, hidden_size=hidden, expert_ffn_size=4 * hidden,
                     expert_params=int(share * layer.params / experts), router_params=experts * hidden,
                     capacity_factor=cf, expert_fwd_flops_per_token=share * layer.fwd_flops_per_sample / per_sample,
                     expert_saved_bytes_per_token=share * layer.saved_bytes_per_sample / per_sample,
                     expert_memory_bytes_per_token=share * layer.fwd_memory_bytes_per_sample / per_sample,
                     module="mlp", experts_module="mlp.experts")
    return layer.model_copy(update={"moe": moe})


def random_instance(seed: int) -> tuple:
    rng = random.Random(seed)
    profile = random_profile(rng, rng.randint(1, 3))
    gpus = rng.choice([1, 2, 4, 8])
    gpus_per_node = rng.choice([2, 4, 8])
    batch = rng.choice([2, 4, 8])
    single = CostModel(profile, HW).evaluate(ParallelConfig(tp=1, pp=1, dp=1, micro_batch_size=1, num_microbatches=batch,
                                                            recompute="none"))
    state_and_acts = single.peak_memory_bytes - HW.memory_reserve_bytes
    hw = replace(HW, memory_bytes=int(HW.memory_reserve_bytes + state_and_acts * rng.uniform(0.02, 1.2)))
    pins = Pins(zero_stage=rng.choice([None, 0, 1, 3]), sequence_parallel=rng.choice([None, False]),
                micro_batch_size=rng.choice([None, 1, 2]) if gpus > 2 else None)
    hw = replace(hw, comm_overlap=rng.choice([1.0, 1.0, 0.0, 0.375]))  # GPUs, a CPU, something between
    hw = replace(hw, lockstep=rng.choice([LockstepCosts(), LOCKSTEP]))  # calibrated lock-step costs or none
    hw = replace(hw, overlap_slowdown=rng.choice([0.0, 0.189]), allocator_fragmentation=rng.choice([0.0, 0.05]))
    return profile, hw, gpus, gpus_per_node, batch, pins


@pytest.mark.slow
@pytest.mark.parametrize("chunk", range(8))
def test_solver_equals_brute_force_on_random_instances(chunk: int) -> None:
    """25 instances per chunk, 200 in all: the same optimum (or both infeasible)."""
    feasible = 0
    for seed in range(chunk * 25, chunk * 25 + 25):
        profile, hw, gpus, gpn, batch, pins = random_instance(seed)
        reference = brute_force(profile, hw, gpus=gpus, gpus_per_node=gpn, global_batch_size=batch, pins=pins)
        try:
            result = search(profile, hw, gpus=gpus, gpus_per_node=min(gpn, gpus), global_batch_size=batch, pins=pins,
                            time_limit_s=30)
        except AutoparError:  # the pins leave no valid configuration at all
            assert reference is None
            continue
        if reference is None:
            assert not result.best, f"seed {seed}: solver found a plan brute force says cannot fit"
            continue
        feasible += 1
        assert result.status == "OPTIMAL", f"seed {seed}"
        found = result.best[0].estimate
        assert found.fits
        assert found.step_time_s == pytest.approx(reference.step_time_s, rel=1e-5, abs=1e-6), f"seed {seed}"
    assert feasible >= 10  # the instances are not all trivially infeasible


def test_solver_objective_is_the_cost_model_evaluation() -> None:
    from autopar.capture import capture_model

    profile = capture_model("examples/gpt.py", {"n_layer": "12", "n_embd": "768", "n_head": "12"}, seq_len=1024)
    cost = CostModel(profile, HW)
    for cfg in [ParallelConfig(tp=2, pp=4, dp=2, micro_batch_size=2, num_microbatches=8, zero_stage=1),
                ParallelConfig(tp=1, pp=2, dp=4, micro_batch_size=1, num_microbatches=8, zero_stage=3, offload_activations=True),
                ParallelConfig(tp=2, pp=2, dp=1, micro_batch_size=1, num_microbatches=4, schedule="interleaved",
                               virtual_stages=3, sequence_parallel=True)]:
        inner = solve_inner(cost, cfg, modes=("none", "selective", "full"), time_limit_s=20, threads=2)
        assert inner.status == "OPTIMAL"
        est = cost.evaluate(replace(cfg, stage_layers=inner.stage_layers, layer_recompute=inner.layer_recompute))
        assert inner.objective_s == pytest.approx(est.step_time_s, rel=1e-5)


def test_solver_encodes_the_hardwares_zero3_overlap() -> None:
    """A profile whose ZeRO-3 traffic hides less than its gradient sync (a CPU): the CP-SAT objective is
    still the cost model's evaluation."""
    from autopar.capture import capture_model

    profile = capture_model("examples/gpt.py", {"n_layer": "4", "n_embd": "256", "n_head": "8"}, seq_len=256)
    cost = CostModel(profile, replace(HW, comm_overlap=0.6, zero3_comm_overlap=0.25))
    cfg = ParallelConfig(tp=1, pp=2, dp=4, micro_batch_size=1, num_microbatches=4, zero_stage=3)
    inner = solve_inner(cost, cfg, modes=("none", "full"), time_limit_s=20, threads=2)
    assert inner.status == "OPTIMAL"
    est = cost.evaluate(replace(cfg, stage_layers=inner.stage_layers, layer_recompute=inner.layer_recompute))
    assert est.breakdown_s["dp_comm"] > 0
    assert inner.objective_s == pytest.approx(est.step_time_s, rel=1e-5)


GPT_SMALL = {"n_layer": "8", "n_embd": "512", "n_head": "8", "vocab_size": "8000"}


def test_deterministic_and_pinnable() -> None:
    from autopar.search import solve

    first = solve("examples/gpt.py", gpus=16, overrides=GPT_SMALL, seq_len=512, global_batch_size=64, gpu="a100-40gb")
    again = solve("examples/gpt.py", gpus=16, overrides=GPT_SMALL, seq_len=512, global_batch_size=64, gpu="a100-40gb")
    strip = {"solver": {"wall_s"}}
    assert first.model_dump(exclude=strip) == again.model_dump(exclude=strip)
    pinned = solve("examples/gpt.py", gpus=16, overrides=GPT_SMALL, seq_len=512, global_batch_size=64, gpu="a100-40gb",
                   pins=Pins(tp=2, pp=2, recompute="full"))
    par = pinned.parallelism
    assert (par.tp, par.pp, par.dp) == (2, 2, 4)
    assert all(layer.recompute == ("full" if layer.name.startswith("h.") else "none") for layer in pinned.layers)
    assert pinned.prediction.step_time_s >= first.prediction.step_time_s  # pins only restrict the space


def test_top_k_plans_are_distinct_and_ordered() -> None:
    from autopar.search import solve_top_k

    plans = solve_top_k("examples/gpt.py", gpus=8, k=4, overrides=GPT_SMALL, seq_len=512, global_batch_size=32)
    times = [p.prediction.step_time_s for p in plans]
    assert len(plans) == 4 and times == sorted(times)
    assert len({p.parallelism.model_dump_json() for p in plans}) == 4
    assert [p.solver.rank for p in plans] == [1, 2, 3, 4]


def test_infeasible_names_the_fix() -> None:
    from autopar.search import solve

    with pytest.raises(AutoparError) as err:
        solve("examples/gpt.py", gpus=2, overrides={"n_layer": "48", "n_embd": "8192", "n_head": "64"},
              seq_len=2048, global_batch_size=8, gpu="a100-80gb")
    message = str(err.value)
    assert message.startswith("no plan fits") and "GPUs" in message and "\n" not in message


def test_plan_schema_is_checked_in() -> None:
    import json
    from pathlib import Path

    from autopar.plan import plan_schema

    checked_in = json.loads((Path(__file__).resolve().parents[1] / "autopar" / "plan.schema.json").read_text())
    assert checked_in == plan_schema(), "regenerate with: python -m autopar.plan > autopar/plan.schema.json"


def test_loading_a_plan_validates_it(tmp_path) -> None:  # noqa: ANN001
    from autopar.plan import Plan
    from autopar.search import solve

    plan = solve("examples/gpt.py", gpus=4, overrides=GPT_SMALL, seq_len=256, global_batch_size=16, gpu="cpu")
    path = tmp_path / "plan.json"
    plan.save(path)
    assert Plan.load(path) == plan
    broken = plan.model_dump()
    broken["world_size"] = broken["cluster"]["gpus"] = 5
    path.write_text(__import__("json").dumps(broken))
    with pytest.raises(AutoparError, match=r"pp\(\d\) \* dp\(\d\) \* tp\(\d\) = 4 != world_size\(5\)"):
        Plan.load(path)
    broken = plan.model_dump()
    broken["parallelism"]["dp"] = 3
    path.write_text(__import__("json").dumps(broken))
    with pytest.raises(AutoparError, match=r"dp\(3\) \* num_microbatches\(\d+\) != global_batch_size\(16\)"):
        Plan.load(path)


def test_random_optima_use_every_decision() -> None:
    """The random instances are not degenerate: their optima use non-uniform cuts, mixed recomputation,
    per-layer tensor-parallel degrees, expert and context parallelism (so the brute-force agreement above covers
    all five)."""
    seen = {"cuts": 0, "recompute": 0, "layer_tp": 0, "expert_parallel": 0, "context_parallel": 0}
    for seed in range(200):
        profile, hw, gpus, gpn, batch, pins = random_instance(seed)
        try:
            result = search(profile, hw, gpus=gpus, gpus_per_node=min(gpn, gpus), global_batch_size=batch, pins=pins)
        except AutoparError:
            continue
        if result.best:
            cfg = result.best[0].config
            seen["cuts"] += cfg.pp > 1 and len(set(cfg.stage_layers or ())) > 1
            seen["recompute"] += len(set(cfg.layer_recompute or ())) > 1
            seen["layer_tp"] += cfg.layer_tp is not None
            seen["expert_parallel"] += cfg.ep > 1
            seen["context_parallel"] += cfg.cp > 1
    assert all(count >= 3 for count in seen.values()), seen
