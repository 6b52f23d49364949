"""CRC-32 (zlib's, reflected polynomial 0xEDB88320) over one 64-byte line per cycle.

``crc32_line(state, line)`` returns the combinational next CRC register: the register after
feeding the line's 64 bytes (byte i = bits 8i..8i+7, the device's little-endian line order)
into a register holding ``state``. Start from ``CRC_INIT`` and xor the final register with
``CRC_INIT``: the result equals ``zlib.crc32`` of the concatenated lines, which is what the
simulation's golden models compute. No pipeline: 32 xor trees of about 290 inputs each.

The register update without preset and final xor is linear over GF(2) in (state, data), so
its matrix is derived once, at elaboration, from zlib itself (one source for the polynomial).
"""
import zlib
from functools import lru_cache

from amaranth import Cat, Const, Value

from ..common.cxl_mem import LINE_BITS, LINE_BYTES
from .log_format import CRC_INIT


def crc32_register_update(state: int, line_bytes: bytes) -> int:
    """The raw register update (no preset, no final xor), in Python."""
    return ~zlib.crc32(line_bytes, ~state & 0xFFFF_FFFF) & 0xFFFF_FFFF


@lru_cache(maxsize=None)
def _masks() -> tuple[tuple[int, int], ...]:
    """Per output bit j: (state mask, data mask) whose parity gives bit j."""
    zero = bytes(LINE_BYTES)
    state_cols = [crc32_register_update(1 << i, zero) for i in range(32)]
    data_cols = [crc32_register_update(0, (1 << i).to_bytes(LINE_BYTES, "little")) for i in range(LINE_BITS)]
    masks = []
    for j in range(32):
        sm = sum(1 << i for i, col in enumerate(state_cols) if col >> j & 1)
        dm = sum(1 << i for i, col in enumerate(data_cols) if col >> j & 1)
        masks.append((sm, dm))
    return tuple(masks)


def crc32_line(state: Value, line: Value) -> Value:
    """Next CRC register after one line (32-bit ``state``, 512-bit ``line``)."""
    state = Const(state, 32) if isinstance(state, int) else Value.cast(state)
    bits = [(state & sm).xor() ^ (line & dm).xor() for sm, dm in _masks()]
    return Cat(*bits)


def crc32_single_line(line: Value) -> Value:
    """``zlib.crc32`` of one line (records): preset, one update, final xor."""
    return crc32_line(CRC_INIT, line) ^ CRC_INIT
