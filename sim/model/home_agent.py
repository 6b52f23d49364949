"""Transaction-level CXL.cache host home agent (pure Python, no simulator).

The home agent (HA) owns host memory and answers a Type-2 device's D2H requests, keeping a
per-line directory of the device's state and of the host CPU cache's state. It is driven by
method calls and returns the messages to send; a transport (the test's in-memory queues, or
sim/bfm/cxl_cache_host.py on the wires) delivers them and reports back when each one went out.

Construction::

    HomeAgent(host_range=(base_line, n_lines), gpu_range=None, device_hdm_range=None, *,
              rng=None, max_delay=0, grant_m=False, rdshared_grant_e=False,
              snp_cur_rate=0.0, error_lines=(), error_rate=0.0, error_writes=True)

Ranges are (first line address, number of lines). Host and GPU memory are both served from
the HA's memory (a dict line -> 512-bit int, default 0, plus a poisoned set); the device's
own HDM range (HDM-D) is served by the device: see "Bias" below. Any other address is a
protocol error and gets an error answer.

Inputs:
- ``handle_d2h(kind, fields)``: a D2H message received from the device; kind "req", "rsp"
  or "data", fields those of D2HReq / D2HRsp / D2HData.
- ``sent(msg)``: the transport delivered ``msg`` (one this HA returned) to the device.
- ``cpu_request(line, store)``, ``cpu_store(line, value)``, ``cpu_evict(line, dirty_value)``:
  from the host CPU cache (host_cpu_cache.py), attached with ``attach_cpu(cpu)``. The HA
  calls the cache back: ``cpu.fill(line, state, value)`` (state I = use once),
  ``cpu.recall(line, invalidate) -> dirty value or None``.
Each input returns a list of ``HaMsg``: ``channel`` ("h2d_req", "h2d_rsp", "h2d_data" or
"m2s_req"), ``fields`` (H2DReq / H2DRsp / H2DData / cxl_mem.M2SReq fields, ints), ``delay``
(cycles to wait before sending; 0 unless ``rng`` and ``max_delay``), ``line``, and
``serial`` (for data: the serialization point of the read, see below).

Answers (cxl-reference §2): RdCurr -> data, no GO; RdShared -> GO-S (GO-E when
``rdshared_grant_e`` and the CPU holds no copy) + data; RdOwn -> GO-E (GO-M if ``grant_m``)
+ data; RdAny -> GO-E if the CPU holds no copy, else GO-S, + data; RdOwnNoData -> GO-E;
CLFlush -> GO-I (after writing back and invalidating the CPU copy); CacheFlushed -> GO-I;
CleanEvict -> GO_WritePull, or GO_WritePull_Drop on a coin flip when ``rng`` is given (the
pulled clean data is compared with memory, not written); DirtyEvict -> GO_WritePull, data
written unless Bogus; CleanEvictNoData -> GO-I; ItoMWr / WrCur -> GO_WritePull, data written;
WrInv -> WritePull, data written, then GO-I; WOWrInv(F) -> Fast_GO_WritePull, data written,
then ExtCmp. GO state in RspData[3:0]; pulls carry the host UQID in RspData; all responses
carry the request's CQID; RSP_PRE is 0. Data messages set ChunkValid = 1.
Error injection: a read of a line in ``error_lines`` (or with probability ``error_rate``)
gets GO-Err and all-ones data with Poison and GO-Err set; a write gets GO_ERR_WritePull (WrInv:
WritePull then GO-Err; WOWrInv: then ExtCmp) and its data is dropped. ``error_writes=False``
keeps the random errors (``error_rate``) to reads and CLFlush: a dropped write-back loses the
line's dirty data, which a value checker cannot tell from a lost write.

Conflicts with the host CPU: before a device grant the CPU copy is recalled (invalidated for
E/M grants, writes and flushes; downgraded to S for S grants), dirty data written back.
A CPU request the device may hold snoops the device: SnpInv for a store, SnpData for a load
(SnpCur instead with probability ``snp_cur_rate``: the CPU then gets a use-once copy when
the device keeps its line). The snoop response and any forwarded data update memory and the
directory; impossible responses are recorded in ``protocol_errors`` (never raised).

Host obligations, and how they are kept: work on one line is serialized (a FIFO of
operations per line; an operation is done when all its messages were delivered and all the
data it pulls or snoops arrived), so: one snoop per line at a time; no GO while a snoop to
the line is pending; no WritePull concurrent with a snoop (a pull is outstanding until its
data arrives). A read's GO and data are created together (independent random delays, so
either may go first) and the line accepts no snoop until both were delivered: no snoop can
fall between them, whatever their order.

Directory: device state I/S/E/M (E also covers a silent E->M upgrade; M means GO-M was
granted, so the device owes a write-back), CPU state I/S/E/M (exact). A device read to a line
the directory says it holds is taken as a legal silent drop of a clean copy (counted in
``stats["silent_drops"]``), except after GO-M (a protocol error: GO-M dropped silently).

Bogus (dirty-evict data): a DirtyEvict that arrives when the directory no longer gives the
device E/M (a snoop took the line between the evict and its GO_WritePull) must carry Bogus=1;
a DirtyEvict from E/M must not. Bogus data is dropped; a mismatch is a protocol error.

Bias (HDM-D, ``device_hdm_range``): RdCurr/RdShared/RdOwn/RdAny/RdOwnNoData to the device's
own memory is answered with an M2S Req MemRdFwd (Tag = CQID, Addr = line, Meta0-State,
MetaValue Invalid: the host CPU never caches device memory in this model, so it holds no
copy), WOWrInv(F)/ItoMWr/WrCur with MemWrFwd; no GO, no data. Any other request there (an
evict: check 14) is a protocol error and gets an error answer.

Serialization log (for coherence checks): ``log`` lists (seq, line, value, source) for every
change of a line's value in the order the HA observes it; source is "cpu_store",
"dev_writeback" (DirtyEvict data, *Fwd* snoop data), "dev_write" (ItoMWr/WrCur/WrInv/WOWrInv
data) or "backdoor". A device's stores while it owns a line are seen at the write-back.
``serial`` is the next seq; a read's data message carries ``serial`` at its grant, and
``expected_read_value(line, serial)`` is what that read must return (the latest logged value
before ``serial``; ``serial=None`` = now). ``dir_state(line)`` -> (device, cpu) states, and
``swmr_ok(dev, cpu)`` says whether a pair allows one writer or many readers.
``obligation_checks`` counts the obligation checks made on the HA's own output (snoop / GO /
pull against the line's pending work); ``obligation_violations`` lists failures (an HA bug).
"""
from __future__ import annotations

