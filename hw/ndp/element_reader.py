"""ElementReader: streams the 32-bit elements of an array in device memory, in order.

Ports
- ``start`` (pulse) with ``base`` (line address of the array's element 0), ``first``
  (index of the first element to deliver) and ``count`` (elements to deliver; 0 = none).
- ``elems``: Out stream of 32-bit elements ``array[first] .. array[first+count-1]``.
- ``abort`` (pulse): stop issuing, drop what is buffered, and wait for reads in flight.
- ``busy``: a stream is running, or reads are still in flight after an abort. Start only
  when ``busy`` is 0.
- ``media_error``: sticky from ``start``: a line came back with its error or poison bit.
  Its elements are still delivered (the consumer decides).
- ``mem``: Out(client_port_signature(addr_bits, ctx_bits)), reads only; ``ctx`` = buffer slot.

Behaviour: element i lives in line ``base + i // 16``, bits ``32 * (i % 16)``. The reader
prefetches up to ``depth`` lines ahead (one read issued per cycle), so with a depth larger
than the media latency times the consumption rate in lines, the stream delivers one element
per cycle. Responses may return out of order; the buffer puts them back in order.
Elements leave through a register slice (one cycle, full rate; ``abort`` empties it), so
``elems.valid`` / ``payload`` and the reader's reaction to ``elems.ready`` start and end at
flip-flops: a consumer's logic does not add to the buffer's head and word logic (the undo
log's 15-LUT-level path ran from ``offsets.head`` through its consumer into the indices
reader).
The caller checks that every line read lies inside device memory.
"""
from amaranth import Module, Signal, Const, Mux
from amaranth.hdl import ResetInserter
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out

from ..common.cxl_mem import LINE_BITS
from ..common.stream_util import RegisterSlice
from ..mem.arbiter import client_port_signature

WORDS_PER_LINE = LINE_BITS // 32


class ElementReader(wiring.Component):
    def __init__(self, *, addr_bits: int, depth: int = 16):
        assert depth >= 2 and depth & (depth - 1) == 0, "depth: a power of two"
        self.depth = depth
        self.ctx_bits = (depth - 1).bit_length()
        self.addr_bits = addr_bits
        super().__init__({
            "start": In(1), "base": In(addr_bits), "first": In(32), "count": In(32),
            "abort": In(1),
            "busy": Out(1),
            "media_error": Out(1),
            "elems": Out(stream.Signature(32)),
            "mem": Out(client_port_signature(addr_bits, self.ctx_bits)),
        })

    def elaborate(self, platform):
        m = Module()
        depth, sb = self.depth, self.ctx_bits
        m.submodules.buf = buf = memory.Memory(shape=LINE_BITS, depth=depth, init=[])
        wr = buf.write_port()
        rd = buf.read_port(domain="comb")

        next_line = Signal(self.addr_bits)
        lines_left = Signal(33)          # lines still to issue
        elems_left = Signal(32)          # elements still to deliver
        word = Signal(range(WORDS_PER_LINE))
        head = Signal(sb)                # slot of the line being delivered
        tail = Signal(sb)                # slot the next read fills
        used = Signal(range(depth + 1))  # slots issued and not yet released
        ready = Signal(depth)            # slot holds its line
        inflight = Signal(range(depth + 1))
        draining = Signal()

        req = self.mem.req
        issue = Signal()
        m.d.comb += [
            req.valid.eq((lines_left != 0) & (used != depth) & ~draining),
            req.payload.write.eq(0),
            req.payload.addr.eq(next_line),
            req.payload.ctx.eq(tail),
            issue.eq(req.valid & req.ready),
            self.mem.rd_rsp.ready.eq(1),
            self.mem.wr_rsp.ready.eq(1),
        ]
        rsp = self.mem.rd_rsp
        got = Signal()
        m.d.comb += [
            got.eq(rsp.valid),
            wr.addr.eq(rsp.payload.ctx), wr.data.eq(rsp.payload.data), wr.en.eq(rsp.valid),
            rd.addr.eq(head),
        ]
        with m.If(rsp.valid & (rsp.payload.error | rsp.payload.poison)):
            m.d.sync += self.media_error.eq(1)

        # Delivery: the head line's current word.
        release = Signal()
        m.submodules.out_slice = out_slice = ResetInserter(self.abort)(RegisterSlice(32))
        wiring.connect(m, out_slice.o, wiring.flipped(self.elems))
        out = out_slice.i
        m.d.comb += [
            out.valid.eq(ready.bit_select(head, 1) & (elems_left != 0) & ~draining),
            out.payload.eq(rd.data.word_select(word, 32)),
        ]
        with m.If(out.valid & out.ready):
            m.d.sync += [elems_left.eq(elems_left - 1), word.eq(word + 1)]
            m.d.comb += release.eq((word == WORDS_PER_LINE - 1) | (elems_left == 1))

        set_mask = Signal(depth)
        clr_mask = Signal(depth)
        with m.If(got):
            m.d.comb += set_mask.eq(Const(1, depth) << rsp.payload.ctx)
        with m.If(release):
            m.d.comb += clr_mask.eq(Const(1, depth) << head)
            m.d.sync += head.eq(head + 1)
        m.d.sync += ready.eq((ready & ~clr_mask) | set_mask)
        with m.If(issue):
            m.d.sync += [next_line.eq(next_line + 1), lines_left.eq(lines_left - 1), tail.eq(tail + 1)]
        m.d.sync += [used.eq(used + issue - release), inflight.eq(inflight + issue - got)]

        with m.If(self.start):
            span = Signal(33)
            m.d.comb += span.eq(self.first[:4] + self.count + WORDS_PER_LINE - 1)
            m.d.sync += [
                next_line.eq(self.base + self.first[4:]),
                word.eq(self.first[:4]),
                elems_left.eq(self.count),
                lines_left.eq(Mux(self.count == 0, 0, span[4:])),
                self.media_error.eq(0),
            ]
        with m.If(self.abort):
            m.d.sync += [lines_left.eq(0), elems_left.eq(0), draining.eq(1)]
        with m.If(draining & (inflight == 0)):
            # Everything that was issued came back: forget the buffer.
            m.d.sync += [draining.eq(0), head.eq(0), tail.eq(0), used.eq(0), ready.eq(0)]
        m.d.comb += self.busy.eq(draining | (lines_left != 0) | (elems_left != 0) | (inflight != 0)
                                 | self.elems.valid)
        return m
