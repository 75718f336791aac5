"""Run a plan with PyTorch's own distributed engine: DeviceMesh, DTensor TP/SP, FSDP2, DDP, pipelining, AC,
expert parallelism (all-to-all token dispatch).

    loaded, meshes = prepare_rank(spec, "model.py")   # autopar.runtime.train
    pm = build(spec, loaded, meshes)                   # on meta; each rank allocates and initialises its shards
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
