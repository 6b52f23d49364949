"""LookupFeeder: turns a LOOKUP command's TBE arrays into per-row work items for the units.

Ports
- ``start`` (pulse) with ``cmd`` (CommandDescriptor, stable until ``done``); ``table_index``
  -> ``table`` (TableDescriptor, one cycle later) reads the processor's table memory.
- ``items``: Out stream of ``lookup_item_layout``; ``payload.unit`` names the slot the item
  is for (a bag slot: the lookup engine gives each reduce unit ``contexts`` of them, slot
  c * units + u), ``unit_room[s]`` says slot s can take a new bag.
- ``done`` (pulse): every item has been emitted (or the command failed); ``error`` and
  ``error_info`` are valid with it. ``lookups``: ROW items emitted so far.
- ``mem``: reads of the offsets, indices and weights arrays (four ElementReaders behind a
  MemPortArbiter: the offsets stream, offsets[T*B], the indices, the weights; ``ctx_bits``
  is the port's ctx width). ``table_index`` runs one table ahead of the table being fed,
  except in the first table's descriptor read.

Order and contents: bags in TBE order (t*B + b); a bag of L > 0 indices becomes L ROW items
(``first`` on the first, ``last`` on the last) all for one unit, a bag of L = 0 one EMPTY
item (its ``weight`` is 1.0: the next weight in the stream belongs to the next bag). Each
ROW carries the row's first line (``table.base_addr + index * dim/16``), the index's weight
(when the command has weights; else 1.0), the bag's pooling mode and length, and the line
its pooled vector goes to (``out_addr + b * row_pitch_lines + col_lines``).
The feeder emits up to one item per cycle. A bag's end offset is read and its unit chosen
(round robin over the units with room) in the cycle that takes the previous bag's last
item, so a bag of L > 0 indices costs L cycles and an empty bag 1, across table boundaries
too (the next table's descriptor is read while the table before it runs); the first table
costs 2 more. A bag waits a cycle more when its offset is not there yet or no unit has
room. Start-up: offsets[0], offsets[T*B] and the first lines of the indices
(and weights) are read at once, so one read round trip passes before the first item. The
indices and weights streams start only when their ``cmd.index_count`` elements lie inside
device memory (the checks below find the same error either way: past the two OFFSETS
checks offsets[T*B] equals ``cmd.index_count``).

Checks, in stream order (element positions in ``error_info``): OFFSETS when offsets[0] != 0
(``error_info`` 0), offsets[T*B] != ``cmd.index_count`` (T*B), or an offset is below the
previous one or above the last one (``error_info`` = its position); ADDRESS when
the indices or weights array reaches past device memory (AddressFault); INDEX_RANGE when an index
is >= its table's rows (its position in the indices array); BAD_DESCRIPTOR for a MEAN bag
longer than 65535 (the bag number). On an error the feeder stops, closes a half-emitted bag
with an ABORT item (the unit drops it) and drains its readers before ``done``. MEDIA when a
read came back with an error or poison (the items are still emitted).
Assumes the processor checked the tables and the offsets array's range.
"""
from amaranth import Module, Signal, Mux
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out

from ..common.cxl_mem import LINE_ADDR_BITS
from ..common.fp32 import ONE
from ..mem.arbiter import MemPortArbiter, client_port_signature, connect_port
from .command import AddressFault, CommandDescriptor, TableDescriptor, NdpError, PoolMode, TABLE_ID_BITS
from .element_reader import ElementReader

MAX_MEAN_LENGTH = 65535          # the divider takes a 16-bit bag length


class ItemKind(enum.Enum, shape=2):
    ROW = 0                      # read this row, reduce it into the bag
    EMPTY = 1                    # a bag without indices: its pooled vector is +0.0
    ABORT = 2                    # the bag in progress is cancelled (command error)


def lookup_item_layout(addr_bits: int, unit_bits: int) -> data.StructLayout:
    return data.StructLayout({
        "kind": ItemKind,
        "first": 1,
        "last": 1,
        "mode": PoolMode,
        "dim_lines": 5,          # 1..16
        "length": 16,            # bag length (MEAN divides by it)
        "weight": 32,            # fp32
        "row_line": addr_bits,
        "out_line": LINE_ADDR_BITS,
        "unit": unit_bits,
    })


