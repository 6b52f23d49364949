"""The CXL.cache protocol monitor must pass legal flows and flag each rule it claims to check
(synthetic message sequences built through the real layouts; no simulator involved).

Expectations come from ../shared/docs/cxl-reference.md (§2, §3, "Testbench checks" 7, 9-14).
"""
import pytest

from hw.common.cxl_cache import (D2HReq, D2HRsp, D2HData, H2DReq, H2DRsp, H2DData,
                                 D2HReqOpcode as DQ, D2HRspOpcode as DR, H2DReqOpcode as HQ,
                                 H2DRspOpcode as HR, GOState, RspPre)
from hw.common.cxl_mem import M2SReq, M2SReqOpcode as Q, MetaField, MetaValue, SnpType
from sim.checkers.cxl_cache_monitor import CxlCacheMonitor
from sim.model.codec import StructCodec

CODECS = {name: StructCodec(layout) for name, layout in
          (("d2h_req", D2HReq), ("d2h_rsp", D2HRsp), ("d2h_data", D2HData), ("h2d_req", H2DReq),
           ("h2d_rsp", H2DRsp), ("h2d_data", H2DData), ("m2s_req", M2SReq))}
HDM = (0x10000, 0x1000)          # device memory: lines 0x10000..0x10FFF
DEV_LINE = 0x10040


def wire(name, **fields):
    """The dict the BFM will deliver: packed through the layout and unpacked again."""
    codec = CODECS[name]
    return codec.unpack(codec.pack(**fields))


class Bench:
    """Drives one monitor; every message gets the next cycle unless one is given."""

    def __init__(self, hdm=HDM):
        self.mon = CxlCacheMonitor(device_hdm=hdm)
        self.cycle = 0
        self.seq = 0

    def _at(self, cycle):
        if cycle is None:
            self.cycle += 1
            return self.cycle
        return cycle

    # device -> host
    def req(self, op, cqid, line, cycle=None):
        self.mon.on_d2h(self._at(cycle), "req", wire("d2h_req", opcode=op, cqid=cqid, nt=0, addr=line))

    def snp_rsp(self, op, uqid, cycle=None):
        self.mon.on_d2h(self._at(cycle), "rsp", wire("d2h_rsp", opcode=op, uqid=uqid))

    def d2h_data(self, uqid, bogus=0, cycle=None):
        self.mon.on_d2h(self._at(cycle), "data", wire("d2h_data", uqid=uqid, chunk_valid=0, bogus=bogus,
                                                      poison=0, data=0xD0D0 + uqid))

    # host -> device
    def snoop(self, op, line, uqid, cycle=None):
        self.mon.on_h2d(self._at(cycle), "req", wire("h2d_req", opcode=op, addr=line, uqid=uqid))

    def rsp(self, op, cqid, rsp_data=0, cycle=None):
        self.mon.on_h2d(self._at(cycle), "rsp", wire("h2d_rsp", opcode=op, rsp_data=rsp_data,
                                                     rsp_pre=RspPre.HIT, cqid=cqid))

    def go(self, cqid, state, cycle=None):
        self.rsp(HR.GO, cqid, state.value, cycle)

    def h2d_data(self, cqid, cycle=None):
        self.mon.on_h2d(self._at(cycle), "data", wire("h2d_data", cqid=cqid, chunk_valid=0, poison=0,
                                                      go_err=0, data=(1 << 511) | cqid))

    def m2s(self, op, tag, line, mv=MetaValue.INVALID, kind="req"):
        self.seq += 1
        self.mon.on_m2s(self.seq, self._at(None), kind,
                        wire("m2s_req", opcode=op, snp_type=SnpType.NO_OP, meta_field=MetaField.META0_STATE,
                             meta_value=mv, tag=tag, addr=line, ld_id=0, tc=0))

    # whole flows
    def read(self, op, cqid, line, state):
        self.req(op, cqid, line)
        self.h2d_data(cqid)
        self.go(cqid, state)

    def evict(self, op, cqid, line, uqid, pull=HR.GO_WRITE_PULL, bogus=0):
        self.req(op, cqid, line)
        self.rsp(pull, cqid, uqid)
        if pull != HR.GO_WRITE_PULL_DROP:
            self.d2h_data(uqid, bogus)

    def finish(self):
        self.mon.finish(self._at(None))
        return self.mon.violations

    def state(self, line):
        return self.mon.coherence.granted_state(line)


def flagged(bench, fragment, count=1):
    """The run (finished) has exactly `count` violations, all containing `fragment`."""
    violations = bench.finish()
    assert len(violations) == count, violations
    assert all(fragment in v for v in violations), violations
    return violations


def clean(bench):
    assert bench.finish() == []
    assert bench.mon.outstanding == 0


# ---------------------------------------------------------------- legal flows (zero violations)

@pytest.mark.parametrize("go_first", [False, True])
def test_read_for_ownership_data_and_go_e_in_either_order(go_first):
    b = Bench()
    b.req(DQ.RD_OWN, 5, 0x40)
    assert b.mon.outstanding == 1
    if go_first:
        b.go(5, GOState.E)
        assert b.state(0x40) == "E"
        b.h2d_data(5)
    else:
        b.h2d_data(5)
        b.go(5, GOState.E)
    assert b.state(0x40) == "E" and b.mon.outstanding == 0
    assert b.mon.messages == 3
    clean(b)


def test_rdshared_gets_go_s_and_rdany_go_m():
    b = Bench()
    b.read(DQ.RD_SHARED, 1, 0x80, GOState.S)
    b.read(DQ.RD_ANY, 2, 0xC0, GOState.M)
    assert b.state(0x80) == "S" and b.state(0xC0) == "M"
    assert b.mon.coherence.held_lines() == {0x80: "S", 0xC0: "M"}
    clean(b)


def test_rdcurr_gets_data_only_and_caches_nothing():
    b = Bench()
    b.req(DQ.RD_CURR, 3, 0x100)
    b.h2d_data(3)
    assert b.state(0x100) == "I" and b.mon.outstanding == 0
    clean(b)


