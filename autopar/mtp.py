"""Multi-token prediction: the layers it adds to a model's profile.

DeepSeek-V3 (DeepSeek-AI 2024, arXiv:2412.19437, §2.2 and Figure 3) trains D sequential MTP modules beside the
model: module k normalises the previous depth's hidden state and the embedding of the token k ahead (RMSNorm
each), projects their concatenation [h; e] from 2·d to d (M_k), runs one transformer block like the model's own,
and predicts through the shared output head. Megatron-Core (``--mtp-num-layers``, multi_token_prediction.py:
MultiTokenPredictionLayer with enorm, hnorm, eh_proj, transformer_layer and final_layernorm) builds the same
and places every MTP layer on the last pipeline stage, after the decoder's layers (``get_mtp_layer_offset``; its
pipeline layout's ``m``), with the embedding it shares held there as a copy whose gradient is all-reduced with
the first stage's (its embedding group).

``with_mtp(profile, n)`` adds, after the model's last block, n layers ``mtp.K`` (kind block): a copy of that
block plus the two norms, the projection and the final norm (2·d² + 3·d parameters, 4·d² FLOPs a token; the
embedding lookup's gather, a copy of a row per token, is left out), the first of them using the embedding's weights
as a tied copy (one for every depth, as Megatron-Core builds one embedding on that stage; a model that ties its
head to the embedding holds a second there, the head's own, as Megatron-Core allocates the output layer's weight
off the first stage); and after the head n layers ``mtp.K.head``: the head's work again on its own weights (no
parameters of their own). No pipeline cut is allowed after an MTP layer, the final norm or a head, so they all
share the last chunk.

Assumed, where Megatron-Core does a little more: the projection is sharded with the block under tensor
parallelism and the all-gather of its output (one hidden-width gather per token, as a sequence-parallel norm
has) is not priced; the MTP loss's scaling and logging are free.
"""
from __future__ import annotations

from autopar.errors import AutoparError
from autopar.profile import LayerProfile, ModelProfile, source_was_named, traced_here
from cost_models.model import DTYPE_BYTES, MTP_PREFIX, decoder_blocks, mtp_depth

# Per token of an MTP layer's own parts beside its block, in elements of the hidden width d: the three RMSNorms
# read and write d each (6), the concatenation writes and the projection reads 2·d (4); autograd keeps the norms'
# inputs (3) and the projection's input (2).
NORMS = 3
TRAFFIC_PER_D = 10
SAVED_PER_D = 5


def with_mtp(profile: ModelProfile, layers: int) -> ModelProfile:
    """``profile`` with ``layers`` MTP layers (module docstring); itself when it already holds that many."""
    held = mtp_depth(profile.layers)
    if layers == held:
        return profile
    if held:
        raise AutoparError(f"the profile already holds {held} MTP layers; load the model again for {layers}")
    if layers < 0:
        raise AutoparError(f"--mtp-layers must be 0 or more, got {layers}")
    blocks = decoder_blocks(profile.layers)
    heads = [i for i, layer in enumerate(profile.layers) if layer.kind == "head"]
    if not blocks or not heads or heads[-1] < blocks[-1]:
        raise AutoparError(f"{profile.name} has no transformer blocks followed by an output head, which multi-token "
                           "prediction needs; drop --mtp-layers")
    last, head = profile.layers[blocks[-1]], profile.layers[heads[-1]]
    embedding = next((layer for layer in profile.layers if layer.kind == "embedding"), None)
    # one embedding on the last stage serves every depth (Megatron-Core's GPTModel builds it where mtp_process)
    mtp = [_mtp_block(profile, last, k, embedding.params if embedding and k == 0 else 0) for k in range(layers)]
    outputs = [head.model_copy(update={"name": f"{MTP_PREFIX}{k}.head", "block_id": f"{head.block_id}|mtp-head",
                                       "params": 0, "tied_params": 0, "param_bytes": 0}) for k in range(layers)]
    before, after = profile.layers[:blocks[-1] + 1], profile.layers[blocks[-1] + 1:]
    tail = [*mtp, *after, *outputs]
    ordered = [*before, *(layer.model_copy(update={"pipeline_cut_after": False}) for layer in tail[:-1]), tail[-1]]
    added = sum(layer.params for layer in mtp)
    out = profile.model_copy(update={
        "layers": [layer.model_copy(update={"index": i}) for i, layer in enumerate(ordered)],
        "params": profile.params + added,
        "param_bytes": profile.param_bytes + sum(layer.param_bytes for layer in mtp)})
    return traced_here(out) if source_was_named(profile) else out


def _mtp_block(profile: ModelProfile, last: LayerProfile, k: int, embedding_params: int) -> LayerProfile:
    """MTP layer k: the model's last block, plus its norms and projection, using the embedding as a tied copy."""
    nbytes = DTYPE_BYTES[profile.dtype]
    d = profile.hidden_size or last.input_bytes_per_sample // (profile.seq_len * nbytes)
    if d <= 0:
        raise AutoparError(f"{profile.name}: no hidden size to size the MTP projection; drop --mtp-layers")
    own = 2 * d * d + NORMS * d
    tokens = profile.seq_len
    gemm = 2.0 * (2 * d) * d * tokens  # [h; e] (2·d) × M_k (d) per token
    added = {"fwd_flops_per_sample": gemm, "fwd_matmul_flops_per_sample": gemm,
             "fwd_memory_bytes_per_sample": TRAFFIC_PER_D * d * nbytes * tokens,
             "fwd_fused_memory_bytes_per_sample": TRAFFIC_PER_D * d * nbytes * tokens,
             "saved_bytes_per_sample": SAVED_PER_D * d * nbytes * tokens,
             "autocast_saved_bytes_per_sample": SAVED_PER_D * d * nbytes * tokens}
    update = {name: getattr(last, name) + extra for name, extra in added.items()
              if getattr(last, name) is not None}  # a figure the capture did not measure stays unmeasured
    return last.model_copy(update={**update, "name": f"{MTP_PREFIX}{k}", "block_id": f"{last.block_id}|mtp",
                                   "params": last.params + own, "tied_params": embedding_params,
                                   "param_bytes": last.param_bytes + own * nbytes})
