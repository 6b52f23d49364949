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

from hw.common.cxl_cache import (D2HReqOpcode as DReq, D2HRspOpcode as DRsp,
                                 H2DReqOpcode as Snp, H2DRspOpcode as HRsp, GOState)
from hw.cxl_controller.cache_port import CacheOp, PORT_MUX_LATENCY
from hw.cxl_controller.cxl_cache import HIT_LATENCY
from sim.bfm.cache_client import CacheClient
from sim.bfm.cxl_cache_host import H2D_CODECS, D2H_CODECS
from sim.bfm.link import LinkDriver
from sim.checkers.cxl_mem_monitor import ALL_ONES
from sim.checkers.cxl_cache_monitor import CxlCacheMonitor
from sim.env import DeviceEnv, CLOCK_PERIOD_NS



class ScriptedHost:
    """The host side, played by the test: records D2H messages, sends what it is told."""

    def __init__(self, dut, clk, rng, monitor=None):
        self.link = LinkDriver(dut, clk, tx=H2D_CODECS, rx=D2H_CODECS, rng=rng)
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

    def snoop(self, opcode: Snp | int, line, uqid):
        """A snoop; ``opcode`` may be a raw int (a reserved value)."""
        self.link.send("h2d_req", {"opcode": int(getattr(opcode, "value", opcode)), "addr": line,
                                   "uqid": uqid})


class Bench:
    def __init__(self, env: DeviceEnv):
        self.env = env
        self.clk = env.clk
        self.rng = env.rng
        monitor = CxlCacheMonitor()          # every test runs the protocol monitor
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

    def check_links(self):
        for drv in (self.host.link, self.client.link):
            if drv.error is not None:
                raise drv.error

    def finish(self, host_errors: int = 0):
        """Close the monitor: no device violation, and exactly ``host_errors`` host violations
        (the illegal host messages a test injected on purpose)."""
        self.check_links()
        self.monitor.finish(self.host.link.cycle)
        dev, host = self.monitor.device_violations, self.monitor.host_violations
        assert not dev and len(host) == host_errors, \
            f"{len(host)} host violations, {host_errors} injected:\n" + "\n".join(self.monitor.violations[:12])


async def setup(dut) -> Bench:
    env = await DeviceEnv.create(dut)
    env.cache_traffic_expected = True
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
    # Now E: reads and a write hit without any CXL.cache traffic, in HIT_LATENCY cycles
    # (the agent) plus PORT_MUX_LATENCY (the register slices between the test port and it).
    stamps = []
    b.client.on_response.append(lambda req, f, cycle: stamps.append(cycle - req.accepted))
    rid = b.client.request(CacheOp.READ_SHARED, 0x1234)
    assert (await b.answer(rid))["data"] == v
    assert stamps == [HIT_LATENCY + PORT_MUX_LATENCY], f"hit answered after {stamps} cycles"
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


@cocotb.test()
async def push_stream_bandwidth(dut):
    """ItoMWr pushes at full rate against a host that pulls at once: lines per cycle."""
    import json
    import os
    n = int(os.environ.get("TCXL_BENCH_LINES", "4096"))
    b = await setup(dut)
    stamps = []

    class AutoPull:            # the host grants every push at once (GO_WritePull)
        def on_rx(self, cycle, name, f):
            if name == "d2h_req" and f["opcode"] == DReq.ITOM_WR.value:
                b.host.rsp(f["cqid"], HRsp.GO_WRITE_PULL, uqid=f["cqid"])
            elif name == "d2h_data":
                stamps.append(cycle)

        def on_tx(self, *a):
            pass
    b.host.link.listeners.append(AutoPull())
    values = [b.rng.getrandbits(512) for _ in range(64)]
    sent = 0
    while sent < n or b.client.busy:
        while sent < n and b.client.free_id() and b.client.link.pending < 64:
            b.client.request(CacheOp.PUSH, 0x10000 + sent, values[sent % 64])
            sent += 1
        await Timer(16 * CLOCK_PERIOD_NS, unit="ns")
        if b.client.link.error or b.host.link.error:
            raise b.client.link.error or b.host.link.error
    cycles = stamps[-1] - stamps[0] + 1
    result = {"lines": n, "cycles": cycles, "cache_push_efficiency": round(n / cycles, 4),
              "seed": b.env.seed}
    dut._log.info(f"push bench: {result}")
    path = os.environ.get("TCXL_RESULT_JSON")
    if path:
        with open(path, "w") as fh:
            json.dump(result, fh)
    assert len(stamps) == n
    b.finish()


