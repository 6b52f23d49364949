"""MlpLogEngine (hw/checkpoint/mlp_log.py) alone in Amaranth's simulator.

A Python memory stand-in (tests/pysim_memory.py: random latencies and stalls, responses
out of order, reads see accepted writes) and a CXL.cache stand-in for the GPU memory (random
latencies, out of order, optional error answers) surround the engine. Expected record lines
are built independently: ``StructCodec(LogRecord)`` and ``zlib.crc32`` on the line's bytes.
Random tests print their seed; replay with TCXL_SEED=<seed>."""
import os
import random
import zlib

import pytest
from amaranth.sim import Simulator

from hw.checkpoint.log_format import LOG_MAGIC, LogRecord, LogRegion, LogState
from hw.checkpoint.mlp_log import MlpLogEngine
from hw.cxl_controller.cache_port import CacheOp
from hw.ndp.command import AddressFault, CommandDescriptor, NdpError, NdpOpcode
from pysim_memory import MemModel
from sim.model.codec import StructCodec

CMD = StructCodec(CommandDescriptor)
REC = StructCodec(LogRecord)
REG = StructCodec(LogRegion)
CAP = 1 << 12
ID_BASE = 0x60
MAX_OUT = 8
HOST = 0x1_2345_6000                       # host line address of the image
ONES = (1 << 512) - 1


def _seed() -> int:
    seed = int(os.environ.get("TCXL_SEED", "0")) or random.randrange(1 << 30)
    print(f"seed {seed} (replay with TCXL_SEED={seed})")
    return seed


def record(state: LogState, slot: int, batch: int, count: int = 0, lines: int = 0) -> int:
    word = REC.pack(magic=LOG_MAGIC, state=state, slot=slot, batch=batch, count=count, lines=lines, crc=0)
    return word | REC.pack(crc=zlib.crc32(word.to_bytes(64, "little")))


class CacheModel:
    """The GPU memory over CXL.cache: RdCurr answers with random latency, out of order."""

    def __init__(self, port, host, prng, error_addrs=()):
        self.port, self.host, self.prng = port, host, prng
        self.pending = []                 # [due, id, addr]
        self.error_addrs = set(error_addrs)
        self.reads = []                   # (cycle, addr)

    def drive(self, ctx, cycle):
        p = self.port
        ctx.set(p.req.ready, int(self.prng.random() < 0.8))
        due = [e for e in self.pending if e[0] <= cycle]
        if due and self.prng.random() < 0.9:
            e = self.prng.choice(due)
            err = e[2] in self.error_addrs
            ctx.set(p.rsp.valid, 1)
            ctx.set(p.rsp.payload.id, e[1])
            ctx.set(p.rsp.payload.error, int(err))
            ctx.set(p.rsp.payload.data, ONES if err else self.host[e[2]])
            if ctx.get(p.rsp.ready):
                self.pending.remove(e)
        else:
            ctx.set(p.rsp.valid, 0)

    def sample(self, ctx, cycle):
        p = self.port
        if ctx.get(p.req.valid) and ctx.get(p.req.ready):
            rid = ctx.get(p.req.payload.id)
            assert ID_BASE <= rid < ID_BASE + MAX_OUT, hex(rid)
            assert 0x40 <= rid < 0x80
            assert rid not in [e[1] for e in self.pending], f"id {rid:#x} reused while in flight"
            assert ctx.get(p.req.payload.op) == CacheOp.READ_CURRENT
            addr = ctx.get(p.req.payload.addr)
            assert addr in self.host, hex(addr)
            self.pending.append([cycle + self.prng.randint(2, 30), rid, addr])
            self.reads.append((cycle, addr))


