"""Host driver for the NDP command rings (hw/ndp/command.py) and its pure-Python parts.

Contract
--------
Pure Python (no simulator; unit-tested in tests/test_ndp.py):

- ``NdpTable(rows, dim, mode)``: one embedding table as the device sees it (mode ``"sum"``,
  ``"mean"`` or ``"weighted_sum"``). ``tables_from_manifest(manifest)`` builds them from a
  trace manifest (sim/model/trace.py).
- ``plan_layout(tables, batch_size=, max_indices=, capacity_lines=, ...)`` -> ``DeviceLayout``:
  places, at line-aligned device line addresses inside ``capacity_lines``, in this order:
  the submission ring, the completion ring (``ring_slots`` lines each), the table
  descriptors (one line per table), the argument arrays (offsets, indices, weights if any,
  pooled-output gradients, pooled outputs unless they go to the host) and the tables (row r
  of table t at ``tables[t].base + r * dim/16``). Every region starts at element 0 of its
  line. When the model does not fit, ``LayoutError`` says how many lines are needed and
  available and suggests a rows cap (or a smaller batch when even one row per table does
  not fit).
- Packing, always through the Amaranth layouts (``StructCodec``; no offset typed here):
  ``NdpCommand.pack()`` (CommandDescriptor), ``DeviceLayout.table_descriptors()``
  (TableDescriptor; col_lines = prefix sum of dim/16 over the tables, row_pitch_lines =
  ``row_pitch_for(tables)``, the total made odd), ``NdpCompletion.unpack(line)``. Arrays:
  ``array_to_lines`` / ``lines_to_array`` (u32 / fp32 little-endian, 16 per line, element 0
  at bit 0 of the first line, the last line zero-padded). ``NdpCommand.unpack(line)`` is the
  inverse of ``pack``.
- Checkpoint commands (hw/ndp/command.py): ``NdpCommand`` carries ``batch``, ``mlp_offset``,
  ``mlp_count`` and the flags ``checkpoint`` / ``mlp_slot``; ``log_command(layout, batch,
  index_count=, has_weights=, tag=)`` (LOG), ``update_command(..., checkpoint_batch=k)`` (UPDATE with
  flags.checkpoint, batch k), ``mlp_log_command(batch, offset, count, slot, tag=)`` and
  ``mlp_log_commands(batch, lines, slot, chunks=)`` (MLP_LOG; no tables), ``recover_command(
  tag=)`` (RECOVER; no tables).
- Checkpoint logs in the layout: ``plan_layout(..., emb_log=True, log_max_rows=None,
  mlp_log_lines=0, mlp_host_line=0)`` reserves the embedding undo log (two slots of
  2 + R * (1 + max dim/16) lines, R = log_max_rows or max_indices) and the MLP log (two slots
  of 1 + mlp_log_lines) after the tables; ``DeviceLayout.log_region`` is the
  ``CheckpointRegion`` (sim/model/checkpoint.py, the Python twin of ``LogRegion``).

On the simulator (cocotb, a ``sim.env.DeviceEnv``):

- ``Backdoor(env)``: bulk line loads and reads of the PMEM media (grouped per channel) that
  also keep the CXL.mem scoreboard's reference image in step, so later host reads are
  checked against what was loaded.
- ``NdpHost(env, layout)``: ``await start()`` programs NDP_SQ_BASE / NDP_CQ_BASE /
  NDP_RING and syncs with NDP_SQ_HEAD; ``load_tables`` / ``load_batch`` / ``load_gradients``
  put data in device memory through the backdoor (fast; no protocol content to check);
  ``await write_table_descriptors()`` and ``await submit(cmd)`` write descriptor lines over
  CXL.mem (``env.host``, so the protocol monitor and the scoreboard see every ring write,
  as a real driver's would be; each write's Cmp is awaited before the doorbell, so the
  device cannot fetch a stale slot); ``submit`` then rings NDP_SQ_TAIL. ``await
  wait(seq)`` polls NDP_SQ_HEAD with a Timer (never per-cycle Python), up to a timeout that
  reports the progress made (head, busy, media line counts); the Completion line is read
  from the completion ring through the backdoor (the device wrote it, so the scoreboard's
  reference holds no copy to check a CXL.mem read against) and cross-checked with the
  NDP_STATUS / NDP_LAST_* CSRs (NDP_LAST_CYCLES, which also counts the completion write
  until durable, becomes ``total_cycles``); STATUS.NDP_DONE is cleared. ``await execute(cmd,
  expect=NdpError.OK)`` = submit + wait and raises ``NdpCommandError`` when the error code
  is not the expected one. ``read_outputs`` / ``read_table`` / ``read_rows`` read results
  back (device memory through the backdoor, host memory from the home agent);
  ``read_outputs`` refuses an output array whose last LOOKUP failed or has not completed
  (a failed LOOKUP leaves its outputs undefined).
- ``await program_checkpoint(region=None, mlp_host_line=None)`` writes the CKPT_* geometry
  CSRs (default: the layout's ``log_region``); ``await read_recovery()`` reads
  CKPT_RECOVERED_EMB / CKPT_RECOVERED_MLP / CKPT_RECOVER_STATUS into a ``RecoveryResult``
  (``error`` None: the completion carries it).
- ``MediaCounters(env)``: per-channel completed media reads / writes (pmem_media
  ``stat_reads`` / ``stat_writes``) when the harness makes them visible to VPI.
- ``HostMemorySide(env, base_line, lines)``: the host side of CXL.cache for pushed outputs
  (home agent + wire driver + CXL.cache protocol monitor), ``finish()`` checks them.

Backdoor writes must not race device traffic to the same lines: load only while no
command runs (between ``execute`` calls).
"""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from hw.common.cxl_mem import LINE_BYTES, M2SReqOpcode, M2SRwDOpcode, MetaField, MetaValue, SnpType
from hw.cxl_controller.csr_map import field
from hw.mem.port import split_line_address
from hw.ndp.command import (DEV_ADDR_BITS, FLOATS_PER_LINE, MAX_DIM, MAX_TABLES, MIN_DIM, CommandDescriptor,
                            CommandFlags, Completion, EngineStats, NdpError, NdpOpcode, PoolMode, TableDescriptor)
from sim.model.checkpoint import CheckpointRegion, RecoveryResult, slot_lines_for
from sim.model.codec import StructCodec

COMMAND = StructCodec(CommandDescriptor)
TABLE = StructCodec(TableDescriptor)
COMPLETION = StructCodec(Completion)
STATS = StructCodec(EngineStats)
FLAGS = StructCodec(CommandFlags)

POOL_MODES = {"sum": PoolMode.SUM, "mean": PoolMode.MEAN, "weighted_sum": PoolMode.WEIGHTED_SUM}
STAT_NAMES = tuple(name for name, _, _ in STATS.fields)
MAX_RING_SLOTS = 1 << 15
LINE_MASK = (1 << (8 * LINE_BYTES)) - 1
DEFAULT_TIMEOUT_CYCLES = 2_000_000


