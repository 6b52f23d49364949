"""One memory channel: turns line requests into AXI4 single-beat transactions.

Ports
- ``req``    In  stream(mem_request_layout(local_addr_bits, ctx_bits)): channel-local lines.
- ``rd_rsp`` Out stream(mem_read_response_layout(ctx_bits))
- ``wr_rsp`` Out stream(mem_write_response_layout(ctx_bits))
- ``axi``    Out Axi4Signature(addr_width=local_addr_bits + 6, id_width=id_bits)

Behaviour
- Requests are taken in order from a small input FIFO. A read is issued on AR with a free
  ARID (up to ``read_ids`` outstanding; its ``ctx`` is kept in a table indexed by ARID, so R
  beats may return in any order). A write is issued on AW and W together (AWID 0, so B
  responses return in issue order; up to ``write_depth`` outstanding, their addresses and
  ``ctx`` kept in order).
- Read-after-write: a read whose line matches any outstanding write waits until that write's
  B response, so it returns the new data (the media may serve reads before earlier writes).
  Writes to a line are in order because they share AWID 0.
- After reset the free-ARID list is filled for ``read_ids`` cycles; reads wait for it.
- Latency through the block: the input FIFO adds 1 cycle; R->rd_rsp and B->wr_rsp are
  combinational (the ``ctx`` table has an asynchronous read port).
"""
from amaranth import Module, Signal, Array, Const, Cat, Mux
from amaranth.lib import stream, wiring, fifo, memory
from amaranth.lib.wiring import In, Out

from ..common.axi import Axi4Signature, AXI_BURST_INCR, AXI_RESP_OKAY
from .port import mem_request_layout, mem_read_response_layout, mem_write_response_layout

LINE_SIZE_LOG2 = 6       # AxSIZE for a 64-byte beat


