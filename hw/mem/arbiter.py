"""Memory port arbiter: N clients share the memory subsystem's one request stream.

Ports
- ``clients[i]``: In(client_port_signature(addr_bits, ctx_bits)), i = 0..N-1: each client
  sends ``req`` and receives its own ``rd_rsp`` / ``wr_rsp`` (hw/mem/port.py layouts).
- ``mem``: Out(client_port_signature(addr_bits, ctx_bits + client_bits)): to
  MemoryInterleaver (``req`` out, ``rd_rsp`` / ``wr_rsp`` in).

Behaviour: requests are merged round-robin (combinational, no added latency; a client that
keeps ``valid`` high is served within N transfers). ``input_stage`` (one per client) puts a
stage between a client and the merge: ``"none"`` (the default), ``"skid"`` (a SkidBuffer: 0
cycles, the client's ``ready`` is a flip-flop) or ``"slice"`` (a RegisterSlice: 1 cycle, its
``valid`` and ``ready`` both flip-flops), so neither a client's request logic nor the
merge's grant adds to the other's logic depth (hw/common/stream_util.py). With a stage, a
client's request is accepted by its stage; the memory sees it when the merge grants it. The
client index rides in the top bits of ``ctx`` and routes each response back to its client; a
response waits while its client is not ready. Per-client order is kept; across clients, the
memory subsystem's guarantees (hw/mem/port.py: read-after-write per line, writes per line in
order) hold in the order the merge granted the requests (no client of the device orders its
requests after another client's write by the write's acceptance: a command's writes count as
done at their responses).

In the device (hw/top.py) it merges the shared memory port 0: the CXL.mem target, the
command processor, the lookup feeder and the update, undo-log, MLP-log and recovery engines;
and interleaver port 1: lookup unit 0 and the update engine's gradient reads.
"""
from amaranth import Module, Cat, Const
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from ..common.stream_util import RegisterSlice, RoundRobinArbiter, SkidBuffer
from .port import mem_request_layout, mem_read_response_layout, mem_write_response_layout


def client_port_signature(addr_bits: int, ctx_bits: int) -> wiring.Signature:
    """A memory client's port, from the client's side."""
    return wiring.Signature({
        "req": Out(stream.Signature(mem_request_layout(addr_bits, ctx_bits))),
        "rd_rsp": In(stream.Signature(mem_read_response_layout(ctx_bits))),
        "wr_rsp": In(stream.Signature(mem_write_response_layout(ctx_bits))),
    })


INPUT_STAGES = {"none": None, "skid": SkidBuffer, "slice": RegisterSlice}


class MemPortArbiter(wiring.Component):
    def __init__(self, *, clients: int, addr_bits: int, ctx_bits: int, input_stage=None):
        assert clients >= 1
        self.input_stage = tuple(input_stage) if input_stage is not None else ("none",) * clients
        if len(self.input_stage) != clients or not set(self.input_stage) <= set(INPUT_STAGES):
            raise ValueError(f"input_stage must name one of {sorted(INPUT_STAGES)} per client "
                             f"({clients}), got {self.input_stage!r}")
        self.n = clients
        self.addr_bits = addr_bits
        self.ctx_bits = ctx_bits
        self.client_bits = max((clients - 1).bit_length(), 1)
        super().__init__({
            "clients": In(client_port_signature(addr_bits, ctx_bits)).array(clients),
            "mem": Out(client_port_signature(addr_bits, ctx_bits + self.client_bits)),
        })

    def elaborate(self, platform):
        m = Module()
        n, cb = self.n, self.client_bits
        wide = mem_request_layout(self.addr_bits, self.ctx_bits + cb)
        m.submodules.arb = arb = RoundRobinArbiter(wide, n)
        for i, client in enumerate(self.clients):
            src, dst = client.req, arb.inputs[i]
            stage_cls = INPUT_STAGES[self.input_stage[i]]
            if stage_cls is not None:
                m.submodules[f"in{i}_{self.input_stage[i]}"] = stage = stage_cls(wide)
                wiring.connect(m, stage.o, arb.inputs[i])
                dst = stage.i
            m.d.comb += [
                dst.valid.eq(src.valid), src.ready.eq(dst.ready),
                dst.payload.write.eq(src.payload.write), dst.payload.addr.eq(src.payload.addr),
                dst.payload.strb.eq(src.payload.strb), dst.payload.poison.eq(src.payload.poison),
                dst.payload.data.eq(src.payload.data),
                dst.payload.ctx.eq(Cat(src.payload.ctx, Const(i, cb))),
            ]
        wiring.connect(m, arb.o, wiring.flipped(self.mem.req))

        for rsp_name in ("rd_rsp", "wr_rsp"):
            rsp = getattr(self.mem, rsp_name)
            owner = rsp.payload.ctx[self.ctx_bits:]
            for i, client in enumerate(self.clients):
                out = getattr(client, rsp_name)
                mine = owner == i
                m.d.comb += [out.valid.eq(rsp.valid & mine), out.payload.ctx.eq(rsp.payload.ctx)]
                for name, _ in out.payload.shape():
                    if name != "ctx":
                        m.d.comb += getattr(out.payload, name).eq(getattr(rsp.payload, name))
                with m.If(mine):
                    m.d.comb += rsp.ready.eq(out.ready)
        return m


def connect_port(m: Module, client, port) -> None:
    """Connect a client's port (``client_port_signature`` from the client's side) to a port
    of the memory subsystem (the flipped signature) whose ``ctx`` may be wider: the client's
    ctx is zero-extended on requests and truncated back on responses. Clients never see
    bits they did not send, since responses return ctx unchanged."""
    src, dst = client.req, port.req
    m.d.comb += [dst.valid.eq(src.valid), src.ready.eq(dst.ready)]
    for name, _ in src.payload.shape():
        m.d.comb += getattr(dst.payload, name).eq(getattr(src.payload, name))
    for rsp_name in ("rd_rsp", "wr_rsp"):
        src, dst = getattr(port, rsp_name), getattr(client, rsp_name)
        m.d.comb += [dst.valid.eq(src.valid), src.ready.eq(dst.ready)]
        for name, _ in dst.payload.shape():
            m.d.comb += getattr(dst.payload, name).eq(getattr(src.payload, name))
