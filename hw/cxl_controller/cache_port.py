"""The device-internal CXL.cache request port (what device blocks use to reach host memory).

``CacheReq`` (into the agent) and ``CacheRsp`` (out of it), one per request, matched by
``id`` (opaque to the agent; responses may come back in any order across lines, and in
order for one line). Operations and their CXL.cache flows (hw/cxl_controller/cxl_cache.py):

| op | meaning | CXL.cache when it misses the device cache |
|---|---|---|
| READ_SHARED | read a host line, keep a shared copy | RdShared -> data + GO-S/E |
| READ_OWN | read a host line for ownership | RdOwn -> data + GO-E/M |
| READ_CURRENT | read a snapshot, cache nothing | RdCurr -> data |
| WRITE | write a full line into the device cache (owned, M) | RdOwnNoData -> GO-E |
| PUSH | write a full line to host memory, cache nothing | ItoMWr -> GO_WritePull -> data |
| PUSH_INV | the same, strongly ordered | WrInv -> WritePull -> data -> GO-I |
| FLUSH | drop the line everywhere, writing back dirty data | DirtyEvict if M, else CLFlush |
| ACQUIRE | take a device-memory line from the host (to device bias) | RdOwnNoData -> MemRdFwd |

A READ that hits returns the cached line without CXL traffic; a WRITE that hits E or M
writes in place. PUSH and PUSH_INV to a line the device owns (E or M) write the new data
back with DirtyEvict instead (ItoMWr/WrInv are for lines the device does not own); an S
copy is dropped first. FLUSH drops the device's copy (writing back M data). ``error`` is
set when the host answered GO-Err / poisoned data (the data is then all ones).

Ids: the agent's port is shared (``CachePortMux`` in hw/top.py): ids 0x00-0x3F belong to
the test port, 0x40-0x7F to the NDP engines (``EngineCachePortMerge``: 0x40-0x5F the lookup
push, 0x60-0x7F the MLP log), 0x80-0xFF to the bias engine.
"""
from amaranth import Module
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out

from ..common.cxl_mem import LINE_ADDR_BITS, LINE_BITS

PORT_ID_BITS = 8
BIAS_ENGINE_ID = 0x80        # ids with this bit set are the bias engine's
ENGINE_ID_BASE = 0x40        # ids 0x40-0x7F are the NDP engines'; 0x00-0x3F the test port's


class CacheOp(enum.Enum, shape=3):
    READ_SHARED = 0
    READ_OWN = 1
    READ_CURRENT = 2
    WRITE = 3
    PUSH = 4
    PUSH_INV = 5
    FLUSH = 6
    ACQUIRE = 7


class CacheReq(data.Struct):
    op: CacheOp
    addr: LINE_ADDR_BITS
    id: PORT_ID_BITS
    data: LINE_BITS


class CacheRsp(data.Struct):
    id: PORT_ID_BITS
    error: 1
    data: LINE_BITS


def cache_port_signature() -> wiring.Signature:
    """The port from the client's side (a client has ``Out(...)``, the agent ``In(...)``)."""
    return wiring.Signature({
        "req": Out(stream.Signature(CacheReq)),
        "rsp": In(stream.Signature(CacheRsp)),
    })


# Cycles ``CachePortMux`` adds between a client and the agent: one register slice each way.
PORT_MUX_LATENCY = 2


