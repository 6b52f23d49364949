"""CsrBlock: the device's MMIO register file, an AXI4-Lite subordinate generated from the map.

The register map (offsets, fields, access kinds, reset values, port names) lives in
``hw/cxl_controller/csr_map.py``; this module only turns it into hardware. Nothing here
names a register except through the map (the ``irq`` pair is ``IRQ_STATUS_REG`` /
``IRQ_ENABLE_REG`` there).

Contract
- Clock domain ``sync`` (``clk``, ``rst``: active-high synchronous reset).
- Ports: ``bus`` = ``In(AxiLiteSignature(addr_width=addr_width, data_width=32))``
  (Verilog ``bus__awaddr`` ...; ``awprot``/``arprot`` are accepted and ignored), ``irq`` =
  ``Out(1)``, plus per field (``csr_map.ports()``): RO ``In(w)`` ``<base>``; RW ``Out(w)``
  ``<base>`` (a register, reset value from the map); RW1C ``In(w)`` ``<base>_set`` and
  ``Out(w)`` ``<base>``; COUNTER ``In(1)`` ``<base>_inc``; CONST no port. ``<base>`` is the
  lowercased register name for a whole-register field, else ``<reg>_<field>`` lowercased.
- Decode: a register is selected by address bits [addr_width-1:2]; bits [1:0] do not
  select (AXI narrow access: data sits on the word's byte lanes and WSTRB picks the
  bytes), unless ``strict_align=True``, which answers any address with bits [1:0] != 0
  with DECERR. Unmapped words: reads return 0 with RRESP=DECERR, writes have no effect and
  BRESP=DECERR. Everything mapped answers OKAY (writes to RO/CONST bits are ignored).
- Writes: RW bits update only in byte lanes whose WSTRB bit is set; RW1C bits clear where
  WDATA is 1 *and* the lane's strobe is set; a COUNTER clears on a write with any strobe
  set (a write with WSTRB=0 leaves it). Unimplemented bits read 0.
- Hardware events: a ``_set`` pulse sets its RW1C bit; set wins over a same-cycle
  software clear (no event is lost). A COUNTER field's ``sets`` (map) also sets those
  RW1C bits on every increment pulse, so the STATUS bits need no wiring in the top.
  ``_inc`` adds 1 per cycle it is high, saturating at 2**counter_width-1 (0xFFFFFFFF by
  default); clear and increment in the same cycle leave 1.
- ``irq`` (level) = OR over bits of (STATUS & IRQ_ENABLE), from registers (no
  combinational path from any input).
- Latency (cycle n = the cycle in which the handshake happens, i.e. VALID & READY high):
  read: AR in cycle n -> RVALID from cycle n+1; RDATA is the register value in cycle n.
  write: AW and W accepted in any order (or together), each held in a one-entry buffer;
  once both are held the write takes effect and BVALID rises at the same clock edge, so
  if the later of AW/W is accepted in cycle n, BVALID (and the new register/port value)
  appear from cycle n+2. One transaction per direction in flight: ARREADY is low while
  RVALID is high; AWREADY/WREADY are low while their buffer is full, and a buffered pair
  waits for an outstanding B to be accepted (BREADY) before it commits.
- Ordering: the read and write channels are independent; a read sees every write whose
  B response was issued before the AR handshake (so software waits for B, as AXI says).
- AMBA rules: VALID outputs (BVALID, RVALID) are registers and never depend on READY
  inputs; READY outputs depend only on internal state; BVALID/RVALID and their payloads
  hold until accepted.
"""
from __future__ import annotations

from amaranth.hdl import C, Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.common.axi import AXI_RESP_DECERR, AXI_RESP_OKAY, AxiLiteSignature
from hw.cxl_controller import csr_map
from hw.cxl_controller.csr_map import Access

__all__ = ["CsrBlock"]


