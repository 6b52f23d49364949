"""The device against a host that shares lines with it: the CXL.cache coherence bench.

``CoherenceBench(env, lines, *, ha_kw, cpu_kw, backpressure, cpu_period)`` wires, on the
device harness of ``env`` (sim/env.py): a host home agent (sim/model/home_agent.py) with a
host CPU cache (sim/model/host_cpu_cache.py) on ``lines``, the H2D/D2H link driver
(sim/bfm/cxl_cache_host.py), the device's internal cache port driven by a ``CacheClient``,
and every check:

- the CXL.cache protocol monitor (sim/checkers/cxl_cache_monitor.py) on every message, plus
  the home agent's own protocol errors and obligations (``protocol_violations``);
- single writer / multiple readers on every line at every message: the state the host
  granted the device, the CPU cache's state and the directory (``coherence_violations``);
- every read, by the device or the CPU, returns a value the line could hold between its
  issue and its completion, and after the drain every line read through the device returns
  its latest value (sim/checkers/coherence.py; ``mismatches``).

``request(op, line, data)`` issues a device operation (waiting while 16 are outstanding);
``drain(max_cycles)`` waits until the device and the host are idle and returns the device
requests still unanswered; ``final_reads()`` reads every line back; ``problems()`` lists the
first failures; ``counts()`` the figures. Seeds: the bench draws from ``env.seed`` + fixed
offsets, so a run replays from its seed. Used by ``coherence_stress`` (sim/tb/cxl_cache_tb.py)
and the CXL.cache fuzz (sim/tb/fuzz_cxl_cache_tb.py).
"""
from __future__ import annotations

import random

from cocotb.triggers import Timer

from hw.cxl_controller.cache_port import CacheOp
from sim.bfm.cache_client import CacheClient
from sim.bfm.cxl_cache_host import CxlCacheHost
from sim.checkers.coherence import CoherenceChecker
from sim.checkers.cxl_cache_monitor import CxlCacheMonitor
from sim.env import CLOCK_PERIOD_NS
from sim.model.home_agent import HomeAgent, swmr_ok
from sim.model.host_cpu_cache import HostCpuCache

HOST_BASE = 1 << 24                 # host memory lines, far above the device's HDM window
MAX_OUTSTANDING = 16                # device operations in flight from the bench
STATE_NUMBER = {"I": 0, "S": 1, "E": 2, "M": 3}


