"""Context parallelism: every sequence split over the ``cp`` ranks of a context-parallel group.

The split is the load-balanced causal one of Megatron-Core and TransformerEngine: the sequence in ``2 cp``
chunks of ``c = seq_len / (2 cp)`` tokens, cp rank ``i`` holding chunks ``i`` and ``2 cp - 1 - i``, so every
rank does the same causal attention work (an early chunk attends to few keys, its partner to many).

- **Inputs** (``ContextParallel.split``): each cp rank of a data-parallel rank reads the same samples and keeps
  its two chunks, their global positions (the model's ``positions`` argument: RoPE and learned position
  embeddings follow the chunks) and the next-token targets taken from the whole sequence before the split.
- **Attention**, all-gather variant (Llama 3, arXiv:2407.21783 §3.3.2): keys and values all-gathered over the
  group in one collective with ``all_gather_single`` (PyTorch's functional collective, differentiable: their
  gradients are reduce-scattered back; what ``torch.distributed.nn.functional.all_gather``'s deprecation
  points to), then each local query chunk attends to the keys up to its end under the causal mask of its
  global positions (lower-right aligned: PyTorch's ``causal_lower_right``, which flash attention runs without
  a mask in memory). ``apply_cp`` runs every layer's forward under a ``TorchFunctionMode`` that
  replaces its ``F.scaled_dot_product_attention`` calls with that (torchtitan's ``context_parallel`` patches
  SDPA the same way), so the user's model is not rewritten; inside the layer's forward, so that activation
  checkpointing's recomputation runs it too.
- **Loss** (``ContextParallel.loss``): the model file's ``loss_fn`` on each chunk, the chunk's next token
  appended (the sequence's last chunk has none), weighted by its number of targets: each rank's loss is
  ``cp`` times its share of the sequence's mean, so the mean over cp ranks is the whole sequence's loss and
  the gradients averaged over ``dp x cp`` (the data-parallel engines' group under cp) are the plan's. A loss of
  each token at its own position (a masked LM's, ``aligned``: ``check_loss`` tells which) is the mean over the
  rank's tokens, whose mean over the cp ranks is the sequence's.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right
from torch.overrides import TorchFunctionMode

from autopar.errors import AutoparError
from autopar.plan import LayerAssignment, RunPlan
from autopar.runtime.wrap import forward_within
from cost_models import ConfigError
from cost_models.rules import check_context

POSITIONS = "positions"  # the keyword a model's forward takes its tokens' global positions by


def check_plan(spec: RunPlan) -> None:
    """What the runtime cannot run in a context-parallel plan, in one line (before torchrun and on every rank)."""
    p = spec.parallelism
    if p.cp == 1:
        return
    try:  # the plan's rule (a plan parsed by autopar.plan has passed it already; a spec built in code may not)
        check_context(p.cp, seq_len=spec.model.seq_len)
    except ConfigError as err:
        raise AutoparError(str(err)) from None
    if p.cp_comm != "all_gather":
        raise AutoparError(f"cp_comm '{p.cp_comm}': the runtime runs context parallelism with the all-gather "
                           "variant only; re-plan with cp_comm all_gather")
    if not spec.uniform_tp:
        raise AutoparError("per-layer tensor-parallel degrees with cp > 1 are not supported by the runtime; "
                           "re-plan with one tp for every layer")


def check_launch(spec: RunPlan, source: str) -> None:
    """Before torchrun: the model file can run the plan's cp (``check_model`` on the model built on meta)."""
    if spec.parallelism.cp == 1:
        return
    from autopar.capture import load_spec
    from autopar.runtime.init import build_meta

    loaded = load_spec(source, spec.model.overrides)
    model = build_meta(loaded.build)
    check_model(model, loaded.example_inputs, loaded.loss_fn, spec.parallelism.cp)
    check_kernels(model, loaded.example_inputs, spec.model.seq_len)


def check_kernels(model: nn.Module, example_inputs: Callable[[int, int], tuple], seq_len: int) -> None:
    """transformers' attention modules run their own kernel, mask and all (autopar.runtime.hf_attention: refused
    only for a kernel it cannot call); any other attention must call SDPA without a mask (``check_masks``)."""
    from autopar.runtime.hf_attention import check

    if not check(model):
        check_masks(model, example_inputs, seq_len)


