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
- Read-after-write, with forwarding: the data of every outstanding write is kept (a
  ``write_depth`` x 513-bit RAM, ``w_data``). A read whose line's youngest outstanding
  write wrote all 64 bytes is answered from that copy (data and poison, OKAY) in the cycle
  after it leaves the input FIFO, without going to the media. A read whose line's youngest
  outstanding write was partial (strobes not all set) waits until no write to its line is
  outstanding, so it returns the merged line from the media. Why forward: that wait held
  the channel's in-order queue, and with it every port's stream (hw/mem/interleave.py),
  for up to a write's latency; UPDATE re-reading a row it has just written back lost 15 %
  of rm1's batch that way. Forwarded data may not be durable yet, as any data a read
  returns right after a write (the failure model's durability is the write's B response).
  Writes to a line are in order because they share AWID 0.
- After reset the free-ARID list is filled for ``read_ids`` cycles; reads wait for it.
- Latency through the block: the input FIFO adds 1 cycle; R->rd_rsp and B->wr_rsp are
  combinational (the ``ctx`` table has an asynchronous read port; the head write's ``ctx``
  is kept in a register). A forwarded response
  takes ``rd_rsp`` ahead of R (R waits that cycle); one is pending at a time.
- Memories: ``ctx_table`` (read_ids x ctx, LUT RAM) and ``w_data`` (write_depth x 513,
  synchronous read: block RAM or LUT RAM); the outstanding writes' addresses are flip-flops
  (the compare needs them all at once).
"""
from amaranth import Module, Signal, Array, Const, Cat, Mux
from amaranth.lib import stream, wiring, fifo, memory
from amaranth.lib.wiring import In, Out

from ..common.axi import Axi4Signature, AXI_BURST_INCR, AXI_RESP_OKAY
from ..common.onehot import one_hot_index
from ..common.ram import BypassRam
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
        # w_fwd[i]: entry i is its line's youngest outstanding write and wrote every byte
        w_fwd = Array(Signal(name=f"w_fwd{i}") for i in range(wdepth))
        w_head = Signal(range(wdepth))
        w_tail = Signal(range(wdepth))
        w_count = Signal(range(wdepth + 1))
        full_strb = Signal()
        m.d.comb += full_strb.eq(head.strb == (1 << len(head.strb)) - 1)

        # the outstanding writes' data (and poison), for forwarding
        m.submodules.w_data = w_data = BypassRam(shape=len(head.data) + 1, depth=wdepth, name="w_data")
        w_data_wr = w_data.write_port()
        w_data_rd = w_data.read_port()

        match = Signal(wdepth)
        fwd_match = Signal(wdepth)
        m.d.comb += [match.eq(Cat(w_live[i] & (w_addr[i] == head.addr) for i in range(wdepth))),
                     fwd_match.eq(Cat(match[i] & w_fwd[i] for i in range(wdepth)))]
        raw_hazard = Signal()
        forwardable = Signal()                   # at most one bit of fwd_match is set
        fwd_index = Signal(range(wdepth))
        m.d.comb += [raw_hazard.eq(match.any()), forwardable.eq(fwd_match.any()),
                     fwd_index.eq(one_hot_index(fwd_match))]

        # --- issue: AR for reads, AW+W for writes
        aw_done = Signal()
        w_done = Signal()
        is_read = in_fifo.r_rdy & ~head.write
        is_write = in_fifo.r_rdy & head.write
        can_read = is_read & ~raw_hazard & free_ids.r_rdy & ~initializing
        can_write = is_write & (w_count != wdepth)

        # a forwarded read: taken from the FIFO when no forwarded response is pending or the
        # pending one leaves this cycle; its response is valid from the next cycle
        fwd_valid = Signal()
        fwd_ctx = Signal(self.ctx_bits)
        fwd_done = Signal()
        forward = Signal()
        m.d.comb += [fwd_done.eq(fwd_valid & self.rd_rsp.ready),
                     forward.eq(is_read & forwardable & (~fwd_valid | fwd_done))]
        with m.If(forward):
            m.d.sync += [fwd_valid.eq(1), fwd_ctx.eq(head.ctx)]
        with m.Elif(fwd_done):
            m.d.sync += fwd_valid.eq(0)
        m.d.comb += [w_data_rd.addr.eq(fwd_index), w_data_rd.en.eq(forward)]

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
            in_fifo.r_en.eq(ar_fire | write_issued | forward),
            ctx_wr.addr.eq(free_ids.r_data),
            ctx_wr.data.eq(head.ctx),
            ctx_wr.en.eq(ar_fire),
        ]

        # --- R (or a forwarded read) -> rd_rsp; the ARID goes back to the free list
        m.d.comb += ctx_rd.addr.eq(axi.rid)
        with m.If(fwd_valid):
            m.d.comb += [
                self.rd_rsp.valid.eq(1),
                self.rd_rsp.payload.data.eq(w_data_rd.data[:-1]),
                self.rd_rsp.payload.poison.eq(w_data_rd.data[-1]),
                self.rd_rsp.payload.ctx.eq(fwd_ctx),
            ]
        with m.Else():
            m.d.comb += [
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

        # --- B -> wr_rsp, in order. The head write's ctx is a register of its own, so the
        # response's owner (the port bits of ctx, which the interleaver's per-port merges
        # decode into their grants and every channel's ``bready``) starts at a flip-flop,
        # not behind a ``write_depth``-way read of ``w_ctx`` (13 LUT levels from ``w_head``
        # to another channel's ``bready`` in the eighth round's device run). Its next value
        # is picked by ``b_fire`` between two reads that do not depend on it.
        head_ctx = Signal(self.ctx_bits)
        m.d.comb += [
            self.wr_rsp.valid.eq(axi.bvalid),
            self.wr_rsp.payload.error.eq(axi.bresp != AXI_RESP_OKAY),
            self.wr_rsp.payload.ctx.eq(head_ctx),
            axi.bready.eq(self.wr_rsp.ready),
        ]
        b_fire = axi.bvalid & axi.bready
        next_head = _wrap_inc(w_head, wdepth)
        # A write issued now becomes the head when the queue is empty (stay) or when the
        # head's B leaves now with nothing behind it (advance). A B never arrives in its
        # write's issue cycle, so the register is right by the time it is used.
        ctx_stay = Mux(write_issued & (w_tail == w_head), head.ctx, head_ctx)
        ctx_advance = Mux(write_issued & (w_tail == next_head), head.ctx, w_ctx[next_head])
        m.d.sync += head_ctx.eq(Mux(b_fire, ctx_advance, ctx_stay))
        m.d.comb += [w_data_wr.addr.eq(w_tail), w_data_wr.data.eq(Cat(head.data, head.poison)),
                     w_data_wr.en.eq(write_issued)]
        with m.If(write_issued):
            m.d.sync += [
                w_addr[w_tail].eq(head.addr),
                w_ctx[w_tail].eq(head.ctx),
                w_live[w_tail].eq(1),
                w_tail.eq(_wrap_inc(w_tail, wdepth)),
            ]
            # the new write is its line's youngest: older entries of the line stop forwarding
            for i in range(wdepth):
                with m.If(match[i]):
                    m.d.sync += w_fwd[i].eq(0)
            m.d.sync += w_fwd[w_tail].eq(full_strb)
        with m.If(b_fire):
            m.d.sync += [
                w_live[w_head].eq(0),
                w_fwd[w_head].eq(0),
                w_head.eq(next_head),
            ]
        m.d.sync += w_count.eq(w_count + write_issued - b_fire)
        return m


def _wrap_inc(value, depth):
    return Mux(value == depth - 1, 0, value + 1)
