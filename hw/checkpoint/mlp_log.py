"""MlpLogEngine: executes MLP_LOG commands (copy the GPU's MLP parameter image into PMEM).

Ports
- ``ctl``: In(engine_control_signature()) (hw/ndp/command.py). Table ports unused
  (``table_index`` = 0). ``error_info`` is ``AddressFault.MLP_REGION`` for ADDRESS, else 0.
- ``mem``: Out(client_port_signature(addr_bits, 1)): media writes only (``ctx`` = 0).
- ``cache``: Out(cache_port_signature()): CXL.cache READ_CURRENT (RdCurr) requests, ids
  ``id_base .. id_base+max_outstanding-1`` (inside the NDP engines' range 0x40-0x7F).
- ``region``: In(LogRegion) from the CKPT_* CSRs (stable while a command runs).

Layout (hw/checkpoint/log_format.py): MLP slot s at ``mlp_slot_base = mlp_base +
s*(1+mlp_lines)``; line 0 is its record, line 1+i the image line i read from host line
``mlp_host_addr + i``. s = ``cmd.flags.mlp_slot``.

A command copies one chunk, image lines [mlp_offset, mlp_offset+mlp_count):
1. Checks: ``mlp_lines != 0``, ``mlp_lines < 2**26`` (the byte count fits the record's 32-bit
   ``count``) and ``mlp_base + 2*(1+mlp_lines) <= capacity_lines``, else ADDRESS /
   MLP_REGION. ``mlp_count != 0`` and ``mlp_offset + mlp_count <= mlp_lines``, else
   MLP_SIZE. A chunk with ``mlp_offset != 0`` must continue the running copy
   (``mlp_offset == next_offset`` and s == ``copy_slot``), else MLP_SIZE. A chunk failing a
   check writes nothing and leaves the running copy as it was.
2. ``mlp_offset == 0`` starts a copy: a FREE record (slot s, ``cmd.batch``) goes to slot line
   0 and is acknowledged (durable) before any image line is requested, so a torn copy can
   never be taken for a complete one. Then ``copy_batch = cmd.batch``, ``byte_counter = 0``,
   ``copy_slot = s``.
3. Up to ``max_outstanding`` RdCurr reads are in flight; responses may come back in any
   order (a table maps each id to its image line). Each line is written to its log line
   through a one-line buffer; every acknowledged write adds 64 to ``byte_counter``.
4. The image's last chunk (``mlp_offset + mlp_count == mlp_lines``): after all its writes
   are acknowledged, ``byte_counter == mlp_lines*64`` is checked (else MLP_SIZE). Then the
   record {LOG_MAGIC, MLP_LOGGED, slot s, ``copy_batch``, count = ``byte_counter``, lines =
   ``mlp_lines``, crc} goes to slot line 0 and is acknowledged, and only then the other
   slot is released with a FREE record (slot 1-s, ``copy_batch``), acknowledged; done OK.
   So at every instant at least one complete image exists once the first copy finished.
Errors: a CXL.cache response with ``error`` -> CACHE; a write answered with ``error`` ->
MEDIA. The engine then stops requesting, waits for every read and write in flight (ids are
free again at ``done``) and abandons the running copy (``next_offset`` = 0: the host
restarts from offset 0). The registers ``copy_batch``, ``byte_counter``, ``next_offset``
and ``copy_slot`` persist across commands; reset (power failure) loses them, after which
only an offset-0 chunk is accepted.
Stats: ``lines_read`` = CXL.cache reads issued, ``lines_written`` = media lines written
(records included); the others are 0.
Throughput: one line per cycle when ``max_outstanding`` covers the CXL.cache latency and
the memory accepts a write per cycle; a few cycles per record (plus the write latency).
"""
from amaranth import Module, Signal, Const, Mux, Cat, Value
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out

from ..common.cxl_mem import LINE_BITS, LINE_BYTES, LINE_ADDR_BITS
from ..cxl_controller.cache_port import CacheOp, CacheReq, ENGINE_ID_BASE, BIAS_ENGINE_ID, cache_port_signature
from ..mem.arbiter import client_port_signature
from ..mem.port import mem_request_layout
from ..ndp.command import AddressFault, NdpError, engine_control_signature
from .crc import crc32_single_line
from .log_format import LOG_MAGIC, LogRecord, LogRegion, LogState, record_crc_offset

