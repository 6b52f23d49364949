"""Golden validator of NDP commands: which NdpError (and error_info) a command must end with.

Contract: ``expected_error(cmd_line, desc_lines, offsets, indices, capacity_lines, *,
logged=None, log_region_ok=True)`` -> ``(NdpError, error_info)`` for a 64-byte
CommandDescriptor line, the TableDescriptor lines at its ``tables_addr`` (the first
``num_tables`` of them are used), the offsets and indices arrays as they are in device memory
and the device size. ``logged`` maps an embedding-log slot (0/1) to the batch of its valid
LOGGED record (checkpointed UPDATE); ``log_region_ok`` says the CKPT_* region fits device
memory. Pure Python; fields are decoded through the hw/ndp/command.py layouts (one source).

Written from the documented contract (hw/ndp/command.py NdpError / AddressFault comments,
the CommandProcessor docstring's check order, the LookupFeeder, UpdateEngine and
UndoLogEngine docstrings, architecture.md §4-5), not from the RTL's comparisons. The order,
first failing check wins:

1. NOP completes OK (nothing else is looked at); an opcode outside NdpOpcode: BAD_OPCODE.
2. BAD_TABLES: num_tables 0 or > MAX_TABLES, batch_size 0, or T*B >= 2**32 - 1 (see Finding).
3. ADDRESS (error_info an AddressFault), an array of n lines at line a "reaches past device
   memory" when a + n > capacity: TABLES (T lines), OFFSETS (lines for T*B+1 u32), OUTPUTS
   (LOOKUP to device memory: B * row_pitch_lines), GRADIENTS (UPDATE: B * row_pitch_lines).
4. Per table t in order (error_info t): BAD_DIM (dim not a multiple of 16 in [16, 256]),
   BAD_DESCRIPTOR (rows 0, pooling mode 3, WEIGHTED_SUM without flags.has_weights,
   col_lines + dim/16 > row_pitch_lines), ADDRESS TABLE_ROWS + t (base + rows*dim/16 > cap).
5. UPDATE with flags.checkpoint: ADDRESS LOG_REGION when the region does not fit, then
   NOT_LOGGED unless slot batch&1 holds batch's LOGGED record.
6. The engines, which see the arrays:
   - LOOKUP ("in stream order", LookupFeeder): OFFSETS 0 when offsets[0] != 0; OFFSETS T*B
     when offsets[T*B] != index_count; ADDRESS INDICES / WEIGHTS (weights only with
     flags.has_weights) when the offsets[T*B]-element array reaches past device memory; then
     bag by bag k = 0..T*B-1: OFFSETS k+1 when offsets[k+1] < offsets[k] or > offsets[T*B];
     BAD_DESCRIPTOR k for a MEAN bag longer than 65535; INDEX_RANGE j for the bag's first
     index >= rows. "Stream order" is read as: the arrays' extent (offsets[0], offsets[T*B])
     is known before any bag is streamed, each bag's offset before its indices.
   - UPDATE and LOG (UpdateEngine / UndoLogEngine pass 1): OFFSETS i for the first i with
     offsets[i] < offsets[i-1] or offsets[i] - offsets[i-1] > 65535 (every mode); then
     OFFSETS 0 (offsets[0] != 0), OFFSETS T*B (offsets[T*B] != index_count). LOG says "in
     stream order": OFFSETS 0 comes first there, before a step down at position 1 (the two
     engines' docstrings differ here; see Finding 2); ADDRESS
     INDICES / WEIGHTS when the line of element offsets[T*B]-1 is outside; INDEX_RANGE j, the
     first index >= its table's rows (table t owns positions offsets[t*B] .. offsets[(t+1)*B]-1).
     LOG first checks its region (ADDRESS LOG_REGION) and checks no weights address.
   An empty indices array (offsets[T*B] = 0) reaches nowhere: no ADDRESS INDICES / WEIGHTS.

Finding 1 (a documentation gap, reported): hw/ndp/command.py documents BAD_TABLES as "num_tables
is 0 or > MAX_TABLES, or batch_size is 0"; the processor also rejects T*B >= 2**32 - 1 (the
offsets array's element count no longer fits the u32 offsets). This model follows the
device there, because by the documented rules alone such a command would be ADDRESS OFFSETS
on any device smaller than 2**28 lines, and the difference is only which code says no.

``log_slot_freed(error, info)``: what a LOG leaves in its slot: the UndoLogEngine
writes a FREE record before it validates the arrays, so a LOG that passed the processor's
and the region checks and then failed leaves slot batch&1 without a LOGGED record.

Finding 2 (reported): undo_log.py says LOG validates "with the UPDATE engine's codes and
error_info" but lists its offsets checks "in stream order"; the two differ when offsets[0] != 0
and offsets[1] < offsets[0]: UPDATE reports position 1, LOG position 0 (the fuzz found it;
same code, nothing written, so only the error_info differs). This model follows each
engine's own docstring. Ambiguity left by the LOG docstring, resolved by reading the LOG
RTL once: at position T*B a step down is reported before offsets[T*B] != index_count.

MLP_LOG and RECOVER are not modelled (``NotImplementedError``). The arrays are indexable
sequences of ints; an element the order needs but the caller did not provide raises
IndexError (a generator bug, never a silent guess).
"""
from __future__ import annotations