class CsrBlock(wiring.Component):
    """AXI4-Lite register file for the CSR map (see the module docstring for the contract).

    Parameters
    - ``registers``: the map (default ``csr_map.REGISTERS``).
    - ``addr_width``: AXI address width (default 12: the 4 KiB BAR).
    - ``counter_width``: COUNTER storage width, 1..32 (default 32); a smaller value only
      makes saturation testable quickly (read value zero-extended to 32 bits).
    - ``strict_align``: answer addresses with bits [1:0] != 0 with DECERR (default False).
    """

    def __init__(self, registers=None, *, addr_width: int = csr_map.ADDR_WIDTH,
                 counter_width: int = 32, strict_align: bool = False):
        regs = tuple(csr_map.REGISTERS if registers is None else registers)
        csr_map.check_map(regs, addr_width=addr_width)
        if not 1 <= counter_width <= csr_map.DATA_WIDTH:
            raise ValueError(f"counter_width must be 1..{csr_map.DATA_WIDTH}")
        if addr_width < 3:
            raise ValueError("addr_width must be at least 3")
        self.registers = regs
        self.addr_width = addr_width
        self.counter_width = counter_width
        self.strict_align = strict_align
        self._ports = csr_map.ports(regs)
        members = {"bus": In(AxiLiteSignature(addr_width=addr_width, data_width=csr_map.DATA_WIDTH))}
        for p in self._ports:
            members[p.name] = (In if p.direction == "in" else Out)(p.width)
        members["irq"] = Out(1)
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        regs = self.registers
        dw = csr_map.DATA_WIDTH
        lanes = dw // 8

        # ---------------- write channel: AW and W one-entry buffers, then B ----------------
        aw_full = Signal()
        aw_addr = Signal(self.addr_width)
        w_full = Signal()
        w_data = Signal(dw)
        w_strb = Signal(lanes)
        b_valid = Signal()
        b_resp = Signal(2)
        wr_fire = Signal()                     # the buffered write takes effect this cycle
        wr_hit_any = Signal()
        w_mask = Signal(dw)                    # WSTRB expanded to bits
        m.d.comb += [
            bus.awready.eq(~aw_full),
            bus.wready.eq(~w_full),
            bus.bvalid.eq(b_valid),
            bus.bresp.eq(b_resp),
            wr_fire.eq(aw_full & w_full & (~b_valid | bus.bready)),
            w_mask.eq(Cat(w_strb[i].replicate(8) for i in range(lanes))),
        ]
        with m.If(bus.awvalid & ~aw_full):
            m.d.sync += [aw_full.eq(1), aw_addr.eq(bus.awaddr)]
        with m.If(bus.wvalid & ~w_full):
            m.d.sync += [w_full.eq(1), w_data.eq(bus.wdata), w_strb.eq(bus.wstrb)]
        with m.If(b_valid & bus.bready):
            m.d.sync += b_valid.eq(0)
        with m.If(wr_fire):                    # after the clear above: a new B wins
            m.d.sync += [aw_full.eq(0), w_full.eq(0), b_valid.eq(1),
                         b_resp.eq(Mux(wr_hit_any, AXI_RESP_OKAY, AXI_RESP_DECERR))]

        # ---------------- read channel ----------------
        r_valid = Signal()
        r_data = Signal(dw)
        r_resp = Signal(2)
        rd_value = Signal(dw)
        rd_hit_any = Signal()
        m.d.comb += [
            bus.arready.eq(~r_valid),
            bus.rvalid.eq(r_valid),
            bus.rdata.eq(r_data),
            bus.rresp.eq(r_resp),
        ]
        with m.If(r_valid & bus.rready):
            m.d.sync += r_valid.eq(0)
        with m.If(bus.arvalid & ~r_valid):
            m.d.sync += [r_valid.eq(1), r_data.eq(rd_value),
                         r_resp.eq(Mux(rd_hit_any, AXI_RESP_OKAY, AXI_RESP_DECERR))]

        # ---------------- decode ----------------
        def hit(addr, reg, name):
            s = Signal(name=name)
            cond = addr[2:] == reg.offset >> 2
            if self.strict_align:
                cond = cond & (addr[:2] == 0)
            m.d.comb += s.eq(cond)
            return s

        wr_hits, rd_hits = {}, {}
        for r in regs:
            wr_hits[r.name] = hit(aw_addr, r, f"wr_hit_{r.name.lower()}")
            rd_hits[r.name] = hit(bus.araddr, r, f"rd_hit_{r.name.lower()}")
        m.d.comb += [
            wr_hit_any.eq(_any(wr_hits.values())),
            rd_hit_any.eq(_any(rd_hits.values())),
        ]

        # ---------------- hardware events that set RW1C bits (map "sets") ----------------
        extra_sets = {}                        # (reg, field) -> [1-bit signals]
        for r in regs:
            for f in r.fields:
                for ref in f.sets:
                    tr, tf = csr_map.resolve_field_ref(regs, ref)
                    port = getattr(self, r.port_base(f) + "_inc")
                    extra_sets.setdefault((tr.name, tf.name), []).append(port)

        # ---------------- storage and read values ----------------
        values = {}
        sat = (1 << self.counter_width) - 1
        for r in regs:
            val = Signal(dw, name=f"{r.name.lower()}_value")
            values[r.name] = val
            we = Signal(name=f"{r.name.lower()}_we")
            m.d.comb += we.eq(wr_fire & wr_hits[r.name])
            for f in r.fields:
                base = r.port_base(f)
                sl = slice(f.lsb, f.lsb + f.width)
                if f.access is Access.CONST:
                    m.d.comb += val[sl].eq(Const(f.reset, f.width))
                elif f.access is Access.RO:
                    m.d.comb += val[sl].eq(getattr(self, base))
                elif f.access is Access.RW:
                    q = Signal(f.width, init=f.reset, name=f"{base}_q")
                    with m.If(we):
                        m.d.sync += q.eq((q & ~w_mask[sl]) | (w_data[sl] & w_mask[sl]))
                    m.d.comb += [val[sl].eq(q), getattr(self, base).eq(q)]
                elif f.access is Access.RW1C:
                    q = Signal(f.width, init=f.reset, name=f"{base}_q")
                    set_ = Signal(f.width, name=f"{base}_setall")
                    clr = Signal(f.width, name=f"{base}_clr")
                    src = getattr(self, base + "_set")
                    for s in extra_sets.get((r.name, f.name), []):
                        src = src | s
                    m.d.comb += [
                        set_.eq(src),
                        clr.eq(Mux(we, w_data[sl] & w_mask[sl], 0)),
                    ]
                    m.d.sync += q.eq((q & ~clr) | set_)
                    m.d.comb += [val[sl].eq(q), getattr(self, base).eq(q)]
                elif f.access is Access.COUNTER:
                    q = Signal(self.counter_width, name=f"{base}_q")
                    inc = getattr(self, base + "_inc")
                    with m.If(we & w_strb.any()):
                        m.d.sync += q.eq(inc)
                    with m.Elif(inc & (q != sat)):
                        m.d.sync += q.eq(q + 1)
                    m.d.comb += val[sl].eq(q)
                else:                          # pragma: no cover
                    raise AssertionError(f.access)

        m.d.comb += rd_value.eq(_any(Mux(rd_hits[r.name], values[r.name], 0) for r in regs))

        # ---------------- interrupt ----------------
        names = {r.name for r in regs}
        if csr_map.IRQ_STATUS_REG in names:
            m.d.comb += self.irq.eq((values[csr_map.IRQ_STATUS_REG]
                                     & values[csr_map.IRQ_ENABLE_REG]).any())
        return m


def _any(items):
    out = C(0, 1)
    for it in items:
        out = out | it
    return out
