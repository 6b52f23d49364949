"""LookupUnit: one 16-lane FP32 reduce pipeline of the lookup engine, with its own memory port.

Ports
- ``items[c]``, c = 0..contexts-1: In streams of ``lookup_item_layout``
  (hw/ndp/lookup_feeder.py): the bag contexts, each in bag order. Rows of different contexts
  are interleaved (see below).
- ``mem``: Out(client_port_signature(addr_bits, rob_bits)): row reads (``ctx`` = reorder
  slot) and, when pooled vectors stay in device memory, their writes.
- ``push``: Out(cache_port_signature()): PUSH requests of pooled vectors to host memory
  (when ``out_to_host``); ``push.rsp`` is drained and counted.
- ``out_to_host`` (level, stable during a command); ``clear`` (pulse at command start)
  resets ``media_error`` / ``cache_error`` (sticky: a read came back with error or poison /
  a push was answered with an error).
- ``idle``: nothing queued, in flight or unacknowledged (writes are durable, pushes done).

Datapath. Each ROW item becomes dim/16 line reads issued in order, each into a reorder
slot (``rob_depth`` slots, enough to cover the media latency at this unit's share of the
bandwidth); the issue stage takes the contexts round robin, row by row, skipping a context
without work at a row's start. Lines retire in issue order, one per cycle, through an
operand stage (registers: the line, its weight; the accumulator is read and the forward
chosen there) into 16 Fp32Fma lanes (hw/common/fp32.py): acc[k] = acc[k] + row (SUM, MEAN)
or fma(w, row, acc[k]) (WEIGHTED_SUM), starting from +0.0, with ``k`` the line within the
row: the exact operation order of architecture.md §5, per bag and lane (accumulators are
per context and line). An EMPTY bag retires dim/16 lines of +0.0 + +0.0 (an ADD in every
mode: its item's weight is never used). A line whose chain predecessor retired less than L
cycles before waits (L = the FMA's latency, 5 with ``fp32_pipeline="compact"``, 12 with
"deep"; the predecessor's result is forwarded into the operand stage in the cycle it leaves
the FMA), so with rows of n = dim/16 lines and C = ``contexts`` a unit retires about
min(1, Cn/L) lines per cycle while all its contexts have bags (n/L with one); the feeder
spreads bags over the contexts of several units to fill the memory channels. The deep FMA
needs more contexts for the same rate (rm1's two-line rows: C = 2 gives 4/12, C = 8 all
of it).
The last line of each chain goes out: MEAN divides each lane by the bag length with one
Fp32DivInt (16 cycles per line; an empty bag stays +0.0), then the line is written to
device memory or pushed to the host. An ABORT item drops the bag in progress.
"""
from amaranth import Module, Signal, Mux, Const, Cat
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from ..common.cxl_mem import LINE_ADDR_BITS, LINE_BITS, LINE_BYTES
from ..common.fp32 import Fp32Fma, FmaOp, ONE
from ..common.fp32_div import Fp32DivInt
from ..cxl_controller.cache_port import cache_port_signature, CacheOp
from ..mem.arbiter import client_port_signature
from .command import PoolMode
from .lookup_feeder import ItemKind

LANES = LINE_BITS // 32
MAX_DIM_LINES = 16