class LookupFeeder(wiring.Component):
    def __init__(self, *, addr_bits: int, capacity_lines: int, units: int, reader_depth: int = 16):
        self.addr_bits = addr_bits
        self.capacity_lines = capacity_lines
        self.units = units
        self.unit_bits = max((units - 1).bit_length(), 1)
        self.item_layout = lookup_item_layout(addr_bits, self.unit_bits)
        self._readers = [ElementReader(addr_bits=addr_bits, depth=reader_depth) for _ in range(3)]
        self._end_reader = ElementReader(addr_bits=addr_bits, depth=2)      # offsets[T*B] alone
        self._arb = MemPortArbiter(clients=4, addr_bits=addr_bits, ctx_bits=self._readers[0].ctx_bits)
        self.ctx_bits = self._arb.ctx_bits + self._arb.client_bits
        super().__init__({
            "start": In(1),
            "cmd": In(CommandDescriptor),
            "table_index": Out(TABLE_ID_BITS),
            "table": In(TableDescriptor),
            "items": Out(stream.Signature(self.item_layout)),
            "unit_room": In(units),
            "done": Out(1),
            "error": Out(NdpError),
            "error_info": Out(32),
            "lookups": Out(32),
            "mem": Out(client_port_signature(addr_bits, self.ctx_bits)),
        })

    def elaborate(self, platform):
        m = Module()
        cmd = self.cmd
        m.submodules.offsets = offs = self._readers[0]
        m.submodules.indices = idxs = self._readers[1]
        m.submodules.weights = wgts = self._readers[2]
        m.submodules.end = end = self._end_reader
        m.submodules.arb = arb = self._arb
        for i, r in enumerate(self._readers):
            wiring.connect(m, r.mem, arb.clients[i])
        connect_port(m, end.mem, arb.clients[3])          # its ctx is narrower: zero-extended
        wiring.connect(m, arb.mem, wiring.flipped(self.mem))
        readers = (offs, idxs, wgts, end)

        nbags = Signal(32)
        bag = Signal(32)                 # bags done
        b = Signal(32)                   # sample within the table
        t = Signal(TABLE_ID_BITS)
        prev = Signal(32)                # offsets[bag]
        off_end = Signal(32)             # offsets[nbags]
        length = Signal(32)
        j = Signal(32)                   # index within the bag
        out_row = Signal(LINE_ADDR_BITS)  # out_addr + b * row_pitch_lines
        tbl = Signal(TableDescriptor)
        unit = Signal(self.unit_bits)
        rr = Signal(self.unit_bits)      # next unit to try
        err = Signal(NdpError)
        err_info = Signal(32)
        half_bag = Signal()              # items of the current bag were emitted
        got_end = Signal()               # offsets[T*B] is in off_end
        got_first = Signal()             # offsets[0] is in prev
        media = Signal()
        cap = self.capacity_lines

        m.d.comb += [offs.base.eq(cmd.offsets_addr), end.base.eq(cmd.offsets_addr), idxs.base.eq(cmd.indices_addr),
                     wgts.base.eq(cmd.weights_addr)]
        with m.If(offs.media_error | idxs.media_error | wgts.media_error | end.media_error):
            m.d.sync += media.eq(1)

        # Round robin over the units with room, starting at rr.
        pick = Signal(self.unit_bits)
        any_room = Signal()
        m.d.comb += any_room.eq(self.unit_room != 0)
        # (A case per value of rr with constant unit numbers: ``(rr + off) % units`` on the
        # signal made Yosys build a divider, 27 LUT levels by `synth --premap`.)
        with m.Switch(rr):
            for r in range(self.units):
                with m.Case(r):
                    for off in reversed(range(self.units)):
                        u = (r + off) % self.units
                        with m.If(self.unit_room[u]):
                            m.d.comb += pick.eq(u)

        def fail(code, info):
            m.d.sync += [err.eq(code), err_info.eq(info)]
            m.next = "ABORT"

        item = self.items.payload
        weight = Mux(cmd.flags.has_weights, wgts.elems.payload, ONE)
        index = idxs.elems.payload
        m.d.comb += [
            item.mode.eq(tbl.mode), item.dim_lines.eq(tbl.dim[4:9]), item.length.eq(length),
            item.weight.eq(weight), item.row_line.eq(tbl.base_addr + index * tbl.dim[4:9]),
            item.out_line.eq(out_row + tbl.col_lines), item.unit.eq(unit),
            item.first.eq(j == 0), item.last.eq(j + 1 == length),
        ]
        # The indices (and weights) arrays' lines, from cmd.index_count: the streams start
        # before offsets[T*B] is known, and CHECK fails unless the two are equal.
        idx_lines = Signal(33)
        m.d.comb += idx_lines.eq((cmd.index_count + 15) >> 4)
        indices_outside = cmd.indices_addr + idx_lines > cap
        weights_outside = cmd.flags.has_weights & (cmd.weights_addr + idx_lines > cap)

        def load_bag(this_bag, mode):
            """Check the end offset of bag ``this_bag`` (the head of the offsets stream; its
            start is ``prev``; its table's pooling ``mode``) and, when a unit has room, make it
            the bag being emitted."""
            o = offs.elems.payload
            with m.If(offs.elems.valid):
                with m.If((o < prev) | (o > off_end)):
                    fail(NdpError.OFFSETS, this_bag + 1)
                with m.Elif((mode == PoolMode.MEAN) & (o - prev > MAX_MEAN_LENGTH)):
                    fail(NdpError.BAD_DESCRIPTOR, this_bag)
                with m.Elif(any_room):
                    m.d.comb += offs.elems.ready.eq(1)
                    m.d.sync += [length.eq(o - prev), j.eq(0), unit.eq(pick),
                                 rr.eq(Mux(pick == self.units - 1, 0, pick + 1)), prev.eq(o)]
                    m.next = "ROWS"
                    with m.If(o == prev):
                        m.next = "EMPTY"

        def next_bag():
            """The bag's last item was taken this cycle: step to the next bag (or table, or
            the end) in the same cycle. The next bag's offset is taken in this cycle too when
            it is there (across a table boundary with the next table's descriptor, which
            table_index has named since this bag began), so a bag costs L cycles (1 for an
            empty bag); else BAG waits for it. Its checks come after every item of this bag,
            as in BAG."""
            m.d.sync += [bag.eq(bag + 1), half_bag.eq(0)]
            with m.If(bag + 1 == nbags):
                m.next = "DRAIN"
            with m.Elif(b + 1 == cmd.batch_size):
                # table_index has been t + 1 since the bag began: its descriptor is here.
                m.d.sync += [b.eq(0), t.eq(t + 1), out_row.eq(cmd.out_addr), tbl.eq(self.table)]
                m.next = "BAG"
                load_bag(bag + 1, self.table.mode)
            with m.Else():
                m.d.sync += [b.eq(b + 1), out_row.eq(out_row + cmd.row_pitch_lines)]
                m.next = "BAG"
                load_bag(bag + 1, tbl.mode)

        with m.FSM() as fsm:
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [nbags.eq(cmd.num_tables * cmd.batch_size), bag.eq(0), b.eq(0), t.eq(0),
                                 err.eq(NdpError.OK), err_info.eq(0), media.eq(0), half_bag.eq(0),
                                 self.lookups.eq(0), out_row.eq(cmd.out_addr)]
                    m.next = "READ_END"
            with m.State("READ_END"):
                # Both ends of the offsets array at once (the stream from offsets[0], and
                # offsets[T*B]), and the indices and weights when they lie inside memory.
                streams_ok = ~indices_outside & ~weights_outside
                m.d.comb += [offs.start.eq(1), offs.first.eq(0), offs.count.eq(nbags + 1),
                             end.start.eq(1), end.first.eq(nbags), end.count.eq(1),
                             idxs.start.eq(streams_ok), idxs.first.eq(0), idxs.count.eq(cmd.index_count),
                             wgts.start.eq(streams_ok & cmd.flags.has_weights), wgts.first.eq(0),
                             wgts.count.eq(cmd.index_count)]
                m.d.sync += [got_end.eq(0), got_first.eq(0)]
                m.next = "WAIT_END"
            with m.State("WAIT_END"):
                m.d.comb += [end.elems.ready.eq(~got_end), offs.elems.ready.eq(~got_first)]
                with m.If(end.elems.valid & ~got_end):
                    m.d.sync += [off_end.eq(end.elems.payload), got_end.eq(1)]
                with m.If(offs.elems.valid & ~got_first):
                    m.d.sync += [prev.eq(offs.elems.payload), got_first.eq(1)]
                with m.If((got_end | end.elems.valid) & (got_first | offs.elems.valid)):
                    m.next = "CHECK"
            with m.State("CHECK"):
                # PyTorch's contract: offsets run from 0 to the index count. Anything else
                # would read positions that belong to no bag (garbage after the indices).
                with m.If(prev != 0):
                    fail(NdpError.OFFSETS, 0)
                with m.Elif(off_end != cmd.index_count):
                    fail(NdpError.OFFSETS, nbags)
                with m.Elif(indices_outside):
                    fail(NdpError.ADDRESS, AddressFault.INDICES)
                with m.Elif(weights_outside):
                    fail(NdpError.ADDRESS, AddressFault.WEIGHTS)
                with m.Else():
                    m.next = "TABLE"
            with m.State("TABLE"):           # table_index = t: the descriptor arrives next cycle
                                             # (the first table; later ones are prefetched)
                m.next = "TABLE_LOAD"
            with m.State("TABLE_LOAD"):
                m.d.sync += tbl.eq(self.table)
                m.next = "BAG"
            with m.State("BAG"):
                load_bag(bag, tbl.mode)
            with m.State("EMPTY"):
                m.d.comb += [self.items.valid.eq(1), item.kind.eq(ItemKind.EMPTY), item.weight.eq(ONE)]
                with m.If(self.items.ready):
                    next_bag()
            with m.State("ROWS"):
                have = idxs.elems.valid & (wgts.elems.valid | ~cmd.flags.has_weights)
                with m.If(have):
                    with m.If(index >= tbl.rows):
                        fail(NdpError.INDEX_RANGE, prev - length + j)
                    with m.Else():
                        m.d.comb += [self.items.valid.eq(1), item.kind.eq(ItemKind.ROW)]
                        with m.If(self.items.ready):
                            m.d.comb += [idxs.elems.ready.eq(1), wgts.elems.ready.eq(cmd.flags.has_weights)]
                            m.d.sync += [j.eq(j + 1), half_bag.eq(1), self.lookups.eq(self.lookups + 1)]
                            with m.If(j + 1 == length):
                                next_bag()          # its half_bag.eq(0) comes last: it wins
            with m.State("ABORT"):           # close a half-emitted bag, stop the readers
                with m.If(half_bag):
                    m.d.comb += [self.items.valid.eq(1), item.kind.eq(ItemKind.ABORT)]
                    with m.If(self.items.ready):
                        m.d.sync += half_bag.eq(0)
                with m.Else():
                    m.d.comb += [r.abort.eq(1) for r in readers]
                    m.next = "DRAIN"
            with m.State("DRAIN"):
                with m.If(~(offs.busy | idxs.busy | wgts.busy | end.busy)):
                    m.d.comb += self.done.eq(1)
                    m.d.comb += [self.error.eq(Mux((err == NdpError.OK) & media, NdpError.MEDIA, err)),
                                 self.error_info.eq(err_info)]
                    m.next = "IDLE"
        # From the first table's BAG on, the table memory is read one table ahead, so
        # crossing to the next table costs no cycle.
        m.d.comb += self.table_index.eq(Mux(fsm.ongoing("TABLE"), t, t + 1))
        return m
