"""CommandProcessor (hw/ndp/processor.py) in Amaranth's simulator: the table descriptor checks
and the checkpointed UPDATE's record check.

One command per simulation, behind the memory stand-in of tests/pysim_memory.py, with engine
stubs that pulse ``done`` a few cycles after ``start``.

Table checks: descriptor reads answered out of order (random latency); the completion must
carry the error the golden validator (sim/model/ndp_validate.py, written from the documented
check order) names for the lowest failing table, and no engine may start.

Record check: one UPDATE (``flags.checkpoint``, batch k). Record lines come from the golden
model (``sim.model.checkpoint.pack_record``, zlib.crc32), not from the RTL's CRC. Expected:
the engine starts only when line 0 of slot k mod 2 holds a valid LOGGED record of batch k
(else NOT_LOGGED and no write but the completion); a region outside device memory gives
ADDRESS / LOG_REGION and a record read with error MEDIA, both before any record read or
engine start respectively; after the engine, the APPLIED record (the LOGGED record's count
and lines) is durable before the completion is written.
"""
import random

import pytest
from amaranth.sim import Simulator

from hw.checkpoint.log_format import RECORD_LINE_APPLIED, RECORD_LINE_LOGGED, LogRegion, LogState
from hw.ndp.command import (AddressFault, CommandDescriptor, CommandFlags, Completion, NdpError, NdpOpcode,
                            PoolMode, TableDescriptor)
from hw.ndp.processor import CommandProcessor
from pysim_memory import MemModel
from sim.model import checkpoint as ck
from sim.model.codec import StructCodec
from sim.model.ndp_validate import expected_error

CMD = StructCodec(CommandDescriptor)
FLAGS = StructCodec(CommandFlags)
TBL = StructCodec(TableDescriptor)
REG = StructCodec(LogRegion)
CPL = StructCodec(Completion)
CAP = 1 << 12
SQ, CQ, TABLES = 100, 200, 300
REGION = dict(log_base=1000, slot_lines=100, mlp_base=0, mlp_lines=0, mlp_host_addr=0)
ENGINE_CYCLES = 5


def slot_line(region, k, line):
    return region["log_base"] + (k & 1) * region["slot_lines"] + line


def run_command(mem: dict, *, region=REGION, seed=1, rd_error_line=None, lat=(2, 9), commands=1):
    """The command in ring slot 0 (``mem[SQ]``) with memory ``mem``; the engines are stubs.
    Returns (completion fields, engine started, memory model). With ``commands`` > 1 the ring
    slots 0 .. commands-1 run back to back; then the completion fields and the engine starts
    are lists, one per command."""
    dut = CommandProcessor(addr_bits=12, capacity_lines=CAP)
    mm = MemModel(dut.mem, mem, random.Random(seed), capacity=CAP, ready_p=0.7, lat=lat,
                  rd_error=() if rd_error_line is None else (rd_error_line,))
    engines = (dut.lookup, dut.update, dut.log, dut.mlp_log, dut.recover)
    started = []

    async def bench(ctx):
        ctx.set(dut.sq_base, SQ)
        ctx.set(dut.cq_base, CQ)
        ctx.set(dut.size_log2, 2)
        ctx.set(dut.region.as_value(), REG.pack(**region))
        ctx.set(dut.sq_tail, commands)
        for cycle in range(1000 * commands):
            mm.drive(ctx, cycle)
            for eng in engines:
                ctx.set(eng.done, int(bool(started) and cycle == started[-1][1] + ENGINE_CYCLES))
            mm.sample(ctx, cycle)
            if any(ctx.get(eng.start) for eng in engines):
                started.append((ctx.get(dut.sq_head), cycle))
            if ctx.get(dut.completed) and ctx.get(dut.sq_head) == commands - 1:
                return
            await ctx.tick()
        raise AssertionError("no completion")

    sim = Simulator(dut)
    sim.add_clock(1e-9)
    sim.add_testbench(bench)
    sim.run()
    assert len(started) == len({c for c, _ in started}) <= commands
    if commands == 1:
        return CPL.unpack(mem[CQ]), bool(started), mm
    return [CPL.unpack(mem[CQ + c]) for c in range(commands)], [any(c == i for i, _ in started)
                                                                 for c in range(commands)], mm


