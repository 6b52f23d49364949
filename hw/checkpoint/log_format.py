"""The persistent checkpoint format: log region layout, record lines and undo-log entries (one source).

Everything here is in device PMEM and survives a power failure (architecture.md §6). The
engines (hw/checkpoint/), the command processor and the simulation golden models
(sim/model/checkpoint.py) all take layouts and constants from this file.

Region geometry comes from CSRs (``CKPT_*``, hw/cxl_controller/csr_map.py) as a ``LogRegion``
(``log_region_fits``: the embedding log's bounds check, one form for every user):

Embedding undo log: two slots, batch k uses slot ``k & 1``, slot s at
``log_base + s * slot_lines``:

| line | content |
|---|---|
| 0 | ``LogRecord`` state LOGGED: batch k's log is complete (written after every entry is acked) |
| 1 | ``LogRecord`` state APPLIED: batch k's update is complete (written after every row is acked) |
| 2 .. | entry groups, packed: an ``EntryGroup`` line, then its entries' old values (dim/16 lines each) |

Entries are numbered in slot order; entry n belongs to group n // GROUP_ENTRIES, in its
``entries[n % GROUP_ENTRIES]``. A group line therefore precedes the payloads of up to
GROUP_ENTRIES entries (the last group may hold fewer; its unused ``EntryInfo`` are zero).
The LOGGED record's ``count`` is the number of entries and ``lines`` the slot lines they take
(payload lines plus one group line per GROUP_ENTRIES entries, rounded up). Sharing the header
line saves the LOG engine's write bandwidth: a dim-32 row costs 2.25 written lines, not 3.

MLP log: two slots (the host picks one with ``CommandFlags.mlp_slot``), slot s at
``mlp_base + s * (1 + mlp_lines)``: line 0 is a ``LogRecord`` state MLP_LOGGED, lines
1 .. mlp_lines hold the copy of the GPU's parameter image (``mlp_lines`` 64-byte lines read
from host line address ``mlp_host_addr`` with CXL.cache RdCurr).

Validity: a record counts only if its ``magic`` matches and its ``crc`` equals ``zlib.crc32``
over its bytes with the ``crc`` field zero. An entry counts only if its group line's ``magic``
is GROUP_MAGIC and its ``EntryInfo.crc`` equals ``zlib.crc32`` over its ``EntryCrcPrefix``
line (ENTRY_MAGIC, the group's batch, the entry's table, dim_lines, row, row_addr; rest zero)
followed by its payload lines. A record torn by a power failure (each 8-byte word old or
new) or never written is therefore treated as absent. Correctness does not rest on the CRC:
an entry is used only when its slot's LOGGED record is valid, and that record is written only
after every entry and group line write was acknowledged (durable); the CRC is the second line
of defence against media faults and what the recovery engine checks (error LOG_CORRUPT).

Batch numbers: batch k is the (k+1)-th training batch. "Applied batches" n means the tables
hold the state after batches 0 .. n-1 (n = 0: the initial tables). The MLP log taken during
batch k holds the parameters after k applied batches.
"""
from amaranth import Value
from amaranth.lib import data, enum

from ..common.cxl_mem import LINE_ADDR_BITS

LOG_MAGIC = 0x4C58_4354          # "TCXL" in little-endian bytes
ENTRY_MAGIC = 0x4E45_4354        # "TCEN": the first word of an entry's CRC prefix line
GROUP_MAGIC = 0x5247_4354        # "TCGR": an entry group line
GROUP_ENTRIES = 4                # entries per group line
CRC_INIT = 0xFFFF_FFFF           # zlib.crc32's register preset (and final xor)

RECORD_LINE_LOGGED = 0           # slot line of the LOGGED record
RECORD_LINE_APPLIED = 1          # slot line of the APPLIED record
SLOT_HEADER_LINES = 2            # entries start here
MIN_SLOT_LINES = SLOT_HEADER_LINES + 1   # smallest usable slot: the record lines and one more


