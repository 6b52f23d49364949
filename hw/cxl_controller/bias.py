"""Bias table for the device's own memory (HDM-D) and the engine that flips pages.

One bit per page of device memory (``pages`` pages of ``2**page_line_bits`` lines):
0 = host bias (reset: everything behaves as host bias), 1 = device bias.

Ports
- ``host_page`` In / ``host_device`` Out: the CXL.mem target's lookup of the page a host
  access touches (asynchronous read). ``host_to_host`` In / ``host_flip_page`` In: its
  one-cycle request to flip a page to host bias (the device caches no device-memory lines:
  nothing to flush); the target reads and flips in different cycles, so the two pages are
  separate ports.
- ``flip_page`` In, ``flip_to_device`` In, ``flip_seq`` In (8 bits): a CSR doorbell. When
  ``flip_seq`` differs from the last sequence served, the engine flips ``flip_page``:
  to host bias at once; to device bias by taking every line of the page from the host
  with ``ACQUIRE`` (RdOwnNoData, answered by MemRdFwd) on ``port`` and setting the bit once
  all lines are the device's. An error answer leaves the page in host bias and sets
  ``error``.
- ``hdm_base`` In: the HDM window base (line address), to form host addresses of the lines.
- ``busy`` Out, ``error`` Out, ``done_seq`` Out (the last sequence served).
- ``query_page`` In / ``query_device`` Out: a read of any page's bit, for software.
- ``port``: Out cache_port_signature(): the engine's client port into the CXL.cache agent
  (ids with BIAS_ENGINE_ID set).
- ``events``: ``to_device`` / ``to_host`` pulses (flips done).

A flip to device bias keeps at most ``window`` ACQUIREs in flight. Assumes the host answers
each one (MemRdFwd, or GO/GO-Err on CXL.cache).

Memory: one write port, two asynchronous read ports (LUT RAM; FPGA rules in
tools/mem_audit.py). A host flip writes in the cycle it is asked for; the engine's write of
the page bit waits for a cycle without one, so a flip may end a cycle later under host
traffic. A read in the cycle of a write returns the old bit (the write lands at the edge).

The request payload is driven outside the FSM, every field unconditionally (``data`` is 0:
an ACQUIRE carries none): it only matters while ``valid``, and a field that only a constant
drives in a signal also assigned under ``m.If``/``m.FSM`` becomes a constant-only ``always @*``
that Verilator never runs (ALWNEVER; tests/test_no_alwnever.py).
"""
from amaranth import Module, Signal, Mux
from amaranth.lib import wiring, memory, data
from amaranth.lib.wiring import In, Out

from ..common.cxl_mem import LINE_ADDR_BITS
from .cache_port import CacheOp, cache_port_signature, BIAS_ENGINE_ID


class BiasTable(wiring.Component):
    def __init__(self, *, pages: int, page_line_bits: int, window: int = 16):
        assert pages >= 2 and pages & (pages - 1) == 0
        self.pages = pages
        self.page_line_bits = page_line_bits
        self.window = window
        page_bits = (pages - 1).bit_length()
        super().__init__({
            "host_page": In(page_bits),
            "host_device": Out(1),
            "host_to_host": In(1),
            "host_flip_page": In(page_bits),
            "flip_page": In(page_bits),
            "flip_to_device": In(1),
            "flip_seq": In(8),
            "hdm_base": In(LINE_ADDR_BITS),
            "busy": Out(1),
            "error": Out(1),
            "done_seq": Out(8),
            "query_page": In(page_bits),
            "query_device": Out(1),
            "port": Out(cache_port_signature()),
            "events": Out(data.StructLayout({"to_device": 1, "to_host": 1})),
        })

    def elaborate(self, platform):
        m = Module()
        lines_per_page = 1 << self.page_line_bits
        # One write port and asynchronous reads: LUT RAM on an FPGA (the read ports are
        # replicas). The host's flip and the engine's share the write port (below).
        m.submodules.bits = bits = memory.Memory(shape=1, depth=self.pages, init=[])
        rd_host = bits.read_port(domain="comb")
        rd_query = bits.read_port(domain="comb")
        wr = bits.write_port()
        m.d.comb += [
            rd_host.addr.eq(self.host_page), self.host_device.eq(rd_host.data),
            rd_query.addr.eq(self.query_page), self.query_device.eq(rd_query.data),
        ]

        page = Signal.like(self.flip_page)
        issued = Signal(range(lines_per_page + 1))
        answered = Signal(range(lines_per_page + 1))
        failed = Signal()
        m.d.comb += self.busy.eq(self.done_seq != self.flip_seq)

        engine_write = Signal()          # the engine sets or clears a page bit this cycle
        engine_value = Signal()
        with m.FSM():
            with m.State("IDLE"):
                # The engine writes only in a cycle without a host flip (one write port).
                with m.If((self.done_seq != self.flip_seq) & ~self.host_to_host):
                    m.d.sync += [page.eq(self.flip_page), issued.eq(0), answered.eq(0),
                                 failed.eq(0)]
                    with m.If(self.flip_to_device):
                        m.next = "ACQUIRE"
                    with m.Else():
                        m.d.comb += [engine_write.eq(1), engine_value.eq(0),
                                     self.events.to_host.eq(1)]
                        m.d.sync += [self.done_seq.eq(self.flip_seq), self.error.eq(0)]
            with m.State("ACQUIRE"):
                in_flight = issued - answered
                m.d.comb += self.port.req.valid.eq((issued != lines_per_page) & (in_flight < self.window))
                with m.If(self.port.req.valid & self.port.req.ready):
                    m.d.sync += issued.eq(issued + 1)
                with m.If((answered == lines_per_page) & ~self.host_to_host):
                    m.d.comb += [engine_write.eq(~failed), engine_value.eq(1),
                                 self.events.to_device.eq(~failed)]
                    m.d.sync += [self.done_seq.eq(self.flip_seq), self.error.eq(failed)]
                    m.next = "IDLE"
        m.d.comb += [
            self.port.req.payload.op.eq(CacheOp.ACQUIRE),
            self.port.req.payload.addr.eq(
                self.hdm_base + ((page << self.page_line_bits) | issued[:self.page_line_bits])),
            self.port.req.payload.id.eq(BIAS_ENGINE_ID),
            self.port.req.payload.data.eq(0),
            self.port.rsp.ready.eq(1),
        ]
        with m.If(self.port.rsp.valid):
            m.d.sync += answered.eq(answered + 1)
            with m.If(self.port.rsp.payload.error):
                m.d.sync += failed.eq(1)

        # One write port: the host's flip to host bias has it whenever it asks (the access
        # it belongs to proceeds as host bias in that cycle); the engine's flip (to device:
        # the page it acquired; to host: the page asked for) waits for a cycle without one
        # (engine_write is never high together with host_to_host).
        engine_page = Mux(engine_value, page, self.flip_page)
        m.d.comb += [
            wr.addr.eq(Mux(self.host_to_host, self.host_flip_page, engine_page)),
            wr.data.eq(~self.host_to_host & engine_value),
            wr.en.eq(self.host_to_host | engine_write),
        ]
        return m
