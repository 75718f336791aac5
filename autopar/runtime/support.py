"""What autopar's own runtime can run of a model, asked before the search.

`autopar solve` (engine ``autopar``, the default) searches only plans that `autopar launch` runs on this model:
each feature below is tried here on the model built on the meta device, by the same checks the launcher runs
before torchrun (no process group, no storage), and a feature the runtime refuses is left out of the search
with the launcher's one-line reason as a note on the plan. Other engines (``--engine megatron`` …) run their
own code and are searched in full.

The features: ``pp`` (the top-level forward splits into pipeline chunks: autopar.runtime.pp, or a Hugging Face
model's into module stages: autopar.runtime.stages), ``tp`` (no replicated projection feeds the sharded heads
directly, no column-parallel linear holds projections the model splits: autopar.runtime.train.model_layers),
``sequence_parallel`` (every model whose sequence splits in two: autopar.runtime.sequence), ``cp`` (one token-id
input, a ``positions`` argument not counted from the ids, a next-token or masked-LM loss, attention without an
explicit mask or through a transformers attention module: autopar.runtime.cp, autopar.runtime.hf_attention), ``ep``
(the MoE modules follow the expert contract: autopar.runtime.ep, or transformers' experts layout:
autopar.runtime.hf_experts), ``etp`` above 1 (every model whose experts run under ep) and ``dualpipev`` (one model
input: torch's ScheduleDualPipeV splits a backward into its input and weight passes, which fail where a second input
flows past the chunks, T5's and BART's encoder output: "backward through the graph a second time").
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from autopar.errors import AutoparError

FEATURES = ("pp", "tp", "sequence_parallel", "cp", "ep", "etp", "dualpipev")


def unsupported(profile: Any) -> dict[str, str]:
    """feature -> why autopar's runtime cannot run it on this model (one line), for the features of FEATURES it
    refuses; empty when it runs them all. ``profile``: the model's ModelProfile (its source is rebuilt on meta)."""
    from autopar.capture import load_spec
    from autopar.runtime.init import build_meta

    loaded = load_spec(profile.source, profile.overrides)
    model = build_meta(loaded.build)  # no check changes it: a trace, a forward on meta, a look at modules
    out: dict[str, str] = {}
    for feature, check in (("pp", _pipeline), ("tp", _tensor), ("sequence_parallel", _sequence_parallel),
                           ("cp", _context), ("ep", _experts), ("etp", _expert_tp), ("dualpipev", _dualpipev)):
        try:
            check(profile, loaded, model)
        except AutoparError as err:
            out[feature] = str(err)
    return out


