"""Device memory behind one client port (hw/mem/port.py), for engine tests in Amaranth's simulator.

``MemModel(port, mem, prng, ...)`` stands in for the memory subsystem on ``port`` (the DUT's
``Out(client_port_signature(...))``); ``mem`` is a dict line address -> 512-bit line, read
as 0 where absent. Each simulated cycle the testbench calls ``drive(ctx, cycle)`` and then
``sample(ctx, cycle)`` before ``await ctx.tick()``:

- ``drive``: ``req.ready`` high with probability ``ready_p``; on each of ``rd_rsp`` and
  ``wr_rsp`` one due response, picked at random among the due ones (so out of order), is
  offered (with ``rsp_p`` < 1 only with that probability) and leaves when the DUT is ready.
  Read responses carry ``error`` for addresses in ``rd_error`` and ``poison`` for those in
  ``poison``; write responses carry ``error`` for addresses in ``wr_error``.
- ``sample``: a request accepted this cycle must address a line below ``capacity``; a write
  must have all 64 byte enables and no poison, lands in ``mem`` at once (later reads see
  it) and is acknowledged after a random latency (``wr_lat`` if given, else ``lat``); a
  read returns the line as of its acceptance after a random latency ``lat``.
- ``power_fail(rng)``: every write not yet acknowledged is torn (each 8-byte word old or
  new) and nothing in flight is answered any more.

Trace: ``writes`` holds ``[addr, accept cycle, response cycle or None, data]`` per write,
``reads`` ``(addr, accept cycle)`` per read, ``read_answers`` ``(addr, cycle)`` per read
response taken, in the order they were taken, ``events`` ``(cycle, "w" | "a" | "r", addr)``
for write accepted / write acknowledged / read accepted, in order. ``prng`` (a
``random.Random``) drives every random choice, so a seed replays a run.

``read_stream(ctx, dut, out, mm, prng, fields, ...)``: one run of an array reader (LineReader,
ElementReader: ``start`` / ``busy`` / ``abort`` and an output stream ``out``) against ``mm``.
"""
from __future__ import annotations

from dataclasses import dataclass

WORD = (1 << 64) - 1
ALL_BYTES = (1 << 64) - 1


@dataclass
class _InFlight:
    due: int
    kind: str                   # "rd_rsp" or "wr_rsp"
    ctx: int
    addr: int
    data: int                   # a read: the line returned; a write: the line's previous value
    write: list | None = None   # a write: its ``writes`` trace entry


