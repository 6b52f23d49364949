"""CXL.cache agent with device coherency (DCOH): a MESI device cache for host lines.

Ports
- ``d2h_req``, ``d2h_rsp``, ``d2h_data``: Out streams of D2HReq / D2HRsp / D2HData.
- ``h2d_req``, ``h2d_rsp``, ``h2d_data``: In streams of H2DReq / H2DRsp / H2DData.
- ``port``: the internal request port (hw/cxl_controller/cache_port.py): ``port.req`` In
  stream(CacheReq), ``port.rsp`` Out stream(CacheRsp).
- ``events``: one-cycle pulses for statistics counters.
- ``stray_info`` (StrayInfo), ``stray_capture``, ``stray_held``: the first illegal host
  message, for the CSR CACHE_STRAY_INFO (captured while ``stray_held`` is 0; the
  ``stray_capture`` pulse sets its VALID bit, which drives ``stray_held``).

Structure
- Device cache: ``cache_lines`` lines, direct mapped (slot = low address bits), MESI.
- Trackers: ``trackers`` CQIDs; one per D2H request in flight, holding the request's line,
  its flow, what has arrived (data, GO, pull) and a 64-byte buffer (write data, read data,
  or an evicted line). Reads, writes and pushes to different lines overlap freely.
- Front end (in order, one port request per cycle, two stages: the lookups of a request are
  registered before it is decided, see the code): a hit is served from the cache; a miss
  allocates a tracker and sends the D2H request. A fill whose slot holds another valid line
  first evicts it (DirtyEvict for M, CleanEvict for E: the line moves to an evict tracker
  and the slot frees at once; an S copy is dropped silently). PUSH / PUSH_INV / FLUSH drop the local copy first.
- Serialization: a request waits while any tracker holds its line (so at most one D2H
  request per line is in flight: reads are serialized per line, an evict is never
  repeated), and a fill waits while another fill holds its slot.
- H2D responses and data update the trackers; pulls queue for the data sender; every
  finished flow goes through one finisher (behind two register slices, two cycles) that fills
  the cache (in the granted state; GO-I/GO-Err lines are used once, not cached), answers
  the port and frees the CQID.
- ACQUIRE (host -> device bias for a line of the device's own memory): RdOwnNoData,
  finished by the host's MemRdFwd on CXL.mem (``fwd``, Tag = CQID); a Fwd matching no live
  ACQUIRE is counted (``unexpected_fwd``) and dropped.
- Snoops, one at a time, in two stages (the lookups of a snoop are registered before it is
  answered, a cycle after its handshake, see the code): a hit answers from the line's state (M: *FwdM + data, the data
  queued a cycle after the response; E/S: RspIHitSE / RspSHitSE; SnpCur: RspVHitV /
  RspVFwdV) and downgrades it; a line between its
  evict request and the host's pull answers from the evict tracker and marks the later
  pull data Bogus if the snoop changed its state; anything else answers RspIHitI. A snoop
  to a line whose GO has arrived but whose fill has not landed waits for the fill (a few
  cycles), so it never answers from a stale state.

Illegal host messages (issue 20): every tracker knows which H2D messages its flow takes and
whether it has had them (a few bits: valid, GO, data, pull). RdOwn/RdShared take one data and
one GO; RdCurr one data; RdOwnNoData, CLFlush and ACQUIRE one GO; ItoMWr one GO_WritePull or
GO_ERR_WritePull; WrInv one WritePull, then one GO; DirtyEvict one GO_WritePull or
GO_ERR_WritePull, CleanEvict one GO_WritePull or GO_WritePull_Drop. Any other H2D response or
data (a CQID with bits above the tracker count, a free CQID, a duplicate, a reserved or
unexpected opcode, a GO before WrInv's pull) is dropped before it touches a tracker, line or
buffer; the ``stray`` event counts it (ERR_CACHE_STRAY; a second stray in the same cycle is
counted in the next, up to ``STRAY_BACKLOG`` pending). A duplicate MemRdFwd (after the first
completed the ACQUIRE) counts as ``unexpected_fwd``. A snoop with a reserved opcode (0, 4-7)
is answered RspIHitI with no data and no state change (``snoop_rsvd``).

Assumptions: the host keeps its obligations (one snoop per line, no snoop between a read's
data and its GO, no GO while a snoop to the line is pending). The internal client keeps
accepting ``port.rsp``: a fill (and so a snoop waiting for it) waits for its response.
Latency: a hit answers ``HIT_LATENCY`` cycles after its request handshake (checked by the
test ``read_for_ownership_then_hits``); a miss adds the host's round trip. A snoop is
answered (D2H Rsp queued) at the earliest in the cycle after its handshake (its lookups are
registered in the handshake's cycle); a forwarded line follows the response a cycle later.

D2H requests never set NT (no non-temporal hint). The D2H request word is assembled with
unconditional per-field statements from signals that carry the conditional parts: a field
of a signal assigned under ``m.If`` that only a constant drives (NT) would come out as a
constant-only ``always @*``, which Verilator never runs (ALWNEVER; see
hw/cxl_controller/cxl_mem.py and tests/test_no_alwnever.py).
"""
from amaranth import Module, Signal, Array, Cat, Const, Mux
from amaranth.lib import stream, wiring, fifo, memory, data, enum
from amaranth.lib.wiring import In, Out

from ..common.cxl_cache import (D2HReq, D2HRsp, D2HData, H2DReq, H2DRsp, H2DData,
                                D2HReqOpcode as DReq, D2HRspOpcode as DRsp,
                                H2DReqOpcode as Snp, H2DRspOpcode as HRsp, GOState, QID_BITS)
from ..common.cxl_mem import LINE_ADDR_BITS, LINE_BITS
from ..common.onehot import one_hot_index, one_hot_select
from ..common.stream_util import RoundRobinArbiter, RegisterSlice
from ..common.ram import LvtRam
from .cache_port import CacheReq, CacheRsp, CacheOp, cache_port_signature
from .cxl_mem import FWD

# Cycles from a port request's handshake to its answer's handshake when it hits (an
# always-ready client): the front end's second stage (1), the hit FIFO (2) plus the response
# merge.
HIT_LATENCY = 3

CACHE_EVENTS = ("d2h_req", "snoop", "snoop_hit", "evict_dirty", "evict_clean", "bogus",
                "go_err", "hit", "miss", "unexpected_fwd", "stray", "snoop_rsvd")
# Uncounted stray messages the ``stray`` event can owe (it pulses once per cycle; H2D Rsp and
# Data can both bring a stray in one cycle): exact unless this many pile up.
STRAY_BACKLOG = 15


class StrayKind(enum.Enum, shape=2):
    """Which H2D channel an illegal message came on (CACHE_STRAY_INFO.KIND)."""
    RSP = 0
    DATA = 1
    SNOOP = 2


class StrayReason(enum.Enum, shape=2):
    """Why it was dropped (CACHE_STRAY_INFO.REASON)."""
    OUT_OF_RANGE = 0     # CQID bits above the tracker count set
    FREE = 1             # no D2H request outstanding on that CQID
    WRONG_PHASE = 2      # outstanding, but its flow does not take this message (now)
    RESERVED_SNOOP = 3   # reserved snoop opcode (answered RspIHitI)


