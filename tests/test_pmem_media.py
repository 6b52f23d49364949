"""pmem_media alone: build it once (small DEPTH_LINES, the 500 MHz timing of
sim/model/pmem_params.py) and run each cocotb test of tests/pmem_media_tb.py in a fresh
simulation, so no test depends on another's leftovers. PMEM_TEST_SEED=<n> repeats a
random test's stimulus (each test prints the seed it used)."""
from __future__ import annotations

import json
import os

import pytest

from sim import runner
from sim.model.pmem_params import media_verilog_parameters

from sim.harness import MEDIA_SOURCES
PARAMS = media_verilog_parameters(500.0, depth_lines=1024, id_width=8, addr_width=32)
TESTS = ["test_zero_init_and_backdoor", "test_idle_latency", "test_read_bandwidth",
         "test_write_bandwidth", "test_arbitration_alternates", "test_strobes_and_poison",
         "test_slverr", "test_random_traffic", "test_power_failure", "test_store_arrays"]
# The same media at 1 GiB (2**24 lines): its store must be sparse.
GIB_PARAMS = media_verilog_parameters(500.0, depth_lines=1 << 24, id_width=8, addr_width=32)


def test_params_match_paper_at_500mhz():
    assert {k: PARAMS[k] for k in ("RD_LAT", "WR_LAT", "RD_COST_Q8", "WR_COST_Q8",
                                   "RD_QUEUE", "WR_QUEUE")} == {
        "RD_LAT": 120, "WR_LAT": 280, "RD_COST_Q8": 533, "WR_COST_Q8": 3200,
        "RD_QUEUE": 64, "WR_QUEUE": 64}


@pytest.fixture(scope="module")
def build_dir():
    return runner.build("pmem_media", list(MEDIA_SOURCES), "pmem_media", parameters=PARAMS)


@pytest.mark.sim
@pytest.mark.parametrize("testcase", TESTS)
def test_pmem_media(build_dir, testcase):
    env = {"PMEM_PARAMS": json.dumps(PARAMS)}
    if "PMEM_TEST_SEED" in os.environ:
        env["PMEM_TEST_SEED"] = os.environ["PMEM_TEST_SEED"]
    runner.run(build_dir, "pmem_media", "tests.pmem_media_tb", testcase, env=env)


@pytest.mark.sim
def test_pmem_media_gigabyte():
    build = runner.build("pmem_media", list(MEDIA_SOURCES), "pmem_media", parameters=GIB_PARAMS)
    runner.run(build, "pmem_media", "tests.pmem_media_tb", "test_gigabyte_store",
               env={"PMEM_PARAMS": json.dumps(GIB_PARAMS)})