def test_dirty_evict_pull_then_data_leaves_m():
    b = Bench()
    b.read(DQ.RD_OWN, 1, 0x40, GOState.M)
    b.req(DQ.DIRTY_EVICT, 2, 0x40)
    assert b.state(0x40) == "M"              # snoop ownership kept until the pull
    b.rsp(HR.GO_WRITE_PULL, 2, 0x77)
    assert b.state(0x40) == "I" and b.mon.outstanding == 1     # the data is still owed
    b.d2h_data(0x77)
    clean(b)


def test_dirty_evict_go_err_write_pull_still_sends_data():
    b = Bench()
    b.read(DQ.RD_OWN, 1, 0x40, GOState.E)    # E may have been written silently
    b.evict(DQ.DIRTY_EVICT, 2, 0x40, 0x12, pull=HR.GO_ERR_WRITE_PULL)
    clean(b)


def test_clean_evict_dropped_sends_no_data_and_evict_after_reread_is_fine():
    b = Bench()
    b.read(DQ.RD_SHARED, 1, 0x40, GOState.S)
    b.evict(DQ.CLEAN_EVICT, 2, 0x40, 0x9, pull=HR.GO_WRITE_PULL_DROP)
    b.read(DQ.RD_SHARED, 3, 0x40, GOState.S)
    b.evict(DQ.CLEAN_EVICT, 4, 0x40, 0x9)    # this time pulled
    b.read(DQ.RD_OWN, 5, 0x40, GOState.E)
    b.req(DQ.CLEAN_EVICT_NO_DATA, 6, 0x40)
    b.go(6, GOState.I)
    assert b.state(0x40) == "I"
    clean(b)


def test_itomwr_and_wrcur_pull_then_data():
    b = Bench()
    b.evict(DQ.ITOM_WR, 1, 0x40, 0x21)
    b.evict(DQ.WR_CUR, 2, 0x80, 0x22, pull=HR.GO_ERR_WRITE_PULL)
    clean(b)


def test_wrinv_write_pull_data_then_go_i():
    b = Bench()
    b.req(DQ.WR_INV, 7, 0x40)
    b.rsp(HR.WRITE_PULL, 7, 0x31)
    b.d2h_data(0x31)
    b.go(7, GOState.I)
    clean(b)


def test_wowrinv_fast_go_write_pull_data_ext_cmp():
    b = Bench()
    b.req(DQ.WO_WR_INV, 1, 0x40)
    b.rsp(HR.FAST_GO_WRITE_PULL, 1, 0x41)
    b.d2h_data(0x41)
    b.rsp(HR.EXT_CMP, 1)
    b.req(DQ.WO_WR_INV_F, 2, 0x80)            # error path: still data, still ExtCmp
    b.rsp(HR.GO_ERR_WRITE_PULL, 2, 0x42)
    b.d2h_data(0x42)
    b.rsp(HR.EXT_CMP, 2)
    clean(b)


@pytest.mark.parametrize("data_first", [False, True])
def test_snoop_of_m_line_answered_rspifwdm_with_data(data_first):
    b = Bench()
    b.read(DQ.RD_OWN, 1, 0x40, GOState.M)
    b.snoop(HQ.SNP_INV, 0x40, 0x50)
    if data_first:                           # the device knows the UQID from the snoop
        b.d2h_data(0x50)
        b.snp_rsp(DR.RSP_I_FWD_M, 0x50)
    else:
        b.snp_rsp(DR.RSP_I_FWD_M, 0x50)
        assert b.mon.outstanding == 1
        b.d2h_data(0x50)
    assert b.state(0x40) == "I"
    clean(b)


def test_snpdata_of_e_line_answered_rspshitse_and_snpcur_answers():
    b = Bench()
    b.read(DQ.RD_OWN, 1, 0x40, GOState.E)
    b.snoop(HQ.SNP_DATA, 0x40, 0x50)
    b.snp_rsp(DR.RSP_S_HIT_SE, 0x50)
    assert b.state(0x40) == "S"
    b.snoop(HQ.SNP_CUR, 0x40, 0x51)
    b.snp_rsp(DR.RSP_V_HIT_V, 0x51)
    assert b.state(0x40) == "S"
    b.read(DQ.RD_OWN, 2, 0x80, GOState.M)
    b.snoop(HQ.SNP_DATA, 0x80, 0x52)
    b.snp_rsp(DR.RSP_S_FWD_M, 0x52)
    b.d2h_data(0x52)
    assert b.state(0x80) == "S"
    b.snoop(HQ.SNP_INV, 0x100, 0x53)         # a line the device never had
    b.snp_rsp(DR.RSP_I_HIT_I, 0x53)
    clean(b)


def test_go_err_means_use_once():
    b = Bench()
    b.read(DQ.RD_OWN, 1, 0x40, GOState.ERR)
    assert b.state(0x40) == "I"
    b.read(DQ.RD_SHARED, 2, 0x80, GOState.I)
    assert b.state(0x80) == "I"
    b.snoop(HQ.SNP_INV, 0x40, 0x60)
    b.snp_rsp(DR.RSP_I_HIT_I, 0x60)
    clean(b)


def test_rdownnodata_to_device_memory_completed_by_memrdfwd_flips_bias():
    b = Bench()
    b.req(DQ.RD_OWN_NO_DATA, 0x2A, DEV_LINE)
    b.req(DQ.RD_OWN_NO_DATA, 0x2B, DEV_LINE)          # HDM-D allows several RdOwnNoData
    assert b.mon.device_bias_lines == set()
    b.m2s(Q.MEM_RD, 0x2A, DEV_LINE)                   # other M2S traffic is ignored
    assert b.mon.messages == 2
    b.m2s(Q.MEM_RD_FWD, 0x2A, DEV_LINE)
    assert b.mon.device_bias_lines == {DEV_LINE} and b.state(DEV_LINE) == "E"
    b.m2s(Q.MEM_RD_FWD, 0x2B, DEV_LINE)
    b.req(DQ.RD_SHARED, 0x2C, DEV_LINE + 1)           # a host-bias read of device memory
    b.m2s(Q.MEM_RD_FWD, 0x2C, DEV_LINE + 1, mv=MetaValue.SHARED)
    b.req(DQ.WO_WR_INV, 0x2D, DEV_LINE + 2)
    b.m2s(Q.MEM_WR_FWD, 0x2D, DEV_LINE + 2)
    assert b.mon.device_bias_lines == {DEV_LINE} and b.state(DEV_LINE + 1) == "S"
    clean(b)


