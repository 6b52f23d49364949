"""cocotb side of the fp32 bulk harness (sim/rtl/fp32_harness.sv): clock, reset, wait.

All operands and results move through files ($readmemh / $writememh, see the harness
contract); Python wakes up only for the reset and the final `done`, so the simulation runs
at Verilator speed. FP32_N (vector count) bounds the wait.
"""
import os

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, RisingEdge, with_timeout


@cocotb.test()
async def run_vectors(dut):
    n = int(os.environ.get("FP32_N", "0"))
    Clock(dut.clk, 10, unit="ns").start()
    dut.rst.value = 1
    await ClockCycles(dut.clk, 2)
    dut.rst.value = 0
    # One vector per cycle, up to ~1/4 bubbles, plus the pipeline latency.
    await with_timeout(RisingEdge(dut.done), 10 * (2 * n + 100), "ns")
    errors = int(dut.errors.value)
    assert errors == 0, f"{errors} results with a wrong tag, latency or count"
    assert int(dut.fma_count.value) == n and int(dut.div_count.value) == n
