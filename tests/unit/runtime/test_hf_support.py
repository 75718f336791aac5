"""What autopar's runtime runs of Hugging Face models, as `autopar solve` asks it before searching
(autopar.runtime.support.unsupported): every feature for every family of tests/helpers/hf_families.py but those
``REFUSED`` names, each refusal one line saying why (the solve's note). The families' plans under torchrun:
tests/integration/test_hf_plans.py."""
from __future__ import annotations

import pytest

from helpers import hf_families as hf


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(hf.FAMILIES))
def test_what_the_runtime_refuses_is_one_line_each(family: str) -> None:
    from autopar.runtime.support import unsupported

    refused = unsupported(hf.profile(family))  # the capture tests/integration/test_hf_plans.py's plans are made from
    expected = hf.REFUSED.get(family, {})
    assert set(refused) == set(expected), refused
    for feature, why in expected.items():
        assert why in refused[feature] and "\n" not in refused[feature], refused[feature]