def test_clflush_and_rdcurr_are_not_serialized_and_wrinv_of_m_line_is_fine():
    b = Bench()
    b.req(DQ.RD_OWN, 1, 0x40)
    b.req(DQ.RD_CURR, 2, 0x40)
    b.req(DQ.CL_FLUSH, 3, 0x40)
    b.h2d_data(2)
    b.go(3, GOState.I)
    b.h2d_data(1)
    b.go(1, GOState.M)
    b.req(DQ.WR_INV, 4, 0x40)                         # a full-line write replaces the dirty line
    b.rsp(HR.WRITE_PULL, 4, 0x5)
    b.d2h_data(0x5)
    b.go(4, GOState.I)
    clean(b)


def test_bogus_after_a_state_changing_snoop_between_evict_and_pull():
    b = Bench()
    b.read(DQ.RD_OWN, 1, 0x40, GOState.M)
    b.req(DQ.DIRTY_EVICT, 2, 0x40)
    b.snoop(HQ.SNP_INV, 0x40, 0x70)
    b.snp_rsp(DR.RSP_I_FWD_M, 0x70)
    b.d2h_data(0x70)
    b.rsp(HR.GO_WRITE_PULL, 2, 0x71)
    b.d2h_data(0x71, bogus=1)
    # SnpData that takes E away also allows Bogus
    b.read(DQ.RD_OWN, 3, 0x80, GOState.E)
    b.req(DQ.CLEAN_EVICT, 4, 0x80)
    b.snoop(HQ.SNP_DATA, 0x80, 0x72)
    b.snp_rsp(DR.RSP_S_HIT_SE, 0x72)
    b.rsp(HR.GO_WRITE_PULL, 4, 0x73)
    b.d2h_data(0x73, bogus=1)
    clean(b)


def test_evict_in_the_same_cycle_as_the_invalidating_snoop_answer():
    b = Bench()
    b.read(DQ.RD_SHARED, 1, 0x40, GOState.S)
    b.snoop(HQ.SNP_INV, 0x40, 0x70)
    b.snp_rsp(DR.RSP_I_HIT_SE, 0x70, cycle=100)
    b.req(DQ.CLEAN_EVICT, 2, 0x40, cycle=100)
    b.rsp(HR.GO_WRITE_PULL, 2, 0x71)
    b.d2h_data(0x71, bogus=1)
    clean(b)


def test_listener_rejects_unknown_kind():
    b = Bench()
    with pytest.raises(ValueError):
        b.mon.on_d2h(1, "snoop", {})


# ---------------------------------------------------------------- check 9: reads

def test_read_with_two_data_messages():
    b = Bench()
    b.req(DQ.RD_OWN, 5, 0x40)
    b.h2d_data(5)
    b.h2d_data(5)
    b.go(5, GOState.E)
    flagged(b, "second H2D data for RD_OWN CQID 0x5")


def test_read_with_two_gos():
    b = Bench()
    b.req(DQ.RD_OWN, 5, 0x40)
    b.go(5, GOState.E)
    b.go(5, GOState.E)
    b.h2d_data(5)
    b.go(5, GOState.E)                       # after completion
    v = flagged(b, "CQID 0x5", 2)
    assert "second GO for RD_OWN" in v[0] and "after RD_OWN CQID 0x5 line 0x40" in v[1]


def test_rdcurr_must_not_get_a_go():
    b = Bench()
    b.req(DQ.RD_CURR, 3, 0x40)
    b.go(3, GOState.I)
    b.h2d_data(3)
    flagged(b, "GO is not an answer to RD_CURR")


@pytest.mark.parametrize("op", [DQ.RD_OWN_NO_DATA, DQ.CL_FLUSH, DQ.CACHE_FLUSHED])
def test_read0_gets_no_data(op):
    b = Bench()
    b.req(op, 4, 0x40)
    b.h2d_data(4)
    b.go(4, GOState.I if op != DQ.RD_OWN_NO_DATA else GOState.E)
    flagged(b, "which gets no data")


def test_answers_for_unknown_cqid_and_cqid_reuse_and_missing_go():
    b = Bench()
    b.h2d_data(9)
    b.go(9, GOState.E)
    b.req(DQ.RD_OWN, 1, 0x40)
    b.req(DQ.RD_SHARED, 1, 0x80)             # CQID 1 still live
    b.h2d_data(1)
    v = b.finish()
    assert len(v) == 4, v
    assert sum("which no live D2H request has" in x for x in v) == 2
    assert "reuses CQID 0x1 while RD_OWN CQID 0x1 line 0x40" in v[2]
    assert "RD_SHARED CQID 0x1 line 0x80" in v[3] and "never got GO" in v[3]


def test_go_state_must_fit_the_request():
    b = Bench()
    b.read(DQ.RD_OWN, 1, 0x40, GOState.S)
    b.read(DQ.RD_SHARED, 2, 0x80, GOState.E)
    b.req(DQ.RD_OWN_NO_DATA, 3, 0xC0)
    b.go(3, GOState.M)
    v = flagged(b, "is not a grant for", 3)
    assert "GO-S is not a grant for RD_OWN" in v[0] and "GO-M is not a grant for RD_OWN_NO_DATA" in v[2]


# ---------------------------------------------------------------- check 10: writes

def test_wrinv_go_before_write_pull():
    b = Bench()
    b.req(DQ.WR_INV, 7, 0x40)
    b.go(7, GOState.I)
    b.rsp(HR.WRITE_PULL, 7, 0x31)
    b.d2h_data(0x31)
    b.go(7, GOState.I)                        # the early GO was not applied: this one ends it
    flagged(b, "GO for WR_INV CQID 0x7 line 0x40 (cycle 1) before its WritePull")


def test_two_data_messages_for_one_pull():
    b = Bench()
    b.evict(DQ.ITOM_WR, 1, 0x40, 0x21)
    b.d2h_data(0x21)
    flagged(b, "D2H data to UQID 0x21 after GO_WRITE_PULL UQID 0x21 for ITOM_WR")


