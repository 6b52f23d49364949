"""Golden checkpoint model (sim/model/checkpoint.py) and the GPU agent (sim/bfm/gpu_agent.py); pure Python.

Records and entries against hand-built bytes and zlib, tearing at 8-byte granularity,
golden recovery on scripted memory images (crash before LOGGED, between LOGGED and APPLIED,
after APPLIED, during recovery), MLP log selection, the LOG checker, the training golden
against sim/model/embedding applied directly, and the GPU agent's image and timing model.
"""
from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

from hw.checkpoint.log_format import ENTRY_MAGIC, GROUP_ENTRIES, GROUP_MAGIC, LOG_MAGIC, LogState
from hw.ndp.command import NdpError
from sim.bfm.gpu_agent import (DEFAULT_EFFICIENCY, RTX3090_PEAK_FLOPS, GpuAgent, cache_window, mlp_image_lines,
                               mlp_layers, mlp_param_count, mlp_time_cycles, mlp_timing)
from sim.model import checkpoint as ck
from sim.model import embedding
from sim.model.home_agent import HomeAgent
from sim.model.trace import TraceKnobs, generate_trace

ALL_WORDS = 0xFF


# --------------------------------------------------------------------------------------------
# records and entries
# --------------------------------------------------------------------------------------------
def test_record_round_trip_and_crc_against_hand_built_bytes():
    line = ck.pack_record(LogState.LOGGED, 1, 0x1234_5678, count=7, lines=21)
    raw = struct.pack("<IBBHIIII", LOG_MAGIC, LogState.LOGGED.value, 1, 0, 0x1234_5678, 7, 21, 0).ljust(64, b"\0")
    crc = zlib.crc32(raw)
    want = int.from_bytes(raw, "little") | crc << (8 * 20)
    assert line == want
    f = ck.unpack_record(line)
    assert (f["magic"], f["state"], f["slot"], f["batch"], f["count"], f["lines"], f["crc"]) == \
        (LOG_MAGIC, 1, 1, 0x1234_5678, 7, 21, crc)
    assert ck.record_valid(line) and ck.record_valid(line, slot=1, state=LogState.LOGGED, batch=0x1234_5678)
    assert not ck.record_valid(line, slot=0)
    assert not ck.record_valid(line, state=LogState.APPLIED)
    assert not ck.record_valid(line, batch=3)
    assert not ck.record_valid(ck.pack_record(LogState.LOGGED, 1, 5, crc=crc ^ 1))
    assert not ck.record_valid(ck.pack_record(LogState.LOGGED, 1, 5, magic=LOG_MAGIC ^ 1))
    assert not ck.record_valid(line ^ (1 << 300))            # a flipped bit beyond the fields
    assert not ck.record_valid(0)


def test_entry_groups_and_crc_against_hand_built_bytes():
    payloads = [[int.from_bytes(bytes(range(i + k, i + k + 64)), "little") for k in range(n)]
                for i, n in ((3, 2), (70, 1), (9, 3), (1, 1), (5, 2))]
    entries = [ck.LogEntry(5 + n, 1234 + n, 0xABCDE + 16 * n, tuple(p)) for n, p in enumerate(payloads)]
    lines = ck.pack_entries(9, entries)
    # two groups: a group line, the payloads of entries 0-3, a group line, entry 4's payload
    assert len(lines) == 2 + sum(map(len, payloads))
    assert lines[1:8] == [v for p in payloads[:4] for v in p] and lines[9:] == payloads[4]

    def crc_of(e):
        prefix = struct.pack("<IIHBBII", ENTRY_MAGIC, 9, e.table, len(e.payload), 0, e.row, e.row_addr).ljust(64, b"\0")
        return zlib.crc32(prefix + b"".join(v.to_bytes(64, "little") for v in e.payload))

    def group_bytes(group):
        raw = struct.pack("<II", GROUP_MAGIC, 9) + b"".join(
            struct.pack("<IIIBB", e.row_addr, e.row, crc_of(e), e.table, len(e.payload)) for e in group)
        return int.from_bytes(raw.ljust(64, b"\0"), "little")

    assert lines[0] == group_bytes(entries[:4]) and lines[8] == group_bytes(entries[4:])
    f = ck.group_info(lines[0], 2)
    assert (f["row_addr"], f["row"], f["crc"], f["table"], f["dim_lines"]) == (0xABCDE + 32, 1236, crc_of(entries[2]),
                                                                               7, 3)
    assert ck.entry_valid(lines[0], 2, payloads[2], batch=9)
    assert ck.entry_problem(lines[0], 2, payloads[2], batch=8) == "batch 9 (expected 8)"
    assert ck.entry_problem(lines[0], 0, [payloads[0][0], payloads[0][1] ^ 1]) == "crc"
    assert ck.entry_problem(lines[0], 0, payloads[0][:1]).startswith("1 payload lines")
    assert ck.entry_problem(lines[0], 1, payloads[0][:1]) == "crc"          # another entry's payload
    assert ck.entry_problem(ck.pack_entries(9, entries, magic=0)[0], 0, payloads[0]).startswith("group magic")
    assert ck.entry_problem(lines[8], 1, []) == "dim_lines 0"                # an unused place
    bad = ck.pack_group(9, [ck.LogEntry(1, 2, 3, tuple(payloads[1]), crc=0)])
    assert ck.entry_problem(bad, 0, payloads[1]) == "crc"
    with pytest.raises(ValueError):
        ck.pack_group(9, entries)


