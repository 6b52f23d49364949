"""cocotb tests for UpdateEngine (hw/ndp/update/engine.py), run by tests/test_update_engine.py.

The testbench stands in for both neighbours of the engine, in one per-cycle step registered
as a raw rising-edge callback (values read there are the pre-edge ones, as in sim/bfm/link.py):
- the command processor: pulses ``ctl.start`` with a packed CommandDescriptor and answers
  ``ctl.table_index`` with that table's descriptor one cycle later (a synchronous read port);
  it records ``done`` (error, error_info, stats) and the cycles from start to done.
- the memory subsystem (hw/mem/port.py guarantees) behind both of the engine's ports (``mem``;
  ``grad_port``, where only gradient reads may appear): a numpy array of lines. A write
  updates the array when accepted; a read returns the line as it is when accepted, so a read
  accepted after a write to the same line sees it. Each response waits a random latency (the "random"
  model: 20..150 cycles, UE_MAX_LAT / UE_MAX_WR_LAT raise the bounds, so responses come back
  out of order, a read after a pending write to its line after that write's response;
  req.ready drops at random), a PMEM-like one (the "pmem" model: ~120-cycle
  reads, writes retired at 0.32 per cycle, at most 256 reads / 128 writes outstanding) or the
  device's channels (the "channels" model: the default DeviceConfig's 4 channels mapped as
  hw/mem/port.py maps lines, each serving in order at the media's occupancy, 2.08 cycles a
  read and 12.5 a write, with a 120 / 280-cycle latency, its 64 reads and 32 writes
  outstanding per channel, a request per channel and cycle, each port's request stream held
  while its head's channel is full, and a read of a line with a write in flight answered two
  cycles later from that write, as the device's channel masters forward it). Reads of lines
  in ``poison`` come back poisoned.

Every command's result is compared bit for bit (NaN == NaN) with sim.model.embedding's
``tbe_sgd_step`` on a host copy of the tables; stats are checked against the traffic the
memory saw. Environment: UE_ADDR_BITS, UE_CAPACITY, UE_SCRATCH (the build's parameters),
TCXL_SEED (replay), UE_PERF_JSON (the perf test writes its figures there); test_rm4_trace
also reads UE_MEM_MODEL (default channels), UE_ROWS_CAP (400), UE_TABLE_BASE (the first
table's line, 64; the device's layout puts rm4's at 30549 with rows cap 4096, which needs a
build with UE_TEST_ADDR_BITS=18 UE_TEST_CAPACITY=262144, tests/test_update_engine.py) and
UE_MODEL / UE_BATCH (another preset's batch, e.g. rm1 and 64, tables at 9157 on the device).
"""
from __future__ import annotations

import heapq
import json
import os
import random

import cocotb
import numpy as np
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, Timer

from hw.config import DeviceConfig
from hw.mem.port import mem_read_response_layout, mem_request_layout, mem_write_response_layout, split_line_address
from hw.ndp.command import AddressFault, CommandDescriptor, EngineStats, NdpError, PoolMode, TableDescriptor
from hw.ndp.update import KIND_BITS, Kind, UpdateEngine
from sim.bfm.ndp_host import NdpTable, row_pitch_for
from sim.model import embedding, fp32_ref
from sim.model.codec import StructCodec
from sim.model.pmem_params import media_verilog_parameters

ADDR_BITS = int(os.environ.get("UE_ADDR_BITS", "16"))
CAPACITY = int(os.environ.get("UE_CAPACITY", str(1 << ADDR_BITS)))
SCRATCH = int(os.environ.get("UE_SCRATCH", "1024"))
SEED = int(os.environ.get("TCXL_SEED", "0")) or random.randrange(1, 1 << 31)
CTX_BITS = UpdateEngine.required_ctx_bits(SCRATCH)
MODES = {"sum": PoolMode.SUM, "mean": PoolMode.MEAN, "weighted_sum": PoolMode.WEIGHTED_SUM}

# The "channels" model's media: the device's (sim/harness.py builds pmem_media with these),
# and the default device's channels and their outstanding reads / writes (hw/config.py).
MEDIA = media_verilog_parameters(500, depth_lines=1, id_width=1, addr_width=7)
DEVICE = DeviceConfig()
CHANNELS = DEVICE.channels
REQ = StructCodec(mem_request_layout(ADDR_BITS, CTX_BITS))
RD = StructCodec(mem_read_response_layout(CTX_BITS))
WR = StructCodec(mem_write_response_layout(CTX_BITS))
CMD = StructCodec(CommandDescriptor)
TAB = StructCodec(TableDescriptor)
STATS = StructCodec(EngineStats)


def line_to_int(words: np.ndarray) -> int:
    return int.from_bytes(words.astype("<u4").tobytes(), "little")


def int_to_line(value: int) -> np.ndarray:
    return np.frombuffer(value.to_bytes(64, "little"), dtype="<u4").astype(np.uint32)


class _Port:
    """One of the engine's memory ports, as the bench sees it: handles and response state."""

    def __init__(self, dut, index: int, name: str):
        h = lambda sig: getattr(dut, f"{name}__{sig}")._handle          # noqa: E731
        self.index, self.name = index, name
        self.h_req_valid, self.h_req_ready, self.h_req_payload = h("req__valid"), h("req__ready"), h("req__payload")
        self.h_rd_valid, self.h_rd_ready, self.h_rd_payload = (
            h("rd_rsp__valid"), h("rd_rsp__ready"), h("rd_rsp__payload"))
        self.req_ready = 0
        self.rd_due: list = []              # read responses due, answered in random order
        self.rd_driven = False
        self.rd_driven_ch = 0


