"""CXL.mem target (HDM-D, Type-2 device memory) with its HDM decoder.

Ports
- ``m2s_req`` In stream(M2SReq), ``m2s_rwd`` In stream(M2SRwD): from the host.
- ``s2m_ndr`` Out stream(S2MNDR), ``s2m_drs`` Out stream(S2MDRS): to the host.
- ``mem_req`` Out, ``mem_rd_rsp`` In, ``mem_wr_rsp`` In: the device memory port
  (hw/mem/port.py), device line addresses.
- ``hdm_base``, ``hdm_size`` (46-bit line counts), ``hdm_enable``: the HDM decoder window
  (from CSRs). A line decodes when enabled, base <= addr < base + size, and the offset is
  below the device capacity.
- ``events``: one-cycle pulses for the CSR error and statistics counters.

Answers (docs/cxl-reference.md §1 "Expected responses"; Tag and LD-ID always echoed):
- MemRd / MemRdData in the window: a media read, then NDR + DRS MemData together. NDR
  opcode: Meta0-State with MetaValue Any -> Cmp-E, Shared -> Cmp-S, Invalid -> Cmp;
  MetaField No-Op -> Cmp, except MemRdData -> Cmp-E (no device cache can hold the line).
  Poisoned lines return DRS Poison=1; a media error returns Poison=1 too.
- MemInv / MemInvNT: NDR only, by the same rule (no device cache: nothing to flush).
- MemSpecRd: no response; dropped (counted).
- MemWr (all 64 bytes) / MemWrPtl (byte enables): the media write, then NDR Cmp once the
  line is in the persistence domain. Poison=1 stores the line poisoned.
- Outside the window: reads (MemRd, MemRdData) answer one DRS MemData-NXM with all-ones
  data and no NDR; other Req answer NDR Cmp; writes answer NDR Cmp without effect.
- MemRdFwd / MemWrFwd: completions of the device's CXL.cache requests to its own memory
  (host-bias resolution); handed to the agent on ``fwd`` (Tag = CQID), never answered.
- Bias (HDM-D): a host access to a line of a device-bias page flips the page to host bias
  (``bias_to_host`` on ``bias_flip_page``) two cycles after its decode: the cycle after the
  decode reads the page's bit (``bias_page`` / ``bias_device``, from registers), the next one
  writes it. A flip still being written when the same page is read again counts as done (a
  bypass register), so each access sees every earlier access's flip and a page flips once.
  The device caches no device-memory lines, so nothing is flushed and the access does not
  wait for the flip.
- BIConflict: BI-ConflictAck at once (HDM-D: no back-invalidate snoop can be pending);
  counted as unsupported.
- Any other Req or RwD opcode (TEE, MemClnEvct, MemRdFill, reserved): NDR Cmp, no effect,
  counted. Nothing hangs.

Throughput and latency: one M2S message per cycle in total (Req and RwD are arbitrated
round-robin at the port: ``ready`` of one may drop while the other is taken); one S2M NDR
and one DRS per cycle. Idle MemRd latency: the media's read latency plus
``PIPELINE_READ_CYCLES`` = 10 (input FIFO, decode stage, the shared port's register slice,
the memory subsystem's request and response register slices, channel FIFO, output FIFO;
checked by the test ``idle_read_latency``). Responses may return in any order.

Ordering: messages are serialized where they are accepted. A read accepted after a write
to the same line returns the new data (hw/mem guarantees it); a read accepted before a
write may return either (Req and RwD are unordered in CXL).

Every S2M message carries MetaField No-Op (this device stores no Meta0 state; MetaValue is
then meaningless and sent as 0) and DevLoad Light.

Constant fields and Verilator (ALWNEVER): when a signal is assigned under ``m.If`` /
``m.Switch`` anywhere, Amaranth emits it as a Verilog ``reg`` driven by an ``always @*``
process, and any of its bits that no conditional statement assigns (a field only ever tied
to a constant, or never assigned) is split off into its own ``always @* sig[..] = const;``.
That block reads no variable, so an event-driven simulator never runs it: Verilator left
the NDR/DRS MetaField at 0 (Meta0-State) instead of No-Op. So here the S2M headers and the
``events`` port are assembled field by field with unconditional statements only (Yosys
then writes plain ``assign``s), from small signals that carry the conditional parts; and
the decode and response stages each own a struct of just the events they raise (the bias
flip stage raises one, ``bias_to_host``, as its own signal).
tests/test_no_alwnever.py lints this module with ALWNEVER enabled.
"""
from amaranth import Module, Signal, Const, Mux
from amaranth.lib import stream, wiring, fifo, data
from amaranth.lib.wiring import In, Out

