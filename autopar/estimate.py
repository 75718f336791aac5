"""`autopar estimate`: evaluate one explicit parallel configuration with cost_models, return a Plan."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from autopar.errors import AutoparError
from autopar.models import load_profile
from autopar.plan import Plan
from autopar.pricing import attention_kernel, cluster_shape, plan_of, priced_hardware
from autopar.profile import ModelProfile
from autopar.search.robust import assess, scenarios
from cost_models import ConfigError, CostModel, make_config
from cost_models.config import default
from cost_models.engines import DEFAULT_ENGINE, load_engine
from cost_models.hardware import DEFAULT_HARDWARE
from cost_models.rules import check_engine_mtp


def estimate(profile_or_source: str | Path | ModelProfile, *, gpus: int, gpus_per_node: int | None = None,
             gpus_per_domain: int | None = None,
             gpu: str = DEFAULT_HARDWARE, hardware_file: str | Path | None = None,
             global_batch_size: int | None = None, seq_len: int | None = None,
             overrides: Mapping[str, str] | None = None, dtype: str = "bf16", engine: str = DEFAULT_ENGINE,
             **choices: Any) -> Plan:
    """Predict step time and memory of one configuration under ``engine`` (cost_models/engines.py), with its
    range over the hardware profile's uncertainties; raises AutoparError if it cannot run. ``choices``: the
    configuration's declared decisions by name (cost_models/config.py: tp, pp, dp, micro_batch_size, zero_stage,
    …); the rest take their declared defaults, dp the GPUs the other degrees leave.

    A configuration that runs but does not fit in memory is returned with ``prediction.fits`` false and
    the reason in ``notes``."""
    hardware_name = str(hardware_file) if hardware_file is not None else gpu
    if hardware_file is not None and Path(hardware_file).suffix != ".json":
        raise AutoparError(f"--hardware expects a .json profile file, got {hardware_file}")
    raw, hw = priced_hardware(gpu, hardware_file, dtype=dtype, engine=engine, fp8=choices.get("fp8"),
                              compile_=choices.get("compile"))
    node, domain = cluster_shape(raw, gpus, gpus_per_node, gpus_per_domain, whole_nodes=False)
    try:
        profile = load_profile(profile_or_source, overrides=overrides, seq_len=seq_len, dtype=dtype,
                               mtp_layers=choices.get("mtp_layers") or 0)
        given = {name: value for name, value in choices.items() if value is not None}
        if given.get("schedule") == "dualpipev":  # its two chunks per device: the only virtual-stage count it runs
            given.setdefault("virtual_stages", 2)
        degrees = {name: given.get(name, default(name)) for name in ("tp", "cp", "pp", "micro_batch_size")}
        batch = global_batch_size if global_batch_size is not None else (
            profile.global_batch or degrees["micro_batch_size"] * gpus // (degrees["tp"] * degrees["cp"] * degrees["pp"]))
        given["attention_kernel"] = attention_kernel(profile, given.get("attention_kernel", default("attention_kernel")))
        check_engine_mtp(given.get("mtp_layers", 0), hw.mtp_without, f"--engine {engine}",
                         pp=degrees["pp"], cp=degrees["cp"])
        cfg = make_config(gpus, global_batch_size=batch, gpus_per_node=min(domain, gpus), **given)
        result = CostModel(profile, hw).evaluate(cfg)
        spread = assess(profile, result.config, scenarios(raw, load_engine(engine)), None, None)
    except ConfigError as err:
        raise AutoparError(str(err)) from err
    return plan_of(profile, result, hw, gpus_per_node=node, hardware_name=hardware_name, engine=engine,
                   uncertainty=spread, gpus_per_domain=domain)
