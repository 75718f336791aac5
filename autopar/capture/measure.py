"""Run the traced graph node by node on meta tensors and measure what each node costs.

Per fx node: output bytes, FLOPs (torch.utils.flop_counter), bytes moved by memory-bound ops, and the
activation bytes autograd saves for backward (saved-tensor hooks, deduplicated by storage, parameters
and buffers excluded). Everything is measured at two batch sizes so that per-sample and fixed parts
separate exactly: value(b) = per_sample * b + fixed.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.fx
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from autopar.capture.diagnose import node_failure_message
from autopar.capture.spec import ModelSpec
from autopar.capture.trace import Traced, default_dtype, meta_inputs
from autopar.errors import AutoparError

aten = torch.ops.aten
# Ops that only re-describe memory (no kernel, no traffic).
_VIEW_OPS = {"view", "_unsafe_view", "reshape", "transpose", "t", "permute", "unbind", "split", "chunk",
             "expand", "unsqueeze", "squeeze", "slice", "select", "getitem", "flatten", "unflatten",
             "sym_size", "sym_numel", "sym_stride", "_assert_tensor_metadata", "alias", "detach",
             "split_with_sizes", "as_strided", "narrow", "contiguous", "lift_fresh_copy", "size"}
# Casts: no kernel when the tensor already has the dtype (the output is the input).
_CASTS = {"to", "float", "half", "bfloat16", "type", "type_as"}

# torch.autocast on CUDA (PyTorch "Automatic Mixed Precision package", Autocast Op Reference: "CUDA Ops that can
# autocast to float16" and "CUDA Ops that can autocast to float32"), by the aten names capture's graphs carry. The
# first run in the autocast dtype on casts of their inputs (and save those casts for backward); the second run in
# fp32; every other op runs in the widest dtype of its inputs.
AUTOCAST_LOW = {"linear", "matmul", "mm", "bmm", "addmm", "addbmm", "baddbmm", "addmv", "addr", "mv", "prelu",
                "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
                "convolution", "_convolution", "scaled_dot_product_attention", "chain_matmul", "multi_dot"}
AUTOCAST_FP32 = {"layer_norm", "native_layer_norm", "group_norm", "native_group_norm", "softmax", "_softmax",
                 "log_softmax", "_log_softmax", "softmin", "cross_entropy", "cross_entropy_loss", "nll_loss",
                 "nll_loss2d", "nll_loss_forward", "pow", "rsqrt", "reciprocal", "exp", "expm1", "log", "log10", "log2",
                 "log1p", "acos", "asin", "cosh", "sinh", "tan", "erfinv", "sum", "prod", "cumsum", "cumprod", "norm",
                 "normalize", "dist", "cdist", "pdist", "renorm", "softplus", "mse_loss", "l1_loss", "smooth_l1_loss",
                 "kl_div", "binary_cross_entropy_with_logits", "cosine_similarity", "logsumexp"}


# Element-wise ops that take many instructions per element (transcendentals, normalisations): on a CPU
# they run far below memory bandwidth, on a GPU they are memory-bound like the rest. Their bytes are
# counted apart (heavy_bytes ⊆ memory_bytes) so a hardware profile can give them their own efficiency.
HEAVY_OPS = {"gelu", "gelu_backward", "silu", "tanh", "exp", "log", "sigmoid", "erf", "softmax", "_softmax",
             "log_softmax", "_log_softmax", "layer_norm", "native_layer_norm", "group_norm", "native_group_norm",
             "sin", "cos", "cross_entropy", "cross_entropy_loss", "nll_loss", "nll_loss2d", "nll_loss_forward", "_safe_softmax", "mish", "softplus",
             "hardswish", "elu", "selu", "celu"}


# The kernel a heavy op runs, by the names calibration measures (autopar/calibrate/kernels.py): one
# bandwidth per kernel, since a tanh-GELU on a CPU runs several times slower per byte than an erf one.
_HEAVY_KERNEL = {"_softmax": "softmax", "_safe_softmax": "softmax", "log_softmax": "softmax",
                 "_log_softmax": "softmax", "native_layer_norm": "layer_norm", "cross_entropy_loss": "cross_entropy",
                 "nll_loss": "cross_entropy", "nll_loss_forward": "cross_entropy", "nll_loss2d": "cross_entropy",
                 "native_group_norm": "group_norm", "gelu_backward": "gelu"}


def heavy_kernel(node: torch.fx.Node) -> str:
    """The kernel name of a heavy element-wise node ("" for any other node): its op, canonicalised, and
    "gelu_tanh" for GELU's tanh approximation."""
    name = op_name(node)
    if name not in HEAVY_OPS:
        return ""
    if name == "gelu" and node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none") == "tanh":
        return "gelu_tanh"
    return _HEAVY_KERNEL.get(name, name)


