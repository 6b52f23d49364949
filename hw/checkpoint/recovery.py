"""RecoveryEngine: executes RECOVER (scan the checkpoint log, roll back an interrupted batch, report).

Ports
- ``ctl``: In(engine_control_signature()) (hw/ndp/command.py); table ports unused
  (``table_index`` = 0).
- ``mem``: Out(client_port_signature(addr_bits, ctx_bits)), ``ctx_bits`` = log2(depth):
  reads of log lines (a LineReader, hw/mem/line_reader.py) and writes of table rows.
- ``region``: In(LogRegion) from the CKPT_* CSRs (stable while a command runs).
- Results, registered: ``emb_valid``, ``emb_batches`` (32), ``rolled_back``, ``mlp_valid``,
  ``mlp_batch`` (32), ``mlp_slot``. 0 after reset; cleared when a RECOVER starts and set
  when it ends OK, then held until the next RECOVER (a failed RECOVER leaves them 0).

Sequence (formats in hw/checkpoint/log_format.py):
1. Checks: ``slot_lines >= 3`` and ``log_base + 2*slot_lines <= capacity_lines``, else
   ADDRESS / LOG_REGION; if ``mlp_lines != 0``, ``mlp_base + 2*(1+mlp_lines) <=
   capacity_lines``, else ADDRESS / MLP_REGION (``error_info`` = the AddressFault).
2. Read the record lines: embedding slot 0 lines 0, 1, slot 1 lines 0, 1 and, if
   ``mlp_lines != 0``, line 0 of both MLP slots. A record is valid iff
   (hw/checkpoint/record_check.py) its magic is LOG_MAGIC, its crc equals zlib.crc32 of
   the line with the crc field zero, its ``slot`` is the slot it was read from and its
   state is the one of that line (LOGGED at line 0, APPLIED at line 1, MLP_LOGGED at an
   MLP line 0); an MLP record also needs ``lines == mlp_lines``. A torn or never-written
   record is thereby absent.
3. Embedding: k = the greater batch among the slots with a valid LOGGED record (slot 0 on a
   tie). None: ``emb_valid`` = 0, ``emb_batches`` = 0. If that slot's APPLIED record is
   valid with batch k: ``emb_batches`` = k+1, nothing is written. Otherwise batch k's update
   may be partial and is rolled back:
   - pass 1 reads the slot's ``lines`` entry lines (from slot line 2: per GROUP_ENTRIES
     entries a group line, then their payloads) and checks every group line (magic
     GROUP_MAGIC, batch k) and every entry of the record's ``count``: ``dim_lines`` 1..16,
     the entry inside ``lines``, its rows inside device memory and outside the embedding log
     region, and its crc (zlib.crc32 of its EntryCrcPrefix line with batch k, then the
     payload); the entries must take exactly ``lines`` (and ``lines <= slot_lines - 2``).
     Any failure ends with LOG_CORRUPT, ``error_info`` = the index of the failing entry (for
     a group line: its first entry; for lines after the last entry: ``count``; for too few
     lines: the entries counted), before any write.
   - pass 2 reads the entries again and writes every payload line j to ``row_addr + j``;
     done after every write is acknowledged (durable): ``emb_batches`` = k,
     ``rolled_back`` = 1.
4. MLP: among the MLP slots with a valid MLP_LOGGED record the greater batch (slot 0 on a
   tie): ``mlp_valid``, ``mlp_batch``, ``mlp_slot``; none: ``mlp_valid`` = 0.
Errors: a read answered with error or poison -> MEDIA (``error_info`` = entry index; before
any write unless it happens in pass 2, where writing stops); a write answered with error ->
MEDIA after every write was acknowledged.
Persistence: recovery never writes a log line, only table rows with their logged old
values, so it is idempotent: a power failure during RECOVER followed by another RECOVER
gives the same tables and results. Assumes nothing writes device memory meanwhile.
Stats: ``unique_rows`` = entries checked, ``rows_written`` = entries rolled back,
``lines_read`` / ``lines_written`` = media lines.
Throughput: one line per cycle per pass when ``depth`` covers the read latency (pass 2
shares the port between its reads and its writes: about two cycles per payload line). The
CRC of an entry's prefix line is computed in the cycle before its first payload line (a
second, small CRC unit: the prefix is 160 bits), so payload lines take one CRC step each;
an entry's CRC is compared in the cycle after its last payload line (pass 1 ends a cycle
later when its last entry is the last line; a CRC failure wins over whatever the next line
found in that cycle, so ``error_info`` still names the first failing entry).
"""
from amaranth import Cat, Module, Signal, Const, Mux
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from ..common.cxl_mem import LINE_BITS, LINE_BYTES
from ..mem.arbiter import client_port_signature
from ..mem.line_reader import LineReader
from ..ndp.command import AddressFault, NdpError, engine_control_signature
from .crc import crc32_data_part, crc32_line, crc32_state_part
from .log_format import (CRC_INIT, ENTRY_MAGIC, GROUP_ENTRIES, GROUP_MAGIC, EntryCrcPrefix, EntryGroup, EntryInfo,
                         LogRecord, LogRegion, LogState, SLOT_HEADER_LINES, RECORD_LINE_APPLIED, RECORD_LINE_LOGGED,
                         log_region_end, log_region_fits)
