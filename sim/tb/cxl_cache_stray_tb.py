"""cocotb tests: the CXL.cache agent ignores illegal host messages (issue 20).

Contract checked (hw/cxl_controller/cxl_cache.py, "Illegal host messages"): an H2D GO,
GO_WritePull, WritePull (any H2D response) or H2D data whose CQID is out of range, names a
free tracker, or names a tracker not in the phase that takes the message is dropped: no
tracker, cache line, buffer, port answer or D2H message changes; ERR_CACHE_STRAY counts it
and CACHE_STRAY_INFO captures the first one. A reserved snoop opcode (0, 4-7) is answered
RspIHitI with no data and no state change and counted in ERR_CACHE_SNOOP_RSVD. Also the
issue's second half on RTL: an evict held back on D2H Req across several snoops.

``illegal_host_round`` is the reusable illegal-host phase: legal traffic leaves flows half
done, random illegal messages are injected, then everything must be as before. The CXL.cache
monitor watches every message; it must see exactly the injected host errors and no device
violation. Random tests log their seed; replay with TCXL_SEED=<seed>.
"""
from __future__ import annotations

import cocotb

from hw.common.cxl_cache import (D2HReqOpcode as DReq, D2HRspOpcode as DRsp,
                                 H2DReqOpcode as Snp, H2DRspOpcode as HRsp, GOState)
from hw.cxl_controller.cache_port import CacheOp
from sim.tb.cxl_cache_tb import Bench, setup, own, line_in_slot

RESERVED_SNOOPS = (0, 4, 5, 6, 7)
STRAY_RSP_OPS = (HRsp.GO, HRsp.GO_WRITE_PULL, HRsp.WRITE_PULL, HRsp.GO_WRITE_PULL_DROP,
                 HRsp.GO_ERR_WRITE_PULL)
GO_STATES = (GOState.I, GOState.S, GOState.E, GOState.M, GOState.ERR)


def out_of_range(b: Bench, cqid: int, rng=None) -> int:
    """``cqid`` with a bit above the tracker count set (the agent must not alias it)."""
    n = b.env.config.cache_trackers
    bits = [1 << k for k in range((n - 1).bit_length(), 12)]
    return cqid | (rng.choice(bits) if rng else bits[-1])


async def write_line(b: Bench, line, value):
    """WRITE ``line`` (a miss: RdOwnNoData, GO-E): the device holds it M with ``value``."""
    rid = b.client.request(CacheOp.WRITE, line, value)
    (r,) = await b.d2h_req()
    assert r["opcode"] == DReq.RD_OWN_NO_DATA.value
    b.host.go(r["cqid"], GOState.E)
    assert (await b.answer(rid))["error"] == 0
    return r


async def snoop_answer(b: Bench, op, line, uqid, want: DRsp, data=None):
    """Snoop, wait for the answer, check it (and the forwarded line: ``data`` or none)."""
    n_rsp, n_data = len(b.host.got["d2h_rsp"]), len(b.host.got["d2h_data"])
    b.host.snoop(op, line, uqid)
    await b.until(lambda: len(b.host.got["d2h_rsp"]) > n_rsp, "the snoop answer")
    rsp = b.host.got["d2h_rsp"][-1]
    assert rsp["uqid"] == uqid
    assert rsp["opcode"] == want.value, \
        f"snoop {op} of line {line:#x}: {DRsp(rsp['opcode']).name}, expected {want.name}"
    await b.quiet(12)
    if data is None:
        assert len(b.host.got["d2h_data"]) == n_data, "a snoop answer without *Fwd* sent data"
    else:
        assert len(b.host.got["d2h_data"]) == n_data + 1
        assert b.host.got["d2h_data"][-1]["uqid"] == uqid and b.host.got["d2h_data"][-1]["data"] == data


async def nothing_happens(b: Bench, cycles=48):
    """After illegal messages: no D2H message and no port answer (a stray answer to an id the
    client has no request for stops the client with an error)."""
    counts = {k: len(v) for k, v in b.host.got.items()}
    answers = dict(b.answers)
    await b.quiet(cycles)
    b.check_links()
    assert {k: len(v) for k, v in b.host.got.items()} == counts, \
        f"the device sent D2H messages after illegal host messages: {b.host.got}"
    assert b.answers == answers, "the port got an answer to an illegal host message"


