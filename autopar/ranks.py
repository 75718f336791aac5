"""Megatron's rank order, the one place it is written: tp innermost, then cp, dp, pp (Megatron-Core's
``RankGenerator``, order tp-cp-dp-pp; the runtime's meshes, explain's group maps and the exporters read it here).

    rank = pp_rank·(dp·cp·tp) + dp_rank·(cp·tp) + cp_rank·tp + tp_rank

The experts view a stage's tp·cp·dp ranks as etp × ep × edp (Megatron-Core's expert ``RankGenerator`` over
etp × ep × edp × pp in the order tp-ep-dp-pp, megatron/core/parallel_state.py, core_v0.16.1): the experts'
tensor-parallel rank fastest, then the expert-parallel rank, then the expert data-parallel rank (context parallelism
folds into it), edp = tp·cp·dp / (ep·etp).
"""
from __future__ import annotations


def rank_of(p: int, d: int, c: int, t: int, *, tp: int, dp: int, cp: int = 1) -> int:
    """The global rank of pipeline rank p, data-parallel rank d, context-parallel rank c, tensor-parallel rank t."""
    return ((p * dp + d) * cp + c) * tp + t


def rank_formula(tp: int, dp: int, cp: int = 1) -> str:
    """The rank order in words, with the plan's strides."""
    if cp > 1:
        return f"pp_rank·{dp * cp * tp} + dp_rank·{cp * tp} + cp_rank·{tp} + tp_rank"
    return f"pp_rank·{dp * tp} + dp_rank·{tp} + tp_rank"


def mesh_groups(tp: int, dp: int, pp: int, cp: int = 1) -> dict[str, list[list[int]]]:
    """The ranks of every tensor-, context- (when cp > 1), data- and pipeline-parallel group."""
    def rank(p: int, d: int, c: int, t: int) -> int:
        return rank_of(p, d, c, t, tp=tp, dp=dp, cp=cp)

    every = [(p, d, c, t) for p in range(pp) for d in range(dp) for c in range(cp) for t in range(tp)]
    groups = {"tp": [[rank(p, d, c, t) for t in range(tp)] for p, d, c, t in every if t == 0],
              "cp": [[rank(p, d, c, t) for c in range(cp)] for p, d, c, t in every if c == 0],
              "dp": [[rank(p, d, c, t) for d in range(dp)] for p, d, c, t in every if d == 0],
              "pp": [[rank(p, d, c, t) for p in range(pp)] for p, d, c, t in every if p == 0]}
    if cp == 1:
        del groups["cp"]
    return groups


def gradient_groups(tp: int, dp: int, pp: int, cp: int) -> list[list[int]]:
    """Megatron-Core's dp-cp groups: the dp·cp ranks of a stage with the same tp rank (gradients are reduced over
    them)."""
    stage = tp * cp * dp
    return [[p * stage + j * tp + t for j in range(cp * dp)] for p in range(pp) for t in range(tp)]


def expert_rank_grid(tp: int, dp: int, pp: int, ep: int, etp: int, cp: int = 1) -> list[list[list[list[int]]]]:
    """The experts' view of the ranks, ``grid[pp_rank][edp_rank][ep_rank][etp_rank]`` (module docstring):
    rank = pp_rank·(tp·cp·dp) + edp_rank·(ep·etp) + ep_rank·etp + etp_rank."""
    stage = tp * cp * dp
    edp = stage // (ep * etp)
    return [[[[p * stage + d * ep * etp + e * etp + t for t in range(etp)] for e in range(ep)]
              for d in range(edp)] for p in range(pp)]


def expert_groups(tp: int, dp: int, pp: int, ep: int, etp: int, cp: int = 1) -> dict[str, list[list[int]]]:
    """The ranks of every expert-parallel ("ep"), expert tensor-parallel ("etp") and expert data-parallel
    ("edp") group, in the experts' rank order (expert_rank_grid)."""
    grid = expert_rank_grid(tp, dp, pp, ep, etp, cp)
    edp = len(grid[0])
    stages = range(pp)
    return {"ep": [[grid[p][d][e][t] for e in range(ep)] for p in stages for d in range(edp) for t in range(etp)],
            "etp": [grid[p][d][e] for p in stages for d in range(edp) for e in range(ep)],
            "edp": [[grid[p][d][e][t] for d in range(edp)] for p in stages for e in range(ep) for t in range(etp)]}


def nodes_spanned(group: list[int], gpus_per_node: int) -> int:
    """How many nodes of ``gpus_per_node`` consecutive ranks a group's ranks lie on."""
    return len({r // gpus_per_node for r in group})
