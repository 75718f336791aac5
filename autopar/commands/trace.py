"""`autopar trace`: a model's layer profile (the work is in autopar.capture)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from autopar.commands import options
from autopar.commands.base import fail
from autopar.errors import AutoparError


def trace_command(
    model: Annotated[str, options.MODEL],
    set_: Annotated[Optional[list[str]], options.SET] = None,
    batch_size: Annotated[int, options.whole("B", help="micro-batch size the table shows")] = 1,
    seq_len: Annotated[Optional[int], options.SEQ_LEN] = None,
    dtype: Annotated[str, options.DTYPE] = "bf16",
    output: Annotated[Optional[Path], options.output("write the profile JSON here")] = None,
    json_: Annotated[bool, options.JSON] = False,
) -> None:
    """Trace MODEL on the meta device and print its layer profile (params, FLOPs, activations, TP pattern)."""
    try:
        from autopar.capture import capture_model
        from autopar.profile import parse_set

        profile = capture_model(model, parse_set(set_ or []), batch_size=batch_size, seq_len=seq_len, dtype=dtype)
    except AutoparError as e:
        raise fail(str(e))
    if output is not None:
        profile.save(output)
    if json_:
        sys.stdout.write(profile.model_dump_json(indent=1) + "\n")
    else:
        from autopar.report.profile_table import print_profile

        print_profile(profile, batch_size)
        if output is not None:
            typer.echo(f"profile written to {output}")
