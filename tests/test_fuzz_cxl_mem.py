"""``trainingcxl fuzz --target cxl-mem``: its generator, its expectations and a short RTL run.

Pure Python (no simulator): the stimulus generator (sim/tb/cxl_mem_fuzz_gen.py), the host-rule
classifier (sim/checkers/cxl_mem_host_rules.py), the CSR counter model
(sim/checkers/cxl_mem_counters.py) and the same-line ordering rules the scoreboard applies
(the orderings sim/tb/fuzz_cxl_mem_tb.py states, and nothing else). RTL: a short fuzz run on
the shared harness must be clean and send every M2S opcode value. Replay a failing run with
TCXL_SEED=<seed> (the seed is in the result and the log).
"""
import collections
import json
import random

import pytest

from conftest import run_cocotb
from hw.common.cxl_mem import M2SReq, M2SRwD, M2SReqOpcode as Q, M2SRwDOpcode as W, NDROpcode as N
from sim.checkers.cxl_mem_counters import COUNTERS, CxlMemCounterModel, counter_events
from sim.checkers.cxl_mem_host_rules import host_errors
from sim.model.codec import StructCodec
from sim.model.memory import merge_line
from sim.tb.cxl_mem_fuzz_gen import ALL_OPCODE_NAMES, OUTSIDE, WINDOW_KINDS, choose_window, generate, opcode_name
from test_checkers import drs, ndr, req, rwd, setup

WINDOW = (64, 4096 - 128, True)          # (base line, size, enabled), lines outside on both sides
CAP = 4096


def _decodes(line):
    return WINDOW[0] <= line < WINDOW[0] + WINDOW[1]


def _messages(seed, n):
    return list(generate(random.Random(seed), n, WINDOW, CAP))


# ---------------------------------------------------------------- the generator

def test_first_32_messages_cover_every_opcode_value_once():
    msgs = _messages(1, 32)
    names = [opcode_name(m.kind, m.fields["opcode"]) for m in msgs]
    assert sorted(names) == sorted(ALL_OPCODE_NAMES) and len(set(ALL_OPCODE_NAMES)) == 32
    assert "rwd:RESERVED_0011" in names and "req:MEM_CLN_EVCT_U" in names
    assert len(_messages(1, 5)) == 5                       # a run shorter than 32 is still n


def test_generator_is_reproducible_and_every_message_packs():
    a, b = _messages(7, 3000), _messages(7, 3000)
    assert a == b and a != _messages(8, 3000)
    codecs = {"req": StructCodec(M2SReq), "rwd": StructCodec(M2SRwD)}
    for m in a:
        word = codecs[m.kind].pack(**m.fields)          # raises if a field does not fit
        assert codecs[m.kind].unpack(word) == m.fields   # every field given, none lost


def test_generator_mix_reaches_every_case():
    msgs = _messages(3, 20_000)
    f = [m.fields for m in msgs]
    outside = sum(not _decodes(x["addr"]) for x in f) / len(f)
    assert OUTSIDE * 0.7 < outside < OUTSIDE * 1.1          # race clusters stay inside
    assert any(x["addr"] == WINDOW[0] - 1 for x in f) and any(x["addr"] == sum(WINDOW[:2]) for x in f)
    assert any(x["addr"] >= 1 << 40 for x in f)                       # far above
    ptl = [x for m, x in zip(msgs, f) if m.kind == "rwd" and x["opcode"] == W.MEM_WR_PTL.value]
    strbs = {x["byte_enable"] for x in ptl}
    assert {0, (1 << 64) - 1} <= strbs and len(strbs) > len(ptl) // 2
    assert 0.02 < sum(x["poison"] for x in f if "poison" in x) / sum("poison" in x for x in f) < 0.06
    assert {x["snp_type"] for x in f} == set(range(8))
    assert {x["meta_field"] for x in f} == set(range(4)) and {x["meta_value"] for x in f} == set(range(4))
    assert sum(m.gap > 0 for m in msgs) > 1000 and max(m.gap for m in msgs) > 100
    names = collections.Counter(opcode_name(m.kind, m.fields["opcode"]) for m in msgs)
    assert set(names) == set(ALL_OPCODE_NAMES) and min(names.values()) >= 20
    # Same-line races: a read and a write to one line with no gap between them, often.
    pairs = sum(1 for p, q in zip(msgs, msgs[1:]) if q.gap == 0 and p.fields["addr"] == q.fields["addr"]
                and {p.kind, q.kind} == {"req", "rwd"} and _decodes(p.fields["addr"]))
    assert pairs > 500
    # Tags repeated within a few messages (likely outstanding).
    reused = sum(1 for i, m in enumerate(msgs) if m.fields["tag"] in {x["tag"] for x in f[max(0, i - 8):i]})
    assert reused > len(msgs) // 20


