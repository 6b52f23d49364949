"""UndoLogEngine: the LOG command: undo-log the old value of every row a batch will update, once per row.

Contract
--------
Constructor: ``UndoLogEngine(addr_bits=, capacity_lines=, set_entries=4096)``. ``addr_bits`` <= 32 and
``capacity_lines`` <= 2**addr_bits: every line the engine touches is below capacity_lines.
``set_entries``: capacity of the on-chip deduplication set in (table, row) keys, a power of two >= 8.
``engine.ctx_bits`` (8) is the width of the memory port's ``ctx``.

Ports
- ``ctl``: In(engine_control_signature()) (hw/ndp/command.py). ``ctl.start`` (one cycle, ``ctl.cmd``
  valid and stable until ``done``) starts a LOG command for batch k = ``cmd.batch``; a start while busy
  is ignored. Table descriptor t is read by driving ``ctl.table_index`` = t and using ``ctl.table``
  one cycle later. ``busy`` is high from ``start`` until ``done``; ``done`` is a one-cycle pulse with
  ``error``, ``error_info`` and ``stats`` valid. ``cmd.opcode``, ``tag``, ``flags`` are ignored.
- ``mem``: Out(client_port_signature(addr_bits, ctx_bits)) (hw/mem/port.py). Single-line reads and
  writes (all 64 byte enables, never poisoned); ``rd_rsp`` / ``wr_rsp`` are always ready; ``ctx``
  must come back unchanged (it routes responses inside the engine; responses in any order).
- ``region``: In(LogRegion) (hw/checkpoint/log_format.py), the CKPT_* CSRs; stable while busy.

Sequence (slot s = k & 1 at slot_base = log_base + s * slot_lines; layout in log_format.py)
1. Region check: slot_lines >= 3 and log_base + 2 * slot_lines <= capacity_lines, else ADDRESS with
   error_info = AddressFault.LOG_REGION (nothing is read or written).
2. The slot is invalidated: LogRecord {LOG_MAGIC, FREE, slot s, batch k, count 0, lines 0, crc} is
   written to slot line RECORD_LINE_LOGGED. No entry is written before its write response came back,
   so a half-written log is never behind an old LOGGED record. (Array reads overlap this write.)
3. Validation, with the UPDATE engine's codes and error_info (hw/ndp/update/engine.py): the offsets array
   (T*B+1 u32) is streamed first: OFFSETS, error_info = position i of the first offset with
   offsets[i] < offsets[i-1] or offsets[i] - offsets[i-1] > 65535 (the UPDATE engine's bag limit, so a
   batch LOG accepts is one UPDATE accepts), or 0 when offsets[0] != 0, or T*B when offsets[T*B] !=
   cmd.index_count (in stream order). Then ADDRESS / AddressFault.INDICES when the line holding
   indices[offsets[T*B]-1] is outside device memory. Then the index occurrences
   indices[offsets[0] : offsets[T*B]] are streamed in input order (table t owns positions
   offsets[t*B] .. offsets[(t+1)*B]-1): INDEX_RANGE, error_info = position of an index >= its table's
   rows. INDEX_RANGE and LOG_FULL end the command when a pass reaches them (every index is checked in
   the first pass; LOG_FULL is found when an entry is allocated, so with P = 1 they come in stream
   order).
4. Deduplication (exact): an on-chip hash set of ``set_entries`` keys (t, row), WAYS = 4-way
   set-associative; set = (top bits of row * 0x9E3779B1) + t, modulo the number of sets. A key
   absent from the set is inserted and becomes an entry. Entries of a pass are allocated at the next
   free slot line, packed from SLOT_HEADER_LINES; entry n (n = entries so far) with
   n % GROUP_ENTRIES == 0 also allocates its group line in front of its payload. The keys are taken
   in partitions: partition (p, d) is one pass over the whole index stream that keeps only keys with
   (row & (2**d - 1)) == p; the first pass is (0, 0), every key. If a key finds its set full, the
   pass is abandoned (its entries are overwritten: entry lines, the entry count and the group line
   being filled restart where the partition began) and the partition is
   redone as its two halves (p, d+1) and (p + 2**d, d+1), depth first; partitions already complete
   are kept. A partition ends once the copy engine holds none of its keys. The set is emptied
   between passes (a generation tag per way, so emptying costs nothing; when the 16-bit tag wraps,
   and at the first pass after reset, since memories keep stale tags through a reset, the set is
   cleared for real, one set per cycle). Entry order in the slot: partitions in depth-first order;
   within a partition, first-occurrence order of the index stream.
   Termination: at d = 32 a partition holds the keys of one row value, at most one per table,
   and set = (h + t) mod sets puts at most ceil(T / sets) of them in one set, which fits the 4 ways
   whenever set_entries >= T (always for set_entries >= MAX_TABLES = 128). Should a set still
   overflow there, the command ends with LOG_FULL. Cost: every pass streams the whole index array:
   one pass per leaf partition plus one per split; a partition fits when no set gets a fifth key
   (with a uniform hash about set_entries / 8 keys; the default set rarely overflows below ~500
   distinct keys), so a batch of U distinct keys takes about 2 * U / (set_entries / 8) passes.
5. Copy: for each entry n = (t, row) with payload at slot line e: its dim_lines = dim/16 lines are
   read from row_addr = table.base_addr + row * dim_lines and written to slot lines e .. e+dim_lines-1
   (the old value); its EntryInfo {row_addr, row, crc, table t, dim_lines} goes into place
   n % GROUP_ENTRIES of its group line (EntryGroup {GROUP_MAGIC, batch k}, unused places zero), which
   is written after the payload of its last entry, or, for a last group that is not full, once every
   entry is copied. crc = zlib.crc32(EntryCrcPrefix line + payload lines), computed as the lines pass.
   LOG_FULL, error_info = entries allocated so far, when an entry would end past the slot; entries
   allocated before are still written.
   MEDIA when any read returns error or poison or any write response has error; error_info =
   what << 24 (1 offsets, 2 indices, 5 row read, 6 write), like the UPDATE engine.
6. After every entry and group line write's response has arrived: LogRecord {LOG_MAGIC, LOGGED,
   slot s, batch k, count = entries, lines = slot lines used after the slot header, crc} is written to slot line
   RECORD_LINE_LOGGED; ``done`` (OK) follows its write response. On any error the engine stops reading
   the arrays, lets the entries already allocated finish, waits for every outstanding response and
   ends with the slot's record FREE (so no LOGGED record). The engine never writes a table row and
   never writes outside the slot (besides nothing at all for LOG_REGION). It is ready for the next
   command after ``done``.
Stats: lookups = index occurrences (counted in partition 0's pass), unique_rows = rows_read = entries,
rows_written = 0, lines_read / lines_written = every line read / written on ``mem`` (array lines are
re-read in every pass; record writes and entries of abandoned attempts included), lines_pushed = 0.

Pipelining and throughput
- The offsets and indices arrays are streamed by two ElementReaders (16 lines of prefetch each)
  behind a MemPortArbiter shared with the copy engine (round robin). Dedup takes one index per cycle
  (set read, then compare and insert, then the entry's room and queue push: three stages; the read
  port is transparent to the insert) plus 3 cycles per table; measured (test_dedup_rate): 3000
  indices over 50 rows in 3266 cycles for the whole command. New keys wait in a 16-entry queue
  for the copy engine (back-pressure).
- Copy engine: a 64-line reorder ring; up to 64 row-line reads are outstanding (``ctx`` names the ring
  slot, so responses may return in any order); payload lines are written in order as they arrive,
  then (every GROUP_ENTRIES entries) the group line. Requests go through one output register: at most
  one request per cycle, entry writes first, then record and group-flush writes, then row reads. An
  entry costs 2*dim_lines + 1/GROUP_ENTRIES requests, so the port bound is dim_lines /
  (2*dim_lines + 0.25) copied lines per cycle. Measured (tests/test_undo_log.py, test_copy_throughput:
  60-cycle memory, always ready, distinct rows): 0.95-0.98 requests per cycle, i.e. 0.42 copied
  lines/cycle for dim 16 and 0.48 for dim 64 (bounds 0.44 and 0.48; with a header line per entry,
  before the group lines: 0.33 and 0.44).
- Costs besides the copy: one FREE-record write round trip (overlapping the offsets stream), one
  offsets stream, P index streams per attempt, the LOGGED write round trip.

Assumptions: the processor checked the descriptor and tables as for UPDATE (T in 1..128, B >= 1,
T*B < 2**32, dims multiples of 16 in [16, 256], rows >= 1, rows inside device memory, the offsets
array inside device memory). The memory port honours hw/mem/port.py (read-after-write per line, writes
to a line in acceptance order, a write response means durable).
"""
import enum

