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
    return crc32_state_part(state) ^ crc32_data_part(line)


def crc32_state_part(state: Value) -> Value:
    """The register update's state part: ``crc32_line(state, 0)`` (32 inputs per bit)."""
    state = Const(state, 32) if isinstance(state, int) else Value.cast(state)
    return Cat(*[(state & sm).xor() for sm, _ in _masks()])


def crc32_data_part(line: Value) -> Value:
    """The register update's data part: ``crc32_line(0, line)``. By linearity
    ``crc32_line(s, d) = crc32_state_part(s) ^ crc32_data_part(d)``, so the data part can be
    computed a stage ahead of the recurrence (and of a mask that is itself linear: the part of
    ``d & mask`` is that of ``d`` xor that of ``d & ~mask``)."""
    line = Value.cast(line)
    return Cat(*[(line & dm).xor() for _, dm in _masks()])


def crc32_single_line(line: Value) -> Value:
    """``zlib.crc32`` of one line (records): preset, one update, final xor."""
    return crc32_line(CRC_INIT, line) ^ CRC_INIT