async def check_errors(b: Bench, stray: int, snoop: int, first=None):
    """ERR_CACHE_STRAY / ERR_CACHE_SNOOP_RSVD count exactly what was injected, STATUS.ERROR
    is set when any was, and CACHE_STRAY_INFO holds ``first`` = (kind, reason, opcode, qid,
    go_state or None); then clear them all for the next phase."""
    from hw.cxl_controller.csr_map import field
    from hw.cxl_controller.cxl_cache import StrayKind, StrayReason
    csr = b.env.csr
    assert await csr.read("ERR_CACHE_STRAY") == stray
    assert await csr.read("ERR_CACHE_SNOOP_RSVD") == snoop
    status = await csr.read("STATUS")
    assert bool(status & field("STATUS", "ERROR").mask) == bool(stray or snoop)
    info = await csr.read("CACHE_STRAY_INFO")

    def get(name):
        f = field("CACHE_STRAY_INFO", name)
        return (info & f.mask) >> f.lsb
    assert get("VALID") == bool(stray or snoop)
    if first is not None:
        kind, reason, opcode, qid, go_state = first
        got = (StrayKind(get("KIND")), StrayReason(get("REASON")), get("OPCODE"), get("QID"))
        want = (kind, reason, int(getattr(opcode, "value", opcode)), qid)
        assert got == want, f"CACHE_STRAY_INFO {info:#x}: {got}, expected {want}"
        if go_state is not None:
            assert get("GO_STATE") == go_state.value
    await csr.write("ERR_CACHE_STRAY", 0)
    await csr.write("ERR_CACHE_SNOOP_RSVD", 0)
    await csr.write("CACHE_STRAY_INFO", field("CACHE_STRAY_INFO", "VALID").mask)
    await csr.write("STATUS", field("STATUS", "ERROR").mask)
    assert not (await csr.read("CACHE_STRAY_INFO")) & field("CACHE_STRAY_INFO", "VALID").mask


def kinds():
    from hw.cxl_controller.cxl_cache import StrayKind, StrayReason
    return StrayKind, StrayReason


@cocotb.test()
async def stray_go_for_a_free_cqid_changes_nothing(dut):
    """The issue's sequence: WRITE X (RdOwnNoData, GO-E); FLUSH X (DirtyEvict, GO_WritePull,
    data); a stray GO-M / GO-E / GO-S for the old CQID; a legal SnpInv to X must then be
    answered RspIHitI (not RspIFwdM with stale data, nor RspIHitSE), and the port gets no
    answer."""
    b = await setup(dut)
    first = None
    for k, state in enumerate((GOState.M, GOState.E, GOState.S)):
        line = 0x2300 + k
        r1 = await write_line(b, line, 0x1000 + k)
        rid = b.client.request(CacheOp.FLUSH, line)
        (fl,) = await b.d2h_req()
        assert fl["opcode"] == DReq.DIRTY_EVICT.value
        b.host.rsp(fl["cqid"], HRsp.GO_WRITE_PULL, uqid=0x40 + k)
        assert (await b.answer(rid))["error"] == 0
        assert b.host.got["d2h_data"][-1]["data"] == 0x1000 + k
        # The host CPU now stores X; then a stray GO for the WRITE's (free) CQID.
        b.host.go(r1["cqid"], state)
        await nothing_happens(b)
        await snoop_answer(b, Snp.SNP_INV, line, 0x80 + k, DRsp.RSP_I_HIT_I)
        if first is None:
            kind, reason = kinds()
            first = (kind.RSP, reason.FREE, HRsp.GO, r1["cqid"], state)
    await check_errors(b, 3, 0, first)
    b.finish(host_errors=3)