def run(mem, host, region, cmds, seed, cache_err=(), wr_err=(), mem_lat=(2, 25)):
    """Run ``cmds`` (dicts of CommandDescriptor fields) one after the other on one engine.
    Returns one result dict per command (error, info, stats, events of that command)."""
    prng = random.Random(seed)
    dut = MlpLogEngine(addr_bits=12, capacity_lines=CAP, id_base=ID_BASE, max_outstanding=MAX_OUT)
    mm = MemModel(dut.mem, mem, prng, capacity=CAP, ready_p=0.75, rsp_p=0.9, wr_error=wr_err, lat=mem_lat)
    cm = CacheModel(dut.cache, host, prng, cache_err)
    results = []

    async def bench(ctx):
        ctx.set(dut.region.as_value(), REG.pack(**region))
        cycle = 0
        for c in cmds:
            ctx.set(dut.ctl.cmd.as_value(), CMD.pack(opcode=NdpOpcode.MLP_LOG, **c))
            ctx.set(dut.ctl.start, 1)
            ev0, rd0 = len(mm.events), len(cm.reads)
            await ctx.tick()
            cycle += 1
            ctx.set(dut.ctl.start, 0)
            for _ in range(5000):
                assert ctx.get(dut.ctl.busy)
                assert ctx.get(dut.ctl.table_index) == 0
                mm.drive(ctx, cycle)
                cm.drive(ctx, cycle)
                mm.sample(ctx, cycle)
                cm.sample(ctx, cycle)
                if ctx.get(dut.ctl.done):
                    st = {f: ctx.get(getattr(dut.ctl.stats, f)) for f in ("lines_read", "lines_written",
                                                                          "lines_pushed", "rows_written")}
                    results.append({"error": NdpError(ctx.get(dut.ctl.error)), "info": ctx.get(dut.ctl.error_info),
                                    "stats": st, "events": mm.events[ev0:], "reads": cm.reads[rd0:]})
                    # everything the command started has finished
                    assert not cm.pending, "cache reads still in flight at done"
                    assert not mm.outstanding_writes(), "writes not acknowledged at done"
                    break
                await ctx.tick()
                cycle += 1
            else:
                raise AssertionError("no done")
            await ctx.tick()
            cycle += 1
            assert not ctx.get(dut.ctl.busy)

    sim = Simulator(dut)
    sim.add_clock(1e-9)
    sim.add_testbench(bench)
    sim.run()
    return results


def setup(rng, lines=40, base=200):
    host = {HOST + i: rng.getrandbits(512) for i in range(lines)}
    region = dict(log_base=16, slot_lines=64, mlp_base=base, mlp_lines=lines, mlp_host_addr=HOST)
    # old contents: slot 0 and 1 hold stale images and records
    mem = {base + i: rng.getrandbits(512) for i in range(2 * (1 + lines))}
    return host, region, mem


def chunk(slot, batch, offset, count):
    return dict(flags=slot << 3, batch=batch, mlp_offset=offset, mlp_count=count, tag=0x55)


def slot_base(region, s):
    return region["mlp_base"] + s * (1 + region["mlp_lines"])


def check_image(mem, host, region, s, upto=None):
    upto = region["mlp_lines"] if upto is None else upto
    for i in range(upto):
        assert mem[slot_base(region, s) + 1 + i] == host[HOST + i], f"image line {i}"


def check_start_order(res, region, s):
    """The FREE record is the first write and is acknowledged before any image read."""
    ev = res["events"]
    sb = slot_base(region, s)
    assert ev[0][1:] == ("w", sb)
    ack = next(c for c, k, a in ev if k == "a" and a == sb)
    assert all(c > ack for c, _ in res["reads"])
    assert all(c > ack for c, k, a in ev if k == "w" and a != sb)


def check_end_order(res, region, s):
    """MLP_LOGGED after every image ack; the release after the MLP_LOGGED ack."""
    ev = res["events"]
    sb, ob = slot_base(region, s), slot_base(region, 1 - s)
    rec_w = max(i for i, e in enumerate(ev) if e[1:] == ("w", sb))
    img_acks = [i for i, e in enumerate(ev) if e[1] == "a" and sb < e[2] <= sb + region["mlp_lines"]]
    assert all(i < rec_w for i in img_acks)
    rec_a = next(i for i, e in enumerate(ev) if i > rec_w and e[1:] == ("a", sb))
    rel_w = next(i for i, e in enumerate(ev) if e[1:] == ("w", ob))
    assert rel_w > rec_a
    assert ev[-1][1:] == ("a", ob)


def test_full_copy_one_chunk():
    seed = _seed()
    rng = random.Random(seed)
    host, region, mem = setup(rng)
    L = region["mlp_lines"]
    (res,) = run(mem, host, region, [chunk(0, 7, 0, L)], seed)
    assert res["error"] == NdpError.OK, res
    check_image(mem, host, region, 0)
    assert mem[slot_base(region, 0)] == record(LogState.MLP_LOGGED, 0, 7, count=64 * L, lines=L)
    assert mem[slot_base(region, 1)] == record(LogState.FREE, 1, 7)
    assert res["stats"]["lines_read"] == L
    assert res["stats"]["lines_written"] == L + 3
    assert sorted(a for _, a in res["reads"]) == sorted(host)
    check_start_order(res, region, 0)
    check_end_order(res, region, 0)


