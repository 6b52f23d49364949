"""Memory subsystem: P client ports spread over N AXI4 channels by line interleaving.

Ports
- ``clients[i]``, i = 0..P-1 (``ports`` = P): In(client_port_signature(addr_bits, ctx_bits))
  (hw/mem/arbiter.py): the client sends ``req`` (device line addresses) and receives its own
  ``rd_rsp`` / ``wr_rsp`` with its ``ctx`` unchanged (hw/mem/port.py layouts).
- ``pmem0`` ... ``pmem{N-1}``: Out Axi4Signature, one per channel (512-bit data).

Mapping: channel = line % N, channel-local line = line // N (N a power of two; see
``split_line_address`` in port.py).

Requests: every port's ``req`` enters a RegisterSlice (hw/common/stream_util.py: 1 cycle,
its ``ready`` and its output's ``valid`` and payload flip-flops). So no ready chain runs from
the channels back into the clients, and no valid chain runs from one client's request logic
through the channels' arbiters into another port's grant (with a 0-cycle skid buffer here,
that was the device's deepest path: a lookup unit's issue logic -> each channel's round robin
-> another port's buffer, 21 LUT levels). Each channel has a round-robin arbiter over the P
ports whose head request (the slice's output) targets it; a request leaves its port's slice
in the cycle it is granted, and the channel's input FIFO adds 1 cycle. A port's head waits
(and holds back the requests behind it) while its channel is busy or grants another port;
the other ports keep flowing to other channels. So up to min(P, N) requests are granted per
cycle, one per channel; the media behind 4 channels deliver about 1.9 lines per cycle, which
one port (1 line per cycle) cannot use.

Responses: the port index rides above the client's bits in the ``ctx`` the channels carry
and routes each response back to its port. Per port, read and write responses are each
merged round-robin over the channels and leave through a RegisterSlice (1 cycle; valid and
ready are flip-flops, so no chain runs from the AXI response channels into the clients), so
every port can receive one read and one write response per cycle; a response waits while its
port is not ready. Responses return out of order across channels and lines.

Outstanding: N * read_ids reads and N * write_depth writes (256 and 128 by default), shared
by all ports, enough to cover the PMEM read latency at one line per cycle per channel (see
README, "Performance").

Ordering: the guarantees of hw/mem/port.py hold per channel, and a line lives on exactly one
channel. Across ports, "accepted" means the order in which the channel's arbiter granted the
requests, which a client does not see (its handshake is with its port's register slice): a
client that needs another port's write seen waits for that write's response. Within a port,
requests to one line reach their channel in program order.

Latency: an idle request reaches its channel's input FIFO 1 cycle after its handshake and the
channel's master 1 cycle later; a response reaches the client 1 cycle after the channel
offers it.
"""
from amaranth import Module, Cat, Const
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..common.axi import Axi4Signature
from ..common.stream_util import RegisterSlice, RoundRobinArbiter
from .arbiter import client_port_signature
from .axi_master import AxiChannelMaster, LINE_SIZE_LOG2
from .port import mem_read_response_layout, mem_request_layout, mem_write_response_layout


class MemoryInterleaver(wiring.Component):
    def __init__(self, *, channels, addr_bits, ctx_bits, ports=1, read_ids=64, write_depth=32,
                 id_bits=8):
        assert channels >= 1 and channels & (channels - 1) == 0, "channels: a power of two"
        assert ports >= 1
        self.channels = channels
        self.ports = ports
        self.addr_bits = addr_bits
        self.ctx_bits = ctx_bits
        self.channel_bits = (channels - 1).bit_length()
        self.port_bits = (ports - 1).bit_length()      # 0 for one port: ctx unchanged
        self.local_addr_bits = addr_bits - self.channel_bits
        self._kw = dict(local_addr_bits=self.local_addr_bits,
                        ctx_bits=ctx_bits + self.port_bits,
                        read_ids=read_ids, write_depth=write_depth, id_bits=id_bits)
        self.axi_signature = Axi4Signature(
            addr_width=self.local_addr_bits + LINE_SIZE_LOG2, id_width=id_bits)
        # Public for testbenches: a request is granted by its channel when it leaves
        # ``req_slices[p].o`` (the acceptance order of hw/mem/port.py's guarantees).
        self.req_slices = [RegisterSlice(mem_request_layout(addr_bits, ctx_bits)) for _ in range(ports)]
        super().__init__({
            "clients": In(client_port_signature(addr_bits, ctx_bits)).array(ports),
            **{f"pmem{c}": Out(self.axi_signature) for c in range(channels)},
        })

    def elaborate(self, platform):
        m = Module()
        n, cb, pb = self.channels, self.channel_bits, self.port_bits
        masters = []
        for c in range(n):
            mc = AxiChannelMaster(**self._kw)
            m.submodules[f"channel{c}"] = mc
            masters.append(mc)
            wiring.connect(m, mc.axi, wiring.flipped(getattr(self, f"pmem{c}")))

        # --- requests: port p's head goes to channel addr % N; one arbiter (one payload
        # mux) per channel picks among the ports that target it.
        arbs = []
        for c, mc in enumerate(masters):
            arb = RoundRobinArbiter(mc.req_layout, self.ports)
            m.submodules[f"req_arb{c}"] = arb
            wiring.connect(m, arb.o, mc.req)
            arbs.append(arb)
        for p, client in enumerate(self.clients):
            stage = self.req_slices[p]
            m.submodules[f"req_slice{p}"] = stage
            wiring.connect(m, wiring.flipped(client.req), stage.i)
            req = stage.o
            channel = req.payload.addr[:cb] if n > 1 else 0
            for c, arb in enumerate(arbs):
                dst = arb.inputs[p]
                m.d.comb += [
                    dst.valid.eq(req.valid & (channel == c)),
                    dst.payload.write.eq(req.payload.write),
                    dst.payload.addr.eq(req.payload.addr[cb:]),
                    dst.payload.strb.eq(req.payload.strb),
                    dst.payload.poison.eq(req.payload.poison),
                    dst.payload.data.eq(req.payload.data),
                    dst.payload.ctx.eq(Cat(req.payload.ctx, Const(p, pb))),
                ]
                with m.If(channel == c):
                    m.d.comb += req.ready.eq(dst.ready)

        # --- responses: per port and kind, a round-robin merge over the channels of the
        # responses whose ctx names that port.
        for rsp_name, layout in (("rd_rsp", mem_read_response_layout(self.ctx_bits)),
                                 ("wr_rsp", mem_write_response_layout(self.ctx_bits))):
            merges = []
            for p, client in enumerate(self.clients):
                merge = RoundRobinArbiter(layout, n)
                m.submodules[f"{rsp_name}_arb{p}"] = merge
                out = RegisterSlice(layout)
                m.submodules[f"{rsp_name}_slice{p}"] = out
                wiring.connect(m, merge.o, out.i)
                wiring.connect(m, out.o, wiring.flipped(getattr(client, rsp_name)))
                merges.append(merge)
            for c, mc in enumerate(masters):
                src = getattr(mc, rsp_name)
                owner = src.payload.ctx[self.ctx_bits:]
                for p, merge in enumerate(merges):
                    dst = merge.inputs[c]
                    mine = (owner == p) if pb else Const(1)
                    m.d.comb += [dst.valid.eq(src.valid & mine),
                                 dst.payload.ctx.eq(src.payload.ctx[:self.ctx_bits])]
                    for name, _ in layout:
                        if name != "ctx":
                            m.d.comb += getattr(dst.payload, name).eq(getattr(src.payload, name))
                    with m.If(mine):
                        m.d.comb += src.ready.eq(dst.ready)
        return m
