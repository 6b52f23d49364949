"""A minimal AXI4-Lite manager for cocotb that costs nothing while idle.

``AxiLiteManager(dut, "csr", clk)`` drives ``csr__awaddr`` ... (names from
hw/common/axi.py). ``await read(addr)`` -> int and ``await write(addr, data, strb=0xF)``
issue one transaction at a time (a lock serializes callers) and raise ``AxiLiteError``
on a SLVERR/DECERR response. Valid signals follow the AMBA rules (asserted without waiting
for ready, held until the handshake). ``abort()`` drives the manager idle after a cancelled
transaction (a power cut).

Why not cocotbext-axi here: its channel monitors wake on every clock cycle even when no
transaction is pending, which cost ~25% of simulation speed in the device regression; this
driver only wakes while a transaction is in progress. The CSR block's own tests still use
cocotbext-axi (tests/test_csr.py), so the two models check each other.
"""
from __future__ import annotations

from cocotb.triggers import RisingEdge, Lock

from hw.common.axi import AXI_RESP_OKAY


class AxiLiteError(Exception):
    pass


class AxiLiteManager:
    def __init__(self, dut, prefix: str, clk, *, timeout_cycles: int = 1000):
        self.clk = clk
        self.timeout = timeout_cycles
        self._lock = Lock()
        sig = lambda name: getattr(dut, f"{prefix}__{name}")   # noqa: E731
        for name in ("awaddr", "awprot", "awvalid", "awready", "wdata", "wstrb", "wvalid",
                     "wready", "bresp", "bvalid", "bready", "araddr", "arprot", "arvalid",
                     "arready", "rdata", "rresp", "rvalid", "rready"):
            setattr(self, name, sig(name))
        for name in ("awvalid", "wvalid", "bready", "arvalid", "rready", "awprot", "arprot"):
            getattr(self, name).value = 0

    def abort(self) -> None:
        """Forget the transaction in progress (its caller was cancelled, e.g. at a power cut):
        drive every manager signal idle and take a new lock. A cancelled task whose trigger
        never fires again does not unwind, so the old lock could stay held for good."""
        for name in ("awvalid", "wvalid", "bready", "arvalid", "rready"):
            getattr(self, name).value = 0
        self._lock = Lock()

    async def read(self, addr: int) -> int:
        async with self._lock:
            self.araddr.value = addr
            self.arvalid.value = 1
            self.rready.value = 1
            ar_done = False
            for _ in range(self.timeout):
                await RisingEdge(self.clk)
                if not ar_done and self.arready.value:
                    ar_done = True
                    self.arvalid.value = 0
                if self.rvalid.value and (ar_done or self.arready.value):
                    data, resp = int(self.rdata.value), int(self.rresp.value)
                    self.rready.value = 0
                    self.arvalid.value = 0
                    if resp != AXI_RESP_OKAY:
                        raise AxiLiteError(f"read {addr:#x}: response {resp:#04b}")
                    return data
            raise AxiLiteError(f"read {addr:#x}: no response in {self.timeout} cycles")

    async def write(self, addr: int, data: int, strb: int = 0xF) -> None:
        async with self._lock:
            self.awaddr.value = addr
            self.wdata.value = data
            self.wstrb.value = strb
            self.awvalid.value = 1
            self.wvalid.value = 1
            self.bready.value = 1
            aw_done = w_done = False
            for _ in range(self.timeout):
                await RisingEdge(self.clk)
                if not aw_done and self.awready.value:
                    aw_done = True
                    self.awvalid.value = 0
                if not w_done and self.wready.value:
                    w_done = True
                    self.wvalid.value = 0
                if self.bvalid.value:
                    resp = int(self.bresp.value)
                    self.bready.value = 0
                    if resp != AXI_RESP_OKAY:
                        raise AxiLiteError(f"write {addr:#x}: response {resp:#04b}")
                    return
            raise AxiLiteError(f"write {addr:#x}: no response in {self.timeout} cycles")
