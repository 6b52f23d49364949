"""RTL regression of the CXL.mem path on Verilator (cocotb tests in sim/tb/cxl_mem_tb.py).

Every test runs the CXL.mem protocol monitor and the scoreboard; reads are compared bit for
bit (data and poison) with the numpy reference memory. Random tests log their seed; replay
one with TCXL_SEED=<seed> pytest tests/test_cxl_mem.py -k <name>.
"""
import pytest

from conftest import run_cocotb

MODULE = "sim.tb.cxl_mem_tb"

DIRECTED = [
    "identity_registers",
    "idle_read_latency",
    "read_write_and_meta_responses",
    "partial_write_byte_enables",
    "read_after_write_same_line",
    "invalidate_and_speculative_read",
    "outside_window_nxm_and_counters",
    "outside_window_same_tag_and_counter_scope",
    "reserved_and_unsupported_opcodes",
    "poison_propagates",
]


@pytest.mark.sim
@pytest.mark.parametrize("testcase", DIRECTED)
def test_directed(harness, testcase):
    run_cocotb(harness, MODULE, testcase)


@pytest.mark.sim
def test_random_stress(harness):
    run_cocotb(harness, MODULE, "random_stress", TCXL_TRANSACTIONS=3000)


@pytest.mark.sim
def test_power_failure(harness):
    run_cocotb(harness, MODULE, "power_failure_under_writes", TCXL_POWER_ROUNDS=6)


@pytest.mark.sim
def test_streaming_reads(harness):
    run_cocotb(harness, MODULE, "streaming_read_bandwidth", TCXL_BENCH_LINES=2048)