@cocotb.test()
async def coherence_stress(dut):
    """The device and a host CPU cache hammer a few shared lines (some sharing a cache slot,
    so evictions happen). Checks, all the time: the CXL.cache protocol monitor; single writer
    or multiple readers on every line at every message; every read (device or CPU) returns
    a value the line could hold at that time; the home agent saw no protocol error and kept
    its obligations (sim/tb/coherence_bench.py). Sizes: TCXL_TRANSACTIONS device operations."""
    import json
    import os
    import time
    from sim.tb.coherence_bench import HOST_BASE, CoherenceBench

    n_ops = int(os.environ.get("TCXL_TRANSACTIONS", "2000"))
    env = await DeviceEnv.create(dut)
    env.cache_traffic_expected = True
    rng, seed, slots = env.rng, env.seed, env.config.cache_lines
    # 12 lines: 3 cache slots x 4 lines each, so fills evict each other.
    lines = [HOST_BASE + s + k * slots for s in (3, 17, 40) for k in range(4)]
    bench = CoherenceBench(env, lines, ha_kw=dict(max_delay=4, grant_m=bool(seed & 1), snp_cur_rate=0.1),
                           cpu_kw=dict(store_rate=0.5, evict_rate=0.05), backpressure=0.1, cpu_period=6)
    if os.environ.get("TCXL_TRACE"):          # every message, for debugging a failing seed
        trace = open(os.environ["TCXL_TRACE"], "w")

        def short(f):
            return {k: (hex(v) if k != "data" else hex(v)[:14]) for k, v in f.items()}

        class Trace:
            def on_d2h(self, cycle, kind, f):
                trace.write(f"{cycle} D2H {kind} {short(f)}\n")

            def on_h2d(self, cycle, kind, f):
                trace.write(f"{cycle} H2D {kind} {short(f)}\n")
        bench.host.listeners.insert(0, Trace())
        bench.client.on_response.append(lambda req, f, c: trace.write(
            f"{c} PORT rsp op {CacheOp(req.op).name} line {req.line:#x} accepted {req.accepted} "
            f"err {f['error']} data {hex(f['data'])[:14]}\n"))

    ops = [CacheOp.READ_SHARED] * 25 + [CacheOp.READ_OWN] * 20 + [CacheOp.READ_CURRENT] * 10 + \
        [CacheOp.WRITE] * 25 + [CacheOp.PUSH] * 8 + [CacheOp.PUSH_INV] * 5 + [CacheOp.FLUSH] * 7
    bench.start()
    t0 = time.perf_counter()
    start_cycle = bench.cycle
    for _ in range(n_ops):
        await bench.request(rng.choice(ops), rng.choice(lines), rng.getrandbits(512))
        if rng.random() < 0.3:
            await Timer(rng.randrange(1, 8) * CLOCK_PERIOD_NS, unit="ns")
    unanswered = await bench.drain(160000)
    assert not unanswered, f"{unanswered} device requests never answered"
    cycles = bench.cycle - start_cycle
    wall = time.perf_counter() - t0
    await bench.final_reads()
    bench.finish()
    result = {"transactions": n_ops, **bench.counts(), "cycles": cycles,
              "sim_cycles_per_second": round(cycles / wall), "seed": seed}
    dut._log.info(f"coherence stress: {result}")
    path = os.environ.get("TCXL_RESULT_JSON")
    if path:
        with open(path, "w") as fh:
            json.dump(result, fh, indent=2, sort_keys=True)
    problems = bench.problems()
    assert not problems, f"seed {seed}:\n" + "\n".join(problems)
    assert bench.checker.reads_checked > n_ops // 4 and bench.cpu.counts["stores"] > 0