def run_update(k, record, *, region=REGION, seed=1, rd_error_line=None):
    """One checkpointed UPDATE of batch k with ``record`` (or nothing) at its slot's line 0.
    Returns (completion fields, engine started, memory model, memory)."""
    mem = {SQ: CMD.pack(opcode=NdpOpcode.UPDATE, flags=FLAGS.pack(checkpoint=1), tag=0x77, num_tables=1,
                        batch_size=2, tables_addr=TABLES, offsets_addr=310, grad_addr=400, row_pitch_lines=1,
                        batch=k),
           TABLES: TBL.pack(base_addr=500, rows=10, dim=16, mode=0, col_lines=0)}
    if record is not None:
        mem[slot_line(region, k, RECORD_LINE_LOGGED)] = record
    cpl, started, mm = run_command(mem, region=region, seed=seed, rd_error_line=rd_error_line)
    return cpl, started, mm, mem


def logged(k, **kw):
    return ck.pack_record(kw.pop("state", LogState.LOGGED), kw.pop("slot", k & 1), kw.pop("batch", k),
                          **{"count": 3, "lines": 9, **kw})


@pytest.mark.parametrize("k", [4, 5, 0xFFFF_FFFF])
def test_logged_record_starts_the_update_then_applied_before_completion(k):
    cpl, started, mm, mem = run_update(k, logged(k))
    assert NdpError(cpl["error"]) == NdpError.OK and started
    applied_line = slot_line(REGION, k, RECORD_LINE_APPLIED)
    assert [w[0] for w in mm.writes] == [applied_line, CQ]
    assert ck.record_valid(mem[applied_line], slot=k & 1, state=LogState.APPLIED, batch=k)
    assert ck.unpack_record(mem[applied_line])["count"] == 3 and ck.unpack_record(mem[applied_line])["lines"] == 9
    applied_w, completion_w = mm.writes
    assert applied_w[2] is not None and applied_w[2] < completion_w[1], "completion before APPLIED was durable"


@pytest.mark.parametrize("record", [
    pytest.param(logged(5, batch=3), id="other_batch"),
    pytest.param(logged(5, batch=5 | 1 << 31), id="batch_high_bit"),
    pytest.param(logged(5, slot=0), id="other_slot"),
    pytest.param(logged(5, slot=3), id="slot_high_bits"),
    pytest.param(logged(5, state=LogState.APPLIED), id="applied"),
    pytest.param(logged(5, state=LogState.FREE), id="free"),
    pytest.param(logged(5, crc=1234), id="bad_crc"),
    pytest.param(logged(5, magic=0x1234), id="bad_magic"),
    pytest.param(logged(5) ^ 1 << 60, id="reserved_bit"),
    pytest.param(logged(5) ^ 1 << 400, id="bit_past_the_record"),
    pytest.param(None, id="never_written"),
])
def test_invalid_record_is_not_logged(record):
    cpl, started, mm, _ = run_update(5, record)
    assert NdpError(cpl["error"]) == NdpError.NOT_LOGGED and not started
    assert [w[0] for w in mm.writes] == [CQ]


def test_record_crc_is_the_command_own():
    """Two checkpointed UPDATEs back to back (batches 4 and 5, slots 0 and 1): the second
    record's crc field holds the first record's CRC. The record's CRC is registered a cycle
    before the compare (CRC_LOGGED, then CHECK_LOGGED): it must be this record's, not the one
    left from the previous command (a mutant registering it from the line already in the
    register one state early, i.e. the previous record, passes the second record; checked)."""
    first = logged(4)
    second_ok = logged(5)
    second_bad = logged(5, crc=ck.unpack_record(first)["crc"])
    assert second_bad != second_ok
    for second, want in ((second_bad, NdpError.NOT_LOGGED), (second_ok, NdpError.OK)):
        mem = {c: CMD.pack(opcode=NdpOpcode.UPDATE, flags=FLAGS.pack(checkpoint=1), tag=c, num_tables=1,
                           batch_size=2, tables_addr=TABLES, offsets_addr=310, grad_addr=400, row_pitch_lines=1,
                           batch=k) for c, k in ((SQ, 4), (SQ + 1, 5))}
        mem[TABLES] = TBL.pack(base_addr=500, rows=10, dim=16, mode=0, col_lines=0)
        mem[slot_line(REGION, 4, RECORD_LINE_LOGGED)] = first
        mem[slot_line(REGION, 5, RECORD_LINE_LOGGED)] = second
        cpls, started, _ = run_command(mem, commands=2)
        assert [NdpError(c["error"]) for c in cpls] == [NdpError.OK, want]
        assert started == [True, want == NdpError.OK]