def grouped_mm_flops(a_shape: Any, b_shape: Any, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    """FLOPs of torch._grouped_mm, the grouped GEMM that runs mixture-of-experts layers (transformers 5,
    torchtitan): every row of the input is multiplied by its own group's matrix, so a token routed to k
    experts costs k GEMM rows, not one per expert. torch.utils.flop_counter has no entry for it."""
    if len(a_shape) == 2 and len(b_shape) == 2:  # the groups split the reduction dimension
        return 2 * a_shape[0] * a_shape[1] * b_shape[1]
    out = 1
    for d in out_shape:
        out *= d
    return 2 * out * a_shape[-1]


class OpCounter(TorchDispatchMode):
    """Counts the aten ops a piece of forward dispatches (views included): under a tensor-parallel style
    each of them runs through DTensor, whose per-op overhead calibration measures."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.count += 1
        return func(*args, **(kwargs or {}))


@dataclasses.dataclass
class NodeCost:
    out_bytes: int = 0
    flops: float = 0.0
    matmul_flops: float = 0.0
    memory_bytes: float = 0.0
    heavy_bytes: float = 0.0
    heavy_kernel: str = ""
    saved_bytes: int = 0
    saved_score_bytes: int = 0  # of the saved bytes, those of an eager attention's S×S scores
    autocast_saved_bytes: int = 0  # what autograd would save with fp32 weights under torch.autocast (attribute_autocast)
    fp8_saved_delta: int = 0  # how its saves change when its weight GEMM keeps its input in FP8 (attribute_fp8)
    aten_ops: int = 0
    saves: dict[str, int] = dataclasses.field(default_factory=dict)  # every storage it saves, by label (attribute_saves)


_DROPOUTS = {"dropout", "dropout_", "Dropout", "native_dropout"}


def op_name_of(meter: "_Meter", name: str) -> str:
    """The op of the node called ``name`` in the meter's graph."""
    return op_name(meter._names[name])


def op_name(node: torch.fx.Node) -> str:
    target = node.target
    if node.op == "call_module":
        return str(target)
    name = getattr(target, "__name__", str(target))
    return name.split(".")[0] if node.op == "call_function" else name


def _copied(n: torch.fx.Node, result: Any, env: dict) -> bool:
    """Whether a view-like op or a cast copied (reshape, contiguous, flatten of a non-contiguous tensor; a
    cast to another dtype): its output shares no storage with its input, so it ran a copy kernel."""
    src = env.get(n.all_input_nodes[0]) if n.all_input_nodes else None
    return (isinstance(result, torch.Tensor) and isinstance(src, torch.Tensor)
            and result.untyped_storage()._cdata != src.untyped_storage()._cdata)


def tensor_bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(tensor_bytes(v) for v in value)
    return 0


class _Meter(torch.fx.Interpreter):
    """fx Interpreter that records the cost of every node it runs."""

    def __init__(self, gm: torch.fx.GraphModule, excluded_storages: set[int], scores: set[str],
                 traced_dtype: torch.dtype = torch.bfloat16):
        super().__init__(gm)
        self._traced_dtype = traced_dtype
        self._names = {n.name: n for n in gm.graph.nodes}
        self.costs: dict[str, NodeCost] = {}
        self._excluded = excluded_storages
        self._seen: set[int] = set()
        self._current: NodeCost | None = None
        self.current_node = ""
        self._scores = scores
        self._producer: dict[int, str] = {}  # storage → the node that produced it
        self._alive: list[Any] = []  # every output, so that no storage address is reused (meta: no data)
        self._packed: list[tuple[int, int, str]] = []  # (storage, bytes, the node that saved it)
        # every save, repeats included: (storage, bytes, element size, floating, the node, one of its inputs)
        self._saves: list[tuple[int, int, int, bool, str, bool]] = []
        self._inputs: set[int] = set()  # the storages of the running node's tensor inputs
        self._dropout = False  # the running node is a dropout
        self._fp32: dict[str, bool] = {}  # node → its output would be fp32 under autocast (fp32 weights)
        self._weight_gemms: set[str] = set()  # nodes multiplying by a parameter (a linear's GEMM, grouped experts')
        self._flops = FlopCounterMode(display=False, custom_mapping={aten._grouped_mm: grouped_mm_flops})

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        key = t.untyped_storage()._cdata
        nbytes = t.untyped_storage().nbytes()
        if self._dropout and key not in self._inputs and t.is_floating_point():
            # dropout off CUDA saves its mask in the input's dtype (_dropout_impl); the GPU kernel a run uses
            # (native_dropout) saves a bool mask: one byte per element
            nbytes //= t.element_size()
        if self._current is not None and key not in self._excluded:
            self._saves.append((key, nbytes, t.element_size(), t.is_floating_point(), self.current_node,
                                key in self._inputs))
        if self._current is not None and key not in self._excluded and key not in self._seen:
            self._seen.add(key)
            self._current.saved_bytes += nbytes
            self._packed.append((key, nbytes, self.current_node))
        return t

    def attribute_scores(self) -> None:
        """Once every node has run (and so every output has its producer): the saved bytes whose storage
        an eager attention's score node produced. A temporary made and saved inside a node (matmul's
        contiguous copies of q and k) is no node's output, so never a score."""
        for key, nbytes, consumer in self._packed:
            if self._producer.get(key) in self._scores:
                self.costs[consumer].saved_score_bytes += nbytes

    def attribute_saves(self) -> None:
        """Every storage each node saves (repeats by other nodes included), by a label that is the same at every batch
        size: the node that produced it, or ``<node>~<k>`` for the k-th temporary a node made and saved itself (flash
        attention's log-sum-exp). capture/parts.py reads which ops save what a part of a layer makes."""
        temporaries: dict[int, str] = {}
        made: dict[str, int] = {}
        for key, nbytes, _, _, node, _ in self._saves:
            label = self._producer.get(key)
            if label is None:
                label = temporaries.get(key)
                if label is None:
                    label = temporaries[key] = f"{node}~{made.get(node, 0)}"
                    made[node] = made.get(node, 0) + 1
            self.costs[node].saves[label] = nbytes

    def attribute_autocast(self, half_bytes: int) -> None:
        """Each node's saved bytes as the same forward would save them with fp32 weights under torch.autocast
        (autopar's runtime without FSDP2: autopar/runtime/parallelize.py), from the dtype each node's output would
        have there (``_fp32``): an fp32 tensor keeps 4 bytes an element, a half one ``half_bytes``, and an op that
        autocast runs in half precision saves its own cast copy of each fp32 input (one per op: only weights'
        casts are cached). A kernel's own temporaries (flash attention's log-sum-exp) keep their bytes."""
        seen: set[int] = set()
        for key, nbytes, size, floating, node, is_input in self._saves:
            producer = self._producer.get(key)
            fp32 = self._fp32.get(producer, False) if producer is not None else None
            if is_input and fp32 and op_name_of(self, node) in AUTOCAST_LOW:
                self.costs[node].autocast_saved_bytes += nbytes // size * half_bytes  # the op's cast copy
            elif key not in seen:
                seen.add(key)
                scaled = nbytes if not floating or fp32 is None else nbytes // size * (4 if fp32 else half_bytes)
                self.costs[node].autocast_saved_bytes += scaled

    def attribute_fp8(self) -> None:
        """Each weight GEMM's change in saved bytes when it keeps its activation input in FP8, as Transformer Engine's
        linears do under an FP8 recipe (transformer_engine/pytorch/module/linear.py ``_Linear.forward``: the quantized
        input, column-wise data only, is what it saves for the weight gradient; layernorm_linear.py and
        grouped_linear.py likewise): an input only weight GEMMs save is kept at 1 byte an element instead of its own
        size; one that another op saves too (attention's output, saved by the kernel) stays and gains an FP8 copy.
        Each storage counts once, at the first GEMM that saves it (q, k and v share their input)."""
        savers: dict[int, set[str]] = {}
        for key, _, _, _, node, _ in self._saves:
            savers.setdefault(key, set()).add(node)
        done: set[int] = set()
        for key, nbytes, size, floating, node, is_input in self._saves:
            if key in done or not (floating and is_input and node in self._weight_gemms):
                continue
            done.add(key)
            elements = nbytes // size
            only_gemms = savers[key] <= self._weight_gemms
            self.costs[node].fp8_saved_delta += elements - nbytes if only_gemms else elements

    def _autocast_dtype(self, n: torch.fx.Node, result: Any) -> bool:
        """Whether ``n``'s output would be fp32 under autocast with fp32 weights and inputs."""
        name = op_name(n)
        if n.op in ("placeholder", "get_attr"):
            return True
        if name in AUTOCAST_LOW:
            return False
        if name in AUTOCAST_FP32:
            return True
        if name in _CASTS and isinstance(result, torch.Tensor) and result.is_floating_point():
            if name == "type_as" and len(n.all_input_nodes) > 1:
                return self._fp32.get(n.all_input_nodes[1].name, True)
            # a cast to fp32, or to the dtype the model was traced in (its own dtype: fp32 with fp32 weights)
            return result.dtype in (torch.float32, self._traced_dtype)
        return any(self._fp32.get(a.name, False) for a in n.all_input_nodes)

    def run_node(self, n: torch.fx.Node) -> Any:
        cost = self._current = NodeCost()
        self.current_node = n.name
        self._dropout = op_name(n) in _DROPOUTS
        self._inputs = {v.untyped_storage()._cdata for a in n.all_input_nodes
                        if isinstance(v := self.env.get(a), torch.Tensor)}
        before = self._flops.get_total_flops()
        with OpCounter() as ops:
            result = super().run_node(n)
        cost.aten_ops = ops.count
        cost.flops += self._flops.get_total_flops() - before
        if cost.flops > 0 and self._inputs & self._excluded:
            self._weight_gemms.add(n.name)
        cost.out_bytes = tensor_bytes(result)
        for t in (result if isinstance(result, (tuple, list)) else (result,)):
            if isinstance(t, torch.Tensor):
                self._producer.setdefault(t.untyped_storage()._cdata, n.name)
        self._alive.append(result)
        self._fp32[n.name] = self._autocast_dtype(n, result)
        n.meta.setdefault("val", result)  # symbolic_trace graphs carry no shapes of their own
        if cost.flops > 0:
            cost.matmul_flops = cost.flops
        elif n.op in ("call_function", "call_method", "call_module") and (
                _copied(n, result, self.env) if op_name(n) in _VIEW_OPS | _CASTS else True):
            # a cast reads the tensor it casts; type_as(other) / to(other) read only other's dtype
            read = n.all_input_nodes[:1] if op_name(n) in _CASTS else n.all_input_nodes
            inputs = [self.env[a] for a in read if a in self.env]
            cost.memory_bytes = float(sum(tensor_bytes(v) for v in inputs) + cost.out_bytes)
            cost.heavy_kernel = heavy_kernel(n)
            if cost.heavy_kernel:
                cost.heavy_bytes = cost.memory_bytes
        self.costs[n.name] = cost
        self._current = None
        return result

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        if target is aten.scaled_dot_product_attention.default:
            return self._flash_attention(*args, **kwargs)
        return super().call_function(target, args, kwargs)

    def _flash_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Any = None,
                         dropout_p: float = 0.0, is_causal: bool = False, scale: Any = None,
                         enable_gqa: bool = False) -> torch.Tensor:
        """Run attention as the fused (flash) kernel that CUDA and CPU use in training, not the math
        path meta would pick: the fused kernel saves q, k, v, out and logsumexp, never the S×S scores.
        Grouped-query attention (``enable_gqa``, transformers' SDPA path without a mask) runs in the flash
        kernels of CUDA and CPU as it is (PyTorch's sdp_utils: ``check_batch_size_and_num_heads_dense<true
        /*supports GQA*/>``), so they keep the key/value heads, not copies widened to the query's.
        FLOPs as torch.utils.flop_counter counts the fused kernels (it has no CPU-flash entry)."""
        assert self._current is not None
        mask_grad = isinstance(attn_mask, torch.Tensor) and attn_mask.requires_grad
        if mask_grad or v.shape[-1] != q.shape[-1]:
            # A learned bias (T5's relative positions) or a value head narrower than the query's (DeepSeek's
            # latent attention): the memory-efficient kernel, which takes both; it saves the bias too. It
            # has no grouped-query attention: PyTorch widens the key/value heads first.
            if enable_gqa and k.shape[-3] != q.shape[-3]:
                groups = q.shape[-3] // k.shape[-3]
                k, v = k.repeat_interleave(groups, dim=-3), v.repeat_interleave(groups, dim=-3)
            bias = attn_mask if attn_mask is None or attn_mask.is_floating_point() else \
                torch.zeros_like(attn_mask, dtype=q.dtype).masked_fill(~attn_mask, float("-inf"))
            # flop_counter counts this kernel itself (sdpa_flop_count's formula, the value width apart)
            out = aten._scaled_dot_product_efficient_attention(q, k, v, bias, True, dropout_p, is_causal,
                                                               scale=scale)[0]
            return out
        self._current.flops += sdpa_flop_count(q.shape, k.shape, v.shape)  # no CPU-flash entry in flop_counter
        out, _ = aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)
        return out


