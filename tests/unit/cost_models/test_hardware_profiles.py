"""Today's hardware as data: every number of a built-in profile names its source and states an uncertainty, and the
fast (NVLink / xGMI) domain, not the node, decides which groups run on the fast links (cost_models/comm.py)."""
from __future__ import annotations

import json

import pytest

from cost_models import load_hardware
from cost_models.comm import all_to_all_time, domain_bandwidth, group_link, members_per_domain
from cost_models.hardware import PROFILE_DIR
from cost_models.hardware_file import UNCERTAIN_FIELDS

PROFILES = sorted(p.stem for p in PROFILE_DIR.glob("*.json") if p.stem != "cpu-calibrated")  # that one is measured
TODAY = ("b200", "gb200-nvl72", "mi300x", "mi325x", "mi355x")


@pytest.mark.parametrize("name", PROFILES)
def test_every_number_of_a_profile_names_its_source(name: str) -> None:
    raw = json.loads((PROFILE_DIR / f"{name}.json").read_text())
    given = set(raw) - {"name", "description", "sources", "uncertainty"}
    missing = sorted(given - set(raw["sources"]))
    assert not missing, f"{name}: no source for {missing}"
    assert all(len(text.strip()) > 10 for text in raw["sources"].values()), name


@pytest.mark.parametrize("name", TODAY)
def test_todays_profiles_state_the_uncertainty_of_every_number_that_prices_time(name: str) -> None:
    raw = json.loads((PROFILE_DIR / f"{name}.json").read_text())
    uncertain = {k for k in raw if k in UNCERTAIN_FIELDS} - {"tree_all_reduce"}
    missing = sorted(uncertain - set(raw["uncertainty"]) - {"mesh_link_bandwidth_bidirectional_gbytes_per_s",
                                                            "fp8_rowwise_gemm_efficiency"})
    assert not missing, f"{name}: no uncertainty for {missing}"
    hw = load_hardware(name)
    assert hw.peak("fp8") == pytest.approx(2 * hw.peak("bf16"), rel=0.01)  # dense FP8 doubles dense BF16 on all five


def test_a_gb200_nvl72_rack_is_18_nodes_of_4_in_one_72_gpu_domain() -> None:
    nvl, hgx = load_hardware("gb200-nvl72"), load_hardware("b200")
    assert (nvl.gpus_per_node, nvl.domain_gpus) == (4, 72)
    assert (hgx.gpus_per_node, hgx.domain_gpus) == (8, 8)
    # the NIC share per GPU is the same 400 Gb/s: the node's 4 NICs over its 4 GPUs
    assert nvl.inter_node_bytes_per_s == hgx.inter_node_bytes_per_s == 50e9


def test_the_domain_decides_which_groups_run_on_nvlink() -> None:
    nvl, hgx = load_hardware("gb200-nvl72"), load_hardware("b200")
    # the dp group of 9 at tp 8 (a 72-GPU tp 8 × dp 9 slice): inside one NVL72 domain, across 9 HGX nodes
    assert not group_link(nvl, 9, 8, nvl.domain_gpus).inter_node
    assert group_link(hgx, 9, 8, hgx.domain_gpus).inter_node
    # a tensor-parallel group of 8 is inside either
    assert not group_link(hgx, 8, 1, 8).inter_node and not group_link(nvl, 8, 1, 72).inter_node
    # so an all-to-all over those 9 costs NVLink time on NVL72, the NIC's on HGX
    nbytes = 256e6
    assert all_to_all_time(nbytes, 9, stride=8, gpus_per_node=72, hw=nvl) < \
        0.2 * all_to_all_time(nbytes, 9, stride=8, gpus_per_node=8, hw=hgx)


def test_power_of_two_groups_past_8_straddle_72_gpu_domains() -> None:
    """Megatron's rank order fills domains in turn: groups of 16 consecutive ranks tile 64 of a domain's 72 and the
    fifth straddles two domains (8 and 8), so the slowest copy of such a group crosses the network. A group of n
    ranks s apart stays whole only where n·s divides 72: for powers of two, n·s ≤ 8, as on an HGX node. Using 64 of
    each rack's 72 GPUs (--gpus-per-domain 64: 16 of its 18 trays) keeps groups of up to 64 whole."""
    assert members_per_domain(16, 1, 72) == 8 and members_per_domain(8, 4, 72) == 2
    assert members_per_domain(8, 1, 72) == 8 and members_per_domain(36, 2, 72) == 36
    assert members_per_domain(64, 1, 64) == 64 and members_per_domain(16, 4, 64) == 16
    assert group_link(load_hardware("gb200-nvl72"), 16, 1, 72).inter_node
    assert not group_link(load_hardware("gb200-nvl72"), 16, 1, 64).inter_node


def test_an_xgmi_mesh_gives_a_group_only_the_links_between_its_members() -> None:
    mi = load_hardware("mi300x")
    link = mi.mesh_link_bytes_per_s
    assert link == pytest.approx(64e9)                       # 128 GB/s per link, both directions
    assert domain_bandwidth(mi, 2) == pytest.approx(link)    # a pair: one link
    assert domain_bandwidth(mi, 8) == pytest.approx(min(7 * link, mi.intra_node_bytes_per_s))
    assert group_link(mi, 2, 1, 8).bytes_per_s < group_link(mi, 8, 1, 8).bytes_per_s
    switched = load_hardware("h100-80gb")
    assert domain_bandwidth(switched, 2) == domain_bandwidth(switched, 8) == switched.intra_node_bytes_per_s