class LookupUnit(wiring.Component):
    def __init__(self, *, addr_bits: int, item_layout, unit_id: int, rob_depth: int = 128,
                 out_depth: int | None = None, fp32_pipeline: str = "compact", contexts: int = 2):
        assert rob_depth & (rob_depth - 1) == 0
        assert contexts >= 2 and contexts & (contexts - 1) == 0, "contexts: a power of two, at least 2"
        self.contexts = contexts
        self.cbits = (contexts - 1).bit_length()
        self.addr_bits = addr_bits
        self.rob_depth = rob_depth
        self.ctx_bits = (rob_depth - 1).bit_length()
        self.fp32_pipeline = fp32_pipeline
        self.fma_latency = Fp32Fma.LATENCIES[fp32_pipeline]
        # Room for every chain result the FMA can hold (one last line per cycle) plus a few.
        self.out_depth = out_depth if out_depth is not None else max(8, self.fma_latency + 3)
        self.unit_id = unit_id
        super().__init__({
            "items": In(stream.Signature(item_layout)).array(contexts),
            "mem": Out(client_port_signature(addr_bits, self.ctx_bits)),
            "push": Out(cache_port_signature()),
            "out_to_host": In(1),
            "clear": In(1),
            "idle": Out(1),
            "media_error": Out(1),
            "cache_error": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        R, sb, C = self.rob_depth, self.ctx_bits, self.contexts
        # ``k``: the accumulator line, {context, line within the row}.
        kb = 4 + self.cbits
        meta_layout = data.StructLayout({
            "kind": ItemKind, "k": kb, "first": 1, "last": 1, "mode": 2, "length": 16,
            "weight": 32, "out_line": LINE_ADDR_BITS})
        tag_layout = data.StructLayout({
            "k": kb, "last": 1, "mode": 2, "length": 16, "out_line": LINE_ADDR_BITS})

        m.submodules.rob_meta = rob_meta = memory.Memory(shape=meta_layout, depth=R, init=[])
        m.submodules.rob_data = rob_data = memory.Memory(shape=LINE_BITS, depth=R, init=[])
        meta_w, meta_r = rob_meta.write_port(), rob_meta.read_port(domain="comb")
        data_w, data_r = rob_data.write_port(), rob_data.read_port(domain="comb")
        head = Signal(sb + 1)
        tail = Signal(sb + 1)
        ready = Signal(R)

        # ---- issue: items -> reorder slots (+ row reads) ---------------------------------
        # Context choice: stay on ``sel`` inside a row; at a row boundary take ``sel`` when it
        # has an item, else the next context round robin that has one (``sel`` moves on to the
        # context after the one that finished a row).
        sel = Signal(self.cbits)
        k = Signal(4)
        ctx_now = Signal(self.cbits)
        valid_of = Signal(C)
        m.d.comb += valid_of.eq(Cat(*(s.valid for s in self.items)))
        next_valid = Signal(self.cbits)
        with m.Switch(sel):              # a case per sel value: constant context numbers
            for r in range(C):
                with m.Case(r):
                    for off in reversed(range(C)):
                        with m.If(valid_of[(r + off) % C]):
                            m.d.comb += next_valid.eq((r + off) % C)
        m.d.comb += ctx_now.eq(Mux(k == 0, next_valid, sel))
        item = Signal.like(self.items[0].payload)
        items_valid = Signal()
        m.d.comb += [item.eq(self.items[0].payload), items_valid.eq(valid_of.bit_select(ctx_now, 1))]
        with m.Switch(ctx_now):
            for c in range(1, C):
                with m.Case(c):
                    m.d.comb += item.eq(self.items[c].payload)
        rob_full = Signal()
        m.d.comb += rob_full.eq((tail - head)[:sb + 1] == R)
        read_req = Signal()              # wants the memory request port for a row read
        write_req = Signal()             # the output stage wants it for a write (priority)
        alloc = Signal()
        instant = Signal()               # the slot needs no read (EMPTY, ABORT)
        req = self.mem.req
        m.d.comb += instant.eq(item.kind != ItemKind.ROW)
        m.d.comb += [
            read_req.eq(items_valid & ~rob_full & ~instant),
            alloc.eq(items_valid & ~rob_full & (instant | (~write_req & req.ready))),
            meta_w.addr.eq(tail[:sb]), meta_w.en.eq(alloc),
            meta_w.data.kind.eq(item.kind), meta_w.data.k.eq(Cat(k, ctx_now)),
            meta_w.data.first.eq(item.first | (item.kind == ItemKind.EMPTY)),
            meta_w.data.last.eq(item.last | (item.kind == ItemKind.EMPTY)),
            meta_w.data.mode.eq(item.mode), meta_w.data.length.eq(item.length),
            meta_w.data.weight.eq(item.weight),
        ]
        row_done = Signal()
        m.d.comb += row_done.eq((item.kind == ItemKind.ABORT) | (k + 1 == item.dim_lines))
        # A row's line k > 0 is read at (and written out to) the address after line k - 1's,
        # kept in registers: an adder after the context's item mux stood in front of the
        # memory port's request (16 LUT levels, the item buffer -> the port's skid buffer).
        # Inside a row the item does not change (the context stays until the row is done).
        row_line_next = Signal.like(item.row_line)
        out_line_next = Signal.like(item.out_line)
        row_line = Mux(k == 0, item.row_line, row_line_next)
        out_line = Mux(k == 0, item.out_line, out_line_next)
        m.d.comb += meta_w.data.out_line.eq(out_line)
        with m.If(alloc):
            m.d.sync += [tail.eq(tail + 1), row_line_next.eq(row_line + 1), out_line_next.eq(out_line + 1)]
            with m.If(row_done):
                m.d.sync += [k.eq(0), sel.eq(ctx_now + 1)]
                for c in range(C):
                    m.d.comb += self.items[c].ready.eq(ctx_now == c)
            with m.Else():              # inside a row: stay on its context
                m.d.sync += [k.eq(k + 1), sel.eq(ctx_now)]

        # ---- read responses fill slots -------------------------------------------------
        rsp = self.mem.rd_rsp
        m.d.comb += [rsp.ready.eq(1), data_w.addr.eq(rsp.payload.ctx), data_w.data.eq(rsp.payload.data),
                     data_w.en.eq(rsp.valid)]
        with m.If(rsp.valid & (rsp.payload.error | rsp.payload.poison)):
            m.d.sync += self.media_error.eq(1)
        fill_mask, instant_mask = Signal(R, name="fill_mask"), Signal(R, name="instant_mask")
        clr_mask = Signal(R)
        with m.If(rsp.valid):
            m.d.comb += fill_mask.eq(Const(1, R) << rsp.payload.ctx)
        with m.If(alloc & instant):
            m.d.comb += instant_mask.eq(Const(1, R) << tail[:sb])

        # ---- retire: head slot -> FMA lanes -------------------------------------------
        lanes = [Fp32Fma(tag_width=tag_layout.size if i == 0 else 1, pipeline=self.fp32_pipeline)
                 for i in range(LANES)]
        for i, lane in enumerate(lanes):
            m.submodules[f"fma{i}"] = lane
        o_valid = lanes[0].o_valid
        o_tag = Signal(tag_layout)
        o_line = Signal(LINE_BITS)
        m.d.comb += [o_tag.eq(lanes[0].o_tag), o_line.eq(Cat(*(lane.o_result for lane in lanes)))]

        m.submodules.acc = acc = memory.Memory(shape=LINE_BITS, depth=C * MAX_DIM_LINES, init=[])
        acc_w, acc_r = acc.write_port(), acc.read_port(domain="comb")
        m.d.comb += [acc_w.addr.eq(o_tag.k), acc_w.data.eq(o_line), acc_w.en.eq(o_valid)]

        meta = meta_r.data
        m.d.comb += [meta_r.addr.eq(head[:sb]), data_r.addr.eq(head[:sb])]
        # Lines retired 1..H cycles ago have no result yet (the operand stage, then L - 1 FMA
        # stages): a line of the same chain waits; one retired L cycles ago has its result
        # forwarded in the operand stage.
        H = self.fma_latency - 1
        hist_valid = Signal(H + 1)       # one more: the line retired L cycles ago (idle only)
        hist_k = [Signal(kb, name=f"hist_k{i}") for i in range(H)]
        hazard = Signal()
        m.d.comb += hazard.eq(~meta.first & Cat(*[hist_valid[i] & (hist_k[i] == meta.k) for i in range(H)]).any())

        # Output credit: results that will need a place in the output FIFO.
        m.submodules.out_fifo = out_fifo = fifo.SyncFIFOBuffered(
            width=LINE_BITS + tag_layout.size, depth=self.out_depth)
        lasts_in_flight = Signal(range(self.out_depth + 1))
        credit = Signal()
        m.d.comb += credit.eq(out_fifo.level + lasts_in_flight < self.out_depth)

        head_ready = Signal()
        m.d.comb += head_ready.eq(ready.bit_select(head[:sb], 1) & (head != tail))
        retire = Signal()
        to_fma = Signal()
        m.d.comb += [
            retire.eq(head_ready & ((meta.kind == ItemKind.ABORT) | (~hazard & (~meta.last | credit)))),
            to_fma.eq(retire & (meta.kind != ItemKind.ABORT)),
        ]
        with m.If(retire):
            m.d.sync += head.eq(head + 1)
            m.d.comb += clr_mask.eq(Const(1, R) << head[:sb])
        m.d.sync += ready.eq((ready & ~clr_mask) | fill_mask | instant_mask)
        m.d.sync += [hist_valid.eq(Cat(to_fma, hist_valid[:H])), hist_k[0].eq(meta.k)]
        m.d.sync += [hist_k[i].eq(hist_k[i - 1]) for i in range(1, H)]
        o_last = o_valid & o_tag.last
        m.d.sync += lasts_in_flight.eq(lasts_in_flight + (to_fma & meta.last) - o_last)

        # ---- operand stage: the retired line in registers, its accumulator read here ------
        # The retire decision (the head's reorder-buffer read, the chain hazard, the output
        # credit) and the operand muxes stood in one cycle in front of the FMA's first stage
        # (17 LUT levels in the device). A chain's lines still follow each other L cycles
        # apart: both the line and its predecessor's result arrive a cycle later.
        empty = meta.kind == ItemKind.EMPTY
        op_valid = Signal()
        op_k = Signal(kb)
        op_first = Signal()
        op_row = Signal(LINE_BITS)
        op_weight = Signal(32)
        op_weighted = Signal()
        op_tag = Signal(tag_layout)
        m.d.sync += op_valid.eq(to_fma)
        with m.If(to_fma):
            m.d.sync += [
                op_k.eq(meta.k), op_first.eq(meta.first), op_weight.eq(meta.weight),
                # An EMPTY bag is +0.0 + +0.0 in every mode: it has no weight of its own, and
                # fma(w, +0.0, +0.0) would be NaN for an infinite or NaN w.
                op_row.eq(Mux(empty, 0, data_r.data)),
                op_weighted.eq((meta.mode == PoolMode.WEIGHTED_SUM) & ~empty),
                op_tag.k.eq(meta.k), op_tag.last.eq(meta.last), op_tag.mode.eq(meta.mode),
                op_tag.length.eq(meta.length), op_tag.out_line.eq(meta.out_line),
            ]
        forward = Signal()
        m.d.comb += [acc_r.addr.eq(op_k), forward.eq(o_valid & (o_tag.k == op_k))]
        for i, lane in enumerate(lanes):
            row = op_row.word_select(i, 32)
            acc_in = Mux(op_first, 0, Mux(forward, o_line.word_select(i, 32), acc_r.data.word_select(i, 32)))
            m.d.comb += [
                lane.i_valid.eq(op_valid),
                lane.op.eq(Mux(op_weighted, FmaOp.FMA, FmaOp.ADD)),
                lane.a.eq(Mux(op_weighted, op_weight, row)),
                lane.b.eq(Mux(op_weighted, row, ONE)),
                lane.c.eq(acc_in),
            ]
        m.d.comb += lanes[0].i_tag.eq(op_tag)
        for lane in lanes[1:]:
            m.d.comb += lane.i_tag.eq(0)

        # ---- output: chain results -> (MEAN divide) -> write or push -------------------
        m.d.comb += [out_fifo.w_en.eq(o_last), out_fifo.w_data.eq(Cat(o_line, o_tag))]
        head_line = out_fifo.r_data[:LINE_BITS]
        head_tag = Signal(tag_layout)
        m.d.comb += head_tag.eq(out_fifo.r_data[LINE_BITS:])
        m.submodules.div = div = Fp32DivInt(tag_width=4, pipeline=self.fp32_pipeline)
        result = Signal(LINE_BITS)
        lane_in = Signal(5)              # lanes fed to the divider
        lane_out = Signal(5)             # lanes back from it
        divided = Signal()
        m.d.comb += [div.x.eq(head_line.word_select(lane_in[:4], 32)), div.l.eq(head_tag.length),
                     div.i_tag.eq(lane_in[:4])]
        needs_div = (head_tag.mode == PoolMode.MEAN) & (head_tag.length != 0)
        with m.If(out_fifo.r_rdy & needs_div & ~divided & (lane_in != LANES)):
            m.d.comb += div.i_valid.eq(1)
            m.d.sync += lane_in.eq(lane_in + 1)
        with m.If(div.o_valid):
            for i in range(LANES):
                with m.If(div.o_tag == i):
                    m.d.sync += result.word_select(i, 32).eq(div.o_result)
            m.d.sync += lane_out.eq(lane_out + 1)
            with m.If(lane_out == LANES - 1):
                m.d.sync += divided.eq(1)
        out_data = Mux(needs_div, result, head_line)
        send = Signal()
        m.d.comb += send.eq(out_fifo.r_rdy & (~needs_div | divided))

        writes_out = Signal(range(R + 1))
        pushes_out = Signal(range(R + 1))
        sent = Signal()
        with m.If(self.out_to_host):
            preq = self.push.req
            m.d.comb += [preq.valid.eq(send), preq.payload.op.eq(CacheOp.PUSH),
                         preq.payload.addr.eq(head_tag.out_line), preq.payload.id.eq(self.unit_id),
                         preq.payload.data.eq(out_data), sent.eq(send & preq.ready)]
        with m.Else():
            m.d.comb += [write_req.eq(send), sent.eq(send & req.ready)]
        m.d.comb += [
            req.valid.eq(write_req | read_req),
            req.payload.write.eq(write_req),
            req.payload.addr.eq(Mux(write_req, head_tag.out_line, row_line)),
            req.payload.strb.eq(Const((1 << LINE_BYTES) - 1, LINE_BYTES)),
            req.payload.data.eq(out_data),
            req.payload.ctx.eq(tail[:sb]),
            out_fifo.r_en.eq(sent),
        ]
        with m.If(sent):
            m.d.sync += [lane_in.eq(0), lane_out.eq(0), divided.eq(0)]
        wrsp, prsp = self.mem.wr_rsp, self.push.rsp
        m.d.comb += [wrsp.ready.eq(1), prsp.ready.eq(1)]
        m.d.sync += [
            writes_out.eq(writes_out + (sent & ~self.out_to_host) - wrsp.valid),
            pushes_out.eq(pushes_out + (sent & self.out_to_host) - prsp.valid),
        ]
        with m.If(wrsp.valid & wrsp.payload.error):
            m.d.sync += self.media_error.eq(1)
        with m.If(prsp.valid & prsp.payload.error):
            m.d.sync += self.cache_error.eq(1)
        with m.If(self.clear):
            m.d.sync += [self.media_error.eq(0), self.cache_error.eq(0)]

        # out_fifo.level, not r_rdy: a line written into the buffered FIFO spends a cycle in
        # its storage before r_rdy rises, and in that cycle the unit must not look idle (the
        # command would complete before its last pooled line is written or pushed).
        m.d.comb += self.idle.eq((valid_of == 0) & (head == tail) & ~op_valid & (hist_valid == 0) & ~o_valid &
                                 (out_fifo.level == 0) & (writes_out == 0) & (pushes_out == 0))
        return m