def test_region_twin_packs_log_region_and_slot_bases():
    r = ck.CheckpointRegion(log_base=100, slot_lines=30, mlp_base=200, mlp_lines=5, mlp_host_addr=1 << 40)
    assert ck.CheckpointRegion.unpack(r.pack()) == r
    assert (r.emb_slot(4), r.emb_slot(7), r.mlp_slot(0), r.mlp_slot(1)) == (100, 130, 200, 206)
    assert (r.emb_lines, r.mlp_log_lines) == (60, 12)
    assert ck.slot_lines_for(10, 32) == 2 + 10 * 2 + 3        # 3 group lines


def test_torn_record_is_valid_only_when_every_word_is_new():
    old = ck.pack_record(LogState.FREE, 0, 4)
    new = ck.pack_record(LogState.LOGGED, 0, 4, count=3, lines=9)
    valid_masks = [m for m in range(256) if ck.record_valid(ck.torn_line(old, new, m), slot=0,
                                                            state=LogState.LOGGED, batch=4)]
    differing = sum(1 << w for w in range(8) if (old >> 64 * w) & ck._WORD_MASK != (new >> 64 * w) & ck._WORD_MASK)
    assert differing and all(m & differing == differing for m in valid_masks)
    assert ALL_WORDS in valid_masks
    assert ck.torn_line(old, new, 0) == old and ck.torn_line(old, new, ALL_WORDS) == new
    # garbage from an older use of the line, torn with the new record, is never valid either
    garbage = int.from_bytes(bytes(range(64)), "little")
    assert not any(ck.record_valid(ck.torn_line(garbage, new, m)) for m in range(255))


# --------------------------------------------------------------------------------------------
# a small scripted device: tables in a dict memory, LOG / UPDATE / APPLIED in the device's order
# --------------------------------------------------------------------------------------------
ROW_BASES = (4000, 5000)         # table t's row r at ROW_BASES[t] + r * dim/16
REGION = ck.CheckpointRegion(log_base=100, slot_lines=ck.slot_lines_for(64, 32), mlp_base=600, mlp_lines=3)


def row_line(t: int, row: int) -> int:
    return ROW_BASES[t] + row * (16 if t == 0 else 32) // 16


def _training(n_batches=4, seed=11):
    rng = np.random.default_rng(seed)
    tables = [rng.uniform(-1, 1, (20, 16)).astype(np.float32), rng.uniform(-1, 1, (10, 32)).astype(np.float32)]
    B = 3
    batches, grads = [], []
    for _ in range(n_batches):
        lengths = rng.integers(0, 4, 2 * B)
        idx = np.concatenate([rng.integers(0, 20 if j < B else 10, n) for j, n in enumerate(lengths)]).astype(np.uint32)
        offsets = np.r_[0, np.cumsum(lengths)].astype(np.uint32)
        batches.append({"offsets": offsets, "indices": idx, "weights": None})
        grads.append([rng.standard_normal((B, 16)).astype(np.float32), rng.standard_normal((B, 32)).astype(np.float32)])
    return ck.CheckpointedTraining(tables, ["sum", "mean"], B, batches, grads, 0.25)


