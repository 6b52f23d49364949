"""The CXL.mem fuzz's stimulus: a seeded stream of M2S messages (pure Python, no simulator).

``choose_window(rng, capacity_lines)`` picks the HDM window (base line, size in lines) of a
run, one of ``WINDOW_KINDS``: "split" (64 lines left outside at each end of the device),
"oversized" (twice the device: lines past the capacity inside the window do not decode),
"high" (a base between 2^30 and 2^45 lines, half the device: wide address compares).

``generate(rng, n, window, capacity_lines)`` yields ``n`` ``FuzzMessage(kind, fields, gap)``:
``kind`` "req" or "rwd", ``fields`` the M2SReq / M2SRwD fields as raw integers (any value
that fits the field, reserved encodings included), ``gap`` idle cycles the feeder waits
before offering it. The stream depends on the rng only (not on the device), so a seed
replays it exactly.
- The first min(n, 32) messages are every M2S Req opcode value (16) and every RwD opcode
  value (16, 9 of them reserved) once, shuffled: any run of 32 or more covers them all.
- Then a mix (``MIX``): MemRd / MemRdData, MemWr, MemWrPtl (byte enables: all, none, one
  byte, one 8-byte word, or random), MemInv / MemInvNT, MemSpecRd, same-line race clusters
  (2-4 reads and writes to one line back to back, no gap), the other Req opcodes (TEE,
  MemClnEvct*, MemRdFwd / MemWrFwd with no D2H request behind them) and every other RwD
  code (BIConflict, MemRdFill, TEE writes, reserved codes).
- Header fields: SnpType mostly 000-011, else any of 000-111; MetaField mostly Meta0-State or
  No-Op, else any of 00-11 (EMS and the reserved 10 included); MetaValue any; LD-ID mostly 0;
  TC any; RwD Poison ~4% (on every RwD opcode), TRP random, byte enables random even on
  MemWr (which must ignore them), data random or all-ones / all-zeros.
- Addresses (sim/tb/cxl_mem_stim.py ``pick_line``): ~12% outside the HDM window (below, just
  below, just above, far above), ~44% on 64 hot lines, the rest anywhere in the window.
- Tags: ~15% repeat one of the last 8 Tags (likely still outstanding), else random 16 bits.
- Gaps: mostly 0 (back to back), sometimes 1-3 cycles, rarely 8-200 (the device drains).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterator

from hw.common.cxl_mem import (M2SReqOpcode as Q, M2SRwDOpcode as W, SnpType, MetaField, LINE_BITS,
                               LINE_BYTES, TAG_BITS, LD_ID_BITS)
from ..checkers.cxl_mem_host_rules import REQ_SUPPORTED, RWD_SUPPORTED
from .cxl_mem_stim import pick_line

OPCODE_VALUES = 16                      # both MemOpcode fields are 4 bits
FULL_STRB = (1 << LINE_BYTES) - 1
ALL_ONES = (1 << LINE_BITS) - 1
HOT_LINES = 64
OUTSIDE = 0.12

# Req and RwD opcodes outside the device's supported set (what the "other" actions draw).
REQ_OTHER = tuple(sorted(set(range(OPCODE_VALUES)) - REQ_SUPPORTED | {Q.MEM_RD_FWD.value, Q.MEM_WR_FWD.value}))
RWD_OTHER = tuple(sorted(set(range(OPCODE_VALUES)) - RWD_SUPPORTED))

# (action, weight)
MIX = (("read", 28), ("write", 14), ("write_partial", 16), ("invalidate", 6), ("spec_read", 4),
       ("race", 10), ("req_other", 11), ("rwd_other", 11))
_ACTIONS = tuple(a for a, _ in MIX)
_WEIGHTS = tuple(w for _, w in MIX)
_LEGAL_SNP = tuple(s.value for s in SnpType)
_COMMON_META = (MetaField.META0_STATE.value, MetaField.NO_OP.value)


WINDOW_KINDS = ("split", "oversized", "high")


def choose_window(rng: random.Random, capacity_lines: int) -> tuple[str, int, int]:
    """(kind, base line, size in lines) of the HDM window for one run."""
    kind = rng.choice(WINDOW_KINDS)
    if kind == "split":
        return kind, 64, capacity_lines - 128
    if kind == "oversized":
        return kind, 128, 2 * capacity_lines
    return kind, rng.randrange(1 << 30, 1 << 45), capacity_lines // 2


def opcode_name(kind: str, code: int) -> str:
    """``req:MEM_RD``, ``rwd:MEM_WR_PTL``, ``rwd:RESERVED_0011``: the result's opcode keys."""
    enum_cls = Q if kind == "req" else W
    name = enum_cls(code).name if code in enum_cls._value2member_map_ else f"RESERVED_{code:04b}"
    return f"{kind}:{name}"


ALL_OPCODE_NAMES = tuple(opcode_name(k, c) for k in ("req", "rwd") for c in range(OPCODE_VALUES))


@dataclass(frozen=True)
class FuzzMessage:
    kind: str                # "req" or "rwd"
    fields: dict
    gap: int = 0