def test_every_window_kind_gets_traffic_on_both_sides_of_its_decoded_part():
    seen = set()
    for seed in range(40):
        rng = random.Random(seed)
        kind, base, size = choose_window(rng, CAP)
        if kind in seen:
            continue
        seen.add(kind)
        end = base + min(size, CAP)                        # the decoder also stops at the capacity
        addrs = [m.fields["addr"] for m in generate(rng, 5000, (base, size, True), CAP)]
        assert all(0 <= a < 1 << 46 for a in addrs)
        outside = [a for a in addrs if not base <= a < end]
        assert OUTSIDE * 0.7 < len(outside) / len(addrs) < OUTSIDE * 1.1, kind
        assert base - 1 in outside and end in outside and any(a < base - 1 for a in outside), kind
        if kind == "oversized":                           # inside the window, past the device
            assert any(end <= a < base + size for a in outside)
    assert seen == set(WINDOW_KINDS)


# ---------------------------------------------------------------- host rules and counters

def test_host_rules():
    ok = req(Q.MEM_RD, 1, 5)
    assert host_errors("req", ok) == ()
    assert host_errors("rwd", rwd(W.MEM_WR_PTL, 1, 5)) == ()
    assert host_errors("req", {**ok, "opcode": Q.MEM_RD_FWD.value}) == ()   # judged by the agent
    assert host_errors("req", {**ok, "opcode": Q.MEM_CLN_EVCT.value}) == ("req_opcode_unsupported",)
    assert host_errors("rwd", {**rwd(W.MEM_WR, 1, 5), "opcode": 0b0011}) == ("rwd_opcode_reserved",)
    assert host_errors("rwd", {**rwd(W.MEM_WR, 1, 5), "opcode": 0}) == ("rwd_opcode_reserved",)
    assert host_errors("rwd", rwd(W.BI_CONFLICT, 1, 5)) == ("rwd_opcode_unsupported",)
    assert host_errors("req", {**ok, "snp_type": 0b111, "meta_field": 0b10}) == \
        ("snp_type_reserved", "meta_field_reserved")
    assert host_errors("req", {**ok, "meta_field": 0b01}) == ("meta_field_ems",)
    assert host_errors("req", {**ok, "meta_value": 0b01}) == ("meta0_explicit_no_op",)
    assert host_errors("req", {**ok, "meta_field": 0b11, "meta_value": 0b01}) == ()


def test_counter_events():
    assert counter_events("req", req(Q.MEM_RD, 1, 5), True) == ("STAT_RD_LINES",)
    assert counter_events("req", req(Q.MEM_RD_DATA, 1, 5), False) == ("ERR_OUT_OF_WINDOW_RD",)
    assert counter_events("req", req(Q.MEM_INV_NT, 1, 5), False) == ("ERR_OUT_OF_WINDOW_RD",)
    assert counter_events("req", req(Q.MEM_INV, 1, 5), True) == ("STAT_INV",)
    assert counter_events("req", req(Q.MEM_SPEC_RD, 1, 5), False) == ("STAT_SPEC_RD_DROPPED",)
    assert counter_events("req", req(Q.MEM_WR_FWD, 1, 5), True) == ("ERR_UNEXPECTED_FWD",)
    assert counter_events("req", req(Q.MEM_WR_FWD, 1, 5), True, d2h_idle=False) == ()
    assert counter_events("req", req(Q.TE_UPDATE, 1, 5), False) == ("ERR_UNSUPPORTED_REQ",)
    assert counter_events("rwd", rwd(W.BI_CONFLICT, 1, 5, poison=1), True) == ("ERR_UNSUPPORTED_RWD",)
    assert counter_events("rwd", rwd(W.MEM_WR, 1, 5, poison=1), True) == ("STAT_WR_LINES", "ERR_POISON_WR")
    assert counter_events("rwd", rwd(W.MEM_WR_PTL, 1, 5, poison=1), False) == ("ERR_OUT_OF_WINDOW_WR",)
    mon, _, _ = setup()
    model = CxlMemCounterModel(mon)
    model.on_m2s(0, 0, "rwd", rwd(W.MEM_WR, 1, 5))
    model.on_s2m(0, "drs", drs(1, 0, poison=1))
    read = dict.fromkeys(COUNTERS, 0) | {"STAT_WR_LINES": 1, "ERR_POISON_RD": 1}
    assert model.mismatches(read) == []
    assert model.mismatches(read | {"ERR_MEDIA": 1}) == ["CSR ERR_MEDIA reads 1, expected 0"]


