"""The cocotb test environment for the device harness (sim/harness.py).

``env = await DeviceEnv.create(dut, seed=...)`` starts the clock, resets the device, and
wires the host BFM, the protocol monitor (always on), the scoreboard, the CSR driver and
the PMEM backdoor. ``await env.finish()`` drains outstanding traffic and returns a summary;
tests assert on ``env.monitor.violations`` and ``env.scoreboard.mismatches``. Unless a test
sets ``env.cache_traffic_expected`` (the CXL.cache tests, which run their own CXL.cache
monitor), ``finish`` also reports any D2H message the device tried to send.

The device configuration comes from the environment variable ``TCXL_CONFIG`` (JSON of
``DeviceConfig`` fields) that the Python runner sets when it builds the harness, so the
cocotb side and the RTL always agree.
"""
from __future__ import annotations

import json
import os
import random

from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, Timer

from hw.config import DeviceConfig
from hw.mem.port import split_line_address
from .bfm.csr import CsrDriver
from .bfm.cxl_mem_host import CxlMemHost
from .bfm.pmem import PmemChannel, power_fail
from .checkers.cxl_mem_monitor import CxlMemMonitor
from .checkers.scoreboard import CxlMemScoreboard
from .model.memory import MemoryModel

CLOCK_PERIOD_NS = 2          # the simulator's time base; cycles are what we report


def config_from_env() -> DeviceConfig:
    return DeviceConfig(**json.loads(os.environ.get("TCXL_CONFIG", "{}")))


def seed_from_env(default: int | None = None) -> int:
    value = os.environ.get("TCXL_SEED")
    if value:
        return int(value, 0)
    return default if default is not None else random.SystemRandom().randrange(1 << 32)