def measure(traced: Traced, wrapper: nn.Module, spec: ModelSpec, batch_size: int, seq_len: int,
            dtype: torch.dtype, scores: set[str] | None = None) -> dict[str, NodeCost]:
    """Costs of every node for one forward of ``batch_size`` samples (meta device: nothing allocated).
    ``scores``: the nodes of eager attention cores whose outputs are S×S scores (attention.py)."""
    state = dict(wrapper.named_parameters(remove_duplicate=False))
    buffers = dict(wrapper.named_buffers(remove_duplicate=False))
    inputs = meta_inputs(spec, batch_size, seq_len, dtype)
    args: list[Any] = []
    for kind, key in traced.placeholders:
        if kind == "param":
            args.append(state[key])
        elif kind == "buffer":
            args.append(buffers[key])
        elif kind == "constant":
            args.append(traced.constants[key])
        else:
            args.append(inputs[key])
    excluded = {t.untyped_storage()._cdata for t in list(state.values()) + list(buffers.values())}
    meter = _Meter(traced.graph_module, excluded, scores or set(), dtype)
    try:
        with default_dtype(dtype), meter._flops, torch.autograd.graph.saved_tensors_hooks(meter.pack, lambda t: t):
            meter.run(*args)
        meter.attribute_scores()
        meter.attribute_saves()
        meter.attribute_fp8()
        if dtype in (torch.bfloat16, torch.float16):  # mixed precision: autopar's runtime may run it under autocast
            meter.attribute_autocast(torch.finfo(dtype).bits // 8)
    except Exception as e:  # an op of the graph failed on these inputs: say where it was traced from
        node = next((n for n in traced.graph_module.graph.nodes if n.name == meter.current_node), None)
        raise AutoparError(node_failure_message(spec, node, e)) from None
    return meter.costs
