"""LineReader: streams whole 64-byte lines of device memory, in address order.

Ports
- ``start`` (pulse) with ``base`` (first line address) and ``count`` (lines; 0 = none).
  Start only when ``busy`` is 0; ``base`` / ``count`` are sampled in the ``start`` cycle.
- ``lines``: Out(stream.Signature(LineBeat)): lines ``base .. base+count-1`` in order, each
  with ``error`` = the response's error or poison bit (the line is delivered anyway; the
  consumer decides).
- ``abort`` (pulse): stop issuing, drop what is buffered, and wait for the reads in flight.
- ``busy``: a stream is running (lines still to issue or deliver), or reads are in flight.
- ``mem``: Out(client_port_signature(addr_bits, ctx_bits)), reads only (``write`` = 0);
  ``ctx`` = reorder-buffer slot, ``ctx_bits`` = log2(depth). ``wr_rsp`` is never expected.

Behaviour: up to ``depth`` reads are outstanding (one issued per cycle); responses may come
back in any order and a ``depth``-line reorder buffer puts them back in order. A slot is
reused only after its line was delivered, so with ``depth`` larger than the read latency
the stream delivers one line per cycle. Lines leave through a register slice (one cycle,
full rate): ``lines.valid``, ``lines.payload`` and the reader's reaction to ``lines.ready``
start and end at flip-flops, so a consumer's logic does not add to the reorder buffer's
(the recovery engine's 16-LUT-level path ran from ``head`` through it). ``abort`` empties
the slice too. The caller checks that every line lies inside device memory. Like
hw/ndp/element_reader.py, but whole lines and no element unpacking.

``side = (width, f)`` (optional) adds a field ``side`` to each beat: ``f(line)``, a
combinational function of the line's data computed before the output slice (same cycle,
same beat), so that a consumer's first logic stage on the line ends at a flip-flop (the
recovery engine: the data part of its CRC, a 512-input xor per bit). Without it the beat is
``LineBeat``.
"""
from amaranth import Module, Signal, Const
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from amaranth.hdl import ResetInserter

from ..common.cxl_mem import LINE_BITS
from ..common.stream_util import RegisterSlice
from .arbiter import client_port_signature


class LineBeat(data.Struct):
    data: LINE_BITS
    error: 1                     # the media answered error or poison for this line


class LineReader(wiring.Component):
    def __init__(self, *, addr_bits: int, depth: int = 16, side=None):
        assert depth >= 2 and depth & (depth - 1) == 0, "depth: a power of two"
        self.depth = depth
        self.addr_bits = addr_bits
        self.ctx_bits = (depth - 1).bit_length()
        self.side = side
        self.beat = LineBeat if side is None else data.StructLayout({"data": LINE_BITS, "error": 1, "side": side[0]})
        super().__init__({
            "start": In(1), "base": In(addr_bits), "count": In(32),
            "abort": In(1),
            "busy": Out(1),
            "lines": Out(stream.Signature(self.beat)),
            "mem": Out(client_port_signature(addr_bits, self.ctx_bits)),
        })

    def elaborate(self, platform):
        m = Module()
        depth, sb = self.depth, self.ctx_bits
        m.submodules.buf = buf = memory.Memory(shape=LINE_BITS + 1, depth=depth, init=[])
        wr = buf.write_port()
        rd = buf.read_port(domain="comb")

        next_line = Signal(self.addr_bits)
        to_issue = Signal(32)            # lines still to request
        to_deliver = Signal(32)          # lines still to deliver
        head = Signal(sb)                # slot of the next line to deliver
        tail = Signal(sb)                # slot the next read fills
        used = Signal(range(depth + 1))  # slots issued and not yet delivered
        filled = Signal(depth)           # slot holds its line
        inflight = Signal(range(depth + 1))
        draining = Signal()

        req = self.mem.req
        rsp = self.mem.rd_rsp
        issue = Signal()
        got = Signal()
        m.d.comb += [
            req.valid.eq((to_issue != 0) & (used != depth) & ~draining),
            req.payload.write.eq(0),
            req.payload.addr.eq(next_line),
            req.payload.ctx.eq(tail),
            issue.eq(req.valid & req.ready),
            rsp.ready.eq(1),
            self.mem.wr_rsp.ready.eq(1),
            got.eq(rsp.valid),
            wr.addr.eq(rsp.payload.ctx),
            wr.data.eq(rsp.payload.data | ((rsp.payload.error | rsp.payload.poison) << LINE_BITS)),
            wr.en.eq(rsp.valid),
            rd.addr.eq(head),
        ]

        m.submodules.out_slice = out_slice = ResetInserter(self.abort)(RegisterSlice(self.beat))
        wiring.connect(m, out_slice.o, wiring.flipped(self.lines))
        out = out_slice.i
        deliver = Signal()
        m.d.comb += [
            out.valid.eq(filled.bit_select(head, 1) & (to_deliver != 0) & ~draining),
            out.payload.data.eq(rd.data[:LINE_BITS]),
            out.payload.error.eq(rd.data[LINE_BITS]),
            deliver.eq(out.valid & out.ready),
        ]
        if self.side is not None:
            m.d.comb += out.payload.side.eq(self.side[1](rd.data[:LINE_BITS]))

        set_mask = Signal(depth)
        clr_mask = Signal(depth)
        with m.If(got):
            m.d.comb += set_mask.eq(Const(1, depth) << rsp.payload.ctx)
        with m.If(deliver):
            m.d.comb += clr_mask.eq(Const(1, depth) << head)
            m.d.sync += [head.eq(head + 1), to_deliver.eq(to_deliver - 1)]
        m.d.sync += filled.eq((filled & ~clr_mask) | set_mask)
        with m.If(issue):
            m.d.sync += [next_line.eq(next_line + 1), to_issue.eq(to_issue - 1), tail.eq(tail + 1)]
        m.d.sync += [used.eq(used + issue - deliver), inflight.eq(inflight + issue - got)]

        with m.If(self.start):
            m.d.sync += [next_line.eq(self.base), to_issue.eq(self.count), to_deliver.eq(self.count)]
        with m.If(self.abort):
            m.d.sync += [to_issue.eq(0), to_deliver.eq(0), draining.eq(1)]
        with m.If(draining & (inflight == 0)):
            # Everything that was issued came back: forget the buffer.
            m.d.sync += [draining.eq(0), head.eq(0), tail.eq(0), used.eq(0), filled.eq(0)]
        m.d.comb += self.busy.eq(draining | (to_issue != 0) | (to_deliver != 0) | (inflight != 0)
                                 | self.lines.valid)
        return m