def test_no_data_after_go_write_pull_drop():
    b = Bench()
    b.read(DQ.RD_SHARED, 1, 0x40, GOState.S)
    b.evict(DQ.CLEAN_EVICT, 2, 0x40, 0x33, pull=HR.GO_WRITE_PULL_DROP)
    b.d2h_data(0x33)
    flagged(b, "after GO_WRITE_PULL_DROP UQID 0x33 for CLEAN_EVICT")


def test_no_data_for_clean_evict_no_data():
    b = Bench()
    b.read(DQ.RD_SHARED, 1, 0x40, GOState.S)
    b.req(DQ.CLEAN_EVICT_NO_DATA, 2, 0x40)
    b.d2h_data(0x44)
    b.go(2, GOState.I)
    flagged(b, "D2H data to UQID 0x44 that no pull or *Fwd* snoop answer asked for")


def test_pull_without_data_and_go_err_write_pull_without_data():
    b = Bench()
    b.read(DQ.RD_OWN, 1, 0x40, GOState.M)
    b.req(DQ.DIRTY_EVICT, 2, 0x40)
    b.rsp(HR.GO_ERR_WRITE_PULL, 2, 0x12)     # the host drops it, but the data must come
    b.req(DQ.ITOM_WR, 3, 0x80)
    b.rsp(HR.GO_WRITE_PULL, 3, 0x13)
    v = flagged(b, "never sent", 2)
    assert "UQID 0x12" in v[0] and "UQID 0x13" in v[1]


def test_dirty_evict_must_not_be_dropped():
    b = Bench()
    b.read(DQ.RD_OWN, 1, 0x40, GOState.M)
    b.req(DQ.DIRTY_EVICT, 2, 0x40)
    b.rsp(HR.GO_WRITE_PULL_DROP, 2, 0x12)
    b.rsp(HR.GO_WRITE_PULL, 2, 0x12)
    b.d2h_data(0x12)
    flagged(b, "GO_WRITE_PULL_DROP is not an answer to DIRTY_EVICT")


def test_wowrinv_ends_in_ext_cmp():
    b = Bench()
    b.req(DQ.WO_WR_INV, 1, 0x40)
    b.rsp(HR.FAST_GO_WRITE_PULL, 1, 0x41)
    b.d2h_data(0x41)                          # ExtCmp never comes
    b.req(DQ.WO_WR_INV_F, 2, 0x80)
    b.rsp(HR.EXT_CMP, 2)                      # before its pull
    v = b.finish()
    assert len(v) == 2, v
    assert "cycle 5: EXT_CMP for WO_WR_INV_F CQID 0x2 line 0x80 (cycle 4) before its pull" in v[0]
    assert "WO_WR_INV CQID 0x1" in v[1] and "never got ExtCmp" in v[1]


def test_fast_go_is_not_an_answer():
    b = Bench()
    b.req(DQ.WO_WR_INV, 1, 0x40)
    b.rsp(HR.FAST_GO, 1)
    b.rsp(HR.FAST_GO_WRITE_PULL, 1, 0x41)
    b.d2h_data(0x41)
    b.rsp(HR.EXT_CMP, 1)
    flagged(b, "FAST_GO is not an answer to WO_WR_INV")


# ---------------------------------------------------------------- check 11: caching in the granted state

def test_m_line_snooped_answered_without_data():
    b = Bench()
    b.read(DQ.RD_OWN, 1, 0x40, GOState.M)
    b.snoop(HQ.SNP_INV, 0x40, 0x50)
    b.snp_rsp(DR.RSP_I_HIT_I, 0x50)
    b.read(DQ.RD_ANY, 2, 0x80, GOState.M)
    b.snoop(HQ.SNP_DATA, 0x80, 0x51)
    b.snp_rsp(DR.RSP_S_HIT_SE, 0x51)
    v = flagged(b, "but the line is granted M (GO-M dropped silently)", 2)
    assert "RSP_I_HIT_I answers SNP_INV UQID 0x50 line 0x40" in v[0]


def test_clean_evict_of_an_m_line():
    b = Bench()
    b.read(DQ.RD_OWN, 1, 0x40, GOState.M)
    b.evict(DQ.CLEAN_EVICT, 2, 0x40, 0x9)
    b.read(DQ.RD_OWN, 3, 0x80, GOState.M)
    b.req(DQ.CLEAN_EVICT_NO_DATA, 4, 0x80)
    b.go(4, GOState.I)
    flagged(b, "of a line granted M drops its dirty data", 2)


def test_evict_of_a_line_never_granted_and_after_go_err():
    b = Bench()
    b.evict(DQ.DIRTY_EVICT, 1, 0x40, 0x9)
    b.read(DQ.RD_OWN, 2, 0x80, GOState.ERR)   # use once: not cached
    b.evict(DQ.CLEAN_EVICT, 3, 0x80, 0xA)
    flagged(b, "evicts a line it does not hold", 2)


def test_snoop_answer_claims_a_hit_on_a_line_not_granted():
    b = Bench()
    b.snoop(HQ.SNP_DATA, 0x40, 0x50)
    b.snp_rsp(DR.RSP_S_HIT_SE, 0x50)
    b.req(DQ.RD_SHARED, 1, 0x80)              # data arrived, GO not yet: not cached
    b.snoop(HQ.SNP_CUR, 0x80, 0x51)
    b.snp_rsp(DR.RSP_V_HIT_V, 0x51)
    b.h2d_data(1)
    b.go(1, GOState.S)
    flagged(b, "claims a hit on a line not granted", 2)


def test_snoop_answer_fwd_from_s_line():
    b = Bench()
    b.read(DQ.RD_SHARED, 1, 0x40, GOState.S)
    b.snoop(HQ.SNP_DATA, 0x40, 0x50)
    b.snp_rsp(DR.RSP_I_FWD_M, 0x50)
    b.d2h_data(0x50)
    flagged(b, "RSP_I_FWD_M answers SNP_DATA UQID 0x50 line 0x40 (cycle 4) but the line is granted S")


def test_cache_flushed_while_holding_m():
    b = Bench()
    b.read(DQ.RD_OWN, 1, 0x40, GOState.M)
    b.read(DQ.RD_OWN, 2, 0x80, GOState.M)
    b.req(DQ.DIRTY_EVICT, 3, 0x80)            # 0x80 is being written back: fine
    b.req(DQ.CACHE_FLUSHED, 4, 0)
    b.go(4, GOState.I)
    b.rsp(HR.GO_WRITE_PULL, 3, 0x11)
    b.d2h_data(0x11)
    flagged(b, "while line 0x40 is still held in M")
    assert b.mon.coherence.held_lines() == {}