from ..common.cxl_mem import (
    M2SReq, M2SRwD, S2MNDR, S2MDRS, M2SReqOpcode, M2SRwDOpcode, MetaField, MetaValue,
    NDROpcode, DRSOpcode, DevLoad, LINE_ADDR_BITS, LINE_BITS, LINE_BYTES, TAG_BITS,
    LD_ID_BITS)
from ..common.stream_util import RoundRobinArbiter
from ..mem.port import mem_request_layout, mem_read_response_layout, mem_write_response_layout

# Per-request context carried through the memory subsystem and back.
CTX = data.StructLayout({"tag": TAG_BITS, "ld_id": LD_ID_BITS, "ndr_opcode": NDROpcode})

# Cycles a MemRd spends in the device outside the media, from its M2S handshake to its DRS
# handshake with an idle device and an always-ready host: 2 in each of the three buffered
# FIFOs (input, channel, output), 1 in the decode stage, 1 in the shared memory port's
# register slice (hw/top.py) and 1 in each of the memory subsystem's request and response
# register slices (hw/mem/interleave.py).
PIPELINE_READ_CYCLES = 10

EVENTS = ("oow_req", "oow_rwd", "unsupported_req", "unsupported_rwd",
          "poison_wr", "poison_rd", "media_error", "rd_line", "wr_line", "spec_rd_dropped",
          "inv", "bias_to_host")
# Who raises which event: the response stage the media's answers, the bias flip stage (two
# cycles after the decode) the host accesses' flips, the decode stage the rest.
# Each stage's struct holds only its own events, so no bit of it is a bare constant (ALWNEVER).
RESPONSE_EVENTS = ("poison_rd", "media_error")
BIAS_EVENTS = ("bias_to_host",)             # raised by the bias flip stage, after the decode
DECODE_EVENTS = tuple(e for e in EVENTS if e not in RESPONSE_EVENTS + BIAS_EVENTS)

# MemRdFwd / MemWrFwd handed to the CXL.cache agent: they complete its D2H requests.
FWD = data.StructLayout({"cqid": TAG_BITS, "write": 1})


class Action(data.Struct):
    """What the decode stage decided for one M2S message."""
    mem: 1            # issue a media request (read or write)
    write: 1
    fwd: 1            # a MemRdFwd/MemWrFwd for the CXL.cache agent
    ndr: 1            # send an NDR now (no media access)
    nxm: 1            # send a DRS MemData-NXM now
    ndr_opcode: NDROpcode


