"""UpdateEngine: PyTorch's sparse SGD of every embedding index occurrence, next to memory.

Contract
--------
Ports
- ``ctl``: In(engine_control_signature()) (hw/ndp/command.py). ``ctl.start`` (one cycle, with
  ``ctl.cmd`` valid and stable until ``done``) starts an UPDATE command; a start while busy is
  ignored. The engine reads table descriptor t by driving ``ctl.table_index`` = t and using
  ``ctl.table`` one cycle later (it may hold an index for several cycles). ``busy`` is high
  from the cycle after ``start`` until ``done``; ``done`` is a one-cycle pulse with ``error``,
  ``error_info`` and ``stats`` valid in that cycle. ``cmd.opcode`` and ``cmd.tag`` are ignored.
- ``mem``: Out(client_port_signature(addr_bits, ctx_bits)) (hw/mem/arbiter.py, hw/mem/port.py).
  Requests are single lines (writes with every byte enabled, never poisoned) from a request
  register: once ``req.valid`` rises it stays until accepted. ``rd_rsp`` and ``wr_rsp`` are
  always ready: every read has its destination reserved before it is issued. ``ctx`` must
  come back unchanged: ctx[0:P] names the destination (buffer slot), ctx[P:P+3] the buffer
  (``Kind``), P = log2(scratch_lines) (at least 8); bits above are zero.
- ``grad_port``: the same signature, for the pooled-output gradient reads only (Kind GRAD;
  no writes, ``wr_rsp`` unused, ``rd_rsp`` always ready). ``mem`` carries everything else
  (arrays, row fills and write-backs). Why a second port: rm4's UPDATE reads a gradient
  line per occurrence besides its fills and write-backs, 47k requests on one port against
  a media bound of 43k cycles (hw/top.py shares lookup unit 0's interleaver port with it;
  LOOKUP and UPDATE never run at the same time). No line is on both ports (the gradients
  are never written by the engine), so no ordering between them is needed.

Constructor: ``UpdateEngine(addr_bits=, capacity_lines=, ctx_bits=None, scratch_lines=1024,
fp32_pipeline="compact")``; ``fp32_pipeline`` picks the FMA / divider pipelines
(hw/common/fp32.py: FMA latency L = 5 "compact" or 12 "deep"; same results).
``addr_bits`` <= 32 and ``capacity_lines`` <= 2**addr_bits: every line the engine touches is
below capacity_lines. ``scratch_lines``: the row scratchpad in 64-byte lines, a power of two
>= 16 (one 256-float row). ``ctx_bits`` defaults to, and must be at least,
``UpdateEngine.required_ctx_bits(scratch_lines)`` = 3 + max(8, log2(scratch_lines)) (13 for the
default); ``engine.ctx_bits`` is the port's width.

Semantics (architecture.md section 5; bit-exact with sim/model/embedding.py ``tbe_sgd_step``)
For every index occurrence in input order (table by table, bag by bag, index by index) and
every float lane: c = g (SUM), fp32(g * w_j) (WEIGHTED_SUM), fp32(g * fp32(1/L)) (MEAN; 1/L
from Fp32DivInt(1.0, L) once per bag); row = fma(-lr, c, row), one rounding. g is line k of
the bag's pooled-output gradient, cmd.grad_addr + b*row_pitch_lines + table.col_lines + k. A
row that occurs k times is updated k times in that order. NaN results are 0x7FC00000.

Two passes
1. Validation; no write is issued before it ends. The offsets array (T*B+1 u32) is streamed
   and checked, then the indices array, indices[0:offsets[T*B]] (offsets[0] must be 0 and
   offsets[T*B] = cmd.index_count; nothing after it is read), and each index is checked against the rows
   of its table (beside the apply pass: 2. below). The first error found, in this order,
   ends the command:
   - ADDRESS, error_info = the AddressFault (hw/ndp/command.py): the offsets array; then for each
     table t in order, TABLE_ROWS + t its rows (base_addr + rows*dim/16 > capacity_lines) and
     GRADIENTS the gradient vector of its last bag (grad_addr + (B-1)*row_pitch_lines + col_lines + dim/16
     > capacity_lines); later INDICES / WEIGHTS (the line holding element
     offsets[T*B]-1; weights only when flags.has_weights).
   - OFFSETS, error_info = position i of the first offset with offsets[i] < offsets[i-1], or
     with offsets[i] - offsets[i-1] > 65535 (a bag longer than Fp32DivInt's 16-bit L; this
     engine rejects it in every pooling mode); then 0 when offsets[0] != 0 and T*B when
     offsets[T*B] != cmd.index_count (checked before the indices' ADDRESS).
   - INDEX_RANGE, error_info = position of the first index >= its table's rows.
2. Apply: bag stage -> lookahead -> scratchpad -> datapath (below). Each row is read into the
   scratchpad, updated there, and written back when evicted, by the cleaner or at the end;
   before ``done`` every cached row is written back and every write response (durable) has
   arrived. The apply pass starts once the offsets are checked (with the indices' and
   weights' ADDRESS), beside the index check: its lookahead takes an index only once the
   check has passed it (``val_pos``), and nothing is written back before the check has
   ended (``val_ok``; the misses queue their write-backs and wait). An INDEX_RANGE error, or
   a MEDIA error, found meanwhile stops issuing, drains the responses, drops the scratchpad
   (nothing was written) and ends with that error. So a MEDIA error of a row or gradient
   read may be reported where, in the order above, an INDEX_RANGE error further on came
   first; the command writes nothing either way.
   A command without index occurrences ends after validation and writes nothing.
MEDIA, error_info = what << 24 (1 offsets, 2 indices, 3 weights, 4 gradients, 5 row read,
6 row write): a read response with error or poison, or a write response with error. In the
validation pass nothing has been written. In the apply pass the engine stops issuing,
drains every outstanding response, drops the scratchpad without writing it back and ends
with MEDIA: the rows of this batch then hold their old value or any intermediate value of
their update sequence (rows evicted earlier were written back); the device's undo log is
the recovery path. After any error the engine is ready for the next command.

Stats (EngineStats, valid with ``done``, also after an error): lookups = occurrences
applied; rows_read / rows_written = row fills / row write-backs (on success rows_written >=
rows_read: a row the cleaner wrote back and that is hit again is written back again);
lines_read = every line read: the offsets and the used indices in validation, again in the
apply pass by table (each table's offsets[t*B..(t+1)*B] and indices; a line two tables share
is read for each), the weights (when has_weights, by table), the gradients of non-empty
bags, rows; lines_written = row lines
written; lines_pushed = 0; unique_rows = 0. UPDATE does not count distinct rows: with
evictions that needs a set as large as the batch's rows (an earlier 4*scratch_lines hash
filter gave only a lower bound, 4,244 for rm1's 16,372 at batch 64). LOG counts them exactly
(its entries), and the tests compare that with the trace's distinct (table, row) pairs.

After reset (power-up) the engine first clears its tag, slot and arrival memories,
one entry per cycle for max(scratch_lines, 256) cycles (``Main.INIT``, busy): memories keep their
contents through a reset, and a stale valid tag would make a command update a row it never
read. A ``start`` during that sweep is held and runs when it ends.

Scratchpad (a write-back cache of rows)
- Slots of S = 2**ceil(log2(max dim/16 over the command's tables)) lines, scratch_lines/S of
  them. Per slot (a Memory): row address (the key: a row is its first line address, so
  tables must not partially overlap), lines, the number of the last occurrence that uses it,
  a reference bit, its tag way.
- Lookup: an 8-way set-associative tag store, scratch_lines/2 sets, indexed by a
  multiplicative hash of the row address, maps row -> slot. Tags are decoupled from slots
  (4x more tag entries than slots when S = 1), so the distinct rows of a batch that fit in
  the slots are read once and written once unless 9 or more of them share a tag set; then an
  unpinned row of that set is evicted (more traffic, same result).
- Pinning without counters: occurrence n (input order) carries its number; a slot is pinned
  while its last user's number >= ``completed`` (occurrences whose last line has been written
  into the scratchpad). Only unpinned slots are evicted, so all pending updates of a row are
  applied before it is written back; a row that recurs later is read again, and the memory
  port's read-after-write rule makes that exact.
- Replacement: never-used slots first, then CLOCK (second chance: the reference bit is set on
  a hit and cleared as the hand passes; pinned slots are skipped). If every slot is pinned the
  lookahead waits for the datapath.
- Ordering: a miss queues its victim's write-back (when the victim is dirty) and its own
  fill (the miss queue, 16 misses); the port takes them in queue order, a victim's lines
  read from the scratchpad and issued as writes before the fill's reads (one request stream:
  program order), so a row evicted and missed again is read after its write-back.
- Cleaner (eager write-back; Lee, Tyson and Farrens, MICRO 2000): a pointer walks the used
  slots, one per cycle, and writes back a dirty row that no queued occurrence uses (unpinned)
  and that was not hit since the CLOCK hand last passed it, while the lookahead runs, the
  write-back machine is free (no victim write-back of the miss at the queue's head is
  pending; the cleaner's writes then interleave with the fills' reads) and fewer than
  CLEAN_WRITES (48) writes are in flight. The row stays
  cached, clean: its eviction needs no write-back, and the end of the batch has fewer rows to
  write. So the write media work while the datapath is busy with hot rows (no misses), where
  they were idle. A dirty bit per slot (a scratch_lines register) is set by every occurrence
  pushed for the slot (a hit or an insert) and cleared when the cleaner starts (a push in
  that cycle keeps it set; a push between the cleaner's choice and its start cancels the
  choice), so a row hit after its write-back started is dirty again and written again later
  (rm4 b512: 13 of 7,021 rows). Only unpinned rows are cleaned: a pinned row's pending
  updates would land after its dirty bit was cleared (a mutant that cleans pinned rows fails
  8 of the testbench's 8 default-build tests). rm4 b512 in the engine's testbench
  ("channels" model): 54,432 -> 51,083 cycles; rm1 b64 unchanged (182,040, 44 rows written
  twice of 22,265).
- Memories (FPGA rules, hw/common/ram.py): the scratchpad is two ``LvtRam`` banks by line
  parity, each written by fills and FMA results and read by an FMA operand port and the
  write-backs (the operand read bypasses a same-cycle result); the gradient and contribution
  rings have a replica each for the second FMA slot; the tag store is one ``BypassRam`` per
  way. A tag invalidation (the victim's entry, or a flush) is written one cycle after it is
  decided, through the way's only write port; no insert happens in that cycle (an evicting
  insert moves the manager to DROP for it; FL_CHK inserts nothing). The tag compare (S2) is
  registered before the manager acts on it (S3); a compare whose set was written after its
  read is redone from a re-read, and S2 does not move into S3 in a cycle that may write its
  set, so lookups never see a stale entry. The arrival bits of the scratchpad (a
  scratch_lines register: set by fill responses, a whole slot cleared the cycle after a row
  is inserted, before its occurrence can leave the occurrence queue) and of the gradient
  ring (1 x 512, set by responses and cleared by issues, two write ports) are read by the
  FMA window's entries (and the MUL front): flip-flops, below the audit's 4-kbit limit
  (tools/mem_audit.py); so are the cleaner's dirty bits (a scratch_lines register). The slot
  memory has a second read port, the cleaner's (a replica block RAM, transparent for the one
  write port).

Two tables at a time (the apply pass)
- Occurrences need not go to the datapath in input order: the bag stage takes the tables in
  pairs (2p, 2p + 1) and, when the pair qualifies, alternates their bags (bag b of table 2p,
  bag b of table 2p + 1, bag b + 1 of table 2p, ...). Each table's occurrences keep their
  order, and the two tables' rows are different rows, so every row sees its updates in
  input order: the result is the same bit for bit. A pair qualifies when its row ranges are
  disjoint (a table named twice never does) and one of its tables spans at most
  scratch_lines/8 lines (``interleave_lines``; validation decides it per pair, ``pair_il``);
  other pairs go one table after the other.
- Why: a small table's rows recur within a few occurrences (rm4's tables of 3 to 105 rows
  under Zipf), and one row's updates form a chain of FMA latencies. In input order such a
  table keeps the datapath waiting while the media idle, and the next, cold table keeps the
  media busy while the datapath idles. Alternating with the other table of the pair fills
  the chain's gaps (a trace model of the FMA alone on rm4 b512: 38.7k cycles in input order,
  32.2k with the qualifying pairs interleaved, 30.5k with every pair, 26.9k with four tables
  at a time). Why only with a small table: two large tables interleaved share the
  scratchpad between two working sets; with every pair interleaved rm1 b64 re-read 27,179
  rows instead of 22,265 and took 217,009 cycles instead of 182,040 in the engine's
  testbench. A small table costs the other at most an eighth of the scratchpad.
- Each lane (0: tables 2p, 1: tables 2p + 1) has its own readers and element streams of the
  offsets, indices and weights (validation reads the offsets through lane 0's reader, before
  the apply pass starts, and the indices through one of its own); a lane reads its tables'
  runs back to back, the reader starting the next run as soon as it has issued the last
  one. A reader's request ctx names its lane in the payload's top bit and validation's index
  reader in the bit below.

Pipeline, latency and throughput (one request per cycle and port at most)
- Bag stage: one bag per cycle (plus dim/16 - 1 cycles to issue the gradient lines of a
  non-empty bag into a 512-line ring, and 6 cycles per table pair to start it); 1/L through
  an input register and Fp32DivInt (1 + 12 cycles, pipelined).
- Lookahead: a hit costs 1 cycle (row address, tag-set read, compare and decision are
  pipelined), a miss into a free slot 1, a miss that evicts 2 (+1 per slot the CLOCK hand
  passes) while the miss queue has room, and an occurrence whose tag set the miss before it
  wrote 2 more (its set is read again); the port then spends dim/16 requests on the fill and as many on the
  victim's write-back.
  Up to 512 occurrences wait in the occurrence queue with their fills in flight, which hides
  the media latency (about 100-130 reads in flight in the measurements below) and lets the
  fills and write-backs of miss-heavy stretches overlap the FMA work of hit-heavy ones (the
  two alternate over hundreds of occurrences: a table's cold start, Zipf's hot rows). The
  gradient ring bounds it too (a queued occurrence holds its bag's gradient lines): with
  128 occurrences and 256 gradient lines, rm4 b512 took 62,123 cycles and rm1 b64 190,502
  in the engine's testbench ("channels" model); with 512 and 512, 58,073 and 182,162. More
  changes little (2048 and 1024: rm4 58,049), nor do 64 queued misses instead of 16.
- Datapath (datapath.py, ``UpdateDatapath``: its contract is there): two groups of 16 Fp32Fma
  lanes behind a MUL front (c = g * scale) and a window of the two oldest queued occurrences.
  One row updated back to back costs L cycles per occurrence (its lines are in flight), but
  an occurrence of another row fills the gap; otherwise up to two line-steps per cycle for
  rows of two or more lines (SUM; with MUL, the MUL front's one line per cycle).
- End: write-back of every dirty cached row (one line per cycle as the port accepts), then
  ``done`` after the last write response.
- Validation streams whole lines through 128-line reorder buffers, the offsets and then the
  indices, so at a 120-cycle read latency it takes about 1 cycle per line (16 elements: a
  line is checked and popped in one cycle), plus 1 per table on each array (an offsets
  line holding table starts stays one cycle more per start). rm4 b512 in the engine's
  testbench: 3,000 cycles for 3,330 lines (before: 64 lines for the offsets and a check
  cycle before each pop, 5,600).
- The index check runs beside the apply pass on its own reader, at the lowest priority of
  the port (first, it starved the apply pass's own reads: rm4 b512 in the testbench 48,288
  cycles; last, 47,637; before the overlap, 48,483).
- Fixed cost per command: the offsets round trip (validation), the first fills, the last
  writes (about 600-900 cycles at 120/280-cycle read/write latency).
Measured (tests/test_update_engine.py, test_perf: 120-cycle reads, 280-cycle writes retired at
0.32 lines/cycle, <= 256 reads / 128 writes outstanding; UE_PERF_JSON=F writes them): one
dim-16 row 400 times in a row: 7.2 cycles/occurrence (its 1.7 marginal is below the 5-cycle
chain because the 100-occurrence run is the first command and also waits for the INIT
sweep); the same for a dim-32 WEIGHTED_SUM row: 5.2 marginal; uniform random rows, dim 16:
5.1 (512 occurrences, no eviction) and 3.45 (4096 occurrences, evicting), 3.2 marginal (the
write bandwidth allows 3.1); dim-64 WEIGHTED_SUM, 512 random occurrences: 15.0 (write bound:
1940 lines at 0.32/cycle); Zipf(1.2) rows, dim 32: 2.06. (Before issue 15's tenth to twelfth
steps: 5.4, 3.5, 15.7 and 2.5; before the second FMA slot and the miss queue: 6.3, 3.8, 3.5,
15.5 and 3.2.)

Assumptions: the processor has checked the descriptor (T in 1..128, B >= 1, dims multiples of
16 in [16, 256], rows >= 1, pooling mode, has_weights for WEIGHTED_SUM). The memory port honours
hw/mem/port.py (read-after-write per line, writes to a line in order).
"""
from __future__ import annotations