def test_go_that_drops_m_without_dirty_evict():
    b = Bench()
    b.read(DQ.RD_OWN, 1, 0x40, GOState.M)
    b.req(DQ.CL_FLUSH, 2, 0x40)
    b.go(2, GOState.I)
    b.read(DQ.RD_OWN, 3, 0x80, GOState.M)
    b.req(DQ.DIRTY_EVICT, 4, 0x80)            # written back first: fine (GPF: DirtyEvict then CLFlush)
    b.req(DQ.CL_FLUSH, 5, 0x80)
    b.go(5, GOState.I)
    b.rsp(HR.GO_WRITE_PULL, 4, 0x14)
    b.d2h_data(0x14)
    flagged(b, "moves line 0x40 from M to I without a DirtyEvict")


def test_dirty_evict_of_an_s_line():
    b = Bench()
    b.read(DQ.RD_SHARED, 1, 0x40, GOState.S)
    b.evict(DQ.DIRTY_EVICT, 2, 0x40, 0x9)
    flagged(b, "DIRTY_EVICT CQID 0x2 line 0x40 (cycle 4) of a line granted only S")


# ---------------------------------------------------------------- check 12: snoops

def test_two_snoops_to_one_line():
    b = Bench()
    b.snoop(HQ.SNP_INV, 0x40, 0x50)
    b.snoop(HQ.SNP_DATA, 0x40, 0x51)
    b.snp_rsp(DR.RSP_I_HIT_I, 0x50)
    b.snp_rsp(DR.RSP_I_HIT_I, 0x51)
    flagged(b, "sent while SNP_INV UQID 0x50 line 0x40 (cycle 1) is pending (one snoop per line)")


def test_snoop_between_data_and_go():
    b = Bench()
    b.req(DQ.RD_OWN, 1, 0x40)
    b.snoop(HQ.SNP_INV, 0x40, 0x50)           # before the data: allowed
    b.snp_rsp(DR.RSP_I_HIT_I, 0x50)
    b.h2d_data(1)
    b.snoop(HQ.SNP_INV, 0x40, 0x51)
    b.snp_rsp(DR.RSP_I_HIT_I, 0x51)
    b.go(1, GOState.E)
    flagged(b, "sent between the H2D data and the GO of RD_OWN CQID 0x1")


def test_go_while_snoop_pending():
    b = Bench()
    b.read(DQ.RD_SHARED, 1, 0x40, GOState.S)
    b.read(DQ.RD_SHARED, 2, 0xC0, GOState.S)
    b.req(DQ.RD_OWN, 3, 0x40)                 # upgrade: no data yet, so a snoop may come
    b.req(DQ.CLEAN_EVICT, 4, 0xC0)
    b.snoop(HQ.SNP_INV, 0x40, 0x51)
    b.snoop(HQ.SNP_INV, 0xC0, 0x52)
    b.go(3, GOState.E)
    b.rsp(HR.GO_WRITE_PULL, 4, 0x60)
    b.snp_rsp(DR.RSP_I_HIT_SE, 0x51)          # judged against the state when the snoop came (S)
    b.snp_rsp(DR.RSP_I_HIT_SE, 0x52)
    b.h2d_data(3)
    b.d2h_data(0x60)
    v = flagged(b, "(no GO while a snoop is pending)", 2)
    assert v[0].startswith("cycle 11: GO for RD_OWN") and v[1].startswith("cycle 12: GO_WRITE_PULL for CLEAN_EVICT")


def test_write_pull_concurrent_with_snoop():
    b = Bench()
    b.req(DQ.WR_INV, 1, 0x40)
    b.snoop(HQ.SNP_INV, 0x40, 0x50)
    b.rsp(HR.WRITE_PULL, 1, 0x60)
    b.snp_rsp(DR.RSP_I_HIT_I, 0x50)
    b.d2h_data(0x60)
    b.go(1, GOState.I)
    flagged(b, "WRITE_PULL for WR_INV CQID 0x1 line 0x40 (cycle 1) while SNP_INV")


def test_snoop_answer_not_in_table_3_26():
    b = Bench()
    b.read(DQ.RD_OWN, 1, 0x40, GOState.E)
    b.snoop(HQ.SNP_INV, 0x40, 0x50)
    b.snp_rsp(DR.RSP_S_HIT_SE, 0x50)
    b.snoop(HQ.SNP_DATA, 0x80, 0x51)
    b.snp_rsp(DR.RSP_V_HIT_V, 0x51)
    flagged(b, "is not a legal answer to SNP_", 2)


def test_only_fwd_answers_carry_exactly_one_line():
    b = Bench()
    b.read(DQ.RD_OWN, 1, 0x40, GOState.E)
    b.snoop(HQ.SNP_DATA, 0x40, 0x50)
    b.d2h_data(0x50)
    b.snp_rsp(DR.RSP_S_HIT_SE, 0x50)          # data with a non-Fwd answer
    b.read(DQ.RD_OWN, 2, 0x80, GOState.M)
    b.snoop(HQ.SNP_INV, 0x80, 0x51)
    b.snp_rsp(DR.RSP_I_FWD_M, 0x51)           # Fwd without its data
    b.read(DQ.RD_OWN, 3, 0xC0, GOState.M)
    b.snoop(HQ.SNP_CUR, 0xC0, 0x52)
    b.d2h_data(0x52)
    b.d2h_data(0x52)
    b.snp_rsp(DR.RSP_V_FWD_V, 0x52)           # two lines for one Fwd
    b.snoop(HQ.SNP_INV, 0xC0, 0x53)
    b.snp_rsp(DR.RSP_I_FWD_M, 0x53)
    b.d2h_data(0x53)
    b.d2h_data(0x53)                          # one more after the answer
    v = b.finish()
    assert len(v) == 4, v
    assert "only *Fwd* answers carry data" in v[0]
    assert "got 2 D2H data messages" in v[1]
    assert "D2H data to UQID 0x53 after RSP_I_FWD_M" in v[2]
    assert "D2H data to UQID 0x51 never sent for RSP_I_FWD_M" in v[3]


