"""AXI4 and AXI4-Lite signatures (AMBA AXI IHI0022), from the manager's point of view.

Members use the AMBA signal names (``awaddr``, ``wvalid``...), so a port ``pmem0`` flattens
to ``pmem0__awaddr`` in Verilog and bus models bind by prefix (cocotbext-axi's
``AxiLiteBus.from_prefix(dut, "csr_")``). A subordinate port is ``In(signature)``.

AXI4 here is what the memory channels need: one 512-bit beat per 64-byte line, AxLEN/AxSIZE/
AxBURST present (the device issues single-beat INCR bursts), and one-bit ``wuser``/``ruser``
carrying data poison, so that poisoned lines stay poisoned in the media (AMBA allows
user-defined sideband on any channel).
"""
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

AXI_RESP_OKAY = 0b00
AXI_RESP_SLVERR = 0b10
AXI_RESP_DECERR = 0b11
AXI_BURST_INCR = 0b01


class Axi4Signature(wiring.Signature):
    """AXI4 manager interface with poison carried in WUSER/RUSER."""

    def __init__(self, *, addr_width, data_width=512, id_width=8):
        self.addr_width = addr_width
        self.data_width = data_width
        self.id_width = id_width
        strb = data_width // 8
        super().__init__({
            "awid": Out(id_width), "awaddr": Out(addr_width), "awlen": Out(8),
            "awsize": Out(3), "awburst": Out(2), "awvalid": Out(1), "awready": In(1),
            "wdata": Out(data_width), "wstrb": Out(strb), "wlast": Out(1), "wuser": Out(1),
            "wvalid": Out(1), "wready": In(1),
            "bid": In(id_width), "bresp": In(2), "bvalid": In(1), "bready": Out(1),
            "arid": Out(id_width), "araddr": Out(addr_width), "arlen": Out(8),
            "arsize": Out(3), "arburst": Out(2), "arvalid": Out(1), "arready": In(1),
            "rid": In(id_width), "rdata": In(data_width), "rresp": In(2), "rlast": In(1),
            "ruser": In(1), "rvalid": In(1), "rready": Out(1),
        })

    def __eq__(self, other):
        return (isinstance(other, Axi4Signature) and self.addr_width == other.addr_width
                and self.data_width == other.data_width and self.id_width == other.id_width)

    __hash__ = object.__hash__


class AxiLiteSignature(wiring.Signature):
    """AXI4-Lite manager interface (32-bit data by default)."""

    def __init__(self, *, addr_width, data_width=32):
        self.addr_width = addr_width
        self.data_width = data_width
        super().__init__({
            "awaddr": Out(addr_width), "awprot": Out(3), "awvalid": Out(1), "awready": In(1),
            "wdata": Out(data_width), "wstrb": Out(data_width // 8), "wvalid": Out(1),
            "wready": In(1),
            "bresp": In(2), "bvalid": In(1), "bready": Out(1),
            "araddr": Out(addr_width), "arprot": Out(3), "arvalid": Out(1), "arready": In(1),
            "rdata": In(data_width), "rresp": In(2), "rvalid": In(1), "rready": Out(1),
        })

    def __eq__(self, other):
        return (isinstance(other, AxiLiteSignature) and self.addr_width == other.addr_width
                and self.data_width == other.data_width)

    __hash__ = object.__hash__
