"""Golden model of the persistent checkpoint: records, undo-log entries, recovery and training state.

Contract
--------
Pure Python / numpy, no simulator. Every layout and constant comes from
hw/checkpoint/log_format.py (``LogRecord``, ``EntryGroup``, ``EntryInfo``, ``EntryCrcPrefix``,
``LogRegion``, ``LogState``, the magics, GROUP_ENTRIES, slot line numbers) through
``StructCodec``; no offset is typed here. Lines are 512-bit ints, byte i = bits 8i..8i+7 (the
device's little-endian line order); a record's CRC is ``zlib.crc32`` of its bytes with the
``crc`` field zero, an entry's that of its EntryCrcPrefix line followed by its payload lines.

Records and entries
- ``pack_record(state, slot, batch, count=0, lines=0)`` -> line (crc filled in);
  ``unpack_record(line)`` -> dict; ``record_valid(line, slot=, state=, batch=)``: magic, crc
  and (when given) the slot field, the state and the batch.
- ``LogEntry(table, row, row_addr, payload, crc=None)``: one entry (crc None = the right one);
  ``pack_entries(batch, entries)`` -> the slot lines they take after the slot header (per
  GROUP_ENTRIES entries a group line, then their payloads); ``entry_crc(...)``;
  ``entry_problem(group_line, place, payload, batch=)`` -> None or why the entry in that place
  of the group line is invalid (group magic, dim_lines, crc, batch); ``entry_valid`` is its
  boolean; ``walk_entries`` parses a slot's entries the way recovery does.
- ``torn_line(old, new, new_words)``: the power-failure tear (architecture.md §6): 8-byte
  word w is ``new``'s when bit w of ``new_words`` is set, else ``old``'s.

Geometry: ``CheckpointRegion`` is the Python twin of ``LogRegion`` (the CKPT_* CSRs): ``slot_base(s)``,
``emb_slot(batch)``, ``mlp_slot(s)`` give slot base lines; ``pack()`` gives the LogRegion int.

What a LOG must write
- ``expected_log_entries(tables, offsets, indices, batch_size, layout)`` -> {(t, row):
  ExpectedEntry(row_addr, dim_lines, payload)} for every DISTINCT (table, row) the batch's
  indices touch (table t's indices are indices[offsets[t*B] : offsets[(t+1)*B]]), payload =
  the row's current value as lines; ``layout`` has ``row_line(t, row)`` (a DeviceLayout) or
  is such a callable.
- ``check_log_slot(read_line, region, batch, expected, applied=None)`` -> list of mismatch
  strings (empty = the slot is right): slot ``batch & 1`` must hold a valid LOGGED record
  {batch, slot, count = len(expected), lines = ``entries_lines``}; walking the entries
  from slot line 2, each must be valid, of ``batch``, a key of ``expected`` seen once, and
  equal to it (row_addr, dim_lines, payload). Entry order is free (compared as a set).
  ``applied`` True / False also requires the APPLIED record {batch, slot, count, lines}
  to be valid / not valid for ``batch``.

Writers for scripted images (what the device writes, in its order): ``write_log_slot``
(FREE at line 0, entries, then LOGGED), ``write_applied``, ``write_mlp_log`` (FREE, image,
MLP_LOGGED, FREE of the other slot). Memories are dict-like ({line: int}, missing = 0).

Recovery: ``golden_recover(memory, region, apply=True)`` -> ``RecoveryResult``:
- a record is valid when magic, crc, its slot field (= the slot it is in) and the state
  expected at its line all match;
- embedding: the valid LOGGED record with the highest batch k (slot s). If the APPLIED
  record of slot s is valid with batch k: emb_batches = k + 1, nothing written. Else every
  entry (count of them, from slot line 2, in groups: a group line, then its entries'
  payloads) is verified: group magic, crc, dim_lines in 1..16, batch == k, inside the
  ``lines`` the record states and inside the slot, and the entries must take exactly those
  ``lines``; any bad entry -> error LOG_CORRUPT and NO row written. Otherwise every
  entry's payload is written to its row_addr (in log order), emb_batches = k,
  rolled_back = True. No valid LOGGED record: emb_valid = False, emb_batches = 0.
- MLP: the valid MLP_LOGGED record (at MLP slot line 0, lines == mlp_lines) with the
  highest batch: mlp_valid, mlp_batch, mlp_slot. The MLP result is computed even when the
  embedding part fails.
- On LOG_CORRUPT only ``error`` and "no row written" are the contract; the other embedding
  fields then report the slot found (emb_valid, emb_batches = k, rolled_back False).
Recovery writes only table rows, never the log, so running it twice gives the same tables
and the same result (idempotent; a crash during recovery is recovered by recovering again).

Training state: ``CheckpointedTraining(tables, modes, batch_size, batches, grads, lr,
mlp=None)``: ``tables_after(n)`` = the tables after n applied batches (sim/model/embedding
``tbe_sgd_step`` applied to batches 0..n-1; snapshots cached, ``forget_before(n)`` drops
those before n), ``expected_log(k, layout)``
= ``expected_log_entries`` of batch k on ``tables_after(k)``, and ``mlp_image(k)`` = the MLP
image an MLP log taken during batch k must hold: the parameters after k applied batches
(``mlp.image_lines(k)``, a GpuAgent of sim/bfm/gpu_agent.py or any object with it);
``mlp_image_chunks([(j, offset, count), ...])`` = the image of a relaxed MLP log whose chunks
were copied during different batches j.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from hw.checkpoint.log_format import (ENTRY_MAGIC, GROUP_ENTRIES, GROUP_MAGIC, LOG_MAGIC, RECORD_LINE_APPLIED,
                                      RECORD_LINE_LOGGED, SLOT_HEADER_LINES, EntryCrcPrefix, EntryGroup, EntryInfo,
                                      LogRecord, LogRegion, LogState, emb_slot_base, group_lines, mlp_slot_base)
from hw.common.cxl_mem import LINE_BYTES
from hw.ndp.command import FLOATS_PER_LINE, NdpError
from sim.model import embedding
from sim.model.codec import StructCodec

RECORD = StructCodec(LogRecord)
GROUP = StructCodec(EntryGroup)
INFO = StructCodec(EntryInfo)
PREFIX = StructCodec(EntryCrcPrefix)
INFO_OFFSET = EntryGroup.as_shape()["entries"].offset   # bit offset of EntryInfo 0 in a group line
REGION = StructCodec(LogRegion)

WORD_BYTES = 8
WORDS_PER_LINE = LINE_BYTES // WORD_BYTES
MAX_DIM_LINES = 16
_WORD_MASK = (1 << 64) - 1


# --------------------------------------------------------------------------------------------
# lines, CRC, tearing
# --------------------------------------------------------------------------------------------
def line_bytes(value: int) -> bytes:
    return int(value).to_bytes(LINE_BYTES, "little")


def crc_lines(lines: Sequence[int]) -> int:
    """zlib.crc32 of the lines' bytes, in order."""
    crc = 0
    for v in lines:
        crc = zlib.crc32(line_bytes(v), crc)
    return crc


