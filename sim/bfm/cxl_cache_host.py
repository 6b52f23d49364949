"""Host side of CXL.cache on the wires: a LinkDriver over the six channels plus the home agent.

``CxlCacheHost(dut, clk, home_agent, *, rng, backpressure=0.0, mem_host=None, cpu=None,
cpu_period=0, period_ns=None)``:
- tx: ``h2d_req``, ``h2d_rsp``, ``h2d_data``; rx: ``d2h_req``, ``d2h_rsp``, ``d2h_data`` (ports
  ``<name>__valid/__ready/__payload``, payloads = the hw/common/cxl_cache layouts); D2H
  ``ready`` is dropped with probability ``backpressure`` (from ``rng``).
- every D2H message sampled is passed to ``home_agent.handle_d2h(kind, fields)``; the H2D
  messages it returns are released into the link when their ``delay`` (cycles) has elapsed
  (a cycle-stamped heap checked in the link's step; no extra coroutines), in order of due
  cycle then creation; when one transfers, ``home_agent.sent(msg)`` is called.
- "m2s_req" messages (MemRdFwd/MemWrFwd for the device's own memory) go at once, in creation
  order, to ``mem_host.send_req(**fields)`` (a CxlMemHost, which reports them to its own
  listeners via ``on_m2s``); the HA is told they were sent straight away.
- ``listeners`` (e.g. the CXL.cache protocol monitor) get ``on_d2h(cycle, kind, fields)`` and
  ``on_h2d(cycle, kind, fields)`` for every transfer, kind "req"/"rsp"/"data", before the HA
  sees it.
- ``cpu`` (a HostCpuCache on the same HA) issues one random operation (``cpu.tick()``) every
  ``cpu_period`` cycles (0 = never); ``cpu_tick()`` issues one on demand.
- ``period_ns`` (the clock period): the link driver sleeps while nothing is due
  (sim/bfm/link.py).
- ``start()`` / ``stop()``; ``error`` is the exception that stopped the step; ``pending``
  counts H2D messages not yet transferred (delayed or queued); ``idle`` is pending == 0 and
  the HA idle.
"""
from __future__ import annotations

import collections
import heapq

from hw.common.cxl_cache import D2HReq, D2HRsp, D2HData, H2DReq, H2DRsp, H2DData
from ..model.codec import StructCodec
from .link import LinkDriver

H2D_CODECS = {"h2d_req": StructCodec(H2DReq), "h2d_rsp": StructCodec(H2DRsp),
              "h2d_data": StructCodec(H2DData)}
D2H_CODECS = {"d2h_req": StructCodec(D2HReq), "d2h_rsp": StructCodec(D2HRsp),
              "d2h_data": StructCodec(D2HData)}
_KIND = {"d2h_req": "req", "d2h_rsp": "rsp", "d2h_data": "data",
         "h2d_req": "req", "h2d_rsp": "rsp", "h2d_data": "data"}


class CxlCacheHost:
    def __init__(self, dut, clk, home_agent, *, rng, backpressure: float = 0.0, mem_host=None,
                 cpu=None, cpu_period: int = 0, period_ns: float | None = None):
        self.ha = home_agent
        self.mem_host = mem_host
        self.cpu = cpu
        self.cpu_period = cpu_period
        self.link = LinkDriver(dut, clk, tx=H2D_CODECS, rx=D2H_CODECS, rng=rng,
                               backpressure=backpressure, period_ns=period_ns)
        self.link.listeners.append(self)
        self.link.on_cycle = self._on_cycle
        # Idle between messages unless a delayed message or a CPU tick is due.
        self.link.can_sleep = lambda: not self._due and not self.cpu_period
        self.listeners: list = []
        self._due: list = []                    # heap of (due cycle, order, HaMsg)
        self._order = 0
        # The HaMsg behind each word queued on a channel, in queue order (channels are FIFO).
        self._in_link = {name: collections.deque() for name in H2D_CODECS}
        self._next_cpu = cpu_period

    # ---- API
    def start(self) -> None:
        self.link.start()

    def stop(self) -> None:
        self.link.stop()

    @property
    def error(self):
        return self.link.error

    @property
    def cycle(self) -> int:
        return self.link.cycle

    @property
    def pending(self) -> int:
        return len(self._due) + self.link.pending

    @property
    def idle(self) -> bool:
        return self.pending == 0 and self.ha.idle

    def cpu_tick(self) -> None:
        self._accept(self.cpu.tick(), self.link.cycle)

    # ---- link listener
    def on_rx(self, cycle, name, fields):
        kind = _KIND[name]
        for lst in self.listeners:
            lst.on_d2h(cycle, kind, fields)
        self._accept(self.ha.handle_d2h(kind, fields), cycle)

    def on_tx(self, cycle, name, fields):
        msg = self._in_link[name].popleft()
        kind = _KIND[name]
        for lst in self.listeners:
            lst.on_h2d(cycle, kind, fields)
        self._accept(self.ha.sent(msg), cycle)

    # ---- internals
    def _accept(self, msgs, cycle) -> None:
        while msgs:
            more = []
            for msg in msgs:
                if msg.channel == "m2s_req":
                    if self.mem_host is None:
                        raise RuntimeError(f"{msg!r} needs a CXL.mem host (mem_host=None)")
                    self.mem_host.send_req(**msg.fields)
                    more += self.ha.sent(msg)
                elif msg.delay <= 0:
                    self._release(msg)
                else:
                    heapq.heappush(self._due, (cycle + msg.delay, self._order, msg))
                    self._order += 1
            msgs = more

    def _release(self, msg) -> None:
        self.link.send(msg.channel, msg.fields)
        self._in_link[msg.channel].append(msg)

    def _on_cycle(self, cycle) -> None:
        due = self._due
        while due and due[0][0] <= cycle:
            self._release(heapq.heappop(due)[2])
        if self.cpu_period and cycle >= self._next_cpu:
            self._next_cpu = cycle + self.cpu_period
            self.cpu_tick()
