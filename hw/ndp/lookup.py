"""LookupEngine: executes LOOKUP commands (pooled embedding vectors, bit-exact with PyTorch).

Ports
- ``ctl``: In(engine_control_signature()) (hw/ndp/command.py): ``start`` / ``cmd`` /
  table-descriptor reads in, ``done`` / ``error`` / ``error_info`` / ``stats`` out.
- ``feed_mem``: Out(client_port_signature(addr_bits, feed_ctx_bits)): the feeder's reads of
  the offsets, indices and weights arrays.
- ``unit_mem[u]``, u = 0..units-1: Out(client_port_signature(addr_bits, unit_ctx_bits)):
  each reduce unit's row reads and device-memory output writes. Giving every unit its own
  port lets the memory subsystem take several lines per cycle (hw/mem/interleave.py).
- ``push``: Out(cache_port_signature()): the units' PUSH requests, merged round robin;
  ``id`` = ``id_base`` + unit index (responses route back by it).

Structure: a LookupFeeder (hw/ndp/lookup_feeder.py) validates the arrays and emits one work
item per index occurrence, a whole bag to one of the units' ``contexts`` bag contexts (feeder
slot ``c * units + u`` is unit u's context c, so consecutive bags go to different units); each
unit (hw/ndp/lookup_unit.py) has an item FIFO of ``item_depth`` entries per context (and a skid
buffer behind it, so the FIFO's read enable is a flip-flop), its reorder
buffer, 16 FMA lanes and its output path. Bags are independent, so units finish them in any
order; each pooled vector has its own address. ``done`` comes after the feeder is done and
every unit is idle (all outputs durable in device memory or acknowledged by the host), so
the host may read them at once; the idle is registered, so ``done`` follows it by a cycle.
Each unit's requests enter its row cache (below) through a register slice (a cycle).

Row cache (``cache_lines`` > 0): each unit's port goes through a LineCache
(hw/mem/line_cache.py) of ``cache_lines`` 64-byte lines, direct mapped, flushed at every
command's ``start``. Rows that repeat within a batch (Zipf-hot rows) are then read from the
media once per unit and cache entry instead of once per occurrence. Results are unchanged: a
read returns what the memory would (the tables do not change during a LOOKUP, and the unit's
own output writes invalidate their lines). ``stats.lines_read`` counts the lines that reach
the memory subsystem, ``stats.cache_hits`` the row lines served on chip.

Errors: the feeder's (OFFSETS, ADDRESS, INDEX_RANGE, BAD_DESCRIPTOR) win, then MEDIA (a
read answered with error or poison), then CACHE (a push answered with an error). LOOKUP
writes no table, so a failed command leaves the tables untouched; vectors of bags before
the failure may have been written.
"""
from amaranth import Module, Signal, Mux, Cat
from amaranth.lib import fifo, wiring
from amaranth.lib.wiring import In, Out

from ..common.stream_util import RegisterSlice, RoundRobinArbiter, SkidBuffer
from ..cxl_controller.cache_port import cache_port_signature, CacheReq
from ..mem.arbiter import client_port_signature
from ..mem.line_cache import LineCache
from .command import engine_control_signature, NdpError
from .lookup_feeder import LookupFeeder
from .lookup_unit import LookupUnit


