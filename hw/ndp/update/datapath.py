"""UpdateDatapath: the UPDATE engine's arithmetic: PyTorch's row = fma(-lr, c, row) on the
scratchpad, one line-step (16 floats) or a line pair per cycle, rows kept in program order.

Contract
--------
Ports (``UpdateDatapath(scratch_lines=, grad_lines=, contrib_lines=, fma_queue_depth=,
fp32_pipeline=)``; SB = log2(scratch_lines), GB = log2(grad_lines))
- ``occ``: In(stream.Signature(occurrence_layout(SB, GB))): the occurrences in the order
  their rows must see them (the lookahead's occurrence queue). ``row_base``: the row's first
  scratchpad line (slots are aligned to a power of two >= ``lines``); ``lines``: dim/16;
  ``gpos``: the bag's first gradient line in the ring; ``mul``/``scale``: c = g * scale
  (WEIGHTED_SUM, MEAN) rather than c = g (SUM); ``bag_last``: the bag's last occurrence (its
  gradient lines are freed with it). ``ready`` does not depend on ``valid``.
- ``lr``: In(32), the command's learning rate (stable while the engine runs).
- ``clear``: In(1), a command's start: forget everything (one cycle; nothing in flight).
- ``freeze``: In(1), a MEDIA abort: issue nothing new (what is in flight completes).
- ``line_arrived``: In(scratch_lines): a scratchpad line's fill has landed (the owner sets
  and clears these bits; a line is read only once its bit is set).
- ``grad_query``: Out(5 x GB) gradient-ring lines whose arrival ``grad_arrived`` (In(5))
  answers in the same cycle (an asynchronous read): 0 the MUL front's line, 1 and 2 window
  entries A and B, 3 and 4 A's and B's next lines (a line pair).
- ``grad_rd_addr``: Out(2 x GB), ``grad_rd_data``: In(2 x 512): the gradient ring's two
  synchronous read ports (data one cycle after the address): 0 for MUL and issue slot 0,
  1 for issue slot 1 (a replica of the ring).
- ``bank_rd_addr``: Out(2 x (SB-1)), ``bank_rd_data``: In(2 x 512): the scratchpad's two
  banks (line parity), synchronous reads that must see a ``bank_wr`` of the same cycle (a
  bypass); ``bank_wr``: Out(2 x {addr, data, en}): the results, one write port per bank.
- ``completed``: Out(32), occurrences whose last line is written into the scratchpad, a
  prefix of the occurrence order (pinning relies on it); 0 after ``clear``.
- ``grad_freed``: Out(GB + 1), gradient-ring lines freed in this cycle (in ring order; the
  owner advances the ring's tail by it).

Behaviour, latency, throughput
- MUL front: c = g * scale into a ``contrib_lines`` contribution ring (WEIGHTED_SUM, MEAN; one
  line per cycle on lane group 0 when the FMA does not use it); SUM occurrences pass straight
  to the FMA queue (``fma_queue_depth``) with c = the gradient line itself.
- FMA front: a window of the two oldest queued occurrences, A (older) and B. A line-step of A
  issues when its row line has arrived, its c is ready and no FMA on the same scratchpad
  line issued in the L - CD - 1 previous cycles (below; a result leaving as the line's
  next row enters is forwarded); else B may
  issue, unless it updates A's row (one row's updates stay in program order). The issuing
  occurrence's next line goes to group 1 in the same cycle when its operands are ready too
  (lines k and k+1 of a row are in different banks). Occurrences complete in order (a B
  that finished first waits for A). So one row updated back to back costs a loop through
  the FMA per occurrence (below), but another row fills the gap; otherwise up to two
  line-steps per cycle.
- Issue in cycle t: c (the gradient or contribution line) is read in t and enters the lanes
  with -lr in t + 1; the row is read in t + CD and enters in t + 1 + CD; the result is written
  in t + 1 + L (L = 5 "compact", 12 "deep": hw/common/fp32.py). CD = 0 with the compact FMA;
  the deep FMA takes its addend late (CD = LATE_C = 2), so a row's next update may issue
  L - CD cycles after the one before: 5 compact, 10 deep (12 before the late addend). A
  result leaving in the cycle its line's next row enters is forwarded. Bit-exact with
  sim/model/embedding.py (one rounding; NaN results are 0x7FC00000).
"""
from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, ResetInserter, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from ...common.cxl_mem import LINE_BITS
from ...common.fp32 import FmaOp, Fp32Fma
from ..command import FLOATS_PER_LINE

