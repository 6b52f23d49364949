"""Host CXL.mem BFM: drives M2S Req/RwD and receives S2M NDR/DRS at transaction level.

``CxlMemHost(dut, clk, rng, backpressure=p)``:
- ``send_req(**fields)`` / ``send_rwd(**fields)`` queue a message (fields of M2SReq/M2SRwD;
  any number outstanding, tags need not be unique). Messages go out in queue order per
  channel, as fast as the device accepts them.
- S2M ``ready`` is dropped at random with probability ``backpressure`` each cycle
  (reproducible from ``rng``).
- Every transfer is reported to the listeners (the protocol monitor, the scoreboard):
  ``on_m2s(seq, cycle, kind, fields)`` with ``seq`` the acceptance order, and
  ``on_s2m(cycle, kind, fields)``; ``kind`` is "req", "rwd", "ndr" or "drs".

One step per clock edge samples all four channels (values seen at a rising edge are the
pre-edge ones, so valid & ready there is a transfer at that edge) and drives the next
cycle's inputs through raw simulator handles; this keeps the Python cost per cycle low.
"""
from __future__ import annotations

import collections
import os
import random

import cocotb
from cocotb import simulator
from cocotb.triggers import RisingEdge

from hw.common.cxl_mem import M2SReq, M2SRwD, S2MNDR, S2MDRS
from ..model.codec import StructCodec

REQ = StructCodec(M2SReq)
RWD = StructCodec(M2SRwD)
NDR = StructCodec(S2MNDR)
DRS = StructCodec(S2MDRS)
_RISING = RisingEdge._edge_type


def _h(dut, name):
    return getattr(dut, name)._handle


