"""CXL.cache protocol monitor: checks 7 and 9-14 of ../shared/docs/cxl-reference.md.

It watches the six CXL.cache channels of one device and the M2S Req channel (for the HDM-D
forwards MemRdFwd/MemWrFwd). It knows the encodings only through hw/common/cxl_cache.py and
hw/common/cxl_mem.py, and judges messages against the reference tables, not against any RTL.

Listener interface (fields are the plain dicts ``StructCodec(layout).unpack`` produces):
- ``on_d2h(cycle, kind, fields)``, kind "req" (D2HReq), "rsp" (D2HRsp), "data" (D2HData);
- ``on_h2d(cycle, kind, fields)``, kind "req" (H2DReq, snoops), "rsp" (H2DRsp), "data" (H2DData);
- ``on_m2s(seq, cycle, kind, fields)``, as CxlMemMonitor.on_m2s; only kind "req" with
  MemRdFwd or MemWrFwd (M2SReq) is looked at, every other M2S message is ignored;
- ``finish(cycle)`` reports every transaction still open and closes them.
Messages are judged in call order. Messages of one cycle on different channels must be given
in the order the device sees them (the monitor cannot reorder them).

State: ``violations`` ("cycle N: what, which line/CQID/UQID"); ``host_violations``, the subset
the host caused (an H2D message for no live CQID or in the wrong phase, a reserved snoop opcode, a
broken host obligation, a bad Mem*Fwd, a request never answered), and ``device_violations``, the
rest (a test that injects illegal host messages expects exactly its own in ``host_violations``
and none in ``device_violations``); ``messages`` (CXL.cache messages
plus Mem*Fwd seen), ``outstanding`` (live D2H requests + pending snoops + D2H data still owed),
``device_bias_lines`` (lines flipped to device bias: a MemRdFwd completed a RdOwnNoData; the set
only grows, because a flip back is not visible on these channels), and ``coherence``, whose
``granted_state(line)`` is "I", "S", "E" or "M": the state the host granted and the monitor
tracks. "E" means "E, or silently modified to M": the device may write an E line without telling
anyone, so for E every answer that fits S, E or M is accepted, and DirtyEvict is allowed.

Checks, with the reference rows they come from ("ref" = cxl-reference.md):

9. Reads (ref §2 "D2H requests" table = CXL 3.2 Tables 3-22/3-23). Per CQID: RdCurr gets exactly
   one H2D data and no H2D response at all; RdOwn/RdShared/RdAny get exactly one H2D data and
   exactly one GO; Read0 (RdOwnNoData, CLFlush, CacheFlushed) get one GO and no data. The GO
   state must be one the table lists (RdOwn E/M/I/Err, RdShared S/I/Err, RdAny S/E/M/I/Err,
   RdOwnNoData E/Err, CLFlush I/Err, CacheFlushed I). H2D responses and data must name a live
   CQID; a D2H request must not reuse a live CQID. "Exactly 64B" is "exactly one data message":
   at this transaction level one message is one whole line (ChunkValid is not a size).
10. Writes (same table; ref "Dirty-eviction flow"). Allowed H2D responses: ItoMWr/WrCur
   GO_WritePull or GO_ERR_WritePull; CleanEvict GO_WritePull or GO_WritePull_Drop; DirtyEvict
   GO_WritePull or GO_ERR_WritePull; CleanEvictNoData GO-I; WOWrInv(F) Fast_GO_WritePull (or
   GO_ERR_WritePull) then ExtCmp; WrInv WritePull then GO-I (or GO-Err). Any other response
   opcode (including Fast_GO, reserved in CXL 3.2) is a violation. A response or data the
   device must drop (unknown CQID, wrong opcode, a second GO, pull or data, WrInv's GO before
   its pull) is reported once and not applied, so the tracked state stays the device's. Each pull (WritePull,
   GO_WritePull, Fast_GO_WritePull, GO_ERR_WritePull) is owed exactly one D2H data message to
   the UQID in its RspData, error pulls included (the host drops that data); data after
   GO_WritePull_Drop or for CleanEvictNoData answers no pull and is flagged. Order: WrInv's GO
   and WOWrInv's ExtCmp must come after their pull.
11. Caching (ref §2 "Read-for-ownership flow" step 3). A GO for RdShared/RdOwn/RdAny/RdOwnNoData
   sets the line's tracked state to the granted S/E/M; GO-I and GO-Err mean use once (state I).
   CLFlush, CleanEvictNoData and the other writes leave the line I at their GO; evicts leave it I
   at their GO_WritePull(_Drop) (the device gives up snoop ownership there, so the dirty data is
   then tracked as the pull's owed data). CacheFlushed states the device cache is empty: all
   lines become I at the request. "Cached only after its GO": an evict of a line the device does
   not hold (never granted, or taken by a snoop answer), and a snoop answer claiming a hit
   (RspIHitSE, RspSHitSE, *Fwd*, RspVHitV) on a line tracked I, are violations. "GO-M never
   dropped silently": a line granted M leaves M only by a DirtyEvict (its pull) or a *Fwd* snoop
   answer; CleanEvict/CleanEvictNoData of an M line, a
   RspIHitI/RspIHitSE/RspSHitSE to an M line, a CacheFlushed while a line is in M without a live
   DirtyEvict, and a GO that moves an M line to S or I without a live DirtyEvict (a re-read or a
   CLFlush of a dirty line) are violations. A DirtyEvict of a line tracked S is a violation (only
   E/M lines can be dirty).
12. Snoops (ref §2 "H2D snoops and legal answers" = Table 3-26; "Host obligations" = CXL 3.2
   §3.2.5). Host: at most one pending snoop per line (pending = sent, not yet answered); no
   snoop to a line while a read to it has its H2D data but not its GO; no GO-carrying response
   (GO, GO_WritePull(_Drop), GO_ERR_WritePull, Fast_GO_WritePull) and no WritePull for a request
   to a line with a pending snoop; a snoop UQID is not reused while pending. Device: the answer
   is in LEGAL_SNOOP_RESPONSES[snoop] and fits the state tracked when the snoop came (IHitI:
   I/S/E; IHitSE and SHitSE: S/E; SFwdM and IFwdM: E/M; VHitV and VFwdV: S/E/M); an answer that
   is illegal for the snoop is reported once, without the state check. The state then becomes I (IHitI, IHitSE,
   IFwdM), S (SHitSE, SFwdM) or stays (VHitV, VFwdV). Only *Fwd* answers carry data: exactly one
   D2H data to the snoop's UQID, which may come before the answer (the device knows the UQID
   from the snoop; D2H Rsp and Data are independent channels); pull data, in contrast, cannot
   precede its pull.
13. Device obligations (ref "Device obligations", "Dirty-eviction flow" step 3). Bogus on the
   data of a CleanEvict/DirtyEvict pull only if, between the evict request and its pull, a
   snoop to the line was SnpInv or changed its tracked state (covers SnpData answered by giving
   up M/E). Evicts: no second CleanEvict/DirtyEvict/CleanEvictNoData to a line while one is live
   or after one completed until a new cacheable read of the line is granted (a GO S/E/M or a
   MemRdFwd). Reads: the reference says reads other than RdCurr and CLFlush "wait for all
   earlier GOs to that line", so a RdOwn/RdShared/RdAny/RdOwnNoData to a line while any earlier
   live request to it (read, CLFlush, evict, write) still waits for its GO is a violation
   (the GO of evicts and ItoMWr/WrCur/WOWrInv is their GO-carrying pull), except RdOwnNoData
   after RdOwnNoData (HDM-D). RdCurr gets no GO and never blocks.
14. Device memory (ref §3 HDM-D; "Testbench checks" 7 and 14). With ``device_hdm`` = (first
   line, number of lines): no CleanEvict/DirtyEvict/CleanEvictNoData to those lines. A MemRdFwd
   or MemWrFwd must carry Tag = the CQID of a live D2H request to the same line inside the
   device memory (check 7, second half), which it completes instead of any H2D answer (a Fwd
   for a request that already got H2D responses is a violation): MemRdFwd completes RdCurr,
   RdOwn, RdShared, RdAny, RdOwnNoData; MemWrFwd completes WOWrInv(F), ItoMWr, WrCur. MemRdFwd
   grants as a GO would (RdShared S; RdOwn E; RdAny S if MetaValue is Shared, else E; RdCurr
   nothing). A MemRdFwd completing a RdOwnNoData flips the line to device bias: it joins
   ``device_bias_lines`` and is tracked E (owned by the device).

Interpretations where the reference is open (the permissive reading unless noted):
- Fwd data may precede the snoop answer; pull data may not precede its pull (strict: the device
  learns the UQID from the pull).
- "No WritePull concurrent with a snoop" is checked one way: a pull is flagged if a snoop to its
  line is pending; a snoop after a pull whose data is still owed is not flagged.
- A snoop is pending until its answer, not until its Fwd data. The answer is judged against the
  state tracked when the snoop came (legally no GO changes it meanwhile; after a host error this
  avoids a second report). A snoop that reuses a pending snoop's UQID is reported, and the older
  snoop is forgotten (answers carry only the UQID, so it can no longer be matched).
- Read serialization follows the reference's "wait for all earlier GOs to that line" (stricter
  than "wait for earlier reads' GOs", and written so in the reference): a read issued while an
  evict or CLFlush to its line waits for its GO is flagged.
- Bogus is never required, only allowed; Bogus on data other than evict data is not checked.
- An evict request that arrives after snoop answers that changed its line (and before any
  new grant of the line or any other D2H request to it) is accepted as a crossing, judged by
  the state before the first of those snoops: the device may have queued it before the snoops
  came (D2H Req held not ready across several of them), and D2H Req and Rsp are separate
  channels. Its data may then be Bogus.
- A reserved snoop opcode is a host error; the answer expected is this project's defined one,
  RspIHitI with no data and no state change (anything else is a device violation).
- RspVHitV and RspVFwdV (SnpCur only) are accepted for any held state, M included.
- Multiple RdOwnNoData are accepted anywhere, not only to device memory.
- GO-Err is accepted for WrInv (the table lists only GO-I there).
- A Fwd to a line outside ``device_hdm`` is a violation (strict: Fwds exist only for device
  memory, ref §3); without ``device_hdm`` that part is not checked.

Not implemented: check 7's first half (no M2S Req to X passes an earlier Mem*Fwd to X; that is
ordering inside the device, not visible on these channels); the HDM-DB rules (only ItoMWr,
WrCur, WrInv to own memory; BISnp), since this device is HDM-D; poison and data values (the
scoreboard's job); the GO-Err bit of H2D data; the MetaValue of a MemRdFwd is not checked
against the request.
"""
from __future__ import annotations

