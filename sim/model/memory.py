"""Reference model of device memory: the scoreboard's expectation (numpy).

``MemoryModel`` holds the durable image (lines x 64 bytes, uint8, sparse: pages allocated when
written) plus a poison bit per line,
and applies writes with byte enables and the poison rule of the PMEM media:
a poisoned write poisons the line; a full-line (all 64 bytes) clean write clears the poison;
a partial clean write leaves it.

``VersionedMemory`` adds what concurrency needs: for every line the sequence of versions
written (in acceptance order at the CXL port), so a read can be checked against exactly the
values it may legally return: the version current when the read was accepted, or any later
one written before the read completed (Req and RwD are unordered in CXL; a later write may
overtake an earlier read at the media).
"""
from __future__ import annotations

import numpy as np

LINE = 64
FULL_STRB = (1 << LINE) - 1


def strb_to_mask(strb: int) -> np.ndarray:
    """64-bit byte-enable -> bool[64], byte 0 first."""
    return ((strb >> np.arange(LINE, dtype=np.uint64)) & 1).astype(bool) if strb != FULL_STRB \
        else np.ones(LINE, dtype=bool)


def int_to_line(value: int) -> np.ndarray:
    return np.frombuffer(value.to_bytes(LINE, "little"), dtype=np.uint8).copy()


def line_to_int(line: np.ndarray) -> int:
    return int.from_bytes(line.tobytes(), "little")


def merge_line(old: int, new: int, strb: int) -> int:
    """Bytes of ``new`` where ``strb`` is set, else bytes of ``old`` (512-bit ints)."""
    if strb == FULL_STRB:
        return new
    mask = int.from_bytes(bytes(0xFF if (strb >> i) & 1 else 0 for i in range(LINE)), "little")
    return (old & ~mask) | (new & mask)


def next_poison(old: bool, poison: bool, strb: int) -> bool:
    if poison:
        return True
    return False if strb == FULL_STRB else old