def _pipeline(profile: Any, loaded: Any, model: Any) -> None:
    """Two chunks at the cut nearest the middle (not inside a vision tower one chunk holds whole): the split needs
    only the top-level trace (or a Hugging Face model's layers called in plan order), wherever the cut falls. On a
    copy: a Hugging Face split stands layers in for others."""
    import copy

    from autopar.plan import LayerAssignment
    from autopar.runtime.pp import split_model
    from cost_models.partition import forbidden_cuts

    forbidden = forbidden_cuts(profile.layers)
    allowed = [i for i in range(1, len(profile.layers)) if i not in forbidden]
    if not allowed:
        raise AutoparError("a model of one layer (or of layers one chunk holds whole) has no pipeline cut")
    half = min(allowed, key=lambda i: abs(i - len(profile.layers) // 2))
    layers = tuple(LayerAssignment(name=layer.name, stage=int(i >= half), tp=1)
                   for i, layer in enumerate(profile.layers))
    split_model(copy.deepcopy(model), layers, [0, 1], micro_batch=tuple(loaded.example_inputs(1, profile.seq_len)))


def replan(check: Callable[[Any], None], arg: Any, change: str) -> None:
    """``check(arg)``, its one line ending with the change that would run (what the launcher says)."""
    try:
        check(arg)
    except AutoparError as err:
        raise AutoparError(f"{err}; re-plan with {change}") from None


def check_heads(layers: Any) -> None:
    """A replicated linear feeding the sharded heads directly (DeepSeek's latent KV projection, whose rotary key
    all heads share) needs its gradient summed over tp on the features that do (autopar.runtime.latent): capture
    must have found them."""
    for layer in layers:
        unknown = [rel for rel in layer.tp.shared_feeders if rel not in layer.tp.shared_columns]
        if unknown:
            raise AutoparError(f"layer {layer.name}: {', '.join(unknown)} stays whole on every tp rank but feeds the "
                               "sharded heads directly, and capture did not find which of its features do (a split "
                               "on the features): the runtime cannot sum their gradient over tp")


def check_fused(layers: Any) -> None:
    """A column-parallel linear whose output rows are several projections the model splits at offsets of the whole
    width (Phi-3's ``qkv_proj`` at ``num_attention_heads * head_dim`` from its config, its ``gate_up_proj`` in two
    halves: capture's ``TPPair.fused``) runs with each rank holding its block of every projection (autopar.runtime.tp
    ``_FusedColwise``): the projections must be equal in width, which grouped-query attention's q|k|v are not."""
    for layer in layers:
        for pair in layer.tp.pairs:
            if pair.fused == 3 and (pair.inner_features % 3 or pair.heads and pair.head_dim and
                                    pair.inner_features != 3 * pair.heads * pair.head_dim):
                raise AutoparError(f"layer {layer.name}: {pair.columnwise[0]} stacks q, k and v of unequal widths "
                                   f"(grouped-query attention: {pair.inner_features} rows for {pair.heads} query "
                                   "heads), which the runtime's strided shards do not split")


def check_fused_fp8(layers: Any, fp8: str | None) -> None:
    """torchao's Float8Linear on a fused linear under tp: its tensorwise scale is the whole weight's, and the
    runtime runs such a linear on its local rows (autopar.runtime.tp ``_FusedColwise``)."""
    for layer in layers:
        fused = [pair.columnwise[0] for pair in layer.tp.pairs if pair.fused > 1]
        if fp8 and fused:
            raise AutoparError(f"layer {layer.name}: {fused[0]} stacks several projections, which the runtime runs "
                               "under tp without FP8")


def check_sequence_length(seq_len: int, tp: int, *, uneven: bool) -> None:
    """Sequence parallelism splits the sequence into tp blocks. ``uneven``: the layers take blocks of unequal length
    (a Hugging Face model's, a ViT's 197 tokens: DTensor's uneven shards, autopar.runtime.sequence); a model file's
    layers (torch's sequence-parallel styles) and the experts' token dispatch take equal ones."""
    if seq_len % tp and not uneven:
        raise AutoparError(f"the sequence ({seq_len} tokens) does not split into {tp} equal blocks for sequence "
                           "parallelism")


def uneven_blocks(profile: Any) -> bool:
    """Whether the model's layers take sequence blocks of unequal length (``check_sequence_length``): a Hugging Face
    model's without experts."""
    return Path(profile.source).suffix == ".json" and not any(layer.moe for layer in profile.layers)


def check_attention(profile: Any) -> None:
    """A model file's attention must call F.scaled_dot_product_attention (autopar.runtime.cp); a Hugging Face
    model's attention modules run their own kernels, eager ones included (autopar.runtime.hf_attention)."""
    if profile.attention_impl == "eager" and Path(profile.source).suffix == ".py":
        raise AutoparError("context parallelism runs attention through F.scaled_dot_product_attention; this model "
                           "file computes it op by op (eager attention)")


def _tensor(profile: Any, loaded: Any, model: Any) -> None:
    check_heads(profile.layers)
    check_fused(profile.layers)


def _sequence_parallel(profile: Any, loaded: Any, model: Any) -> None:
    """Every Hugging Face model runs it: its layers take the whole sequence where its glue or a layer without a
    tensor-parallel pattern needs it (autopar.runtime.sequence). A model file's layers must each take a shard
    (check_sequence_shards); a pattern that does not divide a plan's degree is the launcher's per-plan check
    (autopar.runtime.train.model_layers)."""
    check_sequence_length(profile.seq_len, 2, uneven=uneven_blocks(profile))  # no tp degree the search tries
    if Path(profile.source).suffix != ".json":
        check_sequence_shards(profile.layers)


def check_sequence_shards(layers: Any) -> None:
    """Sequence parallelism hands every layer of a model file a shard of the sequence; a layer without a
    tensor-parallel pattern (a convolution stem, a layer of its own kind) runs whole on each tp rank and cannot
    take one (what the launcher refuses: autopar.runtime.train)."""
    whole = [layer.name for layer in layers if not layer.tp.plan]
    if whole:
        more = f" (and {len(whole) - 1} more)" if len(whole) > 1 else ""
        raise AutoparError(f"layer {whole[0]}{more} has no tensor-parallel pattern: it runs whole on each tp rank "
                           "and cannot take sequence shards")


def _context(profile: Any, loaded: Any, model: Any) -> None:
    from autopar.runtime.cp import check_kernels, check_model

    if not any(pair.kind == "attention" for layer in profile.layers for pair in layer.tp.pairs):
        return  # the search gives such a model cp 1 anyway (autopar.search.space.cp_degrees)
    if profile.seq_len % 2 or profile.seq_len < 4:
        return  # no cp splits this sequence in 2 cp chunks (ViT's 197 tokens): the search has only cp 1 to try
    check_attention(profile)
    check_model(model, loaded.example_inputs, loaded.loss_fn, 2)
    check_kernels(model, loaded.example_inputs, profile.seq_len)


def _experts(profile: Any, loaded: Any, model: Any) -> None:
    from autopar.runtime.ep import check_moe_module, moe_modules

    for layer in profile.layers:
        if layer.moe is None:
            continue
        for unit in layer.name.split("+"):
            found = moe_modules(model.get_submodule(unit))
            if found is None:
                raise AutoparError(f"layer {unit}: the runtime does not find the experts capture priced")
            moe, experts, info = found
            check_moe_module(unit, moe, experts, info.num_experts)


def _expert_tp(profile: Any, loaded: Any, model: Any) -> None:
    """Every MoE layer the runtime routes splits its experts' FFN width over etp, transformers' stacked gate and up
    rows included (autopar.runtime.hf_experts); a degree that does not divide it is the launcher's per-plan check
    (autopar.runtime.ep.check_experts)."""


def _dualpipev(profile: Any, loaded: Any, model: Any) -> None:
    """DualPipeV (autopar.runtime.pp) on a model of one input: T5 at pp 2 failed in a weight pass, its encoder output
    read by every decoder chunk; a model of several inputs (an encoder-decoder, LLaVA's pixels) is refused."""
    from autopar.runtime.pp import check_dualpipev_inputs

    check_dualpipev_inputs(loaded, profile.seq_len)