def check_masks(model: nn.Module, example_inputs: Callable[[int, int], tuple], seq_len: int) -> None:
    """The forward on meta, with positions as under cp: attention calls SDPA, none with an explicit mask (a sliding
    window, a Hugging Face model's mask), which the split sequence would need split too. A forward that reads values
    (transformers checking that a mask is all ones) cannot run on meta: then the ranks check it."""
    tokens = example_inputs(2, seq_len)[0].to("meta")
    spy = _MaskSpy()
    try:
        with torch.no_grad(), spy:
            model(tokens, positions=torch.arange(seq_len, device="meta").expand(2, seq_len))
    except Exception:  # noqa: BLE001 - the ranks check what meta cannot tell
        return
    if spy.masked and not masks_from_positions(model):
        raise AutoparError(f"context parallelism runs attention without an explicit mask; {type(model).__name__} "
                           "passes attn_mask to scaled_dot_product_attention (a sliding window or a padding mask): "
                           "re-plan with cp 1")
    if not spy.calls:  # attention computed op by op (a Hugging Face module outside transformers' interface)
        raise AutoparError(f"context parallelism splits attention at F.scaled_dot_product_attention; "
                           f"{type(model).__name__} never calls it (eager attention); re-plan with cp 1")


def masks_from_positions(model: nn.Module) -> bool:
    """Whether the masks ``model`` passes to SDPA can only be causal: a transformers model (autopar.capture.hf's
    wrapper, which passes no padding) whose config names no other mask (a sliding window, ALiBi biases, chunked
    attention, non-causal layer types), as Falcon builds one for every call. What it then passes is the causal mask
    of the local tokens, which every call checks (``local_causal``) and replaces with the sequence's."""
    config = getattr(getattr(model, "hf", None), "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False):
        return False
    others = (getattr(config, "alibi", False), getattr(config, "sliding_window", None),
              getattr(config, "attention_chunk_size", None))
    types = getattr(config, "layer_types", None) or ()
    return not any(others) and all(kind == "full_attention" for kind in types)


def local_causal(mask: torch.Tensor, queries: int, keys: int) -> bool:
    """Whether an SDPA mask is the causal mask of the local tokens in their order (what transformers builds from
    the positions 0 .. T/cp - 1 of the split sequence, for a forward without padding): True (or 0.0 in an additive
    mask) exactly on and below the diagonal, every other entry masked out."""
    if mask.dim() < 2 or tuple(mask.shape[-2:]) != (queries, keys) or queries != keys:
        return False
    causal = torch.ones(queries, keys, dtype=torch.bool, device=mask.device).tril()
    if mask.dtype == torch.bool:
        return torch.equal(mask, causal.expand_as(mask))
    return (torch.equal(mask == 0, causal.expand_as(mask))
            and bool((mask.masked_select(~causal.expand_as(mask)) <= torch.finfo(mask.dtype).min / 2).all()))


class _MaskSpy(TorchFunctionMode):
    """Whether any ``F.scaled_dot_product_attention`` call while active had an explicit mask, and how many ran."""

    def __init__(self) -> None:
        super().__init__()
        self.masked = False
        self.calls = 0

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            self.calls += 1
            self.masked |= (kwargs.get("attn_mask") if "attn_mask" in kwargs else
                            (args[3] if len(args) > 3 else None)) is not None
        return func(*args, **kwargs)


def check_model(model: nn.Module, example_inputs: Callable[[int, int], tuple], loss_fn: Callable[..., torch.Tensor],
                cp: int) -> None:
    """The model can run context-parallel: token-id inputs of one length (an encoder-decoder's two, split alike;
    a vision-language model's ids beside its images: ``whole_inputs``), a forward taking ``positions``, and a loss
    that the per-chunk composition reproduces (a next-token mean, as the examples' loss_fn)."""
    inputs = example_inputs(1, 4 * cp)
    ids = [t.dtype in (torch.int64, torch.int32) and t.shape == inputs[0].shape for t in inputs]
    whole = whole_inputs(model)
    if not ids[0] or not (all(ids) or whole):
        raise AutoparError(f"context parallelism splits token ids: this model takes {len(inputs)} input(s) of "
                           f"{', '.join(str(t.dtype) for t in inputs)}; re-plan with cp 1")
    check_positions(model)
    check_loss(loss_fn, cp, 1 if whole else len(inputs))


def check_positions(model: nn.Module) -> None:
    if POSITIONS not in inspect.signature(model.forward).parameters:
        raise AutoparError(f"context parallelism: {type(model).__name__}.forward must take `{POSITIONS}` (each "
                           "token's position in its sequence, for RoPE / position embeddings) as examples/llama.py "
                           "does; add it or re-plan with cp 1")
    from autopar.runtime.hf_attention import forward_reads

    if position_rule(model) is not None:
        if not getattr(model, "_takes_positions", True):  # M2M100's: counted from the ids, and no way to pass them
            raise AutoparError(f"context parallelism: {type(model).__name__} counts positions from the token ids "
                               "and takes no position_ids to be given the sequence's; re-plan with cp 1")
        return  # each chunk takes its slice of the positions the model counts over the whole sequence
    for module in model.modules():  # RoBERTa's: padding_idx + 1 + the count of non-padding tokens before it
        if forward_reads(module, "create_position_ids_from_input_ids"):
            raise AutoparError(f"context parallelism: {type(module).__name__} derives positions from the token ids "
                               "(counting non-padding tokens), which a chunk of the sequence cannot; re-plan with "
                               "cp 1")


def position_rule(model: nn.Module) -> Callable[[torch.Tensor], torch.Tensor] | None:
    """How ``model`` counts position ids from whole sequences of token ids, where it does (a Hugging Face model of
    RoBERTa's family: autopar.capture.hf.HFModel.position_rule); None: positions 0 .. S - 1."""
    rule = getattr(model, "position_rule", None)
    return rule() if rule is not None else None


def check_loss(loss_fn: Callable[..., torch.Tensor], cp: int, inputs: int = 1, vocab: int = 11,
               chunk: int = 3) -> bool:
    """The loss on random logits of a whole sequence against the mean over cp ranks of ``ContextParallel.loss``
    of their chunks: equal (1e-5) for a next-token loss averaged over tokens (False), or for a loss of each token
    at its own position (True: a masked LM's, an encoder-decoder's over its decoder's tokens, ``aligned``), else
    the runtime refuses. ``inputs``: the token-id inputs the model takes (split alike)."""
    gen = torch.Generator().manual_seed(0)
    seq = 2 * cp * chunk
    tokens = tuple(torch.randint(0, vocab, (2, seq), generator=gen) for _ in range(inputs))
    logits = torch.randn(2, seq, vocab, generator=gen)
    failed: Exception | None = None
    for aligned in (False, True):
        try:
            whole = float(loss_fn(logits, *tokens))
            parts = []
            for rank in range(cp):
                run = ContextParallel(cp, rank, None, loss_fn, aligned=aligned)
                *_, positions, targets = run.split(tokens)
                parts.append(float(run.loss(logits[:, positions[0]], targets)))
        except Exception as e:  # the user's loss on tensors it did not expect (or not in this composition)
            failed = failed or e
            continue
        if abs(sum(parts) / cp - whole) <= 1e-5 * max(1.0, abs(whole)):
            return aligned
    if failed is not None:
        raise AutoparError(f"context parallelism: the model's loss_fn fails on logits and token ids "
                           f"({type(failed).__name__}: {str(failed).splitlines()[0] if str(failed) else ''}); "
                           "re-plan with cp 1") from None
    raise AutoparError("context parallelism: the model's loss_fn is neither a next-token loss averaged over tokens "
                       "(loss_fn(logits, idx) predicting idx[:, 1:] from logits[:, :-1]) nor one of every token at "
                       "its own position (a masked LM's), which the split sequence reproduces chunk by chunk; "
                       "re-plan with cp 1")


@dataclasses.dataclass
class ContextParallel:
    """One rank's part of a context-parallel group: its chunks, attention over the group, its loss."""

    cp: int
    rank: int  # in the cp group
    group: dist.ProcessGroup | None  # None: only split and loss (the model-file checks)
    loss_fn: Callable[..., torch.Tensor]
    masks: dict[tuple[int, int], Any] = dataclasses.field(default_factory=dict, repr=False)
    passthrough: int = 0  # > 0: SDPA calls go to the kernel as made (autopar.runtime.hf_attention built the mask)
    aligned: bool = False  # the loss reads each token at its own position (a masked LM), not the next token
    # whole sequences' token ids -> their position ids, for a model that counts them from the ids (RoBERTa:
    # autopar.capture.hf.HFModel.position_rule); None: 0 .. S - 1
    positions_of: Callable[[torch.Tensor], torch.Tensor] | None = None
    # the model takes the whole inputs (a vision-language model's ids and images: ``whole_inputs``) and its text
    # layers this rank's chunks of the merged embeddings (``apply_cp``)
    whole: bool = False

    @property
    def chunks(self) -> tuple[int, int]:
        return self.rank, 2 * self.cp - 1 - self.rank

    def split(self, batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """Whole sequences ``(B, T)`` -> the model's inputs (this rank's tokens; under ``whole`` every input
        whole), the positions of this rank's tokens ``(B, T / cp)`` and its targets ``(B, T / cp + 2)``: each
        chunk's tokens followed by the token after it (the sequence's last chunk: a 0 that no loss reads)."""
        tokens = batch[0]
        size, seq = tokens.shape
        c = seq // (2 * self.cp)
        for j in self.chunks:  # made here, not under selective recomputation (which cannot make a CausalBias)
            self.causal_mask(c, (j + 1) * c)
        index = self.local_positions(2 * c).to(tokens.device)
        whole = self.positions_of(tokens) if self.positions_of is not None else None
        positions = index.repeat(size, 1) if whole is None else whole[:, index].contiguous()
        inputs = tuple(batch) if self.whole else tuple(t[:, index] for t in batch)
        if self.aligned:  # each token is its own target: (B, inputs, T / cp), every input's for the loss
            return *inputs, positions, torch.stack([t[:, index] for t in batch[:1 if self.whole else None]], dim=1)
        padded = torch.cat([tokens, tokens.new_zeros(size, 1)], dim=1)
        targets = torch.cat([padded[:, j * c:(j + 1) * c + 1] for j in self.chunks], dim=1)
        return *inputs, positions, targets  # contiguous: the pipeline sends positions on

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """``cp`` x this rank's share of the sequence's mean loss (see the module docstring); an aligned loss:
        the mean over this rank's tokens, a cp-th of them all."""
        if self.aligned:
            return self.loss_fn(output, *targets.unbind(1))
        c = output.shape[1] // 2
        last = 2 * self.cp - 1
        total: torch.Tensor | float = 0.0
        for half, j in enumerate(self.chunks):
            out = output[:, half * c:(half + 1) * c]
            target = targets[:, half * (c + 1):(half + 1) * (c + 1)]
            if j == last:  # its last token predicts nothing
                if c > 1:
                    total = total + self.loss_fn(out, target[:, :c]) * (c - 1)
            else:  # a dummy row after the chunk's logits: the loss drops the last row and reads the next token
                padded = torch.cat([out, torch.zeros_like(out[:, :1])], dim=1)
                total = total + self.loss_fn(padded, target) * c
        return total * (self.cp / (2 * self.cp * c - 1))  # type: ignore[return-value]

    def local_positions(self, length: int) -> torch.Tensor:
        """The sequence positions of this rank's ``length`` tokens (its two chunks, in order)."""
        c = length // 2
        return torch.cat([torch.arange(j * c, (j + 1) * c) for j in self.chunks])

    def causal_mask(self, queries: int, keys: int) -> Any:
        """Causal attention of the last ``queries`` positions of ``keys`` (PyTorch's CausalBias, lower right)."""
        if (queries, keys) not in self.masks:
            self.masks[queries, keys] = causal_lower_right(queries, keys)
        return self.masks[queries, keys]

    def gather(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole sequence's keys and values, in sequence order, from every rank's two chunks: one collective
        for both, side by side, (batch, heads, 2c, key width + value width) per rank (the widths differ under
        DeepSeek's latent attention)."""
        c = key.shape[-2] // 2
        width = key.shape[-1]
        kv = torch.cat((key, value), dim=-1)
        gathered = funcol.all_gather_single(kv, 0, self.group).view(self.cp, *kv.shape)
        pieces = {}
        for rank in range(self.cp):  # rank r holds chunks r and 2cp-1-r: put them in sequence order
            pieces[rank], pieces[2 * self.cp - 1 - rank] = gathered[rank, ..., :c, :], gathered[rank, ..., c:, :]
        whole = torch.cat([pieces[j] for j in range(2 * self.cp)], dim=-2)
        return whole[..., :width], whole[..., width:]

    @contextlib.contextmanager
    def direct(self) -> Iterator[None]:
        """While active, F.scaled_dot_product_attention runs as called (on keys this object gathered)."""
        self.passthrough += 1
        try:
            yield
        finally:
            self.passthrough -= 1

    def attend(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Any = None,
               dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
               enable_gqa: bool = False) -> torch.Tensor:
        """``F.scaled_dot_product_attention`` of the local queries against the whole sequence's keys and values."""
        if isinstance(attn_mask, torch.Tensor) and not is_causal and \
                local_causal(attn_mask, query.shape[-2], key.shape[-2]):
            attn_mask, is_causal = None, True  # the local tokens' causal mask (Falcon's): the sequence's instead
        if attn_mask is not None:
            raise AutoparError("context parallelism runs attention without an explicit mask (is_causal=True, or "
                               "full attention) or with the causal mask of the local tokens; this model passes "
                               "another attn_mask to scaled_dot_product_attention: re-plan with cp 1")
        c = query.shape[-2] // 2
        keys, values = self.gather(key, value)
        options = dict(dropout_p=dropout_p, scale=scale, enable_gqa=enable_gqa)
        if not is_causal:
            return F.scaled_dot_product_attention(query, keys, values, **options)
        outs = []
        for half, j in enumerate(self.chunks):  # a query chunk needs the keys up to its own end only
            end = (j + 1) * c
            # the causal mask aligned to the last key (query a sees keys 0 .. j c + a), never materialised where
            # a fused kernel takes it (PyTorch's CausalBias: flash attention's own lower-right causal mode)
            outs.append(F.scaled_dot_product_attention(query[..., half * c:(half + 1) * c, :], keys[..., :end, :],
                                                       values[..., :end, :], attn_mask=self.causal_mask(c, end),
                                                       **options))
        return torch.cat(outs, dim=-2)


def whole_inputs(model: nn.Module) -> bool:
    """Whether cp splits ``model``'s sequence after its glue, not its token ids: a vision-language model merges
    its image features into the text embeddings at the image tokens' places, so every cp rank runs the whole inputs
    through the tower (on its own sequence: autopar.capture.towers) and the merge, and its text layers take the
    rank's chunks of the merged embeddings, as Megatron-Core's LLaVA splits them after combining
    (``_get_data_on_this_cp_rank``, megatron/core/models/multimodal/llava_model.py)."""
    from autopar.capture.towers import text_model

    return text_model(model) is not None


def split_after_glue(model: nn.Module) -> bool:
    """Under cp, a vision-language model's text model takes this rank's chunks of the merged embeddings (a pre-hook,
    on the model before a pipeline's trace and its chunk copies, which keep it); whether ``model`` is one."""
    from autopar.capture.towers import text_model

    text = text_model(model)
    if text is not None and not getattr(text, "_autopar_cp_local", False):
        text.register_forward_pre_hook(_local_embeddings, with_kwargs=True)
        text._autopar_cp_local = True
    return text is not None


def _local_embeddings(module: nn.Module, args: tuple, kwargs: dict) -> tuple | None:
    """The text model's whole merged embeddings -> this rank's chunks, at the positions it was given."""
    embeds, positions = kwargs.get("inputs_embeds"), kwargs.get("position_ids")
    if embeds is None or positions is None or embeds.shape[1] == positions.shape[1]:
        return None
    index = positions[..., None].expand(-1, -1, embeds.shape[-1])
    return args, {**kwargs, "inputs_embeds": embeds.gather(1, index)}


def apply_cp(model: nn.Module, layers: list[LayerAssignment], run: ContextParallel,
             own: frozenset[str] = frozenset()) -> None:
    """Every layer's forward under ``run``'s attention (replaced on the instance, as autopar.runtime.ac does:
    parameter names stay the user's). Before activation checkpointing wraps the same forward. ``own``: layers on a
    sequence of their own (a vision tower's), which run whole (``split_after_glue`` split the text before)."""
    from autopar.runtime.hf_attention import route, route_positions

    if run.positions_of is None:  # else the model counts its positions from the whole ids
        route_positions(model, run)
    for layer in layers:
        if layer.name in own:
            continue
        for unit in layer.units:
            module = model.get_submodule(unit)
            route(module, run)  # transformers' attention modules: their own kernels on the gathered keys
            forward_within(module, lambda: _ContextParallelAttention(run))


class _ContextParallelAttention(TorchFunctionMode):
    """Every ``F.scaled_dot_product_attention`` call while active runs ``ContextParallel.attend`` instead."""

    def __init__(self, run: ContextParallel):
        super().__init__()
        self.run = run

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func is F.scaled_dot_product_attention and not self.run.passthrough:
            return self.run.attend(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))