# ---------------------------------------------------------------- same-line orderings

def _race(events):
    """Run ``events`` through the monitor and scoreboard; returns (violations, mismatches)."""
    mon, sb, m2s = setup()
    for e in events:
        if e[0] == "m2s":
            m2s(e[1], e[2])
        else:
            mon.on_s2m(0, e[1], e[2])
    mon.finish(0)
    return mon.violations, sb.mismatches


A, B = int.from_bytes(bytes(range(1, 65)), "little"), int.from_bytes(bytes(range(101, 165)), "little")
SA, SB = 0x0F, 0xF0                           # byte enables of two partial writes
AB = merge_line(merge_line(0, A, SA), B, SB)


def _rd(tag, data):
    return [("s2m", "ndr", ndr(N.CMP_E, tag)), ("s2m", "drs", drs(tag, data))]


@pytest.mark.parametrize("data, legal", [(0, False), (A, True)])
def test_read_after_write_sees_it(data, legal):
    v, m = _race([("m2s", "rwd", rwd(W.MEM_WR, 1, 9, A)), ("m2s", "req", req(Q.MEM_RD, 2, 9))]
                 + _rd(2, data) + [("s2m", "ndr", ndr(N.CMP, 1))])
    assert v == [] and (m == []) == legal


@pytest.mark.parametrize("data, legal", [(0, True), (A, True), (B, False)])
def test_write_may_overtake_an_earlier_read(data, legal):
    v, m = _race([("m2s", "req", req(Q.MEM_RD, 2, 9)), ("m2s", "rwd", rwd(W.MEM_WR, 1, 9, A))]
                 + _rd(2, data) + [("s2m", "ndr", ndr(N.CMP, 1))])
    assert v == [] and (m == []) == legal


def test_a_write_accepted_after_the_data_came_back_is_not_visible():
    v, m = _race([("m2s", "req", req(Q.MEM_RD, 2, 9))] + _rd(2, A)
                 + [("m2s", "rwd", rwd(W.MEM_WR, 1, 9, A)), ("s2m", "ndr", ndr(N.CMP, 1))])
    assert v == [] and len(m) == 1


@pytest.mark.parametrize("data, legal", [
    (merge_line(0, A, SA), True), (AB, True),          # after W1, or W1 then W2
    (0, False),                                        # older than the read's acceptance
    (merge_line(0, B, SB), False),                     # W2 without W1: writes out of order
    (merge_line(0, B, SA | SB), False),                # a value no write sequence produces
])
def test_partial_writes_apply_whole_and_in_order(data, legal):
    v, m = _race([("m2s", "rwd", rwd(W.MEM_WR_PTL, 1, 9, A, strb=SA)), ("m2s", "req", req(Q.MEM_RD, 2, 9)),
                  ("m2s", "rwd", rwd(W.MEM_WR_PTL, 3, 9, B, strb=SB))]
                 + _rd(2, data) + [("s2m", "ndr", ndr(N.CMP, 1)), ("s2m", "ndr", ndr(N.CMP, 3))])
    assert v == [] and (m == []) == legal


# ---------------------------------------------------------------- the RTL run

@pytest.mark.sim
def test_fuzz_short_run_is_clean(harness, tmp_path):
    out = tmp_path / "fuzz.json"
    run_cocotb(harness, "sim.tb.fuzz_cxl_mem_tb", "fuzz_cxl_mem", TCXL_FUZZ_COUNT=5000, TCXL_SEED=11,
               TCXL_RESULT_JSON=out)
    r = json.loads(out.read_text())
    assert r["clean"] and r["messages"] == 5000, r["problems"]
    assert r["hangs"] == r["mismatches"] == r["protocol_violations"] == 0
    assert set(r["opcodes"]) == set(ALL_OPCODE_NAMES) and min(r["opcodes"].values()) > 0
    assert r["reads_checked"] > 300 and r["same_line_races"] > 50 and r["tags_reused_while_outstanding"] > 20
    assert r["poisoned_reads"] > 0 and r["outside_window"] > 100 and r["backpressure_cycles"] > 1000
    assert r["host_errors_injected"] > 100 and r["counter_mismatches"] == r["image_mismatches"] == 0
