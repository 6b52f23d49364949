"""TrainingCxlDevice: the CXL Type-2 memory device (the DUT; top module trainingcxl_device).

Ports (architecture.md §3; one clock domain ``sync``, active-high synchronous reset):
- ``m2s_req``, ``m2s_rwd``: In streams of M2SReq / M2SRwD (hw/common/cxl_mem.py).
- ``s2m_ndr``, ``s2m_drs``: Out streams of S2MNDR / S2MDRS.
- ``csr``: In AXI4-Lite (32-bit), the CXL.io MMIO BAR; map in hw/cxl_controller/csr_map.py.
- ``pmem0`` ... ``pmem{N-1}``: Out AXI4 (512-bit data, 8-bit IDs, poison in W/RUSER) to the
  persistent memory. A B response means the line is durable.
- ``irq``: level; STATUS & IRQ_ENABLE, cleared by writing STATUS.

Later blocks (CXL.cache agent, NDP engines, checkpoint engines) join the memory port through
an arbiter in front of the interleaver; the CXL.mem target is its only client today.
"""
from amaranth import Module, Cat
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .common.axi import AxiLiteSignature
from .common.cxl_mem import M2SReq, M2SRwD, S2MNDR, S2MDRS
from .config import DeviceConfig
from .cxl_controller.csr import CsrBlock
from .cxl_controller.cxl_mem import CxlMemTarget, CTX
from .mem.interleave import MemoryInterleaver

VERSION = (0, 1, 0)
CSR_ADDR_BITS = 12

# CXL.mem target event -> CSR counter input (names in hw/cxl_controller/csr_map.py)
EVENT_COUNTERS = {
    "oow_req": "err_out_of_window_rd_inc",
    "oow_rwd": "err_out_of_window_wr_inc",
    "unsupported_req": "err_unsupported_req_inc",
    "unsupported_rwd": "err_unsupported_rwd_inc",
    "unexpected_fwd": "err_unexpected_fwd_inc",
    "poison_wr": "err_poison_wr_inc",
    "poison_rd": "err_poison_rd_inc",
    "media_error": "err_media_inc",
    "rd_line": "stat_rd_lines_inc",
    "wr_line": "stat_wr_lines_inc",
    "spec_rd_dropped": "stat_spec_rd_dropped_inc",
    "inv": "stat_inv_inc",
}


class TrainingCxlDevice(wiring.Component):
    def __init__(self, config: DeviceConfig | None = None):
        self.config = config = config if config is not None else DeviceConfig()
        self._mem = MemoryInterleaver(
            channels=config.channels, addr_bits=config.addr_bits, ctx_bits=CTX.size,
            read_ids=config.read_ids_per_channel, write_depth=config.writes_per_channel)
        super().__init__({
            "m2s_req": In(stream.Signature(M2SReq)),
            "m2s_rwd": In(stream.Signature(M2SRwD)),
            "s2m_ndr": Out(stream.Signature(S2MNDR)),
            "s2m_drs": Out(stream.Signature(S2MDRS)),
            "csr": In(AxiLiteSignature(addr_width=CSR_ADDR_BITS)),
            **{f"pmem{c}": Out(self._mem.axi_signature) for c in range(config.channels)},
            "irq": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        m.submodules.mem = mem = self._mem
        m.submodules.cxl_mem = tgt = CxlMemTarget(
            addr_bits=cfg.addr_bits, capacity_lines=cfg.capacity_lines,
            input_depth=cfg.input_depth, output_depth=cfg.output_depth)
        m.submodules.csr = csr = CsrBlock()

        wiring.connect(m, wiring.flipped(self.m2s_req), tgt.m2s_req)
        wiring.connect(m, wiring.flipped(self.m2s_rwd), tgt.m2s_rwd)
        wiring.connect(m, tgt.s2m_ndr, wiring.flipped(self.s2m_ndr))
        wiring.connect(m, tgt.s2m_drs, wiring.flipped(self.s2m_drs))
        wiring.connect(m, tgt.mem_req, mem.req)
        wiring.connect(m, mem.rd_rsp, tgt.mem_rd_rsp)
        wiring.connect(m, mem.wr_rsp, tgt.mem_wr_rsp)
        for c in range(cfg.channels):
            wiring.connect(m, getattr(mem, f"pmem{c}"), wiring.flipped(getattr(self, f"pmem{c}")))
        wiring.connect(m, wiring.flipped(self.csr), csr.bus)

        # Identification and capabilities (read-only CSRs).
        m.d.comb += [
            csr.version_major.eq(VERSION[0]), csr.version_minor.eq(VERSION[1]),
            csr.version_patch.eq(VERSION[2]),
            csr.channels_count.eq(cfg.channels),
            csr.outstanding_reads.eq(cfg.max_outstanding_reads),
            csr.outstanding_writes.eq(cfg.max_outstanding_writes),
            csr.capacity_lo.eq(cfg.capacity_bytes & 0xFFFF_FFFF),
            csr.capacity_hi.eq(cfg.capacity_bytes >> 32),
            csr.clock_mhz.eq(cfg.clock_mhz),
        ]
        # HDM decoder window, in line units.
        m.d.comb += [
            tgt.hdm_base.eq(Cat(csr.hdm_base_lo_addr, csr.hdm_base_hi_addr)),
            tgt.hdm_size.eq(Cat(csr.hdm_size_lo_size, csr.hdm_size_hi_size)),
            tgt.hdm_enable.eq(csr.hdm_ctrl_enable),
        ]
        # Counters and status.
        ev = tgt.events
        for event, port in EVENT_COUNTERS.items():
            m.d.comb += getattr(csr, port).eq(getattr(ev, event))
        # STATUS.ERROR / STATUS.POISON are set by the counters themselves (csr_map "sets").
        m.d.comb += [
            csr.status_error_set.eq(0),
            csr.status_poison_set.eq(0),
            self.irq.eq(csr.irq),
        ]
        return m