def torn_line(old: int, new: int, new_words: int) -> int:
    """8-byte word w from ``new`` when bit w of ``new_words`` is set, else from ``old``."""
    out = 0
    for w in range(WORDS_PER_LINE):
        src = new if (new_words >> w) & 1 else old
        out |= ((src >> (64 * w)) & _WORD_MASK) << (64 * w)
    return out


def values_to_lines(row: np.ndarray) -> list[int]:
    """One fp32 row (dim a multiple of 16) -> its lines."""
    data = np.ascontiguousarray(np.asarray(row, dtype="<f4").ravel()).tobytes()
    return [int.from_bytes(data[i:i + LINE_BYTES], "little") for i in range(0, len(data), LINE_BYTES)]


def lines_to_values(lines: Sequence[int]) -> np.ndarray:
    data = b"".join(line_bytes(v) for v in lines)
    return np.frombuffer(data, dtype="<f4").astype(np.float32)


# --------------------------------------------------------------------------------------------
# records
# --------------------------------------------------------------------------------------------
def _state_value(state) -> int:
    return int(state.value if isinstance(state, LogState) else state)


def pack_record(state, slot: int, batch: int, count: int = 0, lines: int = 0, *, magic: int = LOG_MAGIC,
                crc: int | None = None) -> int:
    """A record line; ``crc`` None = the correct CRC (give one to build a bad record)."""
    word = RECORD.pack(magic=magic, state=_state_value(state), slot=slot, batch=batch, count=count, lines=lines)
    if crc is None:
        crc = zlib.crc32(line_bytes(word))
    return word | RECORD.pack(crc=crc)


