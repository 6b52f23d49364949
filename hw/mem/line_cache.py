"""LineCache: a direct-mapped read cache of 64-byte lines in front of one memory client port.

Ports
- ``client``: In(client_port_signature(addr_bits, ctx_bits)) (hw/mem/arbiter.py): the client
  sends reads and writes as it would to the memory subsystem and gets the same responses.
- ``mem``: Out(client_port_signature(addr_bits, ctx_bits)): to the memory subsystem. ``ctx``
  passes unchanged; write responses pass straight through.
- ``flush``: In(1), a pulse: a read accepted in the flush's cycle or later never returns a
  line cached before it.
- ``hit`` / ``miss``: Out(1), one pulse per read answered on chip / sent to ``mem``.

Behaviour. ``lines`` entries (a power of two); a line lives in entry ``addr % lines``. A read
of a cached line (a hit) is answered from on-chip memory and never reaches ``mem``; a read
that misses goes to ``mem``, and its response, passed to the client, is also written into the
entry (installed), unless it came back with error or poison, or its entry has changed owner
since the miss (below). A write goes to ``mem`` and invalidates its line's entry. So a read
returns what the memory would: the cache holds only data of reads that no later write through
this port, and no flush, has overtaken. Writes through other ports are not seen: the owner of
the port flushes whenever other agents may have written (the lookup engine at every LOOKUP
command; nothing writes the tables while one runs).

Ownership. Each entry's owner record names the ``ctx`` and line of the last miss to it (a write
clears it); a miss's line is kept in a table indexed by its ``ctx``. A response installs while
the owner record still names its ``ctx``, or while its miss is clean: no write has been sent
and no flush taken since the miss was sent (one bit per ``ctx``), so the response is the line's
current value even though a later miss to another line took the entry over. A response of a
read that a write has followed never installs. (Without the clean rule, two hot lines sharing
an entry take it from each other at every miss and neither installs.) Assumes the client has at
most one read per ``ctx`` outstanding (it reuses a ``ctx`` only after its response arrived), as
the lookup unit does (``ctx`` = reorder slot).

Parking (``park_depth`` > 0). A read of a line whose miss is still in flight (the owner record
names the line, its miss not answered yet) does not go to memory again: it waits in a FIFO of
``park_depth`` reads (with the owner's ``ctx`` and a one-bit epoch of that ``ctx``'s misses, so
a reuse of the ``ctx`` for another miss is not mistaken for the one awaited) and is replayed
through the tag stage, oldest first, ahead of the client's requests, once the miss it waits for
has been answered or a write waits. A replay never parks again: it hits once the line is
installed, else goes to memory, so a parked read waits for one miss at most. A hot line is then
read from the memory once, not once per read issued during the miss's latency. A write is
taken only when no read is parked: reads before a write in the client's order reach the memory
before it.

Flush and reset. Tag and owner records carry a generation (GEN_BITS); a flush increments it, so
older records stop matching at once. When the generation wraps, and after a reset (on-chip
memories keep their contents through one), a sweep clears every record, one entry per cycle;
while it runs every read misses and nothing is installed.

Timing. One request per cycle (new or replayed). A request spends a cycle in the tag stage (the
tag, data and owner memories' synchronous reads, registered at acceptance); then a hit waits for
the hit register, a miss or write for ``mem.req``, a parked read for nothing. A hit is answered
2 cycles after acceptance; a miss reaches ``mem`` 1 cycle later than without the cache. Hits
and memory responses share ``client.rd_rsp``: when both wait they take turns. An install
happens 2 cycles after its response was passed on.

Memories (FPGA rules, issue 13): data ``lines`` x 512 and tags ``lines`` x (addr_bits - log2
lines + 1 + GEN_BITS): one write port (tags: sweep, then write invalidation, then install; an
install that loses is dropped) and one synchronous read each: block RAM. Owners ``lines`` x
(ctx_bits + tag + 1 + GEN_BITS), two replicas written together (sweep, then the tag stage), one
synchronous read each (the tag stage, the install path): block RAM. Miss lines 2**ctx_bits x
addr_bits: one write, one asynchronous read: LUT RAM. The park FIFO: ``park_depth`` x (2 *
ctx_bits + addr_bits + 1) LUT RAM. Per ``ctx`` (flip-flops, 2**ctx_bits each): outstanding, epoch
and clean bits. Same-cycle hazards are explicit: a tag read that a same-cycle tag write
made stale is not trusted (the request does not hit), an owner record written in the tag read's
cycle is taken from the write (bypass register), and an owned install whose owner read raced an
owner write is dropped; no transparent ports.
"""
from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import data, memory, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from ..common.cxl_mem import LINE_BITS
from .arbiter import client_port_signature


