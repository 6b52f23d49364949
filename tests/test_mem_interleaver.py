"""MemoryInterleaver (hw/mem/interleave.py) with several client ports in Amaranth's simulator.

Every channel is answered by a Python AXI4 subordinate: random ready, random latency, R beats
out of order across ARIDs, B in order (the masters use AWID 0), a read's data taken when its
AR is accepted and a write applied only when its B is accepted (the latest AXI allows, so a
missing read-after-write wait would show). Checks: each request gets exactly one response, on
its own port with its own ctx; read data is the line's state after the last write accepted
before the read (or newer), across ports in acceptance order (a request is accepted when it
leaves its port's register slice, i.e. its channel grants it; in program order per port); the media end up in the
reference state under the device's line-to-channel mapping (hw/mem/port.py); several
requests enter per cycle; a read after a full-line write is forwarded from the channel's
write buffer (no media read, answered before the write's B), one after a partial write
waits for the media.
"""
import hashlib
import random
from collections import deque

from amaranth.sim import Simulator

from hw.common.axi import AXI_BURST_INCR
from hw.mem.interleave import MemoryInterleaver
from hw.mem.port import split_line_address

CHANNELS = 4
PORTS = 3
ADDR_BITS = 8
CTX_BITS = 10
FULL_STRB = (1 << 64) - 1


def initial_line(channel, local):
    """What the media hold before any write (distinct per channel and local line)."""
    return int.from_bytes(hashlib.sha512(f"{channel}:{local}".encode()).digest(), "little"), 0


def merge(old, data, strb):
    mask = sum(0xFF << (8 * b) for b in range(64) if strb >> b & 1)
    return (old & ~mask) | (data & mask)


class AxiSubordinate:
    """One channel's media: single-beat INCR bursts of 64 bytes."""

    def __init__(self, axi, channel, rng, *, always_ready=False, latency=(1, 12)):
        self.axi, self.channel, self.rng = axi, channel, rng
        self.always_ready, self.latency = always_ready, latency
        self.mem = {}                    # local line -> (data, poison)
        self.reads = []                  # [arid, due, data, poison], any order across ARIDs
        self.r_cur = None
        self.aw, self.w = deque(), deque()
        self.writes = deque()            # [due, local line, data, strb, poison], AWID 0: in order
        self.ar_log, self.b_log = [], []  # (cycle, local line) of each AR / B handshake

    def line(self, local):
        return self.mem.get(local, initial_line(self.channel, local))

    def ready(self):
        return 1 if self.always_ready else int(self.rng.random() < 0.7)

    def drive(self, ctx, now):
        a = self.axi
        ctx.set(a.arready, self.ready())
        ctx.set(a.awready, self.ready())
        ctx.set(a.wready, self.ready())
        if self.r_cur is None:
            due = [r for r in self.reads if r[1] <= now]
            if due and (self.always_ready or self.rng.random() < 0.8):
                self.r_cur = self.rng.choice(due)
                self.reads.remove(self.r_cur)
        ctx.set(a.rvalid, int(self.r_cur is not None))
        if self.r_cur is not None:
            arid, _, data, poison = self.r_cur
            ctx.set(a.rid, arid)
            ctx.set(a.rdata, data)
            ctx.set(a.ruser, poison)
            ctx.set(a.rresp, 0)
            ctx.set(a.rlast, 1)
        b = bool(self.writes) and self.writes[0][0] <= now
        ctx.set(a.bvalid, int(b))
        ctx.set(a.bid, 0)
        ctx.set(a.bresp, 0)

    def sample(self, ctx, now):
        a = self.axi
        if ctx.get(a.arvalid) and ctx.get(a.arready):
            assert ctx.get(a.arlen) == 0 and ctx.get(a.arsize) == 6
            assert ctx.get(a.arburst) == AXI_BURST_INCR
            arid = ctx.get(a.arid)
            assert arid not in [r[0] for r in self.reads] + [self.r_cur and self.r_cur[0]]
            addr = ctx.get(a.araddr)
            assert addr % 64 == 0
            self.ar_log.append((now, addr >> 6))
            # the data is taken now, before any B accepted this cycle is applied
            self.reads.append([arid, now + self.rng.randint(*self.latency), *self.line(addr >> 6)])
        if ctx.get(a.awvalid) and ctx.get(a.awready):
            assert ctx.get(a.awlen) == 0 and ctx.get(a.awsize) == 6 and ctx.get(a.awid) == 0
            self.aw.append(ctx.get(a.awaddr) >> 6)
        if ctx.get(a.wvalid) and ctx.get(a.wready):
            assert ctx.get(a.wlast) == 1
            self.w.append((ctx.get(a.wdata), ctx.get(a.wstrb), ctx.get(a.wuser)))
        if self.r_cur is not None and ctx.get(a.rready):
            self.r_cur = None
        if ctx.get(a.bvalid) and ctx.get(a.bready):
            _, local, data, strb, poison = self.writes.popleft()
            self.b_log.append((now, local))
            self.mem[local] = (merge(self.line(local)[0], data, strb), poison)
        while self.aw and self.w:
            self.writes.append([now + self.rng.randint(*self.latency), self.aw.popleft(),
                                *self.w.popleft()])

    def idle(self):
        return not (self.reads or self.r_cur or self.aw or self.w or self.writes)


