"""hw/common/ram.py against amaranth.lib.memory.Memory, cycle by cycle, in Amaranth's simulator.

The reference is the multi-port memory each RAM replaces (the construct the engines used
before issue 13): the same write ports, read ports with the same transparency. Both get the
same random stimulus on a small depth, so same-address traffic is frequent: a read and a
write of one address in one cycle (bypassed or not), back-to-back writes, reads with the
enable low (data held), and several ports writing one address in one cycle. Every read
port's data must equal the reference's in every cycle, bit for bit.
"""
import random

import pytest
from amaranth import Module
from amaranth.lib.memory import Memory
from amaranth.sim import Simulator

from hw.common.ram import BypassRam, LvtRam

SEED = 1304


def _build(ram_cls, *, width, depth, writes, reads, granularity=None):
    """(module, ram ports, reference ports). ``reads``: list of (domain, transparent write-port indices)."""
    m = Module()
    kw = {"granularity": granularity} if granularity else {}
    ram = ram_cls(shape=width, depth=depth, name="dut", **kw)
    ref = Memory(shape=width, depth=depth, init=[])
    m.submodules.ram = ram
    m.submodules.ref = ref
    ram_w = [ram.write_port() for _ in range(writes)]
    ref_w = [ref.write_port(granularity=granularity) for _ in range(writes)]
    ram_r, ref_r = [], []
    for domain, transparent, *late in reads:
        if ram_cls is BypassRam:
            ram_r.append(ram.read_port(domain=domain, bypass=bool(transparent)))
        else:
            ram_r.append(ram.read_port(domain=domain, transparent_for=[ram_w[i] for i in transparent],
                                       late_pick=bool(late)))
        ref_r.append(ref.read_port(domain=domain, transparent_for=[ref_w[i] for i in transparent]))
    return m, (ram_w, ram_r), (ref_w, ref_r)


def _run(m, dut, ref, *, width, depth, cycles, seed, chunks=1, collide=True):
    ram_w, ram_r = dut
    ref_w, ref_r = ref
    rng = random.Random(seed)
    mismatches = []

    async def bench(ctx):
        # Memories keep no reset value: write every address from port 0 first.
        for a in range(depth):
            data = rng.getrandbits(width)
            for w_ in (ram_w[0], ref_w[0]):
                ctx.set(w_.addr, a)
                ctx.set(w_.data, data)
                ctx.set(w_.en, (1 << chunks) - 1)
            await ctx.tick()
        for w_ in ram_w + ref_w:
            ctx.set(w_.en, 0)
        await ctx.tick()
        for cycle in range(cycles):
            used = set()
            for rw, fw in zip(ram_w, ref_w):
                addr = rng.randrange(depth)
                if not collide:
                    while addr in used:
                        addr = rng.randrange(depth)
                en = rng.getrandbits(chunks) if rng.random() < 0.7 else 0
                if en:
                    used.add(addr)
                data = rng.getrandbits(width)
                for p in (rw, fw):
                    ctx.set(p.addr, addr)
                    ctx.set(p.data, data)
                    ctx.set(p.en, en)
            for rr, fr in zip(ram_r, ref_r):
                # Reads mostly hit an address written this cycle or the last.
                addr = rng.choice(sorted(used)) if used and rng.random() < 0.6 else rng.randrange(depth)
                if getattr(rr, "late_pick", False):     # the address as one of two candidates
                    pick = rng.getrandbits(1)
                    other = rng.choice(sorted(used)) if used and rng.random() < 0.6 else rng.randrange(depth)
                    ctx.set(rr.addr_cand[pick], addr)
                    ctx.set(rr.addr_cand[1 - pick], other)
                    ctx.set(rr.pick, pick)
                    ctx.set(fr.addr, addr)
                else:
                    for p in (rr, fr):
                        ctx.set(p.addr, addr)
                if rr.en is not None:
                    en = int(rng.random() < 0.85)
                    ctx.set(rr.en, en)
                    ctx.set(fr.en, en)
            for j, (rr, fr) in enumerate(zip(ram_r, ref_r)):
                if rr.en is None:          # asynchronous: compare in the same cycle
                    got, want = ctx.get(rr.data), ctx.get(fr.data)
                    if got != want:
                        mismatches.append((cycle, j, got, want))
            await ctx.tick()
            for j, (rr, fr) in enumerate(zip(ram_r, ref_r)):
                got, want = ctx.get(rr.data), ctx.get(fr.data)
                if got != want:
                    mismatches.append((cycle, j, got, want))

    sim = Simulator(m)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    return mismatches


CASES = {
    # the update engine's scratchpad: fills and FMA results in; the FMA operand (transparent
    # for the FMA results) and the write-backs out
    "lvt_2w2r_scratch": dict(cls=LvtRam, width=24, depth=8, writes=2, reads=[("sync", [1]), ("sync", [])]),
    # ... with the FMA operand's address picked late from two candidates (window entries A, B)
    "lvt_2w2r_scratch_late_pick": dict(cls=LvtRam, width=24, depth=8, writes=2,
                                       reads=[("sync", [1], "late"), ("sync", [], "late")]),
    # the CXL.cache agent's tracker data: two writers, three asynchronous readers
    "lvt_2w3r_comb": dict(cls=LvtRam, width=16, depth=8, writes=2, reads=[("comb", [])] * 3),
    "lvt_3w2r_both_transparent": dict(cls=LvtRam, width=8, depth=4, writes=3,
                                      reads=[("sync", [0, 2]), ("sync", [0, 1, 2])]),
    # one tag way: a write port and a bypassed read
    "bypass_1w1r": dict(cls=BypassRam, width=20, depth=8, writes=1, reads=[("sync", [0])]),
    "bypass_1w_plain_and_comb": dict(cls=BypassRam, width=20, depth=8, writes=1, reads=[("sync", []), ("comb", [])]),
    "bypass_chunked": dict(cls=BypassRam, width=24, depth=4, writes=1, reads=[("sync", [0])], granularity=8),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_ram_equals_multiport_memory(name):
    """Every read equals the reference multi-port memory's, every cycle (seed printed)."""
    c = dict(CASES[name])
    cls = c.pop("cls")
    gran = c.pop("granularity", None)
    m, dut, ref = _build(cls, width=c["width"], depth=c["depth"], writes=c["writes"], reads=c["reads"],
                         granularity=gran)
    chunks = c["width"] // gran if gran else 1
    print(f"seed {SEED}")
    bad = _run(m, dut, ref, width=c["width"], depth=c["depth"], cycles=600, seed=SEED, chunks=chunks)
    assert not bad, f"{len(bad)} mismatches (cycle, port, got, want), first: {bad[:5]}"


def test_ram_rejects_bad_use():
    with pytest.raises(ValueError, match="granularity"):
        BypassRam(shape=10, depth=4, granularity=4)
    r = BypassRam(shape=8, depth=4)
    with pytest.raises(ValueError, match="write port before"):
        r.read_port(bypass=True)
    r.write_port()
    with pytest.raises(ValueError, match="1 write port"):
        r.write_port()
    with pytest.raises(TypeError):
        LvtRam(shape=8, depth=4, granularity=4)           # whole-word writes only
    lvt = LvtRam(shape=8, depth=4)
    lvt.write_port()
    with pytest.raises(ValueError, match="asynchronous"):
        lvt.read_port(domain="comb", transparent_for=lvt._write_ports)