@cocotb.test()
async def stray_cqid_above_the_tracker_count(dut):
    """CQID 0x800|n (and any bit above the tracker count) names no tracker: a GO, data and a
    pull with such a CQID must not act on tracker n, which is waiting for its GO."""
    b = await setup(dut)
    rid = b.client.request(CacheOp.READ_OWN, 0x3100)
    (r,) = await b.d2h_req()
    n = r["cqid"]
    b.host.data(n, 0xAAAA)
    await b.quiet(8)
    bad = out_of_range(b, n)
    b.host.go(bad, GOState.M)
    b.host.data(bad, 0xBBBB)
    b.host.rsp(n | b.env.config.cache_trackers, HRsp.GO_WRITE_PULL, uqid=5)
    await nothing_happens(b)
    assert rid not in b.answers, "an out-of-range GO completed tracker n"
    b.host.go(n, GOState.E)
    ans = await b.answer(rid)
    assert ans["data"] == 0xAAAA and ans["error"] == 0
    # Granted E (not the stray M): SnpCur answers RspVHitV without data.
    await snoop_answer(b, Snp.SNP_CUR, 0x3100, 0x21, DRsp.RSP_V_HIT_V)
    kind, reason = kinds()
    await check_errors(b, 3, 0, (kind.RSP, reason.OUT_OF_RANGE, HRsp.GO, bad, GOState.M))
    b.finish(host_errors=3)


@cocotb.test()
async def stray_data_and_pulls_for_free_cqids(dut):
    """H2D data for a free CQID (last used by RdCurr) and GO_WritePull / WritePull for a free
    CQID (last used by ItoMWr) must not answer the port again nor send D2H data from the
    tracker's old buffer."""
    b = await setup(dut)
    rid = b.client.request(CacheOp.READ_CURRENT, 0x3200)
    (rc,) = await b.d2h_req()
    b.host.data(rc["cqid"], 0x77)
    assert (await b.answer(rid))["data"] == 0x77
    rid = b.client.request(CacheOp.PUSH, 0x3201, 0xFACE)
    (iw,) = await b.d2h_req()
    assert iw["opcode"] == DReq.ITOM_WR.value
    b.host.rsp(iw["cqid"], HRsp.GO_WRITE_PULL, uqid=0x11)
    assert (await b.answer(rid))["error"] == 0
    await b.quiet(8)
    b.host.data(rc["cqid"], 0x99)                      # stray data
    await b.quiet(4)                                   # (first: it is the one captured)
    b.host.rsp(iw["cqid"], HRsp.GO_WRITE_PULL, uqid=0x12)  # stray pulls
    b.host.rsp(iw["cqid"], HRsp.WRITE_PULL, uqid=0x13)
    b.host.rsp(rc["cqid"], HRsp.GO_ERR_WRITE_PULL, uqid=0x14)
    await nothing_happens(b)
    kind, reason = kinds()
    await check_errors(b, 4, 0, (kind.DATA, reason.FREE, 0, rc["cqid"], None))
    b.finish(host_errors=4)


