"""The checkers themselves: the protocol monitor and the scoreboard must catch what they
claim to catch (fed synthetic message sequences; no simulator involved)."""
import random

from hw.common.cxl_mem import (M2SReqOpcode as Q, M2SRwDOpcode as W, MetaField, MetaValue,
                               SnpType, NDROpcode as N, DRSOpcode as D)
from sim.checkers.cxl_mem_monitor import CxlMemMonitor, ALL_ONES
from sim.checkers.scoreboard import CxlMemScoreboard
from sim.model.memory import MemoryModel, VersionedMemory, word_outcomes, merge_line, FULL_STRB

MS0 = MetaField.META0_STATE.value
NOOP = MetaField.NO_OP.value


def req(op, tag, addr, mf=MS0, mv=MetaValue.ANY.value, ld_id=0):
    return {"opcode": op.value, "snp_type": SnpType.SNP_INV.value, "meta_field": mf,
            "meta_value": mv, "tag": tag, "addr": addr, "ld_id": ld_id, "tc": 0}


def rwd(op, tag, addr, data=0, strb=FULL_STRB, poison=0, ld_id=0):
    return {**req(Q.MEM_INV, tag, addr, NOOP, 0, ld_id), "opcode": op.value, "data": data,
            "byte_enable": strb, "poison": poison, "trp": 0}


def ndr(op, tag, ld_id=0):
    return {"opcode": op.value, "meta_field": NOOP, "meta_value": 0, "tag": tag,
            "ld_id": ld_id, "dev_load": 0}


def drs(tag, data, op=D.MEM_DATA, poison=0, ld_id=0):
    return {**ndr(N.CMP, tag, ld_id), "opcode": op.value, "data": data, "poison": poison,
            "trp": 0}


def setup(lines=64):
    mon = CxlMemMonitor(capacity_lines=lines)
    mon.set_window(0, lines, True)
    sb = CxlMemScoreboard(mon, MemoryModel(lines))
    mon.listeners.append(sb)
    seq = [0]

    def m2s(kind, f):
        mon.on_m2s(seq[0], 0, kind, f)
        sb.on_m2s(seq[0], 0, kind, f)
        seq[0] += 1
    return mon, sb, m2s


def test_clean_sequence_has_no_violation():
    mon, sb, m2s = setup()
    m2s("rwd", rwd(W.MEM_WR, 1, 5, data=0xAB))
    mon.on_s2m(1, "ndr", ndr(N.CMP, 1))
    m2s("req", req(Q.MEM_RD, 2, 5))
    mon.on_s2m(2, "ndr", ndr(N.CMP_E, 2))
    mon.on_s2m(2, "drs", drs(2, 0xAB))
    m2s("req", req(Q.MEM_RD, 3, 1000))              # outside the window
    mon.on_s2m(3, "drs", drs(3, ALL_ONES, D.MEM_DATA_NXM))
    mon.finish(4)
    assert mon.violations == [] and sb.mismatches == [] and sb.reads_checked == 1


def test_monitor_flags_wrong_ndr_opcode_and_missing_and_spurious_responses():
    mon, _, m2s = setup()
    m2s("req", req(Q.MEM_RD, 1, 5))                 # Meta0 Any: only Cmp-E fits
    mon.on_s2m(1, "ndr", ndr(N.CMP_S, 1))
    mon.on_s2m(1, "drs", drs(1, 0))
    m2s("rwd", rwd(W.MEM_WR, 2, 6))                 # never answered
    mon.on_s2m(2, "ndr", ndr(N.CMP, 9))             # nobody waits for tag 9
    m2s("req", req(Q.MEM_SPEC_RD, 3, 7))            # must get nothing
    mon.on_s2m(3, "ndr", ndr(N.CMP, 3))
    mon.finish(5)
    text = "\n".join(mon.violations)
    assert "CMP_S does not fit" in text
    assert "never got NDR" in text
    assert text.count("answers no outstanding request") == 2
    assert len(mon.violations) == 4