from hw.common.cxl_cache import (D2HReqOpcode as DQ, D2HRspOpcode as DR, H2DReqOpcode as HQ,
                                 H2DRspOpcode as HR, GOState, LEGAL_SNOOP_RESPONSES,
                                 FORWARDING_RESPONSES, READS_WITH_DATA, READ0, WRITES)
from hw.common.cxl_mem import M2SReqOpcode, MetaValue

# ---- plain ints for the per-message path (enum attribute access is slow in Python)
_I, _S, _E, _M = 0, 1, 2, 3                       # tracked states
_STATE_NAME = "ISEM"

_NEED_DATA, _NEED_GO, _NEED_PULL, _NEED_EXTCMP = 1, 2, 4, 8
_NEED_NAMES = ((_NEED_DATA, "H2D data"), (_NEED_GO, "GO"), (_NEED_PULL, "write pull"),
               (_NEED_EXTCMP, "ExtCmp"))

_RD_CURR, _RD_OWN, _RD_SHARED, _RD_ANY = (DQ.RD_CURR.value, DQ.RD_OWN.value, DQ.RD_SHARED.value,
                                          DQ.RD_ANY.value)
_RD_OWN_NO_DATA, _CL_FLUSH, _CACHE_FLUSHED = (DQ.RD_OWN_NO_DATA.value, DQ.CL_FLUSH.value,
                                              DQ.CACHE_FLUSHED.value)
