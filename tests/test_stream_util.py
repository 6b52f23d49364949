"""SkidBuffer and RegisterSlice (hw/common/stream_util.py) in Amaranth's simulator.

Random valid on the input and random ready on the output, with a producer that keeps its
payload until it is taken (the stream rule): every payload must come out once, in order;
``i.ready`` must not change when ``o.ready`` does within a cycle (it is a flip-flop); the
skid buffer must pass a payload in the cycle it arrives when empty, the register slice one
cycle later. Seeds are printed (replay: the seed list below)."""
import random

import pytest
from amaranth.sim import Simulator

from hw.common.stream_util import RegisterSlice, SkidBuffer

SEEDS = (1, 2, 3)


def run(cls, seed, n=400, p_valid=0.7, p_ready=0.6):
    print(f"{cls.__name__} seed {seed}")
    rng = random.Random(seed)
    dut = cls(16)
    out = []
    sent = []
    first_out_cycle = {}

    async def bench(ctx):
        k = 0                                  # next payload to offer
        offering = False
        for cycle in range(20 * n):
            if not offering and k < n and rng.random() < p_valid:
                offering = True
            ctx.set(dut.i.valid, int(offering))
            ctx.set(dut.i.payload, k)
            # i.ready may not follow o.ready within the cycle
            ctx.set(dut.o.ready, 0)
            ready_lo = ctx.get(dut.i.ready)
            ctx.set(dut.o.ready, 1)
            assert ctx.get(dut.i.ready) == ready_lo, f"i.ready follows o.ready in cycle {cycle}"
            ctx.set(dut.o.ready, int(rng.random() < p_ready))
            if ctx.get(dut.o.valid) and ctx.get(dut.o.ready):
                v = ctx.get(dut.o.payload)
                out.append(v)
                first_out_cycle.setdefault(v, cycle)
            if offering and ctx.get(dut.i.ready):
                sent.append((k, cycle))
                k += 1
                offering = False
            await ctx.tick()
            if len(out) == n:
                break

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert out == list(range(n)), f"seed {seed}: payloads lost, repeated or reordered"
    return sent, first_out_cycle


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("cls", [SkidBuffer, RegisterSlice])
def test_in_order_nothing_lost(cls, seed):
    run(cls, seed)


@pytest.mark.parametrize("cls,latency", [(SkidBuffer, 0), (RegisterSlice, 1)])
def test_latency_and_full_rate(cls, latency):
    """Always valid, always ready: one payload per cycle, ``latency`` cycles through."""
    sent, first_out = run(cls, 7, n=100, p_valid=1.0, p_ready=1.0)
    assert [c for _, c in sent] == list(range(100)), "not one payload per cycle"
    assert all(first_out[k] == c + latency for k, c in sent)


def test_one_hot_index_and_select():
    """hw/common/onehot.py against the plain answer for every one-hot vector and zero."""
    from amaranth import Module, Signal
    from hw.common.onehot import one_hot_index, one_hot_select
    n = 11
    m = Module()
    bits = Signal(n)
    values = [Signal(8, name=f"v{i}") for i in range(n)]
    index, chosen = Signal(range(n)), Signal(8)
    m.d.comb += [index.eq(one_hot_index(bits)), chosen.eq(one_hot_select(bits, values))]

    async def bench(ctx):
        for i, v in enumerate(values):
            ctx.set(v, 17 * i + 3)
        ctx.set(bits, 0)
        assert (ctx.get(index), ctx.get(chosen)) == (0, 0)
        for k in range(n):
            ctx.set(bits, 1 << k)
            assert (ctx.get(index), ctx.get(chosen)) == (k, 17 * k + 3), k

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_round_robin_grant_order(n):
    """RoundRobinArbiter against a reference model of its contract: each cycle the granted
    input is the first valid one after the last input that completed a transfer (input 0
    first after reset), ``o`` carries its payload, only it sees ``o.ready``; random valid and
    ready, 600 cycles, seed printed."""
    from hw.common.stream_util import RoundRobinArbiter
    seed = 100 + n
    print(f"RoundRobinArbiter n={n} seed {seed}")
    rng = random.Random(seed)
    dut = RoundRobinArbiter(8, n)

    async def bench(ctx):
        last = n - 1
        for cycle in range(600):
            valid = [rng.random() < 0.5 for _ in range(n)]
            ready = rng.random() < 0.7
            for k, inp in enumerate(dut.inputs):
                ctx.set(inp.valid, int(valid[k]))
                ctx.set(inp.payload, 16 * k + cycle % 16)
            ctx.set(dut.o.ready, int(ready))
            want = next(((last + d) % n for d in range(1, n + 1) if valid[(last + d) % n]), None)
            assert ctx.get(dut.o.valid) == (want is not None), cycle
            if want is not None:
                assert ctx.get(dut.o.payload) == 16 * want + cycle % 16, (cycle, want)
            for k, inp in enumerate(dut.inputs):
                assert ctx.get(inp.ready) == int(k == want and ready), (cycle, k, want)
            if want is not None and ready:
                last = want
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