class CoherenceBench:
    def __init__(self, env, lines, *, ha_kw: dict, cpu_kw: dict, backpressure: float, cpu_period: int):
        seed, cfg = env.seed, env.config
        self.env, self.lines = env, list(lines)
        self.ha = HomeAgent((HOST_BASE, 1 << 16), device_hdm_range=(0, cfg.capacity_lines),
                            rng=random.Random(seed + 3), **ha_kw)
        self.cpu = HostCpuCache(self.ha, self.lines, rng=random.Random(seed + 4), **cpu_kw)
        self.monitor = CxlCacheMonitor(device_hdm=(0, cfg.capacity_lines))
        self.host = CxlCacheHost(env.dut, env.clk, self.ha, rng=random.Random(seed + 5),
                                 backpressure=backpressure, mem_host=env.host, cpu=self.cpu,
                                 cpu_period=cpu_period)
        self.host.listeners.append(self.monitor)
        env.host.listeners.append(self.monitor)      # MemRdFwd / MemWrFwd on CXL.mem
        self.client = CacheClient(env.dut, env.clk, rng=random.Random(seed + 6))
        self.checker = CoherenceChecker()
        self.coherence_violations: list[str] = []
        self._issued: dict[int, int] = {}
        self._wrap_cpu()
        self.client.on_response.append(self._device_answer)
        self.host.listeners.append(self)              # single writer / multiple readers

    @property
    def cycle(self) -> int:
        return self.host.cycle

    # ---- checks
    def _wrap_cpu(self) -> None:
        """CPU operations are intervals too: from issue to completion."""
        for name in ("load", "store"):
            original = getattr(self.cpu, name)

            def wrapped(line, *a, _orig=original, **k):
                self._issued[line] = self.cycle
                return _orig(line, *a, **k)
            setattr(self.cpu, name, wrapped)

        def cpu_access(kind, line, value):
            t = self.cycle
            if kind == "store":
                self.checker.write(line, value, self._issued.get(line, t), t)
            else:
                self.checker.record_read(line, value, self._issued.get(line, t), t, who="CPU load")
        self.cpu.on_access = cpu_access

    def _device_answer(self, req, f, cycle) -> None:
        if f["error"]:
            return
        op = CacheOp(req.op)
        if op in (CacheOp.READ_SHARED, CacheOp.READ_OWN, CacheOp.READ_CURRENT):
            self.checker.record_read(req.line, f["data"], req.accepted, cycle, who=f"device {op.name}")
        elif op in (CacheOp.WRITE, CacheOp.PUSH, CacheOp.PUSH_INV):
            self.checker.write(req.line, req.data, req.accepted, cycle)

    def _swmr(self, cycle: int) -> None:
        for line in self.lines:
            dev = STATE_NUMBER[self.monitor.coherence.granted_state(line)]
            cpu_state = self.cpu.state.get(line, 0)
            if not swmr_ok(dev, cpu_state) or not swmr_ok(*self.ha.dir_state(line)):
                self.coherence_violations.append(
                    f"cycle {cycle}: line {line:#x} device {dev} cpu {cpu_state} "
                    f"directory {self.ha.dir_state(line)}")

    def on_d2h(self, cycle, kind, f) -> None:
        self._swmr(cycle)

    def on_h2d(self, cycle, kind, f) -> None:
        self._swmr(cycle)

    # ---- driving
    def start(self) -> None:
        self.host.start()
        self.client.start()

    def _raise_link_errors(self) -> None:
        for drv in (self.host, self.client.link):
            if drv.error is not None:
                raise drv.error

    async def request(self, op: CacheOp, line: int, data: int = 0) -> None:
        while len(self.client.outstanding) >= MAX_OUTSTANDING:
            await Timer(8 * CLOCK_PERIOD_NS, unit="ns")
            self._raise_link_errors()
        self.client.request(op, line, data)

    async def drain(self, max_cycles: int) -> int:
        """Wait until device and host are idle (at most ``max_cycles``); the device requests
        still unanswered then."""
        for _ in range(max_cycles // 8):
            if not self.client.busy and self.host.idle:
                break
            await Timer(8 * CLOCK_PERIOD_NS, unit="ns")
            self._raise_link_errors()
        return len(self.client.outstanding)

    async def final_reads(self, max_cycles: int = 16000) -> int:
        """Every line read through the device after all writes (the checker wants the latest
        value); the CPU stops first. Returns the reads still unanswered after ``max_cycles``."""
        self.host.cpu_period = 0
        for line in self.lines:
            await self.request(CacheOp.READ_CURRENT, line)
        return await self.drain(max_cycles)

    def finish(self) -> None:
        self.monitor.finish(self.cycle)
        self.checker.check()

    @property
    def protocol(self) -> list[str]:
        return (self.monitor.violations + [f"home agent: {e}" for e in self.ha.protocol_errors]
                + [f"home agent obligation: {e}" for e in self.ha.obligation_violations])

    def problems(self, limit: int = 5) -> list[str]:
        return self.checker.violations[:limit] + self.protocol[:limit] + self.coherence_violations[:limit]

    def counts(self) -> dict:
        return {"mismatches": len(self.checker.violations), "protocol_violations": len(self.protocol),
                "coherence_violations": len(self.coherence_violations),
                "reads_checked": self.checker.reads_checked, "cpu": dict(self.cpu.counts)}
