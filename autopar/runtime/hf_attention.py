"""Context parallelism for transformers' attention modules, whatever kernel they run: eager attention (Gemma-2's
logit soft-capping, GPT-OSS's sinks) and SDPA with a sliding window (Mistral, Phi-3, Gemma-2/3, GPT-OSS) as well as
plain causal SDPA.

transformers' attention modules look their kernel up at every call, in ``ALL_ATTENTION_FUNCTIONS`` by their
config's ``_attn_implementation`` (eager: the modeling file's ``eager_attention_forward``). ``route`` gives each
attention module of a layer a copy of its config naming ``autopar_cp`` (registered here with transformers'
``AttentionInterface.register``) and keeps the kernel it ran in the module's ``__dict__`` (no parameter or buffer
changes name). ``autopar_cp`` then:

- for plain causal SDPA (no window, no soft-capping, no sinks): calls the model's kernel unchanged; its
  ``F.scaled_dot_product_attention(is_causal=True)`` is answered by ``ContextParallel.attend`` (autopar.runtime.cp)
  as for a model file: the causal mask never materialised;
- otherwise: all-gathers keys and values over the cp group (``ContextParallel.gather``) and runs the module's own
  kernel once per local query chunk against the keys it may see, with the mask of the chunk's global positions
  built here (causal, and ``kv > q - window`` as transformers' ``sliding_window_overlay``): keys from the window's
  start to the chunk's end, so a window's chunk reads at most window + chunk keys. The mask the model built for the
  local tokens (positions 0 .. T/cp - 1 of the split sequence, not the sequence's) is not used.

An encoder-decoder runs the same way: its encoder's attention both ways over the gathered keys, its decoder's
causal, its cross-attention over the encoder's gathered keys and values. T5 adds a position bias to the logits:
the relative one its first layers compute (``compute_bias``, replaced on those modules by ``_global_bias``: the
local queries' global positions against every key's) and zeros where a module has none (its cross-attention,
built over the local keys: widened to the gathered ones); both go to the module's kernel with the chunk's mask
(``_biased``). Learned absolute positions computed from the local length (BART's ``embed_positions``) take the
local tokens' global positions (``route_positions``).

The same keys and values all-gathered as the model-file path (Llama 3, arXiv:2407.21783 §3.3.2); only where the
kernel is called differs, so every kernel transformers ships for a family runs its own arithmetic (sinks appended
to each query row's logits, soft-capping before the mask) on exactly the keys one process would give it.
"""
from __future__ import annotations

import copy
import functools
import inspect
from typing import Any, Callable

import torch
import torch.nn as nn

from autopar.errors import AutoparError

NAME = "autopar_cp"  # the attention implementation transformers looks up for a routed module
_ROUTED = "_autopar_cp"  # module.__dict__: (the kernel it ran, whether it is eager, the ContextParallel)
_POSITIONS = "_autopar_cp_positions"  # a position embedding's module.__dict__: the ContextParallel
_KERNELS = ("eager", "sdpa")
_EXTRAS = ("softcap", "s_aux")  # what a plain SDPA call never has
_LAYER_TYPES = (None, "full_attention", "sliding_attention")


def forward_of(module: nn.Module) -> Any:
    """The function of ``module``'s class's forward, under its decorators (transformers' deprecate_kwarg …)."""
    return inspect.unwrap(type(module).forward)


def forward_reads(module: nn.Module, name: str) -> bool:
    """Whether ``module``'s class's own forward reads the global ``name`` (a function or table it looks up)."""
    code = getattr(forward_of(module), "__code__", None)
    return code is not None and name in code.co_names


def attention_modules(root: nn.Module) -> list[nn.Module]:
    """The submodules whose forward looks its kernel up in transformers' ``ALL_ATTENTION_FUNCTIONS``."""
    return [module for module in root.modules()
            if forward_reads(module, "ALL_ATTENTION_FUNCTIONS") and hasattr(module, "config")]


def _layer_type(module: nn.Module) -> str | None:
    """The attention layer's type as its config names it (``layer_types``), None where it names none."""
    kind = getattr(module, "layer_type", None)
    types, index = getattr(module.config, "layer_types", None), getattr(module, "layer_idx", None)
    return kind or (types[index] if types and isinstance(index, int) and index < len(types) else None)


