"""TrainingCxlDevice: the CXL Type-2 memory device (the DUT; top module trainingcxl_device).

Ports (architecture.md §3; one clock domain ``sync``, active-high synchronous reset):
- ``m2s_req``, ``m2s_rwd``: In streams of M2SReq / M2SRwD (hw/common/cxl_mem.py).
- ``s2m_ndr``, ``s2m_drs``: Out streams of S2MNDR / S2MDRS.
- ``csr``: In AXI4-Lite (32-bit), the CXL.io MMIO BAR; map in hw/cxl_controller/csr_map.py.
- ``pmem0`` ... ``pmem{N-1}``: Out AXI4 (512-bit data, 8-bit IDs, poison in W/RUSER) to the
  persistent memory. A B response means the line is durable.
- ``d2h_req``, ``d2h_rsp``, ``d2h_data``: Out, ``h2d_req``, ``h2d_rsp``, ``h2d_data``: In
  streams of the CXL.cache layouts (hw/common/cxl_cache.py), the device's Type-2 agent.
- ``cache_port`` (only with ``DeviceConfig.cache_test_port``): the agent's internal request
  port (hw/cxl_controller/cache_port.py), so a testbench can stand in for the engines.
- ``irq``: level; STATUS & IRQ_ENABLE, cleared by writing STATUS.

Memory: port 0 of the interleaver is shared (``SHARED_PORT_CLIENTS`` behind a round-robin
MemPortArbiter); each lookup unit has a port of its own, and port 1 also carries the update
engine's gradient reads (``grad_port``, through a second MemPortArbiter: LOOKUP and UPDATE
never run at once, so each has the port to itself). Both arbiters take their clients through
input stages (skid buffers or register slices), so no client's request logic reaches
another's ready through a grant. The CXL.cache agent's internal port
is shared by the test port, the bias engine and the NDP engines (lookup push, MLP log).
"""
from types import SimpleNamespace

from amaranth import Module, Cat, Signal, Value
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .common.axi import AxiLiteSignature
from .common.stream_util import RegisterSlice
from .common.cxl_cache import D2HReq, D2HRsp, D2HData, H2DReq, H2DRsp, H2DData
from .common.cxl_mem import M2SReq, M2SRwD, S2MNDR, S2MDRS
from .config import DeviceConfig
from .cxl_controller.bias import BiasTable
from .cxl_controller.cache_port import cache_port_signature, CachePortMux, CacheReq, ENGINE_ID_BASE
from .cxl_controller.csr import CsrBlock
from .cxl_controller.cxl_cache import CxlCacheAgent
from .cxl_controller.cxl_mem import CxlMemTarget, CTX
from .mem.arbiter import MemPortArbiter, connect_port
from .mem.interleave import MemoryInterleaver
from .checkpoint.log_format import LogRegion
from .checkpoint.mlp_log import MlpLogEngine
from .checkpoint.recovery import RecoveryEngine
from .checkpoint.undo_log import UndoLogEngine
from .cxl_controller.cache_port import EngineCachePortMerge
from .ndp.lookup import LookupEngine
from .ndp.processor import CommandProcessor
from .ndp.update import UpdateEngine

VERSION = (0, 1, 0)
CSR_ADDR_BITS = 12

# CXL.mem target event -> CSR counter input (names in hw/cxl_controller/csr_map.py)
EVENT_COUNTERS = {
    "oow_req": "err_out_of_window_rd_inc",
    "oow_rwd": "err_out_of_window_wr_inc",
    "unsupported_req": "err_unsupported_req_inc",
    "unsupported_rwd": "err_unsupported_rwd_inc",
    "poison_wr": "err_poison_wr_inc",
    "poison_rd": "err_poison_rd_inc",
    "media_error": "err_media_inc",
    "rd_line": "stat_rd_lines_inc",
    "wr_line": "stat_wr_lines_inc",
    "spec_rd_dropped": "stat_spec_rd_dropped_inc",
    "inv": "stat_inv_inc",
}
# CXL.cache agent event -> CSR counter input
CACHE_EVENT_COUNTERS = {
    "d2h_req": "stat_d2h_req_inc",
    "snoop": "stat_snoop_inc",
    "snoop_hit": "stat_snoop_hit_inc",
    "evict_dirty": "stat_evict_dirty_inc",
    "evict_clean": "stat_evict_clean_inc",
    "bogus": "stat_bogus_inc",
    "go_err": "err_cache_go_inc",
    "hit": "stat_cache_hit_inc",
    "miss": "stat_cache_miss_inc",
    "unexpected_fwd": "err_unexpected_fwd_inc",
    "stray": "err_cache_stray_inc",
    "snoop_rsvd": "err_cache_snoop_rsvd_inc",
}