@cocotb.test()
async def stray_messages_in_the_wrong_phase(dut):
    """Live trackers get messages their flow does not take, or takes once: a pull for a read,
    data twice, a GO twice, data and a plain GO for an ItoMWr, GO before WritePull for a WrInv,
    a plain GO for a DirtyEvict. Each is dropped; the flows then finish with the right data."""
    b = await setup(dut)
    slots = b.env.config.cache_lines
    # RdOwn waiting for data and GO.
    rid_rd = b.client.request(CacheOp.READ_OWN, 0x3300)
    (rd,) = await b.d2h_req()
    # ItoMWr waiting for its GO_WritePull.
    rid_iw = b.client.request(CacheOp.PUSH, 0x3301, 0x1111)
    (iw,) = await b.d2h_req()
    # WrInv waiting for its WritePull.
    rid_wi = b.client.request(CacheOp.PUSH_INV, 0x3302, 0x2222)
    (wi,) = await b.d2h_req()
    # A dirty line evicted by a fill of its slot: DirtyEvict waiting for its pull.
    a, c = line_in_slot(11, 0, slots), line_in_slot(11, 1, slots)
    await write_line(b, a, 0x3333)
    rid_c = b.client.request(CacheOp.READ_SHARED, c)
    ev, rc = await b.d2h_req(2)
    assert ev["opcode"] == DReq.DIRTY_EVICT.value and ev["addr"] == a
    injected = 0
    b.host.rsp(rd["cqid"], HRsp.GO_WRITE_PULL, uqid=0x31)   # a read gets no pull
    b.host.go(iw["cqid"], GOState.I)                         # ItoMWr: GO_WritePull only
    b.host.data(iw["cqid"], 0xBAD1)                          # a write gets no H2D data
    b.host.go(wi["cqid"], GOState.I)                         # WrInv: GO only after its pull
    b.host.go(ev["cqid"], GOState.E)                         # an evict: pulls only
    b.host.data(ev["cqid"], 0xBAD2)
    injected += 6
    await nothing_happens(b)
    # The flows, legally; with duplicates on the way.
    b.host.data(rd["cqid"], 0x4444)
    b.host.data(rd["cqid"], 0xBAD3)                          # second data
    injected += 1
    await b.quiet(8)
    b.host.go(rd["cqid"], GOState.E)
    assert (await b.answer(rid_rd))["data"] == 0x4444
    b.host.go(rd["cqid"], GOState.M)                         # second GO
    injected += 1
    b.host.rsp(iw["cqid"], HRsp.GO_WRITE_PULL, uqid=0x32)
    assert (await b.answer(rid_iw))["error"] == 0
    b.host.rsp(wi["cqid"], HRsp.WRITE_PULL, uqid=0x33)
    await b.until(lambda: any(d["uqid"] == 0x33 for d in b.host.got["d2h_data"]), "the WrInv data")
    await b.quiet(16)
    assert rid_wi not in b.answers, "WrInv answered before its GO"
    b.host.go(wi["cqid"], GOState.I)
    assert (await b.answer(rid_wi))["error"] == 0
    # The evicted line is still ours (M): SnpData takes it to S with the data.
    await snoop_answer(b, Snp.SNP_DATA, a, 0x34, DRsp.RSP_S_FWD_M, data=0x3333)
    b.host.rsp(ev["cqid"], HRsp.GO_WRITE_PULL, uqid=0x35)
    b.host.data(rc["cqid"], 0x5555)
    b.host.go(rc["cqid"], GOState.S)
    assert (await b.answer(rid_c))["data"] == 0x5555
    await b.quiet(16)
    by_uqid = {d["uqid"]: d for d in b.host.got["d2h_data"]}
    assert by_uqid[0x32]["data"] == 0x1111 and by_uqid[0x33]["data"] == 0x2222
    assert by_uqid[0x35]["data"] == 0x3333 and by_uqid[0x35]["bogus"] == 1
    assert set(by_uqid) == {0x32, 0x33, 0x34, 0x35}
    # RdOwn was granted E, not the duplicate's M: SnpCur answers RspVHitV.
    await snoop_answer(b, Snp.SNP_CUR, 0x3300, 0x36, DRsp.RSP_V_HIT_V)
    kind, reason = kinds()
    await check_errors(b, injected, 0, (kind.RSP, reason.WRONG_PHASE, HRsp.GO_WRITE_PULL,
                                        rd["cqid"], None))
    b.finish(host_errors=injected)