class CachePortMux(wiring.Component):
    """Three clients share the agent's port, told apart by the id range they use:
    ``client`` (the test port, ids 0x00-0x3F), ``engines`` (the NDP engines, ids
    ENGINE_ID_BASE.. 0x7F) and ``bias`` (ids with BIAS_ENGINE_ID set). Requests are merged
    round-robin, responses go back by the id's top two bits.

    The merged request enters the agent through a register slice, and the agent's response
    leaves through one (``PORT_MUX_LATENCY`` cycles in all, full rate): no valid or ready
    runs combinationally between a client and the agent's front end or finisher. Without
    them, an engine's request valid ran through two round-robin arbiters into the agent's
    front end, and its ready came back to the engine's FIFO in the same cycle (the device's
    35-LUT-level path; README, Logic depth)."""

    def __init__(self):
        super().__init__({
            "client": In(cache_port_signature()),
            "engines": In(cache_port_signature()),
            "bias": In(cache_port_signature()),
            "agent": Out(cache_port_signature()),
        })

    def elaborate(self, platform):
        from ..common.stream_util import RoundRobinArbiter, RegisterSlice
        m = Module()
        clients = (self.client, self.engines, self.bias)
        m.submodules.arb = arb = RoundRobinArbiter(CacheReq, len(clients))
        for i, c in enumerate(clients):
            wiring.connect(m, wiring.flipped(c.req), arb.inputs[i])
        m.submodules.req_slice = req_slice = RegisterSlice(CacheReq)
        m.submodules.rsp_slice = rsp_slice = RegisterSlice(CacheRsp)
        wiring.connect(m, arb.o, req_slice.i)
        wiring.connect(m, req_slice.o, wiring.flipped(self.agent.req))
        wiring.connect(m, wiring.flipped(self.agent.rsp), rsp_slice.i)
        rsp = rsp_slice.o
        to_bias = (rsp.payload.id & BIAS_ENGINE_ID) != 0
        to_engines = ~to_bias & ((rsp.payload.id & ENGINE_ID_BASE) != 0)
        to_client = ~to_bias & ~to_engines
        for port, mine in ((self.client.rsp, to_client), (self.engines.rsp, to_engines),
                           (self.bias.rsp, to_bias)):
            m.d.comb += [port.payload.eq(rsp.payload), port.valid.eq(rsp.valid & mine)]
            with m.If(mine):
                m.d.comb += rsp.ready.eq(port.ready)
        return m


class EngineCachePortMerge(wiring.Component):
    """The NDP engines' clients share ``CachePortMux.engines``: client i uses the ids
    ``ENGINE_ID_BASE + i * span`` .. ``+ span - 1`` (``span`` = 0x40 / clients, a power of two).
    Each client's requests enter a register slice (a cycle), then are merged round-robin; a
    response goes back to the client whose id range holds its id. The slices keep one client's
    request valid out of another client's ready (the MLP log's issue logic ran through the
    round robin into the lookup units' output FIFOs: 13 LUT levels in the device)."""

    def __init__(self, clients: int):
        assert clients >= 1 and (clients & (clients - 1)) == 0 and clients <= ENGINE_ID_BASE
        self.n = clients
        self.span = ENGINE_ID_BASE // clients
        super().__init__({
            "clients": In(cache_port_signature()).array(clients),
            "engines": Out(cache_port_signature()),
        })

    def id_base(self, client: int) -> int:
        return ENGINE_ID_BASE + client * self.span

    def elaborate(self, platform):
        from ..common.stream_util import RegisterSlice, RoundRobinArbiter
        m = Module()
        m.submodules.arb = arb = RoundRobinArbiter(CacheReq, self.n)
        for i, c in enumerate(self.clients):
            slice_ = RegisterSlice(CacheReq)
            m.submodules[f"in{i}_slice"] = slice_
            wiring.connect(m, wiring.flipped(c.req), slice_.i)
            wiring.connect(m, slice_.o, arb.inputs[i])
        wiring.connect(m, arb.o, wiring.flipped(self.engines.req))
        rsp = self.engines.rsp
        owner = (rsp.payload.id & (ENGINE_ID_BASE - 1)) // self.span
        for i, c in enumerate(self.clients):
            mine = owner == i
            m.d.comb += [c.rsp.payload.eq(rsp.payload), c.rsp.valid.eq(rsp.valid & mine)]
            with m.If(mine):
                m.d.comb += rsp.ready.eq(c.rsp.ready)
        return m