class CxlMemHost:
    def __init__(self, dut, clk, *, rng: random.Random, backpressure: float = 0.0):
        self.clk = clk
        self.rng = rng
        self.backpressure = backpressure
        self.cycle = 0
        self.seq = 0
        self.listeners = []
        self._req_q: collections.deque[int] = collections.deque()
        self._rwd_q: collections.deque[int] = collections.deque()
        self._sig = {n: _h(dut, n) for n in (
            "m2s_req__valid", "m2s_req__ready", "m2s_req__payload",
            "m2s_rwd__valid", "m2s_rwd__ready", "m2s_rwd__payload",
            "s2m_ndr__valid", "s2m_ndr__ready", "s2m_ndr__payload",
            "s2m_drs__valid", "s2m_drs__ready", "s2m_drs__payload")}
        self._driven_req = None       # word currently on m2s_req (None = valid low)
        self._driven_rwd = None
        self._ndr_ready = 0
        self._drs_ready = 0
        self._task = None
        self._cbhdl = None
        self._running = False
        self.error: Exception | None = None    # raised by the step; re-raised by the env
        s = self._sig
        self._h_req_ready = s["m2s_req__ready"]
        self._h_rwd_ready = s["m2s_rwd__ready"]
        self._h_ndr_valid = s["s2m_ndr__valid"]
        self._h_drs_valid = s["s2m_drs__valid"]
        self._h_drs_payload = s["s2m_drs__payload"]
        # An NDR fits in 32 bits: read it as an integer, not as a bit string.
        ndr_payload = s["s2m_ndr__payload"]
        self._read_ndr = (ndr_payload.get_signal_val_long if NDR.width <= 32 else
                          lambda: int(ndr_payload.get_signal_val_binstr(), 2))
        self._req_fmt = f"0{REQ.width}b"
        self._rwd_fmt = f"0{RWD.width}b"
        self.enabled = True

    # ---- API
    def send_req(self, **fields) -> int:
        word = REQ.pack(**fields)
        self._req_q.append(word)
        return word

    def send_rwd(self, **fields) -> int:
        word = RWD.pack(**fields)
        self._rwd_q.append(word)
        return word

    @property
    def pending(self) -> int:
        return len(self._req_q) + len(self._rwd_q)

    def reset_link(self):
        """Forget queued messages and drive every input idle (a power failure)."""
        self._req_q.clear()
        self._rwd_q.clear()
        s = self._sig
        s["m2s_req__valid"].set_signal_val_int(0, 0)
        s["m2s_rwd__valid"].set_signal_val_int(0, 0)
        self._driven_req = self._driven_rwd = None

    # ---- the per-cycle work
    def start(self):
        """Run ``_step`` at every rising clock edge.

        The step is a plain function registered directly as the simulator's value-change
        callback on the clock (what ``RisingEdge`` uses underneath), re-registered at every
        edge: this skips cocotb's task scheduling, which costs several times more per cycle
        than the step itself. ``COCOTB_HOST_COROUTINE=1`` uses an ordinary coroutine.
        """
        self._running = True
        if os.environ.get("COCOTB_HOST_COROUTINE") == "1":
            self._task = cocotb.start_soon(self._run_coroutine())
        else:
            self._clk_handle = self.clk._handle
            self._register()

    def stop(self):
        self._running = False
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self._cbhdl is not None:
            self._cbhdl.deregister()
            self._cbhdl = None

    def _register(self):
        self._cbhdl = simulator.register_value_change_callback(
            self._clk_handle, self._on_edge, _RISING)

    def _on_edge(self):
        self._cbhdl = None
        if not self._running:
            return
        try:
            self._step()
        except Exception as exc:          # a checker or BFM bug: stop, and let the test see it
            self.error = exc
            self._running = False
            return
        self._register()

    async def _run_coroutine(self):
        edge = RisingEdge(self.clk)
        while True:
            await edge
            self._step()

    def _step(self):
        self.cycle += 1
        cycle = self.cycle
        listeners = self.listeners
        # -- transfers at this edge (values seen at the edge are the pre-edge ones)
        if self._driven_req is not None and self._h_req_ready.get_signal_val_long():
            fields = REQ.unpack(self._req_q.popleft())
            self._driven_req = None
            for lst in listeners:
                lst.on_m2s(self.seq, cycle, "req", fields)
            self.seq += 1
        if self._driven_rwd is not None and self._h_rwd_ready.get_signal_val_long():
            fields = RWD.unpack(self._rwd_q.popleft())
            self._driven_rwd = None
            for lst in listeners:
                lst.on_m2s(self.seq, cycle, "rwd", fields)
            self.seq += 1
        if self._ndr_ready and self._h_ndr_valid.get_signal_val_long():
            fields = NDR.unpack(self._read_ndr())
            for lst in listeners:
                lst.on_s2m(cycle, "ndr", fields)
        if self._drs_ready and self._h_drs_valid.get_signal_val_long():
            fields = DRS.unpack(int(self._h_drs_payload.get_signal_val_binstr(), 2))
            for lst in listeners:
                lst.on_s2m(cycle, "drs", fields)
        if not self.enabled:
            return
        # -- drive the next cycle
        s = self._sig
        if self._driven_req is None:
            if self._req_q:
                self._driven_req = self._req_q[0]
                s["m2s_req__payload"].set_signal_val_binstr(
                    0, format(self._driven_req, self._req_fmt))
                s["m2s_req__valid"].set_signal_val_int(0, 1)
            else:
                s["m2s_req__valid"].set_signal_val_int(0, 0)
        if self._driven_rwd is None:
            if self._rwd_q:
                self._driven_rwd = self._rwd_q[0]
                s["m2s_rwd__payload"].set_signal_val_binstr(
                    0, format(self._driven_rwd, self._rwd_fmt))
                s["m2s_rwd__valid"].set_signal_val_int(0, 1)
            else:
                s["m2s_rwd__valid"].set_signal_val_int(0, 0)
        if self.backpressure:
            ndr_r = 0 if self.rng.random() < self.backpressure else 1
            drs_r = 0 if self.rng.random() < self.backpressure else 1
        else:
            ndr_r = drs_r = 1
        if ndr_r != self._ndr_ready:
            s["s2m_ndr__ready"].set_signal_val_int(0, ndr_r)
            self._ndr_ready = ndr_r
        if drs_r != self._drs_ready:
            s["s2m_drs__ready"].set_signal_val_int(0, drs_r)
            self._drs_ready = drs_r