MAX_MLP_LINES = 1 << 26          # mlp_lines * 64 must fit LogRecord.count (32 bits)


def _pack(layout, **values) -> Value:
    """A whole struct value in one expression (fields not given are 0). Driving a struct
    signal with one assignment keeps constant fields out of comb blocks that read nothing
    (Verilator ALWNEVER)."""
    parts, offset = [], 0
    for name, field in sorted(layout, key=lambda nf: nf[1].offset):
        assert field.offset == offset, "a contiguous layout"
        v = values.get(name, 0)
        v = Const(v, field.width) if isinstance(v, int) else Value.cast(v)
        parts.append(v[:field.width] if len(v) >= field.width else Cat(v, Const(0, field.width - len(v))))
        offset += field.width
    return Cat(*parts)


class MlpLogEngine(wiring.Component):
    def __init__(self, *, addr_bits: int, capacity_lines: int, id_base: int = 0x60, max_outstanding: int = 16):
        assert max_outstanding >= 1
        assert ENGINE_ID_BASE <= id_base and id_base + max_outstanding <= BIAS_ENGINE_ID, \
            "ids must stay in the NDP engines' range 0x40-0x7F"
        self.addr_bits = addr_bits
        self.capacity_lines = capacity_lines
        self.id_base = id_base
        self.max_outstanding = max_outstanding
        self.ctx_bits = 1
        super().__init__({
            "ctl": In(engine_control_signature()),
            "mem": Out(client_port_signature(addr_bits, self.ctx_bits)),
            "cache": Out(cache_port_signature()),
            "region": In(LogRegion),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.max_outstanding
        ib = max((n - 1).bit_length(), 1)
        ctl, reg = self.ctl, self.region
        cmd = ctl.cmd
        s = cmd.flags.mlp_slot

        # ---- registers that persist across commands (lost at reset) -------------------
        copy_batch = Signal(32)
        byte_counter = Signal(40)
        next_offset = Signal(32)
        copy_slot = Signal()

        # ---- per-command state ---------------------------------------------------------
        err = Signal(NdpError)
        err_info = Signal(32)
        slot_base = Signal(48)
        other_base = Signal(48)
        last_chunk = Signal()
        issued = Signal(32)                # image lines of this chunk requested
        pend = Signal(n)                   # ids with a read in flight
        wr_out = Signal(33)                # writes not yet acknowledged (not bounded by n)
        wbuf_valid = Signal()
        wbuf_addr = Signal(48)
        wbuf_data = Signal(LINE_BITS)
        n_read = Signal(32)
        n_written = Signal(32)

        # id -> image line of the read in flight
        m.submodules.lines = lines_mem = memory.Memory(shape=32, depth=n, init=[])
        l_w = lines_mem.write_port()
        l_r = lines_mem.read_port(domain="comb")

        # ---- the record line (one builder for FREE / MLP_LOGGED / release) --------------
        rec_state = Signal(LogState)
        rec_slot = Signal()
        rec_batch = Signal(32)
        rec_count = Signal(32)
        rec_lines = Signal(32)
        rec_base = Signal(LINE_BITS)       # the record with crc 0
        rec_line = Signal(LINE_BITS)
        m.d.comb += [
            rec_base.eq(_pack(LogRecord.as_shape(), magic=LOG_MAGIC, state=rec_state, slot=rec_slot,
                              batch=rec_batch, count=rec_count, lines=rec_lines)),
            rec_line.eq(rec_base | (crc32_single_line(rec_base) << record_crc_offset())),
        ]

        # ---- memory port ---------------------------------------------------------------
        wrsp = self.mem.wr_rsp
        req = self.mem.req
        req_addr = Signal(48)
        req_data = Signal(LINE_BITS)
        m.d.comb += [
            # One assignment of the whole payload (see _pack); the strobe is not a bare constant.
            req.payload.eq(_pack(mem_request_layout(self.addr_bits, self.ctx_bits),
                                 write=req.valid, addr=req_addr, data=req_data,
                                 strb=Mux(req.valid, Const((1 << LINE_BYTES) - 1, LINE_BYTES), 0))),
            wrsp.ready.eq(1),
            self.mem.rd_rsp.ready.eq(1),
            ctl.table_index.eq(0),
        ]
        write_done = Signal()
        m.d.comb += write_done.eq(req.valid & req.ready)

        # ---- CXL.cache reads -----------------------------------------------------------
        creq = self.cache.req
        crsp = self.cache.rsp
        free_idx = Signal(ib)
        has_free = Signal()
        for i in reversed(range(n)):
            with m.If(~pend[i]):
                m.d.comb += free_idx.eq(i)
        m.d.comb += has_free.eq(pend != (1 << n) - 1)
        image_line = Signal(32)
        m.d.comb += image_line.eq(cmd.mlp_offset + issued)
        copying = Signal()
        m.d.comb += [
            creq.valid.eq(copying & (issued != cmd.mlp_count) & has_free & (err == NdpError.OK)),
            creq.payload.eq(_pack(CacheReq.as_shape(), op=CacheOp.READ_CURRENT,
                                  addr=(reg.mlp_host_addr + image_line)[:LINE_ADDR_BITS],
                                  id=self.id_base + free_idx)),
        ]
        issue = Signal()
        m.d.comb += [issue.eq(creq.valid & creq.ready),
                     l_w.addr.eq(free_idx), l_w.data.eq(image_line), l_w.en.eq(issue)]

        rsp_idx = Signal(ib)
        take = Signal()
        m.d.comb += [
            rsp_idx.eq(crsp.payload.id - self.id_base),
            l_r.addr.eq(rsp_idx),
            # the write buffer takes a response when it is empty or drains this cycle
            crsp.ready.eq(~wbuf_valid | (copying & req.ready)),
            take.eq(crsp.valid & crsp.ready),
        ]
        set_mask = Signal(n)
        clr_mask = Signal(n)
        with m.If(issue):
            m.d.comb += set_mask.eq(Const(1, n) << free_idx)
            m.d.sync += [issued.eq(issued + 1), n_read.eq(n_read + 1)]
        with m.If(take):
            m.d.comb += clr_mask.eq(Const(1, n) << rsp_idx)
        m.d.sync += pend.eq((pend & ~clr_mask) | set_mask)

        with m.If(copying & write_done):
            m.d.sync += wbuf_valid.eq(0)
        with m.If(take):
            with m.If(crsp.payload.error):
                with m.If(err == NdpError.OK):
                    m.d.sync += err.eq(NdpError.CACHE)
            with m.Else():
                m.d.sync += [wbuf_valid.eq(1), wbuf_data.eq(crsp.payload.data),
                             wbuf_addr.eq(slot_base + 1 + l_r.data)]

        # write acknowledgements (image lines and records)
        with m.If(write_done):
            m.d.sync += n_written.eq(n_written + 1)
        m.d.sync += wr_out.eq(wr_out + write_done - wrsp.valid)
        with m.If(wrsp.valid):
            with m.If(wrsp.payload.error):
                with m.If(err == NdpError.OK):
                    m.d.sync += err.eq(NdpError.MEDIA)
            with m.Elif(copying):
                m.d.sync += byte_counter.eq(byte_counter + LINE_BYTES)

        m.d.comb += [ctl.stats.lines_read.eq(n_read), ctl.stats.lines_written.eq(n_written)]

        # ---- checks --------------------------------------------------------------------
        region_end = Signal(36)
        chunk_end = Signal(33)
        m.d.comb += [region_end.eq(reg.mlp_base + ((reg.mlp_lines + 1) << 1)),
                     chunk_end.eq(cmd.mlp_offset + cmd.mlp_count)]
        bad_region = ((reg.mlp_lines == 0) | (reg.mlp_lines >= MAX_MLP_LINES) |
                      (region_end > self.capacity_lines))
        bad_chunk = (cmd.mlp_count == 0) | (chunk_end > reg.mlp_lines)
        bad_continue = (cmd.mlp_offset != 0) & ((cmd.mlp_offset != next_offset) | (s != copy_slot))

        def finish(code=None, info=0):
            if code is not None:
                m.d.sync += [err.eq(code), err_info.eq(info)]
            m.next = "DONE"

        with m.FSM() as fsm:
            with m.State("IDLE"):
                with m.If(ctl.start):
                    m.d.sync += [err.eq(NdpError.OK), err_info.eq(0), issued.eq(0), n_read.eq(0),
                                 n_written.eq(0)]
                    m.next = "CHECK"
            with m.State("CHECK"):
                m.d.sync += [
                    slot_base.eq(reg.mlp_base + Mux(s, reg.mlp_lines + 1, 0)),
                    other_base.eq(reg.mlp_base + Mux(s, 0, reg.mlp_lines + 1)),
                    last_chunk.eq(chunk_end == reg.mlp_lines),
                ]
                with m.If(bad_region):
                    finish(NdpError.ADDRESS, AddressFault.MLP_REGION)
                with m.Elif(bad_chunk | bad_continue):
                    finish(NdpError.MLP_SIZE)
                with m.Elif(cmd.mlp_offset == 0):
                    m.next = "FREE_WR"
                with m.Else():
                    m.next = "COPY"
            with m.State("FREE_WR"):          # invalidate the slot before overwriting it
                m.d.comb += [req.valid.eq(1), req_addr.eq(slot_base), req_data.eq(rec_line),
                             rec_state.eq(LogState.FREE), rec_slot.eq(s), rec_batch.eq(cmd.batch)]
                with m.If(req.ready):
                    m.next = "FREE_ACK"
            with m.State("FREE_ACK"):
                with m.If(wrsp.valid):
                    with m.If(wrsp.payload.error):
                        m.d.sync += next_offset.eq(0)
                        finish(NdpError.MEDIA)
                    with m.Else():
                        m.d.sync += [copy_batch.eq(cmd.batch), byte_counter.eq(0), copy_slot.eq(s)]
                        m.next = "COPY"
            with m.State("COPY"):
                m.d.comb += [copying.eq(1), req.valid.eq(wbuf_valid), req_addr.eq(wbuf_addr),
                             req_data.eq(wbuf_data)]
                quiet = (pend == 0) & ~wbuf_valid & (wr_out == 0)
                with m.If(quiet & ((issued == cmd.mlp_count) | (err != NdpError.OK))):
                    with m.If(err != NdpError.OK):
                        m.d.sync += next_offset.eq(0)
                        finish()
                    with m.Elif(~last_chunk):
                        m.d.sync += next_offset.eq(chunk_end)
                        finish()
                    with m.Elif(byte_counter != (reg.mlp_lines << 6)):
                        m.d.sync += next_offset.eq(0)
                        finish(NdpError.MLP_SIZE)
                    with m.Else():
                        m.d.sync += next_offset.eq(0)
                        m.next = "REC_WR"
            with m.State("REC_WR"):           # the image is durable: mark it complete
                m.d.comb += [req.valid.eq(1), req_addr.eq(slot_base), req_data.eq(rec_line),
                             rec_state.eq(LogState.MLP_LOGGED), rec_slot.eq(copy_slot), rec_batch.eq(copy_batch),
                             rec_count.eq(byte_counter), rec_lines.eq(reg.mlp_lines)]
                with m.If(req.ready):
                    m.next = "REC_ACK"
            with m.State("REC_ACK"):
                with m.If(wrsp.valid):
                    with m.If(wrsp.payload.error):
                        finish(NdpError.MEDIA)
                    with m.Else():
                        m.next = "REL_WR"
            with m.State("REL_WR"):           # then release the previous image
                m.d.comb += [req.valid.eq(1), req_addr.eq(other_base), req_data.eq(rec_line),
                             rec_state.eq(LogState.FREE), rec_slot.eq(~copy_slot), rec_batch.eq(copy_batch)]
                with m.If(req.ready):
                    m.next = "REL_ACK"
            with m.State("REL_ACK"):
                with m.If(wrsp.valid):
                    with m.If(wrsp.payload.error):
                        finish(NdpError.MEDIA)
                    with m.Else():
                        finish()
            with m.State("DONE"):
                m.d.comb += [ctl.done.eq(1), ctl.error.eq(err), ctl.error_info.eq(err_info)]
                m.next = "IDLE"
        m.d.comb += ctl.busy.eq(~fsm.ongoing("IDLE"))
        return m