@cocotb.test()
async def reserved_snoop_opcodes_answer_rsp_i_hit_i(dut):
    """Snoop opcodes 0, 4, 5, 6, 7 are reserved: RspIHitI, no data, no state change (an M
    line stays M with its data), counted in ERR_CACHE_SNOOP_RSVD; not answered as SnpCur."""
    b = await setup(dut)
    await write_line(b, 0x3400, 0xC0FFEE)
    await own(b, 0x3401, 0xBEEF, CacheOp.READ_SHARED, GOState.S)
    for k, op in enumerate(RESERVED_SNOOPS):
        await snoop_answer(b, op, 0x3400, 0x10 + k, DRsp.RSP_I_HIT_I)
        await snoop_answer(b, op, 0x3401, 0x20 + k, DRsp.RSP_I_HIT_I)
        await snoop_answer(b, op, 0x3402, 0x30 + k, DRsp.RSP_I_HIT_I)
    await snoop_answer(b, Snp.SNP_CUR, 0x3400, 0x40, DRsp.RSP_V_FWD_V, data=0xC0FFEE)
    await snoop_answer(b, Snp.SNP_CUR, 0x3401, 0x41, DRsp.RSP_V_HIT_V)
    kind, reason = kinds()
    n = 3 * len(RESERVED_SNOOPS)
    await check_errors(b, 0, n, (kind.SNOOP, reason.RESERVED_SNOOP, 0, 0x10, None))
    assert await b.env.csr.read("STAT_SNOOP") == n + 2
    b.finish(host_errors=n)


# Snoop answers from a held line (Table 3-26 as the agent implements it): state -> snoop ->
# (answer, forwards the line, state after).
SNOOP_MODEL = {
    "M": {Snp.SNP_DATA: (DRsp.RSP_S_FWD_M, True, "S"), Snp.SNP_CUR: (DRsp.RSP_V_FWD_V, True, "M"),
          Snp.SNP_INV: (DRsp.RSP_I_FWD_M, True, "I")},
    "E": {Snp.SNP_DATA: (DRsp.RSP_S_HIT_SE, False, "S"), Snp.SNP_CUR: (DRsp.RSP_V_HIT_V, False, "E"),
          Snp.SNP_INV: (DRsp.RSP_I_HIT_SE, False, "I")},
    "S": {Snp.SNP_DATA: (DRsp.RSP_S_HIT_SE, False, "S"), Snp.SNP_CUR: (DRsp.RSP_V_HIT_V, False, "S"),
          Snp.SNP_INV: (DRsp.RSP_I_HIT_SE, False, "I")},
    "I": {s: (DRsp.RSP_I_HIT_I, False, "I") for s in (Snp.SNP_DATA, Snp.SNP_CUR, Snp.SNP_INV)},
}


@cocotb.test()
async def evict_held_back_across_snoops(dut):
    """Issue 20, part 2, on RTL: the device owns a line (M or E) and queues its evict; the
    host holds D2H Req not ready while snoops take the line from the evict buffer; then the
    evict arrives. The monitor must judge it against the state it was queued in. Round 0 is
    the issue's sequence (M; SnpData, SnpCur, SnpInv, SnpInv); then 15 random rounds."""
    b = await setup(dut)
    rng = b.rng
    slots = b.env.config.cache_lines
    uqid = 0x100
    for rnd in range(16):
        slot = 24 + rnd                                   # a fresh slot: no other victim
        a, c = line_in_slot(slot, 2 * rnd + 2, slots), line_in_slot(slot, 2 * rnd + 3, slots)
        value = rng.getrandbits(512)
        if rnd == 0:
            held, snoops = "M", [Snp.SNP_DATA, Snp.SNP_CUR, Snp.SNP_INV, Snp.SNP_INV]
        else:
            held = rng.choice("ME")
            snoops = [rng.choice((Snp.SNP_DATA, Snp.SNP_CUR, Snp.SNP_INV))
                      for _ in range(rng.randint(1, 5))]
        if held == "M":
            await write_line(b, a, value)
        else:
            await own(b, a, value, CacheOp.READ_OWN, GOState.E)
        n_req = len(b.host.got["d2h_req"])
        b.host.link.hold.add("d2h_req")
        rid = b.client.request(CacheOp.READ_OWN, c)       # evicts a first: queued, held back
        await b.quiet(12)
        changed, queued = False, held
        for snp in snoops:
            want, fwd, after = SNOOP_MODEL[held][snp]
            uqid += 1
            await snoop_answer(b, snp, a, uqid, want, data=value if fwd else None)
            changed |= after != held
            held = after
        assert len(b.host.got["d2h_req"]) == n_req, "D2H Req was held"
        b.host.link.hold.discard("d2h_req")
        ev, rd = await b.d2h_req(2)
        assert ev["addr"] == a and rd["addr"] == c
        assert ev["opcode"] == (DReq.DIRTY_EVICT if queued == "M" else DReq.CLEAN_EVICT).value
        uqid += 1
        n_data = len(b.host.got["d2h_data"])
        b.host.rsp(ev["cqid"], HRsp.GO_WRITE_PULL, uqid=uqid)
        await b.until(lambda n=n_data: len(b.host.got["d2h_data"]) > n, "the evict data")
        d = b.host.got["d2h_data"][-1]
        assert d["uqid"] == uqid and d["data"] == value and d["bogus"] == int(changed)
        b.host.data(rd["cqid"], 7)
        b.host.go(rd["cqid"], GOState.E)
        assert (await b.answer(rid))["data"] == 7
        b.check_links()
        assert not b.monitor.violations, (rnd, snoops, b.monitor.violations)
    b.finish()