import bisect
import collections

from hw.common.cxl_cache import (D2HReqOpcode as DQ, D2HRspOpcode as DR, H2DReqOpcode as HQ,
                                 H2DRspOpcode as HR, GOState, LEGAL_SNOOP_RESPONSES,
                                 FORWARDING_RESPONSES, QID_BITS)
from hw.common.cxl_mem import LINE_BITS, M2SReqOpcode, MetaField, MetaValue, SnpType

# Directory states (small ints: compared on every message).
I, S, E, M = 0, 1, 2, 3
STATE_NAMES = "ISEM"
ALL_ONES = (1 << LINE_BITS) - 1


def swmr_ok(dev: int, cpu: int) -> bool:
    """Single writer or multiple readers: an owner (E/M) excludes any other valid copy."""
    return dev == I or cpu == I or (dev == S and cpu == S)


# Plain ints for the per-message path.
_RD_CURR, _RD_OWN, _RD_SHARED, _RD_ANY = (DQ.RD_CURR.value, DQ.RD_OWN.value,
                                          DQ.RD_SHARED.value, DQ.RD_ANY.value)
_RD_OWN_NO_DATA, _ITOM_WR, _WR_CUR = DQ.RD_OWN_NO_DATA.value, DQ.ITOM_WR.value, DQ.WR_CUR.value
_CL_FLUSH, _CLEAN_EVICT, _DIRTY_EVICT = (DQ.CL_FLUSH.value, DQ.CLEAN_EVICT.value,
                                         DQ.DIRTY_EVICT.value)
_CLEAN_EVICT_NO_DATA, _WO_WR_INV, _WO_WR_INV_F = (DQ.CLEAN_EVICT_NO_DATA.value,
                                                  DQ.WO_WR_INV.value, DQ.WO_WR_INV_F.value)
_WR_INV, _CACHE_FLUSHED = DQ.WR_INV.value, DQ.CACHE_FLUSHED.value
_KNOWN_REQ = frozenset(op.value for op in DQ) - {DQ.RESERVED_0.value}

