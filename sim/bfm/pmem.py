"""Python side of the PMEM media model (sim/rtl/pmem_media.sv): backdoor and power failure.

- ``PmemChannel(handle)`` wraps one pmem_media instance handle (``dut.<path>``) and reads or
  writes its ``mem[line]`` (512-bit int, byte 0 = bits 7:0) and ``poison[line]`` over VPI.
  Backdoor writes take effect immediately (no clock edge, no AXI, no timing) and bypass the
  media's queues: they must not race an in-flight AXI write to the same line, whose B
  handshake would later overwrite the strobed bytes (and possibly the poison bit). Use them
  while the channel is idle for that line, e.g. to load tables before a test or to inspect
  the persistence domain after a power failure. An R beat already waiting returns the
  line as it is at its handshake, so a poke before that is seen.
- ``watch(line)`` / ``watch_count()``: the media count the writes accepted to one local line
  (``watch_line`` / ``watch_count`` in the RTL), so a test can act right after the device
  issued a given write (the crash campaign cuts power there) by polling a counter.
- ``power_fail(...)`` raises the media's ``power_fail`` for a number of clock cycles (the
  device's reset is the caller's business).
"""
from __future__ import annotations

from typing import Iterable

from cocotb.triggers import RisingEdge

LINE_BITS = 512
# GPI set action "no delay" (cocotb.handle._GPISetAction.NO_DELAY = vpiNoDelay): the value
# is stored at once. Action 0 (deposit) is an inertial put in Verilator, applied only at
# the simulator's next evaluation, so a peek right after a poke would see the old value.
_NO_DELAY = 3
_LINE_MASK = (1 << LINE_BITS) - 1


class PmemChannel:
    """Backdoor access to one pmem_media instance.

    Uses the raw simulator handles (``mem[i]._handle``), 2-3x faster than ``.value``; the
    per-line handles are looked up on first use and cached.
    """

    def __init__(self, handle):
        self.handle = handle
        self._mem_h: dict[int, object] = {}
        self._poison_h: dict[int, object] = {}

    def _mem(self, line: int):
        h = self._mem_h.get(line)
        if h is None:
            h = self.handle.mem[line]._handle
            self._mem_h[line] = h
        return h

    def _poison(self, line: int):
        h = self._poison_h.get(line)
        if h is None:
            h = self.handle.poison[line]._handle
            self._poison_h[line] = h
        return h

    def peek(self, line: int) -> int:
        """The line's 64 bytes as an int, byte 0 in bits 7:0."""
        return int(self._mem(line).get_signal_val_binstr(), 2)

    def poke(self, line: int, value: int, poison: bool = False) -> None:
        """Overwrite the whole line and its poison bit, at once."""
        if not 0 <= value <= _LINE_MASK:
            raise ValueError(f"line value out of range: {value:#x}")
        self._mem(line).set_signal_val_binstr(_NO_DELAY, format(value, "0512b"))
        self._poison(line).set_signal_val_binstr(_NO_DELAY, "1" if poison else "0")

    def peek_poison(self, line: int) -> bool:
        return self._poison(line).get_signal_val_binstr() == "1"

    def load(self, start_line: int, values: Iterable[int]) -> None:
        """Poke consecutive lines (poison cleared) from ``start_line``."""
        for i, v in enumerate(values):
            self.poke(start_line + i, v)

    def dump(self, start_line: int, count: int) -> list[int]:
        return [self.peek(start_line + i) for i in range(count)]

    def watch(self, line: int | None) -> None:
        """Count the writes accepted to local ``line`` from now on (None: watch nothing)."""
        value = (1 << 32) - 1 if line is None else line
        self.handle.watch_line._handle.set_signal_val_binstr(_NO_DELAY, format(value, "032b"))

    def watch_count(self) -> int:
        return int(self.handle.watch_count._handle.get_signal_val_binstr(), 2)


async def power_fail(dut_power_fail_signal, tear_seed_signal, clk, seed: int,
                     cycles: int = 4) -> None:
    """Drive ``tear_seed`` and hold ``power_fail`` high for ``cycles`` rising edges.

    Call it where signal writes are allowed (e.g. right after ``await RisingEdge(clk)``):
    both signals change at once, so the next rising edge is the one that tears in-flight
    writes; ``power_fail`` drops right after the ``cycles``-th edge and the media works
    again from the edge after that.
    """
    if cycles < 1:
        raise ValueError("cycles must be >= 1")
    tear_seed_signal.value = seed & 0xFFFF_FFFF
    dut_power_fail_signal.value = 1
    for _ in range(cycles):
        await RisingEdge(clk)
    dut_power_fail_signal.value = 0