class LayoutError(ValueError):
    """The model does not fit device memory, or a table cannot be described to the device."""


class NdpCommandError(RuntimeError):
    """A command completed with an error code other than the expected one."""

    def __init__(self, message: str, completion: "NdpCompletion"):
        super().__init__(message)
        self.completion = completion


# --------------------------------------------------------------------------------------------
# tables and arrays
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NdpTable:
    rows: int
    dim: int
    mode: str = "sum"

    def __post_init__(self):
        if not 1 <= self.rows < 1 << 32:
            raise LayoutError(f"rows = {self.rows} outside [1, 2**32)")
        if self.dim % FLOATS_PER_LINE or not MIN_DIM <= self.dim <= MAX_DIM:
            raise LayoutError(f"dim = {self.dim} is not a multiple of {FLOATS_PER_LINE} in [{MIN_DIM}, {MAX_DIM}]")
        if self.mode not in POOL_MODES:
            raise LayoutError(f"pooling mode {self.mode!r} not in {tuple(POOL_MODES)}")

    @property
    def lines_per_row(self) -> int:
        return self.dim // FLOATS_PER_LINE

    @property
    def lines(self) -> int:
        return self.rows * self.lines_per_row


def tables_from_manifest(manifest: dict) -> list[NdpTable]:
    return [NdpTable(t["rows"], t["dim"], t["mode"]) for t in manifest["tables"]]


def lines_for(elements: int) -> int:
    """Lines holding ``elements`` 32-bit elements (16 per line)."""
    return -(-elements // FLOATS_PER_LINE)


def array_to_lines(values, dtype=np.uint32) -> list[int]:
    """u32 / fp32 array -> 512-bit line values, 16 elements per line, little-endian."""
    arr = np.ascontiguousarray(np.asarray(values, dtype=np.dtype(dtype).newbyteorder("<")).ravel())
    data = arr.tobytes()
    data += bytes(-len(data) % LINE_BYTES)
    return [int.from_bytes(data[i:i + LINE_BYTES], "little") for i in range(0, len(data), LINE_BYTES)]


def lines_to_array(lines: Sequence[int], dtype=np.uint32, count: int | None = None) -> np.ndarray:
    """Inverse of ``array_to_lines``: the first ``count`` elements (all when None)."""
    data = b"".join(int(v).to_bytes(LINE_BYTES, "little") for v in lines)
    arr = np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder("<")).astype(dtype)
    return arr if count is None else arr[:count]


