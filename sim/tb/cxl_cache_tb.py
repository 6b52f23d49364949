"""cocotb tests of the CXL.cache agent (hw/cxl_controller/cxl_cache.py), host side scripted.

Each test plays the host message by message (``ScriptedHost``) and asserts every D2H
message the device sends and every answer on its internal port, so each flow is pinned
exactly: read for ownership, shared read and upgrade, dirty and clean eviction, ItoMWr and
WrInv pushes, flushes, a snoop of every type in every state, Bogus after a snoop hits an
evicted line, GO-Err. The CXL.cache protocol monitor watches every message when present.
"""
from __future__ import annotations

import random

import cocotb
from cocotb.triggers import Timer

from hw.common.cxl_cache import (D2HReq, D2HRsp, D2HData, H2DReq, H2DRsp, H2DData,
                                 D2HReqOpcode as DReq, D2HRspOpcode as DRsp,
                                 H2DReqOpcode as Snp, H2DRspOpcode as HRsp, GOState)
from hw.cxl_controller.cache_port import CacheOp
from sim.bfm.cache_client import CacheClient
from sim.bfm.link import LinkDriver
from sim.env import DeviceEnv, CLOCK_PERIOD_NS
from sim.model.codec import StructCodec

CODECS_H2D = {"h2d_req": StructCodec(H2DReq), "h2d_rsp": StructCodec(H2DRsp),
              "h2d_data": StructCodec(H2DData)}
CODECS_D2H = {"d2h_req": StructCodec(D2HReq), "d2h_rsp": StructCodec(D2HRsp),
              "d2h_data": StructCodec(D2HData)}
ALL_ONES = (1 << 512) - 1


class ScriptedHost:
    """The host side, played by the test: records D2H messages, sends what it is told."""

    def __init__(self, dut, clk, rng, monitor=None):
        self.link = LinkDriver(dut, clk, tx=CODECS_H2D, rx=CODECS_D2H, rng=rng)
        self.link.listeners.append(self)
        self.got = {"d2h_req": [], "d2h_rsp": [], "d2h_data": []}
        self.monitor = monitor

    def on_rx(self, cycle, name, fields):
        self.got[name].append(fields)
        if self.monitor:
            self.monitor.on_d2h(cycle, name[4:], fields)

    def on_tx(self, cycle, name, fields):
        if self.monitor:
            self.monitor.on_h2d(cycle, name[4:], fields)

    def go(self, cqid, state: GOState):
        self.link.send("h2d_rsp", {"opcode": HRsp.GO.value, "rsp_data": state.value,
                                   "rsp_pre": 0, "cqid": cqid})

    def rsp(self, cqid, opcode: HRsp, uqid=0):
        self.link.send("h2d_rsp", {"opcode": opcode.value, "rsp_data": uqid, "rsp_pre": 0,
                                   "cqid": cqid})

    def data(self, cqid, value, poison=0, go_err=0):
        self.link.send("h2d_data", {"cqid": cqid, "chunk_valid": 1, "poison": poison,
                                    "go_err": go_err, "data": value})

    def snoop(self, opcode: Snp, line, uqid):
        self.link.send("h2d_req", {"opcode": opcode.value, "addr": line, "uqid": uqid})