def _load_tables(mem, tables):
    for t, table in enumerate(tables):
        for r in range(table.shape[0]):
            for i, v in enumerate(ck.values_to_lines(table[r])):
                mem[row_line(t, r) + i] = v


def _read_tables(mem, like):
    out = []
    for t, table in enumerate(like):
        lpr = table.shape[1] // 16
        out.append(np.stack([ck.lines_to_values([mem.get(row_line(t, r) + i, 0) for i in range(lpr)])
                             for r in range(table.shape[0])]))
    return out


def _same(a, b):
    return all(np.array_equal(x.view(np.uint32), y.view(np.uint32)) for x, y in zip(a, b))


def _row_writes(tr, k):
    """{line: value} of batch k's update (the touched rows' new values)."""
    new = tr.tables_after(k + 1)
    writes = {}
    for t, r in tr.touched_rows(k):
        for i, v in enumerate(ck.values_to_lines(new[t][r])):
            writes[row_line(t, r) + i] = v
    return writes


def _run(tr, mem, batches):
    """Batches fully: LOG, UPDATE, APPLIED."""
    for k in batches:
        ck.write_log_slot(mem, REGION, k, tr.expected_log(k, row_line))
        mem.update(_row_writes(tr, k))
        ck.write_applied(mem, REGION, k)


def _fresh(tr):
    mem = {}
    _load_tables(mem, tr.tables_after(0))
    return mem


def test_no_log_recovers_nothing():
    tr = _training()
    mem = _fresh(tr)
    before = dict(mem)
    res = ck.golden_recover(mem, REGION)
    assert (res.emb_valid, res.emb_batches, res.rolled_back, res.mlp_valid, res.error) == \
        (False, 0, False, False, NdpError.OK)
    assert mem == before


def test_applied_batch_is_not_rolled_back():
    tr = _training()
    mem = _fresh(tr)
    _run(tr, mem, range(3))
    before = dict(mem)
    res = ck.golden_recover(mem, REGION)
    assert (res.emb_valid, res.emb_batches, res.rolled_back, res.emb_slot, res.writes) == (True, 3, False, 0, {})
    assert mem == before and _same(_read_tables(mem, tr.initial), tr.tables_after(3))


def test_crash_before_logged_keeps_the_previous_slot():
    tr = _training()
    mem = _fresh(tr)
    _run(tr, mem, range(2))
    entries = tr.expected_log(2, row_line)
    assert len(entries) >= 2
    partial = dict(list(entries.items())[:len(entries) // 2])
    ck.write_log_slot(mem, REGION, 2, partial, logged=False)          # FREE + some entries, no LOGGED
    res = ck.golden_recover(mem, REGION)
    assert (res.emb_valid, res.emb_batches, res.rolled_back, res.emb_slot) == (True, 2, False, 1)
    assert _same(_read_tables(mem, tr.initial), tr.tables_after(2))
    # a LOGGED record torn in flight is absent too
    full = ck.pack_record(LogState.LOGGED, 0, 2, len(partial), ck.entries_lines(partial))
    mem[REGION.emb_slot(2)] = ck.torn_line(mem[REGION.emb_slot(2)], full, 0b1111_0111)
    assert ck.golden_recover(mem, REGION).emb_batches == 2


@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0])
def test_logged_without_applied_rolls_back_to_the_exact_old_rows(fraction):
    tr = _training()
    mem = _fresh(tr)
    _run(tr, mem, range(2))
    ck.write_log_slot(mem, REGION, 2, tr.expected_log(2, row_line))
    writes = list(_row_writes(tr, 2).items())
    done = writes[:int(len(writes) * fraction)]
    mem.update(done)
    if 0 < len(done) < len(writes):                     # one more write torn in flight
        line, value = writes[len(done)]
        mem[line] = ck.torn_line(mem[line], value, 0b0101_0011)
    res = ck.golden_recover(mem, REGION)
    assert (res.emb_valid, res.emb_batches, res.rolled_back, res.emb_slot, res.error) == \
        (True, 2, True, 0, NdpError.OK)
    assert sorted(res.rows_rolled_back) == sorted(tr.touched_rows(2))
    assert _same(_read_tables(mem, tr.initial), tr.tables_after(2))
    # idempotent: again, and after a crash in the middle of recovery (some rollback writes lost)
    snapshot = dict(mem)
    again = ck.golden_recover(mem, REGION)
    assert mem == snapshot and again.mismatches(res) == [] and again.writes == res.writes
    mem.update(done)
    crashed = dict(list(ck.golden_recover(mem, REGION, apply=False).writes.items())[:1])
    mem.update(_row_writes(tr, 2))
    mem.update(crashed)
    ck.golden_recover(mem, REGION)
    assert mem == snapshot