_SNP_DATA, _SNP_INV, _SNP_CUR = HQ.SNP_DATA.value, HQ.SNP_INV.value, HQ.SNP_CUR.value
_LEGAL = {snp.value: frozenset(r.value for r in rsps) for snp, rsps in LEGAL_SNOOP_RESPONSES.items()}
_FWD = frozenset(r.value for r in FORWARDING_RESPONSES)
_R_IHITI, _R_VHITV, _R_IHITSE = DR.RSP_I_HIT_I.value, DR.RSP_V_HIT_V.value, DR.RSP_I_HIT_SE.value
_R_SHITSE, _R_SFWDM, _R_IFWDM = DR.RSP_S_HIT_SE.value, DR.RSP_S_FWD_M.value, DR.RSP_I_FWD_M.value
_R_VFWDV = DR.RSP_V_FWD_V.value
# Device state after each snoop response (None: unchanged, the V* answers of SnpCur).
_STATE_AFTER = {_R_IHITI: I, _R_IHITSE: I, _R_IFWDM: I, _R_SHITSE: S, _R_SFWDM: S,
                _R_VHITV: None, _R_VFWDV: None}
_RSP_NAMES = {r.value: r.name for r in DR}
_SNP_NAMES = {s.value: s.name for s in HQ}

_GO, _WRITE_PULL, _GO_WRITE_PULL = HR.GO.value, HR.WRITE_PULL.value, HR.GO_WRITE_PULL.value
_GO_WRITE_PULL_DROP, _GO_ERR_WRITE_PULL = HR.GO_WRITE_PULL_DROP.value, HR.GO_ERR_WRITE_PULL.value
_FAST_GO_WRITE_PULL, _EXT_CMP = HR.FAST_GO_WRITE_PULL.value, HR.EXT_CMP.value
_PULLS = frozenset({_WRITE_PULL, _GO_WRITE_PULL, _GO_ERR_WRITE_PULL, _FAST_GO_WRITE_PULL})
_GOS = frozenset({_GO, _GO_WRITE_PULL, _GO_WRITE_PULL_DROP, _GO_ERR_WRITE_PULL})
_GO_I, _GO_S, _GO_E, _GO_M, _GO_ERR = (GOState.I.value, GOState.S.value, GOState.E.value,
                                       GOState.M.value, GOState.ERR.value)
_GO_OF_STATE = {S: _GO_S, E: _GO_E, M: _GO_M}

_MEM_RD_FWD, _MEM_WR_FWD = M2SReqOpcode.MEM_RD_FWD.value, M2SReqOpcode.MEM_WR_FWD.value
_BIAS_READS = frozenset({_RD_CURR, _RD_SHARED, _RD_OWN, _RD_ANY, _RD_OWN_NO_DATA})
_BIAS_WRITES = frozenset({_WO_WR_INV, _WO_WR_INV_F, _ITOM_WR, _WR_CUR})
_M2S_FWD_FIELDS = {"snp_type": SnpType.NO_OP.value, "meta_field": MetaField.META0_STATE.value,
                   "meta_value": MetaValue.INVALID.value, "ld_id": 0, "tc": 0}
_QID_COUNT = 1 << QID_BITS
# Requests error injection applies to (CleanEvict(NoData) has no error answer).
_INJECTABLE_READS = frozenset({_RD_CURR, _RD_OWN, _RD_SHARED, _RD_ANY, _RD_OWN_NO_DATA, _CL_FLUSH})
_INJECTABLE = _INJECTABLE_READS | {_ITOM_WR, _WR_CUR, _DIRTY_EVICT, _WR_INV, _WO_WR_INV, _WO_WR_INV_F}


class HaMsg:
    """One message the HA wants sent (see the module docstring)."""
    __slots__ = ("channel", "fields", "delay", "line", "op", "serial")

    def __init__(self, channel, fields, delay, line, op, serial=-1):
        self.channel = channel
        self.fields = fields
        self.delay = delay
        self.line = line
        self.op = op
        self.serial = serial

    def __repr__(self):
        return f"HaMsg({self.channel}, line={self.line:#x}, {self.fields if 'data' not in self.fields else '...'})"


class _Op:
    """One unit of serialized work on a line: a device request or a CPU request."""
    __slots__ = ("kind", "line", "opcode", "cqid", "store", "waiting", "uqid", "snoop",
                 "snoop_rsp", "snoop_data", "error", "bogus_expected", "grant", "then")

    def __init__(self, kind, line, opcode=0, cqid=-1, store=False):
        self.kind = kind            # "dev" or "cpu"
        self.line = line
        self.opcode = opcode
        self.cqid = cqid
        self.store = store
        self.waiting = 0            # messages not yet delivered + data not yet received
        self.uqid = -1              # host UQID of this op's pull or snoop
        self.snoop = -1             # snoop opcode while a snoop is outstanding
        self.snoop_rsp = -1
        self.snoop_data = None      # D2H data fields of a *Fwd* answer
        self.error = False
        self.bogus_expected = False
        self.grant = I
        self.then = None            # continuation once waiting drops to 0


