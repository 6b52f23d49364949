"""LineCache (hw/mem/line_cache.py) in Amaranth's simulator: a read returns what the memory would.

A random client sends reads and writes through the cache to a MemModel (tests/pysim_memory.py:
random latency, responses out of order, back-pressure), with flushes and "other agents" writing
lines behind the cache's back. Every read response is checked bit for bit:
- lines the client writes (0..WRITTEN-1): exactly the client's last write before the read
  (a cached line must never outlive a write through the port, including a write that
  overtakes a miss still in flight);
- lines other agents write (WRITTEN..LINES-1): a value the line had between the last flush
  before the read was accepted and the read's response (the flush contract);
- lines the memory answers with poison or error: the flags, every time (never cached).
Hits must actually happen (the cache works) and every read is answered once. Directed cases:
a write between a miss and its response, a foreign write and a flush between a miss and its
response, a generation wrap (256 flushes) that must not revive a line cached 256 flushes ago
(the sweep), parked reads of a hot line (and of a poisoned one), and two hot lines sharing an
entry (the clean-install rule; a parked read waits for one miss at most).
"""
import os
import random

import pytest
from amaranth.sim import Simulator

from hw.mem.line_cache import LineCache
from tests.pysim_memory import MemModel

ADDR_BITS = 10
CTX_BITS = 3
ALL = (1 << 512) - 1


def _seed() -> int:
    seed = int(os.environ.get("TCXL_SEED", "0")) or random.randrange(1 << 30)
    print(f"seed {seed} (replay with TCXL_SEED={seed})")
    return seed


def _run(seed: int, *, cycles: int, lines: int, addrs: int, written: int, p_write: float, p_flush: float,
         p_backdoor: float, poison=(), rd_error=(), lat=(2, 30), rsp_ready_p: float = 0.85, mem_ready_p=0.8,
         script=None):
    """Random traffic (or a ``script`` of requests); returns the figures for the asserts."""
    prng = random.Random(seed)
    dut = LineCache(addr_bits=ADDR_BITS, ctx_bits=CTX_BITS, lines=lines)
    mem = {a: prng.getrandbits(512) for a in range(addrs)}
    model = MemModel(dut.mem, mem, prng, capacity=1 << ADDR_BITS, ready_p=mem_ready_p, lat=lat,
                     poison=poison, rd_error=rd_error)
    latest = {a: {mem[a]} for a in range(addrs)}      # values a read may return now
    out = {"reads": 0, "hits": 0, "misses": 0, "writes": 0, "wr_rsp": 0, "answered": 0, "checked": 0,
           "max_latency": 0}
    reads = {}                                          # ctx -> (addr, allowed values, cycle accepted)
    free = list(range(1 << CTX_BITS))
    script = list(script) if script is not None else None

    async def bench(ctx):
        req = None
        for cycle in range(cycles + 3000):       # then drain: no new requests, every read answered
            issuing = cycle < cycles
            # Other agents write behind the cache, a flush makes their values the only ones.
            if issuing and prng.random() < p_backdoor:
                a = prng.randrange(written, addrs)
                mem[a] = prng.getrandbits(512)
                latest[a].add(mem[a])
            flush = issuing and prng.random() < p_flush
            if script is not None and req is None:
                op = script[0] if script else None
                if op and op[0] == "flush":
                    script.pop(0)
                    flush = True
                elif op and op[0] == "poke":       # another agent writes the line
                    script.pop(0)
                    mem[op[1]] = prng.getrandbits(512)
                    latest[op[1]].add(mem[op[1]])
                elif op and (op[0] == "wait" and not reads or op[0] == "nop"):
                    script.pop(0)
            ctx.set(dut.flush, flush)
            if flush:
                for a in range(written, addrs):
                    latest[a] = {mem[a]}                    # a new set: reads before keep theirs
            if req is None:
                if script is not None:
                    if script and script[0][0] in "rw" and (script[0][0] == "w" or free):
                        kind, a = script.pop(0)[:2]
                        req = (kind == "w", a, prng.getrandbits(512), free.pop(0) if kind == "r" else 0)
                elif issuing and prng.random() < 0.8:
                    if prng.random() < p_write:
                        req = (1, prng.randrange(written), prng.getrandbits(512), prng.randrange(1 << CTX_BITS))
                    elif free:
                        c = free.pop(prng.randrange(len(free)))
                        req = (0, prng.randrange(addrs), 0, c)
            c = dut.client.req
            ctx.set(c.valid, req is not None)
            if req is not None:
                ctx.set(c.payload.write, req[0])
                ctx.set(c.payload.addr, req[1])
                ctx.set(c.payload.data, req[2])
                ctx.set(c.payload.strb, (1 << 64) - 1)
                ctx.set(c.payload.ctx, req[3])
            ctx.set(dut.client.rd_rsp.ready, int(prng.random() < rsp_ready_p))
            ctx.set(dut.client.wr_rsp.ready, 1)
            model.drive(ctx, cycle)
            # Sample this cycle's handshakes.
            rsp = dut.client.rd_rsp
            if ctx.get(rsp.valid) and ctx.get(rsp.ready):
                rctx = ctx.get(rsp.payload.ctx)
                assert rctx in reads, f"cycle {cycle}: a read response for ctx {rctx}, which has no read"
                a, allowed, accepted = reads.pop(rctx)
                free.append(rctx)
                out["answered"] += 1
                out["max_latency"] = max(out["max_latency"], cycle - accepted)
                poisoned, error = ctx.get(rsp.payload.poison), ctx.get(rsp.payload.error)
                assert poisoned == (a in poison) and error == (a in rd_error), \
                    f"seed {seed} cycle {cycle}: line {a}: poison {poisoned} error {error}"
                if not (poisoned or error):
                    got = ctx.get(rsp.payload.data)
                    assert got in allowed, (f"seed {seed} cycle {cycle}: read of line {a} (ctx {rctx}) returned "
                                            f"{got:#x}, not a value the line had")
                    out["checked"] += 1
            if ctx.get(dut.client.wr_rsp.valid):
                out["wr_rsp"] += 1
            out["hits"] += ctx.get(dut.hit)
            out["misses"] += ctx.get(dut.miss)
            if req is not None and ctx.get(c.ready):
                write, a, d, rctx = req
                if write:
                    latest[a] = {d}
                    out["writes"] += 1
                else:
                    reads[rctx] = (a, latest[a], cycle)     # grows with foreign writes until a flush
                    out["reads"] += 1
                req = None
            model.sample(ctx, cycle)
            await ctx.tick()
            if (not issuing or script is not None and not script) and req is None and not reads \
                    and not model.pending:
                break
        out["outstanding"] = len(reads)
        out["mem_reads"] = len(model.reads)

    sim = Simulator(dut)
    sim.add_clock(1e-9)
    sim.add_testbench(bench)
    sim.run()
    return out