from amaranth import Cat, Const, Module, Mux, ResetInserter, Signal
from amaranth.lib import data, memory, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from ..common.cxl_mem import LINE_BITS, LINE_BYTES
from ..mem.arbiter import MemPortArbiter, client_port_signature, connect_port
from ..mem.port import RequestSource
from ..ndp.command import MAX_TABLES, TABLE_ID_BITS, AddressFault, NdpError, engine_control_signature
from ..ndp.element_reader import ElementReader
from .crc import crc32_data_part, crc32_line, crc32_single_line, crc32_state_part
from .log_format import (CRC_INIT, ENTRY_MAGIC, GROUP_ENTRIES, GROUP_MAGIC, LOG_MAGIC, RECORD_LINE_LOGGED,
                         SLOT_HEADER_LINES, EntryCrcPrefix, EntryGroup, EntryInfo, LogRecord, LogRegion, LogState,
                         log_region_fits, record_crc_offset)

MAX_BAG = 0xFFFF                 # the UPDATE engine's bag-length limit (Fp32DivInt's 16-bit L)
WIDE = 40                        # range-check arithmetic that never wraps


class Media(enum.IntEnum):
    """error_info of MEDIA: what << 24 (the UPDATE engine's numbering)."""
    OFFSETS = 1
    INDICES = 2
    ROW = 5
    WRITE = 6


def _line_of(struct_value):
    """A struct placed at bit 0 of an otherwise zero 64-byte line."""
    v = struct_value.as_value()
    return Cat(v, Const(0, LINE_BITS - len(v)))