from typing import Mapping, Sequence

from hw.ndp.command import (FLOATS_PER_LINE, MAX_DIM, MAX_TABLES, MIN_DIM, AddressFault, CommandDescriptor,
                            CommandFlags, NdpError, NdpOpcode, PoolMode, TableDescriptor)
from sim.model.codec import StructCodec

COMMAND = StructCodec(CommandDescriptor)
FLAGS = StructCodec(CommandFlags)
TABLE = StructCodec(TableDescriptor)
MAX_BAG = 65535                      # longest bag (16-bit length of the divider), architecture.md / update.py
U32 = 1 << 32


def _lines(elements: int) -> int:
    return -(-elements // FLOATS_PER_LINE)


def _reaches_past(base: int, lines: int, cap: int) -> bool:
    return base + lines > cap


def decode(cmd_line: int, desc_lines: Sequence[int]) -> tuple[dict, dict, list[dict]]:
    """(command fields, flags, table descriptors of the first num_tables lines given)."""
    cmd = COMMAND.unpack(cmd_line)
    return cmd, FLAGS.unpack(cmd["flags"]), [TABLE.unpack(v) for v in desc_lines]


def expected_error(cmd_line: int, desc_lines: Sequence[int], offsets: Sequence[int], indices: Sequence[int],
                   capacity_lines: int, *, logged: Mapping[int, int] | None = None,
                   log_region_ok: bool = True) -> tuple[NdpError, int]:
    cmd, flags, _ = decode(cmd_line, ())
    cap = capacity_lines
    op = cmd["opcode"]
    if op == NdpOpcode.NOP.value:
        return NdpError.OK, 0
    if op not in {o.value for o in NdpOpcode}:
        return NdpError.BAD_OPCODE, 0
    if op in (NdpOpcode.MLP_LOG.value, NdpOpcode.RECOVER.value):
        raise NotImplementedError("MLP_LOG and RECOVER are not modelled")
    lookup, update, log = (op == NdpOpcode.LOOKUP.value, op == NdpOpcode.UPDATE.value, op == NdpOpcode.LOG.value)
    T, B, pitch = cmd["num_tables"], cmd["batch_size"], cmd["row_pitch_lines"]
    nbags = T * B
    if T == 0 or T > MAX_TABLES or B == 0 or nbags >= U32 - 1:
        return NdpError.BAD_TABLES, 0
    if _reaches_past(cmd["tables_addr"], T, cap):
        return NdpError.ADDRESS, AddressFault.TABLES
    if _reaches_past(cmd["offsets_addr"], _lines(nbags + 1), cap):
        return NdpError.ADDRESS, AddressFault.OFFSETS
    if lookup and not flags["out_to_host"] and _reaches_past(cmd["out_addr"], B * pitch, cap):
        return NdpError.ADDRESS, AddressFault.OUTPUTS
    if update and _reaches_past(cmd["grad_addr"], B * pitch, cap):
        return NdpError.ADDRESS, AddressFault.GRADIENTS
    tables = [TABLE.unpack(v) for v in desc_lines[:T]]
    if len(tables) < T:
        raise IndexError(f"{T} table descriptors needed, {len(tables)} given")
    for t, d in enumerate(tables):
        dim = d["dim"]
        if dim % FLOATS_PER_LINE or not MIN_DIM <= dim <= MAX_DIM:
            return NdpError.BAD_DIM, t
        lpr = dim // FLOATS_PER_LINE
        if (d["rows"] == 0 or d["mode"] not in {m.value for m in PoolMode}
                or (d["mode"] == PoolMode.WEIGHTED_SUM.value and not flags["has_weights"])
                or d["col_lines"] + lpr > pitch):
            return NdpError.BAD_DESCRIPTOR, t
        if _reaches_past(d["base_addr"], d["rows"] * lpr, cap):
            return NdpError.ADDRESS, AddressFault.TABLE_ROWS + t
    if update and flags["checkpoint"]:
        if not log_region_ok:
            return NdpError.ADDRESS, AddressFault.LOG_REGION
        if (logged or {}).get(cmd["batch"] & 1) != cmd["batch"]:
            return NdpError.NOT_LOGGED, 0
    if log and not log_region_ok:
        return NdpError.ADDRESS, AddressFault.LOG_REGION
    if lookup:
        return _lookup_arrays(cmd, flags, tables, offsets, indices, cap)
    return _update_arrays(cmd, flags, tables, offsets, indices, cap)


def _array_address(cmd, flags, n: int, cap: int):
    """ADDRESS INDICES / WEIGHTS for an n-element array (None when both fit). LOG reads no
    weights (UndoLogEngine names only INDICES), so it checks none."""
    if n == 0:
        return None
    if _reaches_past(cmd["indices_addr"], _lines(n), cap):
        return NdpError.ADDRESS, AddressFault.INDICES
    if (flags["has_weights"] and cmd["opcode"] != NdpOpcode.LOG.value
            and _reaches_past(cmd["weights_addr"], _lines(n), cap)):
        return NdpError.ADDRESS, AddressFault.WEIGHTS
    return None


def _lookup_arrays(cmd, flags, tables, offsets, indices, cap):
    B = cmd["batch_size"]
    nbags = len(tables) * B
    end = int(offsets[nbags])
    if int(offsets[0]) != 0:
        return NdpError.OFFSETS, 0
    if end != cmd["index_count"]:
        return NdpError.OFFSETS, nbags
    bad = _array_address(cmd, flags, end, cap)
    if bad:
        return bad
    prev = 0
    for k in range(nbags):
        o = int(offsets[k + 1])
        if o < prev or o > end:
            return NdpError.OFFSETS, k + 1
        tab = tables[k // B]
        if tab["mode"] == PoolMode.MEAN.value and o - prev > MAX_BAG:
            return NdpError.BAD_DESCRIPTOR, k
        for j in range(prev, o):
            if int(indices[j]) >= tab["rows"]:
                return NdpError.INDEX_RANGE, j
        prev = o
    return NdpError.OK, 0


def _update_arrays(cmd, flags, tables, offsets, indices, cap):
    B = cmd["batch_size"]
    nbags = len(tables) * B
    stream = cmd["opcode"] == NdpOpcode.LOG.value
    if stream and int(offsets[0]) != 0:           # LOG: position 0 first, in stream order
        return NdpError.OFFSETS, 0
    for i in range(1, nbags + 1):
        d = int(offsets[i]) - int(offsets[i - 1])
        if d < 0 or d > MAX_BAG:
            return NdpError.OFFSETS, i
    if int(offsets[0]) != 0:
        return NdpError.OFFSETS, 0
    end = int(offsets[nbags])
    if end != cmd["index_count"]:
        return NdpError.OFFSETS, nbags
    bad = _array_address(cmd, flags, end, cap)
    if bad:
        return bad
    for t, tab in enumerate(tables):
        for j in range(int(offsets[t * B]), int(offsets[(t + 1) * B])):
            if int(indices[j]) >= tab["rows"]:
                return NdpError.INDEX_RANGE, j
    return NdpError.OK, 0


PROCESSOR_ADDRESS_FAULTS = {int(AddressFault.TABLES), int(AddressFault.OFFSETS), int(AddressFault.LOG_REGION)}


def log_slot_freed(error: NdpError, info: int) -> bool:
    """A LOG that ended with (error, info) has invalidated its slot (the engine ran past its
    region check): OK (then it holds the new LOGGED record) or an array error."""
    if error in (NdpError.OK, NdpError.OFFSETS, NdpError.INDEX_RANGE, NdpError.LOG_FULL, NdpError.MEDIA):
        return True
    return error == NdpError.ADDRESS and info not in PROCESSOR_ADDRESS_FAULTS and info < AddressFault.TABLE_ROWS