def test_apply_false_leaves_memory_alone():
    tr = _training()
    mem = _fresh(tr)
    ck.write_log_slot(mem, REGION, 0, tr.expected_log(0, row_line))
    mem.update(_row_writes(tr, 0))
    before = dict(mem)
    res = ck.golden_recover(mem, REGION, apply=False)
    assert res.rolled_back and res.writes and mem == before


def test_torn_entry_is_log_corrupt_and_nothing_is_written():
    tr = _training()
    mem = _fresh(tr)
    ck.write_log_slot(mem, REGION, 0, tr.expected_log(0, row_line))
    mem.update(_row_writes(tr, 0))
    base = REGION.emb_slot(0)
    victim = base + ck.SLOT_HEADER_LINES + 1                               # the first entry's payload
    #                                                                        (after its group line)
    mem[victim] = ck.torn_line(mem[victim], mem[victim] ^ (1 << 200) ^ 1, 0b0000_1000)
    before = dict(mem)
    res = ck.golden_recover(mem, REGION)
    assert res.error == NdpError.LOG_CORRUPT and res.writes == {} and not res.rolled_back
    assert mem == before and "crc" in res.problem


@pytest.mark.parametrize("damage", ["batch", "magic", "dim_lines", "count", "lines", "later_crc"])
def test_inconsistent_entries_are_log_corrupt(damage):
    tr = _training()
    mem = _fresh(tr)
    entries = [ck.LogEntry(t, r, e.row_addr, e.payload) for (t, r), e in tr.expected_log(1, row_line).items()]
    assert len(entries) > GROUP_ENTRIES
    ck.write_log_slot(mem, REGION, 1, entries, group_magic=0 if damage == "magic" else GROUP_MAGIC)
    base = REGION.emb_slot(1)
    first_group = base + ck.SLOT_HEADER_LINES
    if damage == "batch":                                                 # the first group of batch 0
        mem[first_group] = ck.pack_group(0, entries[:GROUP_ENTRIES])
    if damage == "dim_lines":                                             # its first entry's dim_lines 0
        mem[first_group] &= ~(ck.INFO.pack(dim_lines=0xFF) << ck.INFO_OFFSET)
    if damage == "later_crc":                                             # the third entry's crc
        mem[first_group] ^= ck.INFO.pack(crc=1) << (ck.INFO_OFFSET + 2 * ck.INFO.width)
    f = ck.unpack_record(mem[base])
    if damage == "count":                                                 # LOGGED claims one entry more
        mem[base] = ck.pack_record(LogState.LOGGED, 1, 1, f["count"] + 1, f["lines"])
    if damage == "lines":                                                 # ... or one line more
        mem[base] = ck.pack_record(LogState.LOGGED, 1, 1, f["count"], f["lines"] + 1)
    before = dict(mem)
    res = ck.golden_recover(mem, REGION)
    assert res.error == NdpError.LOG_CORRUPT and mem == before, res.problem