class UndoLogEngine(wiring.Component):
    """Undo log of a batch (opcode LOG); see the module docstring."""
    WAYS = 4
    GEN_BITS = 16                # dedup-set generation tag; the set is cleared when it wraps
    RING = 64                    # copy engine: row lines in flight (reorder ring)
    KEY_QUEUE = 16               # new keys waiting for the copy engine
    READER_DEPTH = 16
    COPY_CTX = 6                 # log2(RING)

    def __init__(self, *, addr_bits: int, capacity_lines: int, set_entries: int = 4096):
        if not 1 <= capacity_lines <= 1 << addr_bits or addr_bits > 32:
            raise ValueError(f"capacity_lines {capacity_lines} does not fit {addr_bits} address bits (<= 32)")
        if set_entries < 2 * self.WAYS or set_entries & (set_entries - 1):
            raise ValueError(f"set_entries must be a power of two >= {2 * self.WAYS}, got {set_entries}")
        self.addr_bits = addr_bits
        self.capacity_lines = capacity_lines
        self.set_entries = set_entries
        self._readers = [ElementReader(addr_bits=addr_bits, depth=self.READER_DEPTH) for _ in range(2)]
        # The offsets' and indices' readers enter the merge through register slices: the copy
        # engine's request register takes its ready from the merge, so without them an array
        # reader's issue logic ran through the grant into the copy's entry queue (14 LUT levels).
        self._arb = MemPortArbiter(clients=3, addr_bits=addr_bits, ctx_bits=self.COPY_CTX,
                                   input_stage=("slice", "slice", "none"))
        self.ctx_bits = self._arb.ctx_bits + self._arb.client_bits
        super().__init__({
            "ctl": In(engine_control_signature()),
            "mem": Out(client_port_signature(addr_bits, self.ctx_bits)),
            "region": In(LogRegion),
        })

    def elaborate(self, platform):
        m = Module()
        A = self.addr_bits
        CAP = self.capacity_lines
        W = self.WAYS
        NSETS = self.set_entries // W
        SB = (NSETS - 1).bit_length()
        RING = self.RING
        RB = self.COPY_CTX
        GSB = (GROUP_ENTRIES - 1).bit_length()
        assert GROUP_ENTRIES == 1 << GSB
        GEN_MAX = (1 << self.GEN_BITS) - 1
        cmd = self.ctl.cmd
        tab = self.ctl.table
        region = self.region

        # ------------------------------------------------------------ memory port plumbing --
        m.submodules.offsets = offs = self._readers[0]
        m.submodules.indices = idxs = self._readers[1]
        m.submodules.arb = arb = self._arb
        copy = client_port_signature(A, RB).create()
        connect_port(m, offs.mem, arb.clients[0])
        connect_port(m, idxs.mem, arb.clients[1])
        connect_port(m, copy, arb.clients[2])
        wiring.connect(m, arb.mem, wiring.flipped(self.mem))
        m.d.comb += [offs.base.eq(cmd.offsets_addr), idxs.base.eq(cmd.indices_addr)]

        # ------------------------------------------------------------ command state --
        err = Signal(NdpError)
        err_info = Signal(32)
        media = Signal()
        media_info = Signal(32)
        slot = Signal()
        slot_base = Signal(A)
        n_bags = Signal(32)
        first = Signal(32)                      # offsets[0]
        last = Signal(32)                       # offsets[T*B]
        t = Signal(TABLE_ID_BITS + 1)
        tbl_lines = Signal(5)
        tbl_rows = Signal(32)
        tbl_base = Signal(32)
        t_end = Signal(32)                      # offsets[(t+1)*B]
        pos = Signal(32)                        # element position in the indices array
        p_log = Signal(6)                       # depth of this pass's partition: keys with
        part = Signal(33)                       # (row & (2**p_log - 1)) == part
        pmask = Signal(32)
        m.d.comb += pmask.eq(((Const(1, 33) << p_log) - 1)[:32])
        part_e = Signal(34)                     # alloc_e and entries when the partition began
        part_entries = Signal(32)
        part_grp = Signal(EntryGroup)           # ... and the writer's group line and its place
        part_grp_e = Signal(32)
        # GEN_MAX after reset: the first pass clears the set for real. The memory keeps its
        # contents through a reset, and entries of generation 1.. from before it would
        # otherwise count as logged rows (which the log would then miss).
        gen = Signal(self.GEN_BITS, init=GEN_MAX)
        entries = Signal(32)
        alloc_e = Signal(34)                    # next free slot line
        free_acked = Signal()                   # the FREE record is durable: entries may be written
        hard_stop = Signal()                    # abandon the attempt: copy engine issues nothing
        copy_clr = Signal()

        st_lookups = Signal(32)
        st_lines_read = Signal(32)
        st_lines_written = Signal(32)

        m.d.comb += self.ctl.table_index.eq(t[:TABLE_ID_BITS])

        # Table boundaries offsets[t*B], t = 0..T, captured while the offsets stream is checked.
        m.submodules.tb_mem = tb_mem = memory.Memory(shape=32, depth=MAX_TABLES + 1, init=[])
        tb_wp = tb_mem.write_port()
        tb_rp = tb_mem.read_port()

        # ------------------------------------------------------------ request register --
        req = copy.req
        out_valid = Signal()
        take = Signal()
        m.d.comb += [take.eq(~out_valid | req.ready), req.valid.eq(out_valid),
                     req.payload.strb.eq(Mux(req.payload.write, Const((1 << LINE_BYTES) - 1, LINE_BYTES), 0))]

        src_wr = RequestSource("entry_wr", A, RB)             # entry payload and group-line writes
        src_rec = RequestSource("record", A, RB)              # FREE / LOGGED record writes
        src_grp = RequestSource("group_flush", A, RB)         # the last group line, when not full
        src_rd = RequestSource("row_rd", A, RB)               # row-line reads
        m.d.comb += [src_wr.write.eq(1), src_rec.write.eq(1), src_grp.write.eq(1), src_rd.write.eq(0)]
        granted = Signal()
        g_write = Signal()
        blocked = 0
        for src in (src_wr, src_rec, src_grp, src_rd):
            mine = Signal(name=f"{src.valid.name}_mine")
            m.d.comb += [mine.eq(src.valid & ~blocked), src.ready.eq(take & mine)]
            with m.If(mine):
                m.d.comb += [granted.eq(1), g_write.eq(src.write)]
                with m.If(take):
                    m.d.sync += [req.payload.write.eq(src.write), req.payload.addr.eq(src.addr),
                                 req.payload.data.eq(src.data), req.payload.ctx.eq(src.ctx)]
            blocked = blocked | src.valid
        with m.If(take):
            m.d.sync += out_valid.eq(granted)

        rd_pend = Signal(RB + 2)                # copy reads loaded and not answered
        wr_pend = Signal(32)                    # writes loaded and not acknowledged
        loaded_rd = take & granted & ~g_write
        loaded_wr = take & granted & g_write
        m.d.sync += [rd_pend.eq(rd_pend + loaded_rd - copy.rd_rsp.valid),
                     wr_pend.eq(wr_pend + loaded_wr - copy.wr_rsp.valid)]
        m.d.comb += [copy.rd_rsp.ready.eq(1), copy.wr_rsp.ready.eq(1)]
        outer = self.mem.req
        with m.If(outer.valid & outer.ready):
            with m.If(outer.payload.write):
                m.d.sync += st_lines_written.eq(st_lines_written + 1)
            with m.Else():
                m.d.sync += st_lines_read.eq(st_lines_read + 1)

        # Media errors, first one wins (the ElementReaders' flags restart with each stream).
        with m.If(~media):
            with m.If(copy.wr_rsp.valid & copy.wr_rsp.payload.error):
                m.d.sync += [media.eq(1), media_info.eq(Media.WRITE << 24)]
            with m.Elif(copy.rd_rsp.valid & (copy.rd_rsp.payload.error | copy.rd_rsp.payload.poison)):
                m.d.sync += [media.eq(1), media_info.eq(Media.ROW << 24)]
            with m.Elif(offs.media_error):
                m.d.sync += [media.eq(1), media_info.eq(Media.OFFSETS << 24)]
            with m.Elif(idxs.media_error):
                m.d.sync += [media.eq(1), media_info.eq(Media.INDICES << 24)]

        # ------------------------------------------------------------ records --
        rec = Signal(LogRecord)
        rec_logged = Signal()
        m.d.comb += [rec.magic.eq(LOG_MAGIC), rec.state.eq(Mux(rec_logged, LogState.LOGGED, LogState.FREE)),
                     rec.slot.eq(slot), rec.batch.eq(cmd.batch),
                     rec.count.eq(Mux(rec_logged, entries, 0)),
                     rec.lines.eq(Mux(rec_logged, alloc_e - SLOT_HEADER_LINES, 0))]
        rec_line = _line_of(rec)
        m.d.comb += [src_rec.addr.eq(slot_base + RECORD_LINE_LOGGED),
                     src_rec.data.eq(rec_line | (crc32_single_line(rec_line) << record_crc_offset()))]

        # ------------------------------------------------------------ dedup set --
        key_layout = data.StructLayout({"row": 32, "table": TABLE_ID_BITS})
        way_layout = data.StructLayout({"gen": self.GEN_BITS, "key": key_layout})
        set_layout = data.ArrayLayout(way_layout, W)
        m.submodules.dedup = dedup = memory.Memory(shape=set_layout, depth=NSETS, init=[])
        set_wp = dedup.write_port()
        set_rp = dedup.read_port(transparent_for=(set_wp,))

        # e: the entry's first payload line (slot-relative); gslot: its place in the group line
        entry_layout = data.StructLayout({"e": 32, "lines": 5, "table": TABLE_ID_BITS, "row": 32,
                                          "row_addr": A, "gslot": GSB})
        m.submodules.key_q = key_q = ResetInserter(copy_clr)(
            SyncFIFOBuffered(width=entry_layout.size, depth=self.KEY_QUEUE))

        index = idxs.elems.payload
        s0_set = Signal(SB)
        m.d.comb += [s0_set.eq(((index * 0x9E3779B1)[32 - SB:32] + t[:TABLE_ID_BITS])[:SB]),
                     set_rp.addr.eq(s0_set)]
        s1_valid = Signal()
        s1_key = Signal(key_layout)
        s1_set = Signal(SB)
        s1_lines = Signal(5)
        s1_addr = Signal(A)
        ways = set_rp.data
        hit = Signal()
        free = Signal()
        free_way = Signal(range(W))
        for i in reversed(range(W)):
            cur = ways[i].gen == gen
            with m.If(cur & (ways[i].key.as_value() == s1_key.as_value())):
                m.d.comb += hit.eq(1)
            with m.If(~cur):
                m.d.comb += [free.eq(1), free_way.eq(i)]
        # S1 inserts a new key into its set at once (the read-modify-write loop stays in one
        # cycle, so the next index's read, transparent to this write, sees it). Whether the
        # entry fits the slot, the queue push and the FSM's reaction are S2's, a cycle later,
        # from registers: in S1 the set's compare ran on through the slot-room adder into the
        # FSM and the index reader's abort (13 LUT levels in the eighth round's device run).
        # A key S1 inserted for an entry that then does not fit is never used: LOG fails
        # (LOG_FULL), and a set overflow restarts the pass; both start a new generation.
        s1_ins = Signal()
        m.d.comb += s1_ins.eq(s1_valid & ~hit & free)
        s2_valid = Signal()
        s2_ins = Signal()                       # S1 inserted the key: a new entry if it fits
        s2_ovf = Signal()                       # S1 found the set full of other keys
        s2_key = Signal(key_layout)
        s2_lines = Signal(5)
        s2_addr = Signal(A)
        m.d.sync += [s2_valid.eq(s1_valid), s2_ins.eq(s1_ins), s2_ovf.eq(s1_valid & ~hit & ~free),
                     s2_key.eq(s1_key), s2_lines.eq(s1_lines), s2_addr.eq(s1_addr)]
        # Entry n = ``entries`` takes place n % GROUP_ENTRIES of group line n // GROUP_ENTRIES;
        # the group's first entry allocates that line in front of its payload.
        g_first = Signal()
        new_end = Signal(34)
        m.d.comb += [g_first.eq(entries[:GSB] == 0), new_end.eq(alloc_e + g_first + s2_lines)]
        s2_full = Signal()
        s2_push = Signal()
        m.d.comb += [s2_full.eq(s2_valid & s2_ins & (new_end > region.slot_lines)),
                     s2_push.eq(s2_valid & s2_ins & (new_end <= region.slot_lines))]
        new_way = Signal(way_layout)
        m.d.comb += [new_way.gen.eq(gen), new_way.key.eq(s1_key)]
        new_entry = Signal(entry_layout)
        m.d.comb += [new_entry.e.eq(alloc_e + g_first), new_entry.lines.eq(s2_lines),
                     new_entry.table.eq(s2_key.table), new_entry.row.eq(s2_key.row), new_entry.row_addr.eq(s2_addr),
                     new_entry.gslot.eq(entries[:GSB]),
                     key_q.w_data.eq(new_entry), key_q.w_en.eq(s2_push)]
        clr_set = Signal(SB + 1)
        clearing = Signal()
        with m.If(clearing):
            m.d.comb += [set_wp.addr.eq(clr_set[:SB]), set_wp.data.as_value().eq(0), set_wp.en.eq(1)]
        with m.Else():
            m.d.comb += [set_wp.addr.eq(s1_set), set_wp.en.eq(s1_ins)]
            for i in range(W):
                m.d.comb += set_wp.data[i].eq(Mux(free_way == i, new_way, ways[i]))
        with m.If(s2_push):
            m.d.sync += [entries.eq(entries + 1), alloc_e.eq(new_end)]

        # ------------------------------------------------------------ copy engine --
        m.submodules.ent_q = ent_q = ResetInserter(copy_clr)(SyncFIFOBuffered(width=entry_layout.size, depth=RING))
        m.submodules.ring = ring = memory.Memory(shape=LINE_BITS, depth=RING, init=[])
        ring_wp = ring.write_port()
        ring_rp = ring.read_port(domain="comb")
        r_tail = Signal(RB + 1)                 # next ring slot a read fills
        r_head = Signal(RB + 1)                 # next ring slot the writer consumes
        arrived = Signal(RING)
        ring_used = Signal(RB + 1)
        m.d.comb += ring_used.eq(r_tail - r_head)      # modulo 2*RING (the difference is wider)
        m.d.comb += [ring_wp.addr.eq(copy.rd_rsp.payload.ctx), ring_wp.data.eq(copy.rd_rsp.payload.data),
                     ring_wp.en.eq(copy.rd_rsp.valid), ring_rp.addr.eq(r_head[:RB])]
        # Each line's CRC data part, computed as it arrives and kept beside it: the CRC
        # register's update is linear (hw/checkpoint/crc.py), so the writer xors only the 32
        # state bits' part and this. The line's 512-input xor trees behind the ring's read
        # were the engine's deepest path (12 LUT levels, the ring head -> the CRC register).
        m.submodules.ring_crc = ring_crc = memory.Memory(shape=32, depth=RING, init=[])
        ring_crc_wp = ring_crc.write_port()
        ring_crc_rp = ring_crc.read_port(domain="comb")
        m.d.comb += [ring_crc_wp.addr.eq(copy.rd_rsp.payload.ctx),
                     ring_crc_wp.data.eq(crc32_data_part(copy.rd_rsp.payload.data)),
                     ring_crc_wp.en.eq(copy.rd_rsp.valid), ring_crc_rp.addr.eq(r_head[:RB])]

        # Issuer: row-line reads of the key queue's head entry; the entry goes to the writer with
        # its first read.
        kh = Signal(entry_layout)
        k_rd = Signal(5)
        m.d.comb += kh.eq(key_q.r_data)
        m.d.comb += [
            src_rd.valid.eq(key_q.r_rdy & (ring_used != RING) & ~hard_stop & ((k_rd != 0) | ent_q.w_rdy)),
            src_rd.addr.eq(kh.row_addr + k_rd), src_rd.ctx.eq(r_tail[:RB]),
            ent_q.w_data.eq(kh),
        ]
        with m.If(src_rd.ready):
            m.d.sync += [r_tail.eq(r_tail + 1), k_rd.eq(k_rd + 1)]
            m.d.comb += ent_q.w_en.eq(k_rd == 0)
            with m.If(k_rd + 1 == kh.lines):
                m.d.sync += k_rd.eq(0)
                m.d.comb += key_q.r_en.eq(1)

        # Writer: payload lines in order as they arrive, CRC on the way; then the entry's
        # EntryInfo goes into the group line ``grp``, which is written after its last entry's
        # payload (or, for a last group that is not full, by the FSM's GROUP_FLUSH).
        def crc_prefix_line(entry):
            pre = Signal(EntryCrcPrefix)
            m.d.comb += [pre.magic.eq(ENTRY_MAGIC), pre.batch.eq(cmd.batch), pre.table.eq(entry.table),
                         pre.dim_lines.eq(entry.lines), pre.row.eq(entry.row), pre.row_addr.eq(entry.row_addr)]
            return _line_of(pre)

        wv = Signal()
        cur = Signal(entry_layout)
        k_wr = Signal(5)
        crc = Signal(32)
        # arrived[r_head], registered: the 64-to-1 pick of the head's bit fed the write
        # request's valid, the grant and the key queue's read (13 LUT levels, arrived ->
        # key_q's level). Kept equal to arrived[r_head] by deciding it for the head of the next
        # cycle (the line after the head when the head advances), with this cycle's arrival.
        line_here = Signal()
        payload_phase = k_wr != cur.lines
        w_finish = Signal()
        grp = Signal(EntryGroup)                # the group line being filled
        grp_e = Signal(32)                      # its slot line
        cur_info = Signal(EntryInfo)
        m.d.comb += [cur_info.row_addr.eq(cur.row_addr), cur_info.row.eq(cur.row), cur_info.crc.eq(crc ^ CRC_INIT),
                     cur_info.table.eq(cur.table), cur_info.dim_lines.eq(cur.lines)]
        grp_full = Signal(EntryGroup)           # grp with the current entry in the group's last place
        m.d.comb += [grp_full.eq(grp), grp_full.entries[GROUP_ENTRIES - 1].eq(cur_info)]
        last_in_group = cur.gslot == GROUP_ENTRIES - 1
        m.d.comb += [
            src_wr.valid.eq(wv & free_acked & ~hard_stop & Mux(payload_phase, line_here, last_in_group)),
            src_wr.addr.eq(slot_base + Mux(payload_phase, cur.e + k_wr, grp_e)),
            src_wr.data.eq(Mux(payload_phase, ring_rp.data, grp_full.as_value())),
            w_finish.eq(wv & ~payload_phase & ~hard_stop & (~last_in_group | src_wr.ready)),
            ent_q.r_en.eq(~wv | w_finish),
        ]
        release = Signal()
        with m.If(src_wr.ready & payload_phase):
            m.d.comb += release.eq(1)
            m.d.sync += [crc.eq(crc32_state_part(crc) ^ ring_crc_rp.data), r_head.eq(r_head + 1),
                         k_wr.eq(k_wr + 1)]
        with m.If(w_finish):
            m.d.sync += [wv.eq(0), grp.entries[cur.gslot].eq(cur_info)]
        nxt = Signal(entry_layout)
        m.d.comb += nxt.eq(ent_q.r_data)
        nxt_prefix = crc_prefix_line(nxt)       # (unconditional: see tests/test_no_alwnever.py)
        with m.If(ent_q.r_en & ent_q.r_rdy):
            m.d.sync += [cur.eq(nxt), wv.eq(1), k_wr.eq(0), crc.eq(crc32_line(CRC_INIT, nxt_prefix))]
            with m.If(nxt.gslot == 0):          # a new group line (after the merge above: it wins)
                m.d.sync += [grp.magic.eq(GROUP_MAGIC), grp.batch.eq(cmd.batch), grp.entries.as_value().eq(0),
                             grp_e.eq(nxt.e - 1)]
        set_mask = Mux(copy.rd_rsp.valid, Const(1, RING) << copy.rd_rsp.payload.ctx, 0)
        clr_mask = Mux(release, Const(1, RING) << r_head[:RB], 0)
        m.d.sync += arrived.eq((arrived | set_mask) & ~clr_mask)
        # line_here for the next cycle: arrived[h + 1] (arrived rotated by one, picked at h)
        # when the head h advances, else arrived[h] (= line_here); either with this cycle's arrival.
        rsp_ctx = copy.rd_rsp.payload.ctx[:RB]
        here_after = Signal()
        m.d.comb += here_after.eq(Cat(arrived[1:], arrived[0]).bit_select(r_head[:RB], 1) |
                                  (copy.rd_rsp.valid & (rsp_ctx == (r_head[:RB] + 1)[:RB])))
        m.d.sync += line_here.eq(Mux(release, here_after,
                                     line_here | (copy.rd_rsp.valid & (rsp_ctx == r_head[:RB]))))
        with m.If(copy_clr):
            m.d.sync += [r_tail.eq(0), r_head.eq(0), arrived.eq(0), line_here.eq(0), k_rd.eq(0), wv.eq(0)]
        copy_idle = Signal()
        m.d.comb += copy_idle.eq((key_q.level == 0) & (ent_q.level == 0) & ~wv & (k_rd == 0))
        quiet = Signal()                        # nothing of this command in flight
        m.d.comb += quiet.eq(copy_idle & ~offs.busy & ~idxs.busy & (rd_pend == 0) & (wr_pend == 0) & ~out_valid)

        # ------------------------------------------------------------ main FSM --
        done = Signal()
        m.d.comb += [self.ctl.done.eq(done), self.ctl.error.eq(err), self.ctl.error_info.eq(err_info),
                     self.ctl.stats.lookups.eq(st_lookups), self.ctl.stats.rows_read.eq(entries),
                     self.ctl.stats.unique_rows.eq(entries), self.ctl.stats.rows_written.eq(0),
                     self.ctl.stats.lines_read.eq(st_lines_read), self.ctl.stats.lines_written.eq(st_lines_written),
                     self.ctl.stats.lines_pushed.eq(0)]

        i_off = Signal(32)                      # offsets stream position
        prev = Signal(32)
        nb = Signal(32)                         # next table boundary position t*B
        cap_t = Signal(TABLE_ID_BITS + 1)

        def fail(code, info):
            """Stop the array streams; allocated entries finish; done once everything is quiet."""
            m.d.sync += [err.eq(code), err_info.eq(info), s1_valid.eq(0), s2_valid.eq(0)]
            m.d.comb += [offs.abort.eq(1), idxs.abort.eq(1)]
            m.next = "DRAIN"

        with m.FSM() as fsm:
            with m.State("IDLE"):
                with m.If(self.ctl.start):
                    m.d.sync += [
                        err.eq(NdpError.OK), err_info.eq(0), media.eq(0), media_info.eq(0),
                        slot.eq(cmd.batch[0]),
                        slot_base.eq(region.log_base + Mux(cmd.batch[0], region.slot_lines, 0)),
                        n_bags.eq(cmd.num_tables * cmd.batch_size),
                        entries.eq(0), alloc_e.eq(SLOT_HEADER_LINES), free_acked.eq(0), rec_logged.eq(0),
                        st_lookups.eq(0), st_lines_read.eq(0), st_lines_written.eq(0),
                        p_log.eq(0),
                    ]
                    with m.If(~log_region_fits(region, CAP)):
                        m.d.sync += [err.eq(NdpError.ADDRESS), err_info.eq(AddressFault.LOG_REGION)]
                        m.next = "DONE"
                    with m.Else():
                        m.next = "FREE_REC"
            with m.State("FREE_REC"):
                m.d.comb += src_rec.valid.eq(1)
                with m.If(src_rec.ready):
                    m.next = "OFFS_START"
            with m.State("OFFS_START"):
                with m.If(~offs.busy):
                    m.d.comb += [offs.start.eq(1), offs.first.eq(0), offs.count.eq(n_bags + 1)]
                    m.d.sync += [i_off.eq(0), nb.eq(0), cap_t.eq(0)]
                    m.next = "OFFS_SCAN"
            with m.State("OFFS_SCAN"):
                v = offs.elems.payload
                diff = Signal(33)
                m.d.comb += diff.eq(v - prev)
                with m.If(media):
                    fail(NdpError.MEDIA, media_info)
                with m.Elif(offs.elems.valid):
                    with m.If((i_off != 0) & ((v < prev) | (diff > MAX_BAG))):
                        fail(NdpError.OFFSETS, i_off)
                    with m.Elif((i_off == 0) & (v != 0)):
                        fail(NdpError.OFFSETS, 0)              # offsets run from 0 ...
                    with m.Elif((i_off == n_bags) & (v != cmd.index_count)):
                        fail(NdpError.OFFSETS, n_bags)         # ... to the index count
                    with m.Else():
                        m.d.comb += offs.elems.ready.eq(1)
                        m.d.sync += [prev.eq(v), i_off.eq(i_off + 1)]
                        with m.If(i_off == nb):
                            m.d.comb += [tb_wp.addr.eq(cap_t), tb_wp.data.eq(v), tb_wp.en.eq(1)]
                            m.d.sync += [cap_t.eq(cap_t + 1), nb.eq(nb + cmd.batch_size)]
                        with m.If(i_off == 0):
                            m.d.sync += first.eq(v)
                        with m.If(i_off == n_bags):
                            m.d.sync += last.eq(v)
                            m.next = "OFFS_DONE"
            with m.State("OFFS_DONE"):
                idx_end = Signal(WIDE)
                m.d.comb += idx_end.eq(cmd.indices_addr + ((last - 1)[:32] >> 4))
                with m.If(last == first):
                    m.next = "COPY_WAIT"               # no index: an empty log
                with m.Elif(idx_end >= CAP):
                    fail(NdpError.ADDRESS, AddressFault.INDICES)
                with m.Else():
                    m.next = "ATTEMPT"
            with m.State("ATTEMPT"):
                m.d.sync += [entries.eq(0), alloc_e.eq(SLOT_HEADER_LINES), part.eq(0), p_log.eq(0),
                             st_lookups.eq(0), part_e.eq(SLOT_HEADER_LINES), part_entries.eq(0)]
                m.next = "PASS_INIT"
            with m.State("PASS_INIT"):
                with m.If(gen == GEN_MAX):
                    m.d.sync += [clr_set.eq(0), clearing.eq(1)]
                    m.next = "CLEAR"
                with m.Else():
                    m.d.sync += gen.eq(gen + 1)
                    m.next = "PASS_START"
            with m.State("CLEAR"):
                # Every generation tag has been used: empty the set for real (rare).
                m.d.sync += clr_set.eq(clr_set + 1)
                with m.If(clr_set == NSETS - 1):
                    m.d.sync += [clearing.eq(0), gen.eq(1)]
                    m.next = "PASS_START"
            with m.State("PASS_START"):
                with m.If(~idxs.busy):
                    m.d.comb += [idxs.start.eq(1), idxs.first.eq(first), idxs.count.eq(last - first)]
                    m.d.sync += [t.eq(0), pos.eq(first)]
                    m.next = "TLOAD"
            with m.State("TLOAD"):                  # table_index = t; descriptor and end next cycle
                m.d.comb += tb_rp.addr.eq(t + 1)
                m.next = "TLATCH"
            with m.State("TLATCH"):
                m.d.sync += [tbl_lines.eq(tab.dim[4:9]), tbl_rows.eq(tab.rows), tbl_base.eq(tab.base_addr),
                             t_end.eq(tb_rp.data)]
                m.next = "SCAN"
            with m.State("SCAN"):
                in_part = (index & pmask) == part[:32]
                # room for this index's key: S1's and S2's may still be pushed
                room = key_q.level <= self.KEY_QUEUE - 3
                with m.If(s2_valid & s2_ovf):
                    with m.If(p_log == 32):
                        fail(NdpError.LOG_FULL, entries)
                    with m.Else():
                        m.d.sync += [hard_stop.eq(1), s1_valid.eq(0), s2_valid.eq(0), p_log.eq(p_log + 1)]
                        m.d.comb += idxs.abort.eq(1)
                        m.next = "RESTART"
                with m.Elif(s2_full):
                    fail(NdpError.LOG_FULL, entries)
                with m.Elif(media):
                    fail(NdpError.MEDIA, media_info)
                with m.Elif(pos == t_end):
                    m.d.sync += s1_valid.eq(0)
                    with m.If(~s1_valid & ~s2_valid):
                        with m.If(pos == last):
                            m.next = "PASS_END"
                        with m.Else():
                            m.d.sync += t.eq(t + 1)
                            m.next = "TLOAD"
                with m.Elif(idxs.elems.valid):
                    with m.If(index >= tbl_rows):
                        # The indices before it are judged first (S1's in S2 next cycle).
                        m.d.sync += s1_valid.eq(0)
                        with m.If(~s1_valid):
                            fail(NdpError.INDEX_RANGE, pos)
                    with m.Elif(~in_part | room):
                        m.d.comb += idxs.elems.ready.eq(1)
                        m.d.sync += [pos.eq(pos + 1), s1_valid.eq(in_part), s1_key.row.eq(index),
                                     s1_key.table.eq(t), s1_set.eq(s0_set), s1_lines.eq(tbl_lines),
                                     s1_addr.eq(tbl_base + index * tbl_lines)]
                        with m.If(part == 0):
                            m.d.sync += st_lookups.eq(st_lookups + 1)
                    with m.Else():
                        m.d.sync += s1_valid.eq(0)
                with m.Else():
                    m.d.sync += s1_valid.eq(0)
            with m.State("PASS_END"):
                # The partition is complete once the copy engine holds none of its keys (a later
                # RESTART clears the copy engine, which must then hold only that pass's keys).
                with m.If(copy_idle & (rd_pend == 0) & ~out_valid):
                    m.next = "NEXT_PART"
            with m.State("NEXT_PART"):
                # Depth-first over the partition tree: (part, d) has the children (part, d+1) and
                # (part + 2**d, d+1). Done with a right child: its parent is done too, go up;
                # done with a left child: its sibling is next; back at the root: all done.
                half = Signal(33)
                m.d.comb += half.eq(Const(1, 33) << (p_log - 1)[:6])
                with m.If(p_log == 0):
                    m.next = "COPY_WAIT"
                with m.Elif((part & half) != 0):
                    m.d.sync += [part.eq(part - half), p_log.eq(p_log - 1)]
                with m.Else():
                    m.d.sync += [part.eq(part + half), part_e.eq(alloc_e), part_entries.eq(entries),
                                 part_grp.eq(grp), part_grp_e.eq(grp_e)]
                    m.next = "PASS_INIT"
            with m.State("RESTART"):
                # A set overflowed: wait for the copy engine's reads, forget its work (this pass's
                # keys only), redo the partition as its two halves.
                with m.If(~idxs.busy & (rd_pend == 0) & ~out_valid):
                    m.d.comb += copy_clr.eq(1)
                    # The group line goes back to what the partition began with: entries of the
                    # abandoned pass may have filled its later places or started new groups.
                    m.d.sync += [hard_stop.eq(0), alloc_e.eq(part_e), entries.eq(part_entries),
                                 grp.eq(part_grp), grp_e.eq(part_grp_e)]
                    with m.If(part == 0):
                        m.d.sync += st_lookups.eq(0)
                    m.next = "PASS_INIT"
            with m.State("COPY_WAIT"):
                with m.If(quiet):
                    with m.If(media):
                        m.d.sync += [err.eq(NdpError.MEDIA), err_info.eq(media_info)]
                        m.next = "DONE"
                    with m.Elif(entries[:GSB] != 0):
                        m.next = "GROUP_FLUSH"
                    with m.Else():
                        m.d.sync += rec_logged.eq(1)
                        m.next = "LOGGED_REC"
            with m.State("GROUP_FLUSH"):            # the last group line, not full
                m.d.comb += [src_grp.valid.eq(1), src_grp.addr.eq(slot_base + grp_e),
                             src_grp.data.eq(grp.as_value())]
                with m.If(src_grp.ready):
                    m.next = "GROUP_WAIT"
            with m.State("GROUP_WAIT"):
                with m.If((wr_pend == 0) & ~out_valid):
                    with m.If(media):
                        m.d.sync += [err.eq(NdpError.MEDIA), err_info.eq(media_info)]
                        m.next = "DONE"
                    with m.Else():
                        m.d.sync += rec_logged.eq(1)
                        m.next = "LOGGED_REC"
            with m.State("LOGGED_REC"):
                m.d.comb += src_rec.valid.eq(1)
                with m.If(src_rec.ready):
                    m.next = "REC_WAIT"
            with m.State("REC_WAIT"):
                with m.If((wr_pend == 0) & ~out_valid):
                    with m.If(media):
                        m.d.sync += [err.eq(NdpError.MEDIA), err_info.eq(media_info)]
                    m.next = "DONE"
            with m.State("DRAIN"):
                with m.If(quiet):
                    m.next = "DONE"
            with m.State("DONE"):
                m.d.comb += done.eq(1)
                m.next = "IDLE"

        m.d.comb += self.ctl.busy.eq(~fsm.ongoing("IDLE") | self.ctl.start)

        # Entries wait for the FREE record's write response (it is the only write before them).
        with m.If(~fsm.ongoing("IDLE") & ~fsm.ongoing("FREE_REC") & (wr_pend == 0)):
            m.d.sync += free_acked.eq(1)
        return m