# ------------------------------------------------------------------ the illegal-host phase
# Half-done legal flows the phase leaves open while it injects: kind -> the illegal H2D
# messages for that tracker (("rsp", opcode) or ("data",)); all others are injected at free
# or out-of-range CQIDs.
WRONG_PHASE = {
    "rd_own_data": [("data",), ("rsp", HRsp.GO_WRITE_PULL), ("rsp", HRsp.WRITE_PULL),
                    ("rsp", HRsp.GO_WRITE_PULL_DROP)],                 # has data, waits for GO
    "rd_shared_go": [("rsp", HRsp.GO), ("rsp", HRsp.GO_WRITE_PULL)],    # has GO, waits for data
    "itomwr": [("rsp", HRsp.GO), ("rsp", HRsp.WRITE_PULL), ("data",), ("rsp", HRsp.GO_WRITE_PULL_DROP)],
    "wrinv_pulled": [("rsp", HRsp.WRITE_PULL), ("rsp", HRsp.GO_WRITE_PULL), ("data",)],
    "rdcurr": [("rsp", HRsp.GO), ("rsp", HRsp.GO_ERR_WRITE_PULL)],
    "dirty_evict": [("rsp", HRsp.GO), ("rsp", HRsp.WRITE_PULL), ("data",),
                    ("rsp", HRsp.GO_WRITE_PULL_DROP)],
}
ANY_RSP = STRAY_RSP_OPS + (HRsp.RESERVED_0, HRsp.EXT_CMP, HRsp.FAST_GO, HRsp.FAST_GO_WRITE_PULL)


