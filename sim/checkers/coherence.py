"""Coherent value checker: every read returns a value the line could hold at that time.

Reads and writes are intervals of cycles, [start, end]: the operation took effect at some
unknown point inside (a device request is serialized between its issue and its response;
a host CPU store at one cycle). A read may return the value of any write that could be the
latest one at some point of the read's interval: a write w is a candidate when it started
no later than the read ended, unless another write certainly came after w (started after
w ended) and certainly before the read (ended before the read started). With writes to one
line serialized by the protocol, this is exact up to the unknown points inside intervals.
"""
from __future__ import annotations

import bisect


class CoherenceChecker:
    """``write``/``read`` record operations; ``check()`` judges every read against all writes.

    Judging at the end (``deferred=True``, the default for ``read``) matters: a write is
    known only when it completes, which can be after a read that already saw its value.
    """

    def __init__(self, initial=None):
        self.initial = initial or (lambda line: 0)
        self.writes: dict[int, list[tuple[int, int, int]]] = {}   # line -> [(start, end, value)]
        self.pending_reads: list[tuple[int, int, int, int, str]] = []
        self._sorted: dict[int, tuple] = {}
        self.reads_checked = 0
        self.violations: list[str] = []

    def write(self, line: int, value: int, start: int, end: int) -> None:
        self.writes.setdefault(line, []).append((start, end, value))

    def legal(self, line: int, start: int, end: int) -> set[int]:
        """Values a read over [start, end] may return.

        A write is ruled out exactly when it ended before ``latest``, the latest start among
        the writes that ended before the read began (that one certainly came after it and
        before the read). With the writes sorted by end and a running maximum of their starts,
        that is one bisection plus a scan of the few writes that ended after ``latest``.
        """
        ends, pre_max_start, by_end = self._index(line)
        k = bisect.bisect_left(ends, start)              # writes [0, k) ended before the read
        legal = set()
        if k == 0:
            legal.add(self.initial(line))                # nothing certainly overwrote it
            first = 0
        else:
            latest = pre_max_start[k - 1]
            first = bisect.bisect_left(ends, latest)     # writes that ended at or after it
        for ws, _we, value in by_end[first:]:
            if ws <= end:
                legal.add(value)
        return legal

    def _index(self, line: int):
        cached = self._sorted.get(line)
        writes = self.writes.get(line, [])
        if cached is None or cached[0] != len(writes):
            by_end = sorted(writes, key=lambda w: w[1])
            ends = [w[1] for w in by_end]
            pre, best = [], -1
            for w in by_end:
                best = max(best, w[0])
                pre.append(best)
            cached = (len(writes), ends, pre, by_end)
            self._sorted[line] = cached
        return cached[1], cached[2], cached[3]

    def record_read(self, line: int, value: int, start: int, end: int, who: str = "read") -> None:
        self.pending_reads.append((line, value, start, end, who))

    def check(self) -> int:
        """Judge every recorded read; returns the number of violations."""
        for args in self.pending_reads:
            self.read(*args)
        self.pending_reads.clear()
        return len(self.violations)

    def read(self, line: int, value: int, start: int, end: int, who: str = "read") -> bool:
        """Judge one read now, against the writes recorded so far."""
        self.reads_checked += 1
        legal = self.legal(line, start, end)
        if value in legal:
            return True
        self.violations.append(
            f"{who} of line {line:#x} over cycles [{start}, {end}] returned {value:#x}; "
            f"legal: {', '.join(hex(v) for v in sorted(legal))}")
        return False