def test_snoop_answer_without_snoop_and_snoop_never_answered():
    b = Bench()
    b.snp_rsp(DR.RSP_I_HIT_I, 0x50)
    b.snoop(HQ.SNP_INV, 0x40, 0x51)
    v = b.finish()
    assert len(v) == 2, v
    assert "which no pending snoop has" in v[0] and "SNP_INV UQID 0x51 line 0x40 (cycle 2) never answered" in v[1]


# ---------------------------------------------------------------- check 13: device obligations

def test_bogus_without_a_snoop():
    b = Bench()
    b.read(DQ.RD_OWN, 1, 0x40, GOState.M)
    b.evict(DQ.DIRTY_EVICT, 2, 0x40, 0x9, bogus=1)
    flagged(b, "Bogus data for DIRTY_EVICT CQID 0x2 line 0x40")


def test_bogus_after_a_snoop_that_changed_nothing_or_came_after_the_pull():
    b = Bench()
    b.read(DQ.RD_SHARED, 1, 0x40, GOState.S)
    b.req(DQ.CLEAN_EVICT, 2, 0x40)
    b.snoop(HQ.SNP_DATA, 0x40, 0x50)
    b.snp_rsp(DR.RSP_S_HIT_SE, 0x50)          # S stays S: not state-changing
    b.rsp(HR.GO_WRITE_PULL, 2, 0x60)
    b.d2h_data(0x60, bogus=1)
    b.read(DQ.RD_OWN, 3, 0x80, GOState.M)
    b.req(DQ.DIRTY_EVICT, 4, 0x80)
    b.rsp(HR.GO_WRITE_PULL, 4, 0x61)
    b.snoop(HQ.SNP_INV, 0x80, 0x51)           # after the pull: ownership already given up
    b.snp_rsp(DR.RSP_I_HIT_I, 0x51)
    b.d2h_data(0x61, bogus=1)
    flagged(b, "without a state-changing snoop between the evict and its pull", 2)


def test_duplicate_evicts():
    b = Bench()
    b.read(DQ.RD_OWN, 1, 0x40, GOState.M)
    b.req(DQ.DIRTY_EVICT, 2, 0x40)
    b.req(DQ.DIRTY_EVICT, 3, 0x40)            # while the first is live
    b.rsp(HR.GO_WRITE_PULL, 2, 0x60)
    b.d2h_data(0x60)
    b.rsp(HR.GO_WRITE_PULL, 3, 0x61)
    b.d2h_data(0x61)
    b.read(DQ.RD_SHARED, 4, 0x80, GOState.S)
    b.evict(DQ.CLEAN_EVICT, 5, 0x80, 0x62)
    b.req(DQ.CLEAN_EVICT_NO_DATA, 6, 0x80)    # no read in between
    b.go(6, GOState.I)
    v = flagged(b, "duplicate evict", 2)
    assert "while DIRTY_EVICT CQID 0x2" in v[0] and "since its last evict" in v[1]


def test_reads_to_a_line_are_serialized():
    b = Bench()
    b.req(DQ.RD_SHARED, 1, 0x40)
    b.req(DQ.RD_OWN, 2, 0x40)                 # RdShared still waits for its GO
    b.req(DQ.RD_OWN_NO_DATA, 3, 0x80)
    b.req(DQ.RD_OWN, 4, 0x80)                 # only RdOwnNoData may follow RdOwnNoData
    b.go(1, GOState.S)
    b.h2d_data(1)
    b.read(DQ.RD_SHARED, 5, 0xC0, GOState.S)
    b.req(DQ.RD_OWN, 6, 0xC0)                 # after the GO: fine
    for cqid, state in ((2, GOState.E), (3, GOState.E), (4, GOState.E), (6, GOState.E)):
        if cqid != 3:
            b.h2d_data(cqid)
        b.go(cqid, state)
    v = flagged(b, "still waits for its GO (reads to a line are serialized)", 2)
    assert "RD_OWN CQID 0x2" in v[0] and "RD_OWN CQID 0x4" in v[1]


def test_reads_wait_for_earlier_evict_and_clflush_gos():
    b = Bench()
    b.read(DQ.RD_OWN, 1, 0x40, GOState.M)
    b.req(DQ.DIRTY_EVICT, 2, 0x40)
    b.req(DQ.RD_OWN, 3, 0x40)                 # the evict still waits for its GO_WritePull
    b.rsp(HR.GO_WRITE_PULL, 2, 0x60)
    b.d2h_data(0x60)
    b.h2d_data(3)
    b.go(3, GOState.E)
    b.req(DQ.CL_FLUSH, 4, 0x80)
    b.req(DQ.RD_SHARED, 5, 0x80)              # the CLFlush still waits for its GO
    b.req(DQ.RD_CURR, 6, 0x80)                # RdCurr is exempt
    b.go(4, GOState.I)
    b.h2d_data(5)
    b.go(5, GOState.S)
    b.h2d_data(6)
    v = flagged(b, "still waits for its GO", 2)
    assert "RD_OWN CQID 0x3 line 0x40" in v[0] and "while DIRTY_EVICT CQID 0x2" in v[0]
    assert "RD_SHARED CQID 0x5 line 0x80" in v[1] and "while CL_FLUSH CQID 0x4" in v[1]


# ---------------------------------------------------------------- check 14 and check 7: device memory

def test_no_evicts_to_device_memory():
    b = Bench()
    b.req(DQ.RD_OWN_NO_DATA, 1, DEV_LINE)
    b.m2s(Q.MEM_RD_FWD, 1, DEV_LINE)
    b.evict(DQ.DIRTY_EVICT, 2, DEV_LINE, 0x60)
    b.req(DQ.CLEAN_EVICT_NO_DATA, 3, DEV_LINE + 5)
    b.go(3, GOState.I)
    flagged(b, "evicts a line of the device's own memory on CXL.cache", 2)


