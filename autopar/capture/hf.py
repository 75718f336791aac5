"""Hugging Face configs: build the model a ``config.json`` describes, fed the inputs its architecture takes.

Nothing is downloaded: transformers builds the model from the config alone (on the meta device, in
capture). The architecture decides the inputs and the loss, all from the config:

- causal LM (GPT, Llama, Mixtral, DeepSeek, ...): ``input_ids``; next-token cross-entropy.
- masked LM / encoder-only (BERT, RoBERTa): ``input_ids``; cross-entropy at every position.
- encoder-decoder (T5, BART): ``input_ids`` and ``decoder_input_ids`` of the same length; cross-entropy
  of the decoder's logits.
- image classification (ViT): ``pixel_values`` of ``num_channels × image_size²`` and a label per image;
  the sequence is the patch count, fixed by the config.
- vision-language, LLaVA-style (a vision tower, a projector, a language model): ``input_ids`` whose first
  tokens are the image placeholders, and ``pixel_values``; next-token cross-entropy.

A config naming a base model without a head (``BertModel``, ``BartModel``, ``ViTModel``) is built with
the head its family trains with (masked LM, conditional generation, image classification). The attention
implementation is transformers' own choice: SDPA where the model supports it, eager otherwise (Gemma-2's
logit soft-capping); capture records which one ran.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import os
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.nn as nn
import torch.nn.functional as F

from autopar.capture.diagnose import first_line
from autopar.capture.positions import LENGTH_KEYS, length_settings
from autopar.capture.spec import ModelSpec, convert_value
from autopar.errors import AutoparError
from autopar.files import read_json

# (task, auto-class attribute of transformers) in the order a config's family is tried.
_AUTO_CLASSES = [("seq2seq", "AutoModelForSeq2SeqLM"), ("causal_lm", "AutoModelForCausalLM"),
                 ("masked_lm", "AutoModelForMaskedLM"), ("image_classification", "AutoModelForImageClassification"),
                 ("vision_language", "AutoModelForImageTextToText")]
MAX_CONFIG_BYTES = 16 * 2**20  # a config.json is a few KiB
_IGNORED_KEYS = ("auto_map", "transformers_version", "quantization_config")  # remote code; fp8 weight storage


@dataclasses.dataclass(frozen=True)
class Task:
    """What an architecture is trained on: its input names, and the sequence its blocks see."""

    kind: str
    inputs: tuple[str, ...]
    fixed_seq: int | None = None  # vision: the patch count, whatever --seq-len says
    min_seq: int = 1              # vision-language: the image placeholders must fit in the text


def load_hf(path: Path, overrides: dict[str, str]) -> ModelSpec:
    raw = _read_config(path, overrides)
    try:
        import transformers
    except ImportError:
        raise AutoparError("Hugging Face configs need transformers: pip install transformers") from None
    config_dict = {k: v for k, v in raw.items() if k not in _IGNORED_KEYS}
    try:
        config = transformers.AutoConfig.for_model(**config_dict)
    except (ValueError, KeyError, TypeError) as e:
        raise AutoparError(f"{path}: transformers cannot read this config ({first_line(e)})") from None
    model_class, kind = hf_model_class(transformers, config, raw.get("architectures") or [], path)
    task = _task(kind, config, path)
    make_inputs = _input_maker(task, config)

    def build() -> nn.Module:
        config.dtype = torch.get_default_dtype()  # the training dtype, not the config's torch_dtype
        model = model_class(config)  # attention: SDPA where supported, else eager (transformers decides)
        for module in model.modules():  # no key/value cache in training; T5's decoder holds a config of its own
            if hasattr(getattr(module, "config", None), "use_cache"):
                module.config.use_cache = False
        return HFModel(model, task.inputs)

    defaults = {"seq_len": task.fixed_seq or max(task.min_seq, default_seq_len(config))}
    text = getattr(config, "text_config", None) or config
    return ModelSpec(hf_name(raw, path), str(path), build, make_inputs, _LOSSES[kind], dict(overrides), defaults,
                     fixed_seq_len=task.fixed_seq, min_seq_len=task.min_seq,
                     lengths=length_settings({key: getattr(text, key, None) for key in LENGTH_KEYS}))


def _read_config(path: Path, overrides: dict[str, str]) -> dict[str, Any]:
    raw = read_json(path, "model config", max_bytes=MAX_CONFIG_BYTES,
                    hint="pass a Hugging Face config.json, a model .py file or a profile JSON (autopar trace -o)")
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise AutoparError(f"{path} has no 'model_type': pass a Hugging Face config.json or a model .py file")
    for key, value in overrides.items():
        if key not in raw:
            raise AutoparError(f"--set {key}: {path.name} has no key '{key}' (its keys: {', '.join(sorted(raw))})")
        kind = type(raw[key]) if raw[key] is not None else None
        raw[key] = convert_value(key, value, kind)
    return raw


def hf_name(raw: dict[str, Any], path: Path) -> str:
    """``_name_or_path``'s last part, else the file's name, else (a bare ``config.json``) its folder's
    name, else the model type."""
    if raw.get("_name_or_path"):
        return str(raw["_name_or_path"]).rstrip("/").split("/")[-1]
    if path.stem != "config":
        return path.stem
    folder = path.resolve().parent.name
    return folder or str(raw["model_type"])


def hf_model_class(transformers: Any, config: Any, architectures: list[str], path: Path) -> tuple[type, str]:
    """The config's own architecture class when it has a head autopar knows how to train, else the
    class its family trains with (auto mappings, encoder-decoder first); and the task it is."""
    for name in architectures:
        cls = getattr(transformers, name, None)
        if isinstance(cls, type) and issubclass(cls, nn.Module):
            kind = _task_of_class(name, config)
            if kind:
                return cls, kind
    tries = _AUTO_CLASSES if getattr(config, "is_encoder_decoder", False) else _AUTO_CLASSES[1:]
    for kind, auto_name in tries:
        auto = getattr(transformers, auto_name, None)
        if auto is not None and type(config) in auto._model_mapping:
            return auto._model_mapping[type(config)], kind
    raise AutoparError(f"{path}: transformers has no language-model, image-classification or vision-language "
                       f"class for model_type '{config.model_type}'; write a model .py file for it instead")


def _task_of_class(name: str, config: Any) -> str:
    if "ForCausalLM" in name or name.endswith("LMHeadModel"):
        return "causal_lm"
    if "ForMaskedLM" in name:
        return "masked_lm"
    if "ForImageClassification" in name:
        return "image_classification"
    if "ForConditionalGeneration" in name:
        if hasattr(config, "vision_config") and hasattr(config, "text_config"):
            return "vision_language"
        return "seq2seq" if getattr(config, "is_encoder_decoder", False) else ""
    return ""  # a base model or another head: the family's training class instead


def _task(kind: str, config: Any, path: Path) -> Task:
    if kind == "seq2seq":
        return Task(kind, ("input_ids", "decoder_input_ids"))
    if kind == "image_classification":
        return Task(kind, ("pixel_values", "labels"), fixed_seq=_patch_tokens(config, path) + 1)  # + [CLS]
    if kind == "vision_language":
        return Task(kind, ("input_ids", "pixel_values"), min_seq=_image_tokens(config, path) + 1)
    return Task(kind, ("input_ids",))


def _patch_tokens(config: Any, path: Path) -> int:
    image, patch = getattr(config, "image_size", None), getattr(config, "patch_size", None)
    if not isinstance(image, int) or not isinstance(patch, int) or image % patch:
        raise AutoparError(f"{path}: a vision config needs integer image_size and patch_size, image_size a "
                           f"multiple of patch_size (got {image!r}, {patch!r})")
    return (image // patch) ** 2


def _image_tokens(config: Any, path: Path) -> int:
    """Placeholders per image in a LLaVA-style prompt: one per patch of the vision tower, the [CLS]
    feature dropped under the 'default' feature strategy (LLaVA-1.5: (336/14)² = 576)."""
    vision = config.vision_config
    if getattr(config, "image_token_id", getattr(config, "image_token_index", None)) is None:
        raise AutoparError(f"{path}: vision-language model_type '{config.model_type}' has no image_token_id; "
                           "autopar builds inputs for LLaVA-style models (image placeholders in input_ids)")
    tokens = _patch_tokens(vision, path)
    return tokens + (1 if getattr(config, "vision_feature_select_strategy", "default") == "full" else 0)


def default_seq_len(config: Any) -> int:
    """The largest power of two within the config's context (RoBERTa's 514 positions hold 512 tokens and
    two padding offsets); 2048 when the config states no context."""
    text = getattr(config, "text_config", None) or config
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(text, key, None)
        if isinstance(value, int) and value > 1:
            return 1 << (value.bit_length() - 1)
    return 2048


def _input_maker(task: Task, config: Any) -> Callable[[int, int], tuple]:
    text = getattr(config, "text_config", None) or config
    vocab = int(getattr(text, "vocab_size", None) or getattr(config, "vocab_size", None) or 32000)

    def ids(batch_size: int, seq_len: int) -> torch.Tensor:
        return torch.randint(0, vocab, (batch_size, seq_len))

    if task.kind == "seq2seq":
        return lambda b, s: (ids(b, s), ids(b, s))
    if task.kind == "image_classification":
        size, channels = int(config.image_size), int(getattr(config, "num_channels", 3))
        labels = int(getattr(config, "num_labels", 2))
        return lambda b, s: (torch.randn(b, channels, size, size), torch.randint(0, labels, (b,)))
    if task.kind == "vision_language":
        vision = config.vision_config
        size, channels = int(vision.image_size), int(getattr(vision, "num_channels", 3))
        image_token = getattr(config, "image_token_id", getattr(config, "image_token_index", None))
        n_image = task.min_seq - 1

        def prompt(b: int, s: int) -> tuple:  # s tokens, or the image's and one text token if s holds fewer
            placeholders = torch.full((b, n_image), int(image_token))
            text = ids(b, max(s - n_image, 1))
            text = torch.where(text == int(image_token), (text + 1) % vocab, text)  # placeholders only where images go
            return (torch.cat([placeholders, text], dim=1), torch.randn(b, channels, size, size))
        return prompt
    return lambda b, s: (ids(b, s),)


class HFModel(nn.Module):
    """A Hugging Face model called with named inputs (positional here, so that it traces), returning its
    logits (or the last hidden state of a headless model). Labels are for the loss, not the model."""

    def __init__(self, model: nn.Module, input_names: tuple[str, ...]):
        super().__init__()
        self.hf = model
        self._names = tuple(n for n in input_names if n != "labels")
        self._takes_positions = "position_ids" in inspect.signature(model.forward).parameters

    def position_rule(self) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """How the model derives position ids from whole sequences of token ids, for a model that counts them from
        the ids (RoBERTa's family: padding_idx + 1 + the non-padding tokens so far, ``padding_idx`` at a padding
        token); None for the rest, whose positions are 0 .. S - 1. Context parallelism gives each chunk its slice
        of these (autopar.runtime.cp.ContextParallel.split), which a chunk alone cannot count."""
        for module in self.hf.modules():
            make = getattr(type(module), "create_position_ids_from_input_ids", None)
            if make is not None and isinstance(getattr(module, "padding_idx", None), int):
                return functools.partial(make, padding_idx=module.padding_idx)
        return None

    def forward(self, *inputs: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """``positions``: the tokens' places in their sequences (context parallelism: chunks from the middle), as
        ``position_ids``; with an all-ones attention mask, else transformers would read the jumps between the
        chunks as packed sequences and mask attention between them."""
        named = dict(zip(self._names, inputs))
        if positions is not None and self._takes_positions:
            # the mask of the tokens the text layers run (a VLM's: cp splits after the merge); a model that takes no
            # position ids (T5, BART) gets its positions from the runtime (autopar.runtime.hf_attention)
            named.update(position_ids=positions, attention_mask=torch.ones_like(positions))
        meta = any(t.is_meta for t in inputs) and not torch.compiler.is_exporting()  # the runtime's meta checks
        with _value_checks_off(), _masks_as_at_run_time(meta), _experts_on_meta(meta):
            out = self.hf(**named)
        return out.logits if getattr(out, "logits", None) is not None else out.last_hidden_state


@contextlib.contextmanager
def _value_checks_off() -> Iterator[None]:
    """transformers' sanity checks on tensor values (LLaVA: as many image placeholders as image features)
    read data that a meta tensor does not have; transformers' own switch turns them off while it runs."""
    saved = os.environ.get(_CHECKS_OFF)
    os.environ[_CHECKS_OFF] = "1"
    try:
        yield
    finally:
        if saved is None:
            del os.environ[_CHECKS_OFF]
        else:
            os.environ[_CHECKS_OFF] = saved