def kernel(module: nn.Module) -> tuple[Callable[..., Any], bool]:
    """The kernel ``module`` runs and whether it is the modeling file's eager one, or the one-line refusal: a kernel
    other than eager or SDPA, or a mask other than causal and a sliding window (Llama 4's chunked attention), which
    the masks built here would not reproduce."""
    name = type(module).__name__
    impl = getattr(module.config, "_attn_implementation", None) or "eager"
    if impl not in _KERNELS:
        raise AutoparError(f"context parallelism runs transformers' eager or sdpa attention; {name} runs '{impl}'; "
                           "load it with attn_implementation 'sdpa' or re-plan with cp 1")
    kind = _layer_type(module)
    if kind not in _LAYER_TYPES or getattr(module.config, "attention_chunk_size", None):
        raise AutoparError(f"context parallelism builds causal and sliding-window masks; {name} attends under "
                           f"'{kind or 'chunked_attention'}'; re-plan with cp 1")
    if impl == "sdpa":
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        return ALL_ATTENTION_FUNCTIONS["sdpa"], False
    # the file that defines the forward (a subclass may inherit it from another model's file)
    eager = forward_of(module).__globals__.get("eager_attention_forward")
    if eager is None:
        raise AutoparError(f"context parallelism: {name} runs eager attention but its modeling file "
                           "has no eager_attention_forward to run on the gathered keys; re-plan with cp 1")
    return eager, True


def check(model: nn.Module) -> bool:
    """Whether ``model``'s attention runs through transformers' interface (then ``route`` takes it, and a kernel
    it cannot take is refused here); False: the model-file checks apply (autopar.runtime.cp)."""
    modules = attention_modules(model)
    for module in modules:
        kernel(module)
    return bool(modules)


def route(root: nn.Module, run: Any) -> None:
    """Every attention module under ``root`` calls ``autopar_cp`` with ``run`` (a ContextParallel); a module routed
    before keeps its kernel and takes ``run``. A model without transformers' attention modules is left as it is
    (transformers is not imported)."""
    modules = attention_modules(root)
    if not modules:
        return
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(NAME, _attention)
    copies: dict[int, Any] = {}  # the modules under root that shared a config share its copy
    for module in modules:
        if _ROUTED in module.__dict__:
            fn, eager, _ = module.__dict__[_ROUTED]
            module.__dict__[_ROUTED] = (fn, eager, run)
            continue
        fn, eager = kernel(module)
        module.__dict__[_ROUTED] = (fn, eager, run)
        if getattr(module, "has_relative_attention_bias", False):  # T5's first layers: the stack's position bias
            module.compute_bias = functools.partial(_global_bias, module)
        if id(module.config) not in copies:
            config = copy.copy(module.config)
            config._attn_implementation_internal = NAME  # this module's lookup only: no sub-config to follow
            copies[id(module.config)] = config
        module.config = copies[id(module.config)]


def route_positions(root: nn.Module, run: Any) -> None:
    """Learned absolute position embeddings that count positions from the local length (BART's ``embed_positions``,
    whose forward takes ``position_ids`` but is not given the model's) take the local tokens' global positions."""
    for module in root.modules():
        if isinstance(module, nn.Embedding) and "position_ids" in inspect.signature(module.forward).parameters:
            module.__dict__[_POSITIONS] = run
            if not getattr(module, "_autopar_positions", False):
                module.register_forward_pre_hook(_global_positions, with_kwargs=True)
                module._autopar_positions = True


def _global_positions(module: nn.Module, args: tuple, kwargs: dict) -> tuple:
    first = args[0] if args else next(iter(kwargs.values()))  # ids (BART), or their shape (Marian's sinusoids)
    length = first[1] if isinstance(first, torch.Size) else first.shape[1]
    positions = module.__dict__[_POSITIONS].local_positions(length).to(module.weight.device)
    return args, {**kwargs, "position_ids": positions}


def _global_bias(module: nn.Module, query_length: int, key_length: int, device: torch.device | None = None,
                 past_seen_tokens: int = 0) -> torch.Tensor:
    """T5's relative position bias (``T5Attention.compute_bias``: its buckets and table) of this rank's queries, at
    their global positions, against every key of the sequence (``key_length`` local keys on each of cp ranks)."""
    run = module.__dict__[_ROUTED][2]
    device = device or module.relative_attention_bias.weight.device
    queries = run.local_positions(query_length).to(device)[:, None]
    keys = torch.arange(key_length * run.cp, device=device)[None, :]
    buckets = module._relative_position_bucket(keys - queries, bidirectional=not module.is_decoder,
                                               num_buckets=module.relative_attention_num_buckets,
                                               max_distance=module.relative_attention_max_distance)
    return module.relative_attention_bias(buckets).permute([2, 0, 1]).unsqueeze(0)