def test_monitor_flags_nxm_without_all_ones_and_cmp_m():
    mon, _, m2s = setup()
    m2s("req", req(Q.MEM_RD, 1, 1000))
    mon.on_s2m(1, "drs", drs(1, 0, D.MEM_DATA_NXM))
    m2s("rwd", rwd(W.MEM_WR, 2, 3))
    mon.on_s2m(2, "ndr", ndr(N.CMP_M, 2))
    assert len(mon.violations) == 2


def test_repeated_tags_match_the_request_the_response_fits():
    mon, _, m2s = setup()
    m2s("req", req(Q.MEM_RD, 7, 1, mv=MetaValue.SHARED.value))   # Cmp-S or Cmp-E
    m2s("req", req(Q.MEM_INV, 7, 2))                              # Cmp-E only
    mon.on_s2m(1, "ndr", ndr(N.CMP_E, 7))
    mon.on_s2m(2, "ndr", ndr(N.CMP_S, 7))
    mon.on_s2m(3, "drs", drs(7, 0))
    mon.finish(4)
    assert mon.violations == []


def test_tag_reuse_answered_out_of_order_is_legal():
    """Issue 18.3: MemRd A (line 2, Meta0 Invalid) and MemRd B (line 1, Meta0 Shared) share a
    Tag; a write to line 2 with line 1's value is in flight, so B's data is also legal for A.
    The device answers B first (Cmp-S and its data), then A (Cmp and line 2's old data). The
    first DRS must not be bound to A just because A is older and accepts it."""
    mon, sb, m2s = setup()
    m2s("rwd", rwd(W.MEM_WR, 1, 1, data=0x11))
    mon.on_s2m(0, "ndr", ndr(N.CMP, 1))
    m2s("rwd", rwd(W.MEM_WR, 1, 2, data=0x22))
    mon.on_s2m(0, "ndr", ndr(N.CMP, 1))
    m2s("req", req(Q.MEM_RD, 7, 2, mv=MetaValue.INVALID.value))   # A
    m2s("rwd", rwd(W.MEM_WR, 2, 2, data=0x11))                   # in flight: A may see 0x11 too
    m2s("req", req(Q.MEM_RD, 7, 1, mv=MetaValue.SHARED.value))    # B
    mon.on_s2m(1, "ndr", ndr(N.CMP_S, 7))
    mon.on_s2m(1, "drs", drs(7, 0x11))
    mon.on_s2m(2, "ndr", ndr(N.CMP, 7))
    mon.on_s2m(2, "drs", drs(7, 0x22))
    mon.on_s2m(3, "ndr", ndr(N.CMP, 2))
    mon.finish(4)
    assert mon.violations == [] and sb.mismatches == [] and sb.reads_checked == 2 and mon.outstanding == 0


def test_tag_reuse_without_a_legal_assignment_is_reported():
    """Two DRSs that only one of two same-Tag reads may return: no assignment exists."""
    mon, sb, m2s = setup()
    m2s("rwd", rwd(W.MEM_WR, 1, 1, data=0x11))
    mon.on_s2m(0, "ndr", ndr(N.CMP, 1))
    m2s("req", req(Q.MEM_RD, 7, 1))
    m2s("req", req(Q.MEM_RD, 7, 2))                               # holds 0
    mon.on_s2m(1, "drs", drs(7, 0x11))
    mon.on_s2m(2, "drs", drs(7, 0x11))                            # line 2 never held 0x11
    mon.on_s2m(3, "ndr", ndr(N.CMP_E, 7))
    mon.on_s2m(3, "ndr", ndr(N.CMP_E, 7))
    mon.finish(4)
    assert len(mon.violations) + len(sb.mismatches) >= 1, (mon.violations, sb.mismatches)
    # ... and a third DRS for two reads is a response nobody waits for
    mon, sb, m2s = setup()
    m2s("req", req(Q.MEM_RD, 7, 1))
    m2s("req", req(Q.MEM_RD, 7, 2))
    for c in range(3):
        mon.on_s2m(c, "drs", drs(7, 0))
    mon.finish(4)
    assert any("answers no outstanding request" in v or "no assignment" in v for v in mon.violations)


