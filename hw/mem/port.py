"""The device-internal memory port: what a client of the memory subsystem sees.

A client sends ``MemRequest`` beats (one 64-byte line each, read or write, in one stream so
that their order is the client's program order) and receives ``MemReadResponse`` and
``MemWriteResponse`` beats. ``ctx`` is opaque to the memory subsystem and comes back
unchanged with the response, so a client needs no tracking table of its own.

Guarantees of the memory subsystem (hw/mem/interleave.py; "accepted" = granted by the line's
channel, which for one client port is its program order):
- A read accepted after a write to the same line returns that write's data (or newer).
- Writes to one line reach the media in acceptance order.
- A write response means the line is in the persistence domain (the media's B response).
- Responses may come back in any order across lines (``ctx`` tells them apart).
"""
from amaranth import Signal
from amaranth.lib import data

from ..common.cxl_mem import LINE_BITS, LINE_BYTES


def mem_request_layout(addr_bits: int, ctx_bits: int) -> data.StructLayout:
    return data.StructLayout({
        "write": 1,
        "addr": addr_bits,           # device line address (byte address >> 6)
        "strb": LINE_BYTES,          # byte enables, writes only
        "poison": 1,                 # writes only: store the line poisoned
        "data": LINE_BITS,           # writes only
        "ctx": ctx_bits,
    })


def mem_read_response_layout(ctx_bits: int) -> data.StructLayout:
    return data.StructLayout({
        "data": LINE_BITS,
        "poison": 1,                 # the stored line is poisoned
        "error": 1,                  # the media answered SLVERR/DECERR
        "ctx": ctx_bits,
    })


def mem_write_response_layout(ctx_bits: int) -> data.StructLayout:
    return data.StructLayout({
        "error": 1,
        "ctx": ctx_bits,
    })


def split_line_address(line: int, channels: int) -> tuple[int, int]:
    """Device line address -> (channel, channel-local line). Lines interleave round-robin.

    This is the hardware's mapping (hw/mem/interleave.py uses the same bit split); the
    testbench imports it to find a line in the media models.
    """
    return line % channels, line // channels


class RequestSource:
    """One requester inside a client that merges several into its one memory port (the
    UPDATE engine, the undo log): ``valid``/``ready`` and the request's ``write``, ``addr``,
    ``data`` and ``ctx``, as signals named ``<name>_req_<field>``. The client's merge picks
    among them (fixed priority) into its request register."""

    def __init__(self, name: str, addr_bits: int, ctx_bits: int):
        self.valid = Signal(name=f"{name}_req_valid")
        self.ready = Signal(name=f"{name}_req_ready")
        self.write = Signal(name=f"{name}_req_write")
        self.addr = Signal(addr_bits, name=f"{name}_req_addr")
        self.data = Signal(LINE_BITS, name=f"{name}_req_data")
        self.ctx = Signal(ctx_bits, name=f"{name}_req_ctx")