StrayInfo = data.StructLayout({
    "qid": QID_BITS,        # CQID of an H2D Rsp / Data, UQID of a snoop
    "opcode": 4,            # H2D Rsp or snoop opcode; 0 for data
    "go_state": 4,          # RspData[3:0] of an H2D Rsp (the GO state)
    "kind": StrayKind,
    "reason": StrayReason,
})


class Mesi(enum.Enum, shape=2):
    I = 0  # noqa: E741
    S = 1
    E = 2
    M = 3


class Flow(enum.Enum, shape=4):
    """The D2H flow a tracker runs."""
    RD_SHARED = 0
    RD_OWN = 1
    RD_CURR = 2
    RD_OWN_NO_DATA = 3
    ITOM_WR = 4
    WR_INV = 5
    CL_FLUSH = 6
    EVICT = 7
    ACQUIRE = 8          # RdOwnNoData to device memory, completed by MemRdFwd


def snoop_next_state(opcode, state):
    """The MESI state a line held in ``state`` is left in by a snoop with ``opcode``
    (H2DReq): SnpInv invalidates, SnpData shares a line that is valid, SnpCur and the
    reserved opcodes change nothing."""
    return Mesi(Mux(opcode == Snp.SNP_INV, Mesi.I,
                    Mux((opcode == Snp.SNP_DATA) & (state != Mesi.I), Mesi.S, state)))


def _pow2(x):
    return x > 0 and x & (x - 1) == 0


