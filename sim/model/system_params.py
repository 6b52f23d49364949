"""System parameters of the evaluation: the one documented file, with a source for every number.

Everything ``trainingcxl eval`` composes around the RTL's measured cycles comes from here:
the host CPU, the host's PMEM, the PCIe and CXL links, the GPU, the software costs of the
PCIe configuration and the energy model. Two figures that other files already own are
re-exported, not retyped: the PMEM media timing (``PMEM``: DDR4-3200 per channel scaled by
the paper's Table 2, sim/model/pmem_params.py) and the RTX 3090's FP32 peak and the MLP
efficiency (sim/bfm/gpu_agent.py). ``describe()`` returns every value, for the JSON.

Kinds of numbers (each field says which):
- **spec**: a vendor or standard figure (the document is named).
- **paper**: TrainingCXL (IEEE Micro 2023), docs/paper.md.
- **assumption**: a project choice with its reason, a parameter to sweep. None of them was
  tuned to reproduce a paper figure; they were fixed before the first evaluation run.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

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
    memory_channels: int = 2
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


# spec: CXL 2.0 x16 at 32 GT/s = 64 GB/s raw per direction; a data-only 68-byte flit carries
# 64 bytes (94 %): 60.2 GB/s (docs/cxl-reference.md section 5).
# assumption: 250 ns one way device -> switch -> GPU (the reference reports 293 ns for an
# idle CXL memory access and says to keep latency a parameter).
# assumption: 5 pJ/bit for a 32 GT/s SerDes link (the order of published PCIe 5 / CXL PHYs).
CXL_X16 = Link("CXL 2.0 x16", 64.0 * 64 / 68, 250.0, 5.0)
# spec: PCIe 3.0 x16 = 8 GT/s x 16 x 128/130 = 15.75 GB/s raw (PCI-SIG); the i5-9600K's
# lanes are PCIe 3.0 (Intel ARK). assumption: 12 GB/s achieved by large DMA / cudaMemcpy
# from pinned memory (TLP headers and DMA turnaround take ~20 %). 1 us one way through the
# root complex (assumption). 5 pJ/bit as above.
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
    # assumption: one GPU kernel-graph launch per batch (forward + backward): 20 us.
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
    # assumption: PMEM media energy per 64-byte line: reads 4x and writes 12x a DDR4 line
    # (DDR4 ~20 pJ/bit incl. I/O = 10 nJ per line; 3D XPoint reads/writes cost more than
    # DRAM per bit, in the ratio of its read/write latencies, Table 2 rounded).
    pmem_read_nj_per_line: float = 40.0
    pmem_write_nj_per_line: float = 120.0
    # assumption: the CXL-MEM device's controller and NDP logic: 20 W while a command runs,
    # 5 W idle (an FPGA/ASIC of the Alveo U200 class running a 500 MHz design).
    device_active_w: float = 20.0
    device_idle_w: float = 5.0


@dataclass(frozen=True)
class SystemParams:
    host: HostCpu = field(default_factory=HostCpu)
    pmem: PmemTiming = PMEM
    cxl: Link = CXL_X16
    pcie: Link = PCIE3_X16
    software: Software = field(default_factory=Software)
    energy: Energy = field(default_factory=Energy)
    gpu_peak_flops: float = RTX3090_PEAK_FLOPS      # spec, sim/bfm/gpu_agent.py
    gpu_efficiency: float = DEFAULT_EFFICIENCY      # assumption, sim/bfm/gpu_agent.py


DEFAULT_PARAMS = SystemParams()


def describe(params: SystemParams = DEFAULT_PARAMS) -> dict:
    """Every parameter as plain data (for the results JSON)."""
    return dataclasses.asdict(params)