# Clients of the shared memory port 0 (the lookup units have ports of their own).
SHARED_PORT_CLIENTS = ("cxl_mem", "processor", "lookup_feeder", "update", "undo_log", "mlp_log", "recovery")
# Clients of the NDP engines' CXL.cache port (EngineCachePortMerge: each gets an id range).
ENGINE_CACHE_CLIENTS = ("lookup_push", "mlp_log")


class TrainingCxlDevice(wiring.Component):
    def __init__(self, config: DeviceConfig | None = None):
        self.config = config = config if config is not None else DeviceConfig()
        self._processor = CommandProcessor(addr_bits=config.addr_bits, capacity_lines=config.capacity_lines)
        self._lookup = LookupEngine(addr_bits=config.addr_bits, capacity_lines=config.capacity_lines,
                                    units=config.lookup_units, rob_depth=config.lookup_rob_depth,
                                    id_base=ENGINE_ID_BASE, fp32_pipeline=config.fp32_pipeline,
                                    cache_lines=config.lookup_cache_lines, contexts=config.lookup_contexts)
        self._update = UpdateEngine(addr_bits=config.addr_bits, capacity_lines=config.capacity_lines,
                                    scratch_lines=config.update_scratch_lines, fp32_pipeline=config.fp32_pipeline)
        self._cache_merge = EngineCachePortMerge(clients=len(ENGINE_CACHE_CLIENTS))
        self._undo_log = UndoLogEngine(addr_bits=config.addr_bits, capacity_lines=config.capacity_lines,
                                       set_entries=config.log_set_entries)
        self._mlp_log = MlpLogEngine(addr_bits=config.addr_bits, capacity_lines=config.capacity_lines,
                                     id_base=self._cache_merge.id_base(ENGINE_CACHE_CLIENTS.index("mlp_log")))
        self._recovery = RecoveryEngine(addr_bits=config.addr_bits, capacity_lines=config.capacity_lines)
        assert self._cache_merge.id_base(0) == ENGINE_ID_BASE and config.lookup_units <= self._cache_merge.span
        shared_ctx = max(CTX.size, self._processor.ctx_bits, self._lookup.feed_ctx_bits, self._update.ctx_bits,
                         self._undo_log.ctx_bits, self._mlp_log.ctx_bits, self._recovery.ctx_bits)
        # The shared port's clients enter through stages, so that no client's request logic
        # reaches another's ready through the merge's grant (28 LUT levels in the device, from
        # the lookup feeder's readers into every other client): every client through a register
        # slice (1 cycle). The CXL.mem target, whose latency the host sees, went through a skid
        # buffer (0 cycles) until its decode state's valid, passed through, was the port's
        # deepest path (13 LUT levels, into the skid's holding register through the grant).
        self._shared = MemPortArbiter(clients=len(SHARED_PORT_CLIENTS), addr_bits=config.addr_bits,
                                      ctx_bits=shared_ctx, input_stage=["slice"] * len(SHARED_PORT_CLIENTS))
        # Interleaver port 1 the same way (23 levels in the device: lookup unit 0's request
        # through the merge's grant into UPDATE's gradient ready and its bag stage): both
        # through register slices (1 cycle). Unit 0 went through a skid buffer (0 cycles)
        # until its issue logic's valid, passed through, was 16 levels into the port's stages.
        self._unit0_port = MemPortArbiter(clients=2, addr_bits=config.addr_bits,
                                          ctx_bits=max(self._lookup.unit_ctx_bits, self._update.ctx_bits),
                                          input_stage=("slice", "slice"))
        self._mem = MemoryInterleaver(
            channels=config.channels, addr_bits=config.addr_bits,
            ctx_bits=max(shared_ctx + self._shared.client_bits, self._lookup.unit_ctx_bits,
                         self._unit0_port.ctx_bits + self._unit0_port.client_bits),
            ports=1 + config.lookup_units,
            read_ids=config.read_ids_per_channel, write_depth=config.writes_per_channel)
        super().__init__({
            "m2s_req": In(stream.Signature(M2SReq)),
            "m2s_rwd": In(stream.Signature(M2SRwD)),
            "s2m_ndr": Out(stream.Signature(S2MNDR)),
            "s2m_drs": Out(stream.Signature(S2MDRS)),
            "csr": In(AxiLiteSignature(addr_width=CSR_ADDR_BITS)),
            **{f"pmem{c}": Out(self._mem.axi_signature) for c in range(config.channels)},
            "d2h_req": Out(stream.Signature(D2HReq)),
            "d2h_rsp": Out(stream.Signature(D2HRsp)),
            "d2h_data": Out(stream.Signature(D2HData)),
            "h2d_req": In(stream.Signature(H2DReq)),
            "h2d_rsp": In(stream.Signature(H2DRsp)),
            "h2d_data": In(stream.Signature(H2DData)),
            **({"cache_port": In(cache_port_signature())} if config.cache_test_port else {}),
            "irq": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        m.submodules.mem = mem = self._mem
        m.submodules.cxl_mem = tgt = CxlMemTarget(
            addr_bits=cfg.addr_bits, capacity_lines=cfg.capacity_lines,
            input_depth=cfg.input_depth, output_depth=cfg.output_depth,
            bias_page_bits=cfg.bias_page_line_bits)
        m.submodules.csr = csr = CsrBlock()
        m.submodules.cxl_cache = agent = CxlCacheAgent(cache_lines=cfg.cache_lines,
                                                       trackers=cfg.cache_trackers)
        for name in ("d2h_req", "d2h_rsp", "d2h_data"):
            wiring.connect(m, getattr(agent, name), wiring.flipped(getattr(self, name)))
        for name in ("h2d_req", "h2d_rsp", "h2d_data"):
            wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(agent, name))
        wiring.connect(m, tgt.fwd, agent.fwd)
        # The agent's port: the test port (or, later, the engines) and the bias engine.
        m.submodules.bias = bias = BiasTable(pages=cfg.bias_pages,
                                             page_line_bits=cfg.bias_page_line_bits)
        m.submodules.port_mux = mux = CachePortMux()
        wiring.connect(m, mux.agent, agent.port)
        wiring.connect(m, bias.port, mux.bias)
        if cfg.cache_test_port:
            wiring.connect(m, wiring.flipped(self.cache_port), mux.client)
        else:   # the FPGA build has no test port
            m.d.comb += [mux.client.req.valid.eq(0), mux.client.rsp.ready.eq(1)]

        wiring.connect(m, wiring.flipped(self.m2s_req), tgt.m2s_req)
        wiring.connect(m, wiring.flipped(self.m2s_rwd), tgt.m2s_rwd)
        wiring.connect(m, tgt.s2m_ndr, wiring.flipped(self.s2m_ndr))
        wiring.connect(m, tgt.s2m_drs, wiring.flipped(self.s2m_drs))
        # Memory: port 0 is shared (CXL.mem target, command processor, lookup feeder,
        # update engine); ports 1.. belong to the lookup units, port 1 also to the update
        # engine's gradient reads.
        m.submodules.processor = proc = self._processor
        m.submodules.lookup = lookup = self._lookup
        m.submodules.shared_port = shared = self._shared
        tgt_port = SimpleNamespace(req=tgt.mem_req, rd_rsp=tgt.mem_rd_rsp, wr_rsp=tgt.mem_wr_rsp)
        m.submodules.update = update = self._update
        m.submodules.undo_log = undo_log = self._undo_log
        m.submodules.mlp_log = mlp_log = self._mlp_log
        m.submodules.recovery = recovery = self._recovery
        shared_clients = (tgt_port, proc.mem, lookup.feed_mem, update.mem, undo_log.mem, mlp_log.mem, recovery.mem)
        assert len(shared_clients) == len(SHARED_PORT_CLIENTS)
        for i, client in enumerate(shared_clients):
            connect_port(m, client, shared.clients[i])
        connect_port(m, shared.mem, mem.clients[0])
        m.submodules.unit0_port = unit0 = self._unit0_port
        connect_port(m, lookup.unit_mem[0], unit0.clients[0])
        connect_port(m, update.grad_port, unit0.clients[1])
        connect_port(m, unit0.mem, mem.clients[1])
        for u in range(1, cfg.lookup_units):
            connect_port(m, lookup.unit_mem[u], mem.clients[1 + u])
        wiring.connect(m, proc.lookup, lookup.ctl)
        wiring.connect(m, proc.update, update.ctl)
        wiring.connect(m, proc.log, undo_log.ctl)
        wiring.connect(m, proc.mlp_log, mlp_log.ctl)
        wiring.connect(m, proc.recover, recovery.ctl)
        m.submodules.engine_cache = merge = self._cache_merge
        wiring.connect(m, lookup.push, merge.clients[ENGINE_CACHE_CLIENTS.index("lookup_push")])
        wiring.connect(m, mlp_log.cache, merge.clients[ENGINE_CACHE_CLIENTS.index("mlp_log")])
        # The engines' merged requests enter the port mux through a register slice (a cycle):
        # an engine's request valid ran through both round robins (the engines' merge, the
        # port mux's) and their grant back into the engine (MLP log: 12 LUT levels).
        m.submodules.engine_cache_slice = eng_slice = RegisterSlice(CacheReq)
        wiring.connect(m, merge.engines.req, eng_slice.i)
        wiring.connect(m, eng_slice.o, mux.engines.req)
        wiring.connect(m, mux.engines.rsp, merge.engines.rsp)
        # Checkpoint geometry (CKPT_* CSRs) and the last RECOVER's result.
        region = Signal(LogRegion)
        m.d.comb += [
            region.log_base.eq(csr.ckpt_log_base), region.slot_lines.eq(csr.ckpt_slot_lines),
            region.mlp_base.eq(csr.ckpt_mlp_base), region.mlp_lines.eq(csr.ckpt_mlp_lines),
            region.mlp_host_addr.eq(Cat(csr.ckpt_mlp_addr_lo, csr.ckpt_mlp_addr_hi_addr)),
            proc.region.eq(region), undo_log.region.eq(region), mlp_log.region.eq(region),
            recovery.region.eq(region),
            csr.ckpt_recovered_emb.eq(recovery.emb_batches), csr.ckpt_recovered_mlp.eq(recovery.mlp_batch),
            csr.ckpt_recover_status_emb_valid.eq(recovery.emb_valid),
            csr.ckpt_recover_status_mlp_valid.eq(recovery.mlp_valid),
            csr.ckpt_recover_status_rolled_back.eq(recovery.rolled_back),
            csr.ckpt_recover_status_mlp_slot.eq(recovery.mlp_slot),
        ]
        m.d.comb += [
            proc.sq_base.eq(csr.ndp_sq_base), proc.cq_base.eq(csr.ndp_cq_base),
            proc.size_log2.eq(csr.ndp_ring_size_log2), proc.sq_tail.eq(csr.ndp_sq_tail_tail),
            csr.ndp_sq_head_head.eq(proc.sq_head), csr.ndp_status_busy.eq(proc.busy),
            csr.ndp_status_last_error.eq(proc.last_error), csr.ndp_status_last_tag.eq(proc.last_tag),
            csr.ndp_last_cycles.eq(proc.last_cycles), csr.ndp_last_error_info.eq(proc.last_error_info),
            csr.stat_ndp_commands_inc.eq(proc.completed), csr.err_ndp_command_inc.eq(proc.failed),
            csr.status_ndp_done_set.eq(0),
        ]
        for c in range(cfg.channels):
            wiring.connect(m, getattr(mem, f"pmem{c}"), wiring.flipped(getattr(self, f"pmem{c}")))
        wiring.connect(m, wiring.flipped(self.csr), csr.bus)

        # Identification and capabilities (read-only CSRs).
        m.d.comb += [
            csr.version_major.eq(VERSION[0]), csr.version_minor.eq(VERSION[1]),
            csr.version_patch.eq(VERSION[2]),
            csr.channels_count.eq(cfg.channels),
            csr.outstanding_reads.eq(cfg.max_outstanding_reads),
            csr.outstanding_writes.eq(cfg.max_outstanding_writes),
            csr.capacity_lo.eq(cfg.capacity_bytes & 0xFFFF_FFFF),
            csr.capacity_hi.eq(cfg.capacity_bytes >> 32),
            csr.clock_mhz.eq(cfg.clock_mhz),
        ]
        # HDM decoder window, in line units.
        m.d.comb += [
            tgt.hdm_base.eq(Cat(csr.hdm_base_lo_addr, csr.hdm_base_hi_addr)),
            tgt.hdm_size.eq(Cat(csr.hdm_size_lo_size, csr.hdm_size_hi_size)),
            tgt.hdm_enable.eq(csr.hdm_ctrl_enable),
        ]
        # Bias table: the target's lookups, the CSR doorbell and status.
        m.d.comb += [
            bias.host_page.eq(tgt.bias_page), tgt.bias_device.eq(bias.host_device),
            bias.host_to_host.eq(tgt.bias_to_host), bias.host_flip_page.eq(tgt.bias_flip_page),
            bias.flip_page.eq(csr.bias_flip_page), bias.flip_to_device.eq(csr.bias_flip_to_device),
            bias.flip_seq.eq(csr.bias_doorbell_seq),
            bias.hdm_base.eq(Cat(csr.hdm_base_lo_addr, csr.hdm_base_hi_addr)),
            bias.query_page.eq(csr.bias_query_page),
            csr.bias_geometry_page_line_bits.eq(cfg.bias_page_line_bits),
            csr.bias_geometry_pages_log2.eq((cfg.bias_pages - 1).bit_length()),
            csr.stat_bias_to_device_inc.eq(bias.events.to_device),
            # Flips to host bias: by a host access (the target) or by CSR (the engine).
            csr.stat_bias_to_host_inc.eq(tgt.events.bias_to_host | bias.events.to_host),
        ]
        # BIAS_STATUS is registered, all its fields together (one consistent snapshot, a
        # cycle old): the query's read of the 64Ki-page table no longer runs on into the
        # CSR read mux (12 LUT levels, query page -> r_data, in the eighth round's device
        # run). Software cannot tell: a read issued after a write's B is at least two
        # cycles after the register changed.
        m.d.sync += [
            csr.bias_status_busy.eq(bias.busy), csr.bias_status_error.eq(bias.error),
            csr.bias_status_done_seq.eq(bias.done_seq),
            csr.bias_status_query_device.eq(bias.query_device),
        ]
        # Counters and status. The target's and the agent's event pulses reach their counters a
        # cycle later, registered: an event is decided at the end of a deep path (the agent's
        # tracker match -> its eviction verdict), and the counter's saturating increment after
        # it was the CSR block's deepest path (15 LUT levels in the device).
        ev = tgt.events
        for event, port in EVENT_COUNTERS.items():
            m.d.sync += getattr(csr, port).eq(getattr(ev, event))
        for event, port in CACHE_EVENT_COUNTERS.items():
            m.d.sync += getattr(csr, port).eq(getattr(agent.events, event))
        # The first illegal CXL.cache host message (CACHE_STRAY_INFO; VALID re-arms the capture).
        info = agent.stray_info
        for name in ("qid", "opcode", "go_state", "kind", "reason"):
            port = getattr(csr, f"cache_stray_info_{name}")
            value = getattr(info, name)
            assert len(port) == len(Value.cast(value)), name       # map and StrayInfo agree
            m.d.comb += port.eq(value)
        m.d.comb += [csr.cache_stray_info_valid_set.eq(agent.stray_capture),
                     agent.stray_held.eq(csr.cache_stray_info_valid)]
        # STATUS.ERROR / STATUS.POISON are set by the counters themselves (csr_map "sets").
        m.d.comb += [
            csr.status_error_set.eq(0),
            csr.status_poison_set.eq(0),
            self.irq.eq(csr.irq),
        ]
        return m
