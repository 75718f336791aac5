"""Hugging Face families at a tiny shape and the plans each must train like one process under: pipelines (1F1B and
interleaved), tensor parallelism with sequence parallelism, context parallelism, expert parallelism for the mixtures
of experts (etp 1 and etp = tp), and their combinations on 4 and 8 ranks.

The families are transformers' own classes built from a config: the corpus's (examples/hf, shrunk with ``--set`` as
tests/helpers/solved_plans.py does) and tiny configs of the families the corpus does not bundle (tests/data/hf:
Qwen3, Gemma-3, OLMo-2). Plans are written as the solver writes them (tests/helpers/runtime_worker.py ``plan``),
with the layer names capture finds; tests/integration/test_hf_plans.py runs them under torchrun
(tests/helpers/runtime_worker.py ``--plans``).
"""
from __future__ import annotations

import functools
import os
from typing import Any

from helpers import ROOT
from helpers import solved_plans as sp

SEQ = 16
# family -> (config, tiny overrides)
FAMILIES: dict[str, tuple[str, dict[str, str]]] = {
    "llama": sp.MODELS["hf/llama-3-8b"],
    "qwen3": ("tests/data/hf/qwen3-tiny.json", {}),
    "gemma2": sp.MODELS["hf/gemma-2-2b"],
    "gemma3": ("tests/data/hf/gemma3-tiny.json", {}),
    "olmo2": ("tests/data/hf/olmo2-tiny.json", {}),
    "mixtral": sp.MODELS["hf/mixtral-8x7b-v0.1"],
    "qwen3moe": sp.MODELS["hf/qwen3-30b-a3b"],
    "deepseek": sp.MODELS["hf/deepseek-v2-lite"],
    "t5": sp.MODELS["hf/t5-base"],
    # the other transformers MoE families: OLMoE (q/k norms over the whole projection, 4 experts top-2 without
    # renormalising), Phi-3.5-MoE (sparsemixer routing, biased attention and head, LayerNorm; jitter off)
    "olmoe": ("tests/data/hf/olmoe-tiny.json", {}),
    "phimoe": ("tests/data/hf/phimoe-tiny.json", {}),
    # tensor with sequence parallelism only: what each needed of autopar.runtime.sequence (docs/runtime.md)
    "gpt2": sp.MODELS["hf/gpt2"],  # Conv1D blocks and ln_f run whole, the head takes its block
    "bart": sp.MODELS["hf/bart-base"],  # final_logits_bias on whole logits
    "qwen15moe": sp.MODELS["hf/qwen1.5-moe-a2.7b"],  # a shared expert on flattened tokens
    "deepseek3": sp.MODELS["hf/deepseek-v3"],  # the q LoRA projection, replicated, on the whole sequence
    # attention sinks (one per head, sharded over tp), alternating sliding windows, experts stored (E, in, out) with
    # biases and interleaved gate|up rows (autopar.runtime.hf_experts.layout)
    "gptoss": sp.MODELS["hf/gpt-oss-20b"],
    # a masked LM under cp only: attention both ways over the gathered keys, each token its own target
    # (autopar.runtime.cp: an aligned loss)
    "bert": sp.MODELS["hf/bert-base-uncased"],
    # ... whose positions count non-padding token ids: each chunk takes its slice of the whole sequence's
    # (autopar.capture.hf.HFModel.position_rule)
    "roberta": sp.MODELS["hf/roberta-base"],
    # SDPA called with the causal mask of the local tokens, which it builds for every call (autopar.runtime.cp:
    # the sequence's causal mask instead)
    "falcon": sp.MODELS["hf/falcon-7b"],
    # q|k|v and gate|up rows fused in one linear each, split by the model at the whole width's offsets (strided
    # shards: autopar.runtime.tp, a config of the attention's own: autopar.runtime.heads)
    "phi3": sp.MODELS["hf/phi-3-mini-4k-instruct"],
    # an image encoder: its patches and [CLS] (5 tokens) in blocks of unequal length under SP (3 and 2 at tp 2: the
    # first as long as the pixels' channels, which stay whole)
    "vit": (sp.MODELS["hf/vit-base-patch16-224-in21k"][0], {**sp.MODELS["hf/vit-base-patch16-224-in21k"][1],
                                                           "patch_size": "16"}),
    # a vision tower inside a language model, its features collected by hooks on the tower's layers: one chunk holds
    # the whole tower (the interleaved split cuts before it and after it)
    "llava": sp.MODELS["hf/llava-1.5-7b"],
}
SEQ_OF = {"vit": (32 // 16) ** 2 + 1}
MOE = {"mixtral", "qwen3moe", "deepseek", "qwen15moe", "deepseek3", "gptoss", "olmoe", "phimoe"}
ONLY = ({family: {"tp2_sp"} for family in ("gpt2", "qwen15moe", "deepseek3")}
        | {family: {"cp2"} for family in ("bert", "roberta", "falcon")}
        | {"phi3": {"tp2", "tp2_sp", "tp2_dp2_sp_zero3"}, "vit": {"tp2_sp"}, "bart": {"tp2_sp", "cp2"},
           "olmoe": {"tp2_sp", "ep2"}, "phimoe": {"ep2", "tp2_sp_etp1"},  # every shape of both ran: docs/runtime.md
           "llava": {"pp2_1f1b", "pp2_interleaved", "tp2_sp", "cp2", "pp2_tp2_sp", "cp2_tp2"}})  # the shapes each runs
# family -> {feature: what the runtime's one line (autopar.runtime.support.unsupported, the solve's note) says}
# (Gemma-2's soft-capped eager attention, Gemma-3's masked sliding windows and GPT-OSS's sinks run cp through their
# own kernels: autopar.runtime.hf_attention)
REFUSED: dict[str, dict[str, str]] = {
    # ViT: no cp to leave out (its [CLS] + n² patches are never a multiple of 4 tokens); DualPipeV on one model input
    # only (T5 failed in a weight pass at pp 2, its encoder output read by every decoder chunk)
    **{family: {"dualpipev": "inputs (an encoder-decoder's source and target"} for family in ("t5", "bart", "llava",
                                                                                              "vit")},
}


@functools.lru_cache(maxsize=None)
def profile(family: str):  # noqa: ANN201 - a ModelProfile (autopar.profile imports no torch; capture does)
    """The family captured at SEQ in fp32, once per test session (the plans' layer names, the runtime's refusals)."""
    from autopar.capture import capture_model

    source, overrides = FAMILIES[family]
    return capture_model(str(ROOT / source), overrides, seq_len=SEQ_OF.get(family, SEQ), dtype="fp32")


def captured(family: str, raw: dict[str, Any]) -> list:
    """[layer names, {layer: tensor-parallel plan}] of the family's plan ``raw`` as rank 0 of a torchrun job would
    capture and check them (autopar.runtime.train.layer_plans), from the session's capture: what the job's ranks
    take instead of capturing the model again (autopar.runtime.train.load_model's ``layers``)."""
    from autopar.plan import parse_run_plan
    from autopar.runtime.train import layer_plans

    names, plans = layer_plans(parse_run_plan(raw), str(ROOT / FAMILIES[family][0]), profile(family))
    return [names, plans]


def layer_names(family: str) -> tuple[str, ...]:
    return tuple(layer.name for layer in profile(family).layers)


def plan(family: str, *, tp: int = 1, pp: int = 1, dp: int = 1, cp: int = 1, ep: int = 1, etp: int | None = None,
         mb: int = 2, m: int = 2, zero: int = 0, sp_: bool = False, schedule: str = "1f1b", v: int = 1,
         recompute: str = "none", sizes: list[int] | None = None) -> dict[str, Any]:
    """A plan dict as the solver emits it, layers split as evenly as the chunks allow (or ``sizes`` layers each; a
    size of -1: the layers the others leave)."""
    source, overrides = FAMILIES[family]
    names = layer_names(family)
    chunks = pp * v
    base, extra = divmod(len(names), chunks)
    sizes = sizes or [base + (1 if c < extra else 0) for c in range(chunks)]
    sizes = [len(names) - sum(n for n in sizes if n > 0) if n == -1 else n for n in sizes]
    stages = [c for c, size in enumerate(sizes) for _ in range(size)]
    return {"world_size": tp * pp * dp * cp,
            "model": {"source": source, "overrides": dict(overrides), "seq_len": SEQ_OF.get(family, SEQ), "dtype": "fp32"},
            "parallelism": {"tp": tp, "pp": pp, "dp": dp, "micro_batch_size": mb, "num_microbatches": m,
                            "zero_stage": zero, "recompute": recompute, "sequence_parallel": sp_,
                            "schedule": schedule, "virtual_stages": v, "offload_activations": False,
                            "ep": ep, "etp": etp, "cp": cp},
            "layers": [{"name": n, "stage": s, "tp": tp, "recompute": recompute} for n, s in zip(names, stages)]}


def shape_kwargs(world: int, family: str) -> dict[str, dict[str, Any]]:
    """The plan shapes one family runs on ``world`` ranks (names -> ``plan`` keywords)."""
    moe = family in MOE
    if world == 2:
        out = {"pp2_1f1b": dict(pp=2, m=4, mb=1), "pp2_interleaved": dict(pp=2, v=2, m=4, mb=1, schedule="interleaved"),
               "tp2_sp": dict(tp=2, sp_=True), "cp2": dict(cp=2)}
        if moe:  # the experts as grouped GEMMs: over ep, and at ep 1 each tp rank its tokens through all of them
            out |= {"ep2": dict(dp=2, ep=2), "tp2_sp_etp1": dict(tp=2, sp_=True, etp=1)}
        if family == "llava":  # chunks of 1, 5 (the vision tower), 3 and 3 layers
            out["pp2_interleaved"]["sizes"] = [1, 5, 3, 3]
        if family in ("llama", "phi3"):  # tensor parallelism without SP: whole activations, the rotary table whole
            out["tp2"] = dict(tp=2)
        if family in ("llama", "qwen3moe", "deepseek", "gptoss", "t5"):  # T5: refused (REFUSED), so not run
            out["pp2_dualpipev"] = dict(pp=2, v=2, m=4, mb=1, schedule="dualpipev")
        return out
    if world == 4:
        out = {"pp2_tp2_sp": dict(pp=2, tp=2, sp_=True, m=2, mb=1), "tp2_dp2_sp_zero3": dict(tp=2, dp=2, sp_=True, zero=3),
               "cp2_tp2": dict(cp=2, tp=2)}
        if moe:  # the experts folded off tp (etp 1), and over etp = tp (gate|up blocks: autopar.runtime.hf_experts)
            out |= {"tp2_dp2_ep2_sp": dict(tp=2, dp=2, ep=2, etp=1, sp_=True), "tp2_dp2_ep2": dict(tp=2, dp=2, ep=2, etp=1),
                    "tp2_dp2_ep2_etp2_sp": dict(tp=2, dp=2, ep=2, etp=2, sp_=True)}
        if family in ("llama", "qwen3moe"):  # a rank whose chunk holds the rotary table alone: buffers, no parameters
            out["pp4_rotary_alone"] = dict(pp=4, m=4, mb=1, sizes=[1, 1, 1, -1])
        return out
    if world == 8:  # each pipeline schedule with tp + SP and with dp or cp; the experts over ep inside a stage
        out = {"pp2_tp2_dp2_sp": dict(pp=2, tp=2, dp=2, sp_=True, m=2, mb=1),
               "pp2_interleaved_tp2_dp2_sp": dict(pp=2, v=2, tp=2, dp=2, sp_=True, m=2, mb=1, schedule="interleaved"),
               "pp2_tp2_cp2": dict(pp=2, tp=2, cp=2, m=2, mb=1),
               "pp2_interleaved_tp2_cp2_sp": dict(pp=2, v=2, tp=2, cp=2, sp_=True, m=2, mb=1, schedule="interleaved")}
        if moe:
            out |= {"pp2_tp2_dp2_ep2_sp": dict(pp=2, tp=2, dp=2, ep=2, etp=1, sp_=True, m=2, mb=1),
                    "pp2_interleaved_tp2_dp2_ep2": dict(pp=2, v=2, tp=2, dp=2, ep=2, etp=1, m=2, mb=1,
                                                        schedule="interleaved"),
                    "cp2_tp2_dp2_ep2_sp": dict(cp=2, tp=2, dp=2, ep=2, etp=1, sp_=True)}
        if family == "llava":  # the interleaved chunks keep the vision tower on one (as on 2 ranks)
            out["pp2_interleaved_tp2_dp2_sp"]["sizes"] = out["pp2_interleaved_tp2_cp2_sp"]["sizes"] = [1, 5, 3, 3]
        return out
    return {}


def features(kwargs: dict[str, Any]) -> set[str]:
    """The features (autopar.runtime.support.FEATURES) a shape uses."""
    used = {name for name in ("pp", "tp", "cp", "ep") if kwargs.get(name, 1) > 1}
    used |= {"dualpipev"} if kwargs.get("schedule") == "dualpipev" else set()
    used |= {"etp"} if kwargs.get("etp", kwargs.get("tp", 1)) > 1 and kwargs.get("ep", 1) > 1 else set()
    return used | ({"sequence_parallel"} if kwargs.get("sp_") else set())


def shapes(world: int, families: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """``{family/shape: plan}`` of one torchrun job: the shapes whose features the family runs (``REFUSED``)."""
    return _plans(_shape_kwargs(world, families))


def _plans(kwargs_by_name: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``{family/shape: plan}`` of ``{family/shape: plan keywords}`` (each family captured once: ``profile``)."""
    return {name: plan(name.split("/")[0], **kwargs) for name, kwargs in kwargs_by_name.items()}


def _shape_kwargs(world: int, families: list[str] | None) -> dict[str, dict[str, Any]]:
    """``{family/shape: plan keywords}`` of ``shapes``, named without capturing a model (``plan`` does)."""
    return {f"{family}/{name}": kwargs
            for family in (families or list(FAMILIES)) for name, kwargs in shape_kwargs(world, family).items()
            if not features(kwargs) & set(REFUSED.get(family, {})) and name in ONLY.get(family, {name})}


# Every family runs each feature alone on 2 ranks; their combinations on 4 ranks run on one family of each kind of
# layer (rotary attention with experts as grouped GEMMs, latent attention with experts, encoder-decoder; the dense
# rotary decoder's combinations are the same shapes as Qwen3-MoE's attention runs them), and on 8 ranks the three
# that hold every feature between them (1F1B with tp, dp, SP and ep; interleaved with tp, SP and cp; cp with tp, dp,
# SP and ep), each on one family, which keeps the jobs inside CI's time. AUTOPAR_HF_ALL=1 runs every
# family's every shape at each world (the last such run at 8: docs/runtime.md, "Hugging Face plans on 8 ranks").
FAMILIES_AT: dict[int, list[str] | None] = {2: None, 4: ["qwen3moe", "deepseek", "t5", "phi3"], 8: None}
ONLY_AT = {8: {"olmo2/pp2_interleaved_tp2_cp2_sp", "qwen3moe/pp2_tp2_dp2_ep2_sp", "mixtral/cp2_tp2_dp2_ep2_sp"}}
# left out of CI's jobs where another family runs the same code path (the dense rotary decoders' interleaved
# schedule is Llama's; latent attention under ZeRO-3 and ep without SP is Qwen3-MoE's data parallelism around it;
# T5's two stacks under tp + SP are its pp2_tp2_sp's, FSDP2 around them Qwen3-MoE's)
SKIP_AT = {2: {f"{family}/pp2_interleaved" for family in ("qwen3", "gemma2", "gemma3", "olmo2")},
           4: {"deepseek/tp2_dp2_ep2", "deepseek/tp2_dp2_sp_zero3", "t5/tp2_dp2_sp_zero3"}}
ALL = os.environ.get("AUTOPAR_HF_ALL") == "1"


def job_shapes(world: int) -> dict[str, dict[str, Any]]:
    """The shapes tests/integration/test_hf_plans.py runs on ``world`` ranks (on 2, 4 and 8), as plans: each family
    captured (seconds each; tests/helpers/runtime_jobs.py, when a job runs)."""
    return _plans(_job_kwargs(world))


def job_shape_names(world: int) -> list[str]:
    """The names of ``job_shapes``, without capturing a model: what the tests are parametrized by, so that
    collecting them (every pytest run, the fast loop's too, on every xdist worker) captures nothing."""
    return list(_job_kwargs(world))


def _job_kwargs(world: int) -> dict[str, dict[str, Any]]:
    if world not in FAMILIES_AT:
        return {}
    found = _shape_kwargs(world, None if ALL else FAMILIES_AT[world])
    return {name: kwargs for name, kwargs in found.items()
            if ALL or ((world not in ONLY_AT or name in ONLY_AT[world]) and name not in SKIP_AT.get(world, ()))}
