"""UpdateDatapath (hw/ndp/update/datapath.py) alone, in Amaranth's simulator.

The bench puts the datapath between plain memories: two scratchpad banks (one write port,
a read port transparent for it, as the engine's LvtRam banks behave for the result port)
and the gradient ring (two copies, synchronous reads), with the arrival bits driven by the
test. Occurrences go in through ``occ``; when ``completed`` reaches their count, every
scratchpad line must equal the golden model's bit for bit: for each occurrence in order and
each of its lines, row = fma(-lr, c, row) with c = g (SUM) or fp32(g * scale) (MUL), computed
by sim/model/fp32_ref.py (an independent numpy implementation, not the RTL's algorithm).

The cycle counts pin the window's contract (module docstring: a loop through the FMA per
update of one hot row, another row fills the gap, up to two line-steps per cycle).
"""
from __future__ import annotations

import random

import numpy as np
import pytest
from amaranth import Elaboratable, Module, Signal
from amaranth.lib.memory import Memory
from amaranth.sim import Simulator

from hw.common.fp32 import Fp32Fma
from hw.ndp.update.datapath import UpdateDatapath
from sim.model import fp32_ref

SL = 64                          # scratchpad lines
GL = 64                          # gradient-ring lines
LR = np.float32(0.0625)
SEED = 4242


def _lines_to_ints(a: np.ndarray) -> list[int]:
    """(n, 16) float32 -> n 512-bit ints, float 0 in bits 0..31."""
    return [int.from_bytes(row.astype("<f4").tobytes(), "little") for row in a]


def _int_to_line(v: int) -> np.ndarray:
    return np.frombuffer(v.to_bytes(64, "little"), dtype="<f4").copy()