_CLEAN_EVICT, _DIRTY_EVICT, _CLEAN_EVICT_NO_DATA = (DQ.CLEAN_EVICT.value, DQ.DIRTY_EVICT.value,
                                                    DQ.CLEAN_EVICT_NO_DATA.value)
_WR_INV = DQ.WR_INV.value
_WO_WR_INV = frozenset({DQ.WO_WR_INV.value, DQ.WO_WR_INV_F.value})
_EVICTS = frozenset({_CLEAN_EVICT, _DIRTY_EVICT, _CLEAN_EVICT_NO_DATA})
_EVICTS_WITH_DATA = frozenset({_CLEAN_EVICT, _DIRTY_EVICT})
_CACHEABLE_READS = frozenset({_RD_OWN, _RD_SHARED, _RD_ANY, _RD_OWN_NO_DATA})
_SERIALIZED_READS = _CACHEABLE_READS          # CLFlush/RdCurr are exempt; CacheFlushed has no line
_READS_WITH_GO = frozenset(o.value for o in READS_WITH_DATA) - {_RD_CURR}
_FULL_LINE_WRITES = frozenset(o.value for o in WRITES) - _EVICTS     # leave the line I at GO
_RD_FWD_COMPLETES = frozenset(o.value for o in READS_WITH_DATA) | {_RD_OWN_NO_DATA}
_WR_FWD_COMPLETES = _WO_WR_INV | {DQ.ITOM_WR.value, DQ.WR_CUR.value}

_GO, _WRITE_PULL, _GO_WRITE_PULL, _EXT_CMP = (HR.GO.value, HR.WRITE_PULL.value,
                                              HR.GO_WRITE_PULL.value, HR.EXT_CMP.value)
_GO_WRITE_PULL_DROP, _FAST_GO, _FAST_GO_WRITE_PULL, _GO_ERR_WRITE_PULL = (
    HR.GO_WRITE_PULL_DROP.value, HR.FAST_GO.value, HR.FAST_GO_WRITE_PULL.value,
    HR.GO_ERR_WRITE_PULL.value)
_GO_CARRYING = frozenset({_GO, _GO_WRITE_PULL, _GO_WRITE_PULL_DROP, _FAST_GO, _FAST_GO_WRITE_PULL,
                          _GO_ERR_WRITE_PULL})

_GO_S, _GO_E, _GO_I, _GO_ERR, _GO_M = (GOState.S.value, GOState.E.value, GOState.I.value,
                                       GOState.ERR.value, GOState.M.value)
_GO_GRANTS = {_GO_S: _S, _GO_E: _E, _GO_M: _M, _GO_I: _I, _GO_ERR: _I}   # Err: use once