_CHECKS_OFF = "TRANSFORMERS_DISABLE_TORCH_CHECK"


@contextlib.contextmanager
def _masks_as_at_run_time(meta: bool = False) -> Iterator[None]:
    """While capture exports the model: the attention masks transformers builds when it trains. Run eagerly on
    capture's inputs (no padding, positions 0..S-1 in every sample) it builds no causal or bidirectional mask:
    SDPA runs with ``is_causal`` (and ``enable_gqa``), the flash kernel's path, and a sliding window or an image
    overlay still gets its mask. Under ``torch.export`` it cannot read the positions or the padding, so it
    builds a (batch, 1, S, S) mask that training never has, which SDPA would keep for backward (64 MiB per
    sample at 8,192 tokens). transformers' masking_utils decides with ``is_torchdynamo_exporting``,
    ``find_packed_sequence_indices`` and (reading an all-ones padding mask) ``fast_all``; while exporting, or
    running on the meta device (``meta``: the runtime's checks, which have no values to read), they answer as
    they do at run time. Otherwise (the runtime) nothing changes."""
    import torch.compiler
    import transformers.masking_utils as masking

    answers = {"is_torchdynamo_exporting": lambda: False,
               "find_packed_sequence_indices": lambda position_ids: None}  # one sequence per sample
    if meta:
        answers["fast_all"] = lambda tensor: True  # autopar's inputs are never padded
    if not (torch.compiler.is_exporting() or meta) or not all(hasattr(masking, f) for f in answers):
        yield
        return
    saved = {f: getattr(masking, f) for f in answers}
    for f, fn in answers.items():
        setattr(masking, f, fn)
    try:
        yield
    finally:
        for f, fn in saved.items():
            setattr(masking, f, fn)


