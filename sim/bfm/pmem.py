"""Python side of the PMEM media model (sim/rtl/pmem_media.sv): backdoor and power failure.

- ``PmemChannel(handle)`` wraps one pmem_media instance handle (``dut.<path>``) and reads or
  writes its lines (64 bytes; as an int, byte 0 = bits 7:0) and poison bits in the media's
  C++ store (sim/rtl/pmem_store.cpp), reached by ctypes inside the simulator process: whole
  arrays per call (``read_lines`` / ``write_lines``, numpy), or one line (``peek`` / ``poke``).
  Backdoor writes take effect immediately (no clock edge, no AXI, no timing) and bypass the
  media's queues: they must not race an in-flight AXI write to the same line, whose B
  handshake would later overwrite the strobed bytes (and possibly the poison bit). Use them
  while the channel is idle for that line, e.g. to load tables before a test or to inspect
  the persistence domain after a power failure. An R beat returns the line as it was after
  the edge before its handshake, so a poke is seen by beats handshaked from the second edge
  after it.
- Lines are checked against the media's DEPTH_LINES once the RTL opened its store (its
  initial block; cocotb tests start before it, when nothing is checked): a bad range raises
  IndexError and touches nothing.
- ``watch(line)`` / ``watch_count()``: the media count the writes accepted to one local line
  (``watch_line`` / ``watch_count`` in the RTL, over VPI), so a test can act right after the
  device issued a given write (the crash campaign cuts power there) by polling a counter.
- ``power_fail(...)`` raises the media's ``power_fail`` for a number of clock cycles (the
  device's reset is the caller's business).
"""
from __future__ import annotations

import ctypes
from typing import Iterable

import numpy as np
from cocotb.triggers import RisingEdge

from hw.common.cxl_mem import LINE_BITS, LINE_BYTES

# GPI set action "no delay" (cocotb.handle._GPISetAction.NO_DELAY = vpiNoDelay): the value
# is stored at once. Action 0 (deposit) is an inertial put in Verilator, applied only at
# the simulator's next evaluation, so a read right after a write would see the old value.
_NO_DELAY = 3
_LINE_MASK = (1 << LINE_BITS) - 1
_store_lib: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    """The store's C functions, exported by the simulator binary (sim/runner.py links C++
    sources with -rdynamic)."""
    global _store_lib
    if _store_lib is None:
        lib = ctypes.CDLL(None)
        if not hasattr(lib, "tcxl_pmem_store"):
            raise RuntimeError("this simulator has no PMEM line store: build it with "
                               "sim/rtl/pmem_store.cpp (sim.harness.MEDIA_SOURCES)")
        vp, u64, u8p = ctypes.c_void_p, ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint8)
        lib.tcxl_pmem_store.argtypes, lib.tcxl_pmem_store.restype = [ctypes.c_char_p], vp
        lib.tcxl_pmem_depth.argtypes, lib.tcxl_pmem_depth.restype = [vp], u64
        lib.tcxl_pmem_pages.argtypes, lib.tcxl_pmem_pages.restype = [vp], u64
        for fn in (lib.tcxl_pmem_read, lib.tcxl_pmem_write):
            fn.argtypes, fn.restype = [vp, u64, u64, u8p, u8p], ctypes.c_int
        _store_lib = lib
    return _store_lib


def _ptr(a: np.ndarray | None):
    return None if a is None else a.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))