def test_newest_logged_slot_wins():
    tr = _training()
    mem = _fresh(tr)
    _run(tr, mem, range(3))                      # slot 0: batch 2 applied, slot 1: batch 1 applied
    ck.write_log_slot(mem, REGION, 3, tr.expected_log(3, row_line))      # slot 1: batch 3 logged
    res = ck.golden_recover(mem, REGION)
    assert (res.emb_batches, res.rolled_back, res.emb_slot) == (3, True, 1)
    # a LOGGED record copied into the other slot (slot field mismatch) is ignored
    mem2 = dict(mem)
    mem2[REGION.slot_base(0)] = ck.pack_record(LogState.LOGGED, 1, 9, 0, 0)
    assert ck.golden_recover(mem2, REGION).emb_batches == 3
    # an APPLIED record of another batch does not count
    mem3 = dict(mem)
    mem3[REGION.emb_slot(3) + 1] = ck.pack_record(LogState.APPLIED, 1, 1, 0, 0)
    assert ck.golden_recover(mem3, REGION).rolled_back


def test_mlp_newest_valid_selection():
    region = REGION
    mem = {}
    img = [[(k << 8) + i for i in range(region.mlp_lines)] for k in range(8)]
    assert not ck.golden_recover(mem, region).mlp_valid
    ck.write_mlp_log(mem, region, 0, 2, img[2])
    res = ck.golden_recover(mem, region)
    assert (res.mlp_valid, res.mlp_batch, res.mlp_slot) == (True, 2, 0)
    ck.write_mlp_log(mem, region, 1, 5, img[5])                 # complete: slot 0 released
    res = ck.golden_recover(mem, region)
    assert (res.mlp_valid, res.mlp_batch, res.mlp_slot) == (True, 5, 1)
    assert ck.unpack_record(mem[region.mlp_slot(0)])["state"] == LogState.FREE.value
    ck.write_mlp_log(mem, region, 0, 7, img[7], complete=False)  # crash mid-copy: slot 1 still holds 5
    assert ck.golden_recover(mem, region).csr_view() == {"emb_valid": 0, "emb_batches": 0, "rolled_back": 0,
                                                         "mlp_valid": 1, "mlp_batch": 5, "mlp_slot": 1}
    both = dict(mem)                                             # both complete (release torn away)
    both[region.mlp_slot(0)] = ck.pack_record(LogState.MLP_LOGGED, 0, 7, region.mlp_lines * 64, region.mlp_lines)
    assert (ck.golden_recover(both, region).mlp_batch, ck.golden_recover(both, region).mlp_slot) == (7, 0)
    both[region.mlp_slot(0)] = ck.pack_record(LogState.MLP_LOGGED, 0, 7, 64, region.mlp_lines + 1)
    assert ck.golden_recover(both, region).mlp_batch == 5       # wrong size: ignored
    both[region.mlp_slot(0)] = ck.pack_record(LogState.MLP_LOGGED, 1, 7, 64, region.mlp_lines)
    assert ck.golden_recover(both, region).mlp_batch == 5       # slot field mismatch: ignored
    both[region.mlp_slot(1)] = ck.torn_line(both[region.mlp_slot(1)], 0, 0b10)
    assert not ck.golden_recover(both, region).mlp_valid


# --------------------------------------------------------------------------------------------
# the LOG checker
# --------------------------------------------------------------------------------------------
def test_expected_log_entries_are_the_distinct_rows_with_old_values():
    tr = _training()
    b = tr.batches[1]
    old = tr.tables_after(1)
    exp = ck.expected_log_entries(old, b["offsets"], b["indices"], 3, row_line)
    B = 3
    want = {(0, int(r)) for r in b["indices"][b["offsets"][0]:b["offsets"][B]]} | \
        {(1, int(r)) for r in b["indices"][b["offsets"][B]:b["offsets"][2 * B]]}
    assert set(exp) == want
    for (t, r), e in exp.items():
        assert e.row_addr == row_line(t, r) and e.dim_lines == old[t].shape[1] // 16
        assert np.array_equal(ck.lines_to_values(e.payload).view(np.uint32), old[t][r].view(np.uint32))