def unpack_record(line: int) -> dict[str, int]:
    return RECORD.unpack(line)


def _without_crc(line: int, codec: StructCodec) -> int:
    return line & ~codec.pack(crc=0xFFFF_FFFF)


def record_crc_ok(line: int) -> bool:
    return RECORD.get(line, "crc") == zlib.crc32(line_bytes(_without_crc(line, RECORD)))


def record_valid(line: int, *, slot: int | None = None, state=None, batch: int | None = None) -> bool:
    """Magic and CRC, and the slot field / state / batch when given."""
    f = RECORD.unpack(line)
    if f["magic"] != LOG_MAGIC or not record_crc_ok(line):
        return False
    if slot is not None and f["slot"] != slot:
        return False
    if state is not None and f["state"] != _state_value(state):
        return False
    return batch is None or f["batch"] == batch


def record_str(line: int) -> str:
    f = RECORD.unpack(line)
    return (f"{{magic {f['magic']:#x}, state {RECORD.name('state', f['state'])}, slot {f['slot']}, batch "
            f"{f['batch']}, count {f['count']}, lines {f['lines']}, crc {'ok' if record_crc_ok(line) else 'BAD'}}}")


# --------------------------------------------------------------------------------------------
# entries
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LogEntry:
    """One undo-log entry: the row's old value ``payload`` (lines) and where it goes back to."""
    table: int
    row: int
    row_addr: int
    payload: tuple[int, ...]
    crc: int | None = None                    # None: the right CRC (give one to build a bad entry)


def entry_crc(batch: int, table: int, row: int, row_addr: int, payload: Sequence[int]) -> int:
    """zlib.crc32 of the entry's EntryCrcPrefix line, then its payload lines."""
    prefix = PREFIX.pack(magic=ENTRY_MAGIC, batch=batch, table=table, dim_lines=len(payload), row=row,
                         row_addr=row_addr)
    return crc_lines([prefix, *payload])


def group_info(group_line: int, place: int) -> dict[str, int]:
    """EntryInfo ``place`` (0 .. GROUP_ENTRIES-1) of a group line."""
    return INFO.unpack(group_line >> (INFO_OFFSET + place * INFO.width))


def pack_group(batch: int, entries: Sequence[LogEntry], *, magic: int = GROUP_MAGIC) -> int:
    """The group line of up to GROUP_ENTRIES entries (unused places zero)."""
    if len(entries) > GROUP_ENTRIES:
        raise ValueError(f"{len(entries)} entries in one group line (at most {GROUP_ENTRIES})")
    line = GROUP.pack(magic=magic, batch=batch)
    for place, e in enumerate(entries):
        crc = entry_crc(batch, e.table, e.row, e.row_addr, e.payload) if e.crc is None else e.crc
        line |= INFO.pack(row_addr=e.row_addr, row=e.row, crc=crc, table=e.table,
                          dim_lines=len(e.payload)) << (INFO_OFFSET + place * INFO.width)
    return line


def pack_entries(batch: int, entries: Sequence[LogEntry], *, magic: int = GROUP_MAGIC) -> list[int]:
    """The slot lines ``entries`` take after the slot header, in the device's layout."""
    lines: list[int] = []
    for g in range(0, len(entries), GROUP_ENTRIES):
        group = entries[g:g + GROUP_ENTRIES]
        lines.append(pack_group(batch, group, magic=magic))
        for e in group:
            lines += [int(v) for v in e.payload]
    return lines


