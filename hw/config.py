"""Device configuration: one dataclass that sizes every block (see hw/top.py)."""
from __future__ import annotations

from dataclasses import dataclass

from .common.cxl_mem import LINE_BYTES
from .common.fp32 import Fp32Fma


SIM_CAPACITY_BYTES = 1 << 30           # the simulated device's memory (DeviceConfig.for_simulation)


@dataclass(frozen=True)
class DeviceConfig:
    """Parameters of one TrainingCxlDevice build.

    channels: AXI4 memory channels (power of two). capacity_bytes: device memory behind
    them (a power of two; lines interleave across channels). read_ids_per_channel and
    writes_per_channel: outstanding media reads / writes per channel. input_depth and
    output_depth: CXL.mem message FIFOs at the link side. clock_mhz: the device clock, used
    to turn cycle counts into time (it does not change the RTL). cache_lines and
    cache_trackers: the CXL.cache agent's device cache and requests in flight.
    cache_test_port: expose the agent's internal request port as top-level ports (the
    simulation build does, so tests can drive it until the NDP engines use it). bias_pages:
    entries of the bias table (1 MiB pages in the 64 GiB default, 4 KiB in simulation).
    lookup_units / lookup_rob_depth / lookup_contexts: the lookup engine's reduce units, the
    row lines each keeps in flight and the bags each interleaves (hw/ndp/lookup.py).
    lookup_cache_lines: each lookup unit's row cache in 64-byte lines (hw/mem/line_cache.py;
    0 = no cache, the paper's design).
    update_scratch_lines: the update engine's row scratchpad in lines (hw/ndp/update/engine.py).
    log_set_entries: the undo-log engine's deduplication set, in (table, row) keys
    (hw/checkpoint/undo_log.py). fp32_pipeline: the FP32 FMA and divider pipelines of both
    engines ("compact" or "deep", below).
    """
    channels: int = 4
    capacity_bytes: int = 64 << 30          # 4 x 16 GiB: an Alveo U200's four DDR4 channels
    read_ids_per_channel: int = 64
    writes_per_channel: int = 32
    input_depth: int = 4
    output_depth: int = 4
    clock_mhz: int = 500
    cache_lines: int = 64                   # CXL.cache device cache (direct mapped)
    cache_trackers: int = 64                # CXL.cache requests in flight (CQIDs)
    cache_test_port: bool = False           # expose the internal cache port at the top
    bias_pages: int = 65536                 # HDM-D bias table entries (page = capacity / pages)
    lookup_units: int = 3                   # LOOKUP reduce units (16 FP32 lanes and a memory port each)
    lookup_rob_depth: int = 128             # row lines in flight per lookup unit
    # Bag contexts per lookup unit (a power of two >= 2): their rows interleave to hide the
    # FMA's latency on a bag's chain (hw/ndp/lookup_unit.py).
    lookup_contexts: int = 2
    # LOOKUP row cache per unit (64 KiB: 16 BRAM36 of data); 0 turns it off (issue 15).
    lookup_cache_lines: int = 1024
    update_scratch_lines: int = 1024        # UPDATE row scratchpad (64 KiB)
    # LOG: distinct rows tracked per pass (4 ways x 55 bits: 14.4 Mbit, ~56 URAM288 of the
    # XCU200's 960). Every pass streams the whole index array and a pass fits about 1/8 of
    # this many keys: 4096 made an rm1 batch of 16k distinct rows take ~200 passes (2M
    # cycles); 32768 made rm1 at batch 256 (~130k distinct rows, 65536 rows per table) take
    # ~60 passes. Paper-scale batches (issue 14) need this many.
    log_set_entries: int = 262144
    # FP32 units of LOOKUP and UPDATE (hw/common/fp32.py): "compact" (FMA 5 / divide 10
    # cycles, up to 29 LUT levels per stage) or "deep" (12 / 18 cycles, <= 6 levels: what a
    # 250 MHz UltraScale+ clock needs). Results are identical; only timing differs.
    fp32_pipeline: str = "compact"

    def __post_init__(self):
        def pow2(x):
            return x > 0 and x & (x - 1) == 0
        if not pow2(self.channels):
            raise ValueError(f"channels must be a power of two, got {self.channels}")
        if not pow2(self.capacity_bytes) or self.capacity_bytes < LINE_BYTES * self.channels:
            raise ValueError(f"capacity_bytes must be a power of two of at least "
                             f"{LINE_BYTES * self.channels}, got {self.capacity_bytes}")
        if self.fp32_pipeline not in Fp32Fma.LATENCIES:
            raise ValueError(f"fp32_pipeline must be one of {tuple(Fp32Fma.LATENCIES)}, "
                             f"got {self.fp32_pipeline!r}")
        if not 1 <= self.read_ids_per_channel <= 256:
            raise ValueError("read_ids_per_channel must be 1..256 (8-bit AXI IDs)")
        if self.writes_per_channel < 1:
            raise ValueError("writes_per_channel must be at least 1")
        if not pow2(self.bias_pages) or not 2 <= self.bias_pages <= self.capacity_bytes // 4096 \
                or self.bias_pages > 1 << 24:
            raise ValueError("bias_pages must be a power of two, pages of at least 4 KiB, "
                             "at most 2**24 pages")
        if not 1 <= self.lookup_units <= 16 or not pow2(self.lookup_rob_depth):
            raise ValueError("lookup_units must be 1..16 and lookup_rob_depth a power of two")
        if not pow2(self.lookup_contexts) or not 2 <= self.lookup_contexts <= 16:
            raise ValueError(f"lookup_contexts must be a power of two in 2..16, got {self.lookup_contexts}")
        if self.lookup_cache_lines and (not pow2(self.lookup_cache_lines) or self.lookup_cache_lines < 2
                                        or self.lookup_cache_lines >= self.capacity_lines):
            raise ValueError("lookup_cache_lines must be 0 (off) or a power of two >= 2, below the capacity")
        if not pow2(self.cache_lines) or not pow2(self.cache_trackers) or self.cache_trackers > 4096:
            raise ValueError("cache_lines and cache_trackers must be powers of two (trackers <= 4096)")

    @classmethod
    def for_simulation(cls, capacity_bytes: int | None = None, **kw) -> "DeviceConfig":
        """The configuration the Verilator regression uses: the same queues, ``capacity_bytes``
        of device memory (default SIM_CAPACITY_BYTES, 1 GiB: the PMEM media model's store is
        sparse, so memory costs only the lines touched), the bias table of the default device
        (at most 65,536 pages, of at least 4 KiB) and the cache test port."""
        capacity_bytes = SIM_CAPACITY_BYTES if capacity_bytes is None else capacity_bytes
        channels = kw.pop("channels", 4)
        kw.setdefault("cache_test_port", True)
        kw.setdefault("bias_pages", max(2, min(1 << 16, capacity_bytes // 4096)))
        return cls(channels=channels, capacity_bytes=capacity_bytes, **kw)

    @property
    def capacity_lines(self) -> int:
        return self.capacity_bytes // LINE_BYTES

    @property
    def addr_bits(self) -> int:
        """Bits of a device line address."""
        return (self.capacity_lines - 1).bit_length()

    @property
    def lines_per_channel(self) -> int:
        return self.capacity_lines // self.channels

    @property
    def bias_page_line_bits(self) -> int:
        """log2 of the lines in one bias page."""
        return (self.capacity_lines // self.bias_pages - 1).bit_length()

    @property
    def max_outstanding_reads(self) -> int:
        return self.channels * self.read_ids_per_channel

    @property
    def max_outstanding_writes(self) -> int:
        return self.channels * self.writes_per_channel