class AxiChannelMaster(wiring.Component):
    def __init__(self, *, local_addr_bits, ctx_bits, read_ids=64, write_depth=32,
                 id_bits=8, input_depth=4):
        assert read_ids <= 2 ** id_bits
        self.local_addr_bits = local_addr_bits
        self.ctx_bits = ctx_bits
        self.read_ids = read_ids
        self.write_depth = write_depth
        self.input_depth = input_depth
        self.req_layout = mem_request_layout(local_addr_bits, ctx_bits)
        super().__init__({
            "req": In(stream.Signature(self.req_layout)),
            "rd_rsp": Out(stream.Signature(mem_read_response_layout(ctx_bits))),
            "wr_rsp": Out(stream.Signature(mem_write_response_layout(ctx_bits))),
            "axi": Out(Axi4Signature(addr_width=local_addr_bits + LINE_SIZE_LOG2,
                                     id_width=id_bits)),
        })

    def elaborate(self, platform):
        m = Module()
        axi = self.axi

        # --- input FIFO: registers the request so AXI valids never depend on upstream ready
        m.submodules.in_fifo = in_fifo = fifo.SyncFIFOBuffered(
            width=self.req_layout.size, depth=self.input_depth)
        m.d.comb += [
            in_fifo.w_data.eq(self.req.payload.as_value()),
            in_fifo.w_en.eq(self.req.valid),
            self.req.ready.eq(in_fifo.w_rdy),
        ]
        head = self.req_layout(in_fifo.r_data)

        # --- free ARID list, filled after reset
        m.submodules.free_ids = free_ids = fifo.SyncFIFO(
            width=len(axi.arid), depth=self.read_ids)
        init_count = Signal(range(self.read_ids + 1))
        initializing = Signal()
        m.d.comb += initializing.eq(init_count != self.read_ids)
        with m.If(initializing):
            m.d.sync += init_count.eq(init_count + 1)

        # --- read context table (indexed by ARID)
        m.submodules.ctx_table = ctx_table = memory.Memory(
            shape=self.ctx_bits, depth=self.read_ids, init=[])
        ctx_wr = ctx_table.write_port()
        ctx_rd = ctx_table.read_port(domain="comb")

        # --- outstanding writes, in issue order (circular buffer of registers for the
        # read-after-write address compare)
        wdepth = self.write_depth
        w_addr = Array(Signal(self.local_addr_bits, name=f"w_addr{i}") for i in range(wdepth))
        w_ctx = Array(Signal(self.ctx_bits, name=f"w_ctx{i}") for i in range(wdepth))
        w_live = Array(Signal(name=f"w_live{i}") for i in range(wdepth))
        w_head = Signal(range(wdepth))
        w_tail = Signal(range(wdepth))
        w_count = Signal(range(wdepth + 1))

        raw_hazard = Signal()
        m.d.comb += raw_hazard.eq(Cat(w_live[i] & (w_addr[i] == head.addr)
                                      for i in range(wdepth)).any())

        # --- issue: AR for reads, AW+W for writes
        aw_done = Signal()
        w_done = Signal()
        is_read = in_fifo.r_rdy & ~head.write
        is_write = in_fifo.r_rdy & head.write
        can_read = is_read & ~raw_hazard & free_ids.r_rdy & ~initializing
        can_write = is_write & (w_count != wdepth)

        m.d.comb += [
            axi.araddr.eq(Cat(Const(0, LINE_SIZE_LOG2), head.addr)),
            axi.arid.eq(free_ids.r_data),
            axi.arlen.eq(0), axi.arsize.eq(LINE_SIZE_LOG2), axi.arburst.eq(AXI_BURST_INCR),
            axi.arvalid.eq(can_read),
            axi.awaddr.eq(Cat(Const(0, LINE_SIZE_LOG2), head.addr)),
            axi.awid.eq(0),
            axi.awlen.eq(0), axi.awsize.eq(LINE_SIZE_LOG2), axi.awburst.eq(AXI_BURST_INCR),
            axi.awvalid.eq(can_write & ~aw_done),
            axi.wdata.eq(head.data), axi.wstrb.eq(head.strb), axi.wuser.eq(head.poison),
            axi.wlast.eq(1),
            axi.wvalid.eq(can_write & ~w_done),
        ]
        ar_fire = axi.arvalid & axi.arready
        aw_fire = axi.awvalid & axi.awready
        w_fire = axi.wvalid & axi.wready
        write_issued = can_write & (aw_done | aw_fire) & (w_done | w_fire)

        with m.If(write_issued):
            m.d.sync += [aw_done.eq(0), w_done.eq(0)]
        with m.Else():
            with m.If(aw_fire):
                m.d.sync += aw_done.eq(1)
            with m.If(w_fire):
                m.d.sync += w_done.eq(1)

        m.d.comb += [
            in_fifo.r_en.eq(ar_fire | write_issued),
            ctx_wr.addr.eq(free_ids.r_data),
            ctx_wr.data.eq(head.ctx),
            ctx_wr.en.eq(ar_fire),
        ]

        # --- R -> rd_rsp; the ARID goes back to the free list
        m.d.comb += [
            ctx_rd.addr.eq(axi.rid),
            self.rd_rsp.valid.eq(axi.rvalid),
            self.rd_rsp.payload.data.eq(axi.rdata),
            self.rd_rsp.payload.poison.eq(axi.ruser),
            self.rd_rsp.payload.error.eq(axi.rresp != AXI_RESP_OKAY),
            self.rd_rsp.payload.ctx.eq(ctx_rd.data),
            axi.rready.eq(self.rd_rsp.ready),
        ]
        r_fire = axi.rvalid & axi.rready
        with m.If(initializing):
            m.d.comb += [free_ids.w_data.eq(init_count), free_ids.w_en.eq(1)]
        with m.Else():
            m.d.comb += [free_ids.w_data.eq(axi.rid), free_ids.w_en.eq(r_fire)]
        m.d.comb += free_ids.r_en.eq(ar_fire)

        # --- B -> wr_rsp, in order
        m.d.comb += [
            self.wr_rsp.valid.eq(axi.bvalid),
            self.wr_rsp.payload.error.eq(axi.bresp != AXI_RESP_OKAY),
            self.wr_rsp.payload.ctx.eq(w_ctx[w_head]),
            axi.bready.eq(self.wr_rsp.ready),
        ]
        b_fire = axi.bvalid & axi.bready
        with m.If(write_issued):
            m.d.sync += [
                w_addr[w_tail].eq(head.addr),
                w_ctx[w_tail].eq(head.ctx),
                w_live[w_tail].eq(1),
                w_tail.eq(_wrap_inc(w_tail, wdepth)),
            ]
        with m.If(b_fire):
            m.d.sync += [
                w_live[w_head].eq(0),
                w_head.eq(_wrap_inc(w_head, wdepth)),
            ]
        m.d.sync += w_count.eq(w_count + write_issued - b_fire)
        return m


def _wrap_inc(value, depth):
    return Mux(value == depth - 1, 0, value + 1)