def entry_problem(group_line: int, place: int, payload: Sequence[int], *, batch: int | None = None) -> str | None:
    """None when the entry in ``place`` of the group line is valid with ``payload`` (and of
    ``batch`` when given), else the reason."""
    g = GROUP.unpack(group_line)
    f = group_info(group_line, place)
    if g["magic"] != GROUP_MAGIC:
        return f"group magic {g['magic']:#x}"
    if not 1 <= f["dim_lines"] <= MAX_DIM_LINES:
        return f"dim_lines {f['dim_lines']}"
    if len(payload) != f["dim_lines"]:
        return f"{len(payload)} payload lines for dim_lines {f['dim_lines']}"
    if f["crc"] != entry_crc(g["batch"], f["table"], f["row"], f["row_addr"], payload):
        return "crc"
    if batch is not None and g["batch"] != batch:
        return f"batch {g['batch']} (expected {batch})"
    return None


def entry_valid(group_line: int, place: int, payload: Sequence[int], *, batch: int | None = None) -> bool:
    return entry_problem(group_line, place, payload, batch=batch) is None


@dataclass
class WalkedEntry:
    n: int                                    # entry number in the slot
    line: int                                 # slot line of its first payload line
    info: dict                                # its EntryInfo fields
    payload: list[int]
    problem: str | None


def walk_entries(read, base: int, count: int, end: int, *, batch: int | None = None):
    """Parse ``count`` entries from slot line SLOT_HEADER_LINES of the slot at ``base``, the way
    recovery does; ``end``: the slot line no entry may reach past. Yields WalkedEntry; stops
    after an entry whose dim_lines or extent is impossible (its problem says so). The caller
    checks that the walk ends at the lines the record states."""
    cursor = SLOT_HEADER_LINES
    group = 0
    for n in range(count):
        place = n % GROUP_ENTRIES
        if place == 0:
            if cursor >= end:
                yield WalkedEntry(n, cursor, {}, [], f"group line at slot line {cursor} past the end ({end})")
                return
            group = read(base + cursor)
            cursor += 1
        info = group_info(group, place)
        dim_lines = info["dim_lines"]
        if not 1 <= dim_lines <= MAX_DIM_LINES:
            yield WalkedEntry(n, cursor, info, [], f"dim_lines {dim_lines}")
            return
        if cursor + dim_lines > end:
            yield WalkedEntry(n, cursor, info, [], f"runs past the end ({end})")
            return
        payload = [read(base + cursor + i) for i in range(dim_lines)]
        yield WalkedEntry(n, cursor, info, payload, entry_problem(group, place, payload, batch=batch))
        cursor += dim_lines


def entries_end(walked: Sequence[WalkedEntry]) -> int:
    """Slot line after the last walked entry's payload (SLOT_HEADER_LINES if none)."""
    if not walked:
        return SLOT_HEADER_LINES
    return walked[-1].line + len(walked[-1].payload)


# --------------------------------------------------------------------------------------------
# geometry
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CheckpointRegion:
    """``LogRegion`` in Python (device line addresses; ``mlp_host_addr`` a host line address)."""
    log_base: int
    slot_lines: int
    mlp_base: int = 0
    mlp_lines: int = 0
    mlp_host_addr: int = 0

    def emb_slot(self, batch: int) -> int:
        """Base line of batch ``batch``'s embedding slot (slot batch & 1)."""
        return emb_slot_base(self.log_base, self.slot_lines, batch)

    def slot_base(self, slot: int) -> int:
        return self.log_base + slot * self.slot_lines

    def mlp_slot(self, slot: int) -> int:
        return mlp_slot_base(self.mlp_base, self.mlp_lines, slot)

    @property
    def emb_lines(self) -> int:
        return 2 * self.slot_lines

    @property
    def mlp_log_lines(self) -> int:
        return 2 * (1 + self.mlp_lines) if self.mlp_lines else 0

    def pack(self) -> int:
        return REGION.pack(log_base=self.log_base, slot_lines=self.slot_lines, mlp_base=self.mlp_base,
                           mlp_lines=self.mlp_lines, mlp_host_addr=self.mlp_host_addr)

    @classmethod
    def unpack(cls, value: int) -> "CheckpointRegion":
        return cls(**REGION.unpack(value))