class Bench:
    """Processor + memory stand-in; see the module docstring."""

    def __init__(self, dut, rng: random.Random, model: str = "random"):
        self.dut = dut
        self.rng = rng
        self.model = model
        self.mem = np.zeros((1 << ADDR_BITS, 16), dtype=np.uint32)
        self.poison: set[int] = set()       # lines whose reads come back poisoned
        self.write_errors: set[int] = set()  # lines whose writes are answered with error
        self.cycle = 0
        h = lambda name: getattr(dut, name)._handle          # noqa: E731
        # the engine's two ports: mem (everything but gradients) and grad_port (gradient reads)
        self.ports = [_Port(dut, 0, "mem"), _Port(dut, 1, "grad_port")]
        self.payload_bits = UpdateEngine.required_ctx_bits(SCRATCH) - KIND_BITS
        self.h_wr_valid, self.h_wr_ready, self.h_wr_payload = (
            h("mem__wr_rsp__valid"), h("mem__wr_rsp__ready"), h("mem__wr_rsp__payload"))
        self.h_start, self.h_cmd, self.h_table, self.h_table_index = (
            h("ctl__start"), h("ctl__cmd"), h("ctl__table"), h("ctl__table_index"))
        self.h_done, self.h_error, self.h_info, self.h_stats = (
            h("ctl__done"), h("ctl__error"), h("ctl__error_info"), h("ctl__stats"))
        self.cmd_width = len(dut.ctl__cmd)
        self.tab_width = len(dut.ctl__table)
        self.rd_pending: list = []          # heap of (due cycle, n, (port, (ctx, data int, poison, channel)))
        self.wr_pending: list = []          # heap of (due cycle, n, ctx)
        self.wr_due: list = []              # write responses due, answered in random order
        self.n = 0
        self.wr_driven = False
        self.reads_out = 0
        self.writes_out = 0
        self.write_free_at = 0.0            # pmem model: when the media can retire the next write
        self.channel_free = [0.0] * CHANNELS  # channels model: when each channel's media is free
        self.ready_p = 0.8                  # random model: how often req.ready is high
        self.channel_last_due: dict = {}
        self.ch_out = {(c, w): 0 for c in range(CHANNELS) for w in (False, True)}
        self.wr_driven_ch = 0
        self.tables: list[int] = []         # packed descriptors the processor serves
        self.last_index = -1
        self.pending_cmd: int | None = None
        self.start_driven = False
        self.start_cycle = 0
        self.result: dict | None = None
        self.error: Exception | None = None
        self.reset_counters()

    def reset_counters(self):
        self.lines_read = 0
        self.lines_written = 0
        self.writes_by_line: dict[int, int] = {}
        self.reads_by_line: dict[int, int] = {}
        self.max_reads_out = 0
        self.write_due: dict[int, int] = {}       # line -> its last write's response cycle

    # ---------------------------------------------------------------- per-cycle step --
    def start(self):
        from cocotb import simulator
        from cocotb.triggers import RisingEdge
        self._register_cb = simulator.register_value_change_callback
        self._rising = RisingEdge._edge_type
        self._clk = self.dut.clk._handle
        for hnd in (self.h_wr_valid, self.h_start, *(x for p in self.ports for x in (p.h_rd_valid, p.h_req_ready))):
            hnd.set_signal_val_int(0, 0)
        self.dut.grad_port__wr_rsp__valid._handle.set_signal_val_int(0, 0)
        self._cb = self._register_cb(self._clk, self._on_edge, self._rising)

    def _on_edge(self):
        try:
            self.step()
        except Exception as exc:          # surfaces in the test through wait_done
            self.error = exc
            return
        self._cb = self._register_cb(self._clk, self._on_edge, self._rising)

    @staticmethod
    def _channel(addr: int) -> int:
        return split_line_address(addr, CHANNELS)[0]

    def _channel_due(self, addr: int, cyc: int, write: bool) -> int:
        """The "channels" model: 4 channels as the device maps lines (hw/mem/port.py), each
        serving in order at the media model's occupancy and latency from the start of service
        (sim/model/pmem_params.py at the device's 500 MHz: 2.08 / 12.5 cycles per read / write
        line, 120 / 280 cycles)."""
        ch = self._channel(addr)
        start = max(cyc, self.channel_free[ch])
        self.channel_free[ch] = start + MEDIA["WR_COST_Q8" if write else "RD_COST_Q8"] / 256
        due = int(start) + MEDIA["WR_LAT" if write else "RD_LAT"]
        key = (ch, write)
        due = max(due, self.channel_last_due.get(key, 0))
        self.channel_last_due[key] = due
        return due

    def _latency(self, write: bool) -> int:
        if self.model == "pmem":
            return 120 + self.rng.randrange(8) if not write else 280 + self.rng.randrange(8)
        return self.rng.randrange(20, int(os.environ.get("UE_MAX_WR_LAT" if write else "UE_MAX_LAT", "150")) + 1)

    def step(self):
        self.cycle += 1
        cyc = self.cycle
        rng = self.rng
        # ---- processor side
        if self.start_driven:
            self.h_start.set_signal_val_int(0, 0)
            self.start_driven = False
        if self.h_done.get_signal_val_long() and self.result is None and self.pending_cmd is None:
            stats = STATS.unpack(int(self.h_stats.get_signal_val_binstr(), 2))
            self.result = {"error": self.h_error.get_signal_val_long(),
                           "error_info": self.h_info.get_signal_val_long() & 0xFFFFFFFF,
                           "stats": stats, "cycles": cyc - self.start_cycle}
        if self.pending_cmd is not None:
            self.h_cmd.set_signal_val_binstr(0, format(self.pending_cmd, f"0{self.cmd_width}b"))
            self.h_start.set_signal_val_int(0, 1)
            self.start_driven = True
            self.start_cycle = cyc
            self.pending_cmd = None
        index = self.h_table_index.get_signal_val_long()
        if index != self.last_index:
            self.last_index = index
            word = self.tables[index] if index < len(self.tables) else 0
            self.h_table.set_signal_val_binstr(0, format(word, f"0{self.tab_width}b"))
        # ---- memory: accepted requests (both ports)
        for port in self.ports:
            if port.req_ready and port.h_req_valid.get_signal_val_long():
                self._accept(port, REQ.unpack(int(port.h_req_payload.get_signal_val_binstr(), 2)), cyc)
        # ---- memory: responses taken at this edge, then the next ones
        for port in self.ports:
            if port.rd_driven and port.h_rd_ready.get_signal_val_long():
                port.rd_driven = False
                self.reads_out -= 1
                self.ch_out[(port.rd_driven_ch, False)] -= 1
        if self.wr_driven and self.h_wr_ready.get_signal_val_long():
            self.wr_driven = False
            self.writes_out -= 1
            self.ch_out[(self.wr_driven_ch, True)] -= 1
        while self.rd_pending and self.rd_pending[0][0] <= cyc:
            port, rsp = heapq.heappop(self.rd_pending)[2]
            self.ports[port].rd_due.append(rsp)
        while self.wr_pending and self.wr_pending[0][0] <= cyc:
            self.wr_due.append(heapq.heappop(self.wr_pending)[2])
        for port in self.ports:
            if not port.rd_driven:
                if port.rd_due:
                    k = rng.randrange(len(port.rd_due))
                    port.rd_due[k], port.rd_due[-1] = port.rd_due[-1], port.rd_due[k]
                    ctx, data, poison, port.rd_driven_ch = port.rd_due.pop()
                    port.h_rd_payload.set_signal_val_binstr(
                        0, format(RD.pack(data=data, poison=int(poison), error=0, ctx=ctx), f"0{RD.width}b"))
                    port.h_rd_valid.set_signal_val_int(0, 1)
                    port.rd_driven = True
                else:
                    port.h_rd_valid.set_signal_val_int(0, 0)
        if not self.wr_driven:
            if self.wr_due:
                k = rng.randrange(len(self.wr_due))
                self.wr_due[k], self.wr_due[-1] = self.wr_due[-1], self.wr_due[k]
                ctx, error, self.wr_driven_ch = self.wr_due.pop()
                self.h_wr_payload.set_signal_val_int(0, WR.pack(error=int(error), ctx=ctx))
                self.h_wr_valid.set_signal_val_int(0, 1)
                self.wr_driven = True
            else:
                self.h_wr_valid.set_signal_val_int(0, 0)
        # ---- memory: accept a request in the next cycle? (each channel takes one request
        # per cycle; when both ports' heads want one channel, the ports take turns)
        taken = set()
        for port in (self.ports if cyc % 2 else self.ports[::-1]):
            ready = int(self.reads_out < 256 and self.writes_out < (256 if self.model == "channels" else 128))
            if ready and self.model == "channels" and port.h_req_valid.get_signal_val_long():
                # As the device's channel masters: read_ids_per_channel reads /
                # writes_per_channel writes outstanding per channel, and a port's request
                # stream waits while its head's channel is full.
                f = REQ.unpack(int(port.h_req_payload.get_signal_val_binstr(), 2))
                w, ch = bool(f["write"]), self._channel(f["addr"])
                limit = DEVICE.writes_per_channel if w else DEVICE.read_ids_per_channel
                ready = int(self.ch_out[(ch, w)] < limit and ch not in taken)
                if ready:
                    taken.add(ch)
            if ready and self.model == "random":
                ready = int(rng.random() < self.ready_p)
            if ready != port.req_ready:
                port.h_req_ready.set_signal_val_int(0, ready)
                port.req_ready = ready

    def _accept(self, port, f: dict, cyc: int) -> None:
        """One request accepted at this edge on ``port`` (writes only on the main port)."""
        addr = f["addr"]
        assert addr < CAPACITY, f"request to line {addr:#x} >= capacity {CAPACITY:#x}"
        if f["write"]:
            assert port.index == 0, "a write on the gradient port"
            assert f["strb"] == (1 << 64) - 1 and not f["poison"]
            self.mem[addr] = int_to_line(f["data"])
            self.lines_written += 1
            self.writes_by_line[addr] = self.writes_by_line.get(addr, 0) + 1
            due = cyc + self._latency(True)
            if self.model == "pmem":          # the media retire 0.32 writes per cycle
                self.write_free_at = max(self.write_free_at, cyc) + 1 / 0.32
                due = max(due, int(self.write_free_at))
            elif self.model == "channels":
                due = self._channel_due(addr, cyc, True)
            self.write_due[addr] = due
            self.n += 1
            ch = self._channel(addr)
            self.ch_out[(ch, True)] += 1
            heapq.heappush(self.wr_pending, (due, self.n, (f["ctx"], addr in self.write_errors, ch)))
            self.writes_out += 1
            return
        kind = Kind((f["ctx"] >> self.payload_bits) & ((1 << KIND_BITS) - 1))
        assert (kind == Kind.GRAD) == (port.index == 1), f"a {kind.name} read on port {port.name}"
        self.n += 1
        if self.model == "channels" and self.write_due.get(addr, -1) >= cyc:
            # As the device's channel master: a read of a line whose write is in flight is
            # answered from that write's data (forwarded), without the media.
            due = cyc + 2
        elif self.model == "channels":
            due = self._channel_due(addr, cyc, False)
        else:     # any latency, but after a pending write to the line (also legal)
            due = max(cyc + self._latency(False), self.write_due.get(addr, 0) + 1)
        heapq.heappush(self.rd_pending, (due, self.n, (port.index, (f["ctx"], line_to_int(self.mem[addr]),
                                                                    addr in self.poison, self._channel(addr)))))
        self.ch_out[(self._channel(addr), False)] += 1
        self.lines_read += 1
        self.reads_by_line[addr] = self.reads_by_line.get(addr, 0) + 1
        self.reads_out += 1
        self.max_reads_out = max(self.max_reads_out, self.reads_out)

    # ---------------------------------------------------------------- commands --
    async def run(self, cmd: dict, tables: list[dict], timeout: int = 400_000) -> dict:
        self.tables = [TAB.pack(**t) for t in tables]
        self.last_index = -1
        self.result = None
        self.reset_counters()
        self.pending_cmd = CMD.pack(**cmd)
        waited = 0
        while self.result is None:
            await Timer(200, unit="ns")
            waited += 100
            if self.error is not None:
                raise self.error
            assert waited < timeout, f"no done after {waited} cycles (seed {SEED})"
        await ClockCycles(self.dut.clk, 2)
        if self.error is not None:
            raise self.error
        assert not (self.rd_pending or self.wr_pending or self.wr_due or self.wr_driven
                    or any(p.rd_due or p.rd_driven for p in self.ports)), \
            f"done before every response was taken (seed {SEED})"
        self.result["max_reads_out"] = self.max_reads_out
        return self.result