class LogState(enum.Enum, shape=8):
    FREE = 0                     # written to invalidate a slot before it is reused
    LOGGED = 1                   # embedding undo log of ``batch`` complete: ``count`` entries, ``lines`` lines
    APPLIED = 2                  # the update of ``batch`` is complete (rows durable)
    MLP_LOGGED = 3               # MLP image of ``batch`` complete: ``count`` bytes, ``lines`` lines


class LogRecord(data.Struct):
    """A slot's record line (fields from bit 0; the rest of the line is zero)."""
    magic: 32
    state: LogState
    slot: 8                      # the slot this record belongs to (0 or 1)
    reserved: 16
    batch: 32
    count: 32                    # LOGGED: entries; MLP_LOGGED: bytes copied (the byte counter)
    lines: 32                    # LOGGED: lines after the slot header; MLP_LOGGED: image lines
    crc: 32                      # zlib.crc32 of the 64-byte line with this field zero


class EntryCrcPrefix(data.Struct):
    """The line an entry's CRC starts with (fields from bit 0, the rest zero; never stored):
    ``EntryInfo.crc`` = zlib.crc32 of this line followed by the entry's payload lines."""
    magic: 32                    # ENTRY_MAGIC
    batch: 32                    # the group line's batch
    table: 16
    dim_lines: 8
    reserved: 8
    row: 32
    row_addr: 32


class EntryInfo(data.Struct):
    """One entry's description in its group line."""
    row_addr: 32                 # device line address of the row's first line
    row: 32
    crc: 32                      # see EntryCrcPrefix
    table: 8                     # < MAX_TABLES (128)
    dim_lines: 8                 # 1 .. 16: payload lines (the row's dim / 16)


class EntryGroup(data.Struct):
    """A group line: the descriptions of up to GROUP_ENTRIES entries whose payloads follow it."""
    magic: 32                    # GROUP_MAGIC
    batch: 32                    # the batch whose log this is
    entries: data.ArrayLayout(EntryInfo, GROUP_ENTRIES)


class LogRegion(data.Struct):
    """Checkpoint geometry, from the CKPT_* CSRs (device line addresses unless noted)."""
    log_base: 32                 # embedding log: two slots of ``slot_lines`` lines
    slot_lines: 32
    mlp_base: 32                 # MLP log: two slots of 1 + ``mlp_lines`` lines
    mlp_lines: 32                # the GPU's MLP parameter image, in 64-byte lines
    mlp_host_addr: LINE_ADDR_BITS  # host line address of that image (CXL.cache)


def record_crc_offset() -> int:
    """Bit offset of ``LogRecord.crc`` within the line."""
    return LogRecord.as_shape()["crc"].offset


def group_lines(entries: int) -> int:
    """Group lines that ``entries`` entries take."""
    return -(-entries // GROUP_ENTRIES)


def log_region_end(region) -> Value:
    """First line after the embedding log's two slots: ``log_base + 2*slot_lines`` (34 bits, no wrap).
    ``region``: a LogRegion view."""
    return region.log_base + (region.slot_lines << 1)


def log_region_fits(region, capacity_lines: int) -> Value:
    """1 iff the embedding log region is usable: ``slot_lines >= MIN_SLOT_LINES`` and both slots
    end inside device memory (``log_region_end <= capacity_lines``); else the engines report
    ADDRESS / AddressFault.LOG_REGION. ``region``: a LogRegion view."""
    return (region.slot_lines >= MIN_SLOT_LINES) & (log_region_end(region) <= capacity_lines)


def emb_slot_base(region_log_base: int, slot_lines: int, batch: int) -> int:
    """Line address of batch ``batch``'s embedding slot (Python-side helper)."""
    return region_log_base + (batch & 1) * slot_lines


def mlp_slot_base(mlp_base: int, mlp_lines: int, slot: int) -> int:
    return mlp_base + slot * (1 + mlp_lines)
