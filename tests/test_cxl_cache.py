"""RTL tests of the CXL.cache agent on Verilator (cocotb tests in sim/tb/cxl_cache_tb.py).

The host side is scripted message by message, so every flow is checked exactly; the
CXL.cache protocol monitor watches every message.
"""
import pytest

from conftest import run_cocotb

MODULE = "sim.tb.cxl_cache_tb"

DIRECTED = [
    "read_for_ownership_then_hits",
    "shared_read_then_write_upgrade",
    "dirty_eviction_then_clean_eviction_dropped",
    "itomwr_and_wrinv_pushes",
    "flush_dirty_and_clean",
    "snoop_every_state",
    "snoop_between_evict_and_pull_sets_bogus",
    "go_err_is_used_once_and_counted",
    "push_stream_bandwidth",
    "coherence_stress",
    "bias_flips",
    "go_err_write_pull_still_sends_data",
]


# Illegal host messages and held-back evicts (issue 20): sim/tb/cxl_cache_stray_tb.py.
STRAY_MODULE = "sim.tb.cxl_cache_stray_tb"
STRAY = [
    "stray_go_for_a_free_cqid_changes_nothing",
    "stray_cqid_above_the_tracker_count",
    "stray_data_and_pulls_for_free_cqids",
    "stray_messages_in_the_wrong_phase",
    "reserved_snoop_opcodes_answer_rsp_i_hit_i",
    "evict_held_back_across_snoops",
    "illegal_host_rounds",
]


@pytest.mark.sim
@pytest.mark.parametrize("testcase", DIRECTED)
def test_cache_directed(harness, testcase):
    run_cocotb(harness, MODULE, testcase)


@pytest.mark.sim
@pytest.mark.parametrize("testcase", STRAY)
def test_cache_stray(harness, testcase):
    run_cocotb(harness, STRAY_MODULE, testcase)
