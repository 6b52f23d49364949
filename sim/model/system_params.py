"""System parameters of the evaluation: the one documented file, with a source for every number.

Everything ``trainingcxl eval`` composes around the RTL's measured cycles comes from here:
the host CPU, the host's PMEM, the PCIe and CXL links, the GPU, the software costs of the
PCIe configuration and the energy model. Two figures that other files already own are
re-exported, not retyped: the PMEM media timing (``PMEM``: DDR4-3200 per channel scaled by
the paper's Table 2, sim/model/pmem_params.py) and the RTX 3090's FP32 peak and the MLP
efficiency (sim/bfm/gpu_agent.py). ``describe()`` returns every value, for the JSON.

Modelling choices (``Modelling``, issue 21): six switches, each True for the fair choice (the
default) and False for the choice this evaluation made before an outside recomputation showed
that it handicapped a baseline or left a cost out. ``paper_choices()`` gives the params with all
six switched back; the report's fairness ablation flips each one alone.

Kinds of numbers (each field says which):
- **spec**: a vendor or standard figure (the document is named).
- **paper**: TrainingCXL (IEEE Micro 2023), docs/paper.md.
- **assumption**: a project choice with its reason, a parameter to sweep. None of them was
  tuned to reproduce a paper figure; they were fixed before the first evaluation run.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from hw.config import DeviceConfig
from sim.bfm.gpu_agent import DEFAULT_EFFICIENCY, RTX3090_PEAK_FLOPS
from sim.model.pmem_params import DEFAULT_TIMING as PMEM
from sim.model.pmem_params import PmemTiming


@dataclass(frozen=True)
class HostCpu:
    """The host of the PMEM baseline: embedding operations in software over host-attached PMEM."""

    # spec: Intel Core i5-9600K (the paper's host, docs/paper.md Evaluation): 6 cores,
    # 3.7 GHz base (Intel ARK), two memory channels.
    cores: int = 6
    clock_ghz: float = 3.7
    memory_channels: int = 2       # the i5-9600K's; Modelling.equal_channels gives the host the device's
    # spec: 9 MB Intel Smart Cache (the shared L3, Intel ARK). Modelling.host_cache: what the
    # host's embedding loops find in it.
    llc_bytes: int = 9 * 2**20
    # spec: Skylake-derived cores issue two 256-bit FMAs per cycle = 32 FP32 FLOP/cycle
    # (Intel 64 and IA-32 Architectures Optimization Reference Manual, Skylake microarchitecture).
    flops_per_cycle: int = 32
    # spec: 12 L1D fill buffers per core bound the outstanding cache misses (Optimization
    # Reference Manual, Skylake client: "12 fill buffers"). A gather over PMEM with a random
    # row per lookup is latency bound by cores x fill buffers.
    misses_in_flight_per_core: int = 12
    # assumption: software gather-reduce/scatter loops (FBGEMM-style) reach half of the
    # memory-level parallelism and bandwidth the hardware allows (prefetch-unfriendly random
    # rows, bag bookkeeping, the cores also run the framework). 0.5 is a round middle value.
    software_efficiency: float = 0.5
    # The host's PMEM: the same per-channel media as the device (PMEM below), on the CPU's
    # own memory channels.


@dataclass(frozen=True)
class Link:
    """A point-to-point link: one-way latency plus bytes over bandwidth."""

    name: str
    bandwidth_gbps: float          # GB/s (1e9 B) per direction, after protocol overheads
    latency_ns: float              # one way, per transfer
    energy_pj_per_bit: float       # SerDes + PHY energy per bit moved


def serial_link_gbps(gts: float, lanes: int, payload_bytes: int, overhead_bytes: int) -> float:
    """GB/s per direction of a PCIe-PHY link (one efficiency model for PCIe and CXL): lanes x
    GT/s, 128b/130b encoding (PCIe 3.0 and later, CXL on the PCIe 5.0 PHY), then the payload's
    share of each packet (TLP or flit) on the wire. DLLP/flow-control traffic is left out for both."""
    return gts * lanes / 8 * 128 / 130 * payload_bytes / (payload_bytes + overhead_bytes)


# spec: CXL 2.0 x16 on the PCIe 5.0 PHY, 32 GT/s, 128b/130b; a data-only 68-byte flit carries 64
# bytes (2 bytes of protocol ID, 2 of CRC; docs/cxl-reference.md section 5): 59.3 GB/s.
# assumption: 250 ns one way device -> switch -> GPU (the reference reports 293 ns for an
# idle CXL memory access and says to keep latency a parameter).
# assumption: 5 pJ/bit for a 32 GT/s SerDes link (the order of published PCIe 5 / CXL PHYs).
CXL_X16 = Link("CXL 2.0 x16", serial_link_gbps(32, 16, 64, 4), 250.0, 5.0)
# spec: PCIe 5.0 x16, 32 GT/s, 128b/130b (PCI-SIG); a 256-byte memory-write TLP (the common
# Max_Payload_Size) carries 24 bytes of overhead: 4 of framing token with the sequence number,
# 16 of 4-DW header (64-bit address), 4 of LCRC: 57.6 GB/s, the same model as CXL above.
# assumption: 1 us one way through the root complex for a DMA / cudaMemcpy. 5 pJ/bit as above.
PCIE5_X16 = Link("PCIe 5.0 x16", serial_link_gbps(32, 16, 256, 24), 1000.0, 5.0)
# The links before issue 21 (Modelling.same_link_model False): CXL without the 128b/130b
# encoding (60.2 GB/s), and the i5-9600K's PCIe 3.0 x16 (8 GT/s, 15.75 GB/s raw, Intel ARK) at
# an assumed 12 GB/s achieved (76 %: TLP headers and DMA turnaround), not the same model.
CXL_X16_FLIT_ONLY = Link("CXL 2.0 x16 (flit efficiency only)", 64.0 * 64 / 68, 250.0, 5.0)
PCIE3_X16 = Link("PCIe 3.0 x16", 12.0, 1000.0, 5.0)


@dataclass(frozen=True)
class Software:
    """Costs the PCIe and PMEM configurations pay for software orchestration (assumptions)."""

    # assumption: one cudaMemcpy / DMA descriptor submission from the host: ~10 us of driver
    # and runtime work before data moves (commonly measured 5-15 us for small copies).
    copy_setup_us: float = 10.0
    # assumption: one synchronization (completion interrupt or cudaStreamSynchronize and the
    # wake-up of the waiting host thread): ~10 us.
    sync_us: float = 10.0
    # assumption: one GPU kernel-graph launch per batch (forward, backward and the dense step
    # captured in one CUDA graph): 20 us. Every configuration launches it (Modelling.launch_everywhere).
    launch_us: float = 20.0


@dataclass(frozen=True)
class Energy:
    """Per-event energies and powers (see each field)."""

    # spec: i5-9600K TDP 95 W (Intel ARK), charged while the host computes or copies.
    cpu_active_w: float = 95.0
    # assumption: 10 W package power while the host only waits or polls.
    cpu_idle_w: float = 10.0
    # spec: RTX 3090 total board power 350 W (NVIDIA), charged during the MLP time.
    gpu_active_w: float = 350.0
    # assumption: 30 W for an idle RTX 3090 holding its memory (commonly measured 20-30 W).
    gpu_idle_w: float = 30.0
    # spec: Intel Optane PMem 100 series, 15 W average power per module (Intel product brief,
    # 12-18 W configurable); one module per memory channel, charged for the whole batch.
    pmem_module_w: float = 15.0
    # assumption: PMEM media energy per 64-byte line: reads 3x and writes 7x a DDR4 line
    # (DDR4 ~20 pJ/bit incl. I/O = 10 nJ per line, an assumption; 3D XPoint costs more than DRAM
    # per bit, taken in the ratio of its read/write latencies in the paper's Table 2: 3x, 7x).
    # Before issue 21 these were 40 and 120 nJ (4x and 12x: not Table 2's ratios).
    pmem_read_nj_per_line: float = 30.0
    pmem_write_nj_per_line: float = 70.0
    # assumption: the CXL-MEM device's controller and NDP logic: 20 W while a command runs,
    # 5 W idle (an FPGA/ASIC of the Alveo U200 class running a 500 MHz design).
    device_active_w: float = 20.0
    device_idle_w: float = 5.0


@dataclass(frozen=True)
class Modelling:
    """The modelling choices an outside recomputation named (issue 21). True (the default) is
    the fair choice; False is the earlier one, kept so the report can show what each moved."""

    # The PMEM host's memory on as many PMEM channels (and modules) as the device has
    # (DEVICE_CHANNELS), not the i5-9600K's 2 (HostCpu.memory_channels).
    equal_channels: bool = True
    # PCIe and CXL on the same PHY generation with one efficiency model (PCIE5_X16, CXL_X16),
    # not PCIe 3.0 at an assumed 12 GB/s against CXL's flit efficiency alone.
    same_link_model: bool = True
    # Two-stage software copies (GPU -> host -> PMEM or device, device -> host -> GPU) stream
    # chunk by chunk: the slower stage bounds the copy, not the sum of both.
    pipelined_staging: bool = True
    # The host's embedding loops see its LLC (HostCpu.llc_bytes): when every table fits, the
    # lookup and the update miss nothing but the update's write-backs (made durable); when the
    # batch's distinct rows fit, repeats within the batch hit (lookup and update alike). False:
    # every lookup occurrence misses while the update's repeats hit.
    host_cache: bool = True
    # Every configuration pays the GPU's per-batch launch (Software.launch_us), not only PMEM and PCIe.
    launch_everywhere: bool = True
    # The GPU's batch includes the dense SGD step over the MLP parameters (read weights and
    # gradients, write weights: 12 bytes per parameter at the GPU's memory bandwidth), on the
    # GPU while the gradients go to the embedding update.
    dense_sgd: bool = True


# The device's PMEM channels and modules (hw/config.py, the default DeviceConfig).
DEVICE_CHANNELS = DeviceConfig().channels
# spec: NVIDIA GeForce RTX 3090, 936 GB/s GDDR6X.
RTX3090_MEMORY_GBPS = 936.2


@dataclass(frozen=True)
class SystemParams:
    host: HostCpu = field(default_factory=HostCpu)
    pmem: PmemTiming = PMEM
    cxl: Link = CXL_X16
    pcie: Link = PCIE5_X16
    software: Software = field(default_factory=Software)
    energy: Energy = field(default_factory=Energy)
    gpu_peak_flops: float = RTX3090_PEAK_FLOPS      # spec, sim/bfm/gpu_agent.py
    gpu_efficiency: float = DEFAULT_EFFICIENCY      # assumption, sim/bfm/gpu_agent.py
    gpu_memory_gbps: float = RTX3090_MEMORY_GBPS    # spec, above
    modelling: Modelling = field(default_factory=Modelling)

    @property
    def host_channels(self) -> int:
        """PMEM channels (and modules) of the PMEM configuration's host."""
        return DEVICE_CHANNELS if self.modelling.equal_channels else self.host.memory_channels

    @property
    def links(self) -> tuple[Link, Link]:
        """(PCIe, CXL) as the composition uses them."""
        return (self.pcie, self.cxl) if self.modelling.same_link_model else (PCIE3_X16, CXL_X16_FLIT_ONLY)


DEFAULT_PARAMS = SystemParams()
MODELLING_CHOICES = tuple(f.name for f in dataclasses.fields(Modelling))


def with_modelling(params: SystemParams = DEFAULT_PARAMS, **switches: bool) -> SystemParams:
    """``params`` with some Modelling switches changed (unknown names raise TypeError)."""
    return dataclasses.replace(params, modelling=dataclasses.replace(params.modelling, **switches))


def paper_choices(params: SystemParams = DEFAULT_PARAMS) -> SystemParams:
    """Every Modelling switch False: the composition as it was before issue 21."""
    return with_modelling(params, **dict.fromkeys(MODELLING_CHOICES, False))


def describe(params: SystemParams = DEFAULT_PARAMS) -> dict:
    """Every parameter as plain data (for the results JSON)."""
    return dataclasses.asdict(params)
