"""cocotb tests of the CXL.mem path: host -> CXL.mem target -> interleaver -> PMEM media.

Every test runs the protocol monitor and the scoreboard (sim/env.py) and fails on any
violation or mismatch; directed tests also assert the exact expected answers themselves.
Random tests log their seed; replay with TCXL_SEED=<seed>. Sizes come from TCXL_* variables
so the command line (tools/) can run longer versions: TCXL_TRANSACTIONS, TCXL_POWER_ROUNDS,
TCXL_BENCH_LINES, and TCXL_RESULT_JSON names a file for the figures.
"""
from __future__ import annotations

import os
import time

import cocotb
from cocotb.triggers import ClockCycles

from hw.common.cxl_mem import (M2SReqOpcode as Q, M2SRwDOpcode as W, SnpType, MetaValue,
                               NDROpcode as N, DRSOpcode as D)
from sim.checkers.cxl_mem_monitor import ALL_ONES
from sim.env import DeviceEnv
from sim.model.memory import FULL_STRB, merge_line, word_outcomes
from sim.model.pmem_params import media_verilog_parameters
from sim.tb.cxl_mem_stim import MS0, NOOP, pattern, pick_line, program_split_window, rd, wr
from sim.tb.ndp_run_tb import write_result


class Collector:
    """Records every S2M message per tag, for directed checks."""

    def __init__(self):
        self.ndr: dict[int, list[dict]] = {}
        self.drs: dict[int, list[dict]] = {}

    def on_m2s(self, *a):
        pass

    def on_s2m(self, cycle, kind, f):
        getattr(self, kind).setdefault(f["tag"], []).append(f)


async def setup(dut, **kw):
    env = await DeviceEnv.create(dut, **kw)
    col = Collector()
    env.host.listeners.append(col)
    return env, col


async def finish_clean(env):
    summary = await env.finish()
    env.assert_clean()
    return summary


@cocotb.test()
async def identity_registers(dut):
    env, _ = await setup(dut)
    cfg = env.config
    assert await env.csr.read("DEVICE_ID") == 0x5443584C
    assert await env.csr.read("CHANNELS") & 0xFF == cfg.channels
    assert await env.csr.read64("CAPACITY_LO", "CAPACITY_HI") == cfg.capacity_bytes
    assert await env.csr.read("CLOCK_MHZ") == cfg.clock_mhz
    out = await env.csr.read("OUTSTANDING")
    assert out & 0xFFFF == cfg.max_outstanding_reads >= 128
    await env.csr.write("SCRATCH", 0xA5A5_1234)
    assert await env.csr.read("SCRATCH") == 0xA5A5_1234
    await finish_clean(env)


@cocotb.test()
async def idle_read_latency(dut):
    """An idle MemRd takes the media latency plus the documented pipeline cycles."""
    from hw.cxl_controller.cxl_mem import PIPELINE_READ_CYCLES
    env, _ = await setup(dut)
    times = {}

    class Stamp:
        def on_m2s(self, seq, cycle, kind, f):
            times["req"] = cycle

        def on_s2m(self, cycle, kind, f):
            times[kind] = cycle
    env.host.listeners.append(Stamp())
    rd(env, 1, 12345)
    await env.wait_idle()
    media = media_verilog_parameters(env.config.clock_mhz, depth_lines=1, id_width=8,
                                     addr_width=32)["RD_LAT"]
    latency = times["drs"] - times["req"]
    dut._log.info(f"idle MemRd latency {latency} cycles (media {media})")
    assert latency == media + PIPELINE_READ_CYCLES, latency
    assert times["ndr"] == times["drs"]
    await finish_clean(env)