def _drained(out):
    """Every read answered once, every write acknowledged, each read counted as a hit or a miss."""
    assert out["outstanding"] == 0 and out["answered"] == out["reads"], out
    assert out["wr_rsp"] == out["writes"], out
    assert out["hits"] + out["misses"] == out["reads"], out


@pytest.mark.parametrize("lines,p_write,p_flush,min_hit_rate", [
    (16, 0.15, 0.01, 0.1),
    (4, 0.4, 0.002, 0.002),       # conflicts and writes everywhere: the hazards, not the hit rate
    (64, 0.05, 0.0, 0.3),
])
def test_random_traffic(lines, p_write, p_flush, min_hit_rate):
    """Reads equal the memory's value, bit for bit, under random traffic, flushes and foreign writes."""
    seed = _seed()
    out = _run(seed, cycles=6000, lines=lines, addrs=48, written=32, p_write=p_write, p_flush=p_flush,
               p_backdoor=0.01, poison=(3, 40), rd_error=(5,))
    _drained(out)
    assert out["reads"] > 2000 and out["checked"] > 1500, out
    # The cache serves reads on chip: a memory read per miss only, and many hits.
    assert out["mem_reads"] == out["misses"], out
    assert out["hits"] > min_hit_rate * out["reads"], out


def test_write_overtakes_a_miss():
    """A miss in flight, then a write of the same line, then reads: the miss's (older) response
    must not be installed, whatever order the responses come in."""
    seed = _seed()
    for rep in range(20):
        script = [("r", 7), ("w", 7), ("r", 7), ("r", 7), ("r", 7)] * 3
        out = _run(seed + rep, cycles=3000, lines=8, addrs=16, written=16, p_write=0, p_flush=0, p_backdoor=0,
                   lat=(1, 40), script=script)
        _drained(out)
        assert out["checked"] == out["reads"] == 12, out