def window_mask(first: int, start: int, end: int, window: int | None, device: torch.device) -> torch.Tensor:
    """(queries first .. first + n - 1) x (keys start .. end - 1): True where a query sees a key (causal, and inside
    the sliding window: ``kv > q - window``, transformers' sliding_window_overlay)."""
    queries = torch.arange(first, end, device=device)[:, None]
    keys = torch.arange(start, end, device=device)[None, :]
    seen = keys <= queries
    return seen & (keys > queries - window) if window is not None else seen


def _attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None, sliding_window: int | None = None,
               **kwargs: Any) -> tuple[torch.Tensor, None]:
    fn, eager, run = module.__dict__[_ROUTED]
    causal = kwargs.get("is_causal")
    causal = getattr(module, "is_causal", True) if causal is None else causal
    if kwargs.get("position_bias") is not None:  # T5's
        return _biased(module, fn, eager, run, query, key, value, causal, **kwargs)
    if sliding_window is not None and sliding_window >= query.shape[-2] * run.cp:
        sliding_window = None  # a window as long as the sequence masks nothing: the plain causal kernel
    if not eager and sliding_window is None and not any(kwargs.get(k) is not None for k in _EXTRAS):
        # no mask (the one the model built is the local tokens'): ContextParallel.attend answers its SDPA
        return fn(module, query, key, value, None, **kwargs)
    if not causal:
        raise AutoparError(f"context parallelism: {type(module).__name__} attends both ways with a mask or an eager "
                           "kernel; re-plan with cp 1")
    keys, values = run.gather(key, value)
    return _per_chunk(module, fn, eager, run, query, keys, values, sliding_window, sliding_window=sliding_window,
                      **kwargs)


def _per_chunk(module: nn.Module, fn: Callable[..., Any], eager: bool, run: Any, query: torch.Tensor,
               keys: torch.Tensor, values: torch.Tensor, window: int | None, bias: torch.Tensor | None = None,
               **kwargs: Any) -> tuple[torch.Tensor, None]:
    """The module's kernel once per local query chunk against the gathered keys it may see (from the window's start
    to the chunk's end), with the mask of the chunk's global positions and its rows of a position ``bias``."""
    c = query.shape[-2] // 2
    outs = []
    with run.direct():  # the kernel's own SDPA call, with the mask built here, is not ContextParallel.attend's
        for half, j in enumerate(run.chunks):
            rows, first, end = slice(half * c, (half + 1) * c), j * c, (j + 1) * c
            start = 0 if window is None else max(0, first - window + 1)
            seen = window_mask(first, start, end, window, query.device)[None, None]
            if bias is not None:
                kwargs["position_bias"] = bias[..., rows, start:end]
            out, _ = fn(module, query[..., rows, :], keys[..., start:end, :], values[..., start:end, :],
                        _mask(seen, eager, query.dtype), **kwargs)
            outs.append(out)  # (batch, queries, heads, head dim): the kernels' layout
    return torch.cat(outs, dim=1), None


def _mask(seen: torch.Tensor, eager: bool, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask as the kernel takes it: as is for SDPA, additive (0 or the dtype's least) for eager kernels,
    which add their mask to the logits."""
    return seen if not eager else torch.zeros(seen.shape, dtype=dtype, device=seen.device).masked_fill(
        ~seen, torch.finfo(dtype).min)


def _biased(module: nn.Module, fn: Callable[..., Any], eager: bool, run: Any, query: torch.Tensor, key: torch.Tensor,
            value: torch.Tensor, causal: bool, position_bias: torch.Tensor, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """A kernel taking a position bias (T5's) on the gathered keys: the bias over every key (zeros over the local
    keys, an attention without relative positions, widened to all), whole for attention both ways, else per local
    query chunk with its causal mask."""
    keys, values = run.gather(key, value)
    if position_bias.shape[-1] != keys.shape[-2]:
        position_bias = position_bias.new_zeros(*position_bias.shape[:-1], keys.shape[-2])
    if not causal:
        with run.direct():
            return fn(module, query, keys, values, None, position_bias=position_bias, **kwargs)[0], None
    return _per_chunk(module, fn, eager, run, query, keys, values, None, position_bias, **kwargs)