@cocotb.test()
async def read_write_and_meta_responses(dut):
    env, col = await setup(dut)
    rng = env.rng
    lines = [3, 4, 5, 6, 1000, env.config.capacity_lines - 1]
    data = {ln: pattern(rng) for ln in lines}
    for i, ln in enumerate(lines):
        wr(env, 0x100 + i, ln, data[ln])
    await env.wait_idle()
    cases = [  # (opcode, meta_field, meta_value, snp, expected NDR)
        (Q.MEM_RD, MS0, MetaValue.ANY, SnpType.SNP_INV, N.CMP_E),
        (Q.MEM_RD, MS0, MetaValue.SHARED, SnpType.SNP_DATA, N.CMP_S),
        (Q.MEM_RD, NOOP, MetaValue.INVALID, SnpType.SNP_CUR, N.CMP),
        (Q.MEM_RD, NOOP, MetaValue.INVALID, SnpType.SNP_INV, N.CMP),
        (Q.MEM_RD_DATA, NOOP, MetaValue.INVALID, SnpType.SNP_DATA, N.CMP_E),
        (Q.MEM_RD, MS0, MetaValue.INVALID, SnpType.SNP_INV, N.CMP),
    ]
    for i, (ln, (op, mf, mv, snp, _)) in enumerate(zip(lines, cases, strict=True)):
        rd(env, 0x200 + i, ln, op, mf, mv, snp, ld_id=i % 16)
    await env.wait_idle()
    for i, (ln, case) in enumerate(zip(lines, cases, strict=True)):
        tag = 0x200 + i
        assert [f["opcode"] for f in col.ndr[tag]] == [case[4].value], (case, col.ndr[tag])
        (drs,) = col.drs[tag]
        assert drs["opcode"] == D.MEM_DATA.value and drs["data"] == data[ln]
        assert drs["ld_id"] == i % 16 and col.ndr[tag][0]["ld_id"] == i % 16
        assert drs["poison"] == 0
    for i in range(len(lines)):
        assert [f["opcode"] for f in col.ndr[0x100 + i]] == [N.CMP.value]
        assert 0x100 + i not in col.drs
        assert env.peek(lines[i]) == (data[lines[i]], False)        # in the media
    assert await env.csr.read("STAT_RD_LINES") == len(lines)
    assert await env.csr.read("STAT_WR_LINES") == len(lines)
    await finish_clean(env)


@cocotb.test()
async def partial_write_byte_enables(dut):
    env, col = await setup(dut)
    rng = env.rng
    expected = {}
    for k in range(16):
        ln = 40 + k
        base = pattern(rng)
        env.poke(ln, base)
        strb = [FULL_STRB, 0, 1, 1 << 63, 0x00FF_00FF_00FF_00FF][k] if k < 5 \
            else rng.getrandbits(64)
        new = pattern(rng)
        wr(env, k, ln, new, strb=strb if k else None)
        expected[ln] = merge_line(base, new, strb if k else FULL_STRB)
    await env.wait_idle()
    for k in range(16):
        rd(env, 0x40 + k, 40 + k)
    await env.wait_idle()
    for k in range(16):
        ln = 40 + k
        (drs,) = col.drs[0x40 + k]
        assert drs["data"] == expected[ln], f"line {ln}"
        assert env.peek(ln)[0] == expected[ln]
    await finish_clean(env)


@cocotb.test()
async def read_after_write_same_line(dut):
    env, col = await setup(dut)
    rng = env.rng
    values = []
    for k in range(64):        # write, then read at once, the same line, again and again
        v = pattern(rng)
        values.append(v)
        wr(env, 0x1000 + k, 77, v)
        await ClockCycles(env.clk, 1)
        rd(env, 0x2000 + k, 77)
        await ClockCycles(env.clk, rng.randrange(3))
    await env.wait_idle()
    for k in range(64):
        (drs,) = col.drs[0x2000 + k]
        assert drs["data"] == values[k], f"read {k} returned stale data"
    await finish_clean(env)


