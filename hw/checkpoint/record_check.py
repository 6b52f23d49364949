"""Record-line validity, combinational: the one RTL form of "this record counts" (hw/checkpoint/log_format.py).

``record_valid(line, slot=, state=, batch=None, crc=None)`` is 1 iff the 512-bit record line
``line`` has ``magic`` LOG_MAGIC, its ``crc`` field equals zlib.crc32 of the line with that
field zero, and its ``slot`` and ``state`` fields equal ``slot`` and ``state`` (and its
``batch`` equals ``batch`` when one is given). Its golden twin is
``sim.model.checkpoint.record_valid``. ``crc``: the zlib.crc32 of the line with the crc
field zero when the caller already computes it (a CRC unit shared with other lines, as in
the recovery engine); without it one ``crc32_single_line`` (hw/checkpoint/crc.py) is built
here. No register: the caller decides when the line is looked at. ``record_fields_valid`` (all but
the CRC) and ``record_crc_diff`` (zero iff the CRC matches) are the same check in two parts,
for a caller that registers them apart: ``record_valid`` = fields valid & crc diff == 0.

Users: the command processor's checkpointed-UPDATE pre-check (slot k mod 2's LOGGED record
of batch k, hw/ndp/processor.py) and the recovery engine's record reads
(hw/checkpoint/recovery.py).
"""
from amaranth import Const, Value

from ..common.cxl_mem import LINE_BITS
from .crc import crc32_single_line
from .log_format import LOG_MAGIC, LogRecord, LogState, record_crc_offset

RECORD_CRC_MASK = Const(0xFFFF_FFFF << record_crc_offset(), LINE_BITS)      # the crc field's bits


def record_crc_input(line: Value) -> Value:
    """The line as its CRC covers it: the crc field zero."""
    return line & ~RECORD_CRC_MASK


def record_fields_valid(line: Value, *, slot, state: LogState, batch=None) -> Value:
    """``record_valid`` without the CRC compare: magic, slot, state (and batch) only. For a
    caller that registers the CRC compare and these checks apart (timing) and ands them."""
    line = Value.cast(line)
    rec = LogRecord(line[:LogRecord.as_shape().size])
    ok = (rec.magic == LOG_MAGIC) & (rec.slot == slot) & (rec.state == state)
    if batch is not None:
        ok = ok & (rec.batch == batch)
    return ok


def record_crc_diff(line: Value) -> Value:
    """32 bits, zero iff the record's ``crc`` field equals zlib.crc32 of ``line`` with that field
    zero (the CRC check of ``record_valid``, before its final compare against 0)."""
    line = Value.cast(line)
    return crc32_single_line(record_crc_input(line)) ^ LogRecord(line[:LogRecord.as_shape().size]).crc


def record_valid(line: Value, *, slot, state: LogState, batch=None, crc=None) -> Value:
    """1-bit validity of the record in ``line`` (see the module docstring)."""
    line = Value.cast(line)
    rec = LogRecord(line[:LogRecord.as_shape().size])
    if crc is None:
        crc = crc32_single_line(record_crc_input(line))
    return record_fields_valid(line, slot=slot, state=state, batch=batch) & (crc == rec.crc)
