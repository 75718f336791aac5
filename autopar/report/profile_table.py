"""A rich table of a ModelProfile: one row per layer, runs of identical blocks folded into one row."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from autopar.profile import LayerProfile, ModelProfile
from autopar.report.tables import console as wide_console
from autopar.report.tables import count, numbers, table, text

MIB = 2**20
WIDE = 120  # columns from which the tensor-parallel pattern is a column of the table


def _runs(layers: list[LayerProfile]) -> list[list[LayerProfile]]:
    """Consecutive layers with the same block_id and the same numbers, grouped."""
    runs: list[list[LayerProfile]] = []
    for layer in layers:
        prev = runs[-1][-1] if runs else None
        if prev is not None and prev.block_id == layer.block_id and _numbers(prev) == _numbers(layer):
            runs[-1].append(layer)
        else:
            runs.append([layer])
    return runs


def _numbers(layer: LayerProfile) -> tuple:
    return (layer.params, layer.fwd_flops_per_sample, layer.saved_bytes_per_sample, layer.saved_bytes_fixed,
            layer.cut_bytes_per_sample)


def _tp_text(layer: LayerProfile) -> str:
    if not layer.tp.plan:
        return f"[dim]{layer.tp.reason or '-'}[/dim]" + _moe_text(layer)
    if not layer.tp.pairs:
        return ", ".join(sorted(set(layer.tp.plan.values())))
    parts = []
    for pair in layer.tp.pairs:
        heads = f" {pair.heads}h/{pair.kv_heads}kv" if pair.kind == "attention" else f" {pair.inner_features}"
        parts.append(f"{'+'.join(pair.columnwise)}→{pair.rowwise}{heads}")
    return "; ".join(parts) + _moe_text(layer)


def _moe_text(layer: LayerProfile) -> str:
    moe = layer.moe
    if moe is None:
        return ""
    shared = f" + {moe.num_shared_experts} shared" if moe.num_shared_experts else ""
    capacity = f", capacity {moe.capacity_factor:g}" if moe.capacity_factor else ""
    return f"; {moe.experts_module}: top-{moe.top_k} of {moe.num_experts} experts{shared}{capacity}"


def _run_name(run: list[LayerProfile]) -> str:
    return run[0].name if len(run) == 1 else f"{run[0].name} … {run[-1].name} (×{len(run)})"


def profile_table(profile: ModelProfile, batch_size: int = 1, with_tp: bool = True) -> Table:
    """The layer table; ``with_tp=False`` leaves the tensor-parallel pattern out (narrow terminals get it as
    a list below, print_profile)."""
    b = batch_size
    out = table(title=f"{profile.name}: {profile.params / 1e9:.3f} B params, seq {profile.seq_len}, {profile.dtype}, "
                      f"micro-batch {b}")
    text(out, "layer", "kind")
    numbers(out, "params", "fwd FLOPs", "saved MiB", "cut MiB")
    if with_tp:
        text(out, "TP pattern (col→row)")
    for run in _runs(profile.layers):
        layer = run[0]
        flops = layer.fwd_flops_per_sample * b + layer.fwd_flops_fixed
        saved = layer.saved_bytes_per_sample * b + layer.saved_bytes_fixed
        cut = layer.cut_bytes_per_sample * b + layer.cut_bytes_fixed
        params = count(layer.params) + (f"\n+{count(layer.tied_params)}\n(tied)" if layer.tied_params else "")
        out.add_row(_run_name(run), layer.kind, params, count(flops), f"{saved / MIB:,.1f}",
                    f"{cut / MIB:,.2f}" if layer is not profile.layers[-1] else "-", *[_tp_text(layer)] * with_tp)
    total_flops = sum(lp.fwd_flops_per_sample * b + lp.fwd_flops_fixed for lp in profile.layers)
    eager = ("; eager attention (priced as the unfused kernel: the S×S scores are not in these columns)"
             if profile.attention_impl == "eager" else "")
    out.caption = (f"total: {profile.params:,} params, {total_flops / 1e12:,.3f} TFLOPs forward, "
                   f"{profile.saved_bytes(b) / MIB:,.1f} MiB saved activations per micro-batch of {b}; "
                   f"captured with {profile.capture.method} in {profile.capture.wall_s:.2f} s{eager}")
    return out


def print_profile(profile: ModelProfile, batch_size: int = 1, console: Console | None = None) -> None:
    """The layer table; below WIDE columns the tensor-parallel patterns follow it as a list (they are long)."""
    console = console or wide_console()
    wide = console.width >= WIDE
    console.print(profile_table(profile, batch_size, with_tp=wide))
    if not wide:
        patterns = Table.grid(padding=(0, 1), pad_edge=True)
        patterns.add_column(overflow="fold", max_width=console.width // 3)
        patterns.add_column(overflow="fold")
        for run in _runs(profile.layers):
            patterns.add_row(_run_name(run), _tp_text(run[0]))
        console.print("tensor-parallel pattern (column→row linear pairs):", patterns)