@cocotb.test()
async def invalidate_and_speculative_read(dut):
    env, col = await setup(dut)
    rd(env, 1, 10, Q.MEM_INV, MS0, MetaValue.ANY, SnpType.SNP_INV)
    rd(env, 2, 11, Q.MEM_INV, MS0, MetaValue.INVALID, SnpType.SNP_INV)
    rd(env, 3, 12, Q.MEM_INV_NT, MS0, MetaValue.ANY, SnpType.SNP_INV)
    rd(env, 4, 13, Q.MEM_SPEC_RD, NOOP, MetaValue.INVALID, SnpType.NO_OP)
    await env.wait_idle()
    await ClockCycles(env.clk, 400)           # longer than a media read: nothing may come
    assert [f["opcode"] for f in col.ndr[1]] == [N.CMP_E.value]
    assert [f["opcode"] for f in col.ndr[2]] == [N.CMP.value]
    assert [f["opcode"] for f in col.ndr[3]] == [N.CMP_E.value]
    assert 4 not in col.ndr and 4 not in col.drs and not col.drs
    assert await env.csr.read("STAT_SPEC_RD_DROPPED") == 1
    assert await env.csr.read("STAT_INV") == 3
    await finish_clean(env)


@cocotb.test()
async def outside_window_nxm_and_counters(dut):
    base, size = 1 << 20, 1 << 20
    env, col = await setup(dut, window=(base, size))
    first, last = base // 64, (base + size) // 64 - 1
    env.poke(0, 0x1234)                       # device line 0 = host line `first`
    await env.csr.write("IRQ_ENABLE", 1)
    rd(env, 1, first - 1)                     # below
    rd(env, 2, last + 1)                      # above
    rd(env, 3, first)                         # inside: device line 0
    wr(env, 4, last + 5, pattern(env.rng))    # outside write: Cmp, no effect
    rd(env, 5, first - 1, Q.MEM_INV, MS0, MetaValue.ANY, SnpType.SNP_INV)
    await env.wait_idle()
    for tag in (1, 2):
        assert tag not in col.ndr, "NXM reads get no NDR"
        (drs,) = col.drs[tag]
        assert drs["opcode"] == D.MEM_DATA_NXM.value and drs["data"] == ALL_ONES
    assert col.drs[3][0]["data"] == 0x1234
    assert [f["opcode"] for f in col.ndr[4]] == [N.CMP.value]
    assert [f["opcode"] for f in col.ndr[5]] == [N.CMP.value]
    assert await env.csr.read("ERR_OUT_OF_WINDOW_RD") == 3
    assert await env.csr.read("ERR_OUT_OF_WINDOW_WR") == 1
    assert await env.csr.read("STATUS") & 1 and int(dut.irq.value) == 1
    await env.csr.write("STATUS", 1)
    assert await env.csr.read("STATUS") & 1 == 0 and int(dut.irq.value) == 0
    await env.csr.write("ERR_OUT_OF_WINDOW_RD", 0)
    assert await env.csr.read("ERR_OUT_OF_WINDOW_RD") == 0
    # A window larger than the device: lines past the capacity do not decode.
    cap = env.config.capacity_lines
    await env.program_window(0, 2 * env.config.capacity_bytes)
    rd(env, 7, cap - 1)
    rd(env, 8, cap)
    await env.wait_idle()
    assert col.drs[7][0]["opcode"] == D.MEM_DATA.value
    assert col.drs[8][0]["opcode"] == D.MEM_DATA_NXM.value and 8 not in col.ndr
    # Disabled decoder: everything is outside.
    await env.program_window(base, size, enable=False)
    rd(env, 6, first)
    await env.wait_idle()
    assert col.drs[6][0]["opcode"] == D.MEM_DATA_NXM.value
    await finish_clean(env)