class LineCache(wiring.Component):
    GEN_BITS = 8

    def __init__(self, *, addr_bits: int, ctx_bits: int, lines: int = 1024, park_depth: int = 16):
        assert lines >= 2 and lines & (lines - 1) == 0, "lines: a power of two"
        assert addr_bits > (lines - 1).bit_length(), "the cache must be smaller than the memory"
        assert park_depth >= 0
        self.addr_bits = addr_bits
        self.ctx_bits = ctx_bits
        self.lines = lines
        self.park_depth = park_depth
        self.index_bits = (lines - 1).bit_length()
        self.tag_bits = addr_bits - self.index_bits
        super().__init__({
            "client": In(client_port_signature(addr_bits, ctx_bits)),
            "mem": Out(client_port_signature(addr_bits, ctx_bits)),
            "flush": In(1),
            "hit": Out(1),
            "miss": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        ib, G = self.index_bits, self.GEN_BITS
        tag_layout = data.StructLayout({"valid": 1, "gen": G, "tag": self.tag_bits})
        owner_layout = data.StructLayout({"valid": 1, "gen": G, "ctx": self.ctx_bits, "tag": self.tag_bits})

        m.submodules.data = data_mem = memory.Memory(shape=LINE_BITS, depth=self.lines, init=[])
        m.submodules.tags = tag_mem = memory.Memory(shape=tag_layout, depth=self.lines, init=[])
        # Two replicas of the owner records, written together: one read port each.
        m.submodules.owners = owner_mem = memory.Memory(shape=owner_layout, depth=self.lines, init=[])
        m.submodules.owners_t = owner_t_mem = memory.Memory(shape=owner_layout, depth=self.lines, init=[])
        m.submodules.miss_lines = miss_mem = memory.Memory(shape=self.addr_bits, depth=1 << self.ctx_bits,
                                                           init=[])
        data_w, data_r = data_mem.write_port(), data_mem.read_port()
        tag_w, tag_r = tag_mem.write_port(), tag_mem.read_port()
        owner_w, owner_r = owner_mem.write_port(), owner_mem.read_port()
        owner_tw, owner_tr = owner_t_mem.write_port(), owner_t_mem.read_port()
        m.d.comb += [owner_tw.addr.eq(owner_w.addr), owner_tw.data.eq(owner_w.data), owner_tw.en.eq(owner_w.en)]
        miss_w, miss_r = miss_mem.write_port(), miss_mem.read_port(domain="comb")

        # ---- generation and sweep -------------------------------------------------------
        gen = Signal(G)
        sweeping = Signal(init=1)        # after reset: the memories hold anything
        sweep_at = Signal(ib)
        with m.If(sweeping):
            m.d.sync += sweep_at.eq(sweep_at + 1)
            with m.If(sweep_at == self.lines - 1):
                m.d.sync += sweeping.eq(0)
        with m.If(self.flush):
            m.d.sync += gen.eq(gen + 1)
            with m.If(gen == (1 << G) - 1):
                m.d.sync += [sweeping.eq(1), sweep_at.eq(0)]

        # Misses in flight, by ctx: set when sent, cleared when their response has passed.
        outstanding = Signal(1 << self.ctx_bits)

        # ---- parked reads (their line's miss is in flight) -------------------------------
        creq, mreq = self.client.req, self.mem.req
        PD = max(self.park_depth, 1)
        cb = self.ctx_bits
        m.submodules.park = park = SyncFIFO(width=2 * cb + self.addr_bits + 1, depth=PD)
        park_ctx, park_owner = park.r_data[:cb], park.r_data[cb:2 * cb]
        park_addr, park_epoch = park.r_data[2 * cb:2 * cb + self.addr_bits], park.r_data[-1]
        # One bit per ctx, flipped by each of its misses: a parked read keeps its owner's, so once
        # the owner ctx has been reused for another miss, the one the read waited for is answered.
        miss_epoch = Signal(1 << cb)
        owner_answered = Signal()
        write_waiting = Signal()         # the client offers a write: parked reads go first
        replay = Signal()                # the tag stage takes the oldest parked read
        take = Signal()                  # the tag stage takes a request this cycle
        m.d.comb += [
            write_waiting.eq(creq.valid & creq.payload.write),
            # The oldest parked read goes first once the miss it waits for has been answered
            # (it will hit unless that response was not installed), or when a write waits.
            owner_answered.eq(~outstanding.bit_select(park_owner, 1) |
                              (miss_epoch.bit_select(park_owner, 1) != park_epoch)),
            replay.eq(park.r_rdy & (owner_answered | write_waiting)),
        ]

        # ---- tag stage ------------------------------------------------------------------
        s1_valid = Signal()
        s1 = Signal.like(creq.payload)
        s1_stale = Signal()              # its tag read is not to be trusted (see below)
        s1_first = Signal()              # its first cycle in the stage: the decision is taken
        s1_hit = Signal()                # the decision, held while the request waits
        s1_park = Signal()
        s1_replayed = Signal()           # it comes from the park FIFO: it does not park again
        s1_index = s1.addr[:ib]
        hit_valid = Signal()             # the hit register (-> client.rd_rsp)
        hit_drain = Signal()
        is_hit = Signal()
        is_park = Signal()
        s1_go = Signal()
        tq = tag_r.data
        owner_byp = Signal()             # the owner record was written in the acceptance cycle
        owner_byp_data = Signal(owner_layout)
        pq = Signal(owner_layout)
        m.d.comb += pq.eq(Mux(owner_byp, owner_byp_data, owner_tr.data))
        read_ok = ~s1.write & ~sweeping
        hit_now = read_ok & ~s1_stale & tq.valid & (tq.gen == gen) & (tq.tag == s1.addr[ib:])
        # Its line's miss is in flight: wait for its install (unless a write waits behind it, or it
        # is a replay: it has waited once).
        park_now = (read_ok & ~hit_now & pq.valid & (pq.gen == gen) & (pq.tag == s1.addr[ib:]) &
                    outstanding.bit_select(pq.ctx, 1) & park.w_rdy & ~write_waiting & ~s1_replayed)
        if not self.park_depth:
            park_now = 0
        # Decided in the request's first cycle and held: mreq.valid must not fall while it waits.
        m.d.comb += [is_hit.eq(Mux(s1_first, hit_now, s1_hit)), is_park.eq(Mux(s1_first, park_now, s1_park))]
        with m.If(s1_valid & ~s1_go):
            m.d.sync += [s1_first.eq(0), s1_hit.eq(is_hit), s1_park.eq(is_park)]
        send = ~is_hit & ~is_park
        m.d.comb += [
            mreq.valid.eq(s1_valid & send),
            mreq.payload.eq(s1),
            s1_go.eq(s1_valid & Mux(is_hit, ~hit_valid | hit_drain, is_park | mreq.ready)),
            take.eq(~s1_valid | s1_go),
            park.w_en.eq(s1_valid & is_park),
            park.w_data.eq(Cat(s1.ctx, pq.ctx, s1.addr, miss_epoch.bit_select(pq.ctx, 1))),
            park.r_en.eq(take & replay),
            # A write waits until every read parked before it has left (program order).
            creq.ready.eq(take & ~replay & (~creq.payload.write | ((park.level == 0) & ~park.w_en))),
            self.hit.eq(s1_go & is_hit),
            self.miss.eq(s1_go & send & ~s1.write),
        ]
        in_addr = Signal(self.addr_bits)
        m.d.comb += [
            in_addr.eq(Mux(replay, park_addr, creq.payload.addr)),
            tag_r.addr.eq(in_addr[:ib]), data_r.addr.eq(in_addr[:ib]), owner_tr.addr.eq(in_addr[:ib]),
            tag_r.en.eq(take), data_r.en.eq(take), owner_tr.en.eq(take),
        ]
        with m.If(take):
            # A tag written in the acceptance cycle was read stale (during a sweep: anything);
            # an owner record written then is taken from the write (bypass).
            m.d.sync += [s1_first.eq(1),
                         s1_stale.eq(sweeping | (tag_w.en & (tag_w.addr == in_addr[:ib]))),
                         owner_byp.eq(owner_w.en & (owner_w.addr == in_addr[:ib])), owner_byp_data.eq(owner_w.data)]
            m.d.sync += s1_replayed.eq(replay)
            with m.If(replay):
                m.d.sync += [s1_valid.eq(1), s1.eq(0), s1.ctx.eq(park_ctx), s1.addr.eq(park_addr)]
            with m.Else():
                m.d.sync += [s1_valid.eq(creq.valid & creq.ready), s1.eq(creq.payload)]
        hit_data = Signal(LINE_BITS)
        hit_ctx = Signal(self.ctx_bits)
        with m.If(s1_go & is_hit):
            m.d.sync += [hit_valid.eq(1), hit_data.eq(data_r.data), hit_ctx.eq(s1.ctx)]
        with m.Elif(hit_drain):
            m.d.sync += hit_valid.eq(0)

        miss_go = s1_go & send & ~s1.write
        write_go = s1_go & s1.write
        m.d.comb += [miss_w.addr.eq(s1.ctx), miss_w.data.eq(s1.addr), miss_w.en.eq(miss_go)]

        # ---- read responses: hits and memory responses take turns -----------------------
        crsp, mrsp = self.client.rd_rsp, self.mem.rd_rsp
        hit_turn = Signal()              # when both wait: 1 = the hit goes first
        take_hit = Signal()
        m.d.comb += [
            take_hit.eq(hit_valid & (~mrsp.valid | hit_turn)),
            crsp.valid.eq(hit_valid | mrsp.valid),
            crsp.payload.data.eq(Mux(take_hit, hit_data, mrsp.payload.data)),
            crsp.payload.ctx.eq(Mux(take_hit, hit_ctx, mrsp.payload.ctx)),
            crsp.payload.poison.eq(~take_hit & mrsp.payload.poison),
            crsp.payload.error.eq(~take_hit & mrsp.payload.error),
            mrsp.ready.eq(crsp.ready & ~take_hit),
            hit_drain.eq(take_hit & crsp.ready),
        ]
        with m.If(hit_valid & mrsp.valid & crsp.ready):
            m.d.sync += hit_turn.eq(~hit_turn)
        cw, mw = self.client.wr_rsp, self.mem.wr_rsp
        m.d.comb += [cw.valid.eq(mw.valid), cw.payload.eq(mw.payload), mw.ready.eq(cw.ready)]

        # ---- install: F0 = the response passes (owner read), F1 = tag + data write -------
        m_fire = mrsp.valid & mrsp.ready
        m.d.comb += miss_r.addr.eq(mrsp.payload.ctx)
        f0_line = miss_r.data
        f1_valid = Signal()
        f1_cancel = Signal()             # the owner read raced an owner write to its entry
        f1_line = Signal(self.addr_bits)
        f1_ctx = Signal(self.ctx_bits)
        f1_data = Signal(LINE_BITS)
        m.d.comb += owner_r.addr.eq(f0_line[:ib])
        m.d.sync += [
            f1_valid.eq(m_fire & ~mrsp.payload.error & ~mrsp.payload.poison),
            f1_cancel.eq(owner_w.en & (owner_w.addr == f0_line[:ib])),
            f1_line.eq(f0_line), f1_ctx.eq(mrsp.payload.ctx), f1_data.eq(mrsp.payload.data),
        ]
        # A miss counts as in flight until the cycle after its install (F2): a read whose tag
        # read raced the install (stale) parks once more instead of missing again.
        # a response passed (error or poison included)
        f1_fired, f2_fired = Signal(name="f1_fired"), Signal(name="f2_fired")
        f2_ctx = Signal(self.ctx_bits)
        m.d.sync += [f1_fired.eq(m_fire), f2_fired.eq(f1_fired), f2_ctx.eq(f1_ctx)]
        sent_mask, done_mask = Signal.like(outstanding), Signal.like(outstanding)
        with m.If(miss_go):
            m.d.comb += sent_mask.eq(1 << s1.ctx)
        with m.If(f2_fired):
            m.d.comb += done_mask.eq(1 << f2_ctx)
        m.d.sync += [outstanding.eq((outstanding & ~done_mask) | sent_mask), miss_epoch.eq(miss_epoch ^ sent_mask)]
        oq = owner_r.data
        install = Signal()
        # A miss is clean while no write has been sent and no flush taken since it was sent: its
        # response is the line's current value whoever owns the entry now (a later miss to another
        # line took it over: installing then spares the reads parked on this one a second miss).
        clean = Signal.like(outstanding)
        with m.If(write_go | self.flush):
            m.d.sync += clean.eq(0)
        with m.Else():
            m.d.sync += clean.eq(clean | sent_mask)
        owned = ~f1_cancel & oq.valid & (oq.gen == gen) & (oq.ctx == f1_ctx)
        m.d.comb += install.eq(f1_valid & ~sweeping & ~write_go & (owned | clean.bit_select(f1_ctx, 1)))
        m.d.comb += [data_w.addr.eq(f1_line[:ib]), data_w.data.eq(f1_data), data_w.en.eq(install)]

        # ---- tag and owner writes (one port each) ----------------------------------------
        new_tag = Signal(tag_layout)
        new_owner = Signal(owner_layout)
        m.d.comb += [new_tag.valid.eq(1), new_tag.gen.eq(gen), new_tag.tag.eq(f1_line[ib:]),
                     new_owner.valid.eq(1), new_owner.gen.eq(gen), new_owner.ctx.eq(s1.ctx),
                     new_owner.tag.eq(s1.addr[ib:])]
        with m.If(sweeping):
            m.d.comb += [tag_w.addr.eq(sweep_at), tag_w.data.eq(0), tag_w.en.eq(1),
                         owner_w.addr.eq(sweep_at), owner_w.data.eq(0), owner_w.en.eq(1)]
        with m.Elif(write_go):
            m.d.comb += [tag_w.addr.eq(s1_index), tag_w.data.eq(0), tag_w.en.eq(1),
                         owner_w.addr.eq(s1_index), owner_w.data.eq(0), owner_w.en.eq(1)]
        with m.Else():
            m.d.comb += [tag_w.addr.eq(f1_line[:ib]), tag_w.data.eq(new_tag), tag_w.en.eq(install),
                         owner_w.addr.eq(s1_index), owner_w.data.eq(new_owner), owner_w.en.eq(miss_go)]
        return m