class Bench:
    def __init__(self, env: DeviceEnv):
        self.env = env
        self.clk = env.clk
        self.rng = env.rng
        monitor = None
        try:
            from sim.checkers.cxl_cache_monitor import CxlCacheMonitor
            monitor = CxlCacheMonitor()
        except ImportError:
            pass
        self.monitor = monitor
        self.host = ScriptedHost(env.dut, self.clk, random.Random(env.seed + 1), monitor)
        self.client = CacheClient(env.dut, self.clk, rng=random.Random(env.seed + 2))
        self.answers: dict[int, dict] = {}
        self.client.on_response.append(lambda req, f, cycle: self.answers.__setitem__(req.id, f))
        self.host.link.start()
        self.client.start()

    async def until(self, cond, what: str, timeout_cycles: int = 2000):
        for _ in range(timeout_cycles // 4):
            for drv in (self.host.link, self.client.link):
                if drv.error is not None:
                    raise drv.error
            if cond():
                return
            await Timer(4 * CLOCK_PERIOD_NS, unit="ns")
        raise TimeoutError(f"timed out waiting for {what}")

    async def d2h_req(self, count=1):
        start = len(self.host.got["d2h_req"])
        await self.until(lambda: len(self.host.got["d2h_req"]) >= start + count,
                         f"{count} D2H request(s)")
        return self.host.got["d2h_req"][start:start + count]

    async def answer(self, rid):
        await self.until(lambda: rid in self.answers, f"the answer to request {rid}")
        return self.answers.pop(rid)

    async def quiet(self, cycles=64):
        await Timer(cycles * CLOCK_PERIOD_NS, unit="ns")

    def finish(self):
        assert self.host.link.error is None and self.client.link.error is None
        if self.monitor is not None:
            self.monitor.finish(self.host.link.cycle)
            assert not self.monitor.violations, "\n".join(self.monitor.violations[:10])


async def setup(dut) -> Bench:
    env = await DeviceEnv.create(dut)
    return Bench(env)


def line_in_slot(slot, k, slots):
    """The k-th distinct line that maps to cache slot ``slot``."""
    return slot + k * slots


async def own(b: Bench, line, value, op=CacheOp.READ_OWN, state=GOState.E):
    """Bring ``line`` into the device cache with a read (data ``value``, GO ``state``)."""
    rid = b.client.request(op, line)
    (req,) = await b.d2h_req()
    b.host.data(req["cqid"], value)
    b.host.go(req["cqid"], state)
    ans = await b.answer(rid)
    assert ans["data"] == value and ans["error"] == 0
    return req


@cocotb.test()
async def read_for_ownership_then_hits(dut):
    b = await setup(dut)
    v = b.rng.getrandbits(512)
    req = await own(b, 0x1234, v)
    assert req["opcode"] == DReq.RD_OWN.value and req["addr"] == 0x1234
    # Now E: reads and a write hit without any CXL.cache traffic.
    rid = b.client.request(CacheOp.READ_SHARED, 0x1234)
    assert (await b.answer(rid))["data"] == v
    w = b.rng.getrandbits(512)
    rid = b.client.request(CacheOp.WRITE, 0x1234, w)
    assert (await b.answer(rid))["error"] == 0
    rid = b.client.request(CacheOp.READ_CURRENT, 0x1234)
    assert (await b.answer(rid))["data"] == w
    await b.quiet()
    assert len(b.host.got["d2h_req"]) == 1
    assert await b.env.csr.read("STAT_CACHE_HIT") == 3
    b.finish()


@cocotb.test()
async def shared_read_then_write_upgrade(dut):
    b = await setup(dut)
    v = b.rng.getrandbits(512)
    req = await own(b, 77, v, CacheOp.READ_SHARED, GOState.S)
    assert req["opcode"] == DReq.RD_SHARED.value
    w = b.rng.getrandbits(512)
    rid = b.client.request(CacheOp.WRITE, 77, w)          # S is not enough: RdOwnNoData
    (up,) = await b.d2h_req()
    assert up["opcode"] == DReq.RD_OWN_NO_DATA.value and up["addr"] == 77
    b.host.go(up["cqid"], GOState.E)
    assert (await b.answer(rid))["error"] == 0
    rid = b.client.request(CacheOp.READ_OWN, 77)         # M now: a hit with the new data
    assert (await b.answer(rid))["data"] == w
    await b.quiet()
    assert len(b.host.got["d2h_req"]) == 2
    b.finish()


@cocotb.test()
async def dirty_eviction_then_clean_eviction_dropped(dut):
    b = await setup(dut)
    slots = b.env.config.cache_lines
    a, c, d = (line_in_slot(5, k, slots) for k in range(3))
    w = b.rng.getrandbits(512)
    rid = b.client.request(CacheOp.WRITE, a, w)           # miss: RdOwnNoData, then M
    (r1,) = await b.d2h_req()
    b.host.go(r1["cqid"], GOState.E)
    await b.answer(rid)
    rid = b.client.request(CacheOp.READ_OWN, c)           # same slot: evict a first
    ev, rd = await b.d2h_req(2)
    assert ev["opcode"] == DReq.DIRTY_EVICT.value and ev["addr"] == a
    assert rd["opcode"] == DReq.RD_OWN.value and rd["addr"] == c
    b.host.rsp(ev["cqid"], HRsp.GO_WRITE_PULL, uqid=0x3A)
    await b.until(lambda: len(b.host.got["d2h_data"]) == 1, "the evicted line")
    (pulled,) = b.host.got["d2h_data"]
    assert pulled["uqid"] == 0x3A and pulled["data"] == w and pulled["bogus"] == 0
    v = b.rng.getrandbits(512)
    b.host.go(rd["cqid"], GOState.E)
    b.host.data(rd["cqid"], v)                            # GO first, then data: also legal
    assert (await b.answer(rid))["data"] == v
    # c is E (clean): evicting it sends CleanEvict; the host drops it: no data moves.
    rid = b.client.request(CacheOp.READ_SHARED, d)
    ev2, rd2 = await b.d2h_req(2)
    assert ev2["opcode"] == DReq.CLEAN_EVICT.value and ev2["addr"] == c
    b.host.rsp(ev2["cqid"], HRsp.GO_WRITE_PULL_DROP)
    b.host.data(rd2["cqid"], 5)
    b.host.go(rd2["cqid"], GOState.S)
    assert (await b.answer(rid))["data"] == 5
    await b.quiet()
    assert len(b.host.got["d2h_data"]) == 1
    assert await b.env.csr.read("STAT_EVICT_DIRTY") == 1
    assert await b.env.csr.read("STAT_EVICT_CLEAN") == 1
    b.finish()


@cocotb.test()
async def itomwr_and_wrinv_pushes(dut):
    b = await setup(dut)
    values = {100 + i: b.rng.getrandbits(512) for i in range(32)}
    rids = [b.client.request(CacheOp.PUSH, line, v) for line, v in values.items()]
    reqs = await b.d2h_req(32)
    assert all(r["opcode"] == DReq.ITOM_WR.value for r in reqs)
    assert len({r["cqid"] for r in reqs}) == 32                # all in flight at once
    for i, r in enumerate(reversed(reqs)):                    # pulls in any order
        b.host.rsp(r["cqid"], HRsp.GO_WRITE_PULL, uqid=0x100 + i)
    for rid in rids:
        assert (await b.answer(rid))["error"] == 0
    by_uqid = {d["uqid"]: d["data"] for d in b.host.got["d2h_data"]}
    for i, r in enumerate(reversed(reqs)):
        assert by_uqid[0x100 + i] == values[r["addr"]]
    # WrInv: WritePull, data, then GO-I ends it.
    rid = b.client.request(CacheOp.PUSH_INV, 300, 0xFEED)
    (wi,) = await b.d2h_req()
    assert wi["opcode"] == DReq.WR_INV.value
    b.host.rsp(wi["cqid"], HRsp.WRITE_PULL, uqid=0x7)
    await b.until(lambda: len(b.host.got["d2h_data"]) == 33, "the WrInv data")
    await b.quiet(16)
    assert rid not in b.answers, "WrInv must wait for its GO"
    b.host.go(wi["cqid"], GOState.I)
    assert (await b.answer(rid))["error"] == 0
    assert b.host.got["d2h_data"][-1]["data"] == 0xFEED
    b.finish()


@cocotb.test()
async def flush_dirty_and_clean(dut):
    b = await setup(dut)
    rid = b.client.request(CacheOp.WRITE, 40, 0xAB)
    (r,) = await b.d2h_req()
    b.host.go(r["cqid"], GOState.E)
    await b.answer(rid)
    rid = b.client.request(CacheOp.FLUSH, 40)             # M: written back by DirtyEvict
    (fl,) = await b.d2h_req()
    assert fl["opcode"] == DReq.DIRTY_EVICT.value
    b.host.rsp(fl["cqid"], HRsp.GO_WRITE_PULL, uqid=1)
    assert (await b.answer(rid))["error"] == 0
    assert b.host.got["d2h_data"][-1]["data"] == 0xAB
    await own(b, 41, 0xCD)
    rid = b.client.request(CacheOp.FLUSH, 41)             # E: CLFlush
    (fl2,) = await b.d2h_req()
    assert fl2["opcode"] == DReq.CL_FLUSH.value
    b.host.go(fl2["cqid"], GOState.I)
    assert (await b.answer(rid))["error"] == 0
    rid = b.client.request(CacheOp.READ_CURRENT, 41)      # gone from the cache: a miss
    (rc,) = await b.d2h_req()
    assert rc["opcode"] == DReq.RD_CURR.value
    b.host.data(rc["cqid"], 0xCD)
    assert (await b.answer(rid))["data"] == 0xCD
    b.finish()


SNOOP_TABLE = [  # (state set up, snoop, expected response, data forwarded, state after)
    ("M", Snp.SNP_INV, DRsp.RSP_I_FWD_M, True, "I"),
    ("M", Snp.SNP_DATA, DRsp.RSP_S_FWD_M, True, "S"),
    ("M", Snp.SNP_CUR, DRsp.RSP_V_FWD_V, True, "M"),
    ("E", Snp.SNP_INV, DRsp.RSP_I_HIT_SE, False, "I"),
    ("E", Snp.SNP_DATA, DRsp.RSP_S_HIT_SE, False, "S"),
    ("E", Snp.SNP_CUR, DRsp.RSP_V_HIT_V, False, "E"),
    ("S", Snp.SNP_INV, DRsp.RSP_I_HIT_SE, False, "I"),
    ("S", Snp.SNP_DATA, DRsp.RSP_S_HIT_SE, False, "S"),
    ("S", Snp.SNP_CUR, DRsp.RSP_V_HIT_V, False, "S"),
    ("I", Snp.SNP_INV, DRsp.RSP_I_HIT_I, False, "I"),
    ("I", Snp.SNP_DATA, DRsp.RSP_I_HIT_I, False, "I"),
    ("I", Snp.SNP_CUR, DRsp.RSP_I_HIT_I, False, "I"),
]


@cocotb.test()
async def snoop_every_state(dut):
    b = await setup(dut)
    for k, (state, snp, want, fwd, after) in enumerate(SNOOP_TABLE):
        line = 0x400 + k
        value = b.rng.getrandbits(512)
        if state == "M":
            rid = b.client.request(CacheOp.WRITE, line, value)
            (r,) = await b.d2h_req()
            b.host.go(r["cqid"], GOState.E)
            await b.answer(rid)
        elif state == "E":
            await own(b, line, value, CacheOp.READ_OWN, GOState.E)
        elif state == "S":                                # RdShared is granted S only
            await own(b, line, value, CacheOp.READ_SHARED, GOState.S)
        n_data = len(b.host.got["d2h_data"])
        b.host.snoop(snp, line, uqid=0x200 + k)
        await b.until(lambda k=k: len(b.host.got["d2h_rsp"]) == k + 1, "the snoop response")
        rsp = b.host.got["d2h_rsp"][-1]
        assert rsp["opcode"] == want.value and rsp["uqid"] == 0x200 + k, (state, snp, rsp)
        await b.quiet(8)
        if fwd:
            assert len(b.host.got["d2h_data"]) == n_data + 1
            d = b.host.got["d2h_data"][-1]
            assert d["uqid"] == 0x200 + k and d["data"] == value
        else:
            assert len(b.host.got["d2h_data"]) == n_data
        # The state after: a READ_OWN hits only in E/M, a READ_SHARED only in S/E/M.
        n_req = len(b.host.got["d2h_req"])
        rid = b.client.request(CacheOp.READ_SHARED, line)
        if after == "I":
            (r,) = await b.d2h_req()
            b.host.data(r["cqid"], value)
            b.host.go(r["cqid"], GOState.S)
        assert (await b.answer(rid))["data"] == value
        assert len(b.host.got["d2h_req"]) == n_req + (after == "I")
    assert await b.env.csr.read("STAT_SNOOP") == len(SNOOP_TABLE)
    b.finish()


@cocotb.test()
async def snoop_between_evict_and_pull_sets_bogus(dut):
    b = await setup(dut)
    slots = b.env.config.cache_lines
    a, c = line_in_slot(9, 0, slots), line_in_slot(9, 1, slots)
    rid = b.client.request(CacheOp.WRITE, a, 0x5EED)
    (r,) = await b.d2h_req()
    b.host.go(r["cqid"], GOState.E)
    await b.answer(rid)
    rid = b.client.request(CacheOp.READ_OWN, c)
    ev, rd = await b.d2h_req(2)
    assert ev["opcode"] == DReq.DIRTY_EVICT.value
    b.host.snoop(Snp.SNP_INV, a, uqid=0x55)                # before the host pulls
    await b.until(lambda: len(b.host.got["d2h_rsp"]) == 1, "the snoop response")
    assert b.host.got["d2h_rsp"][0]["opcode"] == DRsp.RSP_I_FWD_M.value
    await b.until(lambda: len(b.host.got["d2h_data"]) == 1, "the forwarded line")
    assert b.host.got["d2h_data"][0]["data"] == 0x5EED
    b.host.rsp(ev["cqid"], HRsp.GO_WRITE_PULL, uqid=0x56)
    await b.until(lambda: len(b.host.got["d2h_data"]) == 2, "the evict data")
    pulled = b.host.got["d2h_data"][1]
    assert pulled["uqid"] == 0x56 and pulled["bogus"] == 1
    b.host.data(rd["cqid"], 1)
    b.host.go(rd["cqid"], GOState.E)
    await b.answer(rid)
    assert await b.env.csr.read("STAT_BOGUS") == 1
    b.finish()


@cocotb.test()
async def go_err_is_used_once_and_counted(dut):
    b = await setup(dut)
    rid = b.client.request(CacheOp.READ_SHARED, 0x99)
    (r,) = await b.d2h_req()
    b.host.data(r["cqid"], ALL_ONES, poison=1, go_err=1)
    b.host.go(r["cqid"], GOState.ERR)
    ans = await b.answer(rid)
    assert ans["error"] == 1 and ans["data"] == ALL_ONES
    rid = b.client.request(CacheOp.READ_SHARED, 0x99)     # not cached: asks again
    (r2,) = await b.d2h_req()
    b.host.data(r2["cqid"], 7)
    b.host.go(r2["cqid"], GOState.I)                      # GO-I: use once, not cached
    assert (await b.answer(rid))["data"] == 7
    rid = b.client.request(CacheOp.READ_SHARED, 0x99)     # GO-I was not cached either
    (r3,) = await b.d2h_req()
    b.host.data(r3["cqid"], 8)
    b.host.go(r3["cqid"], GOState.S)
    assert (await b.answer(rid))["data"] == 8
    assert await b.env.csr.read("ERR_CACHE_GO") == 1
    assert (await b.env.csr.read("STATUS")) & 1
    b.finish()