class _Bench(Elaboratable):
    def __init__(self, scratch: np.ndarray, grads: np.ndarray, pipeline: str):
        self.dp = UpdateDatapath(scratch_lines=SL, grad_lines=GL, contrib_lines=32, fma_queue_depth=16,
                                 fp32_pipeline=pipeline)
        self.line_here = Signal(SL)
        self.grad_here = Signal(GL)
        self.fill_en = Signal()               # a fill: line pair (2a, 2a + 1), one line per bank
        self.fill_addr = Signal(range(SL // 2))
        self.fill_data = [Signal(512, name=f"fill_data{b}") for b in range(2)]
        ints = _lines_to_ints(scratch)
        self.banks = [Memory(shape=512, depth=SL // 2, init=ints[b::2]) for b in range(2)]
        self.grad_mems = [Memory(shape=512, depth=GL, init=_lines_to_ints(grads)) for _ in range(2)]

    def elaborate(self, platform):
        m = Module()
        dp = m.submodules.dp = self.dp
        for b, bank in enumerate(self.banks):
            m.submodules[f"bank{b}"] = bank
            wp = bank.write_port()
            rp = bank.read_port(transparent_for=(wp,))
            fp = bank.write_port()
            m.d.comb += [fp.addr.eq(self.fill_addr), fp.data.eq(self.fill_data[b]), fp.en.eq(self.fill_en)]
            m.d.comb += [wp.addr.eq(dp.bank_wr[b].addr), wp.data.eq(dp.bank_wr[b].data), wp.en.eq(dp.bank_wr[b].en),
                         rp.addr.eq(dp.bank_rd_addr[b]), dp.bank_rd_data[b].eq(rp.data)]
        for i, mem in enumerate(self.grad_mems):
            m.submodules[f"grad{i}"] = mem
            rp = mem.read_port()
            m.d.comb += [rp.addr.eq(dp.grad_rd_addr[i]), dp.grad_rd_data[i].eq(rp.data)]
        for i in range(len(dp.grad_arrived)):
            m.d.comb += dp.grad_arrived[i].eq(self.grad_here.bit_select(dp.grad_query[i], 1))
        m.d.comb += [dp.line_arrived.eq(self.line_here), dp.lr.eq(int(LR.view(np.uint32)))]
        return m


def _golden(scratch: np.ndarray, grads: np.ndarray, occs) -> np.ndarray:
    table = scratch.copy()
    neg_lr = np.uint32((-LR).view(np.uint32))
    for o in occs:
        for k in range(o["lines"]):
            g = grads[o["gpos"] + k].view(np.uint32)
            c = fp32_ref.mul(g, np.uint32(o["scale"])) if o["mul"] else g
            line = o["row_base"] + k
            table[line] = fp32_ref.fma(neg_lr, c, table[line].view(np.uint32)).view(np.float32)
    return table


def _occurrences(rows, lines, rng, *, mul_p=0.0):
    """One occurrence per entry of ``rows`` (slot numbers); each its own bag of ``lines``
    gradient lines at consecutive ring positions (the ring wraps)."""
    occs, gpos = [], 0
    shift = (lines - 1).bit_length()
    for r in rows:
        mul = rng.random() < mul_p
        scale = np.float32(rng.uniform(-2, 2)).view(np.uint32) if mul else 0
        occs.append({"row_base": r << shift, "lines": lines, "gpos": gpos, "mul": int(mul), "scale": int(scale),
                     "bag_last": 1})
        gpos = (gpos + lines) % GL if gpos + 2 * lines <= GL else 0
    return occs


def _run(occs, *, pipeline="compact", seed=SEED, late_pair=None, late_cycles=0):
    """Simulate; return (cycles until ``completed`` = len(occs), the scratchpad, lines freed,
    the golden scratchpad). ``late_pair`` a: scratchpad lines 2a and 2a + 1 hold garbage until
    their fill at cycle ``late_cycles``; their arrival bits rise a cycle later (registers
    set by the fill, as in the engine)."""
    rng = np.random.default_rng(seed)
    scratch = rng.uniform(-4, 4, size=(SL, 16)).astype(np.float32)
    grads = rng.uniform(-4, 4, size=(GL, 16)).astype(np.float32)
    before_fill = scratch.copy()
    if late_pair is not None:
        before_fill[2 * late_pair:2 * late_pair + 2] = np.float32(1e30)
    bench = _Bench(before_fill, grads, pipeline)
    dp = bench.dp
    out = {}

    async def testbench(ctx):
        early = (1 << SL) - 1
        if late_pair is not None:
            early &= ~(3 << 2 * late_pair)
        ctx.set(bench.line_here, early)
        ctx.set(bench.grad_here, (1 << GL) - 1)
        cycle, pushed, freed = 0, 0, 0
        while ctx.get(dp.completed) < len(occs):
            assert cycle < 200 + 40 * len(occs), f"stuck: {ctx.get(dp.completed)} of {len(occs)} completed"
            ctx.set(bench.fill_en, late_pair is not None and cycle == late_cycles)
            if late_pair is not None and cycle == late_cycles:
                ctx.set(bench.fill_addr, late_pair)
                for b, line in enumerate(_lines_to_ints(scratch[2 * late_pair:2 * late_pair + 2])):
                    ctx.set(bench.fill_data[b], line)
            if cycle == late_cycles + 1:        # the arrival bits are registered (set with the write)
                ctx.set(bench.line_here, (1 << SL) - 1)
            if pushed < len(occs):
                ctx.set(dp.occ.valid, 1)
                ctx.set(dp.occ.payload, occs[pushed])
            else:
                ctx.set(dp.occ.valid, 0)
            took = ctx.get(dp.occ.valid) and ctx.get(dp.occ.ready)
            freed += ctx.get(dp.grad_freed)
            await ctx.tick()
            pushed += bool(took)
            cycle += 1
        out["cycles"] = cycle
        out["freed"] = freed
        out["table"] = np.stack([_int_to_line(ctx.get(bench.banks[line % 2].data[line // 2])) for line in range(SL)])

    sim = Simulator(bench)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    want = _golden(scratch, grads, occs)
    return out["cycles"], out["table"], out["freed"], want


def _assert_bits_equal(got, want):
    bad = np.argwhere(got.view(np.uint32) != want.view(np.uint32))
    assert bad.size == 0, f"{len(bad)} floats differ, first at line/lane {tuple(bad[0])}"


LAT = Fp32Fma.LATENCIES["compact"]


@pytest.mark.parametrize("pipeline", ["compact", "deep"])
def test_hot_row_costs_a_loop_per_update(pipeline):
    """One row updated 24 times: each update waits for the one before (bit-exact proves the
    wait: an early issue would read the old row), so a loop through the FMA each and no
    faster: L cycles, or L - LATE_C where the deep FMA takes the row (its addend) late."""
    loop = Fp32Fma.LATENCIES[pipeline] - (Fp32Fma.LATE_C if pipeline == "deep" else 0)
    occs = _occurrences([5] * 24, 1, random.Random(SEED))
    cycles, got, freed, want = _run(occs, pipeline=pipeline)
    _assert_bits_equal(got, want)
    assert freed == 24
    assert 24 * loop <= cycles <= 24 * loop + 12, cycles


def test_two_rows_fill_each_other_gaps():
    """Two rows alternating: B issues while A waits for its row, so half the hot row's time."""
    occs = _occurrences([3, 9] * 12, 1, random.Random(SEED))
    cycles, got, _, want = _run(occs)
    _assert_bits_equal(got, want)
    assert cycles <= 12 * LAT + 14, cycles


@pytest.mark.parametrize("lines", [1, 2, 4])
def test_distinct_rows_stream(lines):
    """Distinct rows: one line-step per cycle, two when a row has two lines or more (a pair)."""
    rng = random.Random(SEED + lines)
    rows = rng.sample(range(SL // lines), SL // lines)[:16]
    occs = _occurrences(rows, lines, rng)
    cycles, got, freed, want = _run(occs)
    _assert_bits_equal(got, want)
    assert freed == 16 * lines
    steps = 16 * lines // (2 if lines >= 2 else 1)
    assert cycles <= steps + LAT + 8, cycles


@pytest.mark.parametrize("pipeline", ["compact", "deep"])
def test_random_mix_with_mul_bit_exact(pipeline):
    """Random rows with repeats (Zipf-like), a third of them through the MUL front, both FMA
    pipelines: bit-exact with the golden model."""
    rng = random.Random(SEED + 7)
    print(f"seed {SEED + 7}")
    rows = [min(int(rng.paretovariate(1.2)) - 1, SL // 2 - 1) for _ in range(40)]
    occs = _occurrences(rows, 2, rng, mul_p=0.33)
    cycles, got, freed, want = _run(occs, pipeline=pipeline)
    _assert_bits_equal(got, want)
    assert freed == 80


@pytest.mark.parametrize("pipeline", ["compact", "deep"])
def test_waits_for_the_row_to_arrive(pipeline):
    """A row whose fill lands late: nothing of it issues before its arrival bit rises (its
    lines hold 1e30 until then: a result computed from them differs from the golden model),
    and the row after it in the window goes ahead."""
    occs = _occurrences([7, 7, 2], 2, random.Random(SEED))
    cycles, got, _, want = _run(occs, late_pair=7, late_cycles=40, pipeline=pipeline)
    _assert_bits_equal(got, want)
    assert cycles >= 40 + 2 * LAT, cycles