# Per D2H request opcode: (what it needs, allowed H2D response opcodes, allowed GO states).
# From ref §2 "D2H requests" (CXL 3.2 Tables 3-22/3-23).
_GO_ONLY = frozenset({_GO})
_PLANS: dict[int, tuple[int, frozenset, frozenset]] = {
    _RD_CURR: (_NEED_DATA, frozenset(), frozenset()),
    _RD_OWN: (_NEED_DATA | _NEED_GO, _GO_ONLY, frozenset({_GO_E, _GO_M, _GO_I, _GO_ERR})),
    _RD_SHARED: (_NEED_DATA | _NEED_GO, _GO_ONLY, frozenset({_GO_S, _GO_I, _GO_ERR})),
    _RD_ANY: (_NEED_DATA | _NEED_GO, _GO_ONLY, frozenset({_GO_S, _GO_E, _GO_M, _GO_I, _GO_ERR})),
    _RD_OWN_NO_DATA: (_NEED_GO, _GO_ONLY, frozenset({_GO_E, _GO_ERR})),
    _CL_FLUSH: (_NEED_GO, _GO_ONLY, frozenset({_GO_I, _GO_ERR})),
    _CACHE_FLUSHED: (_NEED_GO, _GO_ONLY, frozenset({_GO_I})),
    _CLEAN_EVICT_NO_DATA: (_NEED_GO, _GO_ONLY, frozenset({_GO_I})),
    DQ.ITOM_WR.value: (_NEED_PULL, frozenset({_GO_WRITE_PULL, _GO_ERR_WRITE_PULL}), frozenset()),
    DQ.WR_CUR.value: (_NEED_PULL, frozenset({_GO_WRITE_PULL, _GO_ERR_WRITE_PULL}), frozenset()),
    _CLEAN_EVICT: (_NEED_PULL, frozenset({_GO_WRITE_PULL, _GO_WRITE_PULL_DROP}), frozenset()),
    _DIRTY_EVICT: (_NEED_PULL, frozenset({_GO_WRITE_PULL, _GO_ERR_WRITE_PULL}), frozenset()),
    DQ.WO_WR_INV.value: (_NEED_PULL | _NEED_EXTCMP,
                         frozenset({_FAST_GO_WRITE_PULL, _GO_ERR_WRITE_PULL, _EXT_CMP}), frozenset()),
    DQ.WO_WR_INV_F.value: (_NEED_PULL | _NEED_EXTCMP,
                           frozenset({_FAST_GO_WRITE_PULL, _GO_ERR_WRITE_PULL, _EXT_CMP}), frozenset()),
    _WR_INV: (_NEED_PULL | _NEED_GO, frozenset({_WRITE_PULL, _GO}), frozenset({_GO_I, _GO_ERR})),
}
assert set(_PLANS) == {o.value for o in READS_WITH_DATA | READ0 | WRITES}
# Which response is a request's GO: a GO message, or (evicts, ItoMWr, WrCur, WOWrInv) the
# GO-carrying pull or GO_WritePull_Drop. WrInv's WritePull is no GO; RdCurr gets none.
_GO_BIT = {op: (_NEED_GO if need & _NEED_GO else _NEED_PULL if need & _NEED_PULL else 0)
           for op, (need, _, _) in _PLANS.items()}

# Snoops (ref §2, CXL 3.2 Table 3-26).
_SNP_INV = HQ.SNP_INV.value
_LEGAL_RSP = {snp.value: frozenset(r.value for r in rsps) for snp, rsps in LEGAL_SNOOP_RESPONSES.items()}
_RSP_I_HIT_I = DR.RSP_I_HIT_I.value
_FWD_RSP = frozenset(r.value for r in FORWARDING_RESPONSES)
# Snoop answer -> (tracked states it fits, state afterwards or None = unchanged).
_HELD = frozenset({_S, _E, _M})
_RSP_STATE = {
    DR.RSP_I_HIT_I.value: (frozenset({_I, _S, _E}), _I),
    DR.RSP_I_HIT_SE.value: (frozenset({_S, _E}), _I),
    DR.RSP_S_HIT_SE.value: (frozenset({_S, _E}), _S),
    DR.RSP_S_FWD_M.value: (frozenset({_E, _M}), _S),
    DR.RSP_I_FWD_M.value: (frozenset({_E, _M}), _I),
    DR.RSP_V_HIT_V.value: (_HELD, None),
    DR.RSP_V_FWD_V.value: (_HELD, None),
}

_MEM_RD_FWD, _MEM_WR_FWD = M2SReqOpcode.MEM_RD_FWD.value, M2SReqOpcode.MEM_WR_FWD.value
_MV_SHARED = MetaValue.SHARED.value

_D2H_REQ = {o.value: o.name for o in DQ}
_D2H_RSP = {o.value: o.name for o in DR}
_H2D_REQ = {o.value: o.name for o in HQ}
_H2D_RSP = {o.value: o.name for o in HR}
_GO_NAME = {o.value: o.name for o in GOState}


def _name(table: dict, value: int) -> str:
    return table.get(value) or f"reserved({value:#x})"


class _Request:
    """A live D2H request, by CQID."""
    __slots__ = ("cqid", "op", "line", "cycle", "need", "plan_need", "rsp_ok", "go_ok", "go_bit", "bogus_ok")

    def __init__(self, cqid, op, line, cycle, plan):
        self.cqid, self.op, self.line, self.cycle = cqid, op, line, cycle
        self.need = self.plan_need = plan[0]
        self.rsp_ok, self.go_ok = plan[1], plan[2]
        self.go_bit = _GO_BIT[op]       # the need bit cleared by its GO (0: it gets no GO)
        self.bogus_ok = False

    def __str__(self):
        return f"{_D2H_REQ[self.op]} CQID {self.cqid:#x} line {self.line:#x} (cycle {self.cycle})"


