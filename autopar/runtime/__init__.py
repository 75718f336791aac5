"""Run a plan with PyTorch's own distributed engine: DeviceMesh, DTensor TP/SP, FSDP2, DDP, pipelining, AC.

    meshes = build_meshes(spec, init_distributed())
    pm = parallelize(model, spec, meshes, tp_plans=plans, loss_fn=model_spec.loss_fn)
    loss = pm.forward_backward(batch); optimizer.step()

The only package besides capture and calibrate that imports torch; the plan it runs is plain data (autopar/plan.py).
"""
from autopar.plan import LayerAssignment, ModelRef, Parallelism, RunPlan

__all__ = ["RunPlan", "LayerAssignment", "ModelRef", "Parallelism", "parallelize", "build_meshes", "init_distributed"]


def __getattr__(name: str):  # torch loads only when the runtime is used, not when a plan is parsed
    if name == "parallelize":
        from autopar.runtime.parallelize import parallelize
        return parallelize
    if name in ("build_meshes", "init_distributed"):
        from autopar.runtime import mesh
        return getattr(mesh, name)
    raise AttributeError(name)