class MemoryModel:
    """``lines`` lines, zero until written, held in pages of PAGE_LINES allocated on the first
    write that is not all zero: a model of a gigabyte device costs what was touched."""

    PAGE_LINES = 1024

    def __init__(self, lines: int):
        self.lines = lines
        self._data: dict[int, np.ndarray] = {}      # page -> (PAGE_LINES, 64) uint8
        self._poison: dict[int, np.ndarray] = {}    # page -> (PAGE_LINES,) bool

    def _check(self, first: int, count: int) -> None:
        if first < 0 or count < 0 or first + count > self.lines:
            raise IndexError(f"lines {first}..{first + count - 1} outside the memory ({self.lines} lines)")

    def _page(self, no: int) -> tuple[np.ndarray, np.ndarray]:
        if no not in self._data:
            self._data[no] = np.zeros((self.PAGE_LINES, LINE), dtype=np.uint8)
            self._poison[no] = np.zeros(self.PAGE_LINES, dtype=bool)
        return self._data[no], self._poison[no]

    def _spans(self, first: int, count: int):
        """(page, offset in page, offset in the range, lines) covering first..first+count-1."""
        done = 0
        while done < count:
            no, i = divmod(first + done, self.PAGE_LINES)
            n = min(count - done, self.PAGE_LINES - i)
            yield no, i, done, n
            done += n

    def read(self, line: int) -> tuple[int, bool]:
        self._check(line, 1)
        no, i = divmod(line, self.PAGE_LINES)
        if no not in self._data:
            return 0, False
        return line_to_int(self._data[no][i]), bool(self._poison[no][i])

    def write(self, line: int, value: int, strb: int = FULL_STRB, poison: bool = False):
        old, old_poison = self.read(line)
        data, flags = self._page(line // self.PAGE_LINES)
        data[line % self.PAGE_LINES] = int_to_line(merge_line(old, value, strb))
        flags[line % self.PAGE_LINES] = next_poison(old_poison, poison, strb)

    def load(self, first: int, lines: np.ndarray, poison: np.ndarray | None = None) -> None:
        """Lines from ``first`` take ``lines`` ((n, 64) uint8) and ``poison`` (n bools; None:
        cleared), whole lines at once."""
        lines = np.asarray(lines, dtype=np.uint8).reshape(-1, LINE)
        self._check(first, lines.shape[0])
        for no, i, at, n in self._spans(first, lines.shape[0]):
            chunk = lines[at:at + n]
            flags = None if poison is None else np.asarray(poison[at:at + n], dtype=bool)
            if no not in self._data and not chunk.any() and (flags is None or not flags.any()):
                continue
            data, pflags = self._page(no)
            data[i:i + n] = chunk
            pflags[i:i + n] = False if flags is None else flags

    def dump(self, first: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Lines first..first+count-1: ((count, 64) uint8, (count,) bool poison)."""
        self._check(first, count)
        out = np.zeros((count, LINE), dtype=np.uint8)
        flags = np.zeros(count, dtype=bool)
        for no, i, at, n in self._spans(first, count):
            if no in self._data:
                out[at:at + n] = self._data[no][i:i + n]
                flags[at:at + n] = self._poison[no][i:i + n]
        return out, flags

    def pages_allocated(self) -> int:
        return len(self._data)


class Version(tuple):
    """One version of a line: the line after a write, and the write itself."""
    __slots__ = ()
    seq = property(lambda self: self[0])
    value = property(lambda self: self[1])
    poison = property(lambda self: self[2])
    data = property(lambda self: self[3])       # the write's data and byte enables
    strb = property(lambda self: self[4])


def word_outcomes(base: int, writes: list[tuple[int, int]], word: int) -> set[int]:
    """Possible values of 8-byte ``word`` after ``writes`` [(data, strb)] were in flight at a
    power failure on top of ``base``: each write, in order, lands in that word or not
    (architecture.md §6: a write in flight is torn at 8-byte granularity)."""
    shift = 64 * word
    mask64 = (1 << 64) - 1
    outcomes = {(base >> shift) & mask64}
    for data, strb in writes:
        bytes_strb = (strb >> (8 * word)) & 0xFF
        if not bytes_strb:
            continue
        bmask = int.from_bytes(bytes(0xFF if (bytes_strb >> i) & 1 else 0 for i in range(8)),
                               "little")
        new = (data >> shift) & bmask
        outcomes |= {(o & ~bmask) | new for o in outcomes}
    return outcomes


class VersionedMemory:
    """Versions per line (``Version``), seq = acceptance order at the port.

    The first write to a line records the line's earlier value as version ``seq = -1``.
    """

    def __init__(self, base: MemoryModel):
        self.base = base
        self.versions: dict[int, list[tuple[int, int, bool]]] = {}

    def write(self, seq: int, line: int, value: int, strb: int, poison: bool) -> None:
        hist = self.versions.get(line)
        if hist is None:
            old, old_poison = self.base.read(line)
            hist = self.versions[line] = [Version((-1, old, old_poison, old, FULL_STRB))]
        _, old, old_poison = hist[-1][:3]
        new_value = merge_line(old, value, strb)
        new_poison = next_poison(old_poison, poison, strb)
        hist.append(Version((seq, new_value, new_poison, value, strb)))
        self.base.write(line, new_value, poison=new_poison)   # the image: newest version

    def prune(self, oldest_live_seq: int) -> None:
        """Forget versions no read can still see: per line, keep the newest version older
        than ``oldest_live_seq`` (the oldest read still waiting) and everything newer."""
        for hist in self.versions.values():
            keep = 0
            for i, v in enumerate(hist):
                if v.seq < oldest_live_seq:
                    keep = i
            if keep:
                del hist[:keep]

    def legal_reads(self, line: int, accepted_seq: int, completed_seq: int):
        """Values a read accepted as message ``accepted_seq`` and answered when
        ``completed_seq`` messages had been accepted may return: the version current at
        acceptance and any version written after it and before completion."""
        if not 0 <= line < self.base.lines:
            raise IndexError(f"line {line} outside the reference memory (0..{self.base.lines - 1})")
        hist = self.versions.get(line)
        if hist is None:
            return [self.base.read(line)]
        legal = []
        for seq, value, poison, _, _ in hist:
            if seq < accepted_seq:
                legal = [(value, poison)]
            elif seq < completed_seq:
                legal.append((value, poison))
        return legal
