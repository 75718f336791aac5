"""The settings of a plan that autopar's runtime runs one way only: a plan asking for another is refused in one line
before torchrun (the plan was made for another engine: export it to that engine instead).

- experts are dispatched by all-to-all (autopar/runtime/ep.py), never overlapped with another micro-batch;
- gradients are reduced during the backward (DDP's buckets, FSDP2's reduce-scatters);
- tensor-parallel collectives run between the GEMMs (DTensor), never overlapped inside them;
- selective recomputation re-runs the attention core only (autopar/runtime/ac.py);
- the blocks run eagerly (a plan priced under torch.compile is for torchtitan: export it);
- the model trains on its own next-token loss: no multi-token prediction layers (a plan with them is Megatron-Core's).
"""
from __future__ import annotations

from autopar.errors import AutoparError
from autopar.plan import Plan, RunPlan

# decision -> (the values the runtime runs, what it does); EXPORT_TO: the engine such a plan was made for, where it is
# not Megatron-Core
EXPORT_TO = {"compile": "torchtitan"}
RUNS = {
    "moe_dispatcher": (("alltoall",), "dispatches experts' tokens by all-to-all"),
    "moe_overlap": ((False,), "does not overlap the experts' all-to-alls with another micro-batch"),
    "overlap_grad_reduce": ((None, True), "reduces gradients during the backward"),
    "tp_comm_overlap": ((False,), "does not overlap tensor-parallel collectives with the GEMMs"),
    "recompute_modules": ((None, ("core_attn",)), "recomputes the attention core only under selective recomputation"),
    "compile": ((False,), "runs the blocks eagerly, without torch.compile"),
    "mtp_layers": ((0,), "trains no multi-token prediction layers"),
}


def check_settings(spec: RunPlan | Plan) -> None:
    """AutoparError (one line) for the first setting of ``spec`` the runtime does not run as asked."""
    for name, (runs, what) in RUNS.items():
        value = getattr(spec.parallelism, name)
        if value not in runs:
            shown = ",".join(value) if isinstance(value, tuple) else value
            replan = "without --mtp-layers " if name == "mtp_layers" else ""
            raise AutoparError(f"the plan sets {name} {shown}, but autopar's runtime {what}; re-plan {replan}for "
                               "autopar's runtime (autopar solve --engine autopar) or export the plan to the engine "
                               f"it was made for (autopar export --to {_made_for(spec, name)})")


def _made_for(spec: RunPlan | Plan, name: str) -> str:
    """The export target of the engine the plan was priced for, where it is one; else the setting's usual one."""
    engine = getattr(getattr(spec, "prediction", None), "engine", None)
    return engine if engine in ("megatron", "torchtitan", "deepspeed") else EXPORT_TO.get(name, "megatron")