class PmemChannel:
    """Backdoor access to one pmem_media instance's line store."""

    def __init__(self, handle):
        self.handle = handle
        self.name = handle._path           # the store's key (pmem_store.cpp: the path)
        self._store = _lib().tcxl_pmem_store(self.name.encode())

    @property
    def depth(self) -> int:
        """DEPTH_LINES once the RTL opened the store, else 0."""
        return _lib().tcxl_pmem_depth(self._store)

    def pages_allocated(self) -> int:
        """Store pages (1024 lines each) allocated so far: the model's memory for this channel."""
        return _lib().tcxl_pmem_pages(self._store)

    def _check(self, first: int, count: int, rc: int) -> None:
        if rc != 0:
            raise IndexError(f"{self.name}: lines {first}..{first + count - 1} outside the media "
                             f"({self.depth} lines)")

    def read_lines(self, first: int, count: int, with_poison: bool = False):
        """Lines ``first..first+count-1`` as a (count, 64) uint8 array (and their poison bits
        as a bool array when ``with_poison``)."""
        if first < 0 or count < 0:
            raise IndexError(f"{self.name}: negative line range {first}, {count}")
        data = np.empty((count, LINE_BYTES), dtype=np.uint8)
        poison = np.empty(count, dtype=np.uint8) if with_poison else None
        self._check(first, count, _lib().tcxl_pmem_read(self._store, first, count, _ptr(data), _ptr(poison)))
        return (data, poison.astype(bool)) if with_poison else data

    def write_lines(self, first: int, data, poison=None) -> None:
        """Overwrite lines from ``first`` with ``data`` ((n, 64) or n*64 uint8 values); poison
        bits from ``poison`` (n bools), cleared when it is None."""
        data = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1, LINE_BYTES)
        n = data.shape[0]
        if first < 0:
            raise IndexError(f"{self.name}: negative line {first}")
        flags = None if poison is None else np.ascontiguousarray(poison, dtype=np.uint8)
        if flags is not None and flags.shape != (n,):
            raise ValueError(f"poison must have one entry per line ({n}), got shape {flags.shape}")
        self._check(first, n, _lib().tcxl_pmem_write(self._store, first, n, _ptr(data), _ptr(flags)))

    def peek(self, line: int) -> int:
        """The line's 64 bytes as an int, byte 0 in bits 7:0."""
        return int.from_bytes(self.read_lines(line, 1).tobytes(), "little")

    def poke(self, line: int, value: int, poison: bool = False) -> None:
        """Overwrite the whole line and its poison bit, at once."""
        if not 0 <= value <= _LINE_MASK:
            raise ValueError(f"line value out of range: {value:#x}")
        self.write_lines(line, np.frombuffer(value.to_bytes(LINE_BYTES, "little"), dtype=np.uint8),
                         [poison])

    def peek_poison(self, line: int) -> bool:
        return bool(self.read_lines(line, 1, with_poison=True)[1][0])

    def load(self, start_line: int, values: Iterable[int]) -> None:
        """Poke consecutive lines (poison cleared) from ``start_line``."""
        self.write_lines(start_line, lines_to_array(list(values)))

    def dump(self, start_line: int, count: int) -> list[int]:
        return array_to_lines(self.read_lines(start_line, count))

    def watch(self, line: int | None) -> None:
        """Count the writes accepted to local ``line`` from now on (None: watch nothing)."""
        value = (1 << 32) - 1 if line is None else line
        self.handle.watch_line._handle.set_signal_val_binstr(_NO_DELAY, format(value, "032b"))

    def log_writes(self, on: bool = True) -> None:
        """Print every write the media accept (local line, first data word, cycle) on the
        simulator's standard output; replaces any ``watch``. A debugging aid."""
        value = (1 << 32) - 2 if on else (1 << 32) - 1
        self.handle.watch_line._handle.set_signal_val_binstr(_NO_DELAY, format(value, "032b"))

    def watch_count(self) -> int:
        return int(self.handle.watch_count._handle.get_signal_val_binstr(), 2)


def lines_to_array(values: list[int]) -> np.ndarray:
    """Line ints (byte 0 = bits 7:0) as an (n, 64) uint8 array."""
    for v in values:
        if not 0 <= v <= _LINE_MASK:
            raise ValueError(f"line value out of range: {v:#x}")
    blob = b"".join(v.to_bytes(LINE_BYTES, "little") for v in values)
    return np.frombuffer(blob, dtype=np.uint8).reshape(len(values), LINE_BYTES)


def array_to_lines(data: np.ndarray) -> list[int]:
    """An (n, 64) uint8 array as line ints."""
    raw = np.ascontiguousarray(data, dtype=np.uint8).tobytes()
    return [int.from_bytes(raw[i:i + LINE_BYTES], "little") for i in range(0, len(raw), LINE_BYTES)]


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
