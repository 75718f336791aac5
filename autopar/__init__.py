"""autopar: trace a PyTorch model, solve for the fastest parallel plan under memory, run it.

    import autopar
    plan = autopar.solve("examples/gpt.py", gpus=64)          # the fastest plan that fits (CP-SAT)
    plan.save("plan.json"); autopar.Plan.load("plan.json")
    est = autopar.estimate("examples/gpt.py", gpus=64, tp=8, pp=2, micro_batch_size=1, global_batch_size=512)

Importing autopar does not import torch; tracing a model (or running a plan) does.
"""
from autopar.estimate import estimate
from autopar.plan import Plan
from autopar.search import Pins, solve, solve_top_k

__version__ = "0.1.0"
__all__ = ["Pins", "Plan", "estimate", "solve", "solve_top_k"]