class _Line:
    __slots__ = ("dev", "cpu", "queue", "unsent_reads", "pull_open", "snoop_open")

    def __init__(self):
        self.dev = I
        self.cpu = I
        self.queue: collections.deque[_Op] = collections.deque()
        self.unsent_reads = 0       # read GO/data messages created, not yet delivered
        self.pull_open = 0          # pulls sent or queued whose data has not arrived
        self.snoop_open = False


class HomeAgent:
    def __init__(self, host_range, gpu_range=None, device_hdm_range=None, *, rng=None,
                 max_delay: int = 0, grant_m: bool = False, rdshared_grant_e: bool = False,
                 snp_cur_rate: float = 0.0, error_lines=(), error_rate: float = 0.0,
                 error_writes: bool = True):
        self.ranges = [r for r in (host_range, gpu_range) if r is not None]
        self.device_hdm_range = device_hdm_range
        self.rng = rng
        self.max_delay = max_delay if rng is not None else 0
        self.grant_m = grant_m
        self.rdshared_grant_e = rdshared_grant_e
        self.snp_cur_rate = snp_cur_rate if rng is not None else 0.0
        self.error_lines = set(error_lines)
        self.error_rate = error_rate if rng is not None else 0.0
        self.error_writes = error_writes
        self.memory: dict[int, int] = {}
        self.poisoned: set[int] = set()
        self.lines: dict[int, _Line] = {}
        self.cpu = None
        self.protocol_errors: list[str] = []
        self.obligation_checks = 0
        self.obligation_violations: list[str] = []
        self.log: list[tuple[int, int, int, str]] = []
        self._line_log: dict[int, tuple[list[int], list[int]]] = {}
        self._uqids: dict[int, _Op] = {}
        self._next_uqid = 0
        self._live_cqids: set[int] = set()
        self._out: list[HaMsg] = []
        self.stats = collections.Counter()

    # ---- configuration and backdoor
    def attach_cpu(self, cpu) -> None:
        self.cpu = cpu

    def is_host_line(self, line: int) -> bool:
        for base, size in self.ranges:
            if 0 <= line - base < size:
                return True
        return False

    def is_device_line(self, line: int) -> bool:
        r = self.device_hdm_range
        return r is not None and 0 <= line - r[0] < r[1]

    def read_memory(self, line: int) -> int:
        return self.memory.get(line, 0)

    def write_memory(self, line: int, value: int) -> None:
        """Backdoor preload (logged as "backdoor")."""
        self.memory[line] = value
        self._log_value(line, value, "backdoor")

    def dir_state(self, line: int) -> tuple[int, int]:
        rec = self.lines.get(line)
        return (rec.dev, rec.cpu) if rec is not None else (I, I)

    @property
    def serial(self) -> int:
        return len(self.log)

    def expected_read_value(self, line: int, serial: int | None = None) -> int:
        seqs, values = self._line_log.get(line, ((), ()))
        if serial is None:
            return values[-1] if values else 0
        i = bisect.bisect_left(seqs, serial)
        return values[i - 1] if i else 0

    @property
    def idle(self) -> bool:
        return not self._uqids and not any(rec.queue for rec in self.lines.values())

    # ---- inputs
    def handle_d2h(self, kind: str, fields: dict) -> list[HaMsg]:
        if kind == "req":
            self._on_req(fields)
        elif kind == "rsp":
            self._on_rsp(fields)
        elif kind == "data":
            self._on_data(fields)
        else:
            raise ValueError(f"unknown D2H kind {kind!r}")
        return self._take()

    def sent(self, msg: HaMsg) -> list[HaMsg]:
        op = msg.op
        if op is not None:
            rec = self.lines.get(op.line)
            if rec is not None and msg.channel in ("h2d_rsp", "h2d_data") and op.kind == "dev" \
                    and op.opcode in (_RD_SHARED, _RD_OWN, _RD_ANY, _RD_OWN_NO_DATA, _RD_CURR):
                rec.unsent_reads -= 1
            self._progress(op)
        return self._take()

    def cpu_request(self, line: int, store: bool) -> list[HaMsg]:
        """The CPU cache misses on ``line`` (``store``: it wants to write). Answered with
        ``cpu.fill`` once any snoop of the device completed."""
        self.stats["cpu_requests"] += 1
        self._enqueue(_Op("cpu", line, store=store))
        return self._take()

    def cpu_store(self, line: int, value: int) -> None:
        """A store that hit in the CPU cache (E or M): the line's new value."""
        rec = self._line(line)
        if rec.cpu not in (E, M) or rec.dev not in (I,):
            self.protocol_errors.append(f"CPU store to line {line:#x} in CPU state "
                                        f"{STATE_NAMES[rec.cpu]}, device {STATE_NAMES[rec.dev]}")
        rec.cpu = M
        self._log_value(line, value, "cpu_store")

    def cpu_evict(self, line: int, dirty_value: int | None = None) -> None:
        """The CPU cache drops ``line``, writing back ``dirty_value`` if it was modified."""
        rec = self._line(line)
        if dirty_value is not None:
            self.memory[line] = dirty_value
        rec.cpu = I

    # ---- internals: output, ids, log
    def _take(self) -> list[HaMsg]:
        out = self._out
        self._out = []
        return out

    def _delay(self) -> int:
        return self.rng.randint(0, self.max_delay) if self.max_delay else 0

    def _emit(self, channel, fields, op, serial=-1) -> HaMsg:
        msg = HaMsg(channel, fields, self._delay(), op.line, op, serial)
        op.waiting += 1
        self._out.append(msg)
        return msg

    def _alloc_uqid(self, op) -> int:
        for _ in range(_QID_COUNT):
            uqid = self._next_uqid
            self._next_uqid = (uqid + 1) % _QID_COUNT
            if uqid not in self._uqids:
                self._uqids[uqid] = op
                op.uqid = uqid
                return uqid
        raise RuntimeError("home agent ran out of UQIDs")

    def _line(self, line: int) -> _Line:
        rec = self.lines.get(line)
        if rec is None:
            rec = self.lines[line] = _Line()
        return rec

    def _log_value(self, line, value, source):
        seq = len(self.log)
        self.log.append((seq, line, value, source))
        seqs, values = self._line_log.setdefault(line, ([], []))
        seqs.append(seq)
        values.append(value)

    def _error(self, text):
        self.protocol_errors.append(text)

    def _is_error(self, line, opcode) -> bool:
        if line in self.error_lines:
            return True
        if not self.error_writes and opcode not in _INJECTABLE_READS:
            return False
        return bool(self.error_rate) and self.rng.random() < self.error_rate

    # ---- serialization per line
    def _enqueue(self, op: _Op) -> None:
        rec = self._line(op.line)
        rec.queue.append(op)
        if len(rec.queue) == 1:
            self._run_queue(rec)

    def _run_queue(self, rec: _Line) -> None:
        while rec.queue:
            op = rec.queue[0]
            if op.kind == "dev":
                self._start_dev(op, rec)
            else:
                self._start_cpu(op, rec)
            if op.waiting:
                return
            self._retire(op, rec)

    def _retire(self, op: _Op, rec: _Line) -> None:
        rec.queue.popleft()
        if op.kind == "dev":
            self._live_cqids.discard(op.cqid)

    def _progress(self, op: _Op) -> None:
        """One of the op's awaited events happened."""
        op.waiting -= 1
        if op.waiting:
            return
        if op.then is not None:
            then, op.then = op.then, None
            then(op)
            if op.waiting:
                return
        rec = self.lines.get(op.line)
        if rec is not None and rec.queue and rec.queue[0] is op:
            self._retire(op, rec)
            self._run_queue(rec)

    # ---- obligation self-checks (on what the HA is about to send)
    def _check_grant(self, rec: _Line, line: int, what: str) -> None:
        self.obligation_checks += 1
        if rec.snoop_open:
            self.obligation_violations.append(f"{what} to line {line:#x} while a snoop is pending")

    def _check_snoop(self, rec: _Line, line: int) -> None:
        self.obligation_checks += 1
        if rec.snoop_open or rec.unsent_reads or rec.pull_open:
            self.obligation_violations.append(
                f"snoop to line {line:#x} with snoop_open={rec.snoop_open} "
                f"unsent_reads={rec.unsent_reads} pull_open={rec.pull_open}")

    # ---- CPU conflicts
    def _recall_cpu(self, rec: _Line, line: int, invalidate: bool) -> None:
        """Invalidate (or downgrade to S) the CPU copy, writing dirty data back."""
        if rec.cpu == I or (not invalidate and rec.cpu == S):
            return
        dirty = self.cpu.recall(line, invalidate) if self.cpu is not None else None
        if dirty is not None:
            self.memory[line] = dirty
            self.stats["cpu_writebacks"] += 1
        rec.cpu = I if invalidate else S

    # ---- device requests
    def _on_req(self, f: dict) -> None:
        op = _Op("dev", f["addr"], f["opcode"], f["cqid"])
        self.stats["d2h_req"] += 1
        if op.opcode not in _KNOWN_REQ:
            self._error(f"D2H request with reserved opcode {op.opcode:#x} (CQID {op.cqid:#x})")
            return
        if op.cqid in self._live_cqids:
            self._error(f"D2H request reuses live CQID {op.cqid:#x}")
        self._live_cqids.add(op.cqid)
        if op.opcode == _CACHE_FLUSHED:
            for line, rec in self.lines.items():
                if rec.dev == M:
                    self._error(f"CacheFlushed while line {line:#x} was granted GO-M")
                rec.dev = I
            op.then = self._release_cqid
            self._rsp(op, _GO, _GO_I)
            return
        if self.is_device_line(op.line):
            self._on_device_memory_req(op)
            return
        if not self.is_host_line(op.line):
            self._error(f"D2H request to undecoded line {op.line:#x}")
            op.error = True
        self._enqueue(op)

    def _on_device_memory_req(self, op: _Op) -> None:
        opcode = op.opcode
        if opcode in _BIAS_READS or opcode in _BIAS_WRITES:
            self.stats["mem_fwd"] += 1
            fields = dict(_M2S_FWD_FIELDS, opcode=_MEM_RD_FWD if opcode in _BIAS_READS else _MEM_WR_FWD,
                          tag=op.cqid, addr=op.line)
            msg = HaMsg("m2s_req", fields, 0, op.line, op)
            op.waiting += 1
            op.then = self._release_cqid
            self._out.append(msg)
            return
        self._error(f"request {DQ(opcode).name} to the device's own HDM line {op.line:#x} on CXL.cache")
        op.error = True
        self._enqueue(op)

    def _release_cqid(self, op: _Op) -> None:
        self._live_cqids.discard(op.cqid)

    def _rsp(self, op, opcode, rsp_data) -> HaMsg:
        return self._emit("h2d_rsp", {"opcode": opcode, "rsp_data": rsp_data, "rsp_pre": 0,
                                      "cqid": op.cqid}, op)

    def _data(self, op, value, poison=0, go_err=0) -> HaMsg:
        return self._emit("h2d_data", {"cqid": op.cqid, "chunk_valid": 1, "poison": poison,
                                       "go_err": go_err, "data": value}, op, self.serial)

    def _start_dev(self, op: _Op, rec: _Line) -> None:
        opcode = op.opcode
        line = op.line
        if op.error or (opcode in _INJECTABLE and self._is_error(line, opcode)):
            self._answer_error(op, rec)
            return
        if opcode in (_RD_SHARED, _RD_OWN, _RD_ANY, _RD_OWN_NO_DATA):
            if rec.dev == M:
                self._error(f"{DQ(opcode).name} to line {line:#x} the device holds after GO-M "
                            "(GO-M dropped silently)")
            elif rec.dev != I:
                self.stats["silent_drops"] += 1
            if opcode == _RD_SHARED:
                grant = E if self.rdshared_grant_e and rec.cpu == I else S
            elif opcode == _RD_ANY:
                grant = E if rec.cpu == I else S
            else:
                grant = M if self.grant_m and opcode == _RD_OWN else E
            self._recall_cpu(rec, line, invalidate=grant != S)
            self._check_grant(rec, line, "GO")
            rec.dev = grant
            op.grant = grant
            rec.unsent_reads += 2 if opcode != _RD_OWN_NO_DATA else 1
            self._rsp(op, _GO, _GO_OF_STATE[grant])
            if opcode != _RD_OWN_NO_DATA:
                self._data(op, self.memory.get(line, 0), int(line in self.poisoned))
            self.stats["grants_" + STATE_NAMES[grant]] += 1
        elif opcode == _RD_CURR:
            # A snapshot: the CPU's dirty copy is the current value (no state change).
            value = self.memory.get(line, 0)
            if rec.cpu == M:
                value = self.expected_read_value(line)
            rec.unsent_reads += 1
            self._data(op, value, int(line in self.poisoned))
        elif opcode in (_CL_FLUSH, _CLEAN_EVICT_NO_DATA):
            if opcode == _CL_FLUSH:
                self._recall_cpu(rec, line, invalidate=True)
            self._device_gives_up(rec, line, opcode)
            self._check_grant(rec, line, "GO")
            self._rsp(op, _GO, _GO_I)
        elif opcode in (_DIRTY_EVICT, _CLEAN_EVICT):
            op.bogus_expected = rec.dev not in (E, M)
            if opcode == _CLEAN_EVICT and rec.dev == M:
                self._error(f"CleanEvict of line {line:#x} granted GO-M")
            rec.dev = I        # the device gives up snoop ownership at the GO_WritePull
            drop = opcode == _CLEAN_EVICT and self.rng is not None and self.rng.random() < 0.5
            self._check_grant(rec, line, "GO_WritePull")
            if drop:
                self._rsp(op, _GO_WRITE_PULL_DROP, 0)
                self.stats["clean_evict_drop"] += 1
            else:
                self._pull(op, rec, _GO_WRITE_PULL)
        elif opcode in (_ITOM_WR, _WR_CUR, _WR_INV, _WO_WR_INV, _WO_WR_INV_F):
            self._recall_cpu(rec, line, invalidate=True)
            if rec.dev != I:
                self.stats["silent_drops"] += 1
                if rec.dev == M:
                    self._error(f"{DQ(opcode).name} to line {line:#x} the device holds after GO-M")
                rec.dev = I
            self._check_grant(rec, line, "pull")
            pull = {_WR_INV: _WRITE_PULL, _WO_WR_INV: _FAST_GO_WRITE_PULL,
                    _WO_WR_INV_F: _FAST_GO_WRITE_PULL}.get(opcode, _GO_WRITE_PULL)
            self._pull(op, rec, pull)
        else:
            self._error(f"unsupported D2H request {DQ(opcode).name} to line {line:#x}")
            self._answer_error(op, rec)

    def _device_gives_up(self, rec, line, opcode):
        if rec.dev == M:
            self._error(f"{DQ(opcode).name} of line {line:#x} granted GO-M without a write-back")
        rec.dev = I

    def _pull(self, op, rec, opcode):
        uqid = self._alloc_uqid(op)
        rec.pull_open += 1
        op.waiting += 1                 # the data
        self._rsp(op, opcode, uqid)

    def _answer_error(self, op: _Op, rec: _Line) -> None:
        opcode = op.opcode
        self.stats["errors_injected"] += 1
        if opcode in (_RD_SHARED, _RD_OWN, _RD_ANY, _RD_CURR):
            rec.unsent_reads += 1
            if opcode != _RD_CURR:
                rec.unsent_reads += 1
                self._rsp(op, _GO, _GO_ERR)
            self._data(op, ALL_ONES, poison=1, go_err=1)
        elif opcode in (_RD_OWN_NO_DATA, _CL_FLUSH, _CACHE_FLUSHED):
            if opcode == _RD_OWN_NO_DATA:
                rec.unsent_reads += 1
            self._rsp(op, _GO, _GO_ERR)
        elif opcode == _CLEAN_EVICT_NO_DATA:
            rec.dev = I
            self._rsp(op, _GO, _GO_I)
        elif opcode == _CLEAN_EVICT:
            rec.dev = I
            self._rsp(op, _GO_WRITE_PULL_DROP, 0)
        else:
            op.error = True
            if opcode == _DIRTY_EVICT:
                op.bogus_expected = rec.dev not in (E, M)
                rec.dev = I
            pull = {_WR_INV: _WRITE_PULL, _WO_WR_INV: _FAST_GO_WRITE_PULL,
                    _WO_WR_INV_F: _FAST_GO_WRITE_PULL}.get(opcode, _GO_ERR_WRITE_PULL)
            self._pull(op, rec, pull)

    def _on_data(self, f: dict) -> None:
        uqid = f["uqid"]
        op = self._uqids.get(uqid)
        if op is None:
            self._error(f"D2H data for UQID {uqid:#x} that nobody is waiting for")
            return
        if op.kind == "cpu":             # forwarded snoop data
            if op.snoop_data is not None:
                self._error(f"second D2H data for snoop UQID {uqid:#x}")
                return
            op.snoop_data = f
            if op.snoop_rsp < 0:
                return                   # the response comes later; it decides
            self._finish_snoop(op)
            return
        del self._uqids[uqid]
        rec = self.lines[op.line]
        rec.pull_open -= 1
        line = op.line
        opcode = op.opcode
        bogus = f["bogus"]
        if opcode in (_DIRTY_EVICT, _CLEAN_EVICT):
            if bogus != op.bogus_expected:
                self._error(f"{DQ(opcode).name} data for line {line:#x} has Bogus={bogus}, expected "
                            f"{int(op.bogus_expected)} (snoop between evict and pull: "
                            f"{op.bogus_expected})")
        elif bogus:
            self._error(f"{DQ(opcode).name} data for line {line:#x} has Bogus=1")
        if op.error or bogus:
            self.stats["pull_data_dropped"] += 1
        elif opcode == _CLEAN_EVICT:
            if f["data"] != self.memory.get(line, 0) and not op.bogus_expected:
                self._error(f"CleanEvict data for line {line:#x} differs from memory")
        else:
            self.memory[line] = f["data"]
            if f["poison"]:
                self.poisoned.add(line)
            else:
                self.poisoned.discard(line)
            self._log_value(line, f["data"], "dev_writeback" if opcode == _DIRTY_EVICT else "dev_write")
        if opcode == _WR_INV:
            op.then = self._after_wr_inv
        elif opcode in (_WO_WR_INV, _WO_WR_INV_F):
            op.then = self._after_wo_wr_inv
        self._progress(op)

    def _after_wr_inv(self, op):
        self._check_grant(self.lines[op.line], op.line, "GO")
        self._rsp(op, _GO, _GO_ERR if op.error else _GO_I)

    def _after_wo_wr_inv(self, op):
        self._rsp(op, _EXT_CMP, 0)

    # ---- CPU requests and snoops
    def _start_cpu(self, op: _Op, rec: _Line) -> None:
        line = op.line
        dev = rec.dev
        if dev == I or (dev == S and not op.store):
            self._cpu_grant(op, rec)
            return
        if op.store:
            snoop = _SNP_INV
        elif self.snp_cur_rate and self.rng.random() < self.snp_cur_rate:
            snoop = _SNP_CUR
        else:
            snoop = _SNP_DATA
        self._check_snoop(rec, line)
        rec.snoop_open = True
        op.snoop = snoop
        uqid = self._alloc_uqid(op)
        self.stats["snoops_" + _SNP_NAMES[snoop]] += 1
        op.waiting += 1                  # the response (and its data, counted on arrival)
        self._out.append(HaMsg("h2d_req", {"opcode": snoop, "addr": line, "uqid": uqid},
                               self._delay(), line, None))

    def _cpu_grant(self, op: _Op, rec: _Line, use_once: bool = False) -> None:
        line = op.line
        if use_once:
            state = I
        elif op.store or rec.dev == I:
            state = E
        else:
            state = S
        rec.cpu = state
        if self.cpu is not None:
            # Memory is current here: the device had no dirty copy or just forwarded it.
            self.cpu.fill(line, state, self.memory.get(line, 0))

    def _on_rsp(self, f: dict) -> None:
        uqid = f["uqid"]
        op = self._uqids.get(uqid)
        if op is None or op.kind != "cpu" or op.snoop_rsp >= 0:
            self._error(f"D2H response {_RSP_NAMES.get(f['opcode'], f['opcode'])} for UQID {uqid:#x}"
                        " that no snoop is waiting for")
            return
        op.snoop_rsp = f["opcode"]
        if op.snoop_rsp in _FWD and op.snoop_data is None:
            return                      # wait for the forwarded line
        self._finish_snoop(op)

    def _finish_snoop(self, op: _Op) -> None:
        line = op.line
        rec = self.lines[line]
        rsp = op.snoop_rsp
        snp = op.snoop
        name = _RSP_NAMES.get(rsp, f"reserved({rsp:#x})")
        where = f"{name} to {_SNP_NAMES[snp]} of line {line:#x} (directory: device " \
                f"{STATE_NAMES[rec.dev]})"
        del self._uqids[op.uqid]
        rec.snoop_open = False
        if rsp not in _LEGAL[snp]:
            self._error(f"illegal snoop response {where}")
        fwd = rsp in _FWD
        if fwd != (op.snoop_data is not None):
            self._error(f"{'*Fwd* response without' if fwd else 'D2H data with non-forwarding'} "
                        f"data: {where}")
        if rec.dev == M and not fwd:
            self._error(f"{where}: a GO-M line answered without forwarding its data")
        if rec.dev == S and fwd:
            self._error(f"{where}: forwarded data from a line granted only S")
        if rec.dev == I:
            self.obligation_violations.append(f"{where}: snoop sent to a line the device does not hold")
        if op.snoop_data is not None and fwd:
            d = op.snoop_data
            if d["bogus"]:
                self._error(f"snoop data for line {line:#x} has Bogus=1")
            else:
                self.memory[line] = d["data"]
                if d["poison"]:
                    self.poisoned.add(line)
                else:
                    self.poisoned.discard(line)
                self._log_value(line, d["data"], "dev_writeback")
        after = _STATE_AFTER.get(rsp, I)
        self.stats["snoop_rsp_" + name] += 1
        use_once = False
        if after is not None:
            if snp == _SNP_INV and after != I:
                after = I               # already reported as illegal
            rec.dev = after
        else:
            use_once = rec.dev != S      # the device kept E/M: the CPU gets a copy to use once
        self._cpu_grant(op, rec, use_once=use_once)
        self._progress(op)
