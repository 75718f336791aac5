"""Model profiles and hardware built by hand or at random for the tests: round numbers whose arithmetic a test
can follow (ROUND_HW, layer, model), random small models and instances for the solver against brute force, the
small Llama of the context-parallel tests."""
from __future__ import annotations

import random
from dataclasses import replace

from autopar.profile import CaptureInfo, LayerProfile, ModelProfile, MoEProfile, TPPair, TPPattern
from cost_models import CostModel, ParallelConfig, load_hardware
from cost_models.config import Pins
from cost_models.engines import TORCH_SCHEDULES
from cost_models.hardware import LockstepCosts, LogTable
from helpers import EX

LLAMA = str(EX / "llama.py")
LLAMA_SHAPE = {"n_layer": "2", "dim": "256", "n_head": "8", "n_kv_head": "2", "vocab_size": "1024",
               "max_seq_len": "4096"}
LLAMA_SEQ = 4096

ROUND_HW = {
    "name": "round", "peak_dense_tflops": {"bf16": 100, "fp32": 10}, "memory_gib": 10, "memory_reserve_gib": 1,
    "hbm_bandwidth_gbytes_per_s": 1000, "gpus_per_node": 8, "nvlink_bandwidth_bidirectional_gbytes_per_s": 200,
    "intra_node_latency_us": 1, "nic_bandwidth_gbits_per_s": 80, "nics_per_node": 8, "inter_node_latency_us": 10,
    "host_link_bandwidth_gbytes_per_s": 10, "gemm_efficiency_by_mflop_per_token": [[1, 0.5]],
    "gemm_efficiency_by_rows": [[1, 1.0]], "memory_bandwidth_efficiency": 1.0,
    "collective_efficiency_by_mbytes": [[1, 1.0]],
}
BLOCK_TP = TPPattern(pairs=[TPPair(kind="attention", columnwise=["qkv"], rowwise="proj", inner_features=3 * 64,
                                   heads=4, kv_heads=4),
                            TPPair(kind="mlp", columnwise=["fc"], rowwise="out", inner_features=256)],
                     plan={"qkv": "colwise", "proj": "rowwise", "fc": "colwise", "out": "rowwise"}, divisors=[4, 256])


def layer(index: int = 0, *, kind: str = "block", block_id: str = "blk", params: int = 1000, matmul: float = 1e12,
          memory: float = 1e9, saved: int = 100_000_000, inp: int = 1_000_000, cut: int = 1_000_000,
          tp: TPPattern = BLOCK_TP, tied: int = 0) -> LayerProfile:
    return LayerProfile(index=index, name=f"l{index}", kind=kind, module_type="X", block_id=block_id, params=params,
                        tied_params=tied, param_bytes=2 * params, fwd_flops_per_sample=matmul,
                        fwd_matmul_flops_per_sample=matmul, fwd_memory_bytes_per_sample=memory,
                        saved_bytes_per_sample=saved, input_bytes_per_sample=inp, cut_bytes_per_sample=cut, tp=tp)


def model(layers: list[LayerProfile], seq_len: int = 1000) -> ModelProfile:
    return ModelProfile(name="toy", source="hand", dtype="bf16", seq_len=seq_len, params=sum(x.params for x in layers),
                        param_bytes=2 * sum(x.params for x in layers), layers=layers,
                        capture=CaptureInfo(method="torch.export", graph_nodes=0, traced_layers=len(layers), wall_s=0))


A100 = load_hardware("a100-80gb")
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
    single = CostModel(profile, A100).evaluate(ParallelConfig(tp=1, pp=1, dp=1, micro_batch_size=1, num_microbatches=batch,
                                                            recompute="none"))
    state_and_acts = single.peak_memory_bytes - A100.memory_reserve_bytes
    hw = replace(A100, memory_bytes=int(A100.memory_reserve_bytes + state_and_acts * rng.uniform(0.02, 1.2)))
    pins = Pins(zero_stage=rng.choice([None, 0, 1, 3]), sequence_parallel=rng.choice([None, False]),
                micro_batch_size=rng.choice([None, 1, 2]) if gpus > 2 else None)
    hw = replace(hw, comm_overlap=rng.choice([1.0, 1.0, 0.0, 0.375]))  # GPUs, a CPU, something between
    hw = replace(hw, lockstep=rng.choice([LockstepCosts(), LOCKSTEP]))  # calibrated lock-step costs or none
    hw = replace(hw, overlap_slowdown=rng.choice([0.0, 0.189]), allocator_fragmentation=rng.choice([0.0, 0.05]))
    hw = replace(hw, schedules=rng.choice([hw.schedules, TORCH_SCHEDULES]))  # Megatron's, or torch's with DualPipeV
    return profile, hw, gpus, gpus_per_node, batch, pins