def garbage_words(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` random u32 words, a quarter of them fp32 specials (+-Inf, NaNs, +-0, subnormals)."""
    words = rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32)
    specials = np.array([0x7F800000, 0xFF800000, 0x7FC00000, 0xFFFFFFFF, 0x7F800001, 0x80000000, 0x00000001,
                         0x807FFFFF], np.uint32)
    pick = rng.random(n) < 0.25
    words[pick] = rng.choice(specials, int(pick.sum()))
    return words


def f32_bits(value: float) -> int:
    return int(np.float32(value).view(np.uint32))


# --------------------------------------------------------------------------------------------
# layout
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Region:
    name: str
    base: int            # device line address of the first line
    lines: int

    @property
    def end(self) -> int:
        return self.base + self.lines


@dataclass(frozen=True)
class DeviceLayout:
    """Where everything lives in device memory (see ``plan_layout``)."""
    capacity_lines: int
    tables: tuple[NdpTable, ...]
    batch_size: int
    max_indices: int
    ring_slots: int
    sq: Region
    cq: Region
    table_descs: Region
    offsets: Region
    indices: Region
    weights: Region | None
    grads: Region
    outputs: Region | None
    table_regions: tuple[Region, ...]
    free: Region                  # what is left
    emb_log: Region | None = None   # embedding undo log: two slots of emb_log.lines // 2 lines
    mlp_log: Region | None = None   # MLP log: two slots of 1 + mlp_lines lines
    mlp_host_line: int = 0          # host line address of the GPU's MLP image

    @property
    def slot_lines(self) -> int:
        return self.emb_log.lines // 2 if self.emb_log is not None else 0

    @property
    def mlp_lines(self) -> int:
        return self.mlp_log.lines // 2 - 1 if self.mlp_log is not None else 0

    @property
    def log_region(self) -> CheckpointRegion | None:
        """The checkpoint geometry (the CKPT_* CSR values), or None when no log is reserved."""
        if self.emb_log is None and self.mlp_log is None:
            return None
        return CheckpointRegion(log_base=self.emb_log.base if self.emb_log else 0, slot_lines=self.slot_lines,
                                mlp_base=self.mlp_log.base if self.mlp_log else 0, mlp_lines=self.mlp_lines,
                                mlp_host_addr=self.mlp_host_line)

    @property
    def col_lines(self) -> tuple[int, ...]:
        out, acc = [], 0
        for t in self.tables:
            out.append(acc)
            acc += t.lines_per_row
        return tuple(out)

    @property
    def row_pitch_lines(self) -> int:
        return row_pitch_for(self.tables)

    @property
    def vector_lines(self) -> int:
        """Lines of one sample's pooled vectors (the row pitch without its padding line)."""
        return sum(t.lines_per_row for t in self.tables)

    def regions(self) -> list[Region]:
        fixed = [self.sq, self.cq, self.table_descs, self.offsets, self.indices, self.weights, self.grads,
                 self.outputs]
        logs = [r for r in (self.emb_log, self.mlp_log) if r is not None]
        return [r for r in fixed if r is not None] + list(self.table_regions) + logs + [self.free]

    def row_line(self, t: int, row: int) -> int:
        return self.table_regions[t].base + row * self.tables[t].lines_per_row

    def vector_line(self, base: int, t: int, b: int) -> int:
        """First line of the (table t, sample b) vector in an outputs / gradients array."""
        return base + b * self.row_pitch_lines + self.col_lines[t]

    def table_descriptors(self) -> list[int]:
        """The TableDescriptor lines, one per table (mode, col_lines from this layout)."""
        return [pack_table_descriptor(base_addr=r.base, rows=t.rows, dim=t.dim, mode=POOL_MODES[t.mode],
                                      col_lines=c)
                for t, r, c in zip(self.tables, self.table_regions, self.col_lines)]

    def describe(self) -> str:
        return "\n".join(f"{r.name:<12} lines {r.base:>9} .. {r.end - 1:>9} ({r.lines} lines)"
                         for r in self.regions() if r.lines)


def pack_table_descriptor(*, base_addr: int, rows: int, dim: int, mode, col_lines: int, reserved: int = 0) -> int:
    return TABLE.pack(base_addr=base_addr, rows=rows, dim=dim, mode=mode, col_lines=col_lines, reserved=reserved)


def row_pitch_for(tables: Sequence[NdpTable]) -> int:
    """Lines per sample in the pooled outputs and gradients: the tables' dim/16 summed, then
    made odd (one padding line when the sum is even).

    Why odd: the device spreads consecutive lines over a power-of-two number of channels
    (hw/mem/port.py ``split_line_address``). Table t's vectors sit at ``base + b * pitch +
    col``, so with an even pitch the batch's vectors of one table fall on half of the
    channels or fewer (rm4: pitch 52, every one on one channel), and UPDATE, which reads
    them table by table, runs on one channel at a time. An odd pitch is coprime with the
    channel count and visits every channel in turn. The padding line is never read: the
    device reads only ``col_lines .. col_lines + dim/16`` of a row (hw/ndp/command.py).
    """
    pitch = sum(t.lines_per_row for t in tables)
    return pitch | 1


def _argument_lines(tables, batch_size, max_indices, has_weights, outputs_in_device) -> dict[str, int]:
    pitch = row_pitch_for(tables)
    sizes = {"offsets": lines_for(len(tables) * batch_size + 1), "indices": max(1, lines_for(max_indices))}
    if has_weights:
        sizes["weights"] = max(1, lines_for(max_indices))
    sizes["grads"] = batch_size * pitch
    if outputs_in_device:
        sizes["outputs"] = batch_size * pitch
    return sizes


def _rows_cap_that_fits(tables: Sequence[NdpTable], lines_for_tables: int) -> int:
    """Largest R with sum(min(rows, R) * dim/16) <= lines_for_tables (0 when none)."""
    def need(cap):
        return sum(min(t.rows, cap) * t.lines_per_row for t in tables)
    lo, hi = 0, max(t.rows for t in tables)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if need(mid) <= lines_for_tables:
            lo = mid
        else:
            hi = mid - 1
    return lo


def plan_layout(tables: Sequence[NdpTable], *, batch_size: int, max_indices: int, capacity_lines: int,
                has_weights: bool | None = None, ring_slots: int = 16, outputs_in_device: bool = True,
                reserve_lines: int = 0, emb_log: bool = False, log_max_rows: int | None = None,
                mlp_log_lines: int = 0, mlp_host_line: int = 0) -> DeviceLayout:
    """Place rings, descriptors, argument arrays and tables in ``capacity_lines`` lines.

    ``max_indices``: the largest indices array of any batch the layout must hold.
    ``has_weights``: reserve a weights array (default: iff a table pools weighted_sum).
    ``outputs_in_device``: reserve the pooled-output array in device memory (False when
    outputs are pushed to the host). ``reserve_lines``: keep that many lines free at the
    end (for later users).

    Checkpoint logs (after the tables, before ``free``): ``emb_log`` reserves the embedding
    undo log, two slots of ``2 + R * (1 + max dim/16)`` lines, R = ``log_max_rows`` (the most
    distinct rows a batch touches) or, when None, ``max_indices`` (every index distinct, the
    worst case); ``mlp_log_lines`` > 0 reserves the MLP log, two slots of 1 + that many
    lines, for the image at host line ``mlp_host_line``. ``DeviceLayout.log_region`` is then
    the ``CheckpointRegion`` to program (``NdpHost.program_checkpoint``).
    """
    tables = tuple(tables)
    if not 1 <= len(tables) <= MAX_TABLES:
        raise LayoutError(f"{len(tables)} tables; the device takes 1 to {MAX_TABLES}")
    if batch_size < 1:
        raise LayoutError(f"batch_size must be >= 1, got {batch_size}")
    if max_indices < 0:
        raise LayoutError(f"max_indices must be >= 0, got {max_indices}")
    if ring_slots < 2 or ring_slots > MAX_RING_SLOTS or ring_slots & (ring_slots - 1):
        raise LayoutError(f"ring_slots must be a power of two in [2, {MAX_RING_SLOTS}], got {ring_slots}")
    if has_weights is None:
        has_weights = any(t.mode == "weighted_sum" for t in tables)
    pitch = row_pitch_for(tables)
    if pitch >= 1 << 16:
        raise LayoutError(f"row pitch {pitch} lines does not fit the 16-bit row_pitch_lines field")
    args = _argument_lines(tables, batch_size, max_indices, has_weights, outputs_in_device)
    if log_max_rows is not None and log_max_rows < 0:
        raise LayoutError(f"log_max_rows must be >= 0, got {log_max_rows}")
    if mlp_log_lines < 0:
        raise LayoutError(f"mlp_log_lines must be >= 0, got {mlp_log_lines}")
    max_dim = max(t.dim for t in tables)
    slot_lines = slot_lines_for(max_indices if log_max_rows is None else log_max_rows, max_dim) if emb_log else 0
    log_lines = 2 * slot_lines + (2 * (1 + mlp_log_lines) if mlp_log_lines else 0)
    fixed = 2 * ring_slots + len(tables) + sum(args.values()) + reserve_lines + log_lines
    table_lines = sum(t.lines for t in tables)
    usable = min(capacity_lines, 1 << DEV_ADDR_BITS)
    if fixed + table_lines > usable:
        _raise_does_not_fit(tables, usable, fixed, table_lines, args, batch_size)
    cursor = 0

    def take(name: str, lines: int) -> Region:
        nonlocal cursor
        region = Region(name, cursor, lines)
        cursor += lines
        return region

    sq = take("sq", ring_slots)
    cq = take("cq", ring_slots)
    descs = take("table_descs", len(tables))
    placed = {name: take(name, lines) for name, lines in args.items()}
    table_regions = tuple(take(f"table{t}", tab.lines) for t, tab in enumerate(tables))
    emb_region = take("emb_log", 2 * slot_lines) if emb_log else None
    mlp_region = take("mlp_log", 2 * (1 + mlp_log_lines)) if mlp_log_lines else None
    free = Region("free", cursor, usable - cursor)
    return DeviceLayout(capacity_lines=capacity_lines, tables=tables, batch_size=batch_size,
                        max_indices=max_indices, ring_slots=ring_slots, sq=sq, cq=cq, table_descs=descs,
                        offsets=placed["offsets"], indices=placed["indices"], weights=placed.get("weights"),
                        grads=placed["grads"], outputs=placed.get("outputs"), table_regions=table_regions,
                        free=free, emb_log=emb_region, mlp_log=mlp_region, mlp_host_line=mlp_host_line)


def _raise_does_not_fit(tables, usable, fixed, table_lines, args, batch_size):
    need = fixed + table_lines
    mib = lambda lines: lines * LINE_BYTES / (1 << 20)   # noqa: E731
    text = (f"the model does not fit device memory: it needs {need} lines ({mib(need):.1f} MiB): tables "
            f"{table_lines}, argument arrays {sum(args.values())} "
            f"({', '.join(f'{k} {v}' for k, v in args.items())}), rings, descriptors and logs "
            f"{fixed - sum(args.values())}; the device has {usable} lines ({mib(usable):.1f} MiB). ")
    cap = _rows_cap_that_fits(tables, usable - fixed)
    if cap >= 1:
        text += f"Cap the rows at {cap} (--rows-cap {cap}) or use a larger device."
    else:
        per_sample = sum(args.values()) / batch_size
        fits_batch = max(0, int((usable - (fixed - sum(args.values())) - len(tables)) / max(per_sample, 1e-9)) // 2)
        text += (f"The argument arrays alone need {sum(args.values())} lines: use a smaller batch "
                 f"(about --batch-size {max(1, fits_batch)}) and a rows cap, or a larger device.")
    raise LayoutError(text)


# --------------------------------------------------------------------------------------------
# commands and completions
# --------------------------------------------------------------------------------------------
@dataclass
class NdpCommand:
    """A CommandDescriptor's fields; ``pack()`` gives the 64-byte line (as an int).

    ``opcode`` may be an int to build malformed commands (a reserved opcode)."""
    opcode: NdpOpcode | int
    num_tables: int
    batch_size: int
    tables_addr: int
    offsets_addr: int
    indices_addr: int
    row_pitch_lines: int
    weights_addr: int = 0
    grad_addr: int = 0
    out_addr: int = 0
    lr: float = 0.0
    out_to_host: bool = False
    has_weights: bool = False
    tag: int = 0
    batch: int = 0                # LOG, UPDATE (checkpoint), MLP_LOG: training batch number
    mlp_offset: int = 0           # MLP_LOG: first image line of the chunk
    mlp_count: int = 0            # MLP_LOG: lines in the chunk
    checkpoint: bool = False      # UPDATE: require batch's LOGGED record, then write APPLIED
    mlp_slot: int = 0             # MLP_LOG: the MLP log slot (0 / 1)
    index_count: int = 0          # LOOKUP, UPDATE, LOG: elements of indices (= offsets[T*B])

    def pack(self) -> int:
        flags = FLAGS.pack(out_to_host=int(self.out_to_host), has_weights=int(self.has_weights),
                           checkpoint=int(self.checkpoint), mlp_slot=int(self.mlp_slot))
        return COMMAND.pack(opcode=self.opcode, flags=flags, tag=self.tag, num_tables=self.num_tables,
                            batch_size=self.batch_size, tables_addr=self.tables_addr,
                            offsets_addr=self.offsets_addr, indices_addr=self.indices_addr,
                            weights_addr=self.weights_addr, grad_addr=self.grad_addr, out_addr=self.out_addr,
                            row_pitch_lines=self.row_pitch_lines, lr=f32_bits(self.lr), batch=self.batch,
                            mlp_offset=self.mlp_offset, mlp_count=self.mlp_count, index_count=self.index_count)

    @classmethod
    def unpack(cls, line: int) -> "NdpCommand":
        """The inverse of ``pack`` (the opcode stays an int when it is not an NdpOpcode)."""
        f = COMMAND.unpack(line)
        fl = FLAGS.unpack(f["flags"])
        try:
            opcode = NdpOpcode(f["opcode"])
        except ValueError:
            opcode = f["opcode"]
        return cls(opcode, f["num_tables"], f["batch_size"], f["tables_addr"], f["offsets_addr"],
                   f["indices_addr"], f["row_pitch_lines"], weights_addr=f["weights_addr"], grad_addr=f["grad_addr"],
                   out_addr=f["out_addr"], lr=float(np.uint32(f["lr"]).view(np.float32)),
                   out_to_host=bool(fl["out_to_host"]), has_weights=bool(fl["has_weights"]), tag=f["tag"],
                   batch=f["batch"], mlp_offset=f["mlp_offset"], mlp_count=f["mlp_count"],
                   checkpoint=bool(fl["checkpoint"]), mlp_slot=fl["mlp_slot"], index_count=f["index_count"])

    def replace(self, **changes) -> "NdpCommand":
        return dataclasses.replace(self, **changes)

    @property
    def opcode_value(self) -> int:
        return self.opcode.value if isinstance(self.opcode, NdpOpcode) else int(self.opcode)

    @property
    def name(self) -> str:
        try:
            return NdpOpcode(self.opcode_value).name
        except ValueError:
            return f"opcode {self.opcode_value:#x}"


def lookup_command(layout: DeviceLayout, *, index_count: int, has_weights: bool, out_line: int | None = None,
                   out_to_host: bool = False, tag: int = 0) -> NdpCommand:
    """LOOKUP of the batch in the layout's argument arrays (``index_count`` indices, the
    offsets' last value); pooled vectors to ``out_line`` (default: the layout's device output
    array; a host line when ``out_to_host``). After a LOOKUP error the outputs are undefined."""
    if out_line is None:
        if out_to_host or layout.outputs is None:
            raise ValueError("out_line is required for host outputs (the layout has no device output array)")
        out_line = layout.outputs.base
    return NdpCommand(NdpOpcode.LOOKUP, **_common_fields(layout, has_weights, index_count), out_addr=out_line,
                      out_to_host=out_to_host, tag=tag)


def update_command(layout: DeviceLayout, *, index_count: int, lr: float, has_weights: bool, tag: int = 0,
                   checkpoint_batch: int | None = None) -> NdpCommand:
    """UPDATE (sparse SGD) with the gradients in the layout's gradient array. With
    ``checkpoint_batch`` k: flags.checkpoint and batch k (the device requires batch k's
    LOGGED record and writes its APPLIED record)."""
    ckpt = {} if checkpoint_batch is None else {"checkpoint": True, "batch": checkpoint_batch}
    return NdpCommand(NdpOpcode.UPDATE, **_common_fields(layout, has_weights, index_count),
                      grad_addr=layout.grads.base,
                      lr=lr, tag=tag, **ckpt)


def log_command(layout: DeviceLayout, batch: int, *, index_count: int, has_weights: bool = False,
                tag: int = 0) -> NdpCommand:
    """LOG: undo-log the rows batch ``batch`` (the layout's argument arrays) will update."""
    return NdpCommand(NdpOpcode.LOG, **_common_fields(layout, has_weights, index_count), batch=batch, tag=tag)


def mlp_log_command(batch: int, offset: int, count: int, slot: int, *, tag: int = 0) -> NdpCommand:
    """MLP_LOG: copy image lines [offset, offset+count) into MLP slot ``slot`` (names no tables)."""
    return NdpCommand(NdpOpcode.MLP_LOG, 0, 0, 0, 0, 0, 0, batch=batch, mlp_offset=offset, mlp_count=count,
                      mlp_slot=slot, tag=tag)


def mlp_log_commands(batch: int, lines: int, slot: int, *, chunks: int = 1, tag: int = 0) -> list[NdpCommand]:
    """The MLP_LOG commands copying a whole ``lines``-line image in ``chunks`` (relaxed logging)."""
    if not 1 <= chunks <= max(1, lines):
        raise ValueError(f"chunks must be in [1, {lines}], got {chunks}")
    bounds = [lines * i // chunks for i in range(chunks + 1)]
    return [mlp_log_command(batch, a, b - a, slot, tag=tag + i) for i, (a, b) in enumerate(zip(bounds, bounds[1:]))]


def recover_command(*, tag: int = 0) -> NdpCommand:
    """RECOVER: scan the logs, roll back an interrupted batch, report in the CKPT_* CSRs."""
    return NdpCommand(NdpOpcode.RECOVER, 0, 0, 0, 0, 0, 0, tag=tag)


def _common_fields(layout: DeviceLayout, has_weights: bool, index_count: int) -> dict:
    if has_weights and layout.weights is None:
        raise ValueError("the layout has no weights array")
    if not 0 <= index_count <= layout.max_indices:
        raise ValueError(f"index_count {index_count} outside the layout's 0..{layout.max_indices}")
    return {"index_count": int(index_count), "num_tables": len(layout.tables), "batch_size": layout.batch_size,
            "tables_addr": layout.table_descs.base, "offsets_addr": layout.offsets.base,
            "indices_addr": layout.indices.base, "row_pitch_lines": layout.row_pitch_lines,
            "weights_addr": layout.weights.base if has_weights else 0, "has_weights": has_weights}


@dataclass(frozen=True)
class NdpCompletion:
    valid: int
    error: int
    tag: int
    opcode: int
    error_info: int
    cycles: int                   # descriptor fetch to the completion write (in the line)
    stats: dict
    total_cycles: int | None = None   # NDP_LAST_CYCLES: descriptor fetch to the durable completion

    @classmethod
    def unpack(cls, line: int) -> "NdpCompletion":
        f = COMPLETION.unpack(line)
        return cls(valid=f["valid"], error=f["error"], tag=f["tag"], opcode=f["opcode"],
                   error_info=f["error_info"], cycles=f["cycles"], stats=STATS.unpack(f["stats"]))

    @property
    def ok(self) -> bool:
        return self.error == NdpError.OK.value

    @property
    def error_name(self) -> str:
        return COMPLETION.name("error", self.error)

    def __str__(self) -> str:
        return (f"completion tag {self.tag:#x} {COMPLETION.name('opcode', self.opcode)}: {self.error_name} "
                f"(error_info {self.error_info}), {self.cycles} cycles, stats {self.stats}")


# --------------------------------------------------------------------------------------------
# simulator side
# --------------------------------------------------------------------------------------------
class Backdoor:
    """Bulk line access to the media that keeps the scoreboard's reference image in step.

    Arrays move whole: one store call per channel (sim/bfm/pmem.py), lines interleaved
    across channels as the device interleaves them (hw/mem/port.py)."""

    def __init__(self, env):
        self.env = env
        self.channels = env.config.channels

    def _per_channel(self, start: int, count: int):
        """(channel, local first line, rows of the range) for each channel with lines in it.
        A range's lines on one channel are consecutive local lines (each aligned group of N
        lines puts one line on every channel; hw/mem/port.py)."""
        channel, local = split_line_address(np.arange(start, start + count, dtype=np.int64), self.channels)
        for ch in range(self.channels):
            rows = np.flatnonzero(channel == ch)
            if rows.size:
                yield ch, int(local[rows[0]]), rows

    def write_array(self, start: int, values: np.ndarray) -> None:
        """The bytes of ``values`` (any little-endian numpy array, e.g. fp32 rows or u32
        indices) into consecutive lines from ``start``, the last line zero-padded."""
        raw = np.ascontiguousarray(values).reshape(-1).view(np.uint8)
        if raw.dtype.byteorder == ">":
            raise ValueError("big-endian arrays are not line data")
        lines = np.concatenate([raw, np.zeros(-raw.size % LINE_BYTES, np.uint8)]).reshape(-1, LINE_BYTES)
        n = lines.shape[0]
        if n == 0:
            return
        if start < 0 or start + n > self.env.config.capacity_lines:
            raise ValueError(f"backdoor write of lines {start}..{start + n - 1} outside device memory")
        for ch, local, rows in self._per_channel(start, n):
            self.env.media[ch].write_lines(local, lines[rows])
        self._sync_reference(start, lines)

    def read_array(self, start: int, count: int) -> np.ndarray:
        """Lines start..start+count-1 as a (count, 64) uint8 array."""
        out = np.empty((count, LINE_BYTES), dtype=np.uint8)
        for ch, local, rows in self._per_channel(start, count):
            out[rows] = self.env.media[ch].read_lines(local, rows.size)
        return out

    def write_lines(self, start: int, values: Sequence[int]) -> None:
        """Line ints (byte 0 = bits 7:0) into consecutive lines from ``start``."""
        self.write_array(start, np.frombuffer(b"".join(int(v).to_bytes(LINE_BYTES, "little") for v in values),
                                              dtype=np.uint8))

    def read_lines(self, start: int, count: int) -> list[int]:
        raw = self.read_array(start, count).tobytes()
        return [int.from_bytes(raw[i:i + LINE_BYTES], "little") for i in range(0, len(raw), LINE_BYTES)]

    def read_line(self, line: int) -> int:
        ch, local = split_line_address(line, self.channels)
        return self.env.media[ch].peek(local)

    def _sync_reference(self, start: int, lines: np.ndarray) -> None:
        """The scoreboard's image takes the loaded lines ((n, 64) uint8); versions recorded for
        these lines (host writes before the load) no longer describe them and are dropped."""
        self.env.model.load(start, lines)
        versions = self.env.scoreboard.mem.versions
        if versions:
            end = start + lines.shape[0]
            for line in [ln for ln in versions if start <= ln < end]:
                del versions[line]

    def sync_reference(self, start: int, count: int) -> None:
        """After the device wrote lines (outputs, tables): make the scoreboard expect them."""
        self._sync_reference(start, self.read_array(start, count))


class CxlMemPort:
    """Whole-line CXL.mem writes and reads through ``env.host`` that wait for their answer."""

    TAG_BASE = 0xE000          # tags 0xE000..0xEFFF are this port's (tests use others)

    def __init__(self, env, poll_cycles: int = 8):
        self.env = env
        self.poll_cycles = poll_cycles
        self._next = 0
        self._answers: dict[int, dict] = {}
        env.host.listeners.append(self)

    def _tag(self) -> int:
        tag = self.TAG_BASE + (self._next & 0xFFF)
        self._next += 1
        self._answers.pop((tag, "ndr"), None)
        self._answers.pop((tag, "drs"), None)
        return tag

    def host_line(self, device_line: int) -> int:
        return self.env.monitor.window[0] + device_line

    async def write_line(self, device_line: int, value: int) -> None:
        tag = self._tag()
        self.env.host.send_rwd(opcode=M2SRwDOpcode.MEM_WR, snp_type=SnpType.NO_OP, meta_field=MetaField.NO_OP,
                               meta_value=0, tag=tag, addr=self.host_line(device_line), data=value,
                               byte_enable=0, poison=0, ld_id=0)
        await self._wait(tag, "ndr", f"the Cmp of the write to line {device_line:#x}")

    async def read_line(self, device_line: int) -> int:
        tag = self._tag()
        self.env.host.send_req(opcode=M2SReqOpcode.MEM_RD, snp_type=SnpType.NO_OP, meta_field=MetaField.NO_OP,
                               meta_value=MetaValue.INVALID, tag=tag, addr=self.host_line(device_line), ld_id=0)
        return (await self._wait(tag, "drs", f"the data of the read of line {device_line:#x}"))["data"]

    async def _wait(self, tag: int, kind: str, what: str, timeout_cycles: int = 100_000) -> dict:
        from cocotb.triggers import Timer
        from sim.env import CLOCK_PERIOD_NS
        for _ in range(timeout_cycles // self.poll_cycles):
            if self.env.host.error is not None:
                raise self.env.host.error
            got = self._answers.pop((tag, kind), None)
            if got is not None:
                return got
            await Timer(self.poll_cycles * CLOCK_PERIOD_NS, unit="ns")
        raise TimeoutError(f"no {what} within {timeout_cycles} cycles")

    # CxlMemHost listener
    def on_m2s(self, seq, cycle, kind, fields):
        pass

    def on_s2m(self, cycle, kind, fields):
        tag = fields["tag"]
        if self.TAG_BASE <= tag < self.TAG_BASE + 0x1000:
            self._answers[(tag, kind)] = fields


class MediaCounters:
    """Completed media reads / writes per channel (pmem_media ``stat_reads`` / ``stat_writes``).

    They are visible only when the harness makes them public to VPI (sim/rtl/harness.vlt:
    ``public_flat_rd -module "pmem_media" -var "stat_reads"`` and ``"stat_writes"``);
    ``available`` says whether they are, and ``sample()`` returns None when not."""

    def __init__(self, env):
        self.handles = []
        try:
            for c in range(env.config.channels):
                media = getattr(env.dut, f"media{c}")
                self.handles.append((media.stat_reads, media.stat_writes))
        except AttributeError:
            self.handles = []

    @property
    def available(self) -> bool:
        return bool(self.handles)

    def sample(self) -> list[tuple[int, int]] | None:
        if not self.handles:
            return None
        return [(int(r.value), int(w.value)) for r, w in self.handles]

    @staticmethod
    def delta(before, after) -> list[tuple[int, int]] | None:
        if before is None or after is None:
            return None
        return [((r1 - r0) & 0xFFFF_FFFF, (w1 - w0) & 0xFFFF_FFFF) for (r0, w0), (r1, w1) in zip(before, after)]


class HostMemorySide:
    """The host side of CXL.cache for pushed outputs: a home agent owning host memory
    [base_line, base_line + lines), the wire driver, and the CXL.cache protocol monitor."""

    def __init__(self, env, base_line: int, lines: int):
        from sim.bfm.cxl_cache_host import CxlCacheHost
        from sim.checkers.cxl_cache_monitor import CxlCacheMonitor
        from sim.model.home_agent import HomeAgent
        from sim.env import CLOCK_PERIOD_NS
        cap = env.config.capacity_lines
        if base_line < env.monitor.window[0] + cap and base_line + lines > env.monitor.window[0]:
            raise ValueError(f"host memory {base_line:#x}+{lines} overlaps the HDM window")
        env.cache_traffic_expected = True
        self.env = env
        self.base_line = base_line
        self.lines = lines
        self.ha = HomeAgent((base_line, lines), device_hdm_range=(env.monitor.window[0], cap))
        self.monitor = CxlCacheMonitor(device_hdm=(env.monitor.window[0], cap))
        self.host = CxlCacheHost(env.dut, env.clk, self.ha, rng=random.Random(env.seed ^ 0xCAC4E),
                                 mem_host=env.host, period_ns=CLOCK_PERIOD_NS)
        self.host.listeners.append(self.monitor)
        env.host.listeners.append(self.monitor)
        self.host.start()

    def read_lines(self, start: int, count: int) -> list[int]:
        return [self.ha.read_memory(start + i) for i in range(count)]

    def check(self) -> list[str]:
        if self.host.link.error is not None:
            raise self.host.link.error
        problems = list(self.monitor.violations[:10]) + [f"home agent: {e}" for e in self.ha.protocol_errors[:10]]
        return problems

    def finish(self) -> None:
        self.monitor.finish(self.host.link.cycle)
        problems = self.check()
        assert not problems, f"seed {self.env.seed}: CXL.cache problems:\n" + "\n".join(problems)


class NdpHost:
    """The host driver of the NDP command rings on a DeviceEnv (see the module docstring)."""

    def __init__(self, env, layout: DeviceLayout, *, poll_cycles: int = 64, host_memory: HostMemorySide | None = None):
        if layout.capacity_lines > env.config.capacity_lines:
            raise LayoutError(f"layout planned for {layout.capacity_lines} lines, device has "
                              f"{env.config.capacity_lines}")
        self.env = env
        self.layout = layout
        self.poll_cycles = poll_cycles
        self.host_memory = host_memory
        self.backdoor = Backdoor(env)
        self.port = CxlMemPort(env)
        self.media = MediaCounters(env)
        self.submitted = 0            # commands submitted (the doorbell value, unwrapped)
        self.completed = 0            # commands whose completion was collected
        # Output arrays (line, from_host) -> why they hold no defined result: written by a
        # LOOKUP still running or one that failed (hw/ndp/command.py Completion).
        self._lookup_outputs: dict[int, tuple[int, bool]] = {}
        self._undefined_outputs: dict[tuple[int, bool], str] = {}
        self._busy_bit = field("NDP_STATUS", "BUSY")
        self._last_error = field("NDP_STATUS", "LAST_ERROR")
        self._last_tag = field("NDP_STATUS", "LAST_TAG")
        self._done_bit = field("STATUS", "NDP_DONE")

    # ---- setup
    async def start(self) -> None:
        """Program the rings (the device must be idle with empty rings)."""
        csr = self.env.csr
        await csr.write("NDP_SQ_BASE", self.layout.sq.base)
        await csr.write("NDP_CQ_BASE", self.layout.cq.base)
        size_log2 = field("NDP_RING", "SIZE_LOG2")
        await csr.write("NDP_RING", (self.layout.ring_slots.bit_length() - 1) << size_log2.lsb)
        head = await self._read_field("NDP_SQ_HEAD", "HEAD")
        await self._ring_doorbell(head)
        self.submitted = self.completed = head

    def load_tables(self, tables: Sequence[np.ndarray]) -> None:
        if len(tables) != len(self.layout.tables):
            raise ValueError(f"{len(tables)} tables given, the layout has {len(self.layout.tables)}")
        for t, (arr, spec, region) in enumerate(zip(tables, self.layout.tables, self.layout.table_regions)):
            if arr.shape != (spec.rows, spec.dim) or arr.dtype != np.float32:
                raise ValueError(f"table {t}: expected float32 {(spec.rows, spec.dim)}, got {arr.dtype} {arr.shape}")
            self.backdoor.write_array(region.base, arr.astype("<f4", copy=False))

    async def write_table_descriptors(self, lines: Sequence[int] | None = None) -> None:
        """Write the table descriptors (default: the layout's) over CXL.mem."""
        lines = self.layout.table_descriptors() if lines is None else lines
        for i, value in enumerate(lines):
            await self.port.write_line(self.layout.table_descs.base + i, value)

    def load_batch(self, offsets: np.ndarray, indices: np.ndarray, weights: np.ndarray | None = None, *,
                   garbage: np.random.Generator | None = None) -> None:
        """Offsets, indices (and weights) of one batch into the layout's argument arrays.
        ``garbage``: fill every element of those regions after the batch's (the rest of the
        last line and every later line) with random words from it, NaN, Inf and subnormal
        patterns included, as stale data a host leaves there; the device must not read them.
        Without it the rest of the last line is zero."""
        lay = self.layout
        if offsets.size != len(lay.tables) * lay.batch_size + 1:
            raise ValueError(f"offsets has {offsets.size} entries, expected T*B+1 = "
                             f"{len(lay.tables) * lay.batch_size + 1}")
        if indices.size > lay.max_indices:
            raise ValueError(f"{indices.size} indices exceed the layout's {lay.max_indices}")
        if weights is not None and lay.weights is None:
            raise ValueError("the layout has no weights array")
        arrays = [(lay.offsets, np.asarray(offsets, np.uint32)), (lay.indices, np.asarray(indices, np.uint32))]
        if weights is not None:
            arrays.append((lay.weights, np.asarray(weights, np.float32).view(np.uint32)))
        for region, values in arrays:
            if garbage is not None:
                values = np.concatenate([values, garbage_words(garbage, region.lines * FLOATS_PER_LINE - values.size)])
            self.backdoor.write_array(region.base, values.astype("<u4", copy=False))

    def load_gradients(self, grads: Sequence[np.ndarray], *, garbage: np.random.Generator | None = None) -> None:
        """Per-table (B, dim) fp32 pooled-output gradients into the [B][row pitch] array.
        ``garbage``: random words in each sample's padding line (never read), else zeros."""
        rows = self.interleave(grads, garbage=garbage)
        self.backdoor.write_array(self.layout.grads.base, rows.astype("<f4", copy=False))

    def interleave(self, per_table: Sequence[np.ndarray], *, garbage: np.random.Generator | None = None) -> np.ndarray:
        """Per-table (B, dim) arrays -> one (B, row pitch * 16) array: the TBE output layout,
        each sample's row padded to the row pitch (``row_pitch_for``) with zeros, or with
        random words from ``garbage``."""
        lay = self.layout
        for t, (arr, spec) in enumerate(zip(per_table, lay.tables)):
            if arr.shape != (lay.batch_size, spec.dim):
                raise ValueError(f"table {t}: expected {(lay.batch_size, spec.dim)}, got {arr.shape}")
        pad_words = lay.batch_size * (lay.row_pitch_lines - lay.vector_lines) * FLOATS_PER_LINE
        pad = (garbage_words(garbage, pad_words).view(np.float32) if garbage is not None
               else np.zeros(pad_words, np.float32)).reshape(lay.batch_size, -1)
        return np.concatenate([np.asarray(a, dtype=np.float32) for a in per_table] + [pad], axis=1)

    # ---- checkpoint
    async def program_checkpoint(self, region: CheckpointRegion | None = None,
                                 mlp_host_line: int | None = None) -> None:
        """Write the CKPT_* geometry CSRs (default: the layout's ``log_region``; the MLP image
        address from ``mlp_host_line`` or the region's ``mlp_host_addr``)."""
        region = self.layout.log_region if region is None else region
        if region is None:
            raise ValueError("the layout reserves no checkpoint log and no region was given")
        host = region.mlp_host_addr if mlp_host_line is None else mlp_host_line
        hi = field("CKPT_MLP_ADDR_HI", "ADDR")
        if host >> (32 + hi.width):
            raise ValueError(f"MLP host line {host:#x} does not fit {32 + hi.width} bits")
        csr = self.env.csr
        await csr.write("CKPT_LOG_BASE", region.log_base)
        await csr.write("CKPT_SLOT_LINES", region.slot_lines)
        await csr.write("CKPT_MLP_BASE", region.mlp_base)
        await csr.write("CKPT_MLP_LINES", region.mlp_lines)
        await csr.write("CKPT_MLP_ADDR_LO", host & 0xFFFF_FFFF)
        await csr.write("CKPT_MLP_ADDR_HI", ((host >> 32) << hi.lsb) & hi.mask)

    async def read_recovery(self) -> RecoveryResult:
        """The last RECOVER's report (CKPT_RECOVERED_EMB / _MLP / CKPT_RECOVER_STATUS) as a
        RecoveryResult (``error`` None: the completion carries it; no writes listed)."""
        csr = self.env.csr
        emb = await csr.read("CKPT_RECOVERED_EMB")
        mlp = await csr.read("CKPT_RECOVERED_MLP")
        status = await csr.read("CKPT_RECOVER_STATUS")

        def bit(name):
            f = field("CKPT_RECOVER_STATUS", name)
            return (status & f.mask) >> f.lsb
        return RecoveryResult(emb_valid=bool(bit("EMB_VALID")), emb_batches=emb, rolled_back=bool(bit("ROLLED_BACK")),
                              mlp_valid=bool(bit("MLP_VALID")), mlp_batch=mlp, mlp_slot=bit("MLP_SLOT"), error=None)

    # ---- commands
    async def submit(self, cmd: NdpCommand) -> int:
        """Write ``cmd`` into the next submission slot over CXL.mem and ring the doorbell.
        Returns the command's sequence number (for ``wait``)."""
        if self.submitted - self.completed >= self.layout.ring_slots:
            raise RuntimeError(f"submission ring full ({self.layout.ring_slots} commands outstanding)")
        seq = self.submitted
        if cmd.opcode_value == NdpOpcode.LOOKUP.value:
            key = (cmd.out_addr, cmd.out_to_host)
            self._lookup_outputs[seq] = key
            self._undefined_outputs[key] = f"LOOKUP {seq} has not completed"
        await self.port.write_line(self.layout.sq.base + seq % self.layout.ring_slots, cmd.pack())
        self.submitted += 1
        await self._ring_doorbell(self.submitted)
        return seq

    async def wait(self, seq: int, *, timeout_cycles: int = DEFAULT_TIMEOUT_CYCLES,
                   progress_cycles: int = 1_000_000) -> NdpCompletion:
        """Wait until command ``seq`` completed; return its Completion (CSRs cross-checked).
        Logs the progress every ``progress_cycles`` cycles of waiting."""
        from cocotb.triggers import Timer
        from sim.env import CLOCK_PERIOD_NS
        if seq < self.completed:
            raise ValueError(f"command {seq} was already collected")
        start = self.env.host.cycle
        next_report = start + progress_cycles
        head = self.completed
        while True:
            if self.env.host.error is not None:
                raise self.env.host.error
            if self.host_memory is not None and self.host_memory.host.link.error is not None:
                raise self.host_memory.host.link.error
            head = await self._head()
            if head > seq:
                break
            if self.env.host.cycle - start > timeout_cycles:
                raise TimeoutError(await self._progress(seq, head, start))
            if self.env.host.cycle >= next_report:
                self.env.dut._log.info(await self._progress(seq, head, start))
                next_report += progress_cycles
            await Timer(self.poll_cycles * CLOCK_PERIOD_NS, unit="ns")
        completion = NdpCompletion.unpack(self.backdoor.read_line(self.layout.cq.base + seq % self.layout.ring_slots))
        if not completion.valid:
            raise RuntimeError(f"command {seq}: NDP_SQ_HEAD passed it but its completion slot has valid = 0")
        if head == seq + 1:
            completion = await self._check_status_csrs(seq, completion)
        self.completed = max(self.completed, seq + 1)
        key = self._lookup_outputs.pop(seq, None)
        if key is not None and self._undefined_outputs.get(key, "").startswith(f"LOOKUP {seq} "):
            if completion.ok:
                del self._undefined_outputs[key]
            else:
                self._undefined_outputs[key] = f"LOOKUP {seq} failed with {completion.error_name}"
        return completion

    async def execute(self, cmd: NdpCommand, *, expect: NdpError = NdpError.OK,
                      timeout_cycles: int = DEFAULT_TIMEOUT_CYCLES) -> NdpCompletion:
        """Submit ``cmd``, wait for it, and raise NdpCommandError unless its error is ``expect``."""
        seq = await self.submit(cmd)
        completion = await self.wait(seq, timeout_cycles=timeout_cycles)
        if completion.tag != cmd.tag & 0xFFFF:
            raise RuntimeError(f"{cmd.name}: completion tag {completion.tag:#x}, submitted {cmd.tag:#x}")
        if completion.opcode != cmd.opcode_value & 0xFF:
            raise RuntimeError(f"{cmd.name}: completion opcode {completion.opcode}, submitted {cmd.opcode_value}")
        if completion.error != expect.value:
            raise NdpCommandError(f"seed {self.env.seed}: {cmd.name} (tag {cmd.tag:#x}) completed with "
                                  f"{completion.error_name}, expected {expect.name}: {completion}", completion)
        return completion

    async def _read_field(self, reg: str, name: str) -> int:
        f = field(reg, name)
        return (await self.env.csr.read(reg) & f.mask) >> f.lsb

    async def _ring_doorbell(self, count: int) -> None:
        tail = field("NDP_SQ_TAIL", "TAIL")
        await self.env.csr.write("NDP_SQ_TAIL", (count << tail.lsb) & tail.mask)

    async def _head(self) -> int:
        """NDP_SQ_HEAD, unwrapped against the commands submitted."""
        raw = await self._read_field("NDP_SQ_HEAD", "HEAD")
        head = self.submitted - ((self.submitted - raw) & 0xFFFF)
        if head < self.completed:
            raise RuntimeError(f"NDP_SQ_HEAD went back: {raw} ({head} < {self.completed} collected)")
        return head

    async def _progress(self, seq: int, head: int, start: int) -> str:
        status = await self.env.csr.read("NDP_STATUS")
        media = self.media.sample()
        text = (f"seed {self.env.seed}: command {seq} still running after {self.env.host.cycle - start} cycles: "
                f"NDP_SQ_HEAD {head}, submitted {self.submitted}, NDP_STATUS.BUSY "
                f"{(status >> self._busy_bit.lsb) & 1}, last error {(status >> self._last_error.lsb) & 0xFF}")
        if media is not None:
            text += ", media reads/writes per channel " + ", ".join(f"{r}/{w}" for r, w in media)
        return text

    async def _check_status_csrs(self, seq: int, c: NdpCompletion) -> NdpCompletion:
        """The status CSRs must repeat the completion (NDP_LAST_CYCLES also counts the
        completion write itself, so it is at least the completion's cycles); returns the
        completion with ``total_cycles`` = NDP_LAST_CYCLES."""
        csr = self.env.csr
        status = await csr.read("NDP_STATUS")
        seen = {"NDP_STATUS.LAST_ERROR": (status >> self._last_error.lsb) & 0xFF,
                "NDP_STATUS.LAST_TAG": (status >> self._last_tag.lsb) & 0xFFFF,
                "NDP_LAST_ERROR_INFO": await csr.read("NDP_LAST_ERROR_INFO")}
        want = {"NDP_STATUS.LAST_ERROR": c.error, "NDP_STATUS.LAST_TAG": c.tag, "NDP_LAST_ERROR_INFO": c.error_info}
        bad = [f"{k} = {seen[k]} but the completion says {want[k]}" for k in want if seen[k] != want[k]]
        total = await csr.read("NDP_LAST_CYCLES")
        if total < c.cycles:
            bad.append(f"NDP_LAST_CYCLES = {total} < the completion's {c.cycles} cycles")
        if bad:
            raise RuntimeError(f"seed {self.env.seed}: command {seq}: " + "; ".join(bad))
        if not (await csr.read("STATUS") >> self._done_bit.lsb) & 1:
            raise RuntimeError(f"seed {self.env.seed}: command {seq} completed but STATUS.NDP_DONE is 0")
        await csr.write("STATUS", 1 << self._done_bit.lsb)
        return dataclasses.replace(c, total_cycles=total)

    # ---- results
    def read_outputs(self, out_line: int | None = None, *, from_host: bool = False) -> list[np.ndarray]:
        """Pooled outputs per table, (B, dim) fp32, from device memory or host memory.
        Raises RuntimeError when the last LOOKUP into that array failed or has not completed
        (its contents are undefined)."""
        lay = self.layout
        key = (lay.outputs.base if out_line is None and lay.outputs is not None else out_line, from_host)
        if key in self._undefined_outputs:
            raise RuntimeError(f"the pooled outputs at line {key[0]:#x} are undefined: {self._undefined_outputs[key]}")
        count = lay.batch_size * lay.row_pitch_lines
        if from_host:
            if self.host_memory is None:
                raise ValueError("no host memory side attached")
            flat = lines_to_array(self.host_memory.read_lines(out_line, count), np.float32)
        else:
            flat = self.backdoor.read_array(lay.outputs.base if out_line is None else out_line, count).view("<f4")
        flat = flat.reshape(lay.batch_size, lay.row_pitch_lines * FLOATS_PER_LINE)
        out, col = [], 0
        for spec in lay.tables:
            out.append(flat[:, col:col + spec.dim].copy())
            col += spec.dim
        return out

    def read_table(self, t: int) -> np.ndarray:
        spec, region = self.layout.tables[t], self.layout.table_regions[t]
        flat = self.backdoor.read_array(region.base, region.lines).view("<f4").reshape(-1)
        return flat[:spec.rows * spec.dim].astype(np.float32).reshape(spec.rows, spec.dim)

    def read_rows(self, t: int, rows: Sequence[int]) -> np.ndarray:
        """Rows ``rows`` of table t, (len(rows), dim) fp32."""
        spec = self.layout.tables[t]
        lpr = spec.lines_per_row
        if len(rows) * 8 > spec.rows:           # many rows: one bulk read of the table is cheaper
            return self.read_table(t)[np.asarray(rows, dtype=np.int64)]
        out = np.empty((len(rows), lpr * FLOATS_PER_LINE), dtype=np.float32)
        for k, r in enumerate(rows):
            out[k] = self.backdoor.read_array(self.layout.row_line(t, int(r)), lpr).view("<f4").reshape(-1)
        return out[:, :spec.dim].copy()