def test_check_log_slot_accepts_any_order_and_names_mismatches():
    tr = _training()
    exp = tr.expected_log(2, row_line)
    mem = {}
    ck.write_log_slot(mem, REGION, 2, dict(reversed(list(exp.items()))))
    assert ck.check_log_slot(mem, REGION, 2, exp) == []
    assert ck.check_log_slot(mem.get, REGION, 2, exp, applied=False) == []
    assert any("APPLIED" in m for m in ck.check_log_slot(mem, REGION, 2, exp, applied=True))
    ck.write_applied(mem, REGION, 2)
    assert ck.check_log_slot(mem, REGION, 2, exp, applied=True) == []
    (t0, r0), e0 = next(iter(exp.items()))
    wrong = dict(exp)
    wrong[(t0, r0)] = ck.ExpectedEntry(e0.row_addr, e0.dim_lines, (e0.payload[0] ^ 1, *e0.payload[1:]))
    assert any("payload" in m for m in ck.check_log_slot(mem, REGION, 2, wrong))
    fewer = dict(list(exp.items())[1:])
    mem2 = {}
    ck.write_log_slot(mem2, REGION, 2, fewer)
    msgs = ck.check_log_slot(mem2, REGION, 2, exp)
    assert any("count/lines" in m for m in msgs)
    dup = [ck.LogEntry(t, r, e.row_addr, e.payload) for (t, r), e in exp.items()]
    mem3 = {}
    ck.write_log_slot(mem3, REGION, 2, dup[:-1] + dup[:1])
    assert any("logged twice" in m for m in ck.check_log_slot(mem3, REGION, 2, exp))
    assert any("not a valid LOGGED" in m for m in ck.check_log_slot({}, REGION, 2, exp))


# --------------------------------------------------------------------------------------------
# training golden
# --------------------------------------------------------------------------------------------
def test_tables_after_matches_embedding_applied_directly():
    trace = generate_trace("rm-tiny", 4, 7, TraceKnobs(batch_size=4))
    B = trace.batch_size
    rng = np.random.default_rng(3)
    tables = [rng.uniform(-1, 1, (t["rows"], t["dim"])).astype(np.float32) for t in trace.tables]
    grads = [[rng.standard_normal((B, t["dim"])).astype(np.float32) for t in trace.tables] for _ in range(4)]
    lrs = [0.05, 0.1, 0.05, 0.2]
    tr = ck.CheckpointedTraining(tables, trace.modes, B, trace.batches, grads, lrs)
    ref = [t.copy() for t in tables]
    for n in range(5):
        assert _same(tr.tables_after(n), ref), n
        if n < 4:
            b = trace.batches[n]
            embedding.tbe_sgd_step(ref, b.offsets, b.indices, trace.modes, B, grads[n], lrs[n], b.weights)
    assert _same(tr.tables_after(2), tr.tables_after(2)) and _same(tr.tables_after(0), tables)
    tr.tables_after(1)[0][:] = 0                                 # copies: the cache is not touched
    assert _same(tr.tables_after(1), ck.CheckpointedTraining(tables, trace.modes, B, trace.batches, grads,
                                                             lrs).tables_after(1))
    with pytest.raises(ValueError):
        tr.tables_after(5)


def test_mlp_image_comes_from_the_agent():
    agent = GpuAgent("rm-tiny", seed=4)
    tr = ck.CheckpointedTraining([np.zeros((1, 16), np.float32)], ["sum"], 1, [], [], 0.1, mlp=agent)
    assert tr.mlp_image(3) == agent.image_lines(3) != agent.image_lines(2)
    relaxed = tr.mlp_image_chunks([(3, 0, 100), (4, 100, 300), (6, 400, 25)])
    assert relaxed[:100] == agent.image_lines(3)[:100] and relaxed[100:400] == agent.image_lines(4)[100:400]
    assert relaxed[400:] == agent.image_lines(6)[400:] and len(relaxed) == 425