def test_flush_during_a_miss():
    """Another agent writes a line after the memory read it for a miss, then a flush, then the
    response: it must not be installed (the flush ends the miss's clean state and its owner's
    generation), so the read after the flush sees the new value."""
    seed = _seed()
    for rep in range(10):
        script = ([("nop",)] * 40 + [("r", 20)] + [("nop",)] * 6 + [("poke", 20), ("flush",), ("wait",)] +
                  [("nop",)] * 4 + [("r", 20), ("wait",), ("r", 20)])
        out = _run(seed + rep, cycles=2000, lines=32, addrs=32, written=16, p_write=0, p_flush=0, p_backdoor=0,
                   lat=(30, 40), script=script)
        _drained(out)
        assert out["checked"] == out["reads"] == 3, out


def test_generation_wrap_sweeps():
    """A line cached, changed by another agent, then 256 flushes (the generation is back where it
    was): the next read must see the new value (the wrap sweeps every entry)."""
    seed = _seed()
    # After the sweep that follows reset (32 entries), a miss, then hits.
    script = ([("nop",)] * 40 + [("r", 20), ("wait",), ("nop",), ("nop",)] * 4 + [("poke", 20)] +
              [("flush",)] * 256 + [("r", 20)] * 3)
    out = _run(seed, cycles=4000, lines=32, addrs=32, written=16, p_write=0, p_flush=0, p_backdoor=0,
               script=script)
    assert out["outstanding"] == 0 and out["checked"] == out["reads"] == 7, out
    assert out["hits"] == 3, out            # line 20 was served on chip before the flushes


def test_reads_wait_for_a_miss_in_flight():
    """Reads of a line whose miss is in flight park and are answered from its install: one
    memory read for many reads of a hot line (and a write behind parked reads waits for them:
    they return the old value, the reads after it the new one)."""
    seed = _seed()
    out = _run(seed, cycles=3000, lines=16, addrs=16, written=16, p_write=0, p_flush=0, p_backdoor=0,
               lat=(40, 60), script=[("nop",)] * 20 + [("r", 9)] * 30)
    assert out["checked"] == out["reads"] == 30, out
    assert out["mem_reads"] == 1 and out["hits"] == 29, out
    out = _run(seed, cycles=3000, lines=16, addrs=16, written=16, p_write=0, p_flush=0, p_backdoor=0,
               lat=(40, 60), script=[("nop",)] * 20 + ([("r", 9)] * 6 + [("w", 9)]) * 3 + [("r", 9)] * 6)
    _drained(out)
    assert out["checked"] == out["reads"] == 24 and out["writes"] == 3, out


def test_parked_reads_of_a_poisoned_line():
    """A poisoned line is never installed: the reads parked behind its miss go to memory in
    turn and each gets the poison (none waits forever for an install that never comes)."""
    seed = _seed()
    out = _run(seed, cycles=3000, lines=16, addrs=16, written=16, p_write=0, p_flush=0, p_backdoor=0,
               lat=(40, 60), poison=(3,), script=[("nop",)] * 20 + [("r", 3)] * 10 + [("r", 4)] * 4)
    assert out["outstanding"] == 0 and out["answered"] == out["reads"] == 14, out
    assert out["mem_reads"] >= 2 and out["checked"] == 4, out


def test_hot_lines_sharing_an_entry():
    """Two hot lines in one entry (9 and 25 of a 16-entry cache), read in turn: each miss takes the
    entry from the other line's miss in flight, and the clean rule still installs both responses,
    so reads hit; a parked read waits for one miss at most (it never parks again, and a reuse of
    its owner's ctx for another miss does not hold it back): every read is answered within two
    memory latencies plus a few cycles."""
    seed = _seed()
    lat = 40
    out = _run(seed, cycles=3000, lines=16, addrs=32, written=32, p_write=0, p_flush=0, p_backdoor=0,
               lat=(lat, lat), rsp_ready_p=1.0, mem_ready_p=1.0,
               script=[("nop",)] * 20 + [("r", 9), ("r", 25), ("r", 9), ("r", 9), ("r", 25), ("r", 3)] * 20)
    _drained(out)
    assert out["checked"] == out["reads"] == 120, out
    assert out["hits"] >= 80, out
    assert out["max_latency"] <= 2 * lat + 12, out