class LookupEngine(wiring.Component):
    def __init__(self, *, addr_bits: int, capacity_lines: int, units: int = 4, item_depth: int = 128,
                 rob_depth: int = 128, id_base: int = 0, fp32_pipeline: str = "compact", cache_lines: int = 0,
                 contexts: int = 2):
        self.units = units
        self.contexts = contexts
        self.cache_lines = cache_lines
        self.id_base = id_base
        self.item_depth = item_depth
        self._feeder = LookupFeeder(addr_bits=addr_bits, capacity_lines=capacity_lines, units=contexts * units)
        self._units = [LookupUnit(addr_bits=addr_bits, item_layout=self._feeder.item_layout, unit_id=id_base + u,
                                  rob_depth=rob_depth, fp32_pipeline=fp32_pipeline, contexts=contexts)
                       for u in range(units)]
        self.feed_ctx_bits = self._feeder.ctx_bits
        self.unit_ctx_bits = self._units[0].ctx_bits
        self._caches = [LineCache(addr_bits=addr_bits, ctx_bits=self.unit_ctx_bits, lines=cache_lines)
                        for _ in range(units)] if cache_lines else []
        super().__init__({
            "ctl": In(engine_control_signature()),
            "feed_mem": Out(client_port_signature(addr_bits, self.feed_ctx_bits)),
            "unit_mem": Out(client_port_signature(addr_bits, self.unit_ctx_bits)).array(units),
            "push": Out(cache_port_signature()),
        })

    def elaborate(self, platform):
        m = Module()
        ctl = self.ctl
        m.submodules.feeder = feeder = self._feeder
        wiring.connect(m, feeder.mem, wiring.flipped(self.feed_mem))
        m.d.comb += [feeder.start.eq(ctl.start), feeder.cmd.eq(ctl.cmd), feeder.table.eq(ctl.table),
                     ctl.table_index.eq(feeder.table_index)]

        m.submodules.push_arb = push_arb = RoundRobinArbiter(CacheReq, self.units)
        wiring.connect(m, push_arb.o, wiring.flipped(self.push.req))
        prsp = self.push.rsp
        m.d.comb += prsp.ready.eq(1)      # units always take their push responses
        items_ready = Signal()
        unit_idle = []
        media_error = []
        cache_error = []
        width = feeder.item_layout.size
        for u, unit in enumerate(self._units):
            m.submodules[f"unit{u}"] = unit
            queues_empty = []
            for c in range(self.contexts):   # the unit's bag contexts: feeder slot c * units + u
                q = fifo.SyncFIFOBuffered(width=width, depth=self.item_depth)
                m.submodules[f"items{u}_{c}"] = q
                # A skid buffer between the FIFO and the unit: the FIFO's read enable is a
                # flip-flop, not the end of the unit's issue logic (context choice, row
                # end, reorder-buffer room, memory ready: 18 LUT levels into the FIFO's
                # level). Full rate, no added latency.
                m.submodules[f"items{u}_{c}_skid"] = skid = SkidBuffer(feeder.item_layout)
                slot = c * self.units + u
                mine = feeder.items.payload.unit == slot
                m.d.comb += [
                    q.w_en.eq(feeder.items.valid & mine), q.w_data.eq(feeder.items.payload),
                    skid.i.valid.eq(q.r_rdy), skid.i.payload.eq(q.r_data), q.r_en.eq(skid.i.ready),
                    feeder.unit_room[slot].eq(q.level < self.item_depth // 2),
                ]
                wiring.connect(m, skid.o, unit.items[c])
                with m.If(mine):
                    m.d.comb += items_ready.eq(q.w_rdy)
                queues_empty.append((q.level == 0) & ~skid.o.valid)
            m.d.comb += [unit.out_to_host.eq(ctl.cmd.flags.out_to_host), unit.clear.eq(ctl.start)]
            if self._caches:             # the row cache: forgotten at every command (tables may have changed)
                m.submodules[f"cache{u}"] = cache = self._caches[u]
                # The unit's requests enter the cache through a register slice (a cycle): the
                # cache's ready follows its tag stage's decision and a waiting write, and its
                # memory request's valid a waiting write (no parking then), so the unit's issue
                # logic ran through the cache both ways: into the unit's output FIFO (18 LUT
                # levels) and into the memory port's slice (14).
                m.submodules[f"cache{u}_slice"] = req_slice = RegisterSlice(unit.mem.req.payload.shape())
                wiring.connect(m, unit.mem.req, req_slice.i)
                wiring.connect(m, req_slice.o, cache.client.req)
                wiring.connect(m, cache.client.rd_rsp, unit.mem.rd_rsp)
                wiring.connect(m, cache.client.wr_rsp, unit.mem.wr_rsp)
                wiring.connect(m, cache.mem, wiring.flipped(self.unit_mem[u]))
                m.d.comb += cache.flush.eq(ctl.start)
            else:
                wiring.connect(m, unit.mem, wiring.flipped(self.unit_mem[u]))
            wiring.connect(m, unit.push.req, push_arb.inputs[u])
            m.d.comb += [unit.push.rsp.valid.eq(prsp.valid & (prsp.payload.id == self.id_base + u)),
                         unit.push.rsp.payload.eq(prsp.payload)]
            unit_idle.append(unit.idle & Cat(*queues_empty).all())
            media_error.append(unit.media_error)
            cache_error.append(unit.cache_error)
        m.d.comb += feeder.items.ready.eq(items_ready)

        # ---- per-command counters (every port's handshakes) ----------------------------
        stats = ctl.stats
        ports = [self.feed_mem] + list(self.unit_mem)
        reads = sum((p.req.valid & p.req.ready & ~p.req.payload.write) for p in ports)
        writes = sum((p.req.valid & p.req.ready & p.req.payload.write) for p in self.unit_mem)
        hits = sum(c.hit for c in self._caches) if self._caches else 0
        with m.If(ctl.start):
            m.d.sync += [stats.lines_read.eq(0), stats.lines_written.eq(0), stats.lines_pushed.eq(0),
                         stats.cache_hits.eq(0)]
        with m.Else():
            m.d.sync += [stats.lines_read.eq(stats.lines_read + reads), stats.cache_hits.eq(stats.cache_hits + hits),
                         stats.lines_written.eq(stats.lines_written + writes),
                         stats.lines_pushed.eq(stats.lines_pushed + (self.push.req.valid & self.push.req.ready))]
        m.d.comb += [stats.lookups.eq(feeder.lookups), stats.rows_read.eq(feeder.lookups),
                     stats.rows_written.eq(0), stats.unique_rows.eq(0)]

        # ---- completion ------------------------------------------------------------------
        busy = Signal()
        fed = Signal()
        feed_error = Signal(NdpError)
        feed_info = Signal(32)
        with m.If(ctl.start):
            m.d.sync += [busy.eq(1), fed.eq(0)]
        with m.If(feeder.done):
            m.d.sync += [fed.eq(1), feed_error.eq(feeder.error), feed_info.eq(feeder.error_info)]
        # The units' idle, registered: it is the end of each unit's output FIFO level and
        # counters, and ``done`` with its error code went on into the command processor's
        # completion (12 LUT levels). ``fed_settled``: the feeder finished a cycle before
        # ``fed``, so its last item is in a queue (not idle) by the time ``all_idle_q`` looks;
        # once the feeder is done every unit that is idle stays idle. One cycle per command.
        all_idle_q = Signal()
        fed_settled = Signal()
        m.d.sync += [all_idle_q.eq(sum(unit_idle) == self.units), fed_settled.eq(fed & ~ctl.start)]
        any_media = Signal()
        any_cache = Signal()
        m.d.comb += [any_media.eq(sum(media_error) != 0), any_cache.eq(sum(cache_error) != 0)]
        with m.If(busy & fed_settled & all_idle_q):
            m.d.sync += busy.eq(0)
            m.d.comb += [
                ctl.done.eq(1),
                ctl.error.eq(Mux(feed_error != NdpError.OK, feed_error,
                                 Mux(any_media, NdpError.MEDIA, Mux(any_cache, NdpError.CACHE, NdpError.OK)))),
                ctl.error_info.eq(feed_info),
            ]
        m.d.comb += ctl.busy.eq(busy)
        return m
