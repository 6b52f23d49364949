"""CXL.mem protocol monitor: checks 1-4 of docs/cxl-reference.md, and a header check (5), on every message.

It listens to the host BFM (``on_m2s`` / ``on_s2m``) and keeps, for every request, the set of
responses the specification allows, written here from cxl-reference §1 "Expected
responses" (not from the RTL):
1. Each Req gets its response set with the same Tag and LD-ID: at most one NDR and one DRS;
   none for MemSpecRd, MemRdFwd, MemWrFwd. Tags may repeat and responses come in any order,
   so a response may belong to any outstanding request with its Tag and LD-ID: the monitor
   accepts any legal assignment (below), and a response nobody is waiting for is a violation.
2. Each RwD gets exactly one NDR: Cmp for writes, BI-ConflictAck for BIConflict.
3. The NDR opcode fits the request: Meta0-State Any -> Cmp-E, Shared -> Cmp-S or Cmp-E,
   Invalid -> Cmp; MetaField No-Op -> Cmp; MemRdData -> Cmp-S or Cmp-E. Never Cmp-M.
4. One whole line per DRS; reads outside the HDM window answer a single MemData-NXM whose
   data is all ones; DRS opcodes are MemData or MemData-NXM only. (Poison propagation is
   checked by the scoreboard, which knows what was stored.)
5. Every NDR and DRS carries a legal MetaField/MetaValue: cxl-reference §1 "Encodings" and
   §6 (Meta0-State only, no EMS) leave MetaField Meta0-State or No-Op, and Explicit-No-Op
   is an EMS value, so Meta0-State goes with Invalid, Any or Shared. A device that keeps no
   Meta0 state (``meta_state=False``, this one: README "CXL.mem target", "responses carry
   MetaField No-Op") must send No-Op; a Meta0-State there would claim a state it never
   stored. (An RTL constant lost to Verilator's ALWNEVER once sent Meta0-State/Invalid.)
Project-defined answers (README "CXL.mem target"): an unsupported Req or RwD opcode gets
one NDR Cmp; outside the window MemInv gets Cmp and writes get Cmp.

Matching responses to requests that share a Tag and LD-ID: an NDR goes to the most
constrained request it fits (the allowed sets nest, so this is never wrong). A DRS whose data
several outstanding reads could legally return (the listeners' ``accepts``, i.e. the
scoreboard's legal values at the DRS's arrival) is held with that candidate set instead of
being bound to the oldest: a candidate set shrinks as other DRSs take their reads, a DRS
left with one candidate takes it, and a group of held DRSs that covers exactly its
candidates is assigned by a bipartite matching (any perfect matching is legal: each DRS was
accepted by each of its candidates). A DRS for which no assignment of all DRSs received so
far exists is a violation. ``finish()`` assigns what is still held, then reports requests
still waiting (``unanswered`` counts them). ``violations`` lists every problem found, with the
cycle, so a failing test says what went wrong. A listener that raises does not stop the link: the exception becomes
a violation naming the response.

Host errors are not device violations: ``host_errors`` counts, per category, the M2S messages
whose encoding breaks a host rule (sim/checkers/cxl_mem_host_rules.py) and
``host_error_messages`` the messages with at least one; the device's answers to them are
still checked as above. ``tags_reused`` counts requests sent while an earlier request with
the same Tag and LD-ID was still outstanding (legal: Tags need not be unique).
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field

from hw.common.cxl_mem import (M2SReqOpcode as Q, M2SRwDOpcode as W, MetaField, MetaValue,
                               NDROpcode as N, DRSOpcode as D, LINE_BITS)
from .cxl_mem_host_rules import host_errors as classify_host_errors

ALL_ONES = (1 << LINE_BITS) - 1
# Plain ints for the per-message path (enum attribute access is slow in Python).
_MS0, _ANY, _SHARED = MetaField.META0_STATE.value, MetaValue.ANY.value, MetaValue.SHARED.value
_META_NO_OP = MetaField.NO_OP.value
_MS0_VALUES = frozenset({MetaValue.INVALID.value, _ANY, _SHARED})     # not Explicit-No-Op (EMS)
_CMP = frozenset({N.CMP.value})
_CMP_E = frozenset({N.CMP_E.value})
_CMP_S_OR_E = frozenset({N.CMP_S.value, N.CMP_E.value})
_ACK = frozenset({N.BI_CONFLICT_ACK.value})
_READS = (Q.MEM_RD.value, Q.MEM_RD_DATA.value)
_INVS = (Q.MEM_INV.value, Q.MEM_INV_NT.value)
_SILENT = (Q.MEM_SPEC_RD.value, Q.MEM_RD_FWD.value, Q.MEM_WR_FWD.value)
_MEM_DATA, _NXM = D.MEM_DATA.value, D.MEM_DATA_NXM.value


@dataclass
class Pending:
    seq: int
    cycle: int
    kind: str                      # "req" or "rwd"
    fields: dict
    ndr_ok: frozenset | None       # allowed NDR opcodes, None = no NDR expected
    drs_ok: int | None             # expected DRS opcode, None = no DRS expected
    got_ndr: bool = False
    got_drs: bool = False
    responses: list = field(default_factory=list)

    @property
    def done(self) -> bool:
        return (self.ndr_ok is None or self.got_ndr) and (self.drs_ok is None or self.got_drs)


@dataclass
class HeldDrs:
    """A DRS that more than one outstanding read could legally be the answer to."""
    fields: dict
    cycle: int
    candidates: list                  # Pending reads it fits (data accepted at arrival)


def _matching(held: list[HeldDrs]) -> dict[int, Pending] | None:
    """A matching of every held DRS (by index) to a distinct candidate, or None (Kuhn)."""
    owner: dict[int, int] = {}        # id(Pending) -> index of the DRS holding it
    by_id: dict[int, Pending] = {}

    def augment(i: int, seen: set) -> bool:
        for p in held[i].candidates:
            if id(p) in seen:
                continue
            seen.add(id(p))
            if id(p) not in owner or augment(owner[id(p)], seen):
                owner[id(p)] = i
                by_id[id(p)] = p
                return True
        return False

    for i in range(len(held)):
        if not augment(i, set()):
            return None
    return {i: by_id[pid] for pid, i in owner.items()}


def _meta_cmp(fields) -> frozenset:
    if fields["meta_field"] == _MS0:
        mv = fields["meta_value"]
        if mv == _ANY:
            return _CMP_E
        if mv == _SHARED:
            return _CMP_S_OR_E
    return _CMP


class CxlMemMonitor:
    def __init__(self, *, capacity_lines: int, meta_state: bool = False):
        self.capacity_lines = capacity_lines
        self.meta_state = meta_state         # the device keeps Meta0 state (check 5)
        self.window = (0, 0, False)          # (base line, size in lines, enabled)
        self.violations: list[str] = []
        self.waiting: dict[tuple[int, int], collections.deque[Pending]] = \
            collections.defaultdict(collections.deque)
        self.outstanding = 0
        self.messages = 0
        self.held: dict[tuple[int, int], list[HeldDrs]] = {}    # ambiguous DRSs per (Tag, LD-ID)
        self.host_errors: collections.Counter[str] = collections.Counter()
        self.host_error_messages = 0
        self.tags_reused = 0
        self.unanswered = 0                  # requests finish() found still waiting
        # Listeners: on_complete(pending, kind, fields, cycle) for every matched response, and
        # accepts(pending, drs_fields) to tell apart reads that share a Tag.
        self.listeners = []

    # ---- configuration the host programmed through CSRs
    def set_window(self, base_line: int, size_lines: int, enabled: bool) -> None:
        self.window = (base_line, size_lines, enabled)

    def decodes(self, line: int) -> bool:
        base, size, enabled = self.window
        off = line - base
        return enabled and 0 <= off < size and off < self.capacity_lines

    def _violation(self, cycle: int, text: str) -> None:
        self.violations.append(f"cycle {cycle}: {text}")

    # ---- expectations
    def _expect(self, kind: str, f: dict) -> tuple[frozenset | None, int | None]:
        op = f["opcode"]
        inside = self.decodes(f["addr"])
        if kind == "req":
            if op in _READS:
                if not inside:
                    return None, _NXM
                ndr = _CMP_S_OR_E if op == _READS[1] else _meta_cmp(f)
                return ndr, _MEM_DATA
            if op in _INVS:
                return (_meta_cmp(f) if inside else _CMP), None
            if op in _SILENT:
                return None, None
            return _CMP, None
        if op == W.BI_CONFLICT.value:
            return _ACK, None
        return _CMP, None

    # ---- listener interface (from the host BFM)
    def on_m2s(self, seq, cycle, kind, fields):
        self.messages += 1
        errors = classify_host_errors(kind, fields)
        if errors:
            self.host_error_messages += 1
            self.host_errors.update(errors)
        ndr_ok, drs_ok = self._expect(kind, fields)
        if ndr_ok is None and drs_ok is None:
            return
        p = Pending(seq, cycle, kind, fields, ndr_ok, drs_ok)
        queue = self.waiting[(fields["tag"], fields["ld_id"])]
        if queue:
            self.tags_reused += 1
        queue.append(p)
        self.outstanding += 1

    def on_s2m(self, cycle, kind, fields):
        self.messages += 1
        if fields["meta_field"] != _META_NO_OP:
            self._check_meta(cycle, kind, fields)
        key = (fields["tag"], fields["ld_id"])
        queue = self.waiting.get(key) or ()
        op = fields["opcode"]
        # Tags may repeat and responses come in any order, so a response may belong to any
        # outstanding request with its Tag and LD-ID: take one it fits (for read data, one
        # whose legal values include it, as the scoreboard judges; for NDRs, the most
        # constrained), else the oldest one still waiting for this kind of response (and
        # report the misfit).
        if kind == "ndr":
            open_ = [p for p in queue if p.ndr_ok is not None and not p.got_ndr]
            # Most constrained first: the allowed sets nest ({Cmp-E} within {Cmp-S, Cmp-E}),
            # so giving a Cmp-E to a request that allows only Cmp-E is never wrong.
            fits = sorted((p for p in open_ if op in p.ndr_ok), key=lambda p: len(p.ndr_ok))
        else:
            held = self.held.get(key, ())
            open_ = [p for p in queue if p.drs_ok is not None and not p.got_drs]
            fits = [p for p in open_ if op == p.drs_ok]
            if len(fits) > 1 or held:
                accepted = [p for p in fits if self._accepted(p, fields, cycle)]
                if len(accepted) > 1 or (accepted and held):
                    self._hold(key, HeldDrs(fields, cycle, accepted), queue)
                    return
                fits = accepted or fits
        match = fits[0] if fits else (open_[0] if open_ else None)
        if match is None:
            self._violation(cycle, f"{kind.upper()} opcode {op} answers no outstanding request "
                                   f"with Tag {key[0]:#x} LD-ID {key[1]}")
            return
        if kind == "ndr":
            match.got_ndr = True
            if op not in match.ndr_ok:
                name = N(op).name if op in N._value2member_map_ else op
                self._violation(cycle, f"NDR opcode {name} does not fit {self._describe(match)}; allowed "
                                       f"{sorted(N(o).name for o in match.ndr_ok)}")
            self._complete(match, kind, fields, cycle, queue)
        else:
            self._take_drs(match, fields, cycle, queue)
            if key in self.held:
                self._settle(key, queue)

    def _accepted(self, p: Pending, fields: dict, cycle: int) -> bool:
        try:
            return all(lst.accepts(p, fields) for lst in self.listeners)
        except Exception as e:          # a checker bug must not stop the link
            self._violation(cycle, f"checker error judging DRS Tag {fields['tag']:#x} for "
                                   f"{self._describe(p)}: {type(e).__name__}: {e}")
            return False

    def _complete(self, match: Pending, kind: str, fields: dict, cycle: int, queue) -> None:
        if match.done:
            queue.remove(match)
            self.outstanding -= 1
        for lst in self.listeners:
            try:
                lst.on_complete(match, kind, fields, cycle)
            except Exception as e:      # a checker bug must not stop the link
                self._violation(cycle, f"checker error on the {kind.upper()} for {self._describe(match)}: "
                                       f"{type(e).__name__}: {e}")

    def _take_drs(self, match: Pending, fields: dict, cycle: int, queue) -> None:
        op = fields["opcode"]
        match.got_drs = True
        if op != match.drs_ok:
            self._violation(cycle, f"DRS opcode {op} for {self._describe(match)}, "
                                   f"expected {D(match.drs_ok).name}")
        elif op == _NXM and fields["data"] != ALL_ONES:
            self._violation(cycle, f"MemData-NXM for {self._describe(match)} "
                                   f"carries data other than all ones")
        self._complete(match, "drs", fields, cycle, queue)

    def _hold(self, key, new: HeldDrs, queue) -> None:
        """Add an ambiguous DRS to its key's held set and settle what can be settled."""
        self.held.setdefault(key, []).append(new)
        self._settle(key, queue, new)

    def _settle(self, key, queue, new: HeldDrs | None = None, final: bool = False) -> None:
        """Take every held DRS of ``key`` left with one candidate; assign a group that covers
        exactly its candidates (or, ``final``, everything) by a matching."""
        held = self.held.get(key, [])
        while held:
            for h in held:
                h.candidates = [p for p in h.candidates if not p.got_drs]
            if _matching(held) is None:
                bad = new if new in held else next(h for h in held if not h.candidates) if \
                    any(not h.candidates for h in held) else held[-1]
                held.remove(bad)
                self._violation(bad.cycle, f"DRS Tag {key[0]:#x} LD-ID {key[1]}: no assignment of the "
                                           f"{len(held) + 1} DRSs held for this Tag to distinct outstanding "
                                           f"reads exists (a read answered twice, or data no read may return)")
                continue
            single = next((h for h in held if len(h.candidates) == 1), None)
            if single is not None:
                held.remove(single)
                self._take_drs(single.candidates[0], single.fields, single.cycle, queue)
                continue
            if final or len({id(p) for h in held for p in h.candidates}) == len(held):
                match = _matching(held)
                taken = list(held)
                held.clear()
                for i, h in enumerate(taken):         # any perfect matching is legal
                    self._take_drs(match[i], h.fields, h.cycle, queue)
            break
        if not held:
            self.held.pop(key, None)

    def _check_meta(self, cycle, kind, fields) -> None:
        """Check 5 for a response whose MetaField is not No-Op."""
        mf, mv = fields["meta_field"], fields["meta_value"]
        what = f"{kind.upper()} Tag {fields['tag']:#x}"
        if mf != _MS0:
            name = MetaField(mf).name if mf in MetaField._value2member_map_ else f"reserved({mf:#b})"
            self._violation(cycle, f"{what} carries MetaField {name}; only Meta0-State or No-Op is legal")
        elif not self.meta_state:
            self._violation(cycle, f"{what} carries MetaField Meta0-State (MetaValue "
                                   f"{MetaValue(mv).name}) but the device keeps no Meta0 state: "
                                   f"expected No-Op")
        elif mv not in _MS0_VALUES:
            self._violation(cycle, f"{what} carries Meta0-State with MetaValue {MetaValue(mv).name}")

    def _describe(self, p: Pending) -> str:
        f = p.fields
        name = (Q(f["opcode"]).name if p.kind == "req" else
                W(f["opcode"]).name if f["opcode"] in W._value2member_map_ else
                f"reserved({f['opcode']:#x})")
        return (f"{p.kind.upper()} {name} tag {f['tag']:#x} addr {f['addr']:#x} "
                f"(seq {p.seq}, cycle {p.cycle})")

    def forget(self) -> None:
        """Drop every expectation (a power failure ends the link)."""
        self.waiting.clear()
        self.held.clear()
        self.outstanding = 0

    def finish(self, cycle: int) -> None:
        for key in list(self.held):
            self._settle(key, self.waiting[key], final=True)
        for queue in self.waiting.values():
            for p in queue:
                missing = [k for k, want, got in (("NDR", p.ndr_ok, p.got_ndr),
                                                   ("DRS", p.drs_ok, p.got_drs))
                           if want is not None and not got]
                self._violation(cycle, f"{self._describe(p)} never got {'+'.join(missing)}")
                self.unanswered += 1
        self.waiting.clear()
        self.outstanding = 0
