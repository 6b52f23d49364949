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


class CoherenceChecker:
    def __init__(self, initial=None):
        self.initial = initial or (lambda line: 0)
        self.writes: dict[int, list[tuple[int, int, int]]] = {}   # line -> [(start, end, value)]
        self.reads_checked = 0
        self.violations: list[str] = []

    def write(self, line: int, value: int, start: int, end: int) -> None:
        self.writes.setdefault(line, []).append((start, end, value))

    def legal(self, line: int, start: int, end: int) -> set[int]:
        writes = self.writes.get(line, [])
        # The initial value counts as a write that ended before time began.
        cands = [(-2, -1, self.initial(line))] + [w for w in writes if w[0] <= end]
        legal = set()
        for _start, we, value in cands:
            overwritten = any(s2 > we and e2 < start for s2, e2, _ in cands)
            if not overwritten:
                legal.add(value)
        return legal

    def read(self, line: int, value: int, start: int, end: int, who: str = "read") -> bool:
        self.reads_checked += 1
        legal = self.legal(line, start, end)
        if value in legal:
            return True
        self.violations.append(
            f"{who} of line {line:#x} over cycles [{start}, {end}] returned {value:#x}; "
            f"legal: {', '.join(hex(v) for v in sorted(legal))}")
        return False