def test_tag_reuse_random_legal_orders():
    """Many reads share one Tag, lines hold values that several of them may return (writes in
    flight), and the answers come in a random legal order: never a violation. Then one answer
    swapped for data no read may return: always caught."""
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rng = random.Random(seed)
    for trial in range(200):
        mon, sb, m2s = setup()
        values = [rng.choice((0x10, 0x20, 0x30)) for _ in range(8)]
        for line, v in enumerate(values):
            m2s("rwd", rwd(W.MEM_WR, 1, line, data=v))
            mon.on_s2m(0, "ndr", ndr(N.CMP, 1))
        reads = []
        for _ in range(rng.randint(2, 6)):
            line = rng.randrange(8)
            m2s("req", req(Q.MEM_RD, 9, line))
            answer = values[line]
            if rng.random() < 0.4:              # a write in flight: either value is legal
                new = rng.choice((0x10, 0x20, 0x30))
                m2s("rwd", rwd(W.MEM_WR, 2, line, data=new))
                values[line] = new
                answer = rng.choice((answer, new))
            reads.append(answer)
        bad = trial % 2 == 1
        if bad:
            reads[rng.randrange(len(reads))] = 0x99
        rng.shuffle(reads)
        for c, value in enumerate(reads):
            mon.on_s2m(c, "ndr", ndr(N.CMP_E, 9))
            mon.on_s2m(c, "drs", drs(9, value))
        while mon.waiting.get((2, 0)):
            mon.on_s2m(99, "ndr", ndr(N.CMP, 2))
        mon.finish(100)
        problems = mon.violations + sb.mismatches
        assert bool(problems) == bad, (seed, trial, problems)


def test_out_of_window_reads_sharing_a_tag():
    """Issue 18.2: two outstanding MemRd above the window's end and two below its base, each
    pair sharing a Tag, answered MemData-NXM: no exception, no mismatch, and data other than
    all ones is still caught. A disabled window makes every read out of window."""
    mon, sb, m2s = setup()
    mon.set_window(16, 32, True)
    for tag, lines in ((5, (100, 2000)), (6, (3, 15))):
        for line in lines:
            m2s("req", req(Q.MEM_RD, tag, line))
        for _ in lines:
            mon.on_s2m(1, "drs", drs(tag, ALL_ONES, D.MEM_DATA_NXM))
    mon.finish(2)
    assert mon.violations == [] and sb.mismatches == [] and mon.outstanding == 0
    mon, sb, m2s = setup()
    mon.set_window(16, 32, False)
    m2s("req", req(Q.MEM_RD, 5, 20))
    m2s("req", req(Q.MEM_RD, 5, 21))
    mon.on_s2m(1, "drs", drs(5, ALL_ONES, D.MEM_DATA_NXM))
    mon.on_s2m(1, "drs", drs(5, ALL_ONES ^ 1, D.MEM_DATA_NXM))
    mon.finish(2)
    assert any("all ones" in v for v in mon.violations), mon.violations
    # The scoreboard's own judgement of an out-of-window read: all ones, nothing else.
    mon, sb, m2s = setup()
    mon.set_window(16, 32, True)
    m2s("req", req(Q.MEM_RD, 5, 2000))
    pending = mon.waiting[(5, 0)][0]
    assert sb.accepts(pending, drs(5, ALL_ONES, D.MEM_DATA_NXM))
    assert not sb.accepts(pending, drs(5, 0, D.MEM_DATA_NXM))


def test_checker_exceptions_become_violations():
    """A listener that raises is reported, and the monitor goes on."""
    mon, _, m2s = setup()

    class Broken:
        def accepts(self, p, f):
            raise ValueError("boom")

        def on_complete(self, *a):
            raise KeyError("bang")

    mon.listeners.append(Broken())
    m2s("req", req(Q.MEM_RD, 1, 5))
    m2s("req", req(Q.MEM_RD, 1, 6))
    mon.on_s2m(1, "drs", drs(1, 0))
    mon.on_s2m(1, "ndr", ndr(N.CMP_E, 1))
    text = "\n".join(mon.violations)
    assert "checker error" in text and "boom" in text and "bang" in text