class CxlMemTarget(wiring.Component):
    def __init__(self, *, addr_bits, capacity_lines, input_depth=4, output_depth=4,
                 bias_page_bits=6):
        self.addr_bits = addr_bits
        self.capacity_lines = capacity_lines
        self.input_depth = input_depth
        self.output_depth = output_depth
        self.bias_page_bits = bias_page_bits      # log2(lines per bias page)
        self.mem_req_layout = mem_request_layout(addr_bits, CTX.size)
        super().__init__({
            "m2s_req": In(stream.Signature(M2SReq)),
            "m2s_rwd": In(stream.Signature(M2SRwD)),
            "s2m_ndr": Out(stream.Signature(S2MNDR)),
            "s2m_drs": Out(stream.Signature(S2MDRS)),
            "mem_req": Out(stream.Signature(self.mem_req_layout)),
            "mem_rd_rsp": In(stream.Signature(mem_read_response_layout(CTX.size))),
            "mem_wr_rsp": In(stream.Signature(mem_write_response_layout(CTX.size))),
            "hdm_base": In(LINE_ADDR_BITS),
            "hdm_size": In(LINE_ADDR_BITS),
            "hdm_enable": In(1),
            "fwd": Out(stream.Signature(FWD)),
            # Bias table (hw/cxl_controller/bias.py): the page of the host access decoded in
            # the previous cycle and whether it is in device bias (read stage); a pulse
            # flipping ``bias_flip_page`` to host bias (write stage, one cycle later).
            "bias_page": Out(max(addr_bits - bias_page_bits, 1)),
            "bias_device": In(1),
            "bias_to_host": Out(1),
            "bias_flip_page": Out(max(addr_bits - bias_page_bits, 1)),
            "events": Out(data.StructLayout({e: 1 for e in EVENTS})),
        })

    def elaborate(self, platform):
        m = Module()
        ev = self.events

        # ---------------- input: Req and RwD merged at the port, one message per cycle,
        # into one FIFO. Acceptance order is then decode order, so "a read accepted after
        # a write to the same line returns the new data" is visible at the link.
        merged = data.StructLayout({"is_rwd": 1, "msg": M2SRwD})
        m.submodules.in_arb = in_arb = RoundRobinArbiter(merged, 2)
        a0, a1 = in_arb.inputs
        req = self.m2s_req.payload
        m.d.comb += [
            a0.valid.eq(self.m2s_req.valid), self.m2s_req.ready.eq(a0.ready),
            a0.payload.is_rwd.eq(0),
            a0.payload.msg.opcode.eq(req.opcode.as_value()),
            a0.payload.msg.snp_type.eq(req.snp_type), a0.payload.msg.meta_field.eq(req.meta_field),
            a0.payload.msg.meta_value.eq(req.meta_value), a0.payload.msg.tag.eq(req.tag),
            a0.payload.msg.addr.eq(req.addr), a0.payload.msg.ld_id.eq(req.ld_id),
            a0.payload.msg.tc.eq(req.tc),
            a1.valid.eq(self.m2s_rwd.valid), self.m2s_rwd.ready.eq(a1.ready),
            a1.payload.is_rwd.eq(1), a1.payload.msg.eq(self.m2s_rwd.payload),
        ]
        m.submodules.in_fifo = in_fifo = fifo.SyncFIFOBuffered(
            width=merged.size, depth=self.input_depth)
        m.d.comb += [in_fifo.w_data.eq(in_arb.o.payload), in_fifo.w_en.eq(in_arb.o.valid),
                     in_arb.o.ready.eq(in_fifo.w_rdy)]
        inc = merged(in_fifo.r_data)
        msg = inc.msg

        # ---------------- decode (combinational), registered in the stage below
        offset = Signal(LINE_ADDR_BITS + 1)
        m.d.comb += offset.eq(msg.addr - self.hdm_base)
        in_window = Signal()
        m.d.comb += in_window.eq(self.hdm_enable & (msg.addr >= self.hdm_base) &
                                 (offset < self.hdm_size) & (offset < self.capacity_lines))

        req_op = Signal(M2SReqOpcode)
        rwd_op = Signal(M2SRwDOpcode)
        m.d.comb += [req_op.eq(msg.opcode.as_value()), rwd_op.eq(msg.opcode)]

        # NDR opcode for reads and invalidates (cxl-reference §1, testbench check 3).
        meta_cmp = Signal(NDROpcode)
        with m.If(msg.meta_field == MetaField.META0_STATE):
            with m.Switch(msg.meta_value):
                with m.Case(MetaValue.ANY):
                    m.d.comb += meta_cmp.eq(NDROpcode.CMP_E)
                with m.Case(MetaValue.SHARED):
                    m.d.comb += meta_cmp.eq(NDROpcode.CMP_S)
                with m.Default():
                    m.d.comb += meta_cmp.eq(NDROpcode.CMP)
        with m.Else():
            m.d.comb += meta_cmp.eq(NDROpcode.CMP)

        act = Signal(Action)
        strb = Signal(LINE_BYTES)
        dec_events = Signal(data.StructLayout({e: 1 for e in DECODE_EVENTS}))
        with m.If(~inc.is_rwd):
            with m.Switch(req_op):
                with m.Case(M2SReqOpcode.MEM_RD, M2SReqOpcode.MEM_RD_DATA):
                    with m.If(in_window):
                        m.d.comb += [act.mem.eq(1), dec_events.rd_line.eq(1),
                                     act.ndr_opcode.eq(Mux(req_op == M2SReqOpcode.MEM_RD_DATA,
                                                           NDROpcode.CMP_E, meta_cmp))]
                    with m.Else():
                        m.d.comb += [act.nxm.eq(1), dec_events.oow_req.eq(1)]
                with m.Case(M2SReqOpcode.MEM_INV, M2SReqOpcode.MEM_INV_NT):
                    m.d.comb += [act.ndr.eq(1), act.ndr_opcode.eq(meta_cmp)]
                    with m.If(in_window):
                        m.d.comb += dec_events.inv.eq(1)
                    with m.Else():
                        m.d.comb += [act.ndr_opcode.eq(NDROpcode.CMP), dec_events.oow_req.eq(1)]
                with m.Case(M2SReqOpcode.MEM_SPEC_RD):
                    m.d.comb += dec_events.spec_rd_dropped.eq(1)
                with m.Case(M2SReqOpcode.MEM_RD_FWD, M2SReqOpcode.MEM_WR_FWD):
                    m.d.comb += act.fwd.eq(1)
                with m.Default():
                    m.d.comb += [act.ndr.eq(1), act.ndr_opcode.eq(NDROpcode.CMP),
                                 dec_events.unsupported_req.eq(1)]
        with m.Else():
            with m.Switch(rwd_op):
                with m.Case(M2SRwDOpcode.MEM_WR, M2SRwDOpcode.MEM_WR_PTL):
                    with m.If(in_window):
                        m.d.comb += [act.mem.eq(1), act.write.eq(1),
                                     act.ndr_opcode.eq(NDROpcode.CMP),
                                     dec_events.wr_line.eq(1),
                                     dec_events.poison_wr.eq(msg.poison)]
                    with m.Else():
                        m.d.comb += [act.ndr.eq(1), act.ndr_opcode.eq(NDROpcode.CMP),
                                     dec_events.oow_rwd.eq(1)]
                with m.Case(M2SRwDOpcode.BI_CONFLICT):
                    m.d.comb += [act.ndr.eq(1), act.ndr_opcode.eq(NDROpcode.BI_CONFLICT_ACK),
                                 dec_events.unsupported_rwd.eq(1)]
                with m.Default():
                    m.d.comb += [act.ndr.eq(1), act.ndr_opcode.eq(NDROpcode.CMP),
                                 dec_events.unsupported_rwd.eq(1)]
        m.d.comb += strb.eq(Mux(rwd_op == M2SRwDOpcode.MEM_WR_PTL, msg.byte_enable,
                                Const(2 ** LINE_BYTES - 1, LINE_BYTES)))

        # ---------------- decode stage register
        st_valid = Signal()
        st_act = Signal(Action)
        st_tag = Signal(TAG_BITS)
        st_ld_id = Signal(LD_ID_BITS)
        st_mem = Signal(self.mem_req_layout)

        # Immediate answers (no media access) wait in a small FIFO for the response stage.
        imm_layout = data.StructLayout({"ndr": 1, "nxm": 1, "ndr_opcode": NDROpcode,
                                        "tag": TAG_BITS, "ld_id": LD_ID_BITS})
        m.submodules.imm_fifo = imm_fifo = fifo.SyncFIFOBuffered(
            width=imm_layout.size, depth=4)
        imm_in = Signal(imm_layout)
        m.d.comb += [imm_in.ndr.eq(st_act.ndr), imm_in.nxm.eq(st_act.nxm),
                     imm_in.ndr_opcode.eq(st_act.ndr_opcode), imm_in.tag.eq(st_tag),
                     imm_in.ld_id.eq(st_ld_id), imm_fifo.w_data.eq(imm_in)]

        needs_imm = st_act.ndr | st_act.nxm
        st_tag_is_wr = Signal()
        m.d.comb += [
            self.mem_req.payload.eq(st_mem),
            self.mem_req.valid.eq(st_valid & st_act.mem),
            imm_fifo.w_en.eq(st_valid & needs_imm),
            self.fwd.payload.cqid.eq(st_tag), self.fwd.payload.write.eq(st_tag_is_wr),
            self.fwd.valid.eq(st_valid & st_act.fwd),
        ]
        st_done = Signal()
        m.d.comb += st_done.eq(~st_valid |
                               (st_act.mem & self.mem_req.ready) |
                               (needs_imm & imm_fifo.w_rdy) |
                               (st_act.fwd & self.fwd.ready) |
                               (~st_act.mem & ~needs_imm & ~st_act.fwd))
        m.d.comb += in_fifo.r_en.eq(st_done)
        with m.If(st_done):
            m.d.sync += st_valid.eq(in_fifo.r_rdy)
        take = in_fifo.r_rdy & st_done
        with m.If(take):
            ctx = Signal(CTX)
            m.d.comb += [ctx.tag.eq(msg.tag), ctx.ld_id.eq(msg.ld_id),
                         ctx.ndr_opcode.eq(act.ndr_opcode)]
            m.d.sync += [
                st_act.eq(act), st_tag.eq(msg.tag), st_ld_id.eq(msg.ld_id),
                st_tag_is_wr.eq(req_op == M2SReqOpcode.MEM_WR_FWD),
                st_mem.write.eq(act.write),
                st_mem.addr.eq(offset[:self.addr_bits]),
                st_mem.strb.eq(strb),
                st_mem.poison.eq(msg.poison & inc.is_rwd),
                st_mem.data.eq(msg.data),
                st_mem.ctx.eq(ctx),
            ]
        # Bias: a host access (read, write, invalidate) inside the window to a device-bias
        # page flips the page to host bias. Read stage (the cycle after the decode): the
        # page's bit, read with the registered page; write stage (the next cycle): the flip.
        # Registers between the decode, the read and the write keep the decode (address
        # offset, window compare, ``take``) off the bias table, and the table's read off its
        # own write port (17 LUT levels each way before). The write stage's flip lands at the
        # end of its cycle, so a read of the same page in that cycle takes it as done.
        host_access = in_window & (act.mem | (~inc.is_rwd & ((req_op == M2SReqOpcode.MEM_INV) |
                                                             (req_op == M2SReqOpcode.MEM_INV_NT))))
        bias_req_q = Signal()
        bias_page_q = Signal.like(self.bias_page)
        m.d.sync += [bias_req_q.eq(take & host_access),
                     bias_page_q.eq(offset[self.bias_page_bits:self.addr_bits])]
        flip_q = Signal()
        flip_page_q = Signal.like(self.bias_page)
        flip_pending = flip_q & (flip_page_q == bias_page_q)        # the bypass
        m.d.sync += [flip_q.eq(bias_req_q & self.bias_device & ~flip_pending), flip_page_q.eq(bias_page_q)]
        m.d.comb += [self.bias_page.eq(bias_page_q), self.bias_to_host.eq(flip_q),
                     self.bias_flip_page.eq(flip_page_q)]
        # Decode events are counted when a message is decoded (each message exactly once).
        dec_ev_q = Signal.like(dec_events)
        m.d.sync += dec_ev_q.eq(Mux(take, dec_events.as_value(), 0))

        # ---------------- response stage: media reads, media writes, immediate answers
        m.submodules.ndr_fifo = ndr_fifo = fifo.SyncFIFOBuffered(
            width=S2MNDR.as_shape().size, depth=self.output_depth)
        m.submodules.drs_fifo = drs_fifo = fifo.SyncFIFOBuffered(
            width=S2MDRS.as_shape().size, depth=self.output_depth)
        for port, f in ((self.s2m_ndr, ndr_fifo), (self.s2m_drs, drs_fifo)):
            m.d.comb += [port.payload.eq(f.r_data), port.valid.eq(f.r_rdy), f.r_en.eq(port.ready)]

        rd = self.mem_rd_rsp.payload
        rd_ctx = CTX(rd.ctx)
        wr_ctx = CTX(self.mem_wr_rsp.payload.ctx)
        imm = imm_layout(imm_fifo.r_data)

        rd_ok = self.mem_rd_rsp.valid & ndr_fifo.w_rdy & drs_fifo.w_rdy
        wr_ok = self.mem_wr_rsp.valid & ndr_fifo.w_rdy
        imm_ok = imm_fifo.r_rdy & (~imm.ndr | ndr_fifo.w_rdy) & (~imm.nxm | drs_fifo.w_rdy)

        # Round-robin among the three sources that can go this cycle.
        last = Signal(range(3))
        grant = Signal(range(4), init=3)        # 3 = none
        oks = [rd_ok, wr_ok, imm_ok]
        for offset_ in reversed(range(1, 4)):
            for k in range(3):
                with m.If((last == (k - offset_) % 3) & oks[k]):
                    m.d.comb += grant.eq(k)
        with m.If(grant != 3):
            m.d.sync += last.eq(grant)

        # The fields that depend on the granted source; the NDR and DRS of one source share
        # its Tag and LD-ID.
        rsp_tag = Signal(TAG_BITS)
        rsp_ld_id = Signal(LD_ID_BITS)
        ndr_opcode = Signal(NDROpcode)
        drs_opcode = Signal(DRSOpcode)
        drs_poison = Signal()
        drs_data = Signal(LINE_BITS)
        rsp_events = Signal(data.StructLayout({e: 1 for e in RESPONSE_EVENTS}))
        with m.Switch(grant):
            with m.Case(0):
                poisoned = rd.poison | rd.error
                m.d.comb += [
                    self.mem_rd_rsp.ready.eq(1),
                    rsp_tag.eq(rd_ctx.tag), rsp_ld_id.eq(rd_ctx.ld_id),
                    ndr_opcode.eq(rd_ctx.ndr_opcode),
                    drs_opcode.eq(DRSOpcode.MEM_DATA), drs_poison.eq(poisoned), drs_data.eq(rd.data),
                    ndr_fifo.w_en.eq(1), drs_fifo.w_en.eq(1),
                    rsp_events.poison_rd.eq(poisoned), rsp_events.media_error.eq(rd.error),
                ]
            with m.Case(1):
                m.d.comb += [
                    self.mem_wr_rsp.ready.eq(1),
                    rsp_tag.eq(wr_ctx.tag), rsp_ld_id.eq(wr_ctx.ld_id),
                    ndr_opcode.eq(NDROpcode.CMP),
                    ndr_fifo.w_en.eq(1),
                    rsp_events.media_error.eq(self.mem_wr_rsp.payload.error),
                ]
            with m.Case(2):
                m.d.comb += [
                    imm_fifo.r_en.eq(1),
                    rsp_tag.eq(imm.tag), rsp_ld_id.eq(imm.ld_id),
                    ndr_opcode.eq(imm.ndr_opcode),
                    drs_opcode.eq(DRSOpcode.MEM_DATA_NXM), drs_data.eq(Const(2 ** LINE_BITS - 1, LINE_BITS)),
                    ndr_fifo.w_en.eq(imm.ndr), drs_fifo.w_en.eq(imm.nxm),
                ]
        # The S2M headers: every field assigned here, unconditionally, so the constant ones
        # are real drivers (see the module docstring, ALWNEVER). MetaField No-Op: no Meta0
        # state is kept; MetaValue is then meaningless and sent as 0.
        ndr = Signal(S2MNDR)
        drs = Signal(S2MDRS)
        m.d.comb += [
            ndr.opcode.eq(ndr_opcode), ndr.meta_field.eq(MetaField.NO_OP),
            ndr.meta_value.eq(MetaValue.INVALID), ndr.tag.eq(rsp_tag), ndr.ld_id.eq(rsp_ld_id),
            ndr.dev_load.eq(DevLoad.LIGHT),
            drs.opcode.eq(drs_opcode), drs.meta_field.eq(MetaField.NO_OP),
            drs.meta_value.eq(MetaValue.INVALID), drs.tag.eq(rsp_tag), drs.ld_id.eq(rsp_ld_id),
            drs.dev_load.eq(DevLoad.LIGHT), drs.poison.eq(drs_poison), drs.trp.eq(0),
            drs.data.eq(drs_data),
            ndr_fifo.w_data.eq(ndr), drs_fifo.w_data.eq(drs),
        ]
        rsp_ev_q = Signal.like(rsp_events)
        m.d.sync += rsp_ev_q.eq(rsp_events)
        # Each event comes from the one stage that raises it (one unconditional assignment
        # per field: the port has no constant-only bits).
        m.d.comb += [getattr(ev, e).eq(getattr(dec_ev_q, e)) for e in DECODE_EVENTS]
        m.d.comb += [getattr(ev, e).eq(getattr(rsp_ev_q, e)) for e in RESPONSE_EVENTS]
        m.d.comb += ev.bias_to_host.eq(self.bias_to_host)
        return m
