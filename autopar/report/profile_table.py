"""A rich table of a ModelProfile: one row per layer, runs of identical blocks folded into one row."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from autopar.profile import LayerProfile, ModelProfile

MIB = 2**20


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


def profile_table(profile: ModelProfile, batch_size: int = 1) -> Table:
    b = batch_size
    table = Table(title=f"{profile.name}: {profile.params / 1e9:.3f} B params, seq {profile.seq_len}, "
                        f"{profile.dtype}, micro-batch {b}", title_justify="left")
    for col, justify in [("layer", "left"), ("kind", "left"), ("params", "right"), ("fwd GFLOPs", "right"),
                         ("activations MiB", "right"), ("cut MiB", "right"), ("TP pattern (col→row)", "left")]:
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for run in _runs(profile.layers):
        layer = run[0]
        name = layer.name if len(run) == 1 else f"{layer.name} … {run[-1].name} (×{len(run)})"
        flops = layer.fwd_flops_per_sample * b + layer.fwd_flops_fixed
        saved = layer.saved_bytes_per_sample * b + layer.saved_bytes_fixed
        cut = layer.cut_bytes_per_sample * b + layer.cut_bytes_fixed
        params = f"{layer.params:,}" + (f" (+{layer.tied_params:,} tied)" if layer.tied_params else "")
        table.add_row(name, layer.kind, params, f"{flops / 1e9:,.2f}", f"{saved / MIB:,.1f}",
                      f"{cut / MIB:,.2f}" if layer is not profile.layers[-1] else "-", _tp_text(layer))
    total_flops = sum(lp.fwd_flops_per_sample * b + lp.fwd_flops_fixed for lp in profile.layers)
    eager = ("; eager attention (priced as the unfused kernel: the S×S scores are not in these columns)"
             if profile.attention_impl == "eager" else "")
    table.caption = (f"total: {profile.params:,} params, {total_flops / 1e12:,.3f} TFLOPs forward, "
                     f"{profile.saved_bytes(b) / MIB:,.1f} MiB saved activations per micro-batch of {b}; "
                     f"captured with {profile.capture.method} in {profile.capture.wall_s:.2f} s{eager}")
    return table


def print_profile(profile: ModelProfile, batch_size: int = 1, console: Console | None = None) -> None:
    (console or Console()).print(profile_table(profile, batch_size))