@contextlib.contextmanager
def _experts_on_meta(meta: bool) -> Iterator[None]:
    """A forward on the meta device: the experts' grouped GEMM runs transformers' fallback, whose shape function
    meta tensors take (``grouped_mm``'s own is CUDA's, bf16 only); the same GEMMs, one group per expert."""
    try:
        import transformers.integrations.moe as moe
    except ImportError:  # an older transformers without its experts integration
        moe = None
    if not meta or moe is None or not hasattr(moe, "_can_use_grouped_mm"):
        yield
        return
    saved = moe._can_use_grouped_mm
    moe._can_use_grouped_mm = lambda *args, **kwargs: False
    try:
        yield
    finally:
        moe._can_use_grouped_mm = saved


def _next_token_loss(logits: torch.Tensor, input_ids: torch.Tensor, *_: torch.Tensor) -> torch.Tensor:
    """Next-token prediction, as Hugging Face's causal-LM loss."""
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), input_ids[:, 1:].flatten())


def _every_token_loss(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), input_ids.flatten())


def _decoder_loss(logits: torch.Tensor, input_ids: torch.Tensor, decoder_input_ids: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), decoder_input_ids.flatten())


def _image_loss(logits: torch.Tensor, pixel_values: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), labels)


_LOSSES: dict[str, Callable[..., torch.Tensor]] = {
    "causal_lm": _next_token_loss, "vision_language": _next_token_loss, "masked_lm": _every_token_loss,
    "seq2seq": _decoder_loss, "image_classification": _image_loss}
