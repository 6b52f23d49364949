"""What the device's CXL.mem CSR counters must read after the traffic a test sent.

``CxlMemCounterModel(monitor, d2h_idle=True)`` listens to the host BFM like the monitor
(``on_m2s`` for every accepted M2S message, ``on_s2m`` for every S2M message) and keeps the
expected value of each counter, written from the counter descriptions of the register map
(hw/cxl_controller/csr_map.py docs), not from the RTL:
- ERR_OUT_OF_WINDOW_RD: MemRd, MemRdData, MemInv, MemInvNT the window does not decode.
- ERR_OUT_OF_WINDOW_WR: MemWr, MemWrPtl the window does not decode (poisoned or not).
- ERR_UNSUPPORTED_REQ / _RWD: every other Req (not MemSpecRd, MemRdFwd, MemWrFwd) / RwD
  opcode, inside or outside the window (BIConflict included).
- ERR_UNEXPECTED_FWD: MemRdFwd and MemWrFwd when the device has no D2H request outstanding
  (``d2h_idle``: a test without CXL.cache traffic).
- ERR_POISON_WR: poisoned MemWr/MemWrPtl inside the window. ERR_POISON_RD: DRS MemData with
  Poison = 1. ERR_MEDIA: 0 (the fuzz injects no media errors).
- STAT_RD_LINES / STAT_WR_LINES: reads / writes inside the window. STAT_SPEC_RD_DROPPED: every
  MemSpecRd. STAT_INV: MemInv and MemInvNT inside the window.
``mismatches(read)`` compares with the values read back (``read``: name -> int; counters are
32 bits and wrap) and returns one line per difference.
"""
from __future__ import annotations

from hw.common.cxl_mem import M2SReqOpcode as Q, DRSOpcode as D
from .cxl_mem_host_rules import RWD_SUPPORTED

COUNTERS = ("ERR_OUT_OF_WINDOW_RD", "ERR_OUT_OF_WINDOW_WR", "ERR_UNSUPPORTED_REQ",
            "ERR_UNSUPPORTED_RWD", "ERR_UNEXPECTED_FWD", "ERR_POISON_WR", "ERR_POISON_RD",
            "ERR_MEDIA", "STAT_RD_LINES", "STAT_WR_LINES", "STAT_SPEC_RD_DROPPED", "STAT_INV")
COUNTER_BITS = 32

_READS = frozenset({Q.MEM_RD.value, Q.MEM_RD_DATA.value})
_INVS = frozenset({Q.MEM_INV.value, Q.MEM_INV_NT.value})
_FWDS = frozenset({Q.MEM_RD_FWD.value, Q.MEM_WR_FWD.value})
_SPEC = Q.MEM_SPEC_RD.value


def counter_events(kind: str, fields: dict, inside: bool, d2h_idle: bool = True) -> tuple[str, ...]:
    """The counters one accepted M2S message increments (``inside``: the window decodes it)."""
    op = fields["opcode"]
    if kind == "req":
        if op in _READS:
            return ("STAT_RD_LINES",) if inside else ("ERR_OUT_OF_WINDOW_RD",)
        if op in _INVS:
            return ("STAT_INV",) if inside else ("ERR_OUT_OF_WINDOW_RD",)
        if op == _SPEC:
            return ("STAT_SPEC_RD_DROPPED",)
        if op in _FWDS:
            return ("ERR_UNEXPECTED_FWD",) if d2h_idle else ()
        return ("ERR_UNSUPPORTED_REQ",)
    if op not in RWD_SUPPORTED:
        return ("ERR_UNSUPPORTED_RWD",)
    if not inside:
        return ("ERR_OUT_OF_WINDOW_WR",)
    return ("STAT_WR_LINES", "ERR_POISON_WR") if fields["poison"] else ("STAT_WR_LINES",)


class CxlMemCounterModel:
    def __init__(self, monitor, *, d2h_idle: bool = True):
        self.monitor = monitor
        self.d2h_idle = d2h_idle
        self.expected = dict.fromkeys(COUNTERS, 0)

    def on_m2s(self, seq, cycle, kind, fields):
        for name in counter_events(kind, fields, self.monitor.decodes(fields["addr"]), self.d2h_idle):
            self.expected[name] += 1

    def on_s2m(self, cycle, kind, fields):
        if kind == "drs" and fields["opcode"] == D.MEM_DATA.value and fields["poison"]:
            self.expected["ERR_POISON_RD"] += 1

    def mismatches(self, read: dict[str, int]) -> list[str]:
        mask = (1 << COUNTER_BITS) - 1
        return [f"CSR {name} reads {read[name]}, expected {want & mask}"
                for name, want in self.expected.items() if read[name] != want & mask]