def test_three_chunks_slot1():
    seed = _seed()
    rng = random.Random(seed)
    host, region, mem = setup(rng, lines=37)
    L = region["mlp_lines"]
    cmds = [chunk(1, 12, 0, 13), chunk(1, 13, 13, 11), chunk(1, 14, 24, 13)]
    r0, r1, r2 = run(mem, host, region, cmds, seed)
    assert [r["error"] for r in (r0, r1, r2)] == [NdpError.OK] * 3
    check_start_order(r0, region, 1)
    # the first chunks leave the FREE record: the slot is not a complete image yet
    assert r0["stats"]["lines_written"] == 14 and r1["stats"]["lines_written"] == 11
    assert all(a != slot_base(region, 1) and a != slot_base(region, 0) for _, k, a in r1["events"] if k == "w")
    assert [r["stats"]["lines_read"] for r in (r0, r1, r2)] == [13, 11, 13]
    check_end_order(r2, region, 1)
    check_image(mem, host, region, 1)
    # the record carries the batch of the chunk that started the copy
    assert mem[slot_base(region, 1)] == record(LogState.MLP_LOGGED, 1, 12, count=64 * L, lines=L)
    assert mem[slot_base(region, 0)] == record(LogState.FREE, 0, 12)


def test_intermediate_free_record():
    seed = _seed()
    rng = random.Random(seed)
    host, region, mem = setup(rng, lines=20)
    (r0,) = run(mem, host, region, [chunk(0, 3, 0, 5)], seed)
    assert r0["error"] == NdpError.OK
    assert mem[slot_base(region, 0)] == record(LogState.FREE, 0, 3)
    check_image(mem, host, region, 0, upto=5)


def test_skipped_and_wrong_chunks():
    seed = _seed()
    rng = random.Random(seed)
    host, region, mem = setup(rng, lines=30)
    L = region["mlp_lines"]
    old0, old1 = record(LogState.MLP_LOGGED, 0, 1, 64 * L, L), record(LogState.MLP_LOGGED, 1, 2, 64 * L, L)
    mem[slot_base(region, 0)], mem[slot_base(region, 1)] = old0, old1
    cmds = [chunk(0, 5, 0, 10),
            chunk(0, 5, 20, 10),      # skips 10..19: rejected
            chunk(1, 5, 10, 10),      # wrong slot: rejected
            chunk(0, 5, 10, 10),      # the right continuation still works
            chunk(0, 5, 10, 10),      # repeated: rejected
            chunk(0, 5, 20, 10)]      # the last chunk
    res = run(mem, host, region, cmds, seed)
    assert [r["error"] for r in res] == [NdpError.OK, NdpError.MLP_SIZE, NdpError.MLP_SIZE, NdpError.OK,
                                         NdpError.MLP_SIZE, NdpError.OK]
    for r in (res[1], res[2], res[4]):
        assert not r["events"] and not r["reads"], "a rejected chunk touched something"
    check_image(mem, host, region, 0)
    assert mem[slot_base(region, 0)] == record(LogState.MLP_LOGGED, 0, 5, 64 * L, L)
    assert mem[slot_base(region, 1)] == record(LogState.FREE, 1, 5)


def test_chunk_after_reset_rejected():
    """Registers are lost at reset: a fresh engine accepts no continuation, so a copy whose
    first chunks were done before a power failure never gets an MLP_LOGGED record."""
    seed = _seed()
    rng = random.Random(seed)
    host, region, mem = setup(rng, lines=16)
    L = region["mlp_lines"]
    old1 = record(LogState.MLP_LOGGED, 1, 2, 64 * L, L)
    mem[slot_base(region, 1)] = old1
    (r0,) = run(mem, host, region, [chunk(0, 3, 0, 8)], seed)
    (r1,) = run(mem, host, region, [chunk(0, 3, 8, 8)], seed + 1)      # a new engine: reset
    assert (r0["error"], r1["error"]) == (NdpError.OK, NdpError.MLP_SIZE)
    assert mem[slot_base(region, 0)] == record(LogState.FREE, 0, 3)
    assert mem[slot_base(region, 1)] == old1