def run(seed, *, requests, always_ready=False, latency=(1, 12), read_ids=8, cycles=6000, log=None):
    """``requests[p]``: list of (write, line, data, strb, poison) for port p, in program order.
    Returns per-cycle accepted counts and the check results (asserts on the way). ``log``: a
    dict that receives "responses" [(cycle, port, ctx, kind)] and "media" (the subordinates)."""
    rng = random.Random(seed)
    dut = MemoryInterleaver(channels=CHANNELS, addr_bits=ADDR_BITS, ctx_bits=CTX_BITS,
                            ports=PORTS, read_ids=read_ids, write_depth=4, id_bits=6)
    media = [AxiSubordinate(getattr(dut, f"pmem{c}"), c, rng, always_ready=always_ready,
                            latency=latency) for c in range(CHANNELS)]
    versions = {}                        # line -> [(data, poison), ...] in acceptance order
    outstanding = [dict() for _ in range(PORTS)]   # ctx -> (write, line, first allowed version)
    accepted_per_cycle = []
    responses = [0] * PORTS

    def state(line):
        if line not in versions:
            versions[line] = [initial_line(*split_line_address(line, CHANNELS))]
        return versions[line]

    async def bench(ctx):
        todo = [deque(enumerate(reqs)) for reqs in requests]
        handed = [deque() for _ in requests]      # taken by the port, not yet granted
        offering = [False] * PORTS
        for now in range(cycles):
            for p, c in enumerate(dut.clients):
                # a port keeps valid once raised, until the transfer
                offering[p] = bool(todo[p]) and (offering[p] or always_ready or rng.random() < 0.7)
                ctx.set(c.req.valid, int(offering[p]))
                if offering[p]:
                    k, (w, line, data, strb, poison) = todo[p][0]
                    ctx.set(c.req.payload.write, int(w))
                    ctx.set(c.req.payload.addr, line)
                    ctx.set(c.req.payload.data, data)
                    ctx.set(c.req.payload.strb, strb)
                    ctx.set(c.req.payload.poison, poison)
                    ctx.set(c.req.payload.ctx, k)
                ctx.set(c.rd_rsp.ready, 1 if always_ready else int(rng.random() < 0.7))
                ctx.set(c.wr_rsp.ready, 1 if always_ready else int(rng.random() < 0.7))
            for s in media:
                s.drive(ctx, now)

            channels_used = []
            for p, c in enumerate(dut.clients):
                if offering[p] and ctx.get(c.req.ready):
                    handed[p].append(todo[p].popleft())
                    offering[p] = False
                # granted by its channel: the request leaves the port's register slice (at
                # the earliest in the cycle after its handshake)
                granted = dut.req_slices[p].o
                if ctx.get(granted.valid) and ctx.get(granted.ready):
                    k, (w, line, data, strb, poison) = handed[p].popleft()
                    assert ctx.get(granted.payload.ctx) == k, f"port {p}: requests reordered"
                    channels_used.append(split_line_address(line, CHANNELS)[0])
                    v = state(line)
                    if w:
                        v.append((merge(v[-1][0], data, strb), poison))
                    outstanding[p][k] = (w, line, len(v) - 1)
                for name in ("rd_rsp", "wr_rsp"):
                    ch = getattr(c, name)
                    if ctx.get(ch.valid) and ctx.get(ch.ready):
                        k = ctx.get(ch.payload.ctx)
                        assert k in outstanding[p], f"port {p}: response for ctx {k} not outstanding"
                        w, line, first = outstanding[p].pop(k)
                        assert w == (name == "wr_rsp"), f"port {p} ctx {k}: wrong response kind"
                        assert ctx.get(ch.payload.error) == 0
                        if not w:
                            got = (ctx.get(ch.payload.data), ctx.get(ch.payload.poison))
                            assert got in versions[line][first:], \
                                f"port {p} ctx {k}: line {line} read stale or wrong data"
                        responses[p] += 1
                        if log is not None:
                            log.setdefault("responses", []).append((now, p, k, name))
            assert len(channels_used) == len(set(channels_used)), "two requests to one channel"
            accepted_per_cycle.append(len(channels_used))
            for s in media:
                s.sample(ctx, now)
            await ctx.tick()
            if not any(todo) and not any(handed) and not any(outstanding) and all(s.idle() for s in media):
                break

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()

    for p in range(PORTS):
        assert not outstanding[p], f"port {p}: {len(outstanding[p])} requests without a response"
        assert responses[p] == len(requests[p])
    for line, v in versions.items():
        c, local = split_line_address(line, CHANNELS)
        assert media[c].line(local) == v[-1], f"line {line}: media differ from the reference"
    if log is not None:
        log["media"] = media
    return accepted_per_cycle