def test_fwd_tag_must_be_a_live_cqid_for_the_line():
    b = Bench()
    b.req(DQ.RD_OWN_NO_DATA, 0x2A, DEV_LINE)
    b.m2s(Q.MEM_RD_FWD, 0x2B, DEV_LINE)       # wrong Tag
    b.m2s(Q.MEM_RD_FWD, 0x2A, DEV_LINE + 1)   # wrong line
    b.m2s(Q.MEM_RD_FWD, 0x2A, DEV_LINE)
    b.m2s(Q.MEM_RD_FWD, 0x2A, DEV_LINE)       # no longer live
    v = b.finish()
    assert len(v) == 3, v
    assert "MEM_RD_FWD Tag 0x2b line 0x10040 matches no live D2H request CQID" in v[0]
    assert "is for another line" in v[1]
    assert "Tag 0x2a line 0x10040 matches no live" in v[2]
    assert b.mon.device_bias_lines == {DEV_LINE}


def test_fwd_must_fit_the_request_and_come_instead_of_h2d_answers():
    b = Bench()
    b.req(DQ.RD_OWN, 1, DEV_LINE)
    b.m2s(Q.MEM_WR_FWD, 1, DEV_LINE)          # a write forward does not complete a read
    b.h2d_data(1)
    b.m2s(Q.MEM_RD_FWD, 1, DEV_LINE)          # already got H2D data
    b.req(DQ.RD_SHARED, 2, 0x40)
    b.m2s(Q.MEM_RD_FWD, 2, 0x40)              # host memory: no forwards
    v = b.finish()
    assert len(v) == 3, v
    assert "MEM_WR_FWD Tag 0x1 does not complete RD_OWN" in v[0]
    assert "already got H2D answers" in v[1]
    assert "a line outside the device memory" in v[2]


def test_bias_flips_only_after_memrdfwd_for_rdownnodata():
    b = Bench()
    b.req(DQ.RD_OWN_NO_DATA, 1, DEV_LINE)
    b.go(1, GOState.E)                        # a GO-E is ownership, not a bias flip
    b.req(DQ.CL_FLUSH, 2, DEV_LINE + 1)
    b.go(2, GOState.I)                        # "A CLFlush answered with GO-I is not sufficient"
    b.req(DQ.RD_OWN, 3, DEV_LINE + 2)
    b.m2s(Q.MEM_RD_FWD, 3, DEV_LINE + 2)      # a RdOwn forward is no flip either
    assert b.mon.device_bias_lines == set()
    assert b.state(DEV_LINE) == "E" and b.state(DEV_LINE + 2) == "E"
    clean(b)


# ---------------------------------------------------------------- identifiers and reserved encodings

def test_reserved_opcodes_are_flagged():
    b = Bench()
    b.req(DQ.RESERVED_0, 1, 0x40)
    b.req(0b11111, 2, 0x40)
    b.snoop(HQ.RESERVED_0, 0x80, 0x50)
    b.snp_rsp(DR.RSP_I_HIT_I, 0x50)           # one report for the snoop, not two
    v = flagged(b, "reserved opcode", 3)
    assert "D2H request with reserved opcode 0x1f, CQID 0x2" in v[1] and "UQID 0x50 line 0x80" in v[2]


def test_second_pull_and_uqid_reuse():
    b = Bench()
    b.req(DQ.WR_INV, 1, 0x40)
    b.rsp(HR.WRITE_PULL, 1, 0x31)
    b.rsp(HR.WRITE_PULL, 1, 0x32)             # second pull for one write
    b.d2h_data(0x31)
    b.go(1, GOState.I)
    b.req(DQ.ITOM_WR, 2, 0x80)
    b.req(DQ.ITOM_WR, 3, 0xC0)
    b.rsp(HR.GO_WRITE_PULL, 2, 0x33)
    b.rsp(HR.GO_WRITE_PULL, 3, 0x33)          # UQID 0x33 still owed data
    b.d2h_data(0x33)
    b.snoop(HQ.SNP_INV, 0x100, 0x50)
    b.snoop(HQ.SNP_INV, 0x140, 0x50)          # UQID of a pending snoop
    b.snp_rsp(DR.RSP_I_HIT_I, 0x50)           # answers the newer one; the older is forgotten
    b.snoop(HQ.SNP_INV, 0x100, 0x54)          # so line 0x100 has no pending snoop any more
    b.snp_rsp(DR.RSP_I_HIT_I, 0x54)
    v = b.finish()
    assert len(v) == 3, v                     # one report per reused identifier, no cascade
    assert "second pull WRITE_PULL for WR_INV CQID 0x1" in v[0]
    assert "GO_WRITE_PULL UQID 0x33 for ITOM_WR CQID 0x3" in v[1]
    assert "reuses UQID 0x33 while data is still owed" in v[1]
    assert "SNP_INV UQID 0x50 line 0x140" in v[2]
    assert "reuses the UQID of pending SNP_INV UQID 0x50 line 0x100" in v[2]


# ---------------------------------------------------------------- issue 20: evicts held back, stray host messages

def _held_back_evict(b, line, cqid, snoops, evict_op=DQ.DIRTY_EVICT, uqid0=0x60):
    """Snoops answered from the line the device still holds while its evict (queued before the
    snoops) is held back on D2H Req; then the evict, its GO_WritePull and (Bogus) data."""
    answer = {  # held state -> snoop -> (answer, forwards data, state after)
        "M": {HQ.SNP_DATA: (DR.RSP_S_FWD_M, True, "S"), HQ.SNP_CUR: (DR.RSP_V_FWD_V, True, "M"),
              HQ.SNP_INV: (DR.RSP_I_FWD_M, True, "I")},
        "E": {HQ.SNP_DATA: (DR.RSP_S_HIT_SE, False, "S"), HQ.SNP_CUR: (DR.RSP_V_HIT_V, False, "E"),
              HQ.SNP_INV: (DR.RSP_I_HIT_SE, False, "I")},
        "S": {HQ.SNP_DATA: (DR.RSP_S_HIT_SE, False, "S"), HQ.SNP_CUR: (DR.RSP_V_HIT_V, False, "S"),
              HQ.SNP_INV: (DR.RSP_I_HIT_SE, False, "I")},
        "I": {s: (DR.RSP_I_HIT_I, False, "I") for s in (HQ.SNP_DATA, HQ.SNP_CUR, HQ.SNP_INV)},
    }
    held = b.state(line)
    changed = False
    for k, (snp, data_first) in enumerate(snoops):
        rsp, fwd, after = answer[held][snp]
        uqid = uqid0 + k
        b.snoop(snp, line, uqid)
        if fwd and data_first:
            b.d2h_data(uqid)
        b.snp_rsp(rsp, uqid)
        if fwd and not data_first:
            b.d2h_data(uqid)
        changed |= snp == HQ.SNP_INV or after != held
        held = after
    b.req(evict_op, cqid, line)
    b.rsp(HR.GO_WRITE_PULL, cqid, 0x5F)
    b.d2h_data(0x5F, bogus=int(changed))
    return held


