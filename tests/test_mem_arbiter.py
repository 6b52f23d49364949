"""MemPortArbiter (hw/mem/arbiter.py) in Amaranth's simulator: several clients, a memory
stand-in that answers out of order, random ready on every side. Each client must get back
exactly its own responses, with its own ctx, each once."""
import random

import pytest
from amaranth.sim import Simulator

from hw.mem.arbiter import MemPortArbiter


def run(seed, clients=3, per_client=60, input_stage=None):
    rng = random.Random(seed)
    dut = MemPortArbiter(clients=clients, addr_bits=12, ctx_bits=6, input_stage=input_stage)
    sent = {i: [] for i in range(clients)}          # (write, ctx) sent by client i
    got = {i: [] for i in range(clients)}           # (write, ctx) received by client i
    accepted = []                                   # wide ctx seen by the memory

    async def bench(ctx):
        todo = {i: [(rng.random() < 0.4, (i * 17 + k) % 64) for k in range(per_client)]
                for i in range(clients)}
        pending = []                                 # memory's outstanding (write, wide ctx)
        for _ in range(4000):
            # clients offer their next request
            for i, c in enumerate(dut.clients):
                if todo[i] and rng.random() < 0.7:
                    w, cx = todo[i][0]
                    ctx.set(c.req.valid, 1)
                    ctx.set(c.req.payload.write, int(w))
                    ctx.set(c.req.payload.addr, rng.randrange(4096))
                    ctx.set(c.req.payload.ctx, cx)
                else:
                    ctx.set(c.req.valid, 0)
                ctx.set(c.rd_rsp.ready, int(rng.random() < 0.7))
                ctx.set(c.wr_rsp.ready, int(rng.random() < 0.7))
            ctx.set(dut.mem.req.ready, int(rng.random() < 0.8))
            # the memory answers a random outstanding request (out of order)
            offer = rng.choice(pending) if pending and rng.random() < 0.8 else None
            for name in ("rd_rsp", "wr_rsp"):
                ch = getattr(dut.mem, name)
                want = offer is not None and offer[0] == (name == "wr_rsp")
                ctx.set(ch.valid, int(want))
                if want:
                    ctx.set(ch.payload.ctx, offer[1])
            # sample handshakes before the edge
            for i, c in enumerate(dut.clients):
                if ctx.get(c.req.valid) and ctx.get(c.req.ready):
                    sent[i].append(todo[i].pop(0))
                for name in ("rd_rsp", "wr_rsp"):
                    ch = getattr(c, name)
                    if ctx.get(ch.valid) and ctx.get(ch.ready):
                        got[i].append((name == "wr_rsp", ctx.get(ch.payload.ctx)))
            if ctx.get(dut.mem.req.valid) and ctx.get(dut.mem.req.ready):
                item = (bool(ctx.get(dut.mem.req.payload.write)), ctx.get(dut.mem.req.payload.ctx))
                pending.append(item)
                accepted.append(item)
            for name in ("rd_rsp", "wr_rsp"):
                ch = getattr(dut.mem, name)
                if offer is not None and ctx.get(ch.valid) and ctx.get(ch.ready):
                    pending.remove(offer)
            await ctx.tick()
            if not pending and not any(todo.values()) and rng.random() < 0.05:
                break

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return sent, got, accepted


@pytest.mark.parametrize("input_stage", [None, ("skid",) * 3, ("slice",) * 3, ("skid", "slice", "none")])
def test_every_client_gets_exactly_its_responses(input_stage):
    for seed in (1, 2, 3):
        sent, got, accepted = run(seed, input_stage=input_stage)
        for i in sent:
            assert len(sent[i]) == 60, f"seed {seed}: client {i} could not send everything"
            assert sorted(got[i]) == sorted((w, cx) for w, cx in sent[i]), \
                f"seed {seed}: client {i} got {len(got[i])} responses for {len(sent[i])} requests"
            # each client's requests reach the memory once each, in the order it sent them
            assert [(w, cx & 63) for w, cx in accepted if cx >> 6 == i] == sent[i], f"seed {seed}: client {i}"
        # the client index rides above the client's ctx bits
        assert {cx >> 6 for _, cx in accepted} == {0, 1, 2}


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")    # the refused constructions
def test_input_stage_latency_and_errors():
    """A slice holds a request one cycle, a skid none; a bad stage name is refused."""
    with pytest.raises(ValueError, match="input_stage"):
        MemPortArbiter(clients=2, addr_bits=12, ctx_bits=6, input_stage=("skid",))
    with pytest.raises(ValueError, match="input_stage"):
        MemPortArbiter(clients=1, addr_bits=12, ctx_bits=6, input_stage=("fifo",))
    for stage, latency in (("none", 0), ("skid", 0), ("slice", 1)):
        dut = MemPortArbiter(clients=1, addr_bits=12, ctx_bits=6, input_stage=(stage,))
        seen = []

        async def bench(ctx, dut=dut, seen=seen):
            ctx.set(dut.mem.req.ready, 1)
            ctx.set(dut.clients[0].req.valid, 1)
            ctx.set(dut.clients[0].req.payload.addr, 5)
            for cycle in range(4):
                if ctx.get(dut.mem.req.valid):
                    seen.append(cycle)
                await ctx.tick()
                ctx.set(dut.clients[0].req.valid, 0)

        sim = Simulator(dut)
        sim.add_clock(1e-8)
        sim.add_testbench(bench)
        sim.run()
        assert seen == [latency], (stage, seen)
