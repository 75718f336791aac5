"""The export frameworks the parser tests need, imported or skipped with the reason the import gave."""
from __future__ import annotations

import importlib
import warnings
from types import ModuleType

import pytest


def require(module: str, package: str) -> ModuleType:
    """``module``, or a skip naming ``package`` and the import's own error (CI turns "is not installed" skips
    into failures, tests/conftest.py, so the log says why it did not import)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return importlib.import_module(module)
    except ImportError as err:
        pytest.skip(f"{package} is not installed (pip install {package}): {type(err).__name__}: {err}")