@cocotb.test()
async def outside_window_same_tag_and_counter_scope(dut):
    """Issue 18.2 and 18.6: two outstanding MemRd above the window and two below it, each pair
    sharing a Tag (and one pair inside), all answered with the monitor and scoreboard
    attached and silent; a poisoned write and a MemInv outside the window count in the
    out-of-window counters only (ERR_POISON_WR and STAT_INV count inside the window)."""
    base, size = 1 << 20, 1 << 20
    env, col = await setup(dut, window=(base, size))
    first, last = base // 64, (base + size) // 64 - 1
    rd(env, 9, last + 1)
    rd(env, 9, last + 77)                     # above, same Tag
    rd(env, 10, first - 1)
    rd(env, 10, 3)                            # below, same Tag
    env.poke(4, 0x44)
    env.poke(5, 0x55)
    rd(env, 11, first + 4)
    rd(env, 11, first + 5)                    # inside, same Tag
    await env.wait_idle()
    assert [f["opcode"] for t in (9, 10) for f in col.drs[t]] == [D.MEM_DATA_NXM.value] * 4
    assert all(f["data"] == ALL_ONES for t in (9, 10) for f in col.drs[t])
    assert sorted(f["data"] for f in col.drs[11]) == [0x44, 0x55]
    wr(env, 12, last + 3, pattern(env.rng), poison=1)                       # outside, poisoned
    rd(env, 13, first - 2, Q.MEM_INV, MS0, MetaValue.ANY, SnpType.SNP_INV)  # outside MemInv
    await env.wait_idle()
    assert await env.csr.read("ERR_POISON_WR") == 0
    assert await env.csr.read("STAT_INV") == 0
    assert await env.csr.read("ERR_OUT_OF_WINDOW_WR") == 1
    assert await env.csr.read("ERR_OUT_OF_WINDOW_RD") == 5
    wr(env, 14, first + 6, pattern(env.rng), poison=1)                      # inside: counted
    rd(env, 15, first + 6, Q.MEM_INV, MS0, MetaValue.ANY, SnpType.SNP_INV)
    await env.wait_idle()
    assert await env.csr.read("ERR_POISON_WR") == 1
    assert await env.csr.read("STAT_INV") == 1
    await finish_clean(env)


@cocotb.test()
async def reserved_and_unsupported_opcodes(dut):
    env, col = await setup(dut)
    unsupported_req = [op for op in Q if op not in (
        Q.MEM_RD, Q.MEM_RD_DATA, Q.MEM_INV, Q.MEM_INV_NT, Q.MEM_SPEC_RD, Q.MEM_RD_FWD,
        Q.MEM_WR_FWD)]
    for i, op in enumerate(unsupported_req):
        rd(env, 0x10 + i, 5, op, NOOP, MetaValue.INVALID, SnpType.NO_OP)
    rwd_codes = [c for c in range(16) if c not in (W.MEM_WR.value, W.MEM_WR_PTL.value)]
    env.poke(6, 0xCAFE)
    for i, code in enumerate(rwd_codes):
        env.host.send_rwd(opcode=code, snp_type=0, meta_field=NOOP, meta_value=0,
                          tag=0x40 + i, addr=6, data=ALL_ONES, byte_enable=FULL_STRB)
    rd(env, 0x70, 7, Q.MEM_RD_FWD, NOOP, MetaValue.INVALID, SnpType.NO_OP)
    rd(env, 0x71, 7, Q.MEM_WR_FWD, NOOP, MetaValue.INVALID, SnpType.NO_OP)
    await env.wait_idle()
    await ClockCycles(env.clk, 400)
    for i, _ in enumerate(unsupported_req):
        assert [f["opcode"] for f in col.ndr[0x10 + i]] == [N.CMP.value]
    for i, code in enumerate(rwd_codes):
        want = N.BI_CONFLICT_ACK if code == W.BI_CONFLICT.value else N.CMP
        assert [f["opcode"] for f in col.ndr[0x40 + i]] == [want.value]
    assert 0x70 not in col.ndr and 0x71 not in col.ndr
    assert env.peek(6)[0] == 0xCAFE, "an unsupported RwD must not write"
    assert await env.csr.read("ERR_UNSUPPORTED_REQ") == len(unsupported_req)
    assert await env.csr.read("ERR_UNSUPPORTED_RWD") == len(rwd_codes)
    assert await env.csr.read("ERR_UNEXPECTED_FWD") == 2
    await finish_clean(env)


@cocotb.test()
async def poison_propagates(dut):
    env, col = await setup(dut)
    wr(env, 1, 20, 0xBAD, poison=1)
    await env.wait_idle()
    rd(env, 2, 20)
    await env.wait_idle()
    wr(env, 3, 20, 0x600D, strb=0xFF)          # partial clean write: still poisoned
    await env.wait_idle()
    rd(env, 4, 20)
    await env.wait_idle()
    wr(env, 5, 20, 0x600D)                     # full clean write: poison cleared
    await env.wait_idle()
    rd(env, 6, 20)
    await env.wait_idle()
    assert col.drs[2][0]["poison"] == 1 and col.drs[2][0]["data"] == 0xBAD
    assert col.drs[4][0]["poison"] == 1
    assert col.drs[6][0]["poison"] == 0 and col.drs[6][0]["data"] == 0x600D
    assert env.peek(20) == (0x600D, False)
    assert await env.csr.read("ERR_POISON_WR") == 1
    assert await env.csr.read("ERR_POISON_RD") == 2
    assert (await env.csr.read("STATUS")) & 2
    await finish_clean(env)


