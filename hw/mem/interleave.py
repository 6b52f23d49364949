"""Memory subsystem: one request stream spread over N AXI4 channels by line interleaving.

Ports
- ``req``    In  stream(mem_request_layout(addr_bits, ctx_bits)): device line addresses.
- ``rd_rsp`` Out stream(mem_read_response_layout(ctx_bits))
- ``wr_rsp`` Out stream(mem_write_response_layout(ctx_bits))
- ``pmem0`` ... ``pmem{N-1}``: Out Axi4Signature, one per channel (512-bit data).

Mapping: channel = line % N, channel-local line = line // N (N a power of two; see
``split_line_address`` in port.py). Requests are routed in order; a request waits (and holds
back the ones behind it) while its channel's input FIFO is full. Responses from the
channels are merged round-robin, so they return out of order across channels.

Outstanding: N * read_ids reads and N * write_depth writes (256 and 128 by default),
enough to cover the PMEM read latency at one line per cycle (see README, "Performance").
Ordering guarantees are those of hw/mem/port.py; they hold per channel, and a line lives on
exactly one channel.
"""
from amaranth import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..common.axi import Axi4Signature
from ..common.stream_util import RoundRobinArbiter
from .axi_master import AxiChannelMaster, LINE_SIZE_LOG2
from .port import mem_request_layout, mem_read_response_layout, mem_write_response_layout


class MemoryInterleaver(wiring.Component):
    def __init__(self, *, channels, addr_bits, ctx_bits, read_ids=64, write_depth=32,
                 id_bits=8):
        assert channels >= 1 and channels & (channels - 1) == 0, "channels: a power of two"
        self.channels = channels
        self.addr_bits = addr_bits
        self.ctx_bits = ctx_bits
        self.channel_bits = (channels - 1).bit_length()
        self.local_addr_bits = addr_bits - self.channel_bits
        self._kw = dict(local_addr_bits=self.local_addr_bits, ctx_bits=ctx_bits,
                        read_ids=read_ids, write_depth=write_depth, id_bits=id_bits)
        self.axi_signature = Axi4Signature(
            addr_width=self.local_addr_bits + LINE_SIZE_LOG2, id_width=id_bits)
        super().__init__({
            "req": In(stream.Signature(mem_request_layout(addr_bits, ctx_bits))),
            "rd_rsp": Out(stream.Signature(mem_read_response_layout(ctx_bits))),
            "wr_rsp": Out(stream.Signature(mem_write_response_layout(ctx_bits))),
            **{f"pmem{c}": Out(self.axi_signature) for c in range(channels)},
        })

    def elaborate(self, platform):
        m = Module()
        n = self.channels
        masters = []
        for c in range(n):
            mc = AxiChannelMaster(**self._kw)
            m.submodules[f"channel{c}"] = mc
            masters.append(mc)
            wiring.connect(m, mc.axi, wiring.flipped(getattr(self, f"pmem{c}")))

        channel = self.req.payload.addr[:self.channel_bits] if n > 1 else 0
        for c, mc in enumerate(masters):
            p = mc.req.payload
            m.d.comb += [
                p.write.eq(self.req.payload.write),
                p.addr.eq(self.req.payload.addr[self.channel_bits:]),
                p.strb.eq(self.req.payload.strb),
                p.poison.eq(self.req.payload.poison),
                p.data.eq(self.req.payload.data),
                p.ctx.eq(self.req.payload.ctx),
                mc.req.valid.eq(self.req.valid & (channel == c)),
            ]
            with m.If(channel == c):
                m.d.comb += self.req.ready.eq(mc.req.ready)

        m.submodules.rd_arb = rd_arb = RoundRobinArbiter(
            mem_read_response_layout(self.ctx_bits), n)
        m.submodules.wr_arb = wr_arb = RoundRobinArbiter(
            mem_write_response_layout(self.ctx_bits), n)
        for c, mc in enumerate(masters):
            wiring.connect(m, mc.rd_rsp, rd_arb.inputs[c])
            wiring.connect(m, mc.wr_rsp, wr_arb.inputs[c])
        wiring.connect(m, rd_arb.o, wiring.flipped(self.rd_rsp))
        wiring.connect(m, wr_arb.o, wiring.flipped(self.wr_rsp))
        return m