# -------------------------------------------------------------------- workloads --
class Workload:
    """Tables in device memory plus their host copies (the golden state)."""

    def __init__(self, bench: Bench, specs: list[tuple[int, int, str]], rng: np.random.Generator, base: int = 64,
                 specials: bool = False):
        self.bench = bench
        self.rng = rng
        self.tables = []
        self.descs = []
        self.modes = [mode for _, _, mode in specs]
        line = base
        for rows, dim, mode in specs:
            table = rng.standard_normal((rows, dim)).astype(np.float32)
            if specials:
                sel = rng.random(table.shape) < 0.01
                table[sel] = rng.choice(np.array([np.nan, np.inf, -np.inf, 1e-42, -0.0, 3e38], np.float32),
                                        sel.sum())
            lines = dim // 16
            bench.mem[line:line + rows * lines] = table.view(np.uint32).reshape(rows * lines, 16)
            self.tables.append(table)
            self.descs.append(dict(base_addr=line, rows=rows, dim=dim, mode=MODES[mode], col_lines=0))
            line += rows * lines
        col = 0
        for d in self.descs:
            d["col_lines"] = col
            col += d["dim"] // 16
        # the host's pitch rule (odd: every channel in turn; sim/bfm/ndp_host.py)
        self.pitch = row_pitch_for([NdpTable(d["rows"], d["dim"], "sum") for d in self.descs])
        self.args = line + 16          # argument arrays go after the tables

    def device_table(self, t: int) -> np.ndarray:
        d = self.descs[t]
        lines = d["dim"] // 16
        raw = self.bench.mem[d["base_addr"]:d["base_addr"] + d["rows"] * lines]
        return raw.reshape(d["rows"], d["dim"]).view(np.float32)

    def batch(self, B: int, bag_len, pick_rows, lr: float = 0.05, specials: bool = False) -> dict:
        """Random arguments: bag_len(t, b) -> L, pick_rows(t, L) -> row indices."""
        T = len(self.tables)
        lengths = [[bag_len(t, b) for b in range(B)] for t in range(T)]
        offsets = np.zeros(T * B + 1, dtype=np.uint32)
        indices = []
        for t in range(T):
            for b in range(B):
                indices.extend(int(r) for r in pick_rows(t, lengths[t][b]))
                offsets[t * B + b + 1] = len(indices)
        indices = np.asarray(indices, dtype=np.uint32)
        weights = self.rng.standard_normal(max(len(indices), 1)).astype(np.float32)[:len(indices)]
        gouts = [self.rng.standard_normal((B, self.tables[t].shape[1])).astype(np.float32) for t in range(T)]
        if specials:
            for g in gouts:
                sel = self.rng.random(g.shape) < 0.01
                g[sel] = self.rng.choice(np.array([np.nan, np.inf, 1e-40, -0.0], np.float32), sel.sum())
        return dict(B=B, offsets=offsets, indices=indices, weights=weights, gouts=gouts, lr=np.float32(lr))

    def place(self, args: dict) -> dict:
        """Write the argument arrays into device memory; return the command fields."""
        mem = self.bench.mem
        line = self.args

        def put_u32(arr) -> int:
            nonlocal line
            start = line
            n = (len(arr) + 15) // 16
            buf = np.zeros(max(n, 1) * 16, dtype=np.uint32)
            buf[:len(arr)] = np.asarray(arr).view(np.uint32)
            mem[start:start + max(n, 1)] = buf.reshape(-1, 16)
            line += max(n, 1) + 1
            return start

        offsets_addr = put_u32(args["offsets"])
        indices_addr = put_u32(args["indices"])
        weights_addr = put_u32(args["weights"])
        grad_addr = line
        B = args["B"]
        for t, d in enumerate(self.descs):
            g = args["gouts"][t].view(np.uint32).reshape(B, -1, 16)
            for b in range(B):
                at = grad_addr + b * self.pitch + d["col_lines"]
                mem[at:at + g.shape[1]] = g[b]
        has_w = any(m == "weighted_sum" for m in self.modes)
        return dict(opcode=2, flags=int(has_w) << 1, tag=0x55, num_tables=len(self.tables), batch_size=B,
                    index_count=int(args.get("index_count", len(args["indices"]))),
                    tables_addr=0, offsets_addr=offsets_addr, indices_addr=indices_addr,
                    weights_addr=weights_addr, grad_addr=grad_addr, out_addr=0,
                    row_pitch_lines=self.pitch, lr=int(np.float32(args["lr"]).view(np.uint32)))

    def golden(self, args: dict) -> None:
        embedding.tbe_sgd_step(self.tables, args["offsets"], args["indices"], self.modes, args["B"],
                               args["gouts"], float(args["lr"]), args["weights"])

    def check_tables(self, what: str) -> None:
        for t, table in enumerate(self.tables):
            got = self.device_table(t)
            same = fp32_ref.same_fp32(got.view(np.uint32).ravel(), table.view(np.uint32).ravel())
            if not same.all():
                bad = np.flatnonzero(~same)
                r, c = np.unravel_index(bad[0], table.shape)
                raise AssertionError(
                    f"{what}: table {t} differs in {bad.size} floats (seed {SEED}); first at row {r} col {c}: "
                    f"got {int(got.view(np.uint32)[r, c]):08x} expected {int(table.view(np.uint32)[r, c]):08x}")

    def resync(self) -> None:
        for t in range(len(self.tables)):
            self.tables[t] = self.device_table(t).copy()

    def row_lines(self, args: dict) -> set[int]:
        """The memory lines of every row the batch updates."""
        B, offs, idx = args["B"], args["offsets"].astype(np.int64), args["indices"].astype(np.int64)
        out = set()
        for t, d in enumerate(self.descs):
            n = d["dim"] // 16
            for r in set(int(x) for x in idx[offs[t * B]:offs[(t + 1) * B]]):
                out.update(range(d["base_addr"] + r * n, d["base_addr"] + (r + 1) * n))
        return out

    def expected_traffic(self, args: dict) -> tuple[int, int, int]:
        """(lines read, lines written, distinct rows) when no row is evicted."""
        B, offs, idx = args["B"], args["offsets"].astype(np.int64), args["indices"].astype(np.int64)
        T = len(self.tables)
        n_off = (T * B) // 16 + 1
        total = int(offs[-1] - offs[0])
        idx_lines = 0 if total == 0 else int((offs[-1] - 1) // 16 - offs[0] // 16 + 1)
        has_w = any(m == "weighted_sum" for m in self.modes)
        grads = sum(int(np.count_nonzero(np.diff(offs[t * B:(t + 1) * B + 1]))) * self.descs[t]["dim"] // 16
                    for t in range(T))
        rows = {}                   # by first line: a table named twice has its rows once
        for t in range(T):
            n = self.descs[t]["dim"] // 16
            for r in idx[offs[t * B]:offs[(t + 1) * B]]:
                rows[self.descs[t]["base_addr"] + int(r) * n] = n
        row_lines = sum(rows.values())
        if total == 0:
            return n_off, 0, 0
        # The apply pass reads each table's run of offsets (B + 1) and of indices (and weights):
        # a line shared by two tables' runs is read for each.
        apply_off = sum(((t + 1) * B) // 16 - (t * B) // 16 + 1 for t in range(T))
        apply_idx = sum(int((offs[(t + 1) * B] - 1) // 16 - offs[t * B] // 16 + 1)
                        for t in range(T) if offs[(t + 1) * B] > offs[t * B])
        return (n_off + apply_off + idx_lines + apply_idx + (apply_idx if has_w else 0) + grads + row_lines,
                row_lines, len(rows))


async def setup(dut, model="random", seed_offset=0):
    print(f"TCXL_SEED={SEED} (scratch_lines={SCRATCH}, capacity={CAPACITY})")
    rng = random.Random(SEED * 7919 + seed_offset)
    cocotb.start_soon(Clock(dut.clk, 2, unit="ns").start())
    bench = Bench(dut, rng, model)
    dut.rst.value = 1
    dut.ctl__start.value = 0
    await ClockCycles(dut.clk, 4)
    dut.rst.value = 0
    await ClockCycles(dut.clk, 1)
    bench.start()
    return bench, np.random.default_rng([SEED, seed_offset])


def shift_offsets(args: dict, junk: list[int]) -> dict:
    """The same batch with ``junk`` indices placed before offsets[0]: the engine must refuse
    it (OFFSETS, offsets[0] != 0), as PyTorch does."""
    out = dict(args)
    out["offsets"] = args["offsets"] + np.uint32(len(junk))
    out["indices"] = np.concatenate([np.asarray(junk, dtype=np.uint32), args["indices"]])
    out["weights"] = np.concatenate([np.full(len(junk), np.nan, np.float32), args["weights"]])
    return out


def junk_after(args: dict, junk: list[int]) -> dict:
    """The same batch with ``junk`` indices (and NaN weights) after its last index, outside
    index_count: never read, never checked."""
    out = dict(args)
    out["index_count"] = len(args["indices"])
    out["indices"] = np.concatenate([args["indices"], np.asarray(junk, dtype=np.uint32)])
    out["weights"] = np.concatenate([args["weights"], np.full(len(junk), np.nan, np.float32)])
    return out


def tag_set_of(line: int) -> int:
    """The engine's tag set of a row address (hw/ndp/update/engine.py ``_hash``, scratch_lines / 2 sets)."""
    bits = SCRATCH.bit_length() - 2
    return ((line * 0x9E3779B1) & 0xFFFFFFFF) >> (32 - bits)


async def run_and_check(bench: Bench, wl: Workload, args: dict, what: str, *, exact_traffic=True,
                        placed: dict | None = None) -> dict:
    placed = args if placed is None else placed
    cmd = wl.place(placed)
    res = await bench.run(cmd, wl.descs)
    assert res["error"] == NdpError.OK.value, f"{what}: error {res['error']} info {res['error_info']:#x} (seed {SEED})"
    wl.golden(args)
    wl.check_tables(what)
    st = res["stats"]
    total = int(args["offsets"][-1])
    assert st["lookups"] == total, (what, st)
    assert st["lines_read"] == bench.lines_read and st["lines_written"] == bench.lines_written, (what, st)
    assert st["lines_pushed"] == 0
    # Every row read is written back at least once (the cleaner writes a row again when it is
    # hit after an eager write-back).
    assert st["rows_written"] >= st["rows_read"], (what, st)
    exp_read, exp_written, distinct = wl.expected_traffic(placed)
    if exact_traffic:
        # Every distinct row is read once and written at least once; nothing else is written.
        assert st["lines_read"] == exp_read, (what, st, exp_read)
        assert st["rows_read"] == distinct, (what, st, distinct)
        assert set(bench.writes_by_line) == wl.row_lines(placed), what
        assert len(bench.writes_by_line) == exp_written
    else:
        assert distinct <= st["rows_read"], (what, st, distinct)
    assert st["unique_rows"] == 0, (what, st)             # UPDATE does not count them (LOG does)
    res["distinct_rows"] = distinct
    print(f"{what}: {total} occurrences, {res['cycles']} cycles, {res['cycles'] / max(total, 1):.2f} cycles/occ, "
          f"stats {st}")
    return res


def uniform_bags(rng, lo, hi, empty=0.2):
    return lambda t, b: 0 if rng.random() < empty else int(rng.integers(lo, hi + 1))


def rows_with_dups(rng, wl: Workload, hot: int = 3):
    """Random rows with duplicates inside a bag and hot rows shared across bags."""
    def pick(t, n):
        rows = wl.tables[t].shape[0]
        out = []
        for _ in range(n):
            u = rng.random()
            if u < 0.3:
                out.append(int(rng.integers(0, min(hot, rows))))
            elif u < 0.45 and out:
                out.append(out[-1])
            else:
                out.append(int(rng.integers(0, rows)))
        return out
    return pick


# ------------------------------------------------------------------------- tests --
@cocotb.test()
async def test_mixed_modes(dut):
    """Random batches over SUM / MEAN / WEIGHTED_SUM tables of dims 16 and 32, several in a row."""
    bench, rng = await setup(dut, seed_offset=1)
    wl = Workload(bench, [(120, 16, "sum"), (80, 32, "mean"), (60, 16, "weighted_sum"), (40, 32, "sum")], rng,
                  specials=True)
    for k in range(4):
        args = wl.batch(int(rng.integers(3, 12)), uniform_bags(rng, 1, 6), rows_with_dups(rng, wl), specials=k == 3,
                        lr=float(rng.choice([0.05, 0.5, 1.0, 3e-3])))
        await run_and_check(bench, wl, args, f"mixed batch {k}", exact_traffic=SCRATCH >= 1024)
    # junk after the last index (out-of-range values, NaN weights) is neither read nor checked
    args = wl.batch(6, uniform_bags(rng, 1, 5), rows_with_dups(rng, wl))
    await run_and_check(bench, wl, args, "junk after the indices",
                        placed=junk_after(args, [0xFFFFFFFF, 7, 1 << 20, 0, 3] * 7), exact_traffic=SCRATCH >= 1024)
    # all bags empty: completes after validation, nothing written
    args = wl.batch(5, lambda t, b: 0, rows_with_dups(rng, wl))
    res = await run_and_check(bench, wl, args, "empty batch")
    assert bench.lines_written == 0 and res["stats"]["lookups"] == 0
    # many tables, several of them without any index, boundaries sharing offset lines
    specs = [(int(rng.integers(5, 40)), int(rng.choice([16, 32])), str(rng.choice(list(MODES)))) for _ in range(24)]
    wl2 = Workload(bench, specs, rng, base=wl.args + 64)
    empty_tables = set(rng.choice(24, 6, replace=False).tolist())
    args = wl2.batch(3, lambda t, b: 0 if t in empty_tables else int(rng.integers(0, 4)), rows_with_dups(rng, wl2))
    await run_and_check(bench, wl2, args, "24 tables", exact_traffic=SCRATCH >= 1024)


@cocotb.test()
async def test_hot_rows_and_dim256(dut):
    """A row hit many times back to back (dims 16, 32), and a dim-256 table next to a dim-16 one."""
    bench, rng = await setup(dut, seed_offset=2)
    wl = Workload(bench, [(10, 16, "sum"), (10, 32, "weighted_sum")], rng)
    args = wl.batch(4, lambda t, b: 25, lambda t, n: [3] * n)
    await run_and_check(bench, wl, args, "hot rows", exact_traffic=SCRATCH >= 1024)
    wl2 = Workload(bench, [(30, 256, "mean"), (50, 16, "sum")], rng, base=wl.args + 64)
    args = wl2.batch(6, uniform_bags(rng, 1, 5, empty=0.1), rows_with_dups(rng, wl2, hot=2))
    await run_and_check(bench, wl2, args, "dim 256", exact_traffic=SCRATCH >= 1024)
    # Every other occurrence is the hot row: it waits for its own FMA while the next one (another
    # row) issues and finishes first (the FMA window), and the MUL front, running ahead in
    # those waits, wraps the contribution ring: rings must still be freed in order.
    wl3 = Workload(bench, [(40, 64, "weighted_sum"), (40, 32, "mean")], rng, base=wl2.args + 64)
    alternate = lambda t, n: [0 if i % 2 == 0 else int(rng.integers(1, 40)) for i in range(n)]   # noqa: E731
    args = wl3.batch(8, lambda t, b: 12, alternate)
    await run_and_check(bench, wl3, args, "hot row between others", exact_traffic=SCRATCH >= 1024)


@cocotb.test()
async def test_shared_table_pair(dut):
    """Tables 0 and 1 name the same rows (one table twice; table 2 has no partner). The engine
    interleaves the bags of a table pair, so it must see the overlap (``serial``) and apply
    table 0's updates before table 1's: a hot row updated by both is exact only in that order."""
    bench, rng = await setup(dut, seed_offset=9)
    wl = Workload(bench, [(24, 32, "sum"), (24, 32, "weighted_sum"), (30, 16, "mean")], rng)
    wl.descs[1]["base_addr"] = wl.descs[0]["base_addr"]
    wl.tables[1] = wl.tables[0]                      # the golden model updates one array twice
    hot = lambda t, n: [int(x) for x in rng.integers(0, 3, n)]                 # noqa: E731
    args = wl.batch(12, uniform_bags(rng, 1, 4, empty=0.1), hot)
    await run_and_check(bench, wl, args, "one table twice", exact_traffic=False)
    # The same tables side by side (no overlap): interleaved, and still exact.
    wl2 = Workload(bench, [(24, 32, "sum"), (24, 32, "weighted_sum"), (30, 16, "mean")], rng, base=wl.args + 64)
    args = wl2.batch(12, uniform_bags(rng, 1, 4, empty=0.1), hot)
    await run_and_check(bench, wl2, args, "a pair side by side", exact_traffic=SCRATCH >= 1024)


@cocotb.test()
async def test_scratchpad_overflow(dut):
    """More distinct rows than the scratchpad holds: evictions, re-reads, still exact."""
    bench, rng = await setup(dut, seed_offset=3)
    wl = Workload(bench, [(600, 16, "sum"), (300, 32, "weighted_sum"), (200, 16, "mean")], rng)
    for k in range(2):
        args = wl.batch(24, uniform_bags(rng, 1, 12, empty=0.05), rows_with_dups(rng, wl, hot=4))
        res = await run_and_check(bench, wl, args, f"overflow batch {k}", exact_traffic=False)
        assert res["stats"]["rows_read"] > res["distinct_rows"] or SCRATCH >= 1024
    wl2 = Workload(bench, [(40, 256, "sum"), (100, 32, "mean")], rng, base=wl.args + 64)
    args = wl2.batch(16, uniform_bags(rng, 1, 6), rows_with_dups(rng, wl2, hot=2))
    await run_and_check(bench, wl2, args, "overflow dim 256", exact_traffic=False)
    # 12 rows of one tag set (8 ways): the set overflows, its unpinned rows are evicted
    wl3 = Workload(bench, [(20000, 16, "sum")], rng, base=wl2.args + 64)
    base = wl3.descs[0]["base_addr"]
    target = tag_set_of(base + 1)
    same_set = [r for r in range(20000) if tag_set_of(base + r) == target][:12]
    assert len(same_set) == 12
    args = wl3.batch(12, lambda t, b: 6, lambda t, n: rng.choice(same_set, n))
    res = await run_and_check(bench, wl3, args, "tag set conflicts", exact_traffic=False)
    assert res["stats"]["rows_read"] > 12, res["stats"]
    # One more row than slots, in turn: each miss evicts the row that comes next (the oldest),
    # so the next lookup is the victim's: its tag must be gone (the drop lands a cycle after
    # the insert; the manager waits that cycle), and its write-back must precede its re-read.
    n = SCRATCH + 1                                    # dim 16: one line per slot
    wl4 = Workload(bench, [(n + 7, 16, "sum")], rng, base=wl3.args + 64)
    turn = iter(range(1 << 30))
    args = wl4.batch(3 * n, lambda t, b: 1, lambda t, k: [next(turn) % n for _ in range(k)])
    res = await run_and_check(bench, wl4, args, "victim next", exact_traffic=False)
    assert res["stats"]["rows_read"] > 2 * n, res["stats"]


@cocotb.test()
async def test_errors(dut):
    """Each validation error ends before any write and the next command succeeds."""
    bench, rng = await setup(dut, seed_offset=4)
    wl = Workload(bench, [(50, 16, "sum"), (30, 32, "weighted_sum")], rng)

    async def expect_error(args, cmd_patch, descs, code, info, what, workload=None):
        cmd = (workload or wl).place(args)
        cmd.update(cmd_patch)
        before = bench.mem.copy()
        res = await bench.run(cmd, descs)
        assert (res["error"], res["error_info"]) == (code.value, info), \
            f"{what}: got error {res['error']} info {res['error_info']:#x}, expected {code} {info:#x} (seed {SEED})"
        assert bench.lines_written == 0 and np.array_equal(before, bench.mem), f"{what}: memory written"
        good = wl.batch(4, uniform_bags(rng, 1, 4), rows_with_dups(rng, wl))
        await run_and_check(bench, wl, good, f"good command after {what}")

    # offsets[5] < offsets[4]
    args = wl.batch(4, lambda t, b: 3, rows_with_dups(rng, wl))
    args["offsets"][5] = args["offsets"][4] - 1
    await expect_error(args, {}, wl.descs, NdpError.OFFSETS, 5, "decreasing offsets")
    # offsets[0] = 5 (PyTorch requires 0): OFFSETS at position 0
    args = wl.batch(4, lambda t, b: 2, rows_with_dups(rng, wl))
    await expect_error(shift_offsets(args, [0, 1, 2, 3, 4]), {}, wl.descs, NdpError.OFFSETS, 0, "offsets from 5")
    # offsets[T*B] differs from the descriptor's index count, either way: OFFSETS at position T*B
    for delta in (-1, 1):
        args = wl.batch(4, lambda t, b: 2, rows_with_dups(rng, wl))
        await expect_error(args, {"index_count": len(args["indices"]) + delta}, wl.descs, NdpError.OFFSETS, 8,
                           f"index count {delta:+d}")
    # a bag longer than 65535 (the divider's range), caught in the offsets
    args = wl.batch(4, lambda t, b: 1, rows_with_dups(rng, wl))
    args["offsets"][3:] += 70000
    await expect_error(args, {}, wl.descs, NdpError.OFFSETS, 3, "bag too long")
    # index >= rows in table 1 (rows = 30)
    args = wl.batch(4, lambda t, b: 3, rows_with_dups(rng, wl))
    pos = int(args["offsets"][4]) + 4
    args["indices"][pos] = 30
    await expect_error(args, {}, wl.descs, NdpError.INDEX_RANGE, pos, "index out of range")
    # An index out of range at the end of a batch that overflows the scratchpad: the apply pass
    # runs beside the index check (whose reads go last on the port, behind the fills) and has
    # evictions queued by the time the check finds it; none of them may be written.
    big = Workload(bench, [(200, 256, "sum")], rng, base=wl.args + 4096)
    args = big.batch(64, lambda t, b: 40, lambda t, n: [int(x) for x in rng.integers(0, 200, n)])
    args["indices"][-1] = 200
    await expect_error(args, {}, big.descs, NdpError.INDEX_RANGE, len(args["indices"]) - 1,
                       "index out of range after the scratchpad filled", workload=big)
    # the indices array (24 indices: 2 lines) runs past capacity
    args = wl.batch(4, lambda t, b: 3, rows_with_dups(rng, wl))
    await expect_error(args, {"indices_addr": CAPACITY - 1}, wl.descs, NdpError.ADDRESS, AddressFault.INDICES,
                       "indices outside")
    # the offsets array starts past capacity
    await expect_error(args, {"offsets_addr": CAPACITY}, wl.descs, NdpError.ADDRESS, AddressFault.OFFSETS,
                       "offsets outside")
    # table 1's rows run past capacity
    descs = [dict(d) for d in wl.descs]
    descs[1]["base_addr"] = CAPACITY - 10
    await expect_error(args, {}, descs, NdpError.ADDRESS, AddressFault.TABLE_ROWS + 1, "table outside")
    # the gradients of the last bag run past capacity: table 0's end just fits, table 1's does not
    await expect_error(args, {"grad_addr": CAPACITY - 4 * wl.pitch + 1}, wl.descs, NdpError.ADDRESS,
                       AddressFault.GRADIENTS, "gradients outside")


@cocotb.test()
async def test_media_error(dut):
    """A poisoned row read ends the command with MEDIA; the engine then works again."""
    bench, rng = await setup(dut, seed_offset=5)
    wl = Workload(bench, [(60, 16, "sum"), (40, 32, "mean")], rng)
    args = wl.batch(8, lambda t, b: 4, rows_with_dups(rng, wl))
    victim = wl.descs[1]["base_addr"] + 2 * int(args["indices"][args["offsets"][8 + 3]])
    bench.poison.add(victim)
    cmd = wl.place(args)
    res = await bench.run(cmd, wl.descs)
    assert (res["error"], res["error_info"]) == (NdpError.MEDIA.value, 5 << 24), res
    bench.poison.clear()
    wl.resync()                       # the rows of the failed batch are undefined
    for k in range(2):
        good = wl.batch(6, uniform_bags(rng, 1, 5), rows_with_dups(rng, wl))
        await run_and_check(bench, wl, good, f"good command {k} after MEDIA")
    # poisoned index line: caught in validation, nothing written
    args = wl.batch(8, lambda t, b: 4, rows_with_dups(rng, wl))
    cmd = wl.place(args)
    bench.poison.add(cmd["indices_addr"] + 1)
    before = bench.mem.copy()
    res = await bench.run(cmd, wl.descs)
    assert (res["error"], res["error_info"]) == (NdpError.MEDIA.value, 2 << 24), res
    assert np.array_equal(before, bench.mem)
    bench.poison.clear()
    # a row write-back answered with an error (the last batch's rows are written at the end)
    args = wl.batch(8, lambda t, b: 4, rows_with_dups(rng, wl))
    bench.write_errors.add(wl.descs[0]["base_addr"] + int(args["indices"][0]))
    res = await bench.run(wl.place(args), wl.descs)
    assert (res["error"], res["error_info"]) == (NdpError.MEDIA.value, 6 << 24), res
    bench.write_errors.clear()
    wl.resync()
    good = wl.batch(6, uniform_bags(rng, 1, 5), rows_with_dups(rng, wl))
    await run_and_check(bench, wl, good, "good command after a write error")


@cocotb.test()
async def test_perf(dut):
    """Cycles per occurrence with the PMEM-like memory (hot row, random rows, Zipf rows).

    ``*_marginal``: the difference between two batch sizes divided by the extra occurrences
    (the steady state, without the fixed cost of validation, first fills and the last writes).
    """
    bench, rng = await setup(dut, model="pmem", seed_offset=6)
    figures = {}

    async def measure(wl, B, L, pick, what, exact=False):
        args = wl.batch(B, lambda t, b: L, pick)
        res = await run_and_check(bench, wl, args, what, exact_traffic=exact)
        return res

    wl = Workload(bench, [(16, 16, "sum")], rng)
    small = await measure(wl, 1, 100, lambda t, n: [5] * n, "perf hot row dim 16 (100)", exact=True)
    big = await measure(wl, 4, 100, lambda t, n: [5] * n, "perf hot row dim 16 (400)", exact=True)
    figures["hot_row_dim16_cycles_per_occ"] = big["cycles"] / 400
    figures["hot_row_dim16_marginal"] = (big["cycles"] - small["cycles"]) / 300
    wlw = Workload(bench, [(16, 32, "weighted_sum")], rng, base=wl.args + 64)
    small = await measure(wlw, 1, 100, lambda t, n: [7] * n, "perf hot row dim 32 weighted (100)", exact=True)
    big = await measure(wlw, 4, 100, lambda t, n: [7] * n, "perf hot row dim 32 weighted (400)", exact=True)
    figures["hot_row_dim32_weighted_marginal"] = (big["cycles"] - small["cycles"]) / 300

    wl2 = Workload(bench, [(20000, 16, "sum")], rng, base=wlw.args + 64)
    pick = lambda t, n: rng.integers(0, 20000, n)                        # noqa: E731
    small = await measure(wl2, 64, 8, pick, "perf random dim 16 (512)")
    big = await measure(wl2, 512, 8, pick, "perf random dim 16 (4096, overflows)")
    figures["random_dim16_cycles_per_occ_512"] = small["cycles"] / 512
    figures["random_dim16_cycles_per_occ_4096"] = big["cycles"] / 4096
    figures["random_dim16_marginal"] = (big["cycles"] - small["cycles"]) / (4096 - 512)
    figures["random_dim16_max_reads_in_flight"] = big["max_reads_out"]
    wl3 = Workload(bench, [(4000, 64, "weighted_sum")], rng, base=wl2.args + 64)
    res = await measure(wl3, 64, 8, lambda t, n: rng.integers(0, 4000, n), "perf random dim 64 weighted (512)")
    figures["random_dim64_weighted_cycles_per_occ"] = res["cycles"] / 512
    figures["random_dim64_weighted_max_reads_in_flight"] = res["max_reads_out"]
    zipf = np.minimum(rng.zipf(1.2, 4096), 2000) - 1
    wl4 = Workload(bench, [(2000, 32, "sum")], rng, base=wl3.args + 64)
    it = iter(zipf)
    res = await measure(wl4, 128, 32, lambda t, n: [next(it) for _ in range(n)], "perf zipf dim 32 (4096)")
    figures["zipf_dim32_cycles_per_occ"] = res["cycles"] / 4096
    figures["zipf_dim32_rows_read"] = res["stats"]["rows_read"]
    print("PERF", json.dumps(figures))
    if os.environ.get("UE_PERF_JSON"):
        with open(os.environ["UE_PERF_JSON"], "w") as f:
            json.dump(figures, f)
    assert figures["hot_row_dim16_marginal"] < 5.5, figures
    assert figures["random_dim16_marginal"] < 4.5, figures


@cocotb.test()
async def test_tag_conflicts_under_backpressure(dut):
    """Rows of one tag set while the memory port accepts a request one cycle in ten: the miss
    queue is full when a conflict miss picks its victim, so the manager waits in CONF_CHK with
    the victim's slot record. (It once read the CLOCK hand's record there instead and wrote a
    row back to another row's address.)"""
    bench, rng = await setup(dut, seed_offset=9)
    bench.ready_p = 0.1
    wl = Workload(bench, [(20000, 16, "sum")], rng)
    base = wl.descs[0]["base_addr"]
    target = tag_set_of(base + 1)
    same_set = [r for r in range(20000) if tag_set_of(base + r) == target][:24]
    spread = [int(r) for r in rng.choice(20000, 4000, replace=False)]
    args = wl.batch(128, lambda t, b: 8,
                    lambda t, n: [int(rng.choice(same_set)) if rng.random() < 0.5 else int(rng.choice(spread))
                                  for _ in range(n)])
    res = await run_and_check(bench, wl, args, "tag set conflicts, stalled port", exact_traffic=False)
    assert res["stats"]["rows_read"] > len(same_set), res["stats"]


@cocotb.test()
async def test_rm4_trace(dut):
    """A batch of the rm4 preset's own trace (52 tables, 4 to 512 rows each after the cap,
    one index per bag, Zipf rows): tiny tables make rows that every bag updates. UE_MODEL /
    UE_BATCH replay another preset's batch (a performance study; CI runs rm4). Every table
    pools as SUM, as every preset's (rm1-rm4) does."""
    from sim.model.dlrm import get_preset
    from sim.model.trace import TraceKnobs, generate_trace
    bench, rng = await setup(dut, model=os.environ.get("UE_MEM_MODEL", "channels"), seed_offset=8)
    model = os.environ.get("UE_MODEL", "rm4")
    tr = generate_trace(get_preset(model), 1, SEED, TraceKnobs(rows_cap=int(os.environ.get("UE_ROWS_CAP", "400")),
                                                               batch_size=int(os.environ.get("UE_BATCH", "512"))))
    b = tr.batches[0]
    B = tr.batch_size
    wl = Workload(bench, [(t["rows"], t["dim"], "sum") for t in tr.manifest["tables"]], rng,
                  base=int(os.environ.get("UE_TABLE_BASE", "64")))
    off = b.offsets.astype(np.int64)
    bags_taken = [0] * len(wl.tables)

    def trace_bag(t: int, n: int) -> list[int]:
        """Table t's next bag of the trace (Workload.batch asks for the bags in order)."""
        k = bags_taken[t]
        bags_taken[t] += 1
        lo, hi = int(off[t * B + k]), int(off[t * B + k + 1])
        assert hi - lo == n
        return [int(r) for r in b.indices[lo:hi]]
    args = wl.batch(B, lambda t, k: int(off[t * B + k + 1] - off[t * B + k]), trace_bag)
    await run_and_check(bench, wl, args, f"{model} b{B} trace", exact_traffic=False)