class CxlCacheAgent(wiring.Component):
    def __init__(self, *, cache_lines=64, trackers=64):
        assert _pow2(cache_lines) and _pow2(trackers) and trackers <= 2 ** QID_BITS
        self.cache_lines = cache_lines
        self.trackers = trackers
        super().__init__({
            "d2h_req": Out(stream.Signature(D2HReq)),
            "d2h_rsp": Out(stream.Signature(D2HRsp)),
            "d2h_data": Out(stream.Signature(D2HData)),
            "h2d_req": In(stream.Signature(H2DReq)),
            "h2d_rsp": In(stream.Signature(H2DRsp)),
            "h2d_data": In(stream.Signature(H2DData)),
            "fwd": In(stream.Signature(FWD)),
            "port": In(cache_port_signature()),
            "events": Out(data.StructLayout({e: 1 for e in CACHE_EVENTS})),
            # First illegal host message (CSR CACHE_STRAY_INFO): captured while ~stray_held,
            # with a one-cycle stray_capture pulse that sets the CSR's VALID bit.
            "stray_info": Out(StrayInfo),
            "stray_capture": Out(1),
            "stray_held": In(1),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.trackers
        nb = (n - 1).bit_length()
        slots = self.cache_lines
        sb = (slots - 1).bit_length()
        tag_bits = LINE_ADDR_BITS - sb
        ev = self.events

        def slot_of(addr):
            return addr[:sb] if sb else Const(0, 1)

        def tag_of(addr):
            return addr[sb:]

        # ------------------------------------------------------------ device cache
        c_state = Array(Signal(Mesi, name=f"c_state{i}") for i in range(slots))
        m.submodules.c_tags = c_tags = memory.Memory(shape=tag_bits, depth=slots, init=[])
        c_tag_wr = c_tags.write_port()
        c_tag_fe = c_tags.read_port(domain="comb")          # the front end's F2 request
        c_tag_f1 = c_tags.read_port(domain="comb")          # ... and its F1 request
        c_tag_snp = c_tags.read_port(domain="comb")         # the snoop S2 holds
        c_tag_s1 = c_tags.read_port(domain="comb")          # ... and the port's (S1)
        m.submodules.c_data = c_data = memory.Memory(shape=LINE_BITS, depth=slots, init=[])
        c_wr = c_data.write_port()
        c_rd_fe = c_data.read_port(domain="comb")
        c_rd_snp = c_data.read_port(domain="comb")

        # ------------------------------------------------------------ trackers
        # Registers only for what the comparators scan every cycle (line, liveness, pending
        # fills, evicted lines); the rest lives in small memories, which simulate and
        # synthesize far cheaper than 64 separately decoded registers per field.
        t_valid = Array(Signal(name=f"t_valid{i}") for i in range(n))
        t_addr = Array(Signal(LINE_ADDR_BITS, name=f"t_addr{i}") for i in range(n))
        t_fill = Array(Signal(name=f"t_fill{i}") for i in range(n))        # holds its slot
        t_got_go = Array(Signal(name=f"t_got_go{i}") for i in range(n))
        t_evict = Array(Signal(name=f"t_evict{i}") for i in range(n))      # an evict flow
        t_evstate = Array(Signal(Mesi, name=f"t_evstate{i}") for i in range(n))  # evicts
        t_got_data = Array(Signal(name=f"t_got_data{i}") for i in range(n))

        def tmem(name, shape, writers, readers):
            mem_ = memory.Memory(shape=shape, depth=n, init=[])
            m.submodules[name] = mem_
            return ([mem_.write_port() for _ in range(writers)],
                    [mem_.read_port(domain="comb") for _ in range(readers)])
        # set at allocation; dirty: an EVICT flow sent DirtyEvict (else CleanEvict)
        static = data.StructLayout({"flow": Flow, "port": 1, "id": 8, "dirty": 1})
        (st_wr,), (st_r, st_d, st_p, st_f, st_w) = tmem("t_static", static, 1, 5)
        (pl_alloc, pl_set), (pl_r,) = tmem("t_pulled", 1, 2, 1)        # a pull arrived
        (sn_alloc, sn_set), (sn_r,) = tmem("t_sent", 1, 2, 1)         # pull data sent
        (go_alloc, go_set), (go_f,) = tmem("t_go", GOState, 2, 1)
        (er_alloc, er_rsp, er_dat), (er_f,) = tmem("t_err", 1, 3, 1)
        (bg_alloc, bg_set), (bg_p,) = tmem("t_bogus", 1, 2, 1)
        # Two writers (allocation, H2D data) and three asynchronous readers: two one-write LUT
        # RAMs (three read replicas each) and a live value table (hw/common/ram.py).
        m.submodules.t_data = t_data = LvtRam(shape=LINE_BITS, depth=n, name="t_data")
        t_wr_fe = t_data.write_port()
        t_wr_h2d = t_data.write_port()
        t_rd_pull = t_data.read_port(domain="comb")
        t_rd_fin = t_data.read_port(domain="comb")
        t_rd_snp = t_data.read_port(domain="comb")

        # Free CQIDs, filled after reset.
        m.submodules.free = free = fifo.SyncFIFO(width=nb or 1, depth=n)
        init_count = Signal(range(n + 1))
        initializing = Signal()
        m.d.comb += initializing.eq(init_count != n)
        with m.If(initializing):
            m.d.sync += init_count.eq(init_count + 1)

        # ------------------------------------------------------------ output queues
        m.submodules.req_q = req_q = fifo.SyncFIFOBuffered(width=D2HReq.as_shape().size, depth=4)
        m.submodules.rsp_q = rsp_q = fifo.SyncFIFOBuffered(width=D2HRsp.as_shape().size, depth=4)
        m.submodules.fwd_q = fwd_q = fifo.SyncFIFOBuffered(width=D2HData.as_shape().size, depth=4)
        for port, q in ((self.d2h_req, req_q), (self.d2h_rsp, rsp_q)):
            m.d.comb += [port.payload.eq(q.r_data), port.valid.eq(q.r_rdy), q.r_en.eq(port.ready)]
        m.submodules.data_arb = data_arb = RoundRobinArbiter(D2HData, 2)
        fwd_in, pull_in = data_arb.inputs
        m.d.comb += [fwd_in.payload.eq(fwd_q.r_data), fwd_in.valid.eq(fwd_q.r_rdy),
                     fwd_q.r_en.eq(fwd_in.ready)]
        wiring.connect(m, data_arb.o, wiring.flipped(self.d2h_data))
        # Port responses: hits from the front end and finished flows, merged.
        m.submodules.hit_q = hit_q = fifo.SyncFIFOBuffered(width=CacheRsp.as_shape().size, depth=4)
        m.submodules.rsp_arb = rsp_arb = RoundRobinArbiter(CacheRsp, 2)
        hit_in, fin_in = rsp_arb.inputs
        m.d.comb += [hit_in.payload.eq(hit_q.r_data), hit_in.valid.eq(hit_q.r_rdy),
                     hit_q.r_en.eq(hit_in.ready)]
        wiring.connect(m, rsp_arb.o, wiring.flipped(self.port.rsp))

        # Finished flows (CQIDs) from the three places a flow can end, to the finisher.
        comp_rsp = fifo.SyncFIFO(width=nb or 1, depth=n)
        comp_data = fifo.SyncFIFO(width=nb or 1, depth=n)
        comp_pull = fifo.SyncFIFO(width=nb or 1, depth=n)
        comp_fwd = fifo.SyncFIFO(width=nb or 1, depth=n)
        m.submodules += [comp_rsp, comp_data, comp_pull, comp_fwd]
        m.submodules.comp_arb = comp_arb = RoundRobinArbiter(nb or 1, 4)
        for q, a in zip((comp_rsp, comp_data, comp_pull, comp_fwd), comp_arb.inputs, strict=True):
            m.d.comb += [a.payload.eq(q.r_data), a.valid.eq(q.r_rdy), q.r_en.eq(a.ready)]
        # Pulls waiting for the data sender: (CQID, host UQID).
        pull_layout = data.StructLayout({"cqid": nb or 1, "uqid": QID_BITS})
        m.submodules.pull_q = pull_q = fifo.SyncFIFO(width=pull_layout.size, depth=n)

        # ------------------------------------------------------------ H2D responses
        def in_range(qid):         # no CQID bit above the tracker count: never aliased
            return qid[nb:] == 0 if nb < QID_BITS else Const(1, 1)

        rsp = self.h2d_rsp.payload
        r_c = Signal(nb or 1)
        m.d.comb += [r_c.eq(rsp.cqid[:nb or 1]), self.h2d_rsp.ready.eq(1)]
        r_fire = self.h2d_rsp.valid
        m.d.comb += st_r.addr.eq(r_c)
        r_flow = static(st_r.data).flow
        dat = self.h2d_data.payload
        d_c = Signal(nb or 1)
        m.d.comb += [d_c.eq(dat.cqid[:nb or 1]), self.h2d_data.ready.eq(1)]
        d_fire = self.h2d_data.valid
        m.d.comb += st_d.addr.eq(d_c)
        d_flow = static(st_d.data).flow
        # Which H2D messages a tracker takes now (its flow and phase); anything else is a
        # stray: dropped, counted and captured (below), with no effect on any tracker.
        r_live = Signal()
        r_takes = Signal()
        r_ok = Signal()
        r_go_open = ~t_got_go[r_c]
        def op_is(*codes):
            return rsp.opcode.as_value().matches(*(c.value for c in codes))
        m.d.comb += r_live.eq(in_range(rsp.cqid) & t_valid[r_c])
        with m.Switch(r_flow):
            with m.Case(Flow.RD_SHARED, Flow.RD_OWN, Flow.RD_OWN_NO_DATA, Flow.CL_FLUSH, Flow.ACQUIRE):
                m.d.comb += r_takes.eq(op_is(HRsp.GO) & r_go_open)
            with m.Case(Flow.WR_INV):          # WritePull, then GO
                m.d.comb += r_takes.eq((op_is(HRsp.WRITE_PULL) & ~pl_r.data) |
                                       (op_is(HRsp.GO) & pl_r.data & r_go_open))
            with m.Case(Flow.ITOM_WR):
                m.d.comb += r_takes.eq(op_is(HRsp.GO_WRITE_PULL, HRsp.GO_ERR_WRITE_PULL) & r_go_open)
            with m.Case(Flow.EVICT):           # DirtyEvict: GO_(ERR_)WritePull; CleanEvict: _Drop too
                m.d.comb += r_takes.eq(r_go_open & (
                    op_is(HRsp.GO_WRITE_PULL) |
                    Mux(static(st_r.data).dirty, op_is(HRsp.GO_ERR_WRITE_PULL),
                        op_is(HRsp.GO_WRITE_PULL_DROP))))
        m.d.comb += r_ok.eq(r_fire & r_live & r_takes)
        d_live = Signal()
        d_ok = Signal()
        m.d.comb += [
            d_live.eq(in_range(dat.cqid) & t_valid[d_c]),
            d_ok.eq(d_fire & d_live & ~t_got_data[d_c] &
                    ((d_flow == Flow.RD_SHARED) | (d_flow == Flow.RD_OWN) | (d_flow == Flow.RD_CURR))),
        ]
        # The pull sender (below) sends data for tracker p_c this cycle.
        p_fire = Signal()
        p_c = Signal(nb or 1)

        r_is_go = Signal()
        r_is_pull = Signal()
        r_go_state = Signal(GOState)
        m.d.comb += r_go_state.eq(rsp.rsp_data[:4])
        with m.Switch(rsp.opcode):
            with m.Case(HRsp.GO):
                m.d.comb += r_is_go.eq(1)
            with m.Case(HRsp.GO_WRITE_PULL, HRsp.GO_ERR_WRITE_PULL):
                m.d.comb += [r_is_go.eq(1), r_is_pull.eq(1)]
            with m.Case(HRsp.WRITE_PULL):
                m.d.comb += r_is_pull.eq(1)
        r_drop = rsp.opcode == HRsp.GO_WRITE_PULL_DROP
        r_err = (rsp.opcode == HRsp.GO_ERR_WRITE_PULL) | \
            ((rsp.opcode == HRsp.GO) & (r_go_state == GOState.ERR))

        r_complete = Signal()
        m.d.comb += [
            sn_r.addr.eq(r_c), pl_r.addr.eq(r_c),
            go_set.addr.eq(r_c), go_set.data.eq(r_go_state),
            go_set.en.eq(r_ok & (rsp.opcode == HRsp.GO)),
            er_rsp.addr.eq(r_c), er_rsp.data.eq(1), er_rsp.en.eq(r_ok & r_err),
            pl_set.addr.eq(r_c), pl_set.data.eq(1), pl_set.en.eq(r_ok & r_is_pull),
        ]
        with m.If(r_ok):
            with m.If(r_is_go | r_drop):
                m.d.sync += t_got_go[r_c].eq(1)
            with m.If(r_err):
                m.d.comb += ev.go_err.eq(1)
            with m.If((r_is_go | r_drop) & (r_flow == Flow.EVICT)):
                # The device gives up snoop ownership of an evicted line at the GO.
                m.d.sync += t_evstate[r_c].eq(Mesi.I)
            data_here = t_got_data[r_c] | (d_ok & (d_c == r_c))
            sent_here = sn_r.data | (p_fire & (p_c == r_c))
            with m.Switch(r_flow):
                with m.Case(Flow.RD_SHARED, Flow.RD_OWN):
                    m.d.comb += r_complete.eq((rsp.opcode == HRsp.GO) & data_here)
                with m.Case(Flow.RD_OWN_NO_DATA, Flow.CL_FLUSH, Flow.ACQUIRE):
                    m.d.comb += r_complete.eq(rsp.opcode == HRsp.GO)
                with m.Case(Flow.WR_INV):
                    m.d.comb += r_complete.eq((rsp.opcode == HRsp.GO) & sent_here)
                with m.Case(Flow.EVICT):
                    m.d.comb += r_complete.eq(r_drop)
        m.d.comb += [
            comp_rsp.w_data.eq(r_c), comp_rsp.w_en.eq(r_ok & r_complete),
            pull_q.w_data.eq(Cat(r_c, rsp.rsp_data)), pull_q.w_en.eq(r_ok & r_is_pull),
        ]

        # ------------------------------------------------------------ H2D data
        d_complete = Signal()
        m.d.comb += [
            er_dat.addr.eq(d_c), er_dat.data.eq(1), er_dat.en.eq(d_ok & (dat.poison | dat.go_err)),
        ]
        with m.If(d_ok):
            m.d.sync += t_got_data[d_c].eq(1)
            # If the GO arrives in this same cycle, the response side finishes the flow.
            with m.Switch(d_flow):
                with m.Case(Flow.RD_CURR):
                    m.d.comb += d_complete.eq(1)
                with m.Case(Flow.RD_SHARED, Flow.RD_OWN):
                    m.d.comb += d_complete.eq(t_got_go[d_c])
        m.d.comb += [
            t_wr_h2d.addr.eq(d_c), t_wr_h2d.data.eq(dat.data), t_wr_h2d.en.eq(d_ok),
            comp_data.w_data.eq(d_c), comp_data.w_en.eq(d_ok & d_complete),
        ]

        # ------------------------------------------------------------ MemRdFwd / MemWrFwd
        # The host's answer, on CXL.mem, to an ACQUIRE of a device-memory line (Tag = CQID).
        fw = self.fwd.payload
        fw_c = Signal(nb or 1)
        m.d.comb += [fw_c.eq(fw.cqid[:nb or 1]), self.fwd.ready.eq(1), st_w.addr.eq(fw_c)]
        fw_ok = (t_valid[fw_c] & ~t_got_go[fw_c] & (static(st_w.data).flow == Flow.ACQUIRE) & ~fw.write &
                 (fw.cqid[nb:] == 0 if nb < len(fw.cqid) else 1))
        m.d.comb += [comp_fwd.w_data.eq(fw_c), comp_fwd.w_en.eq(self.fwd.valid & fw_ok),
                     ev.unexpected_fwd.eq(self.fwd.valid & ~fw_ok)]
        with m.If(self.fwd.valid & fw_ok):
            m.d.sync += t_got_go[fw_c].eq(1)

        # ------------------------------------------------------------ pull data sender
        pull = pull_layout(pull_q.r_data)
        m.d.comb += [
            p_c.eq(pull.cqid),
            t_rd_pull.addr.eq(p_c),
            pull_in.valid.eq(pull_q.r_rdy),
            pull_in.payload.uqid.eq(pull.uqid),
            pull_in.payload.chunk_valid.eq(1),
            pull_in.payload.bogus.eq(bg_p.data),
            bg_p.addr.eq(p_c), st_p.addr.eq(p_c),
            pull_in.payload.data.eq(t_rd_pull.data),
            pull_q.r_en.eq(pull_in.ready),
            p_fire.eq(pull_in.valid & pull_in.ready),
        ]
        p_flow = static(st_p.data).flow
        p_complete = Signal()
        m.d.comb += [sn_set.addr.eq(p_c), sn_set.data.eq(1), sn_set.en.eq(p_fire)]
        with m.If(p_fire):
            m.d.comb += ev.bogus.eq(bg_p.data)
            with m.Switch(p_flow):
                with m.Case(Flow.ITOM_WR, Flow.EVICT):
                    m.d.comb += p_complete.eq(1)
                with m.Case(Flow.WR_INV):
                    # A GO arriving in this cycle completes it on the response side.
                    m.d.comb += p_complete.eq(t_got_go[p_c])
        m.d.comb += [comp_pull.w_data.eq(p_c), comp_pull.w_en.eq(p_fire & p_complete)]

        # ------------------------------------------------------------ finisher
        # A register slice between the completion arbiter and the finisher carries the
        # finished CQID and what the finisher decides from its tracker (read at the
        # arbiter's output: a finished tracker's static part, GO and error no longer change),
        # so the finisher's cache write and the front end's block start at flip-flops
        # instead of behind the four FIFOs' round robin and three tracker reads. A finished
        # tracker stays valid one cycle longer, which only holds the front end and a snoop
        # to its line back (they wait while a tracker holds the line).
        fin_rec = data.StructLayout({"cqid": nb or 1, "id": 8, "answers": 1, "fills": 1, "error": 1,
                                     "with_data": 1, "state": Mesi})
        # A second slice in front of the tracker reads: the four FIFOs' read and the round
        # robin end at a flip-flop, so the reads and the finisher's decisions start at one
        # (14 LUT levels through both in the eighth round's device run). Finishing a flow
        # one cycle later costs no throughput: 64 trackers cover it.
        m.submodules.comp_slice = comp_slice = RegisterSlice(nb or 1)
        wiring.connect(m, comp_arb.o, comp_slice.i)
        done_q = comp_slice.o
        a_c = done_q.payload
        m.d.comb += [st_f.addr.eq(a_c), go_f.addr.eq(a_c), er_f.addr.eq(a_c)]
        a_static = static(st_f.data)
        a_flow = a_static.flow
        a_err = er_f.data
        a_granted = Signal(Mesi)
        with m.Switch(go_f.data):
            with m.Case(GOState.S):
                m.d.comb += a_granted.eq(Mesi.S)
            with m.Case(GOState.E):
                m.d.comb += a_granted.eq(Mesi.E)
            with m.Case(GOState.M):
                m.d.comb += a_granted.eq(Mesi.M)
        a_rec = Signal(fin_rec)

        def a_flow_in(*flows):
            return a_flow.as_value().matches(*(f.value for f in flows))
        m.d.comb += [
            a_rec.cqid.eq(a_c), a_rec.id.eq(a_static.id), a_rec.answers.eq(a_static.port),
            # The line goes into the cache (RdOwnNoData's line becomes M: the device writes it).
            a_rec.fills.eq(a_flow_in(Flow.RD_SHARED, Flow.RD_OWN, Flow.RD_OWN_NO_DATA)
                           & (a_granted != Mesi.I) & ~a_err),
            a_rec.state.eq(Mux(a_flow == Flow.RD_OWN_NO_DATA, Mesi.M, a_granted)),
            a_rec.error.eq(a_err | ((a_flow == Flow.RD_OWN_NO_DATA) & (a_granted == Mesi.I))),
            a_rec.with_data.eq(a_flow_in(Flow.RD_SHARED, Flow.RD_OWN, Flow.RD_CURR)),
        ]
        m.submodules.fin_slice = fin_slice = RegisterSlice(fin_rec)
        m.d.comb += [fin_slice.i.valid.eq(done_q.valid), fin_slice.i.payload.eq(a_rec),
                     done_q.ready.eq(fin_slice.i.ready)]
        fin = fin_slice.o
        f = fin.payload
        f_c = f.cqid
        m.d.comb += t_rd_fin.addr.eq(f_c)
        f_addr = t_addr[f_c]
        m.d.comb += [
            fin_in.payload.id.eq(f.id),
            fin_in.payload.error.eq(f.error),
            fin_in.payload.data.eq(Mux(f.with_data, t_rd_fin.data, 0)),
            fin_in.valid.eq(fin.valid & f.answers),
            fin.ready.eq(~f.answers | fin_in.ready),
        ]
        f_fire = fin.valid & fin.ready
        f_cache_write = Signal()
        m.d.comb += f_cache_write.eq(f_fire & f.fills)
        with m.If(f_fire):
            m.d.sync += t_valid[f_c].eq(0)
        m.d.comb += [c_tag_wr.addr.eq(slot_of(f_addr)), c_tag_wr.data.eq(tag_of(f_addr)),
                     c_tag_wr.en.eq(f_cache_write)]
        with m.If(f_cache_write):
            m.d.sync += c_state[slot_of(f_addr)].eq(f.state)

        # Free list: reset fill, then CQIDs as the finisher frees them.
        with m.If(initializing):
            m.d.comb += [free.w_data.eq(init_count), free.w_en.eq(1)]
        with m.Else():
            m.d.comb += [free.w_data.eq(f_c), free.w_en.eq(f_fire)]

        # ------------------------------------------------------------ snoops
        # Two stages, like the front end. S1 is the port's snoop; S2 holds the accepted snoop
        # and answers it. Every cycle the snoop's lookups (the cache's tag and state; the 64
        # trackers' evict match; a fill whose GO has arrived) are computed for both S1's and
        # S2's snoop and registered, and S2 decides from the registered set of the snoop it
        # holds: the compares and the answer in one cycle were the agent's deepest paths (15
        # LUT levels: a tracker's address -> the 64-way compare -> the snoop's go -> the
        # response queue, the events and the port's ready). What can change in that cycle:
        # - a cache slot written (the finisher's fill, S2's own new state, the front end's hit
        #   write, eviction or drop; also the one way an evict tracker appears, since an
        #   evicted line leaves its slot in the cycle its tracker is allocated): a snoop to
        #   that slot waits a cycle, and the next cycle's lookup is fresh;
        # - a tracker freed: the registered match is ANDed with the live ``t_valid``;
        # - an evicted line's state (a GO, or S2's own snoop): read live, one-hot selected;
        # - a fill's GO arriving: the wait is computed with the GO of the cycle (``go_now``,
        #   the GO comes first), and a GO after the snoop's handshake, while it is pending,
        #   is excluded by the host's obligations (see Assumptions).
        snp_in = self.h2d_req.payload
        s2_valid = Signal(name="snp2_valid")
        snp = Signal(H2DReq, name="snp2_req")
        s_go = Signal()
        s2_free = Signal()
        s_moved = Signal(name="snp2_moved")
        m.d.comb += [s2_free.eq(~s2_valid | s_go), self.h2d_req.ready.eq(s2_free)]
        with m.If(s2_free):
            m.d.sync += [s2_valid.eq(self.h2d_req.valid), snp.eq(snp_in)]
        m.d.sync += s_moved.eq(s2_free)

        snoop_lookup = data.StructLayout({"hit": 1, "state": Mesi, "wait": 1, "ev": n})
        slk1, slk2 = Signal(snoop_lookup, name="snp1_lookup"), Signal(snoop_lookup, name="snp2_lookup")
        for stage, addr, tag_rd, lk_s in ((1, snp_in.addr, c_tag_s1, slk1), (2, snp.addr, c_tag_snp, slk2)):
            state = Signal(Mesi, name=f"snp{stage}_state")
            m.d.comb += [tag_rd.addr.eq(slot_of(addr)), state.eq(c_state[slot_of(addr)])]
            # Wait for a fill whose GO has arrived (also in this very cycle: the GO comes first).
            go_now = r_ok & (r_is_go | r_drop) & t_fill[r_c] & (t_addr[r_c] == addr)
            m.d.sync += [
                lk_s.state.eq(state),
                lk_s.hit.eq((state != Mesi.I) & (tag_rd.data == tag_of(addr))),
                lk_s.wait.eq(go_now | Cat(t_valid[i] & t_fill[i] & t_got_go[i] & (t_addr[i] == addr)
                                          for i in range(n)).any()),
                lk_s.ev.eq(Cat(t_valid[i] & t_evict[i] & (t_addr[i] == addr) for i in range(n))),
            ]
        slk = Signal(snoop_lookup)
        m.d.comb += slk.eq(Mux(s_moved, slk1, slk2))

        s_slot = slot_of(snp.addr)
        s_state = Signal(Mesi)
        s_hit = Signal()
        m.d.comb += [s_hit.eq(slk.hit), s_state.eq(Mux(s_hit, slk.state, Mesi.I)), c_rd_snp.addr.eq(s_slot)]
        # An evicted line the host has not pulled yet is still ours to answer for.
        # At most one tracker matches: an eviction is allocated only for a line in the cache,
        # and while a line is cached no tracker holds its address (a fill's tracker is freed
        # in the cycle its line enters the cache; line_busy keeps a second tracker off a
        # tracked address; every other flow that finds the line cached takes it out). So the
        # match is one-hot, selected by OR trees rather than a 64-deep priority chain.
        s_ev = Signal(nb or 1)
        s_ev_hit = Signal()
        s_wait = Signal()
        s_slot_written = Signal()
        ev_match = Signal(n)
        m.d.comb += ev_match.eq(Cat(slk.ev[i] & t_valid[i] & (t_evstate[i] != Mesi.I) for i in range(n)))
        m.d.comb += [s_ev.eq(one_hot_index(ev_match)), s_ev_hit.eq(ev_match.any())]
        m.d.comb += s_wait.eq(slk.wait | s_slot_written)
        s_ev_state = Signal(Mesi)
        m.d.comb += s_ev_state.eq(one_hot_select(ev_match, [t_evstate[i] for i in range(n)]))
        held = Signal(Mesi)        # the state the snooped line is held in, wherever it is
        m.d.comb += held.eq(Mux(s_hit, s_state, Mux(s_ev_hit, s_ev_state, Mesi.I)))

        s_rsp = Signal(DRsp)
        s_fwd = Signal()
        s_rsvd = Signal()
        with m.Switch(snp.opcode):
            with m.Case(Snp.SNP_INV):
                with m.Switch(held):
                    with m.Case(Mesi.M):
                        m.d.comb += [s_rsp.eq(DRsp.RSP_I_FWD_M), s_fwd.eq(1)]
                    with m.Case(Mesi.E, Mesi.S):
                        m.d.comb += s_rsp.eq(DRsp.RSP_I_HIT_SE)
                    with m.Default():
                        m.d.comb += s_rsp.eq(DRsp.RSP_I_HIT_I)
            with m.Case(Snp.SNP_DATA):
                with m.Switch(held):
                    with m.Case(Mesi.M):
                        m.d.comb += [s_rsp.eq(DRsp.RSP_S_FWD_M), s_fwd.eq(1)]
                    with m.Case(Mesi.E, Mesi.S):
                        m.d.comb += s_rsp.eq(DRsp.RSP_S_HIT_SE)
                    with m.Default():
                        m.d.comb += s_rsp.eq(DRsp.RSP_I_HIT_I)
            with m.Case(Snp.SNP_CUR):  # current data, no change
                with m.Switch(held):
                    with m.Case(Mesi.M):
                        m.d.comb += [s_rsp.eq(DRsp.RSP_V_FWD_V), s_fwd.eq(1)]
                    with m.Case(Mesi.E, Mesi.S):
                        m.d.comb += s_rsp.eq(DRsp.RSP_V_HIT_V)
                    with m.Default():
                        m.d.comb += s_rsp.eq(DRsp.RSP_I_HIT_I)
            with m.Default():          # reserved opcodes: RspIHitI, no data, no change
                m.d.comb += [s_rsp.eq(DRsp.RSP_I_HIT_I), s_rsvd.eq(1)]

        # The forwarded line enters fwd_q one cycle after the snoop's handshake, read with
        # registers: reading the evicted line's buffer at the tracker match's one-hot index in
        # the handshake's cycle was a 16-LUT-level path (a tracker's address -> the 64-way
        # match -> the index -> the LUT RAM read -> fwd_q). The cache's line is registered at
        # the handshake; the tracker's buffer is read a cycle later, when it still holds the
        # line (only an allocation writes it, and a CQID freed at the handshake is allocated
        # again at the earliest in the next cycle, its write landing after that cycle's read).
        fwd_pend = Signal()                 # a forward to write into fwd_q this cycle
        fwd_from_cache = Signal()
        fwd_line = Signal(LINE_BITS)        # the cache's line, as read last cycle
        fwd_ev = Signal(nb or 1)
        fwd_uqid = Signal.like(snp.uqid)
        # Room for this snoop's forward and the one still to be written.
        fwd_room = Mux(fwd_pend, fwd_q.level < fwd_q.depth - 1, fwd_q.w_rdy)
        m.d.comb += s_go.eq(s2_valid & ~s_wait & rsp_q.w_rdy & fwd_room)
        m.d.sync += [fwd_pend.eq(s_go & s_fwd), fwd_from_cache.eq(s_hit), fwd_line.eq(c_rd_snp.data),
                     fwd_ev.eq(s_ev), fwd_uqid.eq(snp.uqid)]
        s_rsp_word = Signal(D2HRsp)
        s_fwd_word = Signal(D2HData)
        m.d.comb += [
            s_rsp_word.opcode.eq(s_rsp), s_rsp_word.uqid.eq(snp.uqid),
            rsp_q.w_data.eq(s_rsp_word), rsp_q.w_en.eq(s_go),
            t_rd_snp.addr.eq(fwd_ev),
            s_fwd_word.uqid.eq(fwd_uqid), s_fwd_word.chunk_valid.eq(1),
            s_fwd_word.data.eq(Mux(fwd_from_cache, fwd_line, t_rd_snp.data)),
            fwd_q.w_data.eq(s_fwd_word), fwd_q.w_en.eq(fwd_pend),
        ]
        with m.If(s_go):
            m.d.comb += [ev.snoop.eq(1), ev.snoop_hit.eq((held != Mesi.I) & ~s_rsvd),
                         ev.snoop_rsvd.eq(s_rsvd)]
            with m.If(s_hit):
                m.d.sync += c_state[s_slot].eq(snoop_next_state(snp.opcode, s_state))
        # The new states are computed from the state each holder holds (a hit's is the
        # cache's, an evicted line's its tracker's: the match is one-hot) rather than from
        # ``held``: the trackers' 64-way select then stays off the state registers' paths
        # (15 LUT levels, from the trackers' address compare through the select).
        ev_changes = Signal(n)
        for i in range(n):
            ev_next = snoop_next_state(snp.opcode, t_evstate[i])
            m.d.comb += ev_changes[i].eq(ev_match[i] & (ev_next != t_evstate[i]))
            with m.If(s_go & ~s_hit & ev_match[i]):
                m.d.sync += t_evstate[i].eq(ev_next)
        m.d.comb += [bg_set.addr.eq(s_ev), bg_set.data.eq(1),
                     bg_set.en.eq(s_go & ~s_hit & ev_changes.any())]

        # ------------------------------------------------------------ front end
        # Two stages. F1 is the port's next request; every cycle the line's lookups (the cache's
        # tag and state, the 64 trackers' line and slot compares) are computed for both F1's
        # and F2's request and registered, and F2 decides from the registered set of the
        # request it holds: the compares and the decision in one cycle were the agent's
        # deepest paths (14 LUT levels: the tag compare -> the allocation -> the free CQID ->
        # the tracker buffer; a tracker's address -> the 64-way compare -> the port's ready).
        # A registered lookup is a cycle old; what can change in that cycle is mended:
        # - a tracker allocated by F2 in that cycle (the one way a tracker appears): its line
        #   and fill slot are compared with the request F1 hands on, and registered with it;
        # - a tracker freed in that cycle: the request waits a cycle (still busy, stale);
        # - the cache slot written in that cycle (a fill by the finisher, a snoop's new state,
        #   F2's own hit write, eviction or drop): a request for that slot waits a cycle, and
        #   the lookup of the next cycle is fresh.
        in_req = self.port.req
        f1_req = in_req.payload            # F1: the port's request (a register slice's, in the device)
        f2_valid = Signal(name="fe2_valid")
        req = Signal(CacheReq, name="fe2_req")
        f2_fire = Signal()                 # F2's request leaves (served or allocated)
        f2_free = Signal()
        moved = Signal()                   # F2's request came from F1 in the cycle before
        m.d.comb += [f2_free.eq(~f2_valid | f2_fire), in_req.ready.eq(f2_free)]
        with m.If(f2_free):
            m.d.sync += [f2_valid.eq(in_req.valid), req.eq(in_req.payload)]
        m.d.sync += moved.eq(f2_free)

        lookup = data.StructLayout({"hit": 1, "state": Mesi, "line_busy": 1, "slot_busy": 1})
        lk_f1, lk_f2 = Signal(lookup, name="fe1_lookup"), Signal(lookup, name="fe2_lookup")
        for stage, addr, tag_rd, lk in ((1, f1_req.addr, c_tag_f1, lk_f1), (2, req.addr, c_tag_fe, lk_f2)):
            state = Signal(Mesi, name=f"fe{stage}_state")
            m.d.comb += [tag_rd.addr.eq(slot_of(addr)), state.eq(c_state[slot_of(addr)])]
            m.d.sync += [
                lk.state.eq(state),
                lk.hit.eq((state != Mesi.I) & (tag_rd.data == tag_of(addr))),
                lk.line_busy.eq(Cat(t_valid[i] & (t_addr[i] == addr) for i in range(n)).any()),
                lk.slot_busy.eq(Cat(t_valid[i] & t_fill[i] & (slot_of(t_addr[i]) == slot_of(addr))
                                    for i in range(n)).any()),
            ]
        lk = Signal(lookup)
        m.d.comb += lk.eq(Mux(moved, lk_f1, lk_f2))
        # Mends, registered (see above): F2's allocation of the cycle before against F1's line.
        new_line_q = Signal()              # it holds F1's line
        new_fill_q = Signal()              # it is a fill of F1's slot
        changed = Array(Signal(name=f"fe_slot_written{i}") for i in range(3))   # finisher, snoop, F2
        changed_slot = Array(Signal(sb or 1, name=f"fe_slot_written{i}_slot") for i in range(3))

        fe_slot = slot_of(req.addr)
        m.d.comb += c_rd_fe.addr.eq(fe_slot)
        fe_state = lk.state
        fe_hit = lk.hit
        line_busy = Signal()
        slot_busy = Signal()
        slot_written = Signal()
        m.d.comb += [
            line_busy.eq(lk.line_busy | (moved & new_line_q)),
            slot_busy.eq(lk.slot_busy | (moved & new_fill_q)),
            slot_written.eq(Cat(changed[i] & (changed_slot[i] == fe_slot) for i in range(3)).any()),
        ]
        # One writer of a cache slot per cycle: the finisher and a snoop go first. The front
        # end waits while S2 holds a snoop to its slot, not only one that changes the line's
        # state in this cycle: whether it does comes out of the snoop's decision, too deep to
        # stand in front of the front end's own. Likewise it waits while the finisher holds
        # a fill, not only in the cycle the fill is written: that depends on the response
        # merge's grant (the finisher's valid -> the merge -> its ready -> the fill -> the
        # front end's ready -> the port's register slice was port_mux's 11 LUT levels).
        fe_blocked = (line_busy | slot_written | (fin.valid & f.fills) |
                      (s2_valid & (s_slot == fe_slot)))
        cqid = free.r_data
        cqid_ok = free.r_rdy & ~initializing

        op = req.op
        needs_fill = Signal()      # the request will bring its line into the cache
        local = Signal()           # served from the cache, no CXL
        flow = Signal(Flow)
        with m.Switch(op):
            with m.Case(CacheOp.READ_SHARED):
                m.d.comb += [local.eq(fe_hit), needs_fill.eq(~fe_hit), flow.eq(Flow.RD_SHARED)]
            with m.Case(CacheOp.READ_OWN):
                owned = fe_hit & ((fe_state == Mesi.E) | (fe_state == Mesi.M))
                m.d.comb += [local.eq(owned), needs_fill.eq(~owned), flow.eq(Flow.RD_OWN)]
            with m.Case(CacheOp.READ_CURRENT):
                m.d.comb += [local.eq(fe_hit), flow.eq(Flow.RD_CURR)]
            with m.Case(CacheOp.WRITE):
                owned = fe_hit & ((fe_state == Mesi.E) | (fe_state == Mesi.M))
                m.d.comb += [local.eq(owned), needs_fill.eq(~owned), flow.eq(Flow.RD_OWN_NO_DATA)]
            with m.Case(CacheOp.PUSH, CacheOp.PUSH_INV):
                # A line the device owns (E/M) is written and written back (DirtyEvict with
                # the new data); ItoMWr/WrInv are for lines the device does not own.
                owned = fe_hit & ((fe_state == Mesi.E) | (fe_state == Mesi.M))
                m.d.comb += flow.eq(Mux(owned, Flow.EVICT,
                                        Mux(op == CacheOp.PUSH, Flow.ITOM_WR, Flow.WR_INV)))
            with m.Case(CacheOp.FLUSH):
                m.d.comb += flow.eq(Mux(fe_hit & (fe_state == Mesi.M), Flow.EVICT, Flow.CL_FLUSH))
            with m.Case(CacheOp.ACQUIRE):      # device memory: never in the cache
                m.d.comb += flow.eq(Flow.ACQUIRE)
        # A fill into a slot holding another valid line evicts that line first: an M line with
        # DirtyEvict, an E line with CleanEvict (the host may pull it); an S copy is dropped
        # silently (CleanEvict is for exclusive lines; the host's directory tolerates a
        # silent drop of a shared copy).
        victim = needs_fill & (fe_state != Mesi.I) & ~fe_hit
        valid_req = f2_valid & ~fe_blocked
        do_local = valid_req & local & hit_q.w_rdy
        do_drop = valid_req & ~local & victim & (fe_state == Mesi.S)
        do_evict = valid_req & ~local & victim & (fe_state != Mesi.S) & cqid_ok & req_q.w_rdy
        do_alloc = valid_req & ~local & ~victim & cqid_ok & req_q.w_rdy & ~(needs_fill & slot_busy)
        m.d.comb += f2_fire.eq(do_local | do_alloc)

        # Local hits: reads answer with the line; a WRITE to an E/M line writes it (now M).
        hit_word = Signal(CacheRsp)
        m.d.comb += [
            hit_word.id.eq(req.id),
            hit_word.data.eq(Mux(op == CacheOp.WRITE, 0, c_rd_fe.data)),
            hit_q.w_data.eq(hit_word), hit_q.w_en.eq(do_local),
        ]
        with m.If(do_local & (op == CacheOp.WRITE)):
            m.d.sync += c_state[fe_slot].eq(Mesi.M)
        with m.If(do_local | do_alloc):
            m.d.comb += [ev.hit.eq(do_local), ev.miss.eq(do_alloc)]

        # The D2H request of an allocation or an eviction.
        victim_addr = Cat(fe_slot, c_tag_fe.data) if sb else c_tag_fe.data
        d2h_opcode = Signal(DReq)
        d2h_addr = Signal(LINE_ADDR_BITS)
        d2h = Signal(D2HReq)
        m.d.comb += [
            # Every field, unconditionally: NT is a real constant driver (ALWNEVER).
            d2h.opcode.eq(d2h_opcode), d2h.cqid.eq(cqid), d2h.nt.eq(0), d2h.addr.eq(d2h_addr),
            req_q.w_data.eq(d2h), req_q.w_en.eq(do_alloc | do_evict),
        ]
        # What an allocation writes is chosen by ``victim``, not by ``do_evict``: the two agree
        # whenever anything is written (an eviction is the allocation of a victim, and a plain
        # allocation has none), and ``victim`` does not wait for the trackers' address compare
        # (``line_busy``), which then only reaches the write enables (13 LUT levels before).
        with m.If(do_evict):
            m.d.comb += [ev.evict_dirty.eq(fe_state == Mesi.M), ev.evict_clean.eq(fe_state != Mesi.M)]
        with m.If(victim):
            m.d.comb += [
                d2h_addr.eq(victim_addr),
                d2h_opcode.eq(Mux(fe_state == Mesi.M, DReq.DIRTY_EVICT, DReq.CLEAN_EVICT)),
            ]
        with m.Else():
            m.d.comb += d2h_addr.eq(req.addr)
            with m.Switch(flow):
                for f, code in ((Flow.RD_SHARED, DReq.RD_SHARED), (Flow.RD_OWN, DReq.RD_OWN),
                                (Flow.RD_CURR, DReq.RD_CURR),
                                (Flow.RD_OWN_NO_DATA, DReq.RD_OWN_NO_DATA),
                                (Flow.ITOM_WR, DReq.ITOM_WR), (Flow.WR_INV, DReq.WR_INV),
                                (Flow.CL_FLUSH, DReq.CL_FLUSH), (Flow.EVICT, DReq.DIRTY_EVICT),
                                (Flow.ACQUIRE, DReq.RD_OWN_NO_DATA)):
                    with m.Case(f):
                        m.d.comb += d2h_opcode.eq(code)
        m.d.comb += [ev.d2h_req.eq(do_alloc | do_evict), free.r_en.eq(do_alloc | do_evict)]

        # Tracker allocation. Write data (WRITE, PUSH*) or the evicted line goes in its buffer.
        t_new_data = Signal(LINE_BITS)
        flush_own = (op == CacheOp.FLUSH) & (flow == Flow.EVICT)     # write back the cached line
        m.d.comb += t_new_data.eq(Mux(victim | flush_own, c_rd_fe.data, req.data))
        m.d.comb += [t_wr_fe.addr.eq(cqid), t_wr_fe.data.eq(t_new_data),
                     t_wr_fe.en.eq(do_alloc | do_evict)]
        alloc = do_alloc | do_evict
        new_flow = Signal(Flow)
        new_static = Signal(static)
        m.d.comb += [
            new_flow.eq(Mux(victim, Flow.EVICT, flow)),
            new_static.flow.eq(new_flow), new_static.port.eq(~victim), new_static.id.eq(req.id),
            new_static.dirty.eq(d2h_opcode == DReq.DIRTY_EVICT),
            st_wr.addr.eq(cqid), st_wr.data.eq(new_static), st_wr.en.eq(alloc),
        ]
        for wp, value in ((pl_alloc, 0), (sn_alloc, 0), (go_alloc, GOState.I), (er_alloc, 0),
                          (bg_alloc, 0)):
            m.d.comb += [wp.addr.eq(cqid), wp.data.eq(value), wp.en.eq(alloc)]
        with m.If(alloc):
            m.d.sync += [
                t_valid[cqid].eq(1),
                t_evict[cqid].eq(new_flow == Flow.EVICT),
                t_addr[cqid].eq(Mux(victim, victim_addr, req.addr)),
                t_fill[cqid].eq(~victim & needs_fill),
                t_got_go[cqid].eq(0),
                t_got_data[cqid].eq(0),
                # An owned line pushed with new data is dirty now, whatever it was.
                t_evstate[cqid].eq(Mux(~victim & (flow == Flow.EVICT), Mesi.M, fe_state)),
            ]
            # The slot's line leaves the cache: evicted, superseded by a push or flush,
            # or (an S copy) dropped before asking for ownership.
            with m.If(victim | (fe_hit & ~local)):
                m.d.sync += c_state[fe_slot].eq(Mesi.I)
        with m.If(do_drop):
            m.d.sync += c_state[fe_slot].eq(Mesi.I)

        # The front end's mends for the next cycle (see the front end): this cycle's tracker
        # allocation against F1's line and slot, and the cache slots written this cycle.
        alloc_line = Mux(victim, (slot_of(f1_req.addr) == fe_slot) & (c_tag_fe.data == tag_of(f1_req.addr)),
                         req.addr == f1_req.addr)
        m.d.sync += [
            new_line_q.eq(alloc & alloc_line),
            new_fill_q.eq(alloc & ~victim & needs_fill & (slot_of(f1_req.addr) == fe_slot)),
            changed[0].eq(f_cache_write), changed_slot[0].eq(slot_of(f_addr)),
            changed[1].eq(s_go & s_hit), changed_slot[1].eq(s_slot),
            changed[2].eq((do_local & (op == CacheOp.WRITE)) | (alloc & (victim | (fe_hit & ~local))) | do_drop),
            changed_slot[2].eq(fe_slot),
        ]
        m.d.comb += s_slot_written.eq(Cat(changed[i] & (changed_slot[i] == s_slot) for i in range(3)).any())

        # The single cache-data write port: fills from the finisher, else WRITE hits.
        with m.If(f_cache_write):
            m.d.comb += [c_wr.addr.eq(slot_of(f_addr)), c_wr.data.eq(t_rd_fin.data), c_wr.en.eq(1)]
        with m.Elif(do_local & (op == CacheOp.WRITE)):
            m.d.comb += [c_wr.addr.eq(fe_slot), c_wr.data.eq(req.data), c_wr.en.eq(1)]

        # ------------------------------------------------------------ illegal host messages
        # Dropped above (r_ok / d_ok gate every effect); here counted and the first captured.
        r_stray = r_fire & ~r_ok
        d_stray = d_fire & ~d_ok
        s_stray = s_go & s_rsvd

        def reason(qid, c):
            return Mux(~in_range(qid), StrayReason.OUT_OF_RANGE,
                       Mux(~t_valid[c], StrayReason.FREE, StrayReason.WRONG_PHASE))
        info_now = Signal(StrayInfo)
        with m.If(r_stray):
            m.d.comb += [info_now.kind.eq(StrayKind.RSP), info_now.qid.eq(rsp.cqid),
                         info_now.opcode.eq(rsp.opcode), info_now.go_state.eq(rsp.rsp_data[:4]),
                         info_now.reason.eq(reason(rsp.cqid, r_c))]
        with m.Elif(d_stray):
            m.d.comb += [info_now.kind.eq(StrayKind.DATA), info_now.qid.eq(dat.cqid),
                         info_now.reason.eq(reason(dat.cqid, d_c))]
        with m.Else():
            m.d.comb += [info_now.kind.eq(StrayKind.SNOOP), info_now.qid.eq(snp.uqid),
                         info_now.opcode.eq(snp.opcode), info_now.reason.eq(StrayReason.RESERVED_SNOOP)]
        info_q = Signal(StrayInfo)
        capture = Signal()
        m.d.comb += [capture.eq((r_stray | d_stray | s_stray) & ~self.stray_held),
                     self.stray_capture.eq(capture), self.stray_info.eq(info_q)]
        with m.If(capture):
            m.d.sync += info_q.eq(info_now)
        # One counter pulse per cycle; a second stray in the same cycle waits in the backlog.
        backlog = Signal(range(STRAY_BACKLOG + 1))
        owed = Signal(range(STRAY_BACKLOG + 3))
        rest = Signal(range(STRAY_BACKLOG + 3))
        m.d.comb += [owed.eq(backlog + r_stray + d_stray), ev.stray.eq(owed != 0),
                     rest.eq(owed - (owed != 0))]
        m.d.sync += backlog.eq(Mux(rest > STRAY_BACKLOG, STRAY_BACKLOG, rest))
        return m
