"""ElementReader (hw/ndp/element_reader.py) alone in Amaranth's simulator: elements in order
across any first lane and count, ``abort`` drops what is buffered (also the element waiting in
its output register slice) and the reader is usable again, and one element per cycle once
the prefetch is full. The expected values come from the memory dict, not from the RTL."""
import os
import random

from amaranth.sim import Simulator

from hw.ndp.element_reader import ElementReader
from pysim_memory import MemModel, read_stream

CAP = 1 << 10


def _seed() -> int:
    seed = int(os.environ.get("TCXL_SEED", random.randrange(1 << 30)))
    print(f"seed {seed} (replay with TCXL_SEED={seed})")
    return seed


def _elem(mem, base, i):
    return (mem[base + i // 16] >> (32 * (i % 16))) & 0xFFFF_FFFF


def _run(seed, jobs, ready_p, lat, out_ready_p):
    prng = random.Random(seed)
    mem = {a: prng.getrandbits(512) for a in range(CAP)}
    dut = ElementReader(addr_bits=10, depth=8)
    mm = MemModel(dut.mem, mem, prng, capacity=CAP, ready_p=ready_p, lat=lat)
    got = []

    async def bench(ctx):
        cycle = 0
        for base, first, count, abort_after in jobs:
            elems, n, cycle = await read_stream(ctx, dut, dut.elems, mm, prng,
                                                {"base": base, "first": first, "count": count}, cycle,
                                                abort_after, out_ready_p)
            ctx.set(dut.elems.ready, 0)
            for _ in range(3):                     # nothing left over after busy falls
                await ctx.tick()
                assert not ctx.get(dut.elems.valid)
            got.append((elems, n))

    sim = Simulator(dut)
    sim.add_clock(1e-9)
    sim.add_testbench(bench)
    sim.run()
    return mem, got


def test_element_reader_order_abort_reuse():
    seed = _seed()
    prng = random.Random(seed)
    jobs = [(prng.randrange(CAP - 64), prng.randrange(16), prng.randint(1, 300), None) for _ in range(3)]
    jobs.append((40, 5, 0, None))                  # empty stream
    jobs.append((100, 3, 400, 37))                 # aborted after 37 elements
    jobs.append((200, 15, 50, None))               # and usable again
    mem, got = _run(seed, jobs, 0.7, (2, 20), 0.6)
    for (base, first, count, abort_after), (elems, _) in zip(jobs, got):
        want = [_elem(mem, base, first + i) for i in range(count)]
        if abort_after is None:
            assert elems == want
        else:
            assert abort_after <= len(elems) <= abort_after + 1 and elems == want[:len(elems)]


def test_element_reader_one_element_per_cycle():
    mem, got = _run(1, [(0, 0, 320, None)], 1.0, (6, 6), 1.0)
    elems, n = got[0]
    assert len(elems) == 320
    assert n <= 320 + 12, n                        # the read latency and the slice, then 1 per cycle