from .record_check import RECORD_CRC_MASK, record_valid

MAX_ENTRY_LINES = 16
GSB = (GROUP_ENTRIES - 1).bit_length()
assert GROUP_ENTRIES == 1 << GSB
# the record reads fetch lines LOGGED and APPLIED of a slot as one run of two lines
assert RECORD_LINE_APPLIED == RECORD_LINE_LOGGED + 1


class RecoveryEngine(wiring.Component):
    def __init__(self, *, addr_bits: int, capacity_lines: int, depth: int = 16):
        self.addr_bits = addr_bits
        self.capacity_lines = capacity_lines
        # Each beat carries its line's CRC data part, computed ahead of the reader's output
        # slice: the recurrence below then xors only 32 state bits (the line's 512-input xor
        # trees, then the compare, were the engine's 15-LUT-level path into err_info).
        self._reader = LineReader(addr_bits=addr_bits, depth=depth, side=(32, crc32_data_part))
        self.ctx_bits = self._reader.ctx_bits
        super().__init__({
            "ctl": In(engine_control_signature()),
            "mem": Out(client_port_signature(addr_bits, self.ctx_bits)),
            "region": In(LogRegion),
            "emb_batches": Out(32), "mlp_batch": Out(32),
            "emb_valid": Out(1), "mlp_valid": Out(1), "rolled_back": Out(1), "mlp_slot": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cap = self.capacity_lines
        ctl, reg = self.ctl, self.region
        m.submodules.reader = reader = self._reader

        # ---- the memory port: the reader's reads and the engine's row writes ----------
        req = self.mem.req
        rreq = reader.mem.req
        wr_valid = Signal()
        wr_addr = Signal(48)
        wr_data = Signal(LINE_BITS)
        m.d.comb += [
            req.valid.eq(wr_valid | rreq.valid),
            req.payload.write.eq(wr_valid),
            req.payload.addr.eq(Mux(wr_valid, wr_addr, rreq.payload.addr)),
            req.payload.data.eq(wr_data),
            req.payload.ctx.eq(rreq.payload.ctx),
            req.payload.poison.eq(0),
            # Not a bare constant (Verilator ALWNEVER: a comb block reading nothing never runs).
            req.payload.strb.eq(Mux(req.payload.write, Const((1 << LINE_BYTES) - 1, LINE_BYTES), 0)),
            rreq.ready.eq(req.ready & ~wr_valid),
            reader.mem.rd_rsp.valid.eq(self.mem.rd_rsp.valid),
            reader.mem.rd_rsp.payload.eq(self.mem.rd_rsp.payload),
            self.mem.rd_rsp.ready.eq(reader.mem.rd_rsp.ready),
            reader.mem.wr_rsp.valid.eq(0),
            self.mem.wr_rsp.ready.eq(1),
            ctl.table_index.eq(0),
        ]
        wrsp = self.mem.wr_rsp
        write_done = Signal()
        m.d.comb += write_done.eq(req.valid & req.ready & wr_valid)

        # ---- per-command state ---------------------------------------------------------
        err = Signal(NdpError)
        err_info = Signal(32)
        run = Signal(2)                    # record-read run: emb slot 0, 1, MLP slot 0, 1
        rec_i = Signal(3)                  # record line being checked (0..5)
        rvalid = Signal(6)
        rbatch = [Signal(32, name=f"rbatch{i}") for i in range(6)]
        sel_q = Signal()                        # DECIDE: slot 1's embedding record is the newer
        msel_q = Signal()                       # DECIDE: slot 1's MLP record is the newer
        rcount = [Signal(32, name=f"rcount{i}") for i in (0, 1)]    # LOGGED records of slot 0, 1
        rlines = [Signal(32, name=f"rlines{i}") for i in (0, 1)]
        k = Signal(32)
        ent_count = Signal(32)
        ent_lines = Signal(32)
        ent_base = Signal(48)
        res_emb_valid = Signal()
        res_emb_batches = Signal(32)
        res_rolled = Signal()
        res_mlp_valid = Signal()
        res_mlp_batch = Signal(32)
        res_mlp_slot = Signal()

        pos = Signal(34)                   # entry lines consumed in this pass
        remaining = Signal(5)              # payload lines left in the current entry
        entries = Signal(32)               # entries completed in this pass
        need_grp = Signal()                # the next line is a group line
        grp = Signal(EntryGroup)           # the current group line
        info = Signal(EntryInfo)           # the current entry's description
        first_line = Signal()              # its first payload line is next
        start_crc = Signal(32)             # CRC register after its EntryCrcPrefix line
        crc_reg = Signal(32)
        row_addr = Signal(48)
        j = Signal(5)
        wr_out = Signal(33)                # row writes not yet acknowledged
        n_read = Signal(32)
        n_written = Signal(32)
        n_checked = Signal(32)
        n_rolled = Signal(32)

        beat = reader.lines.payload
        line = beat.data
        rv = LogRecord(line[:LogRecord.as_shape().size])
        gv = EntryGroup(line)

        # ---- line classes in an entry pass: a group line, a payload line, or one too many
        is_group = Signal()
        is_payload = Signal()
        m.d.comb += [is_group.eq(need_grp), is_payload.eq(~need_grp & (remaining != 0))]

        # ---- the entry that starts after this line: from this group line (its first place) or
        # from the latched group line (the place after the entry this line ends) --------------
        next_n = Signal(32)
        nxt = Signal(EntryInfo)
        m.d.comb += [next_n.eq(Mux(is_group, entries, entries + 1)),
                     nxt.eq(Mux(is_group, gv.entries[0], grp.entries[next_n[:GSB]]))]
        prefix = Signal(EntryCrcPrefix)
        m.d.comb += [prefix.magic.eq(ENTRY_MAGIC), prefix.batch.eq(k), prefix.table.eq(nxt.table),
                     prefix.dim_lines.eq(nxt.dim_lines), prefix.row.eq(nxt.row), prefix.row_addr.eq(nxt.row_addr)]
        prefix_v = prefix.as_value()
        nxt_crc = crc32_line(CRC_INIT, Cat(prefix_v, Const(0, LINE_BITS - len(prefix_v))))

        # ---- CRCs by linearity: a line's update is the state part ^ its data part (from the
        # reader, beat.side). A payload line continues its entry's CRC; a record (one line, crc
        # field zeroed) starts from CRC_INIT, a constant state part, and xors its crc field's
        # data part out. The record's CRC has no state mux of its own: the one shared with the
        # payload lines, selected by the FSM state, put fsm_state -> the compare -> ``rvalid``
        # at 12 LUT levels.
        crc_state = Signal(32)
        crc_next = Signal(32)
        m.d.comb += [
            crc_state.eq(Mux(first_line, start_crc, crc_reg)),
            crc_next.eq(crc32_state_part(crc_state) ^ beat.side),
        ]
        rec_crc = Signal(32)
        m.d.comb += rec_crc.eq(crc32_state_part(Const(CRC_INIT, 32)) ^ beat.side
                               ^ crc32_data_part(line & RECORD_CRC_MASK) ^ CRC_INIT)
        # An entry's CRC is compared a cycle after its last payload line, from crc_reg: the
        # recurrence, the compare and the failure's priority in one cycle were the engine's
        # deepest path (15 LUT levels, fsm_state -> err_info). SCAN waits for the compare
        # before it ends, and a CRC failure overrides what the next line did in that cycle.
        crc_pending = Signal()
        crc_expect = Signal(32)
        crc_entry = Signal(32)             # its entry number (error_info)
        crc_failed = Signal()
        m.d.sync += crc_pending.eq(0)
        m.d.comb += crc_failed.eq(crc_pending & ((crc_reg ^ CRC_INIT) != crc_expect))

        # ---- record checks (rec_i: 0 LOGGED s0, 1 APPLIED s0, 2 LOGGED s1, 3 APPLIED s1, 4/5 MLP s0/s1)
        exp_slot = Signal()
        exp_state = Signal(LogState)
        with m.Switch(rec_i):
            for i, (slot, state) in enumerate([(0, LogState.LOGGED), (0, LogState.APPLIED),
                                               (1, LogState.LOGGED), (1, LogState.APPLIED),
                                               (0, LogState.MLP_LOGGED), (1, LogState.MLP_LOGGED)]):
                with m.Case(i):
                    m.d.comb += [exp_slot.eq(slot), exp_state.eq(state)]
        rec_ok = Signal()
        m.d.comb += rec_ok.eq(~beat.error & record_valid(line, slot=exp_slot, state=exp_state, crc=rec_crc) &
                              ((rec_i < 4) | (rv.lines == reg.mlp_lines)))

        # ---- entry checks: the group line's, and the next entry's description -------------
        log_end = Signal(34)
        m.d.comb += log_end.eq(log_region_end(reg))
        nxt_end = Signal(34)
        row_end = Signal(34)
        m.d.comb += [nxt_end.eq(pos + 1 + nxt.dim_lines), row_end.eq(nxt.row_addr + nxt.dim_lines)]
        group_ok = (gv.magic == GROUP_MAGIC) & (gv.batch == k)
        nxt_ok = ((nxt.dim_lines != 0) & (nxt.dim_lines <= MAX_ENTRY_LINES) & (nxt_end <= ent_lines) &
                  (row_end <= cap) & ((row_end <= reg.log_base) | (nxt.row_addr >= log_end)))
        more = Signal()                    # an entry starts after this line
        m.d.comb += more.eq(next_n != ent_count)

        def start_next():
            """After this line: the next entry's payload (or its group line) follows."""
            with m.If(is_group | (more & (next_n[:GSB] != 0))):
                m.d.sync += [info.eq(nxt), remaining.eq(nxt.dim_lines), first_line.eq(1), start_crc.eq(nxt_crc),
                             row_addr.eq(nxt.row_addr), j.eq(0)]
            with m.Elif(more):
                m.d.sync += need_grp.eq(1)

        def pass_start():
            m.d.sync += [pos.eq(0), remaining.eq(0), entries.eq(0), need_grp.eq(ent_count != 0)]
            m.d.comb += [reader.start.eq(1), reader.base.eq(ent_base), reader.count.eq(ent_lines)]

        # ---- counters ----------------------------------------------------------------------
        with m.If(rreq.valid & rreq.ready):
            m.d.sync += n_read.eq(n_read + 1)
        with m.If(write_done):
            m.d.sync += n_written.eq(n_written + 1)
        m.d.sync += wr_out.eq(wr_out + write_done - wrsp.valid)
        with m.If(wrsp.valid & wrsp.payload.error & (err == NdpError.OK)):
            m.d.sync += [err.eq(NdpError.MEDIA), err_info.eq(entries)]
        m.d.comb += [ctl.stats.lines_read.eq(n_read), ctl.stats.lines_written.eq(n_written),
                     ctl.stats.unique_rows.eq(n_checked), ctl.stats.rows_written.eq(n_rolled)]

        # ---- results ---------------------------------------------------------------------
        outs = [(self.emb_valid, res_emb_valid), (self.emb_batches, res_emb_batches),
                (self.rolled_back, res_rolled), (self.mlp_valid, res_mlp_valid),
                (self.mlp_batch, res_mlp_batch), (self.mlp_slot, res_mlp_slot)]

        def fail(code, info):
            m.d.sync += [err.eq(code), err_info.eq(info)]
            m.d.comb += reader.abort.eq(1)
            m.next = "DRAIN"

        with m.FSM() as fsm:
            with m.State("IDLE"):
                with m.If(ctl.start):
                    m.d.sync += [err.eq(NdpError.OK), err_info.eq(0), run.eq(0), rec_i.eq(0), rvalid.eq(0),
                                 n_read.eq(0), n_written.eq(0), n_checked.eq(0), n_rolled.eq(0), entries.eq(0)]
                    m.d.sync += [o.eq(0) for o, _ in outs]
                    m.next = "CHECK"
            with m.State("CHECK"):
                with m.If(~log_region_fits(reg, cap)):
                    m.d.sync += [err.eq(NdpError.ADDRESS), err_info.eq(AddressFault.LOG_REGION)]
                    m.next = "DONE"
                with m.Elif((reg.mlp_lines != 0) & (reg.mlp_base + ((reg.mlp_lines + 1) << 1) > cap)):
                    m.d.sync += [err.eq(NdpError.ADDRESS), err_info.eq(AddressFault.MLP_REGION)]
                    m.next = "DONE"
                with m.Else():
                    m.next = "REC_START"
            with m.State("REC_START"):
                m.d.comb += reader.start.eq(1)
                with m.Switch(run):
                    with m.Case(0):
                        m.d.comb += [reader.base.eq(reg.log_base + RECORD_LINE_LOGGED), reader.count.eq(2)]
                    with m.Case(1):
                        m.d.comb += [reader.base.eq(reg.log_base + reg.slot_lines + RECORD_LINE_LOGGED),
                                     reader.count.eq(2)]
                    with m.Case(2):
                        m.d.comb += [reader.base.eq(reg.mlp_base), reader.count.eq(1)]
                    with m.Case(3):
                        m.d.comb += [reader.base.eq(reg.mlp_base + reg.mlp_lines + 1), reader.count.eq(1)]
                m.next = "REC_READ"
            with m.State("REC_READ"):
                m.d.comb += reader.lines.ready.eq(1)
                with m.If(reader.lines.valid):
                    m.d.sync += rec_i.eq(rec_i + 1)
                    with m.If(beat.error & (err == NdpError.OK)):
                        m.d.sync += [err.eq(NdpError.MEDIA), err_info.eq(0)]
                    with m.Switch(rec_i):
                        for i in range(6):
                            with m.Case(i):
                                m.d.sync += [rvalid[i].eq(rec_ok), rbatch[i].eq(rv.batch)]
                                if i in (0, 2):
                                    m.d.sync += [rcount[i // 2].eq(rv.count), rlines[i // 2].eq(rv.lines)]
                with m.Elif(~reader.busy):
                    with m.If(err != NdpError.OK):
                        m.next = "DONE"
                    with m.Elif((run == 3) | ((run == 1) & (reg.mlp_lines == 0))):
                        m.next = "DECIDE"
                    with m.Else():
                        m.d.sync += run.eq(run + 1)
                        m.next = "REC_START"
            with m.State("DECIDE"):
                # Which slot is newer, in a cycle of its own: the batch compares' carry chains
                # then do not run on through the applied check into the FSM's next state
                # (12 LUT levels, rbatch2 -> fsm_state, in the eighth round's device run).
                v0, v1 = rvalid[0], rvalid[2]
                m0, m1 = rvalid[4], rvalid[5]
                m.d.sync += [sel_q.eq(v1 & (~v0 | (rbatch[2] > rbatch[0]))),
                             msel_q.eq(m1 & (~m0 | (rbatch[5] > rbatch[4])))]
                m.next = "DECIDE_APPLIED"
            with m.State("DECIDE_APPLIED"):
                v0, v1 = rvalid[0], rvalid[2]
                m0, m1 = rvalid[4], rvalid[5]
                sel, msel = sel_q, msel_q
                kk = Mux(sel, rbatch[2], rbatch[0])
                applied = Mux(sel, rvalid[3] & (rbatch[3] == kk), rvalid[1] & (rbatch[1] == kk))
                m.d.sync += [
                    k.eq(kk),
                    ent_count.eq(Mux(sel, rcount[1], rcount[0])),
                    ent_lines.eq(Mux(sel, rlines[1], rlines[0])),
                    ent_base.eq(reg.log_base + Mux(sel, reg.slot_lines, 0) + SLOT_HEADER_LINES),
                    res_emb_valid.eq(v0 | v1),
                    res_emb_batches.eq(Mux(v0 | v1, Mux(applied, kk + 1, kk), 0)),
                    res_rolled.eq((v0 | v1) & ~applied),
                    res_mlp_valid.eq(m0 | m1),
                    res_mlp_batch.eq(Mux(m0 | m1, Mux(msel, rbatch[5], rbatch[4]), 0)),
                    res_mlp_slot.eq(msel),
                ]
                with m.If(~(v0 | v1) | applied):
                    m.next = "DONE"
                with m.Else():
                    m.next = "SCAN_CHECK"
            with m.State("SCAN_CHECK"):
                with m.If(ent_lines > reg.slot_lines - SLOT_HEADER_LINES):
                    m.d.sync += [err.eq(NdpError.LOG_CORRUPT), err_info.eq(0)]
                    m.next = "DONE"
                with m.Else():
                    pass_start()
                    m.next = "SCAN"
            with m.State("SCAN"):              # pass 1: check every entry, write nothing
                m.d.comb += reader.lines.ready.eq(1)
                with m.If(reader.lines.valid):
                    m.d.sync += [pos.eq(pos + 1), crc_reg.eq(crc_next), first_line.eq(0)]
                    with m.If(beat.error):
                        fail(NdpError.MEDIA, entries)
                    with m.Elif(is_group):
                        m.d.sync += [grp.eq(gv), need_grp.eq(0)]
                        start_next()
                        with m.If(~group_ok | ~nxt_ok):
                            fail(NdpError.LOG_CORRUPT, entries)
                    with m.Elif(is_payload):
                        m.d.sync += remaining.eq(remaining - 1)
                        with m.If(remaining == 1):
                            m.d.sync += [entries.eq(entries + 1), crc_pending.eq(1), crc_expect.eq(info.crc),
                                         crc_entry.eq(entries)]
                            start_next()
                            with m.If(more & (next_n[:GSB] != 0) & ~nxt_ok):
                                fail(NdpError.LOG_CORRUPT, next_n)
                    with m.Else():             # a line after the last entry: lines and count disagree
                        fail(NdpError.LOG_CORRUPT, entries)
                with m.Elif(~reader.busy & ~crc_pending):
                    m.d.sync += n_checked.eq(entries)
                    with m.If(entries != ent_count):
                        m.d.sync += [err.eq(NdpError.LOG_CORRUPT), err_info.eq(entries)]
                        m.next = "DONE"
                    with m.Else():
                        pass_start()
                        m.next = "ROLL"
                with m.If(crc_failed):         # the entry before this line: its failure comes first
                    fail(NdpError.LOG_CORRUPT, crc_entry)
            with m.State("ROLL"):              # pass 2: write the old values back (pass 1 checked them)
                m.d.comb += [wr_addr.eq(row_addr + j), wr_data.eq(line)]
                with m.If(reader.lines.valid):
                    with m.If(beat.error):
                        m.d.comb += reader.lines.ready.eq(1)
                        fail(NdpError.MEDIA, entries)
                    with m.Elif(is_group):
                        m.d.comb += reader.lines.ready.eq(1)
                        m.d.sync += [grp.eq(gv), need_grp.eq(0)]
                        start_next()
                    with m.Else():
                        m.d.comb += [wr_valid.eq(1), reader.lines.ready.eq(req.ready)]
                        with m.If(req.ready):
                            m.d.sync += [j.eq(j + 1), remaining.eq(remaining - 1)]
                            with m.If(remaining == 1):
                                m.d.sync += [entries.eq(entries + 1), n_rolled.eq(n_rolled + 1)]
                                start_next()
                with m.Elif(~reader.busy & (wr_out == 0)):
                    m.next = "DONE"
            with m.State("DRAIN"):             # wait for the reads and writes in flight
                with m.If(crc_failed):         # the failed entry came before the line that failed
                    m.d.sync += [err.eq(NdpError.LOG_CORRUPT), err_info.eq(crc_entry)]
                with m.If(~reader.busy & (wr_out == 0)):
                    m.next = "DONE"
            with m.State("DONE"):
                m.d.comb += [ctl.done.eq(1), ctl.error.eq(err), ctl.error_info.eq(err_info)]
                with m.If(err == NdpError.OK):
                    m.d.sync += [o.eq(r) for o, r in outs]
                m.next = "IDLE"
        m.d.comb += ctl.busy.eq(~fsm.ongoing("IDLE"))
        return m