def slot_lines_for(unique_rows: int, max_dim: int) -> int:
    """Slot size for ``unique_rows`` entries of at most ``max_dim`` floats."""
    return SLOT_HEADER_LINES + unique_rows * (max_dim // FLOATS_PER_LINE) + group_lines(unique_rows)


# --------------------------------------------------------------------------------------------
# what a LOG must write
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExpectedEntry:
    row_addr: int
    dim_lines: int
    payload: tuple[int, ...]


def _row_line_fn(layout) -> Callable[[int, int], int]:
    return layout.row_line if hasattr(layout, "row_line") else layout


def batch_rows(offsets, indices, batch_size: int, num_tables: int) -> list[tuple[int, int]]:
    """Distinct (table, row) pairs the batch touches, in first-occurrence order."""
    offs = np.asarray(offsets, dtype=np.int64)
    idx = np.asarray(indices, dtype=np.int64)
    out = []
    for t in range(num_tables):
        rows = idx[offs[t * batch_size]:offs[(t + 1) * batch_size]]
        _, first = np.unique(rows, return_index=True)
        out += [(t, int(rows[i])) for i in np.sort(first)]
    return out


def expected_log_entries(tables: Sequence[np.ndarray], offsets, indices, batch_size: int,
                         layout) -> dict[tuple[int, int], ExpectedEntry]:
    """{(t, row): ExpectedEntry} a LOG of this batch must write, from the tables' current values."""
    row_line = _row_line_fn(layout)
    out = {}
    for t, row in batch_rows(offsets, indices, batch_size, len(tables)):
        table = tables[t]
        out[(t, row)] = ExpectedEntry(int(row_line(t, row)), table.shape[1] // FLOATS_PER_LINE,
                                      tuple(values_to_lines(table[row])))
    return out


def entries_lines(expected: Mapping[tuple[int, int], ExpectedEntry]) -> int:
    """Lines the entries take after the slot header (the LOGGED record's ``lines``)."""
    return sum(e.dim_lines for e in expected.values()) + group_lines(len(expected))


def _reader(memory) -> Callable[[int], int]:
    if callable(memory):
        def read(line: int) -> int:
            value = memory(line)
            return 0 if value is None else int(value)
        return read
    if hasattr(memory, "get"):
        return lambda line: memory.get(line, 0)
    return memory.__getitem__


def check_log_slot(read_line, region: CheckpointRegion, batch: int,
                   expected: Mapping[tuple[int, int], ExpectedEntry], *, applied: bool | None = None,
                   max_report: int = 20) -> list[str]:
    """Mismatches between batch ``batch``'s slot in memory and the expected log (empty = right)."""
    read = _reader(read_line)
    slot = batch & 1
    base = region.emb_slot(batch)
    bad: list[str] = []
    count, lines = len(expected), entries_lines(expected)
    logged = read(base + RECORD_LINE_LOGGED)
    if not record_valid(logged, slot=slot, state=LogState.LOGGED, batch=batch):
        bad.append(f"batch {batch}: slot {slot} line 0 is not a valid LOGGED record of batch {batch}: "
                   f"{record_str(logged)}")
    else:
        f = RECORD.unpack(logged)
        if (f["count"], f["lines"]) != (count, lines):
            bad.append(f"batch {batch}: LOGGED count/lines {f['count']}/{f['lines']}, expected {count}/{lines}")
    if applied is not None:
        rec = read(base + RECORD_LINE_APPLIED)
        ok = record_valid(rec, slot=slot, state=LogState.APPLIED, batch=batch)
        if ok and applied:
            f = RECORD.unpack(rec)
            if (f["count"], f["lines"]) != (count, lines):
                bad.append(f"batch {batch}: APPLIED count/lines {f['count']}/{f['lines']}, expected "
                           f"{count}/{lines}")
        elif ok != applied:
            bad.append(f"batch {batch}: slot {slot} line 1 {'is not' if applied else 'is'} a valid APPLIED record "
                       f"of batch {batch}: {record_str(rec)}")
    seen: set[tuple[int, int]] = set()
    for w in walk_entries(read, base, count, region.slot_lines, batch=batch):
        f = w.info
        if not w.payload:
            bad.append(f"batch {batch}: entry {w.n} at slot line {w.line}: {w.problem}; stop walking")
            break
        where = f"batch {batch}: entry {w.n} at slot line {w.line} (table {f['table']}, row {f['row']})"
        if w.problem:
            bad.append(f"{where}: invalid ({w.problem})")
        key = (f["table"], f["row"])
        want = expected.get(key)
        if want is None:
            bad.append(f"{where}: not a row the batch touches")
        elif key in seen:
            bad.append(f"{where}: logged twice")
        else:
            if f["row_addr"] != want.row_addr:
                bad.append(f"{where}: row_addr {f['row_addr']:#x}, expected {want.row_addr:#x}")
            if f["dim_lines"] != want.dim_lines:
                bad.append(f"{where}: dim_lines {f['dim_lines']}, expected {want.dim_lines}")
            elif tuple(w.payload) != want.payload:
                diff = [i for i, (x, y) in enumerate(zip(w.payload, want.payload)) if x != y]
                bad.append(f"{where}: payload lines {diff} differ from the row's old value")
        seen.add(key)
        if len(bad) >= max_report:
            bad.append("...")
            return bad
    missing = sorted(set(expected) - seen)
    if missing:
        bad.append(f"batch {batch}: {len(missing)} rows not logged, e.g. {missing[:5]}")
    return bad


# --------------------------------------------------------------------------------------------
# writers (scripted images; the device's write order)
# --------------------------------------------------------------------------------------------
def write_log_slot(memory, region: CheckpointRegion, batch: int,
                   entries: Mapping[tuple[int, int], ExpectedEntry] | Sequence[LogEntry], *, logged: bool = True,
                   group_magic: int = GROUP_MAGIC) -> int:
    """FREE record, the entries (a dict from ``expected_log_entries`` or LogEntry objects, in
    slot order), then (``logged``) the LOGGED record. Returns the entry lines."""
    slot, base = batch & 1, region.emb_slot(batch)
    memory[base + RECORD_LINE_LOGGED] = pack_record(LogState.FREE, slot, batch)
    if isinstance(entries, Mapping):
        entries = [LogEntry(t, row, e.row_addr, e.payload) for (t, row), e in entries.items()]
    lines = pack_entries(batch, list(entries), magic=group_magic)
    if SLOT_HEADER_LINES + len(lines) > region.slot_lines:
        raise ValueError(f"{len(lines)} entry lines do not fit a slot of {region.slot_lines} lines")
    for i, v in enumerate(lines):
        memory[base + SLOT_HEADER_LINES + i] = v
    if logged:
        memory[base + RECORD_LINE_LOGGED] = pack_record(LogState.LOGGED, slot, batch, len(entries), len(lines))
    return len(lines)


def write_applied(memory, region: CheckpointRegion, batch: int) -> None:
    """The APPLIED record of ``batch``, count/lines copied from its slot's LOGGED record."""
    base = region.emb_slot(batch)
    f = RECORD.unpack(_reader(memory)(base + RECORD_LINE_LOGGED))
    memory[base + RECORD_LINE_APPLIED] = pack_record(LogState.APPLIED, batch & 1, batch, f["count"], f["lines"])


def write_mlp_log(memory, region: CheckpointRegion, slot: int, batch: int, image: Sequence[int], *,
                  complete: bool = True) -> None:
    """An MLP log as the device writes it: FREE, image lines, then (``complete``) MLP_LOGGED
    and the FREE record of the other slot."""
    if len(image) != region.mlp_lines:
        raise ValueError(f"image of {len(image)} lines, the region says {region.mlp_lines}")
    base = region.mlp_slot(slot)
    memory[base] = pack_record(LogState.FREE, slot, batch)
    for i, v in enumerate(image):
        memory[base + 1 + i] = int(v)
    if complete:
        memory[base] = pack_record(LogState.MLP_LOGGED, slot, batch, region.mlp_lines * LINE_BYTES,
                                   region.mlp_lines)
        memory[region.mlp_slot(1 - slot)] = pack_record(LogState.FREE, 1 - slot, batch)


# --------------------------------------------------------------------------------------------
# recovery
# --------------------------------------------------------------------------------------------
@dataclass
class RecoveryResult:
    emb_valid: bool = False
    emb_batches: int = 0
    rolled_back: bool = False
    mlp_valid: bool = False
    mlp_batch: int = 0
    mlp_slot: int = 0
    error: NdpError | None = NdpError.OK     # None: unknown (read from CSRs)
    writes: dict[int, int] = field(default_factory=dict)   # line -> value written by the rollback
    rows_rolled_back: list[tuple[int, int]] = field(default_factory=list)
    emb_slot: int | None = None               # the slot of the newest valid LOGGED record
    problem: str = ""                         # why LOG_CORRUPT

    def csr_view(self) -> dict[str, int]:
        """What CKPT_RECOVERED_EMB / CKPT_RECOVERED_MLP / CKPT_RECOVER_STATUS show (the MLP
        batch and slot count only when mlp_valid)."""
        return {"emb_valid": int(self.emb_valid), "emb_batches": self.emb_batches,
                "rolled_back": int(self.rolled_back), "mlp_valid": int(self.mlp_valid),
                "mlp_batch": self.mlp_batch if self.mlp_valid else 0,
                "mlp_slot": self.mlp_slot if self.mlp_valid else 0}

    def mismatches(self, other: "RecoveryResult") -> list[str]:
        """Differences in the CSR-visible fields (and the error when both know it)."""
        a, b = self.csr_view(), other.csr_view()
        bad = [f"{k}: {a[k]} vs {b[k]}" for k in a if a[k] != b[k]]
        if self.error is not None and other.error is not None and self.error != other.error:
            bad.append(f"error: {self.error.name} vs {other.error.name}")
        return bad


def _newest(read, bases_and_slots, state, extra=lambda f: True):
    best = None
    for slot, base in bases_and_slots:
        line = read(base)
        if record_valid(line, slot=slot, state=state):
            f = RECORD.unpack(line)
            if extra(f) and (best is None or f["batch"] > best[1]["batch"]):
                best = (slot, f)
    return best


def golden_recover(memory, region: CheckpointRegion, *, apply: bool = True) -> RecoveryResult:
    """RECOVER on a dict-like line memory (see the module docstring); writes the rollback into
    ``memory`` when ``apply`` (the result's ``writes`` hold it either way)."""
    read = _reader(memory)
    res = RecoveryResult()
    if region.mlp_lines:
        mlp = _newest(read, [(s, region.mlp_slot(s)) for s in (0, 1)], LogState.MLP_LOGGED,
                      lambda f: f["lines"] == region.mlp_lines)
        if mlp is not None:
            res.mlp_valid, res.mlp_slot, res.mlp_batch = True, mlp[0], mlp[1]["batch"]
    emb = _newest(read, [(s, region.slot_base(s) + RECORD_LINE_LOGGED) for s in (0, 1)], LogState.LOGGED)
    if emb is None:
        return res
    slot, rec = emb
    k, base = rec["batch"], region.slot_base(slot)
    res.emb_valid, res.emb_slot, res.emb_batches = True, slot, k
    if record_valid(read(base + RECORD_LINE_APPLIED), slot=slot, state=LogState.APPLIED, batch=k):
        res.emb_batches = k + 1
        return res
    writes: dict[int, int] = {}
    rows = []
    end = SLOT_HEADER_LINES + rec["lines"]
    walked = []
    for w in walk_entries(read, base, rec["count"], min(end, region.slot_lines), batch=k):
        if w.problem:
            res.error, res.problem = NdpError.LOG_CORRUPT, f"entry {w.n} at slot {slot} line {w.line}: {w.problem}"
            return res
        for i, v in enumerate(w.payload):
            writes[w.info["row_addr"] + i] = v
        rows.append((w.info["table"], w.info["row"]))
        walked.append(w)
    if entries_end(walked) != end:
        res.error, res.problem = NdpError.LOG_CORRUPT, (f"{rec['count']} entries end at slot line "
                                                        f"{entries_end(walked)}, the record says {end}")
        return res
    if apply:
        for line, v in writes.items():
            memory[line] = v
    res.writes, res.rows_rolled_back, res.rolled_back = writes, rows, True
    return res


# --------------------------------------------------------------------------------------------
# training state
# --------------------------------------------------------------------------------------------
def _batch_field(batch, name):
    if isinstance(batch, Mapping):
        return batch.get(name)
    return getattr(batch, name, None)


class CheckpointedTraining:
    """Golden tables after n applied batches and the MLP image of an MLP log of batch k.

    ``batches``: objects or dicts with ``offsets``, ``indices`` and optional ``weights``
    (a TraceBatch works); ``grads``: per batch, one (B, dim) fp32 pooled-output gradient per
    table (a sequence, or a callable k -> list); ``lr``: a float or one per batch; ``mlp``:
    an object with ``image_lines(k)`` (GpuAgent) or None.
    """

    def __init__(self, tables: Sequence[np.ndarray], modes: Sequence[str], batch_size: int, batches: Sequence,
                 grads, lr, mlp=None):
        self.initial = [np.array(t, dtype=np.float32, copy=True) for t in tables]
        self.modes = list(modes)
        self.batch_size = batch_size
        self.batches = batches
        self.grads = grads
        self.lr = lr
        self.mlp = mlp
        self._snapshots: dict[int, list[np.ndarray]] = {0: self.initial}

    def __len__(self) -> int:
        return len(self.batches)

    def lr_of(self, k: int) -> float:
        return float(self.lr[k]) if isinstance(self.lr, (list, tuple, np.ndarray)) else float(self.lr)

    def grads_of(self, k: int) -> list[np.ndarray]:
        return list(self.grads(k) if callable(self.grads) else self.grads[k])

    def step(self, tables: list[np.ndarray], k: int) -> None:
        """Apply batch k to ``tables`` in place."""
        b = self.batches[k]
        embedding.tbe_sgd_step(tables, _batch_field(b, "offsets"), _batch_field(b, "indices"), self.modes,
                               self.batch_size, self.grads_of(k), self.lr_of(k), _batch_field(b, "weights"))

    def tables_after(self, n: int) -> list[np.ndarray]:
        """The tables after batches 0..n-1 (copies)."""
        if not 0 <= n <= len(self.batches):
            raise ValueError(f"{n} applied batches: the run has {len(self.batches)}")
        start = max(k for k in self._snapshots if k <= n)
        tables = [t.copy() for t in self._snapshots[start]]
        for k in range(start, n):
            self.step(tables, k)
            self._snapshots[k + 1] = [t.copy() for t in tables]
        return [t.copy() for t in tables]

    def forget_before(self, n: int) -> None:
        """Drop cached snapshots before n applied batches (except the initial tables): long
        runs that never go back past n keep memory bounded."""
        for k in [k for k in self._snapshots if 0 < k < n]:
            del self._snapshots[k]

    def touched_rows(self, k: int) -> list[tuple[int, int]]:
        b = self.batches[k]
        return batch_rows(_batch_field(b, "offsets"), _batch_field(b, "indices"), self.batch_size,
                          len(self.initial))

    def expected_log(self, k: int, layout) -> dict[tuple[int, int], ExpectedEntry]:
        b = self.batches[k]
        return expected_log_entries(self.tables_after(k), _batch_field(b, "offsets"), _batch_field(b, "indices"),
                                    self.batch_size, layout)

    def mlp_image(self, k: int) -> list[int]:
        """The image an MLP log copied entirely during batch k holds (params after k batches)."""
        if self.mlp is None:
            raise ValueError("no MLP agent given")
        return self.mlp.image_lines(k)

    def mlp_image_chunks(self, chunks: Sequence[tuple[int, int, int]]) -> list[int]:
        """The image a relaxed MLP log holds when chunk (batch j, offset, count) was copied
        while the GPU trained batch j (its image then is the params after j batches): lines
        [offset, offset+count) of ``mlp_image(j)``, per chunk; lines no chunk covers are 0."""
        out: list[int] = []
        for j, offset, count in chunks:
            image = self.mlp_image(j)
            if len(out) < len(image):
                out += [0] * (len(image) - len(out))
            out[offset:offset + count] = image[offset:offset + count]
        return out
