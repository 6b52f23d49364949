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

A READ that hits returns the cached line without CXL traffic; a WRITE that hits E or M
writes in place. PUSH and PUSH_INV to a line the device owns (E or M) write the new data
back with DirtyEvict instead (ItoMWr/WrInv are for lines the device does not own); an S
copy is dropped first. FLUSH drops the device's copy (writing back M data). ``error`` is
set when the host answered GO-Err / poisoned data (the data is then all ones).
"""
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out

from ..common.cxl_mem import LINE_ADDR_BITS, LINE_BITS

PORT_ID_BITS = 8


class CacheOp(enum.Enum, shape=3):
    READ_SHARED = 0
    READ_OWN = 1
    READ_CURRENT = 2
    WRITE = 3
    PUSH = 4
    PUSH_INV = 5
    FLUSH = 6


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