def test_cache_error():
    seed = _seed()
    rng = random.Random(seed)
    host, region, mem = setup(rng, lines=24)
    L = region["mlp_lines"]
    old1 = record(LogState.MLP_LOGGED, 1, 2, 64 * L, L)
    mem[slot_base(region, 1)] = old1
    cmds = [chunk(0, 4, 0, 12), chunk(0, 4, 12, 12)]
    res = run(mem, host, region, cmds, seed, cache_err={HOST + 15})
    assert [r["error"] for r in res] == [NdpError.OK, NdpError.CACHE]
    assert mem[slot_base(region, 0)] == record(LogState.FREE, 0, 4)
    assert mem[slot_base(region, 1)] == old1
    assert all(a != slot_base(region, 0) + 1 + 15 for _, k, a in res[1]["events"] if k == "w")


def test_cache_error_abandons_copy_then_restart():
    seed = _seed()
    rng = random.Random(seed)
    host, region, mem = setup(rng, lines=12)
    L = region["mlp_lines"]
    cmds = [chunk(1, 4, 0, 6), chunk(1, 4, 6, 6), chunk(1, 4, 6, 6), chunk(1, 9, 0, L)]
    # the image line 8 answers with an error in the first run only
    res = run(mem, host, region, cmds[:3], seed, cache_err={HOST + 8})
    assert [r["error"] for r in res] == [NdpError.OK, NdpError.CACHE, NdpError.MLP_SIZE]
    (r,) = run(mem, host, region, cmds[3:], seed)
    assert r["error"] == NdpError.OK
    check_image(mem, host, region, 1)
    assert mem[slot_base(region, 1)] == record(LogState.MLP_LOGGED, 1, 9, 64 * L, L)


def test_media_write_error():
    seed = _seed()
    rng = random.Random(seed)
    host, region, mem = setup(rng, lines=10)
    L = region["mlp_lines"]
    (r,) = run(mem, host, region, [chunk(0, 4, 0, L)], seed, wr_err={slot_base(region, 0) + 3})
    assert r["error"] == NdpError.MEDIA
    assert mem[slot_base(region, 0)] == record(LogState.FREE, 0, 4)


@pytest.mark.parametrize("case,code,info", [
    ("lines0", NdpError.ADDRESS, AddressFault.MLP_REGION),
    ("base", NdpError.ADDRESS, AddressFault.MLP_REGION),
    ("count0", NdpError.MLP_SIZE, 0),
    ("past_end", NdpError.MLP_SIZE, 0),
    ("first_not0", NdpError.MLP_SIZE, 0),
])
def test_bounds(case, code, info):
    rng = random.Random(1)
    host, region, mem = setup(rng, lines=8)
    c = chunk(0, 1, 0, 8)
    if case == "lines0":
        region["mlp_lines"] = 0
    elif case == "base":
        region["mlp_base"] = CAP - 2 * 9 + 1
    elif case == "count0":
        c["mlp_count"] = 0
    elif case == "past_end":
        c.update(mlp_offset=0, mlp_count=9)
    elif case == "first_not0":
        c.update(mlp_offset=1, mlp_count=7)
    before = dict(mem)
    (r,) = run(mem, host, region, [c], 1)
    assert (r["error"], r["info"]) == (code, info)
    assert mem == before and not r["reads"] and not r["events"]


def test_region_exactly_fits():
    rng = random.Random(2)
    host, region, mem = setup(rng, lines=8, base=CAP - 2 * 9)
    (r,) = run(mem, host, region, [chunk(1, 1, 0, 8)], 2)
    assert r["error"] == NdpError.OK
    check_image(mem, host, region, 1)


def test_slow_write_acks():
    """Acks far slower than the reads: many more writes than ids in flight."""
    seed = _seed()
    rng = random.Random(seed)
    host, region, mem = setup(rng, lines=48)
    L = region["mlp_lines"]
    (r,) = run(mem, host, region, [chunk(1, 2, 0, L)], seed, mem_lat=(150, 200))
    assert r["error"] == NdpError.OK
    check_image(mem, host, region, 1)
    assert mem[slot_base(region, 1)] == record(LogState.MLP_LOGGED, 1, 2, count=64 * L, lines=L)
    check_end_order(r, region, 1)
