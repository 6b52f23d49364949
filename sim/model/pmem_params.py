"""PMEM media timing: the one documented parameter file for sim/rtl/pmem_media.sv.

Model. Each memory channel is a DDR4-3200 channel's worth of persistent memory whose latency
and bandwidth are the DRAM baseline scaled by the TrainingCXL paper's Table 2 ratios
(docs/paper.md): read latency 3x, write latency 7x, read bandwidth 0.6x, write bandwidth
0.1x. pmem_media turns them into cycle counts at the device clock:

- RD_LAT / WR_LAT: cycles from an operation's service start to its earliest response
  handshake (an idle media starts service at the request's acceptance edge).
- RD_COST_Q8 / WR_COST_Q8: media occupancy per 64-byte line in 1/256 cycle, so the
  long-run service rate is 256 / COST lines per cycle (0.48 reads or 0.08 writes at 500 MHz).
- RD_QUEUE / WR_QUEUE: outstanding requests the media accepts per direction.

Simplifications (deliberate, documented):
- Reads and writes share ONE occupancy budget (a mixed stream gets a blend of the two
  bandwidths, weighted by the mix), and each direction is serviced in order.
- No banks, row buffers, refresh, or on-DIMM write-combining buffer: every line costs the
  same whatever its address or the previous access.
- No read-after-write penalty (Optane slows reads that follow writes to the same region)
  is modelled yet.
- Rounding to whole cycles / 1/256 cycle: describe() reports the figures actually modelled.

Sources of the numbers are on each field of PmemTiming.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PmemTiming:
    """DRAM baseline per channel and the paper's PMEM/DRAM ratios."""

    # DDR4-3200 peak bandwidth per 64-bit channel: 3200 MT/s x 8 B = 25.6 GB/s (GB = 1e9 B),
    # JEDEC JESD79-4 (DDR4 SDRAM standard, speed bin DDR4-3200).
    dram_peak_bw_gbps: float = 25.6
    # DRAM idle access latency, 80 ns: JEDEC DDR4-3200AA (CL22, 0.625 ns clock) gives
    # tRCD 13.75 ns + CL 13.75 ns = 27.5 ns in the DRAM itself; the rest is memory
    # controller, PHY and queueing. Consistent with "local DDR under 100 ns round trip"
    # (docs/cxl-reference.md section 5).
    dram_read_latency_ns: float = 80.0
    # DRAM write latency: taken equal to the read latency (a posted write is acknowledged
    # once the controller holds it; same 80 ns round trip).
    dram_write_latency_ns: float = 80.0
    # TrainingCXL (IEEE Micro 2023), Table 2, PMEM relative to DRAM (docs/paper.md).
    read_latency_ratio: float = 3.0
    write_latency_ratio: float = 7.0
    read_bw_ratio: float = 0.6
    write_bw_ratio: float = 0.1
    # One AXI beat = one 64-byte cache line (docs/architecture.md section 3).
    line_bytes: int = 64
    # Model choice: outstanding requests per direction. Must exceed the bandwidth-delay
    # product so that the media, not the queue, limits throughput: reads
    # 240 ns x 15.36 GB/s / 64 B = 57.6 lines, writes 560 ns x 2.56 GB/s / 64 B = 22.4
    # lines, at any clock.
    queue_depth: int = 64

    @property
    def read_latency_ns(self) -> float:
        return self.dram_read_latency_ns * self.read_latency_ratio        # 240 ns

    @property
    def write_latency_ns(self) -> float:
        return self.dram_write_latency_ns * self.write_latency_ratio      # 560 ns

    @property
    def read_bw_gbps(self) -> float:
        return self.dram_peak_bw_gbps * self.read_bw_ratio                # 15.36 GB/s

    @property
    def write_bw_gbps(self) -> float:
        return self.dram_peak_bw_gbps * self.write_bw_ratio               # 2.56 GB/s


DEFAULT_TIMING = PmemTiming()


def _cycles(ns: float, clock_mhz: float) -> int:
    return round(ns * clock_mhz / 1000.0)


def _cost_q8(bw_gbps: float, line_bytes: int, clock_mhz: float) -> int:
    # seconds per line x cycles per second x 256
    return round(256 * line_bytes / (bw_gbps * 1e9) * clock_mhz * 1e6)


def media_verilog_parameters(clock_mhz: float = 500.0, *, depth_lines: int, id_width: int,
                             addr_width: int,
                             timing: PmemTiming = DEFAULT_TIMING) -> dict[str, int]:
    """Parameters for one pmem_media instance (at 500 MHz: 120, 280, 533, 3200, 64, 64)."""
    return {
        "ID_W": id_width,
        "ADDR_W": addr_width,
        "DEPTH_LINES": depth_lines,
        "RD_LAT": _cycles(timing.read_latency_ns, clock_mhz),
        "WR_LAT": _cycles(timing.write_latency_ns, clock_mhz),
        "RD_COST_Q8": _cost_q8(timing.read_bw_gbps, timing.line_bytes, clock_mhz),
        "WR_COST_Q8": _cost_q8(timing.write_bw_gbps, timing.line_bytes, clock_mhz),
        "RD_QUEUE": timing.queue_depth,
        "WR_QUEUE": timing.queue_depth,
    }


def describe(clock_mhz: float = 500.0, timing: PmemTiming = DEFAULT_TIMING) -> dict:
    """Target figures and the ones the rounded cycle parameters actually model, per channel."""
    p = media_verilog_parameters(clock_mhz, depth_lines=1, id_width=1, addr_width=7,
                                 timing=timing)
    cycle_ns = 1000.0 / clock_mhz
    rd_lines = 256 / p["RD_COST_Q8"]
    wr_lines = 256 / p["WR_COST_Q8"]
    line_gbps = timing.line_bytes * clock_mhz * 1e6 / 1e9   # GB/s at one line per cycle
    return {
        "clock_mhz": clock_mhz,
        "cycle_ns": cycle_ns,
        "dram_latency_ns": timing.dram_read_latency_ns,
        "dram_bw_gbps": timing.dram_peak_bw_gbps,
        "target_read_latency_ns": timing.read_latency_ns,
        "target_write_latency_ns": timing.write_latency_ns,
        "target_read_bw_gbps": timing.read_bw_gbps,
        "target_write_bw_gbps": timing.write_bw_gbps,
        "rd_lat_cycles": p["RD_LAT"],
        "wr_lat_cycles": p["WR_LAT"],
        "read_latency_ns": p["RD_LAT"] * cycle_ns,
        "write_latency_ns": p["WR_LAT"] * cycle_ns,
        "read_lines_per_cycle": rd_lines,
        "write_lines_per_cycle": wr_lines,
        "read_bw_gbps": rd_lines * line_gbps,
        "write_bw_gbps": wr_lines * line_gbps,
        "queue_depth": timing.queue_depth,
    }
