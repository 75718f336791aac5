# Copyright (c) 2025 NVIDIA CORPORATION & AFFILIATES. All rights reserved.

"""The five helpers of megatron/training/utils.py (Megatron-LM core_v0.16.1) that arguments.py imports,
copied unchanged; the rest of that module needs the training loop and is left out (see ../../README.md)."""

import warnings

import torch

from megatron.core._rank_utils import safe_get_rank as _safe_get_rank


def print_rank_0(message, rank=None):
    """If distributed is initialized or rank is specified, print only on rank 0."""
    if rank is not None:
        if rank == 0:
            print(message, flush=True)
    else:
        if _safe_get_rank() == 0:
            print(message, flush=True)


def warn_rank_0(message, rank=None):
    """If distributed is initialized or rank is specified, warn only on rank 0."""
    if rank is not None:
        if rank == 0:
            warnings.warn(message)
    else:
        if _safe_get_rank() == 0:
            warnings.warn(message)


def is_rank0():
    """Returns true if called in the rank0, false otherwise."""
    return _safe_get_rank() == 0


def get_device_arch_version():
    """Returns GPU arch version (8: Ampere, 9: Hopper, 10: Blackwell, ...)"""
    return torch.cuda.get_device_properties(torch.device("cuda:0")).major


def update_use_dist_ckpt(args):
    args.use_dist_ckpt = args.ckpt_format != "torch"