class IllegalHostPhase:
    """Reusable illegal-host stimulus for a ScriptedHost bench (``Bench``).

    ``await run_round(lines)``: puts half of ``lines`` in random states (M, E, S, I) and
    leaves a random half-done flow on each of the others (RdOwn with data but no GO, RdShared
    with GO but no data, ItoMWr before its pull, WrInv pulled before its GO, RdCurr before its
    data, DirtyEvict before its pull); injects random illegal host messages (GO, GO_WritePull,
    WritePull, Drop, reserved H2D Rsp opcodes and H2D data for free and out-of-range CQIDs and
    for those trackers in the wrong phase; reserved snoop opcodes); then checks that nothing
    moved: no D2H message but the RspIHitI answers, no port answer, every line's state (legal
    SnpCur probes), the flows finishing with the right data, the host image (every pulled or
    forwarded line), ERR_CACHE_STRAY / ERR_CACHE_SNOOP_RSVD counting exactly the injected
    messages. Lines end invalid (flushed). ``lines`` must map to distinct cache slots that hold
    no valid line. The monitor sees every message; ``injected`` totals its host violations.
    """

    def __init__(self, b: Bench, rng):
        self.b, self.rng = b, rng
        self.injected = 0
        self.uqid = 0x400
        self.host_image: dict[int, int] = {}     # line -> last value pulled or forwarded

    def next_uqid(self):
        self.uqid = 0x400 + (self.uqid - 0x400 + 1) % 0x800
        return self.uqid

    async def probe(self, line, state, value):
        """A legal SnpCur: its answer shows the line's state (and M data) without changing it."""
        want = {"M": DRsp.RSP_V_FWD_V, "E": DRsp.RSP_V_HIT_V, "S": DRsp.RSP_V_HIT_V,
                "I": DRsp.RSP_I_HIT_I}[state]
        uqid = self.next_uqid()
        await snoop_answer(self.b, Snp.SNP_CUR, line, uqid, want, data=value if state == "M" else None)
        if state == "M":
            self.host_image[line] = value

    async def pull(self, cqid, line, value, op=HRsp.GO_WRITE_PULL, bogus=0):
        b = self.b
        uqid = self.next_uqid()
        n = len(b.host.got["d2h_data"])
        b.host.rsp(cqid, op, uqid=uqid)
        await b.until(lambda: len(b.host.got["d2h_data"]) > n, "pulled data")
        d = b.host.got["d2h_data"][-1]
        assert d["uqid"] == uqid and d["data"] == value and d["bogus"] == bogus, (d, value)
        self.host_image[line] = value

    async def run_round(self, lines):
        b, rng = self.b, self.rng
        counts0 = (await b.env.csr.read("ERR_CACHE_STRAY"), await b.env.csr.read("ERR_CACHE_SNOOP_RSVD"))
        assert counts0 == (0, 0)
        lines = list(lines)
        rng.shuffle(lines)
        half = len(lines) // 2
        resident = {line: (rng.choice("MESI"), rng.getrandbits(512)) for line in lines[:half]}
        for line, (state, value) in resident.items():
            if state == "M":
                await write_line(b, line, value)
            elif state in "ES":
                await own(b, line, value, CacheOp.READ_OWN if state == "E" else CacheOp.READ_SHARED,
                          GOState.E if state == "E" else GOState.S)
        flows = {}                        # cqid -> (kind, line, value, rid)
        for line in lines[half:]:
            kind = rng.choice(sorted(WRONG_PHASE))
            value = rng.getrandbits(512)
            if kind == "dirty_evict":
                await write_line(b, line, value)
                rid = b.client.request(CacheOp.FLUSH, line)
            else:
                op = {"rd_own_data": CacheOp.READ_OWN, "rd_shared_go": CacheOp.READ_SHARED,
                      "itomwr": CacheOp.PUSH, "wrinv_pulled": CacheOp.PUSH_INV,
                      "rdcurr": CacheOp.READ_CURRENT}[kind]
                rid = b.client.request(op, line, value)
            (r,) = await b.d2h_req()
            cqid = r["cqid"]
            flows[cqid] = (kind, line, value, rid)
            if kind == "rd_own_data":
                b.host.data(cqid, value)
            elif kind == "rd_shared_go":
                b.host.go(cqid, GOState.S)
            elif kind == "wrinv_pulled":
                await self.pull(cqid, line, value, HRsp.WRITE_PULL)
        await b.quiet(16)
        # ---- inject
        free = [c for c in range(b.env.config.cache_trackers) if c not in flows]
        retired = [c for c in b.monitor._retired if c in free] or free
        stray = snoops = 0
        quiet_lines = list(resident) + [0x7F000 + k for k in range(4)]   # no flow, no snoop pending
        n_rsp = len(b.host.got["d2h_rsp"])
        counts = {k: len(v) for k, v in b.host.got.items()}
        for _ in range(rng.randint(4, 14)):
            what = rng.random()
            if what < 0.2:
                snoops += 1
                b.host.snoop(rng.choice(RESERVED_SNOOPS), rng.choice(quiet_lines), self.next_uqid())
                await b.until(lambda n=n_rsp + snoops: len(b.host.got["d2h_rsp"]) >= n, "a RspIHitI")
                assert b.host.got["d2h_rsp"][-1]["opcode"] == DRsp.RSP_I_HIT_I.value
            else:
                stray += 1
                if what < 0.5 and flows:
                    cqid = rng.choice(sorted(flows))
                    msg = rng.choice(WRONG_PHASE[flows[cqid][0]])
                elif what < 0.8:
                    cqid = rng.choice(retired if rng.random() < 0.7 else free)
                    msg = ("data",) if rng.random() < 0.3 else ("rsp", rng.choice(ANY_RSP))
                else:
                    cqid = out_of_range(b, rng.randrange(b.env.config.cache_trackers), rng)
                    msg = ("data",) if rng.random() < 0.3 else ("rsp", rng.choice(ANY_RSP))
                if msg[0] == "data":
                    b.host.data(cqid, rng.getrandbits(512), poison=rng.random() < 0.2)
                elif msg[1] == HRsp.GO:
                    b.host.go(cqid, rng.choice(GO_STATES))
                else:
                    b.host.rsp(cqid, msg[1], uqid=rng.getrandbits(12))
            if rng.random() < 0.5:
                await b.quiet(rng.randint(1, 4))
        counts["d2h_rsp"] += snoops
        await b.quiet(48)
        b.check_links()
        assert {k: len(v) for k, v in b.host.got.items()} == counts, "D2H messages after illegal ones"
        assert not b.answers, f"port answers after illegal host messages: {b.answers}"
        self.injected += stray + snoops
        # ---- nothing moved: line states, then the flows finish as they would have
        for line, (state, value) in resident.items():
            await self.probe(line, state, value)
        for cqid, (kind, line, value, rid) in sorted(flows.items()):
            if kind == "rd_own_data":
                b.host.go(cqid, GOState.E)
                assert (await b.answer(rid))["data"] == value
                resident[line] = ("E", value)
            elif kind == "rd_shared_go":
                b.host.data(cqid, value)
                assert (await b.answer(rid))["data"] == value
                resident[line] = ("S", value)
            elif kind == "itomwr":
                await self.pull(cqid, line, value)
                assert (await b.answer(rid))["error"] == 0
            elif kind == "wrinv_pulled":
                b.host.go(cqid, GOState.I)
                assert (await b.answer(rid))["error"] == 0
            elif kind == "rdcurr":
                b.host.data(cqid, value)
                assert (await b.answer(rid))["data"] == value
            else:
                await self.pull(cqid, line, value)
                assert (await b.answer(rid))["error"] == 0
            resident.setdefault(line, ("I", value))
        for line, (state, value) in resident.items():
            await self.probe(line, state, value)
        # ---- leave every line invalid; the host image holds every written value
        for line, (state, value) in resident.items():
            if state == "I":
                continue
            rid = b.client.request(CacheOp.FLUSH, line)
            (r,) = await b.d2h_req()
            if state == "M":
                assert r["opcode"] == DReq.DIRTY_EVICT.value
                await self.pull(r["cqid"], line, value)
            else:
                assert r["opcode"] == DReq.CL_FLUSH.value
                b.host.go(r["cqid"], GOState.I)
            assert (await b.answer(rid))["error"] == 0
        for line, (state, value) in resident.items():
            if state == "M":
                assert self.host_image[line] == value
        for kind, line, value, _ in flows.values():
            if kind in ("itomwr", "wrinv_pulled", "dirty_evict"):
                assert self.host_image[line] == value
        assert await b.env.csr.read("ERR_CACHE_GO") == 0, "a stray GO-Err / poison counted as an error"
        await check_errors(b, stray, snoops)
        return stray, snoops


@cocotb.test()
async def illegal_host_rounds(dut):
    """The illegal-host phase between legal traffic: TCXL_ROUNDS rounds (default 8) of 8 lines."""
    import os
    b = await setup(dut)
    phase = IllegalHostPhase(b, b.rng)
    slots = b.env.config.cache_lines
    total = [0, 0]
    for rnd in range(int(os.environ.get("TCXL_ROUNDS", "8"))):
        first = (rnd * 8) % slots
        lines = [line_in_slot(s % slots, 40 + rnd, slots) for s in range(first, first + 8)]
        stray, snoops = await phase.run_round(lines)
        total[0] += stray
        total[1] += snoops
    dut._log.info(f"illegal host rounds: {total[0]} stray H2D messages, {total[1]} reserved snoops, "
                  f"seed {b.env.seed}")
    b.finish(host_errors=phase.injected)
