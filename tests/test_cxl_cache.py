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


@pytest.mark.sim
@pytest.mark.parametrize("testcase", DIRECTED)
def test_cache_directed(harness, testcase):
    run_cocotb(harness, MODULE, testcase)
