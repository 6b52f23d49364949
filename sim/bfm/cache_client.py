"""Device-side client of the CXL.cache agent's internal port (``cache_port`` on the sim top).

Stands in for the device blocks (embedding engines, checkpoint DMA) until they exist:
``request(op, line, data=0) -> id`` queues a CacheReq; ``on_response`` listeners get
``(request, response_fields, cycle)`` where request = ``ClientRequest``. Ids are 6 bits
and never reused while outstanding. Built on the generic LinkDriver (sim/bfm/link.py), so
it costs one raw callback per cycle and no coroutine. Ids 0x00-0x3F are the client's (the NDP engines and the bias
engine uses the others).
"""
from __future__ import annotations

from dataclasses import dataclass

from hw.cxl_controller.cache_port import CacheReq, CacheRsp, CacheOp, ENGINE_ID_BASE
from ..model.codec import StructCodec
from .link import LinkDriver

CLIENT_IDS = ENGINE_ID_BASE         # ids 0x00-0x3F are the client's; the rest, the engines' and bias's

REQ = StructCodec(CacheReq)
RSP = StructCodec(CacheRsp)


@dataclass
class ClientRequest:
    id: int
    op: int
    line: int
    data: int
    issued: int              # cycle the request was queued
    accepted: int = -1       # cycle the agent took it


class CacheClient:
    def __init__(self, dut, clk, *, rng, backpressure: float = 0.0):
        self.link = LinkDriver(dut, clk, tx={"cache_port__req": REQ},
                               rx={"cache_port__rsp": RSP}, rng=rng, backpressure=backpressure)
        self.link.listeners.append(self)
        self.outstanding: dict[int, ClientRequest] = {}
        self.on_response = []
        self._next_id = 0
        self.completed = 0

    @property
    def cycle(self) -> int:
        return self.link.cycle

    @property
    def busy(self) -> bool:
        return bool(self.outstanding)

    def free_id(self) -> bool:
        return len(self.outstanding) < CLIENT_IDS

    def request(self, op: CacheOp, line: int, data: int = 0) -> int:
        if not self.free_id():
            raise RuntimeError(f"{CLIENT_IDS} requests outstanding: wait for responses first")
        while self._next_id in self.outstanding:
            self._next_id = (self._next_id + 1) % CLIENT_IDS
        rid = self._next_id
        self._next_id = (rid + 1) % CLIENT_IDS
        self.outstanding[rid] = ClientRequest(rid, op.value, line, data, self.cycle)
        self.link.send("cache_port__req", {"op": op.value, "addr": line, "id": rid, "data": data})
        return rid

    def start(self):
        self.link.start()

    def stop(self):
        self.link.stop()

    # LinkDriver listener
    def on_tx(self, cycle, name, fields):
        self.outstanding[fields["id"]].accepted = cycle

    def on_rx(self, cycle, name, fields):
        req = self.outstanding.pop(fields["id"], None)
        if req is None:
            raise AssertionError(f"cycle {cycle}: response id {fields['id']} answers no request")
        self.completed += 1
        for listener in self.on_response:
            listener(req, fields, cycle)
