"""cost_models: predicted time and memory of a training step under any parallel configuration.

Pure Python, no torch, no autopar import: it reads a ModelProfile-shaped object (cost_models.model)
and a HardwareProfile (cost_models.hardware) and returns a StepEstimate (cost_models.step).
"""
from cost_models.config import ParallelConfig, Pins, make_config
from cost_models.errors import ConfigError
from cost_models.estimate import DeviceEstimate, StepEstimate
from cost_models.hardware import HardwareProfile, builtin_names, hardware_from_dict, load_hardware
from cost_models.precision import PRECISIONS, Precision, default_precision
from cost_models.step import CostModel, evaluate

__all__ = ["PRECISIONS", "ConfigError", "CostModel", "DeviceEstimate", "HardwareProfile", "ParallelConfig",
           "Precision", "StepEstimate", "builtin_names", "default_precision", "evaluate", "hardware_from_dict",
           "load_hardware", "make_config", "Pins"]
