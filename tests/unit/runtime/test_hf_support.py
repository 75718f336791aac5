"""What autopar's runtime runs of Hugging Face models, as `autopar solve` asks it before searching
(autopar.runtime.support.unsupported): every feature for every family of tests/helpers/hf_families.py but those
``REFUSED`` names, each refusal one line saying why (the solve's note). The families' plans under torchrun:
tests/integration/test_hf_plans.py."""
from __future__ import annotations

import pytest

from helpers import ROOT
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


@pytest.mark.slow
@pytest.mark.parametrize("model,changes,seq,feature,why", [
    # fused q|k|v rows of grouped-query attention: q wider than k and v (Phi-3-medium's 40 and 10 heads)
    ("hf/phi-3-mini-4k-instruct", {"num_key_value_heads": "2"}, hf.SEQ, "tp", "stacks q, k and v of unequal widths"),
    # the experts' token dispatch takes equal blocks (a dense model's layers take unequal ones: ViT's in hf_families)
    ("hf/mixtral-8x7b-v0.1", {}, 15, "sequence_parallel", "(15 tokens) does not split into 2 equal blocks"),
])
def test_the_runtime_refuses_what_fails_in_the_ranks(model: str, changes: dict, seq: int, feature: str,
                                                      why: str) -> None:
    from autopar.capture import capture_model
    from autopar.runtime.support import unsupported
    from helpers import solved_plans as sp

    source, overrides = sp.MODELS[model]
    profile = capture_model(str(ROOT / source), overrides | changes, seq_len=seq, dtype="fp32")
    assert why in unsupported(profile).get(feature, ""), unsupported(profile)


def test_sequence_parallelism_takes_unequal_blocks_where_the_layers_do() -> None:
    from autopar.errors import AutoparError
    from autopar.runtime.support import check_sequence_length

    check_sequence_length(16, 2, uneven=False)
    check_sequence_length(197, 2, uneven=True)
    with pytest.raises(AutoparError, match="does not split into 2 equal blocks"):
        check_sequence_length(197, 2, uneven=False)