class _Gen:
    def __init__(self, rng: random.Random, window, capacity_lines: int):
        self.rng = rng
        self.window = window
        self.capacity_lines = capacity_lines
        self.hot = [rng.randrange(min(window[1], capacity_lines)) for _ in range(HOT_LINES)]
        self.recent_tags: list[int] = []

    def line(self) -> int:
        return pick_line(self.rng, self.window, self.capacity_lines, self.hot, outside=OUTSIDE)

    def hot_line(self) -> int:
        return self.window[0] + self.rng.choice(self.hot)

    def tag(self) -> int:
        rng = self.rng
        if self.recent_tags and rng.random() < 0.15:
            return rng.choice(self.recent_tags)
        t = rng.getrandbits(TAG_BITS)
        self.recent_tags = (self.recent_tags + [t])[-8:]
        return t

    def header(self, opcode: int, addr: int) -> dict:
        rng = self.rng
        return {"opcode": opcode,
                "snp_type": rng.choice(_LEGAL_SNP) if rng.random() < 0.8 else rng.randrange(8),
                "meta_field": rng.choice(_COMMON_META) if rng.random() < 0.75 else rng.randrange(4),
                "meta_value": rng.randrange(4),
                "tag": self.tag(), "addr": addr,
                "ld_id": 0 if rng.random() < 0.8 else rng.getrandbits(LD_ID_BITS),
                "tc": rng.randrange(4)}

    def data(self) -> int:
        r = self.rng.random()
        return ALL_ONES if r < 0.03 else 0 if r < 0.05 else self.rng.getrandbits(LINE_BITS)

    def strb(self) -> int:
        rng = self.rng
        k = rng.randrange(8)
        if k == 0:
            return FULL_STRB
        if k == 1:
            return 0
        if k == 2:
            return 1 << rng.randrange(LINE_BYTES)
        if k == 3:
            return 0xFF << (8 * rng.randrange(8))
        return rng.getrandbits(LINE_BYTES)

    def req(self, opcode: int, addr: int | None = None, gap: int = 0) -> FuzzMessage:
        return FuzzMessage("req", self.header(opcode, self.line() if addr is None else addr), gap)

    def rwd(self, opcode: int, addr: int | None = None, gap: int = 0, strb: int | None = None) -> FuzzMessage:
        rng = self.rng
        f = self.header(opcode, self.line() if addr is None else addr)
        f.update(poison=int(rng.random() < 0.04), trp=rng.getrandbits(1),
                 byte_enable=self.strb() if strb is None else strb, data=self.data())
        return FuzzMessage("rwd", f, gap)

    def gap(self) -> int:
        r = self.rng.random()
        return 0 if r < 0.88 else self.rng.randrange(1, 4) if r < 0.97 else self.rng.randrange(8, 201)

    def action(self, action: str) -> list[FuzzMessage]:
        rng = self.rng
        gap = self.gap()
        if action == "read":
            return [self.req(Q.MEM_RD.value if rng.random() < 0.75 else Q.MEM_RD_DATA.value, gap=gap)]
        if action == "write":
            return [self.rwd(W.MEM_WR.value, gap=gap)]
        if action == "write_partial":
            return [self.rwd(W.MEM_WR_PTL.value, gap=gap)]
        if action == "invalidate":
            return [self.req(rng.choice((Q.MEM_INV.value, Q.MEM_INV_NT.value)), gap=gap)]
        if action == "spec_read":
            return [self.req(Q.MEM_SPEC_RD.value, gap=gap)]
        if action == "req_other":
            return [self.req(rng.choice(REQ_OTHER), gap=gap)]
        if action == "rwd_other":
            return [self.rwd(rng.choice(RWD_OTHER), gap=gap)]
        assert action == "race", action
        # One line, reads and writes back to back on both channels: the device sees them in
        # flight together (the scoreboard's same-line rules decide what each read may return).
        line = self.hot_line()
        out = []
        for i in range(rng.randrange(2, 5)):
            g = gap if i == 0 else 0
            if rng.random() < 0.5:
                out.append(self.req(Q.MEM_RD.value if rng.random() < 0.8 else Q.MEM_RD_DATA.value, line, g))
            else:
                out.append(self.rwd(rng.choice((W.MEM_WR.value, W.MEM_WR_PTL.value)), line, g))
        return out


def generate(rng: random.Random, n: int, window, capacity_lines: int) -> Iterator[FuzzMessage]:
    """``n`` messages (see the module docstring); ``window`` = (base line, size in lines, enabled)."""
    g = _Gen(rng, window, capacity_lines)
    cover = [("req", c) for c in range(OPCODE_VALUES)] + [("rwd", c) for c in range(OPCODE_VALUES)]
    rng.shuffle(cover)
    sent = 0
    for kind, code in cover[:n]:
        yield g.req(code) if kind == "req" else g.rwd(code)
        sent += 1
    while sent < n:
        for msg in g.action(rng.choices(_ACTIONS, _WEIGHTS)[0]):
            if sent == n:
                return
            yield msg
            sent += 1