# --------------------------------------------------------------------------------------------
# GPU agent
# --------------------------------------------------------------------------------------------
def test_gpu_agent_image_layout_and_determinism():
    layers = mlp_layers("rm-tiny")
    assert [(ly.fan_in, ly.fan_out) for ly in layers] == [(13, 64), (64, 32), (42, 64), (64, 16), (16, 1)]
    assert mlp_param_count("rm-tiny") == 13 * 64 + 64 + 64 * 32 + 32 + 42 * 64 + 64 + 64 * 16 + 16 + 16 + 1 == 6785
    assert mlp_image_lines("rm-tiny") == 425
    a, b, c = GpuAgent("rm-tiny", seed=1), GpuAgent("rm-tiny", seed=1), GpuAgent("rm-tiny", seed=2)
    assert np.array_equal(a.params_at(3), b.params_at(3))
    assert not np.array_equal(a.params_at(3), c.params_at(3))
    assert np.array_equal(a.params_at(0), GpuAgent("rm-tiny", seed=1).params_at(0))
    assert np.array_equal(b.params_at(1), GpuAgent("rm-tiny", seed=1).params_at(1))   # order-independent
    p = a.params_at(5)
    assert p.dtype == np.float32 and p.shape == (425 * 16,) and not p[6785:].any()
    w, bias = a.unflatten(p)[2]
    assert w.shape == (64, 42) and bias.shape == (64,)
    assert len(a.image_lines(5)) == a.lines == 425
    assert np.array_equal(ck.lines_to_values(a.image_lines(5)), p)
    delta = a.params_at(6) - a.params_at(5)
    assert 0 < np.abs(delta).max() < 0.05
    swapped = GpuAgent("rm-tiny", seed=1, step_fn=lambda v, k: v * np.float32(2))
    assert np.array_equal(swapped.params_at(2), a.params_at(0) * 4)


def test_gpu_agent_writes_the_image_into_home_agent_memory():
    base = 1 << 24
    ha = HomeAgent((base - 10, 2000), gpu_range=None)
    agent = GpuAgent("rm-tiny", ha, base, seed=9)
    agent.advance(2)
    assert agent.read_image() == agent.image_lines(2) and agent.batch == 2
    assert ha.read_memory(base + 3) == agent.image_lines(2)[3]
    agent.advance(3)
    assert ha.read_memory(base) == agent.image_lines(3)[0] != agent.image_lines(2)[0]
    with pytest.raises(ValueError, match="not host/GPU memory"):
        GpuAgent("rm-tiny", ha, base + 1800)
    gpu_ha = HomeAgent((0, 16), gpu_range=(1 << 30, 1024))
    GpuAgent("rm-tiny", gpu_ha, 1 << 30).advance(0)
    with pytest.raises(ValueError, match="no home agent"):
        GpuAgent("rm-tiny").advance(0)


def test_mlp_timing_model_numbers():
    t = mlp_timing("rm1", 2048, 500)
    # rm1: bottom 13-8192-2048-32, top (210 + 32 = 242)-256-64-1, interaction F = 21, dim 32
    bottom = 2 * (13 * 8192 + 8192 * 2048 + 2048 * 32)
    top = 2 * (242 * 256 + 256 * 64 + 64 * 1)
    inter = 2 * 21 * 21 * 32
    assert t.total_flops == 3 * (bottom + top + inter) * 2048
    rate = RTX3090_PEAK_FLOPS * DEFAULT_EFFICIENCY / 500e6
    assert abs(t.total_cycles - t.total_flops / rate) <= len(t.phases)
    assert 11.0e-3 < t.seconds < 12.5e-3                          # ~11.8 ms at 50 % of 35.58 TFLOPS
    assert mlp_time_cycles("rm1", 2048, 500) == t.total_cycles
    assert mlp_time_cycles("rm1", 1024, 500) < t.total_cycles
    assert mlp_time_cycles("rm1", 2048, 500, efficiency=1.0) < t.total_cycles
    times = {m: mlp_timing(m).seconds for m in ("rm1", "rm2", "rm3", "rm4")}
    assert times["rm1"] < times["rm2"] < times["rm4"] < times["rm3"]
    start, end = t.window
    assert start == t.phases["bottom_fwd"] and end == t.total_cycles - t.phases["bottom_bwd"]
    assert not cache_window(t, 0) and not cache_window(t, start - 1) and cache_window(t, start)
    assert cache_window(t, end - 1) and not cache_window(t, end) and not cache_window(t, t.total_cycles)
    assert 0 < (end - start) / t.total_cycles < 0.05            # rm1: the bottom MLP dominates
    agent = GpuAgent("rm-tiny", batch_size=8)
    assert agent.mlp_time_cycles() == mlp_time_cycles("rm-tiny", 8) and agent.cache_window(agent.timing.window[0])
    with pytest.raises(ValueError):
        mlp_timing("rm1", 0)