def _random_traffic(env, n, *, hot_lines=64):
    """Queue ``n`` random M2S messages: reads, writes, partial writes, invalidates,
    speculative reads, a few reserved opcodes; 10% outside the window."""
    rng = env.rng
    window = env.monitor.window
    cap = env.config.capacity_lines
    hot = [rng.randrange(window[1]) for _ in range(hot_lines)]
    tags = 0
    for _ in range(n):
        line = pick_line(rng, window, cap, hot, outside=0.10, hot_share=0.5)
        tag = rng.randrange(1 << 16) if rng.random() < 0.9 else tags % 8   # some repeats
        tags += 1
        ld_id = rng.randrange(16)
        k = rng.random()
        if k < 0.40:
            rd(env, tag, line, Q.MEM_RD if rng.random() < 0.8 else Q.MEM_RD_DATA,
               rng.choice([MS0, NOOP]), rng.choice([MetaValue.ANY, MetaValue.SHARED,
                                                    MetaValue.INVALID]),
               rng.choice(list(SnpType)), ld_id=ld_id)
        elif k < 0.65:
            wr(env, tag, line, pattern(rng), poison=int(rng.random() < 0.02), ld_id=ld_id)
        elif k < 0.88:
            wr(env, tag, line, pattern(rng), strb=rng.getrandbits(64),
               poison=int(rng.random() < 0.02), ld_id=ld_id)
        elif k < 0.94:
            rd(env, tag, line, Q.MEM_INV, MS0, rng.choice([MetaValue.ANY, MetaValue.INVALID]),
               SnpType.SNP_INV, ld_id=ld_id)
        elif k < 0.98:
            rd(env, tag, line, Q.MEM_SPEC_RD, NOOP, MetaValue.INVALID, SnpType.NO_OP,
               ld_id=ld_id)
        else:
            rd(env, tag, line, Q.MEM_CLN_EVCT, MS0, MetaValue.INVALID, SnpType.NO_OP,
               ld_id=ld_id)


@cocotb.test()
async def random_stress(dut):
    n = int(os.environ.get("TCXL_TRANSACTIONS", "2000"))
    env = await DeviceEnv.create(dut, backpressure=0.2)
    await program_split_window(env)         # lines on both sides: outside traffic hits both
    t_gen = time.perf_counter()
    _random_traffic(env, n)                  # stimulus is made up front, then simulated
    t0 = time.perf_counter()
    start_cycle = env.host.cycle
    summary = await env.finish()
    wall = time.perf_counter() - t0
    cycles = env.host.cycle - start_cycle
    result = {"transactions": n, "mismatches": summary["mismatches"],
              "protocol_violations": summary["protocol_violations"], "cycles": cycles,
              "sim_cycles_per_second": round(cycles / wall), "wall_seconds": round(wall, 3),
              "stimulus_seconds": round(t0 - t_gen, 3),
              "reads_checked": summary["reads_checked"], "seed": env.seed,
              "messages": summary["messages"]}
    dut._log.info(f"stress result: {result}")
    write_result(result)
    env.assert_clean()
    assert summary["reads_checked"] > n // 5