class DeviceEnv:
    def __init__(self, dut, config: DeviceConfig, seed: int, backpressure: float):
        self.dut = dut
        self.config = config
        self.seed = seed
        self.rng = random.Random(seed)
        self.clk = dut.clk
        self.monitor = CxlMemMonitor(capacity_lines=config.capacity_lines)
        self.model = MemoryModel(config.capacity_lines)
        self.scoreboard = CxlMemScoreboard(self.monitor, self.model)
        self.monitor.listeners.append(self.scoreboard)
        self.host = CxlMemHost(dut, self.clk, rng=random.Random(seed ^ 0x5EED),
                               backpressure=backpressure, period_ns=CLOCK_PERIOD_NS)
        self.host.listeners += [self.monitor, self.scoreboard]
        self.csr = CsrDriver(dut, self.clk)
        self.media = [PmemChannel(getattr(dut, f"media{c}")) for c in range(config.channels)]
        # CXL.cache tests set this; elsewhere the device must stay silent on D2H.
        self.cache_traffic_expected = False

    @classmethod
    async def create(cls, dut, *, seed: int | None = None, backpressure: float = 0.0,
                     window: tuple[int, int] | None = None) -> "DeviceEnv":
        config = config_from_env()
        seed = seed_from_env() if seed is None else seed
        dut._log.info(f"seed {seed} (replay with TCXL_SEED={seed})")
        env = cls(dut, config, seed, backpressure)
        Clock(dut.clk, CLOCK_PERIOD_NS, unit="ns").start()
        dut.power_fail.value = 0
        dut.tear_seed.value = 0
        for name in ("m2s_req__valid", "m2s_rwd__valid", "s2m_ndr__ready", "s2m_drs__ready",
                     "h2d_req__valid", "h2d_rsp__valid", "h2d_data__valid", "d2h_req__ready",
                     "d2h_rsp__ready", "d2h_data__ready", "cache_port__req__valid",
                     "cache_port__rsp__ready"):
            if hasattr(dut, name):
                getattr(dut, name).value = 0
        await env.reset()
        env.host.start()
        if window is None:
            window = (0, config.capacity_bytes)
        await env.program_window(*window)
        return env

    async def reset(self, cycles: int = 4) -> None:
        self.dut.rst.value = 1
        await ClockCycles(self.clk, cycles)
        self.dut.rst.value = 0
        # The channels fill their free-ARID lists after reset.
        await ClockCycles(self.clk, self.config.read_ids_per_channel + 3)

    async def program_window(self, base_bytes: int, size_bytes: int, enable: bool = True):
        await self.csr.program_hdm(base_bytes, size_bytes, enable)
        self.monitor.set_window(base_bytes // 64, size_bytes // 64, enable)

    # ---- backdoor, in device line addresses
    def peek(self, line: int) -> tuple[int, bool]:
        ch, local = split_line_address(line, self.config.channels)
        return self.media[ch].peek(local), self.media[ch].peek_poison(local)

    def poke(self, line: int, value: int, poison: bool = False) -> None:
        ch, local = split_line_address(line, self.config.channels)
        self.media[ch].poke(local, value, poison)
        self.model.write(line, value, poison=poison)

    async def wait_idle(self, timeout_cycles: int = 200_000, *, raise_on_timeout: bool = True) -> bool:
        """Wait until every queued message was sent and every response came back.

        Returns True when idle; after ``timeout_cycles`` raises TimeoutError, or returns False
        with ``raise_on_timeout=False`` (a fuzz counts what is still unanswered as hangs).
        """
        # Poll with a Timer: ClockCycles would wake Python at every one of the edges.
        poll = 32
        for _ in range(timeout_cycles // poll):
            if self.host.error is not None:
                raise self.host.error
            if self.host.pending == 0 and self.monitor.outstanding == 0:
                return True
            await Timer(poll * CLOCK_PERIOD_NS, unit="ns")
        if not raise_on_timeout:
            return False
        raise TimeoutError(f"device not idle after {timeout_cycles} cycles: "
                           f"{self.host.pending} unsent, {self.monitor.outstanding} unanswered")

    async def power_cycle(self, tear_seed: int) -> None:
        """Cut power: media tear in-flight writes, the device and the link lose all state."""
        self.host.enabled = False
        self.host.reset_link()
        self.dut.rst.value = 1
        await power_fail(self.dut.power_fail, self.dut.tear_seed, self.clk, tear_seed)
        await self.reset()
        self.monitor.forget()
        self.host.enabled = True

    async def finish(self, *, drain_cycles: int = 200_000, quiet_cycles: int = 8,
                     raise_on_hang: bool = True) -> dict:
        """Drain (at most ``drain_cycles``), wait ``quiet_cycles`` more so that a late or
        spurious response is still seen, then close the monitor. With ``raise_on_hang=False``
        a drain that times out is not an exception: the requests still waiting are reported
        (``unanswered``, and each as a monitor violation)."""
        await self.wait_idle(drain_cycles, raise_on_timeout=raise_on_hang)
        await ClockCycles(self.clk, quiet_cycles)
        self.monitor.finish(self.host.cycle)
        if not self.cache_traffic_expected:
            # Nobody drives CXL.cache in this test: the device must not have tried to send.
            for ch in ("d2h_req", "d2h_rsp", "d2h_data"):
                sig = getattr(self.dut, f"{ch}__valid", None)
                if sig is not None and int(sig.value):
                    self.monitor.violations.append(f"unexpected CXL.cache message on {ch}")
        return {
            "seed": self.seed,
            "cycles": self.host.cycle,
            "messages": self.monitor.messages,
            "reads_checked": self.scoreboard.reads_checked,
            "mismatches": len(self.scoreboard.mismatches),
            "protocol_violations": len(self.monitor.violations),
            "unanswered": self.monitor.unanswered,
            "unsent": self.host.pending,
        }

    def assert_clean(self) -> None:
        problems = self.monitor.violations[:10] + self.scoreboard.mismatches[:10]
        assert not problems, (f"seed {self.seed}: {len(self.monitor.violations)} protocol "
                              f"violations, {len(self.scoreboard.mismatches)} mismatches:\n"
                              + "\n".join(problems))