@cocotb.test()
async def bias_flips(dut):
    """HDM-D bias: a CSR flip to device bias takes every line of the page from the host
    (RdOwnNoData answered by MemRdFwd on CXL.mem); a host CXL.mem access to a device-bias
    page flips it back to host bias; a CSR flip to host bias is immediate."""
    from sim.bfm.cxl_cache_host import CxlCacheHost
    from sim.checkers.cxl_cache_monitor import CxlCacheMonitor
    from sim.model.home_agent import HomeAgent
    from hw.cxl_controller.csr_map import field
    env = await DeviceEnv.create(dut)
    env.cache_traffic_expected = True
    cfg = env.config
    ha = HomeAgent((1 << 24, 1 << 16), device_hdm_range=(0, cfg.capacity_lines))
    monitor = CxlCacheMonitor(device_hdm=(0, cfg.capacity_lines))
    host = CxlCacheHost(dut, env.clk, ha, rng=random.Random(env.seed), mem_host=env.host)
    host.listeners.append(monitor)
    env.host.listeners.append(monitor)
    host.start()
    csr = env.csr
    geometry = await csr.read("BIAS_GEOMETRY")
    page_lines = 1 << (geometry & 0xFF)
    assert page_lines == cfg.capacity_lines // cfg.bias_pages
    to_device = 1 << field("BIAS_FLIP", "TO_DEVICE").lsb
    done_shift = field("BIAS_STATUS", "DONE_SEQ").lsb
    query_bit = 1 << field("BIAS_STATUS", "QUERY_DEVICE").lsb

    async def flip(page, device, seq):
        await csr.write("BIAS_FLIP", page | (to_device if device else 0))
        await csr.write("BIAS_DOORBELL", seq)
        for _ in range(400):
            status = await csr.read("BIAS_STATUS")
            if (status >> done_shift) & 0xFF == seq and not status & 1:
                assert not status & 2, "flip reported an error"
                return
            await Timer(16 * CLOCK_PERIOD_NS, unit="ns")
        raise TimeoutError(f"bias flip of page {page} did not finish")

    async def is_device(page):
        await csr.write("BIAS_QUERY", page)
        return bool(await csr.read("BIAS_STATUS") & query_bit)

    assert not await is_device(5), "reset state: host bias"
    await flip(5, True, 1)
    assert await is_device(5) and not await is_device(4)
    page5 = set(range(5 * page_lines, 6 * page_lines))
    assert page5 <= monitor.device_bias_lines, "every line taken by MemRdFwd before the flip"
    assert await csr.read("STAT_BIAS_TO_DEVICE") == 1
    # Host reads of the page: answered normally, and the page goes back to host bias once.
    # Back to back to one page: the second read's bias lookup meets the first one's flip while
    # it is being written (the target's bypass register), so one flip is counted, not two.
    env.poke(5 * page_lines + 3, 0xB1A5)
    env.host.send_req(opcode=1, snp_type=0, meta_field=3, meta_value=0, tag=0x77,
                      addr=5 * page_lines + 3, ld_id=0)
    env.host.send_req(opcode=1, snp_type=0, meta_field=3, meta_value=0, tag=0x78,
                      addr=5 * page_lines + 4, ld_id=0)
    await env.wait_idle()
    assert not await is_device(5)
    assert await csr.read("STAT_BIAS_TO_HOST") == 1
    # CSR flips both ways on another page.
    await flip(9, True, 2)
    assert await is_device(9)
    await flip(9, False, 3)
    assert not await is_device(9)
    assert await csr.read("STAT_BIAS_TO_HOST") == 2
    assert await csr.read("ERR_UNEXPECTED_FWD") == 0
    await env.finish()
    env.assert_clean()
    monitor.finish(host.cycle)
    assert not monitor.violations, "\n".join(monitor.violations[:10])
    assert not ha.protocol_errors, ha.protocol_errors[:5]


@cocotb.test()
async def go_err_write_pull_still_sends_data(dut):
    """GO_ERR_WritePull: the device still sends its data (the host drops it) and the port
    answers with the error; the agent counts it."""
    b = await setup(dut)
    rid = b.client.request(CacheOp.PUSH, 0x4321, 0xDEAD)
    (r,) = await b.d2h_req()
    assert r["opcode"] == DReq.ITOM_WR.value
    b.host.rsp(r["cqid"], HRsp.GO_ERR_WRITE_PULL, uqid=0x9)
    ans = await b.answer(rid)
    assert ans["error"] == 1
    (d,) = b.host.got["d2h_data"]
    assert d["uqid"] == 0x9 and d["data"] == 0xDEAD
    assert await b.env.csr.read("ERR_CACHE_GO") == 1
    b.finish()