class MemModel:
    """One client port's memory; see the module docstring."""

    def __init__(self, port, mem: dict, prng, *, capacity: int, ready_p: float = 0.75, lat=(2, 25),
                 wr_lat=None, rsp_p: float = 1.0, rd_error=(), wr_error=(), poison=()):
        self.port, self.mem, self.prng, self.capacity = port, mem, prng, capacity
        self.ready_p, self.lat, self.wr_lat, self.rsp_p = ready_p, lat, wr_lat, rsp_p
        self.rd_error, self.wr_error, self.poison = set(rd_error), set(wr_error), set(poison)
        self.pending: list[_InFlight] = []
        self.writes: list[list] = []
        self.reads: list[tuple[int, int]] = []
        self.read_answers: list[tuple[int, int]] = []
        self.events: list[tuple[int, str, int]] = []

    def outstanding_writes(self) -> int:
        return sum(e.kind == "wr_rsp" for e in self.pending)

    def drive(self, ctx, cycle: int) -> None:
        p = self.port
        ctx.set(p.req.ready, int(self.prng.random() < self.ready_p))
        for kind in ("rd_rsp", "wr_rsp"):
            ch = getattr(p, kind)
            due = [e for e in self.pending if e.kind == kind and e.due <= cycle]
            if due and (self.rsp_p >= 1 or self.prng.random() < self.rsp_p):
                e = self.prng.choice(due)
                ctx.set(ch.valid, 1)
                ctx.set(ch.payload.ctx, e.ctx)
                if kind == "rd_rsp":
                    ctx.set(ch.payload.data, e.data)
                    ctx.set(ch.payload.error, int(e.addr in self.rd_error))
                    ctx.set(ch.payload.poison, int(e.addr in self.poison))
                else:
                    ctx.set(ch.payload.error, int(e.addr in self.wr_error))
                if ctx.get(ch.ready):
                    self.pending.remove(e)
                    if kind == "wr_rsp":
                        e.write[2] = cycle
                        self.events.append((cycle, "a", e.addr))
                    else:
                        self.read_answers.append((e.addr, cycle))
            else:
                ctx.set(ch.valid, 0)

    def sample(self, ctx, cycle: int) -> None:
        p = self.port
        if not (ctx.get(p.req.valid) and ctx.get(p.req.ready)):
            return
        addr = ctx.get(p.req.payload.addr)
        rctx = ctx.get(p.req.payload.ctx)
        assert addr < self.capacity, f"line {addr:#x} outside device memory"
        lat = self.prng.randint(*self.lat)
        old = self.mem.get(addr, 0)
        if ctx.get(p.req.payload.write):
            if self.wr_lat:
                lat = self.prng.randint(*self.wr_lat)
            assert ctx.get(p.req.payload.strb) == ALL_BYTES
            assert ctx.get(p.req.payload.poison) == 0
            data = ctx.get(p.req.payload.data)
            self.mem[addr] = data
            w = [addr, cycle, None, data]
            self.writes.append(w)
            self.pending.append(_InFlight(cycle + lat, "wr_rsp", rctx, addr, old, w))
            self.events.append((cycle, "w", addr))
        else:
            self.reads.append((addr, cycle))
            self.pending.append(_InFlight(cycle + lat, "rd_rsp", rctx, addr, old))
            self.events.append((cycle, "r", addr))

    def power_fail(self, rng) -> None:
        """Unacknowledged writes: each 8-byte word old or new (later writes tear over earlier)."""
        for e in self.pending:
            if e.kind == "wr_rsp":
                new = self.mem[e.addr]
                self.mem[e.addr] = sum(((new if rng.random() < 0.5 else e.data) >> 64 * w & WORD) << 64 * w
                                       for w in range(8))
        self.pending.clear()


async def read_stream(ctx, dut, out, mm, prng, fields: dict, cycle: int, abort_after=None, out_ready_p=1.0,
                      take=None, every_cycle=None, max_cycles=5000):
    """Start ``dut`` with ``fields`` (signal name -> value: ``base``, ``count`` ...), then run
    until ``busy`` falls: ``out.ready`` high with probability ``out_ready_p``, ``abort`` held
    once ``abort_after`` items were taken, ``mm`` driven and sampled, ``every_cycle(ctx)``
    called (its own checks). Returns (items taken, in order: ``take(ctx)`` or the payload;
    cycles while busy; the cycle count after). Fails when busy lasts ``max_cycles``."""
    assert not ctx.get(dut.busy)
    for name, value in fields.items():
        ctx.set(getattr(dut, name), value)
    ctx.set(dut.start, 1)
    await ctx.tick()
    cycle += 1
    ctx.set(dut.start, 0)
    items, n = [], 0
    while ctx.get(dut.busy):
        ctx.set(dut.abort, int(abort_after is not None and len(items) == abort_after))
        ctx.set(out.ready, int(prng.random() < out_ready_p))
        mm.drive(ctx, cycle)
        mm.sample(ctx, cycle)
        if every_cycle is not None:
            every_cycle(ctx)
        if ctx.get(out.valid) and ctx.get(out.ready):
            items.append(take(ctx) if take is not None else ctx.get(out.payload))
        await ctx.tick()
        cycle += 1
        n += 1
        assert n < max_cycles, f"busy for {max_cycles} cycles"
    ctx.set(dut.abort, 0)
    return items, n, cycle