def test_dirty_evict_held_back_across_snoops_that_take_the_line_m_s_i():
    """Issue 20 regression: M line, DirtyEvict queued, D2H Req held not ready; SnpData ->
    RspSFwdM, SnpCur -> RspVHitV, SnpInv -> RspIHitSE, SnpInv -> RspIHitI; then the DirtyEvict
    arrives. Judged against M (the state when it was queued), not S."""
    b = Bench()
    b.read(DQ.RD_OWN, 1, 0x40, GOState.M)
    held = _held_back_evict(b, 0x40, 2, [(HQ.SNP_DATA, False), (HQ.SNP_CUR, False),
                                         (HQ.SNP_INV, False), (HQ.SNP_INV, False)])
    assert held == "I" and b.state(0x40) == "I"
    clean(b)


def test_crossing_window_ends_at_the_next_request_to_the_line():
    """A crossing evict must precede any later D2H request to its line (one ordered channel)."""
    b = Bench()
    b.read(DQ.RD_OWN, 1, 0x40, GOState.M)
    b.snoop(HQ.SNP_INV, 0x40, 0x50)
    b.snp_rsp(DR.RSP_I_FWD_M, 0x50)
    b.d2h_data(0x50)
    b.req(DQ.RD_CURR, 2, 0x40)
    b.h2d_data(2)
    b.req(DQ.DIRTY_EVICT, 3, 0x40)
    b.rsp(HR.GO_WRITE_PULL, 3, 0x51)
    b.d2h_data(0x51)
    flagged(b, "evicts a line it does not hold")


def test_evict_held_back_random(capsys):
    """Random variant: an M or E line's evict held back on D2H Req across 1-6 random snoops."""
    import os
    import random
    seed = int(os.environ.get("TCXL_SEED", "0")) or random.randrange(1 << 30)
    print(f"seed {seed} (replay with TCXL_SEED={seed})")
    rng = random.Random(seed)
    for i in range(300):
        b = Bench()
        line = 0x1000 + i
        state = rng.choice([GOState.M, GOState.E])
        b.read(DQ.RD_OWN, 1, line, state)
        evict_op = DQ.DIRTY_EVICT if state == GOState.M or rng.random() < 0.5 else DQ.CLEAN_EVICT
        snoops = [(rng.choice([HQ.SNP_DATA, HQ.SNP_CUR, HQ.SNP_INV]), rng.random() < 0.5)
                  for _ in range(rng.randint(1, 6))]
        _held_back_evict(b, line, 2, snoops, evict_op)
        assert b.finish() == [], (seed, i, state, evict_op, snoops)


def test_reserved_snoop_answered_rsp_i_hit_i_changes_nothing():
    b = Bench()
    b.read(DQ.RD_OWN, 1, 0x40, GOState.M)
    for k, op in enumerate((0, 4, 5, 6, 7)):
        b.snoop(op, 0x40, 0x50 + k)
        b.snp_rsp(DR.RSP_I_HIT_I, 0x50 + k)
    assert b.state(0x40) == "M"
    b.snoop(HQ.SNP_INV, 0x40, 0x60)               # still M: only RspIFwdM fits
    b.snp_rsp(DR.RSP_I_FWD_M, 0x60)
    b.d2h_data(0x60)
    v = b.finish()
    assert len(v) == 5 and all("reserved opcode" in x for x in v), v
    assert b.mon.host_violations == v and b.mon.device_violations == []


@pytest.mark.parametrize("answer", [DR.RSP_V_HIT_V, DR.RSP_I_HIT_SE, DR.RSP_V_FWD_V])
def test_reserved_snoop_answered_otherwise_is_a_device_violation(answer):
    b = Bench()
    b.read(DQ.RD_OWN, 1, 0x40, GOState.E)
    b.snoop(5, 0x40, 0x50)
    b.snp_rsp(answer, 0x50)
    v = b.finish()
    assert len(b.mon.host_violations) == 1 and "reserved opcode" in b.mon.host_violations[0], v
    assert len(b.mon.device_violations) == 1, v
    assert "a reserved snoop is answered RspIHitI" in b.mon.device_violations[0]


def test_stray_host_messages_are_host_violations_and_change_nothing():
    """Stray GO / GO_WritePull / WritePull / data for free, retired or wrong-phase CQIDs are
    the host's errors; the monitor's view of the device does not move."""
    b = Bench()
    b.req(DQ.RD_OWN_NO_DATA, 1, 0x40)
    b.go(1, GOState.E)                            # line 0x40 E (written: M)
    b.evict(DQ.DIRTY_EVICT, 2, 0x40, 0x31)        # flushed: I
    b.go(1, GOState.M)                            # stray GO-M for the old CQID
    b.go(0x801, GOState.E)                        # CQID out of range
    b.rsp(HR.GO_WRITE_PULL, 2, 0x32)              # stray pull for a retired evict
    b.rsp(HR.WRITE_PULL, 9, 0x33)                 # never used
    b.h2d_data(2)
    b.req(DQ.RD_OWN, 3, 0x80)
    b.rsp(HR.GO_WRITE_PULL, 3, 0x34)              # wrong phase: a read gets no pull
    b.h2d_data(3)
    b.h2d_data(3)                                 # duplicate data
    b.go(3, GOState.E)
    b.go(3, GOState.M)                            # duplicate GO
    assert b.state(0x40) == "I" and b.state(0x80) == "E"
    b.snoop(HQ.SNP_INV, 0x40, 0x50)
    b.snp_rsp(DR.RSP_I_HIT_I, 0x50)
    v = b.finish()
    assert len(v) == 8 and b.mon.host_violations == v and b.mon.device_violations == [], v