import enum
import functools
import operator
from types import SimpleNamespace

from amaranth import Cat, Const, Elaboratable, Module, Mux, ResetInserter, Signal, Value
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ...common.cxl_mem import LINE_BITS
from ...common.fp32 import ONE, Fp32Fma
from ...common.fp32_div import Fp32DivInt
from ...common.ram import BypassRam, LvtRam
from ...mem.arbiter import client_port_signature
from ...mem.port import RequestSource
from ..command import AddressFault, FLOATS_PER_LINE, MAX_TABLES, NdpError, PoolMode, engine_control_signature
from .datapath import UpdateDatapath, occurrence_layout

LANES = FLOATS_PER_LINE
KIND_BITS = 3
MAX_BAG = 0xFFFF                 # Fp32DivInt takes a 16-bit L
WIDE = 52                        # address arithmetic of the range checks never wraps


class Kind(enum.IntEnum):
    """ctx[P:P+3]: which buffer a response fills (also the 'what' of ADDRESS / MEDIA infos)."""
    OFFSETS = 1
    INDICES = 2
    WEIGHTS = 3
    GRAD = 4
    ROW = 5
    WB = 6


def _hash(key, bits, mult):
    """Multiplicative (Fibonacci) hash of a 32-bit key to ``bits`` bits."""
    return (key[:32] * mult)[32 - bits:32]


def _shift_of(max_lines):
    """log2 of the slot size: the power of two >= max_lines (1..16)."""
    return Mux(max_lines <= 1, 0, Mux(max_lines <= 2, 1, Mux(max_lines <= 4, 2, Mux(max_lines <= 8, 3, 4))))


class _LineReader(Elaboratable):
    """``n_lines`` consecutive lines from ``first_line``, delivered in order.

    Reads are issued while the reorder buffer (``depth`` lines) has room; responses (any
    order) land in the buffer slot named by ``req_slot``; ``out`` presents them in order
    from a registered read port. ``start`` begins a run (a run may start once the previous one
    is issued, ``issue_idle``: the buffer delivers them back to back). A command's reset
    (``ResetInserter``) forgets everything.
    """

    def __init__(self, depth, addr_bits):
        self.depth = depth
        self.slot_bits = ceil_log2(depth)
        self.start = Signal()
        self.first_line = Signal(addr_bits)
        self.n_lines = Signal(addr_bits + 1)
        self.req_valid = Signal()
        self.req_ready = Signal()
        self.req_addr = Signal(addr_bits)
        self.req_slot = Signal(self.slot_bits)
        self.rsp_valid = Signal()
        self.rsp_slot = Signal(self.slot_bits)
        self.rsp_data = Signal(LINE_BITS)
        self.out_valid = Signal()
        self.out_ready = Signal()
        self.out_data = Signal(LINE_BITS)
        self.issue_idle = Signal()              # every line of the run issued: ``start`` may come

    def elaborate(self, platform):
        m = Module()
        sb, depth = self.slot_bits, self.depth
        remaining = Signal.like(self.n_lines)
        next_addr = Signal.like(self.first_line)
        issue_ptr = Signal(sb + 1)
        head = Signal(sb + 1)
        arrived = Signal(depth)
        m.submodules.buf = buf = Memory(shape=LINE_BITS, depth=depth, init=[])
        wp = buf.write_port()
        rp = buf.read_port()
        m.d.comb += [wp.addr.eq(self.rsp_slot), wp.data.eq(self.rsp_data), wp.en.eq(self.rsp_valid)]

        occupancy = Signal(sb + 1)
        m.d.comb += [
            occupancy.eq(issue_ptr - head),
            self.req_valid.eq((remaining != 0) & (occupancy != depth)),
            self.issue_idle.eq(remaining == 0),
            self.req_addr.eq(next_addr),
            self.req_slot.eq(issue_ptr[:sb]),
        ]
        with m.If(self.req_valid & self.req_ready):
            m.d.sync += [remaining.eq(remaining - 1), next_addr.eq(next_addr + 1), issue_ptr.eq(issue_ptr + 1)]
        with m.If(self.start):
            m.d.sync += [remaining.eq(self.n_lines), next_addr.eq(self.first_line)]

        pop = Signal()
        m.d.comb += [
            pop.eq(arrived.bit_select(head[:sb], 1) & (~self.out_valid | self.out_ready)),
            rp.addr.eq(head[:sb]), rp.en.eq(pop), self.out_data.eq(rp.data),
        ]
        set_mask = Mux(self.rsp_valid, Const(1, depth) << self.rsp_slot, 0)
        clr_mask = Mux(pop, Const(1, depth) << head[:sb], 0)
        m.d.sync += arrived.eq((arrived | set_mask) & ~clr_mask)
        with m.If(pop):
            m.d.sync += [head.eq(head + 1), self.out_valid.eq(1)]
        with m.Elif(self.out_ready):
            m.d.sync += self.out_valid.eq(0)
        return m


class _ElementStream(Elaboratable):
    """u32 elements out of a line stream: ``count`` elements from lane ``first_lane`` on.

    ``skid``: the elements leave through a skid buffer (no added latency): ``ready`` then ends
    at a flip-flop instead of running on into the line reader's head (UPDATE's lookahead:
    its S3 decision -> S0's take -> the index and weight streams -> the readers, 18 LUT
    levels). ``idle`` waits for a held element too."""

    def __init__(self, count_bits, skid: bool = False):
        self.skid = skid
        self.start = Signal()
        self.first_lane = Signal(4)
        self.count = Signal(count_bits)
        self.line_valid = Signal()
        self.line_ready = Signal()
        self.line_data = Signal(LINE_BITS)
        self.valid = Signal()
        self.ready = Signal()
        self.data = Signal(32)
        self.idle = Signal()                    # the run's elements all taken: ``start`` may come

    def elaborate(self, platform):
        m = Module()
        lane = Signal(4)
        remaining = Signal.like(self.count)
        take = Signal()
        el_valid = Signal()                     # the element at the line side
        el_ready = Signal()
        el_data = Signal(32)
        m.d.comb += [
            el_valid.eq(self.line_valid & (remaining != 0)),
            el_data.eq(self.line_data.word_select(lane, 32)),
            take.eq(el_valid & el_ready),
            self.line_ready.eq(take & ((lane == LANES - 1) | (remaining == 1))),
        ]
        if self.skid:
            held = Signal(32)
            held_valid = Signal()
            m.d.comb += [el_ready.eq(~held_valid), self.valid.eq(held_valid | el_valid),
                         self.data.eq(Mux(held_valid, held, el_data)),
                         self.idle.eq((remaining == 0) & ~held_valid)]
            with m.If(held_valid):
                with m.If(self.ready):
                    m.d.sync += held_valid.eq(0)
            with m.Elif(el_valid & ~self.ready):
                m.d.sync += [held.eq(el_data), held_valid.eq(1)]
        else:
            m.d.comb += [el_ready.eq(self.ready), self.valid.eq(el_valid), self.data.eq(el_data),
                         self.idle.eq(remaining == 0)]
        with m.If(take):
            m.d.sync += [remaining.eq(remaining - 1), lane.eq(lane + 1)]
        with m.If(self.start):
            m.d.sync += [remaining.eq(self.count), lane.eq(self.first_lane)]
        return m


class Main(enum.IntEnum):
    IDLE = 0
    CHK_OFFS = 1
    TBL_CHK = 2
    OFFS_SCAN = 3
    IDX_PREP = 4
    IDX_TLOAD = 5
    IDX_SCAN = 6
    IDX_DONE = 7
    APPLY = 10
    FLUSH = 11
    WAIT_WR = 12
    ERR_DRAIN = 13
    ABORT = 14
    ABORT_SCAN = 15
    DONE = 16
    INIT = 17                   # after reset: clear the on-chip tag / slot / arrival memories


class Bag(enum.IntEnum):
    IDLE = 0
    FIRST = 1
    TSEL = 2
    TLOAD = 3
    BAG = 4
    GRAD = 5
    DONE = 6


class Mgr(enum.IntEnum):
    IDLE = 0
    LOOK = 1
    CLOCK = 2
    CONF_RD = 3
    CONF_CHK = 4
    DROP = 5                         # one cycle after an eviction: the victim's tag drop lands
    FL_CHK = 7


class _TagWrite:
    """A tag-store write request: set, per-way entries and per-way enables."""
    def __init__(self, set_bits: int, ways: int, entry_bits: int):
        self.addr = Signal(set_bits)
        self.data = Signal(ways * entry_bits)
        self.en = Signal(ways)


class _TagRead:
    """The tag-store read: a set in, its ways out the next cycle."""
    def __init__(self, set_bits: int, width: int):
        self.addr = Signal(set_bits)
        self.data = Signal(width)