class _Snoop:
    __slots__ = ("op", "line", "uqid", "cycle", "state", "early_data")

    def __init__(self, op, line, uqid, cycle, state):
        self.op, self.line, self.uqid, self.cycle = op, line, uqid, cycle
        self.state = state              # tracked state when the snoop came: what the answer must fit
        self.early_data = 0

    def __str__(self):
        return f"{_name(_H2D_REQ, self.op)} UQID {self.uqid:#x} line {self.line:#x} (cycle {self.cycle})"


class _Owed:
    """One D2H data message owed to a host UQID: for a pull (request) or a *Fwd* answer (snoop)."""
    __slots__ = ("request", "what")

    def __init__(self, request, what):
        self.request, self.what = request, what


class CoherenceView:
    """Read-only view of the states the monitor tracks (what the host granted, per line)."""

    def __init__(self, states: dict[int, int]):
        self._states = states

    def granted_state(self, line: int) -> str:
        return _STATE_NAME[self._states.get(line, _I)]

    def held_lines(self) -> dict[int, str]:
        return {line: _STATE_NAME[s] for line, s in self._states.items() if s != _I}


class CxlCacheMonitor:
    def __init__(self, *, device_hdm: tuple[int, int] | None = None):
        self.device_hdm = device_hdm
        self._hdm_lo, self._hdm_hi = ((device_hdm[0], device_hdm[0] + device_hdm[1])
                                      if device_hdm is not None else (0, 0))
        self.violations: list[str] = []
        self.host_violations: list[str] = []          # the subset the host caused (see docstring)
        self.messages = 0
        self.device_bias_lines: set[int] = set()
        self._state: dict[int, int] = {}              # line -> tracked state (absent = I)
        self.coherence = CoherenceView(self._state)
        self._live: dict[int, _Request] = {}          # CQID -> live request
        self._retired: dict[int, _Request] = {}       # CQID -> last completed request, for messages
        self._line_reqs: dict[int, list[_Request]] = {}
        self._evicted: set[int] = set()               # lines whose last state change was an evict
        self._dropped_at: dict[int, int] = {}         # line -> state before a snoop changed it
        self._snoop_line: dict[int, _Snoop] = {}
        self._snoop_uqid: dict[int, _Snoop] = {}
        self._owed: dict[int, _Owed] = {}             # UQID -> D2H data still owed
        self._owed_done: dict[int, str] = {}          # UQID -> what last used it, for messages

    @property
    def outstanding(self) -> int:
        return len(self._live) + len(self._snoop_uqid) + len(self._owed)

    def requests_in_flight(self, line: int) -> int:
        """Device requests to ``line`` the host has not completed yet."""
        return len(self._line_reqs.get(line, ()))

    @property
    def device_violations(self) -> list[str]:
        """The violations the device caused (``violations`` minus ``host_violations``)."""
        host = set(map(id, self.host_violations))
        return [v for v in self.violations if id(v) not in host]

    def _violation(self, cycle: int, text: str) -> None:
        self.violations.append(f"cycle {cycle}: {text}")

    def _host_violation(self, cycle: int, text: str) -> None:
        """A rule the host broke (a stray, duplicate or reserved H2D message, a host obligation)."""
        self._violation(cycle, text)
        self.host_violations.append(self.violations[-1])

    # ---- listeners
    def on_d2h(self, cycle: int, kind: str, fields: dict) -> None:
        self.messages += 1
        if kind == "req":
            self._d2h_req(cycle, fields)
        elif kind == "rsp":
            self._d2h_rsp(cycle, fields)
        elif kind == "data":
            self._d2h_data(cycle, fields)
        else:
            raise ValueError(f"unknown D2H kind {kind!r}")

    def on_h2d(self, cycle: int, kind: str, fields: dict) -> None:
        self.messages += 1
        if kind == "req":
            self._h2d_req(cycle, fields)
        elif kind == "rsp":
            self._h2d_rsp(cycle, fields)
        elif kind == "data":
            self._h2d_data(cycle, fields)
        else:
            raise ValueError(f"unknown H2D kind {kind!r}")

    def on_s2m(self, cycle, kind, fields):
        """S2M messages (from the CXL.mem host BFM) carry nothing this monitor judges."""

    def on_m2s(self, seq: int, cycle: int, kind: str, fields: dict) -> None:
        if kind != "req":
            return
        op = fields["opcode"]
        if op == _MEM_RD_FWD or op == _MEM_WR_FWD:
            self.messages += 1
            self._mem_fwd(cycle, op, fields)

    # ---- D2H
    def _d2h_req(self, cycle, f):
        op, cqid, line = f["opcode"], f["cqid"], f["addr"]
        plan = _PLANS.get(op)
        if plan is None:
            self._violation(cycle, f"D2H request with reserved opcode {op:#x}, CQID {cqid:#x} line {line:#x}")
            return
        old = self._live.get(cqid)
        if old is not None:
            self._violation(cycle, f"D2H {_D2H_REQ[op]} line {line:#x} reuses CQID {cqid:#x} while {old} is live")
            self._remove(old)
        self._retired.pop(cqid, None)
        req = _Request(cqid, op, line, cycle, plan)
        if op == _CACHE_FLUSHED:
            # Its address means nothing: it states the whole cache is empty (ref §2 table: Read0, GO-I).
            self._cache_flushed(cycle, req)
            self._live[cqid] = req
            return
        reqs = self._line_reqs.get(line)
        if op not in _EVICTS:
            # D2H Req is one ordered channel: an evict queued before a snoop took the line would
            # have come before this request, so no crossing evict of the line can follow it.
            self._dropped_at.pop(line, None)
        if op in _EVICTS:
            self._check_evict(cycle, req, reqs or ())
        elif op in _SERIALIZED_READS and reqs:
            for t in reqs:
                if t.need & t.go_bit and not (op == _RD_OWN_NO_DATA and t.op == _RD_OWN_NO_DATA):
                    self._violation(cycle, f"{req} issued while {t} still waits for its GO "
                                           f"(reads to a line are serialized)")
                    break
        self._live[cqid] = req
        if reqs is None:
            self._line_reqs[line] = [req]
        else:
            reqs.append(req)

    def _check_evict(self, cycle, req, reqs):
        line = req.line
        if self._hdm_lo <= line < self._hdm_hi:
            self._violation(cycle, f"{req} evicts a line of the device's own memory on CXL.cache")
            return
        for t in reqs:
            if t.op in _EVICTS:
                self._violation(cycle, f"duplicate evict: {req} while {t} is live")
                return
        state = self._state.get(line, _I)
        if line in self._dropped_at:
            # The evict crossed the snoop answers that changed the line: the device issued it
            # before the snoops arrived, but D2H Req and Rsp are separate channels, so the host
            # may see it later (after several snoops, if D2H Req is held not ready). Legal,
            # judged by the state the device held before the first of them (the state when the
            # evict was queued); its pull data may then be Bogus. Once only: a second evict is
            # a duplicate.
            state = self._dropped_at.pop(line)
            req.bogus_ok = True
        if state == _I:
            if line in self._evicted:
                self._violation(cycle, f"duplicate evict: {req} with no cacheable read of the line "
                                       f"granted since its last evict")
            else:
                self._violation(cycle, f"{req} evicts a line it does not hold (not granted by a GO, "
                                       f"or taken by a snoop)")
        elif state == _M and req.op != _DIRTY_EVICT:
            self._violation(cycle, f"{req} of a line granted M drops its dirty data (GO-M dropped silently)")
        elif state == _S and req.op == _DIRTY_EVICT:
            self._violation(cycle, f"{req} of a line granted only S (only E/M lines can be dirty)")

    def _cache_flushed(self, cycle, req):
        for line, state in self._state.items():
            if state == _M and not self._live_dirty_evict(line):
                self._violation(cycle, f"{req} while line {line:#x} is still held in M "
                                       f"(GO-M dropped silently)")
        self._state.clear()

    def _d2h_rsp(self, cycle, f):
        op, uqid = f["opcode"], f["uqid"]
        snp = self._snoop_uqid.pop(uqid, None)
        if snp is None:
            self._violation(cycle, f"snoop response {_name(_D2H_RSP, op)} to UQID {uqid:#x}, which no "
                                   f"pending snoop has")
            return
        line = snp.line
        if self._snoop_line.get(line) is snp:
            del self._snoop_line[line]
        # Judge the answer against the state when the snoop came: legally nothing changes it while
        # the snoop is pending (no GO then), and after a host error this avoids a second report.
        granted = snp.state
        before = self._state.get(line, _I)
        fits, after = _RSP_STATE.get(op, (None, None))
        if snp.op not in _LEGAL_RSP:
            # A reserved snoop opcode (flagged as a host error when it came): this project's
            # device answers RspIHitI and changes nothing (README, CXL.cache agent).
            if op != _RSP_I_HIT_I:
                self._violation(cycle, f"{_name(_D2H_RSP, op)} answers {snp}: a reserved snoop is "
                                       f"answered RspIHitI with no state change")
            elif snp.early_data:
                self._violation(cycle, f"D2H data for {snp}, answered RSP_I_HIT_I: only *Fwd* "
                                       f"answers carry data")
            return
        if op not in _LEGAL_RSP[snp.op]:
            self._violation(cycle, f"{_name(_D2H_RSP, op)} is not a legal answer to {snp} (Table 3-26)")
        elif granted not in fits:
            why = (" (GO-M dropped silently)" if granted == _M else
                   " (claims a hit on a line not granted)" if granted == _I else "")
            self._violation(cycle, f"{_D2H_RSP[op]} answers {snp} but the line is granted "
                                   f"{_STATE_NAME[granted]}{why}")
        if fits is not None:
            new = before if after is None else after
            if snp.op == _SNP_INV or new != before:
                # A state-changing snoop: evicts of this line not yet pulled may send Bogus data.
                for t in self._line_reqs.get(line, ()):
                    if t.op in _EVICTS and t.need & _NEED_PULL:
                        t.bogus_ok = True
            if new != before:
                # Remember what the first snoop since the last grant took: an evict the device
                # issued before it may still arrive (a crossing), judged against the state
                # before it, however many snoops changed the line meanwhile.
                self._dropped_at.setdefault(line, before)
                if new == _I:
                    del self._state[line]
                else:
                    self._state[line] = new
        if op in _FWD_RSP:
            if snp.early_data == 0:
                self._owe(cycle, uqid, _Owed(None, f"{_D2H_RSP[op]} to {snp}"))
            elif snp.early_data > 1:
                self._violation(cycle, f"{snp} answered {_D2H_RSP[op]} got {snp.early_data} D2H data "
                                       f"messages (exactly one line)")
            else:
                self._owed_done[uqid] = f"{_D2H_RSP[op]} to {snp}"
        elif snp.early_data:
            self._violation(cycle, f"D2H data for {snp}, answered {_name(_D2H_RSP, op)}: only *Fwd* "
                                   f"answers carry data")

    def _d2h_data(self, cycle, f):
        uqid = f["uqid"]
        owed = self._owed.pop(uqid, None)
        if owed is not None:
            req = owed.request
            if f["bogus"] and req is not None and req.op in _EVICTS_WITH_DATA and not req.bogus_ok:
                self._violation(cycle, f"Bogus data for {req} (UQID {uqid:#x}) without a state-changing "
                                       f"snoop between the evict and its pull")
            self._owed_done[uqid] = owed.what
            return
        snp = self._snoop_uqid.get(uqid)
        if snp is not None:
            snp.early_data += 1          # judged when the answer comes
            return
        last = self._owed_done.get(uqid)
        if last is not None:
            self._violation(cycle, f"D2H data to UQID {uqid:#x} after {last} (no data after a Drop; "
                                   f"exactly one line per pull or *Fwd* answer)")
        else:
            self._violation(cycle, f"D2H data to UQID {uqid:#x} that no pull or *Fwd* snoop answer asked for")

    # ---- H2D
    def _h2d_req(self, cycle, f):
        op, line, uqid = f["opcode"], f["addr"], f["uqid"]
        snp = _Snoop(op, line, uqid, cycle, self._state.get(line, _I))
        if op not in _LEGAL_RSP:
            self._host_violation(cycle, f"snoop with reserved opcode {op:#x} UQID {uqid:#x} line {line:#x}")
        other = self._snoop_line.get(line)
        if other is not None:
            self._host_violation(cycle, f"{snp} sent while {other} is pending (one snoop per line)")
        older = self._snoop_uqid.get(uqid)
        if older is not None:
            # Answers carry only the UQID, so the older snoop can no longer be matched: forget it.
            self._host_violation(cycle, f"{snp} reuses the UQID of pending {older}")
            if self._snoop_line.get(older.line) is older:
                del self._snoop_line[older.line]
        for t in self._line_reqs.get(line, ()):
            if t.op in _READS_WITH_GO and t.need & _NEED_GO and not t.need & _NEED_DATA:
                self._host_violation(cycle, f"{snp} sent between the H2D data and the GO of {t}")
                break
        self._snoop_line[line] = snp
        self._snoop_uqid[uqid] = snp

    def _late(self, cycle, what, cqid):
        done = self._retired.get(cqid)
        if done is not None:
            self._host_violation(cycle, f"{what} for CQID {cqid:#x} after {done} completed")
        else:
            self._host_violation(cycle, f"{what} for CQID {cqid:#x}, which no live D2H request has")

    def _h2d_rsp(self, cycle, f):
        op, cqid = f["opcode"], f["cqid"]
        req = self._live.get(cqid)
        if req is None:
            self._late(cycle, _name(_H2D_RSP, op), cqid)
            return
        if op not in req.rsp_ok:
            self._host_violation(cycle, f"{_name(_H2D_RSP, op)} is not an answer to {req} (Table 3-22)")
            return
        line = req.line
        if req.op != _CACHE_FLUSHED:
            snp = self._snoop_line.get(line)
            if snp is not None:
                if op in _GO_CARRYING:
                    self._host_violation(cycle, f"{_H2D_RSP[op]} for {req} while {snp} is pending "
                                                f"(no GO while a snoop is pending)")
                elif op == _WRITE_PULL:
                    self._host_violation(cycle, f"WRITE_PULL for {req} while {snp} is pending "
                                                f"(no WritePull concurrent with a snoop)")
        need = req.need
        if op == _GO:
            if not need & _NEED_GO:
                self._host_violation(cycle, f"second GO for {req}")
                return
            if need & _NEED_PULL:
                # Not applied: the device must drop it (a WrInv takes its GO only after the pull).
                self._host_violation(cycle, f"GO for {req} before its WritePull")
                return
            go = f["rsp_data"] & 0xF
            if go not in req.go_ok:
                self._host_violation(cycle, f"GO-{_name(_GO_NAME, go)} is not a grant for {req} (Table 3-22)")
            req.need = need & ~_NEED_GO
            self._granted(cycle, req, _GO_GRANTS.get(go, _I))
        elif op == _EXT_CMP:
            if need & _NEED_PULL:
                self._host_violation(cycle, f"EXT_CMP for {req} before its pull")
            req.need = need & ~(_NEED_EXTCMP | _NEED_PULL)
        else:                                   # a pull or GO_WritePull_Drop
            if not need & _NEED_PULL:
                self._host_violation(cycle, f"second pull {_H2D_RSP[op]} for {req}")
                return
            req.need = need & ~_NEED_PULL
            uqid = f["rsp_data"]
            what = f"{_H2D_RSP[op]} UQID {uqid:#x} for {req}"
            if op == _GO_WRITE_PULL_DROP:
                self._owed_done[uqid] = what
            else:
                self._owe(cycle, uqid, _Owed(req, what))
            if op != _WRITE_PULL:               # the GO of an evict or full-line write: line is I
                self._set_invalid(line, req.op in _EVICTS)
        if req.need == 0:
            self._complete(req)

    def _h2d_data(self, cycle, f):
        cqid = f["cqid"]
        req = self._live.get(cqid)
        if req is None:
            self._late(cycle, "H2D data", cqid)
        elif not req.plan_need & _NEED_DATA:
            self._host_violation(cycle, f"H2D data for {req}, which gets no data")
        elif not req.need & _NEED_DATA:
            self._host_violation(cycle, f"second H2D data for {req} (exactly one line)")
        else:
            req.need &= ~_NEED_DATA
            if req.need == 0:
                self._complete(req)

    # ---- CXL.mem forwards (HDM-D host bias)
    def _mem_fwd(self, cycle, op, f):
        tag, line = f["tag"], f["addr"]
        name = "MEM_RD_FWD" if op == _MEM_RD_FWD else "MEM_WR_FWD"
        req = self._live.get(tag)
        if req is None:
            self._host_violation(cycle, f"{name} Tag {tag:#x} line {line:#x} matches no live D2H request CQID")
            return
        if req.line != line:
            self._host_violation(cycle, f"{name} Tag {tag:#x} for line {line:#x} but {req} is for another line")
            return
        if op == _MEM_RD_FWD and req.op not in _RD_FWD_COMPLETES or \
                op == _MEM_WR_FWD and req.op not in _WR_FWD_COMPLETES:
            self._host_violation(cycle, f"{name} Tag {tag:#x} does not complete {req}")
            return
        if self.device_hdm is not None and not self._hdm_lo <= line < self._hdm_hi:
            self._host_violation(cycle, f"{name} Tag {tag:#x} for {req}, a line outside the device memory")
        if req.need != req.plan_need:
            self._host_violation(cycle, f"{name} Tag {tag:#x} completes {req}, which already got H2D answers")
        req.need = 0
        if op == _MEM_RD_FWD:
            rop = req.op
            if rop == _RD_OWN_NO_DATA:
                self.device_bias_lines.add(line)
                self._granted(cycle, req, _E)
            elif rop == _RD_SHARED:
                self._granted(cycle, req, _S)
            elif rop == _RD_ANY:
                self._granted(cycle, req, _S if f["meta_value"] == _MV_SHARED else _E)
            elif rop == _RD_OWN:
                self._granted(cycle, req, _E)
        else:
            self._set_invalid(line, False)
        self._complete(req)

    # ---- state
    def _granted(self, cycle, req, new):
        """A GO (or MemRdFwd) for req: the line's tracked state becomes what was granted."""
        op, line = req.op, req.line
        if op == _CACHE_FLUSHED or op == _RD_CURR:
            return
        if op not in _CACHEABLE_READS:
            new = _I                                # CLFlush, CleanEvictNoData, WrInv
        before = self._state.get(line, _I)
        if (before == _M and (new == _I or new == _S) and op not in _FULL_LINE_WRITES
                and op != _CLEAN_EVICT_NO_DATA and not self._live_dirty_evict(line)):
            self._violation(cycle, f"GO for {req} moves line {line:#x} from M to {_STATE_NAME[new]} "
                                   f"without a DirtyEvict (GO-M dropped silently)")
        if new == _I:
            self._set_invalid(line, op == _CLEAN_EVICT_NO_DATA)
        else:
            self._state[line] = new
            self._evicted.discard(line)
            self._dropped_at.pop(line, None)

    def _set_invalid(self, line, by_evict):
        self._state.pop(line, None)
        if by_evict:
            self._evicted.add(line)

    def _live_dirty_evict(self, line):
        return any(t.op == _DIRTY_EVICT for t in self._line_reqs.get(line, ()))

    def _owe(self, cycle, uqid, owed):
        prev = self._owed.get(uqid)
        if prev is not None:
            self._host_violation(cycle, f"{owed.what} reuses UQID {uqid:#x} while data is still owed to "
                                        f"{prev.what}")
        self._owed[uqid] = owed

    def _remove(self, req):
        del self._live[req.cqid]
        reqs = self._line_reqs.get(req.line)
        if reqs is not None and req in reqs:
            reqs.remove(req)
            if not reqs:
                del self._line_reqs[req.line]

    def _complete(self, req):
        self._remove(req)
        self._retired[req.cqid] = req

    def finish(self, cycle: int) -> None:
        """Report every transaction still open, then close them all."""
        for req in self._live.values():
            missing = "+".join(n for bit, n in _NEED_NAMES if req.need & bit)
            self._host_violation(cycle, f"{req} never got {missing}")
        for snp in self._snoop_uqid.values():
            self._violation(cycle, f"{snp} never answered")
        for uqid, owed in self._owed.items():
            self._violation(cycle, f"D2H data to UQID {uqid:#x} never sent for {owed.what}")
        self._live.clear()
        self._line_reqs.clear()
        self._snoop_uqid.clear()
        self._snoop_line.clear()
        self._owed.clear()