@cocotb.test()
async def power_failure_under_writes(dut):
    """Cut power at random points under write traffic; acknowledged writes survive and each
    8-byte word of an unacknowledged write is old or new."""
    rounds = int(os.environ.get("TCXL_POWER_ROUNDS", "6"))
    env = await DeviceEnv.create(dut)
    rng = env.rng
    lines = [rng.randrange(env.config.capacity_lines) for _ in range(96)]
    bad_words = lost_acked = torn_lines = checked_lines = 0
    problems = []
    for rnd in range(rounds):
        for k in range(400):
            ln = rng.choice(lines)
            strb = None if rng.random() < 0.5 else rng.getrandbits(64)
            wr(env, k, ln, pattern(rng), strb=strb)
        await ClockCycles(env.clk, rng.randrange(50, 1500))
        versions = env.scoreboard.mem.versions
        acked = dict(env.scoreboard.acked_seq)
        await env.power_cycle(tear_seed=rng.getrandbits(32))
        for ln, hist in versions.items():
            value, _ = env.peek(ln)
            checked_lines += 1
            lo = acked.get(ln, -1)
            durable = next(v for v in hist if v.seq == lo)       # last acknowledged version
            in_flight = [(v.data, v.strb) for v in hist if v.seq > lo]
            if not in_flight and value != durable.value:
                lost_acked += 1
                problems.append(f"round {rnd} line {ln:#x}: acknowledged write (seq {lo}) "
                                f"lost: {value:#x} != {durable.value:#x}")
                continue
            torn_lines += value not in {v.value for v in hist if v.seq >= lo}
            for w in range(8):
                word = (value >> (64 * w)) & (2 ** 64 - 1)
                if word not in word_outcomes(durable.value, in_flight, w):
                    bad_words += 1
                    problems.append(f"round {rnd} line {ln:#x} word {w}: {word:#018x} is no "
                                    f"combination of the acknowledged value and the "
                                    f"{len(in_flight)} writes in flight")
        # The media are the truth after the failure: restart the reference from them.
        for ln in list(versions):
            value, poison = env.peek(ln)
            env.model.write(ln, value, poison=poison)
        versions.clear()
        env.scoreboard.acked_seq.clear()
        await env.program_window(0, env.config.capacity_bytes)
    for ln in lines:                          # everything still reads back through CXL.mem
        rd(env, 0x9000, ln)
    summary = await env.finish()
    dut._log.info(f"power failure: {rounds} rounds, {checked_lines} line checks, "
                  f"{torn_lines} torn lines, {bad_words} bad words, {lost_acked} lost acked")
    write_result({"rounds": rounds, "line_checks": checked_lines, "torn_lines": torn_lines,
                  "bad_words": bad_words, "lost_acknowledged_writes": lost_acked,
                  "seed": env.seed, **summary})
    assert not problems, "\n".join(problems[:10])
    assert torn_lines > 0, "no write was in flight at any power failure: the test is too weak"
    env.assert_clean()


@cocotb.test()
async def streaming_read_bandwidth(dut):
    """MemRd of consecutive lines at full rate: lines per cycle at the port (the bench)."""
    n = int(os.environ.get("TCXL_BENCH_LINES", "4096"))
    env = await DeviceEnv.create(dut)
    done = []

    class Stamps:                 # cycle of the first request and of every DRS
        def on_m2s(self, seq, cycle, kind, f):
            if seq == 0:
                done.append(cycle)

        def on_s2m(self, cycle, kind, f):
            if kind == "drs":
                done.append(cycle)
    env.host.seq = 0
    env.host.listeners.append(Stamps())
    for i in range(n):
        rd(env, i & 0xFFFF, i, Q.MEM_RD, NOOP, MetaValue.INVALID, SnpType.SNP_CUR)
    t0 = time.perf_counter()
    summary = await env.finish()
    wall = time.perf_counter() - t0
    first, last = done[0], done[-1]
    lines_per_cycle = n / (last - first + 1)
    p = media_verilog_parameters(env.config.clock_mhz, depth_lines=1, id_width=8,
                                 addr_width=32)
    media_rate = env.config.channels * 256 / p["RD_COST_Q8"]
    result = {"lines": n, "cycles": last - first + 1, "lines_per_cycle": lines_per_cycle,
              "media_read_lines_per_cycle": media_rate,
              "cxlmem_read_efficiency": lines_per_cycle / min(1.0, media_rate),
              "sim_cycles_per_second": round(summary["cycles"] / wall), "seed": env.seed}
    dut._log.info(f"bench: {result}")
    write_result(result)
    env.assert_clean()