class UpdateEngine(wiring.Component):
    """Sparse SGD of a TBE batch (opcode UPDATE); see the module docstring."""
    WAYS = 8
    GRAD_LINES = 512
    CONTRIB_LINES = 32
    OCC_DEPTH = 512
    MISS_DEPTH = 16                  # misses (victim write-back + fill) queued for the port
    CLEAN_WRITES = 48                # the cleaner starts a write-back only below this many writes in flight
    FMA_QUEUE_DEPTH = 16
    BAG_DEPTH = 32
    OFFSETS_ROB = 128
    INDICES_ROB = 128
    WEIGHTS_ROB = 16

    @classmethod
    def required_ctx_bits(cls, scratch_lines: int = 1024) -> int:
        payload = max(ceil_log2(scratch_lines), ceil_log2(cls.GRAD_LINES), ceil_log2(cls.INDICES_ROB),
                      ceil_log2(cls.OFFSETS_ROB), ceil_log2(cls.WEIGHTS_ROB))
        return payload + KIND_BITS

    def __init__(self, *, addr_bits: int, capacity_lines: int, ctx_bits: int | None = None,
                 scratch_lines: int = 1024, fp32_pipeline: str = "compact"):
        if scratch_lines < 16 or scratch_lines & (scratch_lines - 1):
            raise ValueError(f"scratch_lines must be a power of two >= 16, got {scratch_lines}")
        if not 1 <= capacity_lines <= 1 << addr_bits or addr_bits > 32:
            raise ValueError(f"capacity_lines {capacity_lines} does not fit {addr_bits} address bits (<= 32)")
        need = self.required_ctx_bits(scratch_lines)
        if ctx_bits is None:
            ctx_bits = need
        if ctx_bits < need:
            raise ValueError(f"ctx_bits must be at least {need}, got {ctx_bits}")
        self.addr_bits = addr_bits
        self.capacity_lines = capacity_lines
        self.ctx_bits = ctx_bits
        self.scratch_lines = scratch_lines
        self.interleave_lines = scratch_lines // 8     # "Two tables at a time": a small table
        if fp32_pipeline not in Fp32Fma.LATENCIES:
            raise ValueError(f"fp32_pipeline must be one of {tuple(Fp32Fma.LATENCIES)}, not {fp32_pipeline!r}")
        self.fp32_pipeline = fp32_pipeline
        self.payload_bits = need - KIND_BITS
        super().__init__({
            "ctl": In(engine_control_signature()),
            "mem": Out(client_port_signature(addr_bits, ctx_bits)),
            "grad_port": Out(client_port_signature(addr_bits, ctx_bits)),
        })

    # ------------------------------------------------------------------------------------
    def elaborate(self, platform):
        m = Module()
        A = self.addr_bits
        CAP = self.capacity_lines
        SL = self.scratch_lines
        SB = ceil_log2(SL)                      # scratch line address bits (also slot index bits)
        GB = ceil_log2(self.GRAD_LINES)
        W = self.WAYS
        WB_ = ceil_log2(W)
        TSB = SB - 1                            # tag sets = scratch_lines / 2
        init_sweep = max(1 << TSB, SL, self.GRAD_LINES)   # the deepest memory INIT clears
        PB = self.payload_bits
        cmd = self.ctl.cmd
        tab = self.ctl.table

        def ctx_of(kind, payload):
            p = Value.cast(payload)
            if len(p) < PB:
                p = Cat(p, Const(0, PB - len(p)))
            return Cat(p[:PB], Const(int(kind), KIND_BITS))

        # ---------------------------------------------------------------- shared state --
        state = Signal(Main, init=Main.INIT)
        init_ctr = Signal(range(init_sweep))    # the INIT sweep's entry
        start_held = Signal()                   # a start that came during INIT
        clr = Signal()                          # start of a command: forget the last one
        freeze = Signal()                       # MEDIA abort: issue nothing new
        frozen = Signal()                       # ... from the abort until the next command clears
        m.d.comb += freeze.eq(frozen)
        tbl_sel = Signal(7)
        m.d.comb += self.ctl.table_index.eq(tbl_sel)

        err = Signal(NdpError)
        err_info = Signal(32)
        media_err = Signal()
        media_info = Signal(32)

        st_lookups = Signal(32)
        st_rows_read = Signal(32)
        st_rows_written = Signal(32)
        st_lines_read = Signal(32)
        st_lines_written = Signal(32)

        n_bags = Signal(48)                     # T * B
        gmul = Signal(48)                       # (B - 1) * row_pitch_lines
        max_lines = Signal(5)
        slot_shift = Signal(3)
        nslots = Signal(SB + 1)
        m.d.comb += [slot_shift.eq(_shift_of(max_lines)), nslots.eq(Const(SL, SB + 1) >> slot_shift)]
        tb_first = Signal(32)                   # offsets[0]
        tb_last = Signal(32)                    # offsets[T*B]
        total = Signal(32)                      # index occurrences
        seq = Signal(32)                        # occurrences handed to the datapath
        completed = Signal(32)                  # occurrences whose last line is written back
        reads_out = Signal(16)
        writes_out = Signal(16)

        # ---------------------------------------------------------------- stream readers --
        cnt_bits = 48
        # The apply pass reads the offsets, indices and weights in two lanes (tables 0, 2, 4, ...
        # and 1, 3, 5, ...: "Two tables at a time" above); validation reads the offsets through
        # lane 0's reader (before the apply pass starts).
        lanes = []
        for sfx in ("", "1"):
            ln = SimpleNamespace()
            for arr, rob in (("off", self.OFFSETS_ROB), ("idx", self.INDICES_ROB), ("w", self.WEIGHTS_ROB)):
                m.submodules[f"rd_{arr}{sfx}"] = rd = ResetInserter(clr)(_LineReader(rob, A))
                setattr(ln, f"rd_{arr}", rd)
            for arr in ("off", "idx", "w"):
                m.submodules[f"es_{arr}{sfx}"] = es = ResetInserter(clr)(_ElementStream(cnt_bits, skid=arr != "off"))
                setattr(ln, f"es_{arr}", es)
            lanes.append(ln)
        rd_off, rd_idx, rd_w, es_off, es_idx, es_w = (getattr(lanes[0], k) for k in ("rd_off", "rd_idx", "rd_w",
                                                                                      "es_off", "es_idx", "es_w"))
        rd_off1, rd_idx1, rd_w1, es_off1, es_idx1, es_w1 = (getattr(lanes[1], k) for k in (
            "rd_off", "rd_idx", "rd_w", "es_off", "es_idx", "es_w"))
        # Validation's own index reader (the apply pass reads the indices beside it).
        m.submodules.rd_vidx = rd_vidx = ResetInserter(clr)(_LineReader(self.INDICES_ROB, A))
        for ln in lanes:
            for r, e in ((ln.rd_off, ln.es_off), (ln.rd_idx, ln.es_idx), (ln.rd_w, ln.es_w)):
                m.d.comb += [e.line_valid.eq(r.out_valid), e.line_data.eq(r.out_data)]
        # In the apply pass the element streams consume the readers; in validation the main
        # FSM takes whole lines (val_pop).
        val_pop_off = Signal()
        val_pop_idx = Signal()
        m.d.comb += [
            rd_off.out_ready.eq(es_off.line_ready | val_pop_off),
            rd_idx.out_ready.eq(es_idx.line_ready), rd_vidx.out_ready.eq(val_pop_idx),
            rd_w.out_ready.eq(es_w.line_ready),
            rd_off1.out_ready.eq(es_off1.line_ready), rd_idx1.out_ready.eq(es_idx1.line_ready),
            rd_w1.out_ready.eq(es_w1.line_ready),
        ]

        # ---------------------------------------------------------------- request path --
        src_look = RequestSource("look", A, self.ctx_bits)     # row write-backs and fills
        src_grad = RequestSource("grad", A, self.ctx_bits)
        src_idx = RequestSource("idx", A, self.ctx_bits)
        src_w = RequestSource("w", A, self.ctx_bits)
        src_off = RequestSource("off", A, self.ctx_bits)
        src_idx1 = RequestSource("idx1", A, self.ctx_bits)
        src_w1 = RequestSource("w1", A, self.ctx_bits)
        src_off1 = RequestSource("off1", A, self.ctx_bits)
        src_vidx = RequestSource("vidx", A, self.ctx_bits)
        # A reader's ctx: its buffer slot, the lane in the payload's top bit, and below it a
        # bit for validation's index reader.
        assert PB - 2 >= max(r.slot_bits for r in (rd_off, rd_idx, rd_w))
        m.d.comb += [src_vidx.valid.eq(rd_vidx.req_valid), rd_vidx.req_ready.eq(src_vidx.ready),
                     src_vidx.addr.eq(rd_vidx.req_addr),
                     src_vidx.ctx.eq(ctx_of(Kind.INDICES, Cat(rd_vidx.req_slot, Const(0, PB - 2 - rd_vidx.slot_bits),
                                                              Const(0b01, 2))))]
        for src, r, kind, lane in ((src_idx, rd_idx, Kind.INDICES, 0), (src_w, rd_w, Kind.WEIGHTS, 0),
                                   (src_off, rd_off, Kind.OFFSETS, 0), (src_idx1, rd_idx1, Kind.INDICES, 1),
                                   (src_w1, rd_w1, Kind.WEIGHTS, 1), (src_off1, rd_off1, Kind.OFFSETS, 1)):
            m.d.comb += [src.valid.eq(r.req_valid), r.req_ready.eq(src.ready), src.addr.eq(r.req_addr),
                         src.ctx.eq(ctx_of(kind, Cat(r.req_slot, Const(0, PB - 1 - r.slot_bits), Const(lane, 1))))]
        sources = [src_look, src_idx, src_idx1, src_w, src_w1, src_off, src_off1, src_vidx]

        req = self.mem.req
        out_valid = Signal()
        take = Signal()
        m.d.comb += [take.eq(~out_valid | req.ready), req.valid.eq(out_valid)]
        granted = Signal()
        g_write = Signal()
        mines = []
        for i, src in enumerate(sources):
            mine = Signal(name=f"src{i}_granted")
            higher = Cat(*[s.valid for s in sources[:i]]).any() if i else Const(0)
            m.d.comb += [mine.eq(src.valid & ~freeze & ~higher), src.ready.eq(take & mine)]
            mines.append(mine)
        # The grants are one-hot, so the request register takes an AND-OR of the sources (a
        # chain of muxes in priority order stood in front of it: 15 LUT levels from the
        # write-back's line counter in the device).
        def granted_or(field):
            return functools.reduce(operator.or_, [Mux(g, getattr(s, field), 0) for g, s in zip(mines, sources)])
        m.d.comb += [granted.eq(Cat(*mines).any()), g_write.eq(granted_or("write"))]
        with m.If(take):
            m.d.sync += [out_valid.eq(granted), req.payload.write.eq(g_write), req.payload.addr.eq(granted_or("addr")),
                         req.payload.data.eq(granted_or("data")), req.payload.ctx.eq(granted_or("ctx"))]
        m.d.comb += [req.payload.strb.eq(Const((1 << 64) - 1, 64)), req.payload.poison.eq(0)]
        issued_rd = Signal()
        issued_wr = Signal()
        m.d.comb += [issued_rd.eq(take & granted & ~g_write), issued_wr.eq(take & granted & g_write)]

        # The gradient reads have a port of their own (grad_port), with its own request register.
        greq = self.grad_port.req
        g_out_valid = Signal()
        g_take = Signal()
        issued_grad = Signal()
        m.d.comb += [g_take.eq(~g_out_valid | greq.ready), greq.valid.eq(g_out_valid),
                     issued_grad.eq(g_take & src_grad.valid & ~freeze), src_grad.ready.eq(issued_grad),
                     greq.payload.write.eq(0), greq.payload.strb.eq(Const((1 << 64) - 1, 64)),
                     greq.payload.poison.eq(0)]
        with m.If(g_take):
            m.d.sync += g_out_valid.eq(issued_grad)
        with m.If(issued_grad):
            m.d.sync += [greq.payload.addr.eq(src_grad.addr), greq.payload.ctx.eq(src_grad.ctx)]

        # ---------------------------------------------------------------- responses --
        rsp = self.mem.rd_rsp
        wrsp = self.mem.wr_rsp
        grsp = self.grad_port.rd_rsp             # gradient lines only (grad_port never writes)
        m.d.comb += [rsp.ready.eq(1), wrsp.ready.eq(1), grsp.ready.eq(1), self.grad_port.wr_rsp.ready.eq(1)]
        gpay = grsp.payload.ctx[:PB]
        rkind = rsp.payload.ctx[PB:PB + KIND_BITS]
        rpay = rsp.payload.ctx[:PB]
        for lane, ln in enumerate(lanes):
            for r, kind in ((ln.rd_off, Kind.OFFSETS), (ln.rd_idx, Kind.INDICES), (ln.rd_w, Kind.WEIGHTS)):
                m.d.comb += [r.rsp_valid.eq(rsp.valid & (rkind == kind) & (rpay[PB - 2:PB] == (lane << 1))),
                             r.rsp_slot.eq(rpay[:r.slot_bits]), r.rsp_data.eq(rsp.payload.data)]
        m.d.comb += [rd_vidx.rsp_valid.eq(rsp.valid & (rkind == Kind.INDICES) & (rpay[PB - 2:PB] == 0b01)),
                     rd_vidx.rsp_slot.eq(rpay[:rd_vidx.slot_bits]), rd_vidx.rsp_data.eq(rsp.payload.data)]
        m.d.sync += [reads_out.eq(reads_out + issued_rd + issued_grad - rsp.valid - grsp.valid),
                     writes_out.eq(writes_out + issued_wr - wrsp.valid)]
        m.d.sync += st_lines_read.eq(st_lines_read + issued_rd + issued_grad)
        with m.If(issued_wr):
            m.d.sync += st_lines_written.eq(st_lines_written + 1)
        with m.If(~media_err):
            with m.If(wrsp.valid & wrsp.payload.error):
                m.d.sync += [media_err.eq(1), media_info.eq(int(Kind.WB) << 24)]
            with m.If(grsp.valid & (grsp.payload.error | grsp.payload.poison)):
                m.d.sync += [media_err.eq(1), media_info.eq(int(Kind.GRAD) << 24)]
            with m.If(rsp.valid & (rsp.payload.error | rsp.payload.poison)):
                m.d.sync += [media_err.eq(1), media_info.eq(Cat(Const(0, 24), rkind))]

        # ---------------------------------------------------------------- memories --
        # Two writers (fills, FMA results) and two readers (FMA row operand, write-backs):
        # four one-write one-read block RAMs and a live value table (hw/common/ram.py). The
        # FMA operand read sees a result written in its own cycle through a bypass register.
        # Two banks by line parity, so the two lines of a line pair (k, k+1 of one row) are
        # read and written in one cycle, one per bank.
        banks = []
        for b in range(2):
            bank = LvtRam(shape=LINE_BITS, depth=SL // 2, name=f"scratch{b}")
            m.submodules[f"scratch{b}"] = bank
            fill_p, upd_p = bank.write_port(), bank.write_port()
            banks.append({"fill": fill_p, "upd": upd_p, "rd": bank.read_port(transparent_for=(upd_p,)),
                          "wb": bank.read_port()})
        # Arrival bits of the scratchpad lines (flip-flops): set by a fill's response, cleared
        # for a whole slot the cycle after a row is inserted (before its occurrence leaves the
        # occurrence queue; its fill may wait in the miss queue), all of them at INIT.
        arrived = Signal(SL)
        arr_clr_mask = Signal(SL)
        arr_set_mask = Signal(SL)
        m.d.comb += arr_set_mask.eq(Mux(rsp.valid & (rkind == Kind.ROW), Const(1, SL) << rpay[:SB], 0))
        m.d.sync += arrived.eq((arrived & ~arr_clr_mask) | arr_set_mask)
        for b, bank in enumerate(banks):
            m.d.comb += [bank["fill"].addr.eq(rpay[1:SB]), bank["fill"].data.eq(rsp.payload.data),
                         bank["fill"].en.eq(rsp.valid & (rkind == Kind.ROW) & (rpay[0] == b))]

        m.submodules.grad_mem = grad_mem = Memory(shape=LINE_BITS, depth=self.GRAD_LINES, init=[])
        grad_wp = grad_mem.write_port()
        grad_rp = grad_mem.read_port()
        # A replica for the second line of a pair (written together: one read port each).
        m.submodules.grad_mem1 = grad_mem1 = Memory(shape=LINE_BITS, depth=self.GRAD_LINES, init=[])
        grad_wp1 = grad_mem1.write_port()
        grad_rp1 = grad_mem1.read_port()
        m.d.comb += [grad_wp1.addr.eq(grad_wp.addr), grad_wp1.data.eq(grad_wp.data), grad_wp1.en.eq(grad_wp.en)]
        m.submodules.grad_arrived = grad_arrived = Memory(shape=1, depth=self.GRAD_LINES, init=[])
        garr_set = grad_arrived.write_port()
        garr_clr = grad_arrived.write_port()
        garr_mul = grad_arrived.read_port(domain="comb")
        garr_fma = grad_arrived.read_port(domain="comb")     # FMA window entry A's gradient line
        garr_fma_b = grad_arrived.read_port(domain="comb")   # ... and entry B's
        garr_fma_a1 = grad_arrived.read_port(domain="comb")  # A's next line (a line pair)
        garr_fma_b1 = grad_arrived.read_port(domain="comb")  # ... and B's
        m.d.comb += [grad_wp.addr.eq(gpay[:GB]), grad_wp.data.eq(grsp.payload.data), grad_wp.en.eq(grsp.valid),
                     garr_set.addr.eq(gpay[:GB]), garr_set.data.eq(1), garr_set.en.eq(grsp.valid),
                     garr_clr.data.eq(0)]

        m.submodules.tb_mem = tb_mem = Memory(shape=32, depth=MAX_TABLES + 1, init=[])
        tb_wp = tb_mem.write_port()
        tb_rp = tb_mem.read_port()
        # Each table's rows (for the index check while the bag stage holds the descriptor port).
        m.submodules.rows_mem = rows_mem = Memory(shape=32, depth=MAX_TABLES, init=[])
        rows_wp = rows_mem.write_port()
        rows_rp = rows_mem.read_port(domain="comb")
        val_pos = Signal(32)                    # indices below this position are checked
        val_ok = Signal()                       # every index is checked: writes may go

        # ---------------------------------------------------------------- main FSM --
        t_chk = Signal(8)
        pair_il = Signal(MAX_TABLES // 2)       # per table pair: interleave its bags
        pair_lo = Signal(WIDE)                  # the even table's rows, while checking the odd
        pair_hi = Signal(WIDE)
        line_pos = Signal(48)                   # element position of lane 0 of the current line
        prev_last = Signal(32)
        cap_t = Signal(8)
        nb = Signal(48)                         # next table boundary position t*B
        lo = Signal(32)                         # first index position of the current table
        flush_go = Signal()
        abort_go = Signal()
        bag_go = Signal()
        runs_go = Signal()                      # the apply pass's readers start their table runs
        look_go = Signal()
        mgr_idle = Signal()
        bag_done = Signal()
        look_empty = Signal()
        miss_idle = Signal()                    # the miss queue and its port machine are empty

        def fail(code, info):
            m.d.sync += [err.eq(code), err_info.eq(info), state.eq(Main.ERR_DRAIN)]

        lines_of_tab = tab.dim[4:9]
        lanes_of = lambda line: [line[32 * i:32 * (i + 1)] for i in range(LANES)]  # noqa: E731

        m.d.comb += [self.ctl.busy.eq(state != Main.IDLE), self.ctl.done.eq(state == Main.DONE),
                     self.ctl.error.eq(err), self.ctl.error_info.eq(err_info),
                     self.ctl.stats.lookups.eq(st_lookups), self.ctl.stats.rows_read.eq(st_rows_read),
                     self.ctl.stats.rows_written.eq(st_rows_written), self.ctl.stats.unique_rows.eq(0),
                     self.ctl.stats.lines_read.eq(st_lines_read), self.ctl.stats.lines_written.eq(st_lines_written),
                     self.ctl.stats.lines_pushed.eq(0)]
        m.d.comb += st_lookups.eq(completed)

        with m.Switch(state):
            with m.Case(Main.INIT):
                # Memories keep their contents through a reset (and real SRAM powers up with
                # any): stale valid tags or arrival bits would make the next command hit rows
                # that were never read. Sweep them once before the first command.
                with m.If(self.ctl.start):
                    m.d.sync += start_held.eq(1)
                m.d.sync += init_ctr.eq(init_ctr + 1)
                with m.If(init_ctr == init_sweep - 1):
                    m.d.sync += state.eq(Main.IDLE)
            with m.Case(Main.IDLE):
                with m.If(self.ctl.start | start_held):
                    m.d.comb += clr.eq(1)
                    m.d.sync += [
                        start_held.eq(0),
                        n_bags.eq(cmd.num_tables * cmd.batch_size),
                        gmul.eq((cmd.batch_size - 1) * cmd.row_pitch_lines),
                        err.eq(NdpError.OK), err_info.eq(0), media_err.eq(0), media_info.eq(0),
                        st_rows_read.eq(0), st_rows_written.eq(0),
                        st_lines_read.eq(0), st_lines_written.eq(0),
                        max_lines.eq(0), t_chk.eq(0), total.eq(0), frozen.eq(0), pair_il.eq(0), val_ok.eq(0),
                        state.eq(Main.CHK_OFFS),
                    ]

            with m.Case(Main.CHK_OFFS):
                m.d.comb += tbl_sel.eq(0)
                last = cmd.offsets_addr + (n_bags >> 4)
                with m.If(last >= CAP):
                    fail(NdpError.ADDRESS, AddressFault.OFFSETS)
                with m.Else():
                    m.d.comb += [rd_off.start.eq(1), rd_off.first_line.eq(cmd.offsets_addr),
                                 rd_off.n_lines.eq((n_bags >> 4) + 1)]
                    m.d.sync += state.eq(Main.TBL_CHK)

            with m.Case(Main.TBL_CHK):
                m.d.comb += tbl_sel.eq(t_chk + 1)
                row_end = Signal(WIDE)
                grad_end = Signal(WIDE)
                m.d.comb += [row_end.eq(tab.base_addr + tab.rows * lines_of_tab),
                             grad_end.eq(cmd.grad_addr + gmul + tab.col_lines + lines_of_tab)]
                with m.If(row_end > CAP):
                    fail(NdpError.ADDRESS, AddressFault.TABLE_ROWS + t_chk)
                with m.Elif(grad_end > CAP):
                    fail(NdpError.ADDRESS, AddressFault.GRADIENTS)
                with m.Else():
                    with m.If(lines_of_tab > max_lines):
                        m.d.sync += max_lines.eq(lines_of_tab)
                    # The pair (t - 1, t) is interleaved when one of its tables is small and
                    # their rows do not overlap (see "Two tables at a time").
                    with m.If(t_chk[0]):
                        small = ((row_end - tab.base_addr <= self.interleave_lines)
                                 | (pair_hi - pair_lo <= self.interleave_lines))
                        disjoint = (row_end <= pair_lo) | (pair_hi <= tab.base_addr)
                        m.d.sync += pair_il.bit_select(t_chk[1:], 1).eq(small & disjoint)
                    with m.Else():
                        m.d.sync += [pair_lo.eq(tab.base_addr), pair_hi.eq(row_end)]
                    m.d.comb += [rows_wp.addr.eq(t_chk), rows_wp.data.eq(tab.rows), rows_wp.en.eq(1)]
                    m.d.sync += t_chk.eq(t_chk + 1)
                    with m.If(t_chk + 1 == cmd.num_tables):
                        m.d.sync += [state.eq(Main.OFFS_SCAN), line_pos.eq(0), cap_t.eq(0),
                                     nb.eq(0)]

            with m.Case(Main.OFFS_SCAN):
                line = lanes_of(rd_off.out_data)
                bad = []
                for i in range(LANES):
                    prev = prev_last if i == 0 else line[i - 1]
                    pos = line_pos + i
                    inside = (pos >= 1) & (pos <= n_bags)
                    diff = Signal(33, name=f"off_diff{i}")
                    m.d.comb += diff.eq(line[i] - prev)
                    bad.append(inside & ((line[i] < prev) | (diff > MAX_BAG)))
                first_bad = Signal(4)
                for i in reversed(range(LANES)):
                    with m.If(bad[i]):
                        m.d.comb += first_bad.eq(i)
                any_bad = Cat(*bad).any()
                with m.If(media_err):
                    fail(NdpError.MEDIA, media_info)
                with m.Elif(rd_off.out_valid):
                    # A line is checked, its table starts captured (one per cycle) and it is
                    # popped, all while it is at the head: one line per cycle when it holds
                    # no table start.
                    with m.If(any_bad):
                        fail(NdpError.OFFSETS, (line_pos + first_bad)[:32])
                    with m.Elif((cap_t <= cmd.num_tables) & (nb < line_pos + LANES)):
                        # Capture offsets[t*B] (table t's first index position), one per cycle.
                        value = rd_off.out_data.word_select((nb - line_pos)[:4], 32)
                        m.d.comb += [tb_wp.addr.eq(cap_t), tb_wp.data.eq(value), tb_wp.en.eq(1)]
                        with m.If(cap_t == 0):
                            m.d.sync += tb_first.eq(value)
                        with m.If(cap_t == cmd.num_tables):
                            m.d.sync += tb_last.eq(value)
                        m.d.sync += [cap_t.eq(cap_t + 1), nb.eq(nb + cmd.batch_size)]
                    with m.Else():
                        m.d.comb += val_pop_off.eq(1)
                        m.d.sync += [line_pos.eq(line_pos + LANES), prev_last.eq(line[LANES - 1])]
                        with m.If(line_pos[4:] == n_bags[4:]):
                            m.d.sync += state.eq(Main.IDX_PREP)

            with m.Case(Main.IDX_PREP):
                first_rel = tb_first >> 4
                last_rel = (tb_last - 1)[:32] >> 4
                m.d.sync += total.eq(tb_last - tb_first)
                # PyTorch's contract: offsets run from 0 to the index count (no position
                # outside a bag is ever read).
                with m.If(tb_first != 0):
                    fail(NdpError.OFFSETS, 0)
                with m.Elif(tb_last != cmd.index_count):
                    fail(NdpError.OFFSETS, n_bags)
                with m.Elif(tb_last == tb_first):
                    m.d.sync += state.eq(Main.DONE)         # nothing to update
                with m.Elif(cmd.indices_addr + last_rel >= CAP):
                    fail(NdpError.ADDRESS, AddressFault.INDICES)
                with m.Elif(cmd.flags.has_weights & (cmd.weights_addr + last_rel >= CAP)):
                    fail(NdpError.ADDRESS, AddressFault.WEIGHTS)
                with m.Else():
                    # The indices are checked beside the apply pass from here on: it takes an
                    # index only below val_pos, and writes nothing before val_ok.
                    m.d.comb += [rd_vidx.start.eq(1), rd_vidx.first_line.eq(cmd.indices_addr + first_rel),
                                 rd_vidx.n_lines.eq(last_rel - first_rel + 1),
                                 runs_go.eq(1), bag_go.eq(1), look_go.eq(1)]
                    m.d.sync += [t_chk.eq(0), lo.eq(tb_first), line_pos.eq(first_rel << 4), val_pos.eq(tb_first),
                                 state.eq(Main.IDX_TLOAD)]

            with m.Case(Main.IDX_TLOAD):
                m.d.comb += tb_rp.addr.eq(t_chk + 1)
                m.d.sync += state.eq(Main.IDX_SCAN)

            with m.Case(Main.IDX_SCAN):
                # (the table's rows from rows_mem: the bag stage has the descriptor port now)
                m.d.comb += [tb_rp.addr.eq(t_chk + 1), rows_rp.addr.eq(t_chk)]
                end = tb_rp.data
                rows = rows_rp.data
                line = lanes_of(rd_vidx.out_data)
                bad = []
                for i in range(LANES):
                    pos = line_pos + i
                    bad.append((pos >= lo) & (pos < end) & (line[i] >= rows))
                first_bad = Signal(4)
                for i in reversed(range(LANES)):
                    with m.If(bad[i]):
                        m.d.comb += first_bad.eq(i)
                any_bad = Cat(*bad).any()
                last_table = t_chk + 1 == cmd.num_tables

                def next_table():
                    m.d.sync += [lo.eq(end), t_chk.eq(t_chk + 1), val_pos.eq(end)]
                    with m.If(last_table):
                        m.d.sync += state.eq(Main.IDX_DONE)
                    with m.Else():
                        m.d.sync += state.eq(Main.IDX_TLOAD)

                def pop():
                    m.d.comb += val_pop_idx.eq(1)
                    m.d.sync += [line_pos.eq(line_pos + LANES), val_pos.eq(line_pos + LANES)]

                with m.If(media_err):
                    m.d.sync += [frozen.eq(1), state.eq(Main.ABORT)]
                with m.Elif(end == lo):
                    next_table()                            # no index in this table
                with m.Elif(rd_vidx.out_valid):
                    with m.If(any_bad):
                        # The apply pass has written nothing yet: it is dropped (ABORT).
                        m.d.sync += [err.eq(NdpError.INDEX_RANGE), err_info.eq((line_pos + first_bad)[:32]),
                                     frozen.eq(1), state.eq(Main.ABORT)]
                    with m.Elif(end <= line_pos + LANES):
                        next_table()
                        with m.If(end == line_pos + LANES):
                            pop()
                    with m.Else():
                        pop()

            with m.Case(Main.IDX_DONE):
                with m.If(media_err):
                    m.d.sync += [frozen.eq(1), state.eq(Main.ABORT)]
                with m.Else():
                    m.d.sync += [val_ok.eq(1), state.eq(Main.APPLY)]

            with m.Case(Main.APPLY):
                with m.If(media_err):
                    m.d.sync += [frozen.eq(1), state.eq(Main.ABORT)]
                with m.Elif(bag_done & look_empty & miss_idle & (seq == total) & (completed == total)):
                    m.d.comb += flush_go.eq(1)
                    m.d.sync += state.eq(Main.FLUSH)

            with m.Case(Main.FLUSH):
                with m.If(media_err):
                    m.d.sync += [frozen.eq(1), state.eq(Main.ABORT)]
                with m.Elif(mgr_idle):
                    m.d.sync += state.eq(Main.WAIT_WR)

            with m.Case(Main.WAIT_WR):
                with m.If((reads_out == 0) & (writes_out == 0)):
                    with m.If(media_err):
                        m.d.sync += [err.eq(NdpError.MEDIA), err_info.eq(media_info)]
                    m.d.sync += state.eq(Main.DONE)

            with m.Case(Main.ERR_DRAIN):
                with m.If((reads_out == 0) & (writes_out == 0)):
                    m.d.sync += state.eq(Main.DONE)

            with m.Case(Main.ABORT):
                with m.If((reads_out == 0) & (writes_out == 0) & ~out_valid & ~g_out_valid):
                    m.d.comb += abort_go.eq(1)
                    m.d.sync += state.eq(Main.ABORT_SCAN)
                    with m.If(err == NdpError.OK):          # (else the index check's error)
                        m.d.sync += [err.eq(NdpError.MEDIA), err_info.eq(media_info)]

            with m.Case(Main.ABORT_SCAN):
                with m.If(mgr_idle):
                    m.d.sync += state.eq(Main.DONE)

            with m.Case(Main.DONE):
                m.d.sync += state.eq(Main.IDLE)
        m.d.comb += tb_rp.en.eq(1)

        # ---------------------------------------------------------------- table runs --
        # Each lane's readers read its tables' runs back to back: offsets[t*B .. (t+1)*B]
        # (B + 1 elements) and the indices (and weights) [offsets[t*B], offsets[(t+1)*B]) of
        # t = lane, lane + 2, ... (offsets[t*B] from the table starts the validation captured).
        # A reader starts a run once it has issued the previous one (its buffer delivers them in
        # order); an element stream starts its run once the previous run's elements are taken.
        # A table without indices has no index run.
        idx_pos = [Signal(32, name=f"idx_pos{j}") for j in range(2)]     # each lane's next index
        runs_on = Signal()
        with m.If(runs_go):
            m.d.sync += runs_on.eq(1)
        with m.Elif(clr | (state == Main.DONE)):
            m.d.sync += runs_on.eq(0)
        bsz, ntab = cmd.batch_size, cmd.num_tables
        for lane, ln in enumerate(lanes):
            first_elem = bsz if lane else 0
            o_t, e_t = Signal(8, name=f"off_rd_t{lane}"), Signal(8, name=f"off_es_t{lane}")
            o_e, e_e = Signal(48, name=f"off_rd_e{lane}"), Signal(48, name=f"off_es_e{lane}")
            i_t, j_t = Signal(8, name=f"idx_rd_t{lane}"), Signal(8, name=f"idx_es_t{lane}")
            with m.If(runs_go):
                m.d.sync += [o_t.eq(lane), e_t.eq(lane), o_e.eq(first_elem), e_e.eq(first_elem), i_t.eq(lane),
                             j_t.eq(lane)]
            with m.If(runs_on & (o_t < ntab) & ln.rd_off.issue_idle):
                m.d.comb += [ln.rd_off.start.eq(1), ln.rd_off.first_line.eq(cmd.offsets_addr + (o_e >> 4)),
                             ln.rd_off.n_lines.eq(((o_e + bsz) >> 4) - (o_e >> 4) + 1)]
                m.d.sync += [o_t.eq(o_t + 2), o_e.eq(o_e + 2 * bsz)]
            with m.If(runs_on & (e_t < ntab) & ln.es_off.idle):
                m.d.comb += [ln.es_off.start.eq(1), ln.es_off.first_lane.eq(e_e[:4]), ln.es_off.count.eq(bsz + 1)]
                m.d.sync += [e_t.eq(e_t + 2), e_e.eq(e_e + 2 * bsz)]
            rd_lo, rd_hi = tb_mem.read_port(domain="comb"), tb_mem.read_port(domain="comb")
            es_lo, es_hi = tb_mem.read_port(domain="comb"), tb_mem.read_port(domain="comb")
            m.d.comb += [rd_lo.addr.eq(i_t), rd_hi.addr.eq(i_t + 1), es_lo.addr.eq(j_t), es_hi.addr.eq(j_t + 1)]
            with m.If(runs_on & (i_t < ntab)):
                first_rel = rd_lo.data >> 4
                n_lines = ((rd_hi.data - 1)[:32] >> 4) - first_rel + 1
                with m.If(rd_lo.data == rd_hi.data):
                    m.d.sync += i_t.eq(i_t + 2)
                with m.Elif(ln.rd_idx.issue_idle & ln.rd_w.issue_idle):
                    m.d.comb += [ln.rd_idx.start.eq(1), ln.rd_idx.first_line.eq(cmd.indices_addr + first_rel),
                                 ln.rd_idx.n_lines.eq(n_lines),
                                 ln.rd_w.start.eq(cmd.flags.has_weights),
                                 ln.rd_w.first_line.eq(cmd.weights_addr + first_rel), ln.rd_w.n_lines.eq(n_lines)]
                    m.d.sync += i_t.eq(i_t + 2)
            with m.If(runs_on & (j_t < ntab)):
                count = (es_hi.data - es_lo.data)[:32]
                with m.If(es_lo.data == es_hi.data):
                    m.d.sync += j_t.eq(j_t + 2)
                with m.Elif(ln.es_idx.idle & ln.es_w.idle):
                    m.d.sync += idx_pos[lane].eq(es_lo.data)
                    m.d.comb += [ln.es_idx.start.eq(1), ln.es_idx.first_lane.eq(es_lo.data[:4]),
                                 ln.es_idx.count.eq(count),
                                 ln.es_w.start.eq(cmd.flags.has_weights), ln.es_w.first_lane.eq(es_lo.data[:4]),
                                 ln.es_w.count.eq(count)]
                    m.d.sync += j_t.eq(j_t + 2)

        # ---------------------------------------------------------------- bag stage --
        # Walks the bags two tables at a time (the pair 2p, 2p + 1: lane 0 and lane 1), bag b of
        # lane 0, then bag b of lane 1, then bag b + 1 ... (one table after the other unless the
        # pair qualifies, ``pair_il``); for each non-empty bag fetches its gradient lines
        # into the ring and sends {table info, L, ring position, lane} through the 1/L divider.
        bstate = Signal(Bag)
        pt = Signal(8)                          # the pair's lane-0 table
        cl = Signal()                           # the lane whose bag is next
        bb = Signal(32)
        ln_prev = [Signal(32, name=f"prev_off{j}") for j in range(2)]
        ln_base = [Signal(32, name=f"tb_base{j}") for j in range(2)]
        ln_lines = [Signal(5, name=f"tb_lines{j}") for j in range(2)]
        ln_mode = [Signal(PoolMode, name=f"tb_mode{j}") for j in range(2)]
        ln_grow = [Signal(WIDE, name=f"grad_row{j}") for j in range(2)]
        prev_off = Mux(cl, ln_prev[1], ln_prev[0])
        tb_lines = Mux(cl, ln_lines[1], ln_lines[0])
        grad_row = Mux(cl, ln_grow[1], ln_grow[0])
        off_valid = Mux(cl, es_off1.valid, es_off.valid)
        off_data = Mux(cl, es_off1.data, es_off.data)
        off_ready = Signal()
        m.d.comb += [es_off.ready.eq(off_ready & ~cl), es_off1.ready.eq(off_ready & cl)]
        has1 = Signal()                         # the pair has a lane-1 table
        m.d.comb += has1.eq(pt + 1 < ntab)
        g_head = Signal(GB + 1)
        g_tail = Signal(GB + 1)
        gk = Signal(5)
        bag_gpos = Signal(GB)
        bag_len = Signal(16)
        reserved = Signal(range(self.BAG_DEPTH + 2))

        bag_rec = data.StructLayout({"base": 32, "lines": 5, "mode": 2, "len": 16, "gpos": GB, "lane": 1})
        m.submodules.div = div = ResetInserter(clr)(Fp32DivInt(tag_width=bag_rec.size, pipeline=self.fp32_pipeline))
        m.submodules.bag_fifo = bag_fifo = ResetInserter(clr)(
            SyncFIFOBuffered(width=bag_rec.size + 32, depth=self.BAG_DEPTH))
        m.d.comb += [bag_fifo.w_en.eq(div.o_valid), bag_fifo.w_data.eq(Cat(div.o_tag, div.o_result))]

        div_push = Signal()
        div_len = Signal(16)
        div_gpos = Signal(GB)
        drec = Signal(bag_rec)
        m.d.comb += [drec.base.eq(Mux(cl, ln_base[1], ln_base[0])), drec.lines.eq(tb_lines),
                     drec.mode.eq(Mux(cl, ln_mode[1], ln_mode[0])), drec.len.eq(div_len),
                     drec.gpos.eq(div_gpos), drec.lane.eq(cl)]
        # The divider takes its inputs from registers: the bag stage decides a push after the
        # offsets' subtract, the empty-bag test and the gradient port's handshake, and the
        # divider's first stage (the length's leading-zero count) ran after that in the same
        # cycle (16 LUT levels by `synth --premap`). A bag's record reaches bag_fifo a cycle
        # later; ``reserved`` counts it from the push, as before.
        div_in_valid = Signal()
        div_in_len = Signal(16)
        div_in_tag = Signal(bag_rec)
        m.d.sync += [div_in_valid.eq(div_push & ~clr), div_in_len.eq(div_len), div_in_tag.eq(drec)]
        m.d.comb += [div.i_valid.eq(div_in_valid), div.x.eq(ONE), div.l.eq(div_in_len), div.i_tag.eq(div_in_tag)]
        bag_pop = Signal()
        m.d.sync += reserved.eq(reserved + div_push - bag_pop)

        g_used = Signal(GB + 1)
        m.d.comb += g_used.eq(g_head - g_tail)
        g_space = (self.GRAD_LINES - g_used) >= tb_lines
        credit = reserved < self.BAG_DEPTH
        m.d.comb += [src_grad.write.eq(0), bag_done.eq(bstate == Bag.DONE), garr_clr.addr.eq(0)]

        def next_pair():
            m.d.sync += [cl.eq(0), bb.eq(0)]
            with m.If(pt + 2 >= ntab):
                m.d.sync += bstate.eq(Bag.DONE)
            with m.Else():
                m.d.sync += [pt.eq(pt + 2), bstate.eq(Bag.FIRST)]

        def advance_bag():
            for j in range(2):
                with m.If(cl == j):
                    m.d.sync += ln_grow[j].eq(ln_grow[j] + cmd.row_pitch_lines)
            last = bb + 1 == bsz
            with m.If(has1 & pair_il.bit_select(pt[1:], 1)):          # interleaved
                with m.If(~cl):
                    m.d.sync += [cl.eq(1), bstate.eq(Bag.BAG)]
                with m.Elif(last):
                    next_pair()
                with m.Else():
                    m.d.sync += [cl.eq(0), bb.eq(bb + 1), bstate.eq(Bag.BAG)]
            with m.Elif(~last):                 # one table at a time
                m.d.sync += [bb.eq(bb + 1), bstate.eq(Bag.BAG)]
            with m.Elif(~cl & has1):
                m.d.sync += [cl.eq(1), bb.eq(0), bstate.eq(Bag.BAG)]
            with m.Else():
                next_pair()

        with m.Switch(bstate):
            with m.Case(Bag.IDLE):
                with m.If(bag_go):
                    m.d.sync += [pt.eq(0), cl.eq(0), bb.eq(0), bstate.eq(Bag.FIRST)]
            with m.Case(Bag.FIRST):
                # Each lane's run starts with offsets[t*B], the first bag's start.
                m.d.comb += off_ready.eq(1)
                with m.If(off_valid):
                    for j in range(2):
                        with m.If(cl == j):
                            m.d.sync += ln_prev[j].eq(off_data)
                    with m.If(~cl & has1):
                        m.d.sync += cl.eq(1)
                    with m.Else():
                        m.d.sync += [cl.eq(0), bstate.eq(Bag.TSEL)]
            with m.Case(Bag.TSEL):
                m.d.comb += tbl_sel.eq(pt + cl)
                m.d.sync += bstate.eq(Bag.TLOAD)
            with m.Case(Bag.TLOAD):
                m.d.comb += tbl_sel.eq(pt + cl)
                for j in range(2):
                    with m.If(cl == j):
                        m.d.sync += [ln_base[j].eq(tab.base_addr), ln_lines[j].eq(lines_of_tab),
                                     ln_mode[j].eq(tab.mode), ln_grow[j].eq(cmd.grad_addr + tab.col_lines)]
                with m.If(~cl & has1):
                    m.d.sync += [cl.eq(1), bstate.eq(Bag.TSEL)]
                with m.Else():
                    m.d.sync += [cl.eq(0), bb.eq(0), bstate.eq(Bag.BAG)]
            with m.Case(Bag.BAG):
                end = off_data
                blen = Signal(32)
                m.d.comb += blen.eq(end - prev_off)
                with m.If(off_valid & ~freeze):
                    # (an equality, not blen == 0: the subtract's carry chain stood between
                    # the offsets stream's element mux and its ready, 19 LUT levels)
                    with m.If(end == prev_off):
                        m.d.comb += off_ready.eq(1)
                        for j in range(2):
                            with m.If(cl == j):
                                m.d.sync += ln_prev[j].eq(end)
                        advance_bag()
                    with m.Elif(g_space & credit):
                        m.d.comb += [src_grad.valid.eq(1), src_grad.addr.eq(grad_row),
                                     src_grad.ctx.eq(ctx_of(Kind.GRAD, g_head[:GB]))]
                        with m.If(src_grad.ready):
                            m.d.comb += [off_ready.eq(1), garr_clr.addr.eq(g_head[:GB]), garr_clr.en.eq(1)]
                            for j in range(2):
                                with m.If(cl == j):
                                    m.d.sync += ln_prev[j].eq(end)
                            m.d.sync += [g_head.eq(g_head + 1), bag_gpos.eq(g_head[:GB]),
                                         bag_len.eq(blen[:16]), gk.eq(1)]
                            with m.If(tb_lines == 1):
                                m.d.comb += [div_push.eq(1), div_len.eq(blen[:16]), div_gpos.eq(g_head[:GB])]
                                advance_bag()
                            with m.Else():
                                m.d.sync += bstate.eq(Bag.GRAD)
            with m.Case(Bag.GRAD):
                gpos = (bag_gpos + gk)[:GB]
                m.d.comb += [src_grad.valid.eq(~freeze), src_grad.addr.eq(grad_row + gk),
                             src_grad.ctx.eq(ctx_of(Kind.GRAD, gpos))]
                with m.If(src_grad.ready):
                    m.d.comb += [garr_clr.addr.eq(gpos), garr_clr.en.eq(1)]
                    m.d.sync += [g_head.eq(g_head + 1), gk.eq(gk + 1)]
                    with m.If(gk + 1 == tb_lines):
                        m.d.comb += [div_push.eq(1), div_len.eq(bag_len), div_gpos.eq(bag_gpos)]
                        advance_bag()
            with m.Case(Bag.DONE):
                pass
        with m.If(clr):
            m.d.sync += [bstate.eq(Bag.IDLE), g_head.eq(0), g_tail.eq(0), reserved.eq(0)]

        # ---------------------------------------------------------------- lookahead --
        # S0: next occurrence -> row address; S1: tag-set read; S2: tag compare (registered);
        # S3: hit or miss (the manager acts on S3).
        occ_rec = occurrence_layout(SB, GB)
        m.submodules.occ_q = occ_q = ResetInserter(clr)(SyncFIFOBuffered(width=occ_rec.size, depth=self.OCC_DEPTH))

        brec = data.View(bag_rec, bag_fifo.r_data[:bag_rec.size])
        bag_inv = bag_fifo.r_data[bag_rec.size:]
        la_valid = Signal()
        la_left = Signal(16)
        la = Signal(bag_rec)
        la_inv = Signal(32)

        # An occurrence on its way through S1-S3: its row address and tag set (from S2 on),
        # and what its occurrence record carries.
        stage_rec = data.StructLayout({"addr": 32, "set": TSB, "lines": 5, "gpos": GB, "scale": 32,
                                       "mul": 1, "last": 1})
        s1_valid = Signal()
        s1 = Signal(stage_rec)
        s2_valid = Signal()
        s2 = Signal(stage_rec)
        s2_fresh = Signal()                     # S2's tag set is at the read port (else s2_tags)
        s2_stale = Signal()                     # a tag write hit S2's set after its read: re-read
        s3_valid = Signal()
        s3 = Signal(stage_rec)
        s3_hit = Signal()                       # S2's compare, registered
        s3_hit_way = Signal(WB_)
        s3_hit_slot = Signal(SB)
        s3_full = Signal()
        s3_free_way = Signal(WB_)
        s3_done = Signal()
        ins_way = Signal(WB_)                   # where this cycle's insert puts its row
        ins_slot = Signal(SB)
        fresh = Signal(SB + 1)                  # slots never used in this batch start here
        mstate = Signal(Mgr)
        look_run = Signal()
        m.d.comb += look_run.eq(mstate == Mgr.LOOK)
        # S0 also takes occurrences while the manager works on S3's miss (CLOCK, CONF, DROP):
        # S1 and S2 move on during DROP, and an S1 left empty then was a bubble after every
        # evicting miss (rm1 b64 UPDATE +1,400 cycles).
        look_feed = Signal()
        m.d.comb += look_feed.eq((mstate != Mgr.IDLE) & (mstate != Mgr.FL_CHK))

        has_w = cmd.flags.has_weights
        s2_move = Signal()
        s2_free = ~s2_valid | s2_move
        s1_move = s1_valid & s2_free
        s1_free = ~s1_valid | s1_move
        idx_valid = Mux(la.lane, es_idx1.valid, es_idx.valid)
        idx_data = Mux(la.lane, es_idx1.data, es_idx.data)
        w_valid = Mux(la.lane, es_w1.valid, es_w.valid)
        w_data = Mux(la.lane, es_w1.data, es_w.data)
        # (an index is used once the validation has checked it: val_pos, then val_ok)
        occ_avail = (la_valid & idx_valid & (~has_w | w_valid)
                     & (val_ok | (Mux(la.lane, idx_pos[1], idx_pos[0]) < val_pos)))
        s0_take = Signal()
        m.d.comb += [s0_take.eq(occ_avail & s1_free & look_feed & ~freeze),
                     es_idx.ready.eq(s0_take & ~la.lane), es_w.ready.eq(s0_take & has_w & ~la.lane),
                     es_idx1.ready.eq(s0_take & la.lane), es_w1.ready.eq(s0_take & has_w & la.lane)]
        m.d.comb += [bag_pop.eq(bag_fifo.r_en & bag_fifo.r_rdy),
                     bag_fifo.r_en.eq(~la_valid | (s0_take & (la_left == 1)))]
        for j in range(2):
            with m.If(s0_take & (la.lane == j)):
                m.d.sync += idx_pos[j].eq(idx_pos[j] + 1)
        with m.If(s0_take):
            m.d.sync += la_left.eq(la_left - 1)
            with m.If(la_left == 1):
                m.d.sync += la_valid.eq(0)
        with m.If(bag_pop):
            m.d.sync += [la.eq(brec), la_inv.eq(bag_inv), la_left.eq(brec.len), la_valid.eq(1)]

        with m.If(s0_take):
            m.d.sync += [
                s1_valid.eq(1),
                s1.addr.eq(la.base + idx_data * la.lines),
                s1.lines.eq(la.lines), s1.gpos.eq(la.gpos),
                s1.scale.eq(Mux(la.mode == PoolMode.MEAN, la_inv,
                                Mux(la.mode == PoolMode.WEIGHTED_SUM, w_data, ONE))),
                s1.mul.eq(la.mode != PoolMode.SUM),
                s1.last.eq(la_left == 1),
            ]
        with m.Elif(s1_move):
            m.d.sync += s1_valid.eq(0)

        s1_set = Signal(TSB)
        m.d.comb += s1_set.eq(_hash(s1.addr, TSB, 0x9E3779B1))
        entry = data.StructLayout({"valid": 1, "key": 32, "slot": SB})
        # The tag store: one block RAM per way, one write port each, read with a bypass of that
        # port's same-cycle write. Inserts (and the INIT sweep) write at once; a drop (the
        # victim's entry, decided in the insert's cycle, or a flush invalidation) lands one
        # cycle later through the same port. That never meets an insert: an insert that drops
        # a tag moves the manager to DROP for one cycle, and FL_CHK inserts nothing.
        # The compare (S2) and the manager's decision (S3) are separate stages: in one cycle
        # they were the block's deepest path (20 LUT levels in the device: a way's bypass
        # register -> the 8 key compares -> hit or miss -> the insert's tag write -> every
        # way's bypass compare against the read address, which itself followed the decision).
        # So no compare result may be older than the tags: S2's set is read with every write
        # up to its read's cycle; a write to S2's set after that marks it stale, and a stale
        # S2 re-reads its set (the read port is its own then: S1 waits). S2 moves into S3 only
        # when no write can land on its set in that cycle, judged from registers: S3 is not a
        # miss on the same set, not a miss that may evict (its drop's set is known too late),
        # and no drop lands on S2's set (``s2_hold``). One exception keeps a row that recurs
        # at once as fast as before: when S3 is a miss for S2's own row, S2 moves in the cycle
        # S3 inserts it and takes the insert's way and slot as its hit (the insert's drop, if
        # any, is another row's entry, never the way just filled). A miss that evicts goes
        # through DROP as before, and S2 moves into S3 during it, so that costs no cycle; a
        # miss on S2's set for another row costs S2 two (the re-read).
        tag_wp = _TagWrite(TSB, W, entry.size)                # inserts (and the INIT sweep)
        tag_drop = _TagWrite(TSB, W, entry.size)              # invalidations (data ignored: 0)
        tag_rp = _TagRead(TSB, W * entry.size)
        drop_pending = Signal(W)
        drop_addr = Signal(TSB)
        m.d.sync += [drop_pending.eq(tag_drop.en), drop_addr.eq(tag_drop.addr)]
        tag_rd_ways = []
        for w in range(W):
            way_mem = BypassRam(shape=entry.size, depth=1 << TSB, name=f"tags_way{w}")
            m.submodules[f"tags_way{w}"] = way_mem
            way_w = way_mem.write_port()
            way_r = way_mem.read_port(bypass=True)
            with m.If(tag_wp.en[w]):
                m.d.comb += [way_w.addr.eq(tag_wp.addr), way_w.data.eq(tag_wp.data.word_select(w, entry.size)),
                             way_w.en.eq(1)]
            with m.Elif(drop_pending[w]):
                m.d.comb += [way_w.addr.eq(drop_addr), way_w.data.eq(0), way_w.en.eq(1)]
            m.d.comb += way_r.addr.eq(tag_rp.addr)
            tag_rd_ways.append(way_r.data)
        m.d.comb += tag_rp.data.eq(Cat(*tag_rd_ways))
        # The read address comes from registers only (S1's set, or a stale S2's).
        m.d.comb += tag_rp.addr.eq(Mux(s2_stale, s2.set, s1_set))
        s2_tags = Signal(W * entry.size)        # S2's tag set, as read
        s2_data = Signal(W * entry.size)
        m.d.comb += s2_data.eq(Mux(s2_fresh, tag_rp.data, s2_tags))
        m.d.sync += s2_tags.eq(s2_data)
        s3_may_write = s3_valid & ~s3_hit & ((s3.set == s2.set) | (~s3_full & (fresh == nslots)))
        same_row = Signal()                     # S3 is a miss for S2's row (registers only)
        m.d.comb += same_row.eq(s3_valid & ~s3_hit & (s3.addr == s2.addr))
        s2_hold = (s3_may_write & ~same_row) | (drop_pending.any() & (drop_addr == s2.set))
        m.d.comb += s2_move.eq(s2_valid & ~s2_stale & (~s3_valid | s3_done) & ~s2_hold)
        write_s2_set = ((tag_wp.en.any() & (tag_wp.addr == s2.set))
                        | (drop_pending.any() & (drop_addr == s2.set)))
        with m.If(s1_move):
            m.d.sync += [s2_valid.eq(1), s2.eq(s1), s2.set.eq(s1_set),
                         s2_fresh.eq(1), s2_stale.eq(0)]    # (the read bypassed this cycle's write)
        with m.Elif(s2_move):
            m.d.sync += [s2_valid.eq(0), s2_fresh.eq(0), s2_stale.eq(0)]
        with m.Else():
            # A stale S2 re-reads its set now (bypassing this cycle's write); otherwise a write
            # to its set now makes what it holds stale.
            m.d.sync += [s2_fresh.eq(s2_stale), s2_stale.eq(s2_valid & ~s2_stale & write_s2_set)]
        m.d.comb += look_empty.eq(~s1_valid & ~s2_valid & ~s3_valid & ~la_valid & (mstate == Mgr.LOOK))

        ways = [data.View(entry, s2_data[w * entry.size:(w + 1) * entry.size]) for w in range(W)]
        hit = Signal()
        hit_way = Signal(WB_)
        hit_slot = Signal(SB)
        free_way = Signal(WB_)
        for w in reversed(range(W)):
            with m.If(ways[w].valid & (ways[w].key == s2.addr)):
                m.d.comb += [hit.eq(1), hit_way.eq(w), hit_slot.eq(ways[w].slot)]
            with m.If(~ways[w].valid):
                m.d.comb += free_way.eq(w)
        tw = Signal(W * entry.size)             # S3's tag set, as compared (a full set's ways)
        with m.If(s2_move):
            m.d.sync += [s3_valid.eq(1), s3.eq(s2),
                         s3_hit.eq(hit | same_row), s3_hit_way.eq(Mux(same_row, ins_way, hit_way)),
                         s3_hit_slot.eq(Mux(same_row, ins_slot, hit_slot)),
                         s3_full.eq(Cat(*[w_.valid for w_ in ways]).all()), s3_free_way.eq(free_way),
                         tw.eq(s2_data)]
        with m.Elif(s3_done):
            m.d.sync += s3_valid.eq(0)

        # Slot state.
        slot_rec = data.StructLayout({"valid": 1, "ref": 1, "addr": 32, "lines": 5, "last_use": 32, "way": WB_})
        m.submodules.slots = slots = Memory(shape=slot_rec, depth=SL, init=[])
        slot_wp = slots.write_port()
        slot_rp = slots.read_port(transparent_for=(slot_wp,))
        slot_rd_addr = Signal(SB)               # the address slot_rp.data belongs to
        m.d.sync += slot_rd_addr.eq(slot_rp.addr)
        rec = slot_rp.data
        slot_cp = slots.read_port(transparent_for=(slot_wp,))     # the cleaner's (a replica)
        dirty = Signal(SL)                      # per slot: a row that memory does not hold yet

        # Occurrence push (a hit in LOOK, or after a miss).
        push = Signal()
        push_slot = Signal(SB)
        orec = Signal(occ_rec)
        m.d.comb += [orec.row_base.eq(push_slot << slot_shift), orec.lines.eq(s3.lines), orec.gpos.eq(s3.gpos),
                     orec.scale.eq(s3.scale), orec.mul.eq(s3.mul), orec.bag_last.eq(s3.last),
                     occ_q.w_data.eq(orec), occ_q.w_en.eq(push)]
        with m.If(push):
            m.d.sync += seq.eq(seq + 1)

        hand = Signal(SB)
        vway = Signal(WB_)
        rr = Signal(WB_)
        tw_way = data.View(entry, tw.word_select(rr, entry.size))     # the conflict candidate
        fs = Signal(SB + 1)
        abort_mode = Signal()
        hand_next = Mux(hand + 1 == nslots, 0, hand + 1)[:SB]
        pinned = rec.valid & (rec.last_use >= completed)

        # Write-back machine: the lines of one slot -> memory writes. The scratch read port's
        # output is the request payload (its enable holds it while the port is busy). The
        # first line is read in the cycle after ``wb_go``, from registers: reading it in the
        # decision's cycle put the flush's and the insert's slot choice in front of the
        # scratchpad's read address (17 LUT levels). Write-backs wait on the media's write
        # rate, so the cycle is mostly hidden.
        wb_go = Signal()
        wb_base_in = Signal(SB)
        wb_addr_in = Signal(32)
        wb_lines_in = Signal(5)
        wb_active = Signal()                    # lines not yet accepted by the port
        wb_base = Signal(SB)
        wb_addr = Signal(32)
        wb_lines = Signal(5)
        wb_k = Signal(5)                        # lines read from the scratchpad
        wb_line = Signal(SB)                    # the scratchpad line read for the port
        wb_en = Signal()
        wb_bank = Signal()                      # the bank of the line read last
        for bank in banks:
            m.d.comb += [bank["wb"].addr.eq(wb_line[1:]), bank["wb"].en.eq(wb_en)]
        with m.If(wb_en):
            m.d.sync += wb_bank.eq(wb_line[0])
        wb_have = Signal()                      # a read line waits on the port
        wb_paddr = Signal(32)                   # the address of the line waiting on the port
        wb_acc = Signal()
        wb_read = Signal()
        wb_issuing = Signal()                   # write-back requests still to be accepted
        m.d.comb += [
            wb_acc.eq(wb_have & src_look.ready),
            wb_read.eq(wb_active & (wb_k != wb_lines) & (~wb_have | wb_acc)),
            wb_issuing.eq(wb_have | (wb_active & (wb_k != wb_lines))),
            wb_line.eq(wb_base | wb_k), wb_en.eq(wb_read),
        ]
        with m.If(wb_read):
            m.d.sync += [wb_k.eq(wb_k + 1), wb_have.eq(1), wb_paddr.eq(wb_addr + wb_k)]
        with m.Elif(wb_acc):
            m.d.sync += wb_have.eq(0)
        with m.If(wb_active & (wb_k == wb_lines) & (~wb_have | wb_acc)):
            m.d.sync += wb_active.eq(0)
        with m.If(wb_go):
            m.d.sync += [wb_active.eq(1), wb_base.eq(wb_base_in), wb_addr.eq(wb_addr_in), wb_lines.eq(wb_lines_in),
                         wb_k.eq(0), st_rows_written.eq(st_rows_written + 1)]

        # Miss queue: what a miss leaves to the port (its victim's write-back, then its fill), so
        # the manager goes on with the next occurrences while the port works through it. One
        # request stream in queue order: a row evicted and missed again is read after its
        # write-back (the port's read-after-write rule).
        miss_rec = data.StructLayout({"wb": 1, "wb_base": SB, "wb_addr": 32, "wb_lines": 5,
                                      "fill_base": SB, "fill_addr": 32, "lines": 5})
        m.submodules.missq = missq = ResetInserter(clr)(SyncFIFOBuffered(width=miss_rec.size,
                                                                          depth=self.MISS_DEPTH))
        miss_w = Signal(miss_rec)
        m.d.comb += missq.w_data.eq(miss_w)
        room = Signal()                         # a miss can be queued and its occurrence pushed
        m.d.comb += room.eq(missq.w_rdy & occ_q.w_rdy & ~freeze)
        slot_line_mask = Signal(16)             # a slot's lines, from its first
        ins_base = Signal(SB)                   # the first line of the slot an insert takes
        m.d.comb += slot_line_mask.eq(Mux(slot_shift == 0, 0x1, Mux(slot_shift == 1, 0x3, Mux(
            slot_shift == 2, 0xF, Mux(slot_shift == 3, 0xFF, 0xFFFF)))))
        # The inserted slot's arrival bits are cleared one cycle after the insert: the slot comes
        # out of S2's tag compare, and shifting its line mask into SL bits after that was the
        # block's deepest path (19 LUT levels by `synth --premap`). Nothing reads them sooner:
        # the insert's occurrence reaches the FMA window through occ_q (SyncFIFOBuffered, 2
        # cycles) and mf, and its fill through missq and the memory port; a fill response in
        # the clear's cycle still wins (set over clear), as it did before.
        ins_clear = Signal()
        ins_clear_q = Signal()
        ins_base_q = Signal(SB)
        m.d.sync += [ins_clear_q.eq(ins_clear), ins_base_q.eq(ins_base)]
        m.d.comb += arr_clr_mask.eq(Mux(ins_clear_q, slot_line_mask << ins_base_q, 0))
        me_valid = Signal()                     # the miss the port works on
        me = Signal(miss_rec)
        me_wb = Signal()                        # ... its write-back not started yet
        me_k = Signal(5)                        # ... fill lines issued
        me_addr = Signal(32)                    # ... the next fill line's address
        fill_valid = Signal()
        me_finish = Signal()
        m.d.comb += [
            fill_valid.eq(me_valid & ~me_wb & ~wb_issuing & ~freeze),
            me_finish.eq(fill_valid & src_look.ready & (me_k + 1 == me.lines)),
            missq.r_en.eq((~me_valid | me_finish) & ~freeze),
        ]
        with m.If(fill_valid & src_look.ready):
            m.d.sync += [me_k.eq(me_k + 1), me_addr.eq(me_addr + 1)]
        with m.If(missq.r_en & missq.r_rdy):     # (after: a new miss starts at line 0)
            m.d.sync += [me.eq(missq.r_data), me_valid.eq(1), me_wb.eq(missq.r_data[0]), me_k.eq(0),
                         me_addr.eq(data.View(miss_rec, missq.r_data).fill_addr)]
        with m.Elif(me_finish):
            m.d.sync += me_valid.eq(0)
        # The victim's write-back goes first (the write-back machine reads it out of the slot
        # before the fill's responses can overwrite it).
        with m.If(me_valid & me_wb & ~wb_active & ~freeze & (mstate != Mgr.FL_CHK) & val_ok):
            m.d.comb += [wb_go.eq(1), wb_base_in.eq(me.wb_base), wb_addr_in.eq(me.wb_addr),
                         wb_lines_in.eq(me.wb_lines)]
            m.d.sync += me_wb.eq(0)
        m.d.comb += miss_idle.eq(~me_valid & ~missq.r_rdy)

        fill_line = Signal(SB)
        m.d.comb += fill_line.eq(me.fill_base | me_k)
        m.d.comb += [
            src_look.valid.eq(wb_have | fill_valid),
            src_look.write.eq(wb_have),
            src_look.addr.eq(Mux(wb_have, wb_paddr, me_addr)),     # (registers: no adder on the port's path)
            src_look.data.eq(Mux(wb_bank, banks[1]["wb"].data, banks[0]["wb"].data)),
            src_look.ctx.eq(Mux(wb_have, ctx_of(Kind.WB, 0), ctx_of(Kind.ROW, fill_line))),
        ]

        def evict(slot, r, drop_tag):
            """Queue the write-back of ``slot`` (record ``r``) with the insert's fill; forget its
            tag unless the caller reuses it."""
            m.d.comb += [miss_w.wb.eq(dirty.bit_select(slot, 1)), miss_w.wb_base.eq(slot << slot_shift),
                         miss_w.wb_addr.eq(r.addr), miss_w.wb_lines.eq(r.lines)]
            if drop_tag:
                m.d.comb += [tag_drop.addr.eq(_hash(r.addr, TSB, 0x9E3779B1)), tag_drop.data.eq(0),
                             tag_drop.en.eq(Const(1, W) << r.way)]

        def insert(slot, way, then=Mgr.LOOK):
            """Tag and slot state of the missing row, its fill queued (after the victim's
            write-back), its occurrence pushed; the manager goes on in ``then`` (DROP after an
            eviction that drops a tag: the drop lands one cycle later, and no lookup may use a
            tag read before it). Callers check ``room``."""
            new = Signal(entry, name="new_entry")
            srec = Signal(slot_rec, name="new_slot")
            m.d.comb += [new.valid.eq(1), new.key.eq(s3.addr), new.slot.eq(slot),
                         tag_wp.addr.eq(s3.set), tag_wp.data.eq(Cat(*[new] * W)), tag_wp.en.eq(Const(1, W) << way),
                         srec.valid.eq(1), srec.ref.eq(0), srec.addr.eq(s3.addr), srec.lines.eq(s3.lines),
                         srec.last_use.eq(seq), srec.way.eq(way),
                         slot_wp.addr.eq(slot), slot_wp.data.eq(srec), slot_wp.en.eq(1)]
            m.d.comb += [miss_w.fill_base.eq(slot << slot_shift), miss_w.fill_addr.eq(s3.addr),
                         miss_w.lines.eq(s3.lines), missq.w_en.eq(1),
                         push.eq(1), push_slot.eq(slot), s3_done.eq(1),
                         ins_base.eq(slot << slot_shift), ins_clear.eq(1), ins_way.eq(way), ins_slot.eq(slot)]
            m.d.sync += [st_rows_read.eq(st_rows_read + 1), mstate.eq(then)]

        # slot_rp.data is slot[hand] whenever the previous cycle presented ``hand`` (the
        # default), so a miss can take the victim at the hand in the cycle it is found.
        at_hand = slot_rd_addr == hand
        victim_at_hand = at_hand & rec.valid & ~pinned & ~rec.ref
        m.d.comb += slot_rp.addr.eq(hand)
        with m.Switch(mstate):
            with m.Case(Mgr.IDLE):
                with m.If(look_go):
                    m.d.sync += mstate.eq(Mgr.LOOK)
            with m.Case(Mgr.LOOK):
                with m.If(flush_go):
                    m.d.comb += slot_rp.addr.eq(0)
                    m.d.sync += [fs.eq(0), abort_mode.eq(0), mstate.eq(Mgr.FL_CHK)]
                with m.Elif(s3_valid & ~freeze):
                    with m.If(s3_hit):
                        with m.If(occ_q.w_rdy):
                            hrec = Signal(slot_rec)
                            m.d.comb += [push.eq(1), push_slot.eq(s3_hit_slot), s3_done.eq(1),
                                         hrec.valid.eq(1), hrec.ref.eq(1), hrec.addr.eq(s3.addr),
                                         hrec.lines.eq(s3.lines), hrec.last_use.eq(seq), hrec.way.eq(s3_hit_way),
                                         slot_wp.addr.eq(s3_hit_slot), slot_wp.data.eq(hrec), slot_wp.en.eq(1)]
                    with m.Elif(s3_full):
                        m.d.sync += mstate.eq(Mgr.CONF_RD)
                    with m.Elif(fresh != nslots):
                        with m.If(room):
                            m.d.sync += fresh.eq(fresh + 1)
                            insert(fresh[:SB], s3_free_way)
                    with m.Elif(victim_at_hand & room):
                        evict(hand, rec, drop_tag=True)
                        insert(hand, s3_free_way, then=Mgr.DROP)
                        m.d.sync += hand.eq(hand_next)
                    with m.Else():
                        m.d.sync += [vway.eq(s3_free_way), mstate.eq(Mgr.CLOCK)]
            with m.Case(Mgr.CLOCK):
                # CLOCK (second chance) over the slots; pinned slots are skipped.
                with m.If(~at_hand | ~room):
                    pass                                # wait for slot[hand] / room in the queues
                with m.Elif(pinned):
                    m.d.comb += slot_rp.addr.eq(hand_next)
                    m.d.sync += hand.eq(hand_next)
                with m.Elif(rec.ref):
                    cleared = Signal(slot_rec)
                    m.d.comb += [cleared.eq(rec), cleared.ref.eq(0),
                                 slot_wp.addr.eq(hand), slot_wp.data.eq(cleared), slot_wp.en.eq(1),
                                 slot_rp.addr.eq(hand_next)]
                    m.d.sync += hand.eq(hand_next)
                with m.Else():
                    with m.If(rec.valid):
                        evict(hand, rec, drop_tag=True)
                    insert(hand, vway, then=Mgr.DROP)
                    m.d.sync += hand.eq(hand_next)
            with m.Case(Mgr.DROP):
                m.d.sync += mstate.eq(Mgr.LOOK)     # the drop lands now (S2 waits if on its set)
            with m.Case(Mgr.CONF_RD):
                # The missing row's tag set is full: evict one of its rows and reuse the way.
                m.d.comb += slot_rp.addr.eq(tw_way.slot)
                m.d.sync += mstate.eq(Mgr.CONF_CHK)
            with m.Case(Mgr.CONF_CHK):
                # rec is slot[tw_way.slot] (read in CONF_RD) and stays so while the manager
                # waits for room: the read port keeps that address (not the hand's).
                m.d.comb += slot_rp.addr.eq(tw_way.slot)
                with m.If(slot_rd_addr != tw_way.slot):
                    pass
                with m.Elif(pinned):
                    m.d.sync += [rr.eq(rr + 1), mstate.eq(Mgr.CONF_RD)]
                with m.Elif(room):
                    evict(tw_way.slot, rec, drop_tag=False)
                    insert(tw_way.slot, rr)
                    m.d.sync += rr.eq(rr + 1)
            with m.Case(Mgr.FL_CHK):
                # End of the batch (or a MEDIA abort): write back (unless aborting) and forget
                # every slot used, one per cycle as the write-back machine frees up.
                m.d.comb += slot_rp.addr.eq(fs[:SB])
                with m.If(fs == fresh):
                    with m.If(~wb_active):
                        m.d.sync += [fresh.eq(0), hand.eq(0), mstate.eq(Mgr.IDLE)]
                with m.Elif(slot_rd_addr != fs[:SB]):
                    pass                                # slot[fs] arrives next cycle
                with m.Elif(~rec.valid):
                    m.d.comb += slot_rp.addr.eq((fs + 1)[:SB])
                    m.d.sync += fs.eq(fs + 1)
                with m.Elif(abort_mode | ~wb_active):
                    with m.If(~abort_mode & dirty.bit_select(fs[:SB], 1)):
                        m.d.comb += [wb_go.eq(1), wb_base_in.eq(fs[:SB] << slot_shift), wb_addr_in.eq(rec.addr),
                                     wb_lines_in.eq(rec.lines)]
                    m.d.comb += [tag_drop.addr.eq(_hash(rec.addr, TSB, 0x9E3779B1)), tag_drop.data.eq(0),
                                 tag_drop.en.eq(Const(1, W) << rec.way),
                                 slot_wp.addr.eq(fs[:SB]), slot_wp.data.as_value().eq(0), slot_wp.en.eq(1),
                                 slot_rp.addr.eq((fs + 1)[:SB])]
                    m.d.sync += fs.eq(fs + 1)
        with m.If(abort_go):
            m.d.sync += [fs.eq(0), abort_mode.eq(1), wb_active.eq(0), wb_have.eq(0), me_valid.eq(0),
                         mstate.eq(Mgr.FL_CHK)]
        m.d.comb += mgr_idle.eq(mstate == Mgr.IDLE)

        # Cleaner (eager write-back): while the lookahead runs and the write-back machine is
        # free (no miss at the port's head waits for it with its victim's write-back), write
        # back a dirty row that no queued occurrence uses (unpinned) and that was not hit since
        # the CLOCK hand last passed it (cold), so its eviction later needs no write-back. It
        # fills the write media while the FMA works through hot rows, and while fills wait for
        # their reads (its writes interleave with them on the port), and leaves fewer rows to
        # the end of the batch. A row hit again is dirty again and is written back once more
        # later. A row cleaned while a queued miss already holds its eviction is written twice
        # with the same bytes: the miss's write-back starts after this one (wb_active).
        # The cleaner does not look at this cycle's occurrence push (whose slot comes out of
        # the tag compare; that kept a 25-LUT-level path from the tag ways to the scratchpad's
        # read enable): a row cleaned in the cycle an occurrence pins it stays dirty (a push
        # sets its dirty bit after the clean clears it) and is written back again once
        # updated, and a victim cleaned in the cycle a new row takes its slot is written
        # twice with the same bytes (the fill waits for every write-back, ``wb_issuing``).
        # Two stages (the choice and the start were one cycle, 19 LUT levels by `synth --premap`:
        # the slot compare, the 1024-bit dirty select and the 32-bit pin compare in front of the
        # scratchpad's write-back read). The scan picks a cleanable slot into ``cq`` (``cp`` moves
        # on); the start takes ``cq`` when the write-back machine has room. A push for the chosen
        # slot after its record was read (registered: ``push_q``) cancels the choice: the slot
        # was hit, or retaken by an insert (whose occurrence sets its dirty bit), and clearing
        # that dirty bit could lose the new row's write-back. A push in the start's own cycle
        # keeps the bit set (set wins); the rows cleaned then are written again, as above.
        cp = Signal(SB)
        cp_rd = Signal(SB)                      # the address slot_cp.data belongs to
        clean_go = Signal()
        crec = slot_cp.data
        cp_next = Mux(cp + 1 >= fresh, 0, cp + 1)[:SB]
        cleanable = Signal()
        clean_room = Signal()
        cq_valid = Signal()                     # the slot chosen to clean, and its row
        cq_slot = Signal(SB)
        cq_addr = Signal(32)
        cq_lines = Signal(5)
        push_q = Signal()
        push_slot_q = Signal(SB)
        cq_cancel = Signal()
        m.d.sync += [cp_rd.eq(slot_cp.addr), push_q.eq(push), push_slot_q.eq(push_slot)]
        m.d.comb += [
            slot_cp.addr.eq(cp),
            cleanable.eq((cp_rd == cp) & (cp < fresh) & crec.valid & dirty.bit_select(cp, 1)
                         & (crec.last_use < completed) & ~crec.ref),
            clean_room.eq(look_run & val_ok & ~freeze & ~wb_active & ~(me_valid & me_wb)
                          & (writes_out < self.CLEAN_WRITES)),
            cq_cancel.eq(push_q & (push_slot_q == cq_slot)),
        ]
        with m.If(cq_valid & ~cq_cancel & clean_room):
            m.d.comb += [clean_go.eq(1), wb_go.eq(1), wb_base_in.eq(cq_slot << slot_shift), wb_addr_in.eq(cq_addr),
                         wb_lines_in.eq(cq_lines)]
        with m.If(~look_run | clr | cq_cancel | clean_go):
            m.d.sync += cq_valid.eq(0)
        with m.Elif(~cq_valid & cleanable):
            m.d.sync += [cq_valid.eq(1), cq_slot.eq(cp), cq_addr.eq(crec.addr), cq_lines.eq(crec.lines)]
        with m.If((cp_rd == cp) & (~cleanable | ~cq_valid)):
            m.d.comb += slot_cp.addr.eq(cp_next)
            m.d.sync += cp.eq(cp_next)
        dirty_set = Mux(push, Const(1, SL) << push_slot, 0)
        dirty_clr = Mux(clean_go, Const(1, SL) << cq_slot, 0)
        with m.If(mgr_idle):
            m.d.sync += dirty.eq(0)             # (no slot is valid: after a flush, before LOOK)
        with m.Else():
            m.d.sync += dirty.eq((dirty & ~dirty_clr) | dirty_set)
        with m.If(clr):
            m.d.sync += [s1_valid.eq(0), s2_valid.eq(0), s2_stale.eq(0), s3_valid.eq(0), la_valid.eq(0), seq.eq(0),
                         rr.eq(0), me_valid.eq(0)]

        # ---------------------------------------------------------------- datapath --
        m.submodules.datapath = dp = UpdateDatapath(
            scratch_lines=SL, grad_lines=self.GRAD_LINES, contrib_lines=self.CONTRIB_LINES,
            fma_queue_depth=self.FMA_QUEUE_DEPTH, fp32_pipeline=self.fp32_pipeline)
        m.d.comb += [dp.occ.valid.eq(occ_q.r_rdy), dp.occ.payload.eq(occ_q.r_data), occ_q.r_en.eq(dp.occ.ready),
                     dp.lr.eq(cmd.lr), dp.clear.eq(clr), dp.freeze.eq(freeze), dp.line_arrived.eq(arrived),
                     completed.eq(dp.completed)]
        for i, port in enumerate((garr_mul, garr_fma, garr_fma_b, garr_fma_a1, garr_fma_b1)):
            m.d.comb += [port.addr.eq(dp.grad_query[i]), dp.grad_arrived[i].eq(port.data)]
        for i, port in enumerate((grad_rp, grad_rp1)):
            m.d.comb += [port.addr.eq(dp.grad_rd_addr[i]), dp.grad_rd_data[i].eq(port.data)]
        for b, bank in enumerate(banks):
            m.d.comb += [bank["rd"].addr.eq(dp.bank_rd_addr[b]), dp.bank_rd_data[b].eq(bank["rd"].data),
                         bank["upd"].addr.eq(dp.bank_wr[b].addr), bank["upd"].data.eq(dp.bank_wr[b].data),
                         bank["upd"].en.eq(dp.bank_wr[b].en)]
        with m.If(~clr):
            m.d.sync += g_tail.eq(g_tail + dp.grad_freed)     # the ring frees in order
        # The INIT sweep (placed last: it overrides the ports' other drivers, idle anyway).
        with m.If(state == Main.INIT):
            m.d.comb += [tag_wp.addr.eq(init_ctr), tag_wp.data.eq(0), tag_wp.en.eq((1 << W) - 1),
                         slot_wp.addr.eq(init_ctr), slot_wp.data.as_value().eq(0), slot_wp.en.eq(1),
                         arr_clr_mask.eq((1 << SL) - 1),
                         garr_clr.addr.eq(init_ctr), garr_clr.en.eq(1)]
        return m