LANES = FLOATS_PER_LINE
GRAD_QUERIES = 5                 # the MUL front, window entries A and B, their next lines


def occurrence_layout(slot_line_bits: int, grad_bits: int) -> data.StructLayout:
    """One index occurrence as the datapath takes it (see the module docstring)."""
    return data.StructLayout({"row_base": slot_line_bits, "lines": 5, "gpos": grad_bits, "scale": 32, "mul": 1,
                              "bag_last": 1})


class _ReadPort:
    """A synchronous or asynchronous read port seen through this block's ports."""
    def __init__(self, addr, data):
        self.addr, self.data = addr, data


class UpdateDatapath(wiring.Component):
    """The MUL front, the FMA window and two groups of 16 Fp32Fma lanes (module docstring)."""

    def __init__(self, *, scratch_lines: int, grad_lines: int, contrib_lines: int, fma_queue_depth: int,
                 fp32_pipeline: str):
        self.scratch_lines = scratch_lines
        self.grad_lines = grad_lines
        self.contrib_lines = contrib_lines
        self.fma_queue_depth = fma_queue_depth
        self.fp32_pipeline = fp32_pipeline
        # The deep FMA takes its addend (the row) late: a row's next update issues L - LATE_C
        # cycles after the one before (hw/common/fp32.py, c_delay).
        self.c_delay = Fp32Fma.LATE_C if fp32_pipeline == "deep" else 0
        sb, gb = ceil_log2(scratch_lines), ceil_log2(grad_lines)
        bank_write = data.StructLayout({"addr": sb - 1, "data": LINE_BITS, "en": 1})
        super().__init__({
            "occ": In(stream.Signature(occurrence_layout(sb, gb))),
            "lr": In(32),
            "clear": In(1),
            "freeze": In(1),
            "line_arrived": In(scratch_lines),
            "grad_query": Out(data.ArrayLayout(gb, GRAD_QUERIES)),
            "grad_arrived": In(GRAD_QUERIES),
            "grad_rd_addr": Out(data.ArrayLayout(gb, 2)),
            "grad_rd_data": In(data.ArrayLayout(LINE_BITS, 2)),
            "bank_rd_addr": Out(data.ArrayLayout(sb - 1, 2)),
            "bank_rd_data": In(data.ArrayLayout(LINE_BITS, 2)),
            "bank_wr": Out(data.ArrayLayout(bank_write, 2)),
            "completed": Out(32),
            "grad_freed": Out(gb + 1),
        })

    def elaborate(self, platform):
        m = Module()
        SB = ceil_log2(self.scratch_lines)
        GB = ceil_log2(self.grad_lines)
        CB = ceil_log2(self.contrib_lines)
        clr, freeze, arrived, completed = self.clear, self.freeze, self.line_arrived, self.completed
        occ_rec = occurrence_layout(SB, GB)
        garr_mul, garr_fma, garr_fma_b, garr_fma_a1, garr_fma_b1 = (
            _ReadPort(self.grad_query[i], self.grad_arrived[i]) for i in range(GRAD_QUERIES))
        grad_rp, grad_rp1 = (_ReadPort(self.grad_rd_addr[i], self.grad_rd_data[i]) for i in range(2))
        banks = [{"rd": _ReadPort(self.bank_rd_addr[b], self.bank_rd_data[b]), "upd": self.bank_wr[b]}
                 for b in range(2)]
        m.d.comb += self.grad_freed.eq(0)

        # MUL front: c = g * scale into the contribution ring (WEIGHTED_SUM, MEAN); SUM
        # occurrences pass straight to the FMA queue with c = the gradient line itself.
        q2_rec = data.StructLayout({"row_base": SB, "lines": 5, "csrc": 1, "cpos": GB, "bag_last": 1})
        m.submodules.fma_q = fma_q = ResetInserter(clr)(SyncFIFOBuffered(width=q2_rec.size,
                                                                          depth=self.fma_queue_depth))
        m.submodules.contrib = contrib = Memory(shape=LINE_BITS, depth=self.contrib_lines, init=[])
        con_wp = contrib.write_port()
        con_rp = contrib.read_port()
        m.submodules.contrib1 = contrib1 = Memory(shape=LINE_BITS, depth=self.contrib_lines, init=[])
        con_wp1 = contrib1.write_port()             # a replica for slot 1, written with contrib
        con_rp1 = contrib1.read_port()
        m.d.comb += [con_wp1.addr.eq(con_wp.addr), con_wp1.data.eq(con_wp.data), con_wp1.en.eq(con_wp.en)]
        con_valid = Signal(self.contrib_lines)
        c_head = Signal(CB + 1)
        c_tail = Signal(CB + 1)
        c_used = Signal(CB + 1)
        m.d.comb += c_used.eq(c_head - c_tail)

        mf_valid = Signal()
        mf = Signal(occ_rec)
        mf_k = Signal(5)
        mf_cpos = Signal(CB)

        fma_go = Signal()
        pair_go = Signal()                      # a second line-step with the FMA's (issue slot 1)
        mul_go = Signal()
        sum_pass = Signal()
        mf_finish = Signal()
        cpos_cur = Signal(CB)
        m.d.comb += cpos_cur.eq(Mux(mf_k == 0, c_head[:CB], mf_cpos))
        m.d.comb += garr_mul.addr.eq((mf.gpos + mf_k)[:GB])
        cspace = (self.contrib_lines - c_used) >= mf.lines
        mul_ready = mf_valid & mf.mul & garr_mul.data & ((mf_k != 0) | (fma_q.w_rdy & cspace))
        m.d.comb += [
            mul_go.eq(mul_ready & ~fma_go & ~freeze),
            sum_pass.eq(mf_valid & ~mf.mul & fma_q.w_rdy & ~freeze),
            mf_finish.eq(sum_pass | (mul_go & (mf_k + 1 == mf.lines))),
            self.occ.ready.eq(~mf_valid | mf_finish),
        ]
        q2w = Signal(q2_rec)
        m.d.comb += [q2w.row_base.eq(mf.row_base), q2w.lines.eq(mf.lines), q2w.csrc.eq(mf.mul),
                     q2w.cpos.eq(Mux(mf.mul, c_head[:CB], mf.gpos)), q2w.bag_last.eq(mf.bag_last),
                     fma_q.w_data.eq(q2w), fma_q.w_en.eq(sum_pass | (mul_go & (mf_k == 0)))]
        with m.If(mul_go):
            m.d.sync += mf_k.eq(mf_k + 1)
            with m.If(mf_k == 0):
                m.d.sync += [mf_cpos.eq(c_head[:CB]), c_head.eq(c_head + mf.lines)]
        with m.If(self.occ.ready & self.occ.valid):
            m.d.sync += [mf.eq(self.occ.payload), mf_valid.eq(1), mf_k.eq(0)]
        with m.Elif(mf_finish):
            m.d.sync += mf_valid.eq(0)

        # FMA front: a window of the two oldest queued occurrences, A (older) and B. A issues
        # when its operands are there and no FMA on its row line is in flight; otherwise B
        # may, unless it updates A's row (one row's updates stay in program order). So a hot
        # row waiting L cycles for its own result does not hold up the next row.
        # Occurrences leave the window in order: a B that finishes first is marked done and
        # leaves with A. Its ring lines are freed with A's (both rings free in order), and its
        # completion is counted with A's last result (``completed`` must count a prefix of the
        # occurrence order: pinning relies on it).
        wa_valid, wb_valid, b_done = Signal(name="wa_valid"), Signal(name="wb_valid"), Signal(name="b_done")
        wa, wb = Signal(q2_rec, name="wa"), Signal(q2_rec, name="wb")
        wa_k, wb_k = Signal(5, name="wa_k"), Signal(5, name="wb_k")
        row_a, row_b = Signal(SB, name="row_a"), Signal(SB, name="row_b")
        c_a, c_b = Signal(GB, name="c_a"), Signal(GB, name="c_b")
        # the entries' next lines (a line pair)
        row_a1, row_b1 = Signal(SB, name="row_a1"), Signal(SB, name="row_b1")
        c_a1, c_b1 = Signal(GB, name="c_a1"), Signal(GB, name="c_b1")
        m.d.comb += [row_a.eq(wa.row_base | wa_k), c_a.eq(wa.cpos + wa_k),
                     garr_fma.addr.eq(c_a),
                     row_b.eq(wb.row_base | wb_k), c_b.eq(wb.cpos + wb_k),
                     garr_fma_b.addr.eq(c_b),
                     row_a1.eq(wa.row_base | (wa_k + 1)[:5]), c_a1.eq(wa.cpos + wa_k + 1),
                     garr_fma_a1.addr.eq(c_a1),
                     row_b1.eq(wb.row_base | (wb_k + 1)[:5]), c_b1.eq(wb.cpos + wb_k + 1),
                     garr_fma_b1.addr.eq(c_b1)]
        # An FMA issued in cycle t takes its row (c) in cycle t + 1 + CD and leaves its result
        # in t + 1 + L; a row line issued again in t' reads its row in t' + CD (a
        # synchronous read, transparent for a same-cycle result) or takes the result leaving
        # in t' + 1 + CD (forwarded). So the FMAs issued 1..HZ cycles ago are in flight.
        CD = self.c_delay
        HZ = Fp32Fma.LATENCIES[self.fp32_pipeline] - 1 - CD
        # Per issue slot (0: a line, 1: the next line of the same occurrence in the same cycle).
        hz_valid = [[Signal(name=f"hz{j}_valid{i}") for i in range(HZ)] for j in range(2)]
        hz_addr = [[Signal(SB, name=f"hz{j}_addr{i}") for i in range(HZ)] for j in range(2)]

        def operands_ready(rec, row, c, arrived, g_arrived):
            in_flight = 0
            for j in range(2):
                for i in range(HZ):
                    in_flight = in_flight | (hz_valid[j][i] & (hz_addr[j][i] == row))
            c_ready = Mux(rec.csrc, con_valid.bit_select(c[:CB], 1), g_arrived)
            return arrived & c_ready & ~in_flight

        go_a, go_b = Signal(name="go_a"), Signal(name="go_b")
        pair_a, pair_b = Signal(name="pair_a"), Signal(name="pair_b")              # ... and its next line with it
        fin_a, fin_b = Signal(name="fin_a"), Signal(name="fin_b")
        m.d.comb += [
            go_a.eq(wa_valid & operands_ready(wa, row_a, c_a, arrived.bit_select(row_a, 1), garr_fma.data) & ~freeze),
            go_b.eq(~go_a & wb_valid & ~b_done & (wb.row_base != wa.row_base) &
                    operands_ready(wb, row_b, c_b, arrived.bit_select(row_b, 1), garr_fma_b.data) & ~freeze),
            # Lines k and k+1 of one row sit in different scratchpad banks (slots are aligned).
            pair_a.eq(go_a & (wa_k + 2 <= wa.lines) & operands_ready(wa, row_a1, c_a1, arrived.bit_select(row_a1, 1),
                                                                     garr_fma_a1.data)),
            pair_b.eq(go_b & (wb_k + 2 <= wb.lines) & operands_ready(wb, row_b1, c_b1, arrived.bit_select(row_b1, 1),
                                                                     garr_fma_b1.data)),
            fma_go.eq(go_a | go_b),
            pair_go.eq(pair_a | pair_b),
            fin_a.eq(go_a & (wa_k + 1 + pair_a == wa.lines)),
            fin_b.eq(go_b & (wb_k + 1 + pair_b == wb.lines)),
        ]
        row_line = Signal(SB)
        c_line = Signal(GB)
        row_line1 = Signal(SB)
        c_line1 = Signal(GB)
        csrc = Signal()
        # The issuing entry's lines, picked by ``go_a`` alone: they only matter when an FMA
        # issues (go_a, or go_b, which implies ~go_a), and go_b's own logic (B's operands, B
        # against A's row, ~go_a) then stays off the operand read addresses (14 LUT levels).
        m.d.comb += [row_line.eq(Mux(go_a, row_a, row_b)), c_line.eq(Mux(go_a, c_a, c_b)),
                     row_line1.eq(Mux(go_a, row_a1, row_b1)), c_line1.eq(Mux(go_a, c_a1, c_b1)),
                     csrc.eq(Mux(go_a, wa.csrc, wb.csrc))]
        m.d.sync += [hz_valid[0][0].eq(fma_go), hz_addr[0][0].eq(row_line),
                     hz_valid[1][0].eq(pair_go), hz_addr[1][0].eq(row_line1)]
        for j in range(2):
            for i in range(1, HZ):
                m.d.sync += [hz_valid[j][i].eq(hz_valid[j][i - 1]), hz_addr[j][i].eq(hz_addr[j][i - 1])]

        with m.If(go_a & ~fin_a):
            m.d.sync += wa_k.eq(wa_k + 1 + pair_a)
        with m.If(go_b):
            m.d.sync += wb_k.eq(wb_k + 1 + pair_b)
            with m.If(fin_b):
                m.d.sync += b_done.eq(1)
        b_leaves = wb_valid & b_done             # with A, this cycle, when A finishes
        with m.If(fin_a):
            # A leaves (and a finished B with it): free their ring lines, in order.
            m.d.sync += c_tail.eq(c_tail + Mux(wa.csrc, wa.lines, 0) + Mux(b_leaves & wb.csrc, wb.lines, 0))
            m.d.comb += self.grad_freed.eq(Mux(wa.bag_last, wa.lines, 0) + Mux(b_leaves & wb.bag_last, wb.lines, 0))
        # Window refill: B moves up into A when A leaves without it; the queue's head goes to
        # the first entry free after this cycle.
        a_free = Signal()
        b_free = Signal()
        m.d.comb += [a_free.eq(~wa_valid | (fin_a & ~(wb_valid & ~b_done))),
                     b_free.eq(~wb_valid | fin_a),
                     fma_q.r_en.eq(b_free)]
        with m.If(fin_a):
            m.d.sync += [wa_valid.eq(0), wb_valid.eq(0), b_done.eq(0)]
            with m.If(wb_valid & ~b_done):
                m.d.sync += [wa.eq(wb), wa_k.eq(wb_k), wa_valid.eq(1)]
        with m.If(fma_q.r_en & fma_q.r_rdy):
            with m.If(a_free):
                m.d.sync += [wa.eq(fma_q.r_data), wa_k.eq(0), wa_valid.eq(1)]
            with m.Else():
                m.d.sync += [wb.eq(fma_q.r_data), wb_k.eq(0), wb_valid.eq(1), b_done.eq(0)]
        # Occurrences this issue completes, in order: A's last line counts A and a finished B.
        done_cnt = Signal(2)
        m.d.comb += done_cnt.eq(Mux(fin_a, 1 + b_leaves, 0))

        # Operand reads (cycle 0), lane inputs (cycle 1), results (cycle 6).
        # Operand reads: the slot-0 line from its bank, the slot-1 line (the other parity) from
        # the other bank; the registered parity says which bank answers which slot.
        m.d.comb += [grad_rp.addr.eq(Mux(fma_go, c_line, (mf.gpos + mf_k)[:GB])), con_rp.addr.eq(c_line[:CB]),
                     grad_rp1.addr.eq(c_line1), con_rp1.addr.eq(c_line1[:CB])]
        # Each entry's bank addresses first, then the entry: the pick is the last step.
        # (With a late addend the rows are read CD cycles after the issue, from registers.)
        # r_row[d] / r_row1[d]: the row lines d cycles later.
        r_row, r_row1 = [row_line], [row_line1]
        for d in range(1, CD + 2):
            r_row.append(Signal(SB, name=f"c{d}_row"))
            r_row1.append(Signal(SB, name=f"c{d}_row1"))
            m.d.sync += [r_row[d].eq(r_row[d - 1]), r_row1[d].eq(r_row1[d - 1])]
        for b, bank in enumerate(banks):
            if CD:
                m.d.comb += bank["rd"].addr.eq(Mux(r_row[CD][0] == b, r_row[CD], r_row1[CD])[1:])
            else:
                line_a = Mux(row_a[0] == b, row_a, row_a1)
                line_b = Mux(row_b[0] == b, row_b, row_b1)
                m.d.comb += bank["rd"].addr.eq(Mux(go_a, line_a, line_b)[1:])
        c1_pair = Signal()
        c1_row1 = r_row1[1]
        m.d.sync += c1_pair.eq(pair_go)
        row_par = r_row[CD + 1][0]              # the slot-0 line's bank, when its row arrives
        rd_data = [Mux(row_par, banks[1]["rd"].data, banks[0]["rd"].data),
                   Mux(row_par, banks[0]["rd"].data, banks[1]["rd"].data)]
        c1_fma = Signal()
        c1_mul = Signal()
        c1_row = r_row[1]
        c1_cdst = Signal(CB)
        c1_done = Signal(2)
        c1_scale = Signal(32)
        c1_csrc = Signal()
        m.d.sync += [c1_fma.eq(fma_go), c1_mul.eq(mul_go), c1_cdst.eq(cpos_cur + mf_k),
                     c1_done.eq(done_cnt), c1_scale.eq(mf.scale), c1_csrc.eq(csrc)]
        tag_w = 1 + max(SB, CB) + 2
        lanes = []
        for i in range(LANES):
            lane = Fp32Fma(tag_width=tag_w if i == 0 else 1, pipeline=self.fp32_pipeline, c_delay=CD)
            m.submodules[f"lane{i}"] = lane
            lanes.append(lane)
        lanes1 = []                             # slot 1: FMA only
        for i in range(LANES):
            lane = Fp32Fma(tag_width=SB if i == 0 else 1, pipeline=self.fp32_pipeline, c_delay=CD)
            m.submodules[f"lane1_{i}"] = lane
            lanes1.append(lane)
        o_tag = lanes[0].o_tag
        o_fma = lanes[0].o_valid & o_tag[0]
        o_mul = lanes[0].o_valid & ~o_tag[0]
        o_addr = o_tag[1:1 + max(SB, CB)]
        o_done = o_tag[tag_w - 2:]                  # occurrences completed (done_cnt)
        o_fma1 = lanes1[0].o_valid
        o_addr1 = lanes1[0].o_tag
        results = Cat(*[lane.o_result for lane in lanes])
        results1 = Cat(*[lane.o_result for lane in lanes1])
        # A result leaving the lanes in the cycle its line's next operand arrives is forwarded
        # (the operand was read the cycle before its write); either slot's result, either slot.
        neg_lr = Cat(self.lr[:31], ~self.lr[31])
        operand = []
        for slot, row_s in enumerate((r_row[CD + 1], r_row1[CD + 1])):
            f0, f1 = Signal(name=f"fwd{slot}_from_slot0"), Signal(name=f"fwd{slot}_from_slot1")
            m.d.comb += [f0.eq(o_fma & (o_addr[:SB] == row_s)), f1.eq(o_fma1 & (o_addr1 == row_s))]
            operand.append((f0, f1))
        groups = ((lanes, con_rp.data, grad_rp.data, operand[0], rd_data[0]),
                  (lanes1, con_rp1.data, grad_rp1.data, operand[1], rd_data[1]))
        for grp, (lns, cdat, gdat, (f0, f1), rdat) in enumerate(groups):
            for i, lane in enumerate(lns):
                sl = slice(32 * i, 32 * (i + 1))
                g = gdat[sl]
                row = Mux(f0, results[sl], Mux(f1, results1[sl], rdat[sl]))
                c_op = Mux(c1_csrc, cdat[sl], g)
                if grp == 0:
                    m.d.comb += [
                        lane.i_valid.eq(c1_fma | c1_mul),
                        lane.op.eq(Mux(c1_fma, FmaOp.FMA, FmaOp.MUL)),
                        lane.a.eq(Mux(c1_fma, neg_lr, g)),
                        lane.b.eq(Mux(c1_fma, c_op, c1_scale)),
                        lane.c.eq(row),
                    ]
                else:
                    m.d.comb += [lane.i_valid.eq(c1_pair), lane.op.eq(FmaOp.FMA), lane.a.eq(neg_lr),
                                 lane.b.eq(c_op), lane.c.eq(row)]
        m.d.comb += [lanes[0].i_tag.eq(Cat(c1_fma, Mux(c1_fma, c1_row, c1_cdst), c1_done)),
                     lanes1[0].i_tag.eq(c1_row1)]
        # Results: each to its line's bank (a pair's two lines never share one).
        for b, bank in enumerate(banks):
            mine0 = o_fma & (o_addr[0] == b)
            m.d.comb += [bank["upd"].addr.eq(Mux(mine0, o_addr[1:SB], o_addr1[1:])),
                         bank["upd"].data.eq(Mux(mine0, results, results1)),
                         bank["upd"].en.eq(mine0 | (o_fma1 & (o_addr1[0] == b)))]
        m.d.comb += [con_wp.addr.eq(o_addr[:CB]), con_wp.data.eq(results), con_wp.en.eq(o_mul)]
        with m.If(o_fma):
            m.d.sync += completed.eq(completed + o_done)
        con_set = Mux(o_mul, Const(1, self.contrib_lines) << o_addr[:CB], 0)
        con_clr = (Mux(fma_go & csrc, Const(1, self.contrib_lines) << c_line[:CB], 0) |
                   Mux(pair_go & csrc, Const(1, self.contrib_lines) << c_line1[:CB], 0))
        m.d.sync += con_valid.eq((con_valid | con_set) & ~con_clr)
        with m.If(clr):
            m.d.sync += [mf_valid.eq(0), wa_valid.eq(0), wb_valid.eq(0), b_done.eq(0), c_head.eq(0), c_tail.eq(0),
                         con_valid.eq(0), completed.eq(0)] + [h.eq(0) for hz in hz_valid for h in hz]
        return m
