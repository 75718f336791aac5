"""`autopar calibrate`: measure this machine and write a hardware profile (the work is in autopar.calibrate)."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from autopar.commands import options
from autopar.commands.base import fail
from autopar.errors import AutoparError


def calibrate_command(
    output: Annotated[Optional[Path], options.output("profile JSON to write (use it with --hardware in solve / "
                                                     "estimate); on a CPU (gloo) the profile is also recorded as "
                                                     "this machine's, which --gpu cpu reads", ("json",))] = None,
    nproc: Annotated[int, options.whole("K", help="processes (GPUs) benchmarked at once, as a plan of this size "
                                                  "runs")] = 2,
    backend: Annotated[Optional[str], typer.Option(metavar="gloo|nccl", show_default=False,
                                                   help="gloo (CPU) or nccl (CUDA); default: nccl when a GPU is "
                                                        "visible")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="fewer shapes and sizes (~15 s on CPU; for tests)")] = False,
    base: Annotated[Optional[str], typer.Option(metavar="NAME|FILE", show_default=False,
                                                help="profile (built-in name or .json) whose inter-node fields are "
                                                     "kept (default: cpu, or the closest built-in GPU)")] = None,
    gpus_per_node: Annotated[Optional[int], options.whole("G", show_default=False,
                                                          help="GPUs per node to record (default: --nproc)")] = None,
    name: Annotated[Optional[str], typer.Option(metavar="NAME", show_default=False,
                                                help="profile name (default: the output file's stem)")] = None,
) -> None:
    """Benchmark GEMMs, memory-bound kernels and collectives under torchrun and fit a hardware profile."""
    from rich.console import Console

    from autopar.calibrate.run import GROUP_TITLES, calibrate, check_request
    from autopar.report.progress import CalibrationProgress

    console = Console(stderr=True)
    try:
        req = check_request(output, nproc=nproc, backend=backend, quick=quick, base=base,
                            gpus_per_node=gpus_per_node, name=name)
        with CalibrationProgress(console, GROUP_TITLES) as bar:
            profile = calibrate(req, bar)
    except AutoparError as err:
        raise fail(str(err))
    from autopar.calibrate.report import print_calibration

    print_calibration(profile, req.output)
