"""`autopar estimate`: evaluate one explicit parallel configuration with cost_models, return a Plan."""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

from autopar.errors import AutoparError
from autopar.plan import Plan
from autopar.pricing import attention_kernel as pricing_kernel
from autopar.pricing import plan_of, priced_hardware
from autopar.profile import ModelProfile, load_profile
from autopar.search.robust import assess, scenarios
from cost_models import ConfigError, CostModel, make_config
from cost_models.engines import DEFAULT_ENGINE, load_engine
from cost_models.hardware import DEFAULT_HARDWARE


def estimate(profile_or_source: str | Path | ModelProfile, *, gpus: int, gpus_per_node: int = 8,
             gpu: str = DEFAULT_HARDWARE, hardware_file: str | Path | None = None, tp: int = 1, pp: int = 1,
             dp: int | None = None, micro_batch: int = 1, global_batch: int | None = None,
             seq_len: int | None = None, zero: int = 0, recompute: str = "full", sequence_parallel: bool = False,
             schedule: str = "1f1b", virtual_stages: int = 1, offload_activations: bool = False,
             attention_kernel: str = "fused", attention_dropout: bool = False,
             overrides: Mapping[str, str] | None = None, dtype: str = "bf16", ep: int = 1, etp: int | None = None,
             moe_imbalance: float | None = None, engine: str = DEFAULT_ENGINE, cp: int = 1,
             cp_comm: str = "all_gather") -> Plan:
    """Predict step time and memory of one configuration under ``engine`` (cost_models/engines.py), with its
    range over the hardware profile's uncertainties; raises AutoparError if it cannot run.

    A configuration that runs but does not fit in memory is returned with ``prediction.fits`` false and
    the reason in ``notes``."""
    hardware_name = str(hardware_file) if hardware_file is not None else gpu
    if hardware_file is not None and Path(hardware_file).suffix != ".json":
        raise AutoparError(f"--hardware expects a .json profile file, got {hardware_file}")
    raw, hw = priced_hardware(gpu, hardware_file, dtype=dtype, engine=engine)
    try:
        profile = load_profile(profile_or_source, overrides=overrides, seq_len=seq_len, dtype=dtype)
        batch = global_batch if global_batch is not None else \
            (profile.global_batch or micro_batch * gpus // (tp * cp * pp))
        cfg = make_config(gpus, tp=tp, pp=pp, dp=dp, micro_batch=micro_batch, global_batch=batch, zero_stage=zero,
                          recompute=recompute, sequence_parallel=sequence_parallel, schedule=schedule,
                          virtual_stages=virtual_stages, offload_activations=offload_activations,
                          gpus_per_node=gpus_per_node, attention_kernel=pricing_kernel(profile, attention_kernel),
                          attention_dropout=attention_dropout, ep=ep, etp=etp, moe_imbalance=moe_imbalance, cp=cp,
                          cp_comm=cp_comm)
        result = CostModel(profile, hw).evaluate(cfg)
        spread = assess(profile, result.config, scenarios(raw, load_engine(engine)), None, 0.0)
    except ConfigError as err:
        raise AutoparError(str(err)) from err
    return plan_of(profile, result, hw, gpus_per_node=gpus_per_node, hardware_name=hardware_name, engine=engine,
                   uncertainty=spread)