def random_requests(rng, n, lines):
    reqs = []
    for _ in range(n):
        w = rng.random() < 0.5
        strb = FULL_STRB if rng.random() < 0.6 else rng.getrandbits(64)
        reqs.append((w, rng.randrange(lines), rng.getrandbits(512), strb,
                     int(rng.random() < 0.1)))
    return reqs


def test_ports_get_their_own_responses_and_current_data():
    for seed in (1, 2, 3):
        rng = random.Random(100 + seed)
        # 16 lines: 4 per channel, so ports keep writing and reading the same lines
        requests = [random_requests(rng, 120, 16) for _ in range(PORTS)]
        accepted = run(seed, requests=requests)
        assert sum(accepted) == PORTS * 120
        assert max(accepted) >= 2, "ports never entered in the same cycle"


def test_several_requests_per_cycle():
    # port p's k-th read goes to channel (p + k) % 4: in lockstep the ports never collide
    n = 300
    requests = [[(False, (4 * k + (p + k) % CHANNELS) % (1 << ADDR_BITS), 0, 0, 0) for k in range(n)]
                for p in range(PORTS)]
    # enough ARIDs to ride out the backlog when two channels answer one port in a cycle
    accepted = run(7, requests=requests, always_ready=True, latency=(2, 20), read_ids=32)
    window = accepted[60:260]          # after the ARID lists are filled
    rate = sum(window) / len(window)
    print(f"accepted requests per cycle: {rate:.2f}")
    assert rate > 1.5


def test_read_after_a_full_write_is_forwarded_after_a_partial_one_waits():
    # port 0: write line 5 (all 64 bytes), read it; write line 9 (some bytes), read it. Both
    # lines are on channel 1 (local lines 1 and 2). Media latency 40-60 cycles.
    rng = random.Random(5)
    full, part = rng.getrandbits(512), rng.getrandbits(512)
    requests = [[(True, 5, full, FULL_STRB, 1), (False, 5, 0, 0, 0),
                 (True, 9, part, 0x00FF_0000_FFFF_0F0F, 0), (False, 9, 0, 0, 0)], [], []]
    log = {}
    run(11, requests=requests, always_ready=True, latency=(40, 60), log=log)
    when = {(k, kind): t for t, p, k, kind in log["responses"]}
    ch1 = log["media"][1]
    assert [local for _, local in ch1.ar_log] == [2], "only the read after the partial write reaches the media"
    # the forwarded read (ctx 1) is answered before its write's B (ctx 0); run() checked its
    # data and poison against the reference (the written line, poison set)
    assert when[(1, "rd_rsp")] < when[(0, "wr_rsp")]
    b_line9 = next(t for t, local in ch1.b_log if local == 2)
    assert ch1.ar_log[0][0] > b_line9, "the read after a partial write waits for that write's B"