@pytest.mark.parametrize("region, ok", [
    pytest.param({**REGION, "slot_lines": 2}, False, id="slot_too_small"),
    pytest.param({**REGION, "slot_lines": 3}, True, id="smallest_slot"),
    pytest.param({**REGION, "log_base": CAP - 200, "slot_lines": 100}, True, id="ends_at_capacity"),
    pytest.param({**REGION, "log_base": CAP - 200, "slot_lines": 101}, False, id="past_capacity"),
    pytest.param({**REGION, "log_base": 0xFFFF_FF00, "slot_lines": 0x80}, False, id="would_wrap"),
])
def test_log_region_bounds(region, ok):
    k = 5
    mem_record = logged(k) if slot_line(region, k, 0) < CAP else None
    cpl, started, mm, _ = run_update(k, mem_record, region=region)
    if ok:
        assert NdpError(cpl["error"]) == NdpError.OK and started
    else:
        assert NdpError(cpl["error"]) == NdpError.ADDRESS and cpl["error_info"] == AddressFault.LOG_REGION
        assert not started and [w[0] for w in mm.writes] == [CQ]
        assert [a for a, _ in mm.reads] == [SQ, TABLES], "no record read outside the region check"


def test_record_read_error_is_media():
    k = 5
    cpl, started, mm, _ = run_update(k, logged(k), rd_error_line=slot_line(REGION, k, RECORD_LINE_LOGGED))
    assert NdpError(cpl["error"]) == NdpError.MEDIA and not started
    assert [w[0] for w in mm.writes] == [CQ]


def _bad_descriptor(rng: random.Random, d: dict, pitch: int) -> dict:
    """``d`` with one of the checks of the processor's docstring broken (or two, in one table)."""
    kind = rng.choice(["dim", "rows", "mode", "weighted", "col", "addr", "dim+rows"])
    d = dict(d)
    if kind in ("dim", "dim+rows"):
        d["dim"] = rng.choice([0, 8, 24, 272])
    if kind in ("rows", "dim+rows"):
        d["rows"] = 0
    if kind == "mode":
        d["mode"] = 3
    if kind == "weighted":
        d["mode"] = PoolMode.WEIGHTED_SUM.value
    if kind == "col":
        d["col_lines"] = pitch
    if kind == "addr":
        d["base_addr"] = CAP - d["rows"] * d["dim"] // 16 + 1
    return d


@pytest.mark.parametrize("seed", range(12))
def test_table_checks_with_responses_out_of_order(seed):
    """Up to four bad tables among 16, descriptor reads answered after 2-60 cycles (so out of
    order): the lowest bad table's first failing check, as the golden validator orders them,
    and no engine start. Mutants that keep the first or the last failing response instead of
    the lowest table fail this (checked when it was written)."""
    rng = random.Random(seed)
    T, pitch = 16, 4
    good = [dict(base_addr=1000 + 40 * t, rows=10, dim=rng.choice([16, 32, 64]), mode=rng.choice([0, 1]),
                 col_lines=0) for t in range(T)]
    descs = list(good)
    for t in rng.sample(range(T), rng.randint(0 if seed == 0 else 1, 4)):
        descs[t] = _bad_descriptor(rng, good[t], pitch)
    opcode = rng.choice([NdpOpcode.LOOKUP, NdpOpcode.UPDATE, NdpOpcode.LOG])
    cmd_line = CMD.pack(opcode=opcode, flags=FLAGS.pack(has_weights=0), tag=0x5, num_tables=T, batch_size=1,
                        tables_addr=TABLES, offsets_addr=310, out_addr=400, grad_addr=400, row_pitch_lines=pitch)
    mem = {SQ: cmd_line, **{TABLES + t: TBL.pack(**d) for t, d in enumerate(descs)}}
    want = expected_error(cmd_line, [mem[TABLES + t] for t in range(T)], [0] * (T + 1), [], CAP)
    cpl, started, mm = run_command(mem, seed=seed, lat=(2, 60))
    order = [a - TABLES for a, _ in mm.read_answers if TABLES <= a < TABLES + T]
    assert sorted(order) == list(range(T)) and order != sorted(order), f"seed {seed}: tables answered in order"
    assert (NdpError(cpl["error"]), cpl["error_info"]) == want, (seed, opcode, order)
    assert started == (want[0] == NdpError.OK)