def test_versioned_memory_refuses_lines_outside():
    vm = VersionedMemory(MemoryModel(8))
    for line in (-1, 8):
        try:
            vm.legal_reads(line, 0, 1)
        except IndexError:
            continue
        raise AssertionError(f"line {line} was not refused")


def test_scoreboard_flags_stale_data_and_lost_poison():
    mon, sb, m2s = setup()
    m2s("rwd", rwd(W.MEM_WR, 1, 5, data=0x11))
    m2s("rwd", rwd(W.MEM_WR, 2, 5, data=0x22, poison=1))
    m2s("req", req(Q.MEM_RD, 3, 5))                 # accepted after both writes
    mon.on_s2m(1, "ndr", ndr(N.CMP_E, 3))
    mon.on_s2m(1, "drs", drs(3, 0x11))              # stale
    m2s("req", req(Q.MEM_RD, 4, 5))
    mon.on_s2m(2, "ndr", ndr(N.CMP_E, 4))
    mon.on_s2m(2, "drs", drs(4, 0x22, poison=0))    # poison dropped
    assert len(sb.mismatches) == 2


def test_read_overlapping_a_later_write_may_see_either_value():
    mon, sb, m2s = setup()
    m2s("req", req(Q.MEM_RD, 1, 5))                 # accepted before the write
    m2s("rwd", rwd(W.MEM_WR, 2, 5, data=0x33))
    mon.on_s2m(1, "drs", drs(1, 0x33))              # the write overtook the read: legal
    mon.on_s2m(1, "ndr", ndr(N.CMP_E, 1))
    assert sb.mismatches == []


def test_versioned_memory_matches_merge_rules():
    rng = random.Random(3)
    model = MemoryModel(4)
    vm = VersionedMemory(model)
    expect = 0
    for seq in range(50):
        data, strb = rng.getrandbits(512), rng.getrandbits(64)
        vm.write(seq, 2, data, strb, False)
        expect = merge_line(expect, data, strb)
        assert model.read(2) == (expect, False)
    assert vm.legal_reads(2, 10, 12) == [(vm.versions[2][i].value, False) for i in (10, 11, 12)]


def test_word_outcomes_of_torn_writes():
    base = 0
    writes = [(0xAAAA << 64, 0xFF00), (0xBB << 64, 0x0100)]   # word 1: full, then one byte
    assert word_outcomes(base, writes, 1) == {0, 0xAAAA, 0xBB, 0xAABB}
    assert word_outcomes(base, writes, 0) == {0}              # no write touches word 0


def test_pruning_keeps_what_waiting_reads_may_see():
    vm = VersionedMemory(MemoryModel(4))
    for seq in range(10):
        vm.write(seq, 1, seq + 100, FULL_STRB, False)
    before = vm.legal_reads(1, 6, 9)
    vm.prune(6)                      # the oldest read still waiting was accepted as seq 6
    assert vm.legal_reads(1, 6, 9) == before
    assert [v.seq for v in vm.versions[1]] == [5, 6, 7, 8, 9]


def test_coherence_checker_intervals():
    from sim.checkers.coherence import CoherenceChecker
    c = CoherenceChecker()
    c.write(1, 0xA, 10, 20)
    c.write(1, 0xB, 30, 40)
    assert c.read(1, 0, 0, 5)                 # before any write: the initial value
    assert c.read(1, 0xA, 15, 25)             # overlaps write A: 0 or A
    assert c.read(1, 0, 15, 25)
    assert c.read(1, 0xA, 21, 29)             # after A, before B
    assert not c.read(1, 0, 21, 29)           # A certainly happened: 0 is stale
    assert c.read(1, 0xB, 35, 50) and c.read(1, 0xA, 35, 50)
    assert not c.read(1, 0xA, 41, 50)         # B certainly happened
    assert len(c.violations) == 2 and c.reads_checked == 8
