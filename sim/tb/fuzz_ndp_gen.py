"""Command generator of the NDP fuzz (pure Python; the bench is sim/tb/fuzz_ndp_tb.py).

Contract: ``FuzzGen(capacity_lines, rng)`` plans a small model (``FUZZ_TABLES``: four tables,
SUM / MEAN / WEIGHTED_SUM, dims 16-48, batch ``FUZZ_BATCH``) with ``plan_layout`` (an
embedding log reserved for LOG and checkpointed UPDATE) and produces ``Case`` objects:

- ``valid(op)``: a well-formed LOOKUP, UPDATE, checkpointed UPDATE (``ckpt_update``), LOG or
  NOP (NOP with every other field random) on a fresh random batch (bags of 0-5 indices,
  duplicate rows, signed weights, normal gradients).
- ``malformed(kinds)``: a valid LOOKUP, UPDATE or LOG with the faults ``kinds`` (names of
  ``FAULTS``) applied in turn, each one field of the command descriptor, of one table
  descriptor or of the argument arrays set to a chosen bad value. Some kinds are
  ``accepted``: the device must ignore or accept them (lr NaN / +-Inf / subnormal, garbage in
  unused and reserved fields); the golden validator (sim/model/ndp_validate.py), not the
  kind, decides what the device must answer.
- ``RING_FAULTS``: ring misuse, executed by the bench (not a descriptor).

A ``Case`` holds everything the device will see: the CommandDescriptor line (``line()``,
with reserved flag bits and bits after the struct when a fault sets them), the
TableDescriptor field dicts, and the whole offsets / indices / weights regions as they are
loaded (the batch, then random padding, so a fault that moves the array's end reads known
values), and the gradients. Addresses never point at the wrong region of the layout: every
address fault points at or beyond the end of device memory, so whatever the device would
have read or written is outside it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from hw.common.cxl_mem import LINE_ADDR_BITS
from hw.ndp.command import MAX_TABLES, CommandDescriptor, NdpOpcode, PoolMode
from sim.bfm.ndp_host import (COMMAND, FLAGS, TABLE, NdpCommand, NdpTable, f32_bits, lines_for, log_command,
                              lookup_command, plan_layout, update_command)
from sim.model.ndp_validate import MAX_BAG

FUZZ_TABLES = (NdpTable(64, 16, "sum"), NdpTable(40, 32, "mean"), NdpTable(48, 16, "weighted_sum"),
               NdpTable(24, 48, "sum"))
MEAN_TABLE = 1
WEIGHTED_TABLE = 2
FUZZ_BATCH = 4
MAX_BAG_LEN = 5
MAX_INDICES = len(FUZZ_TABLES) * FUZZ_BATCH * MAX_BAG_LEN
LR = 0.05
MODE_NAMES = {m.value: name for name, m in (("sum", PoolMode.SUM), ("mean", PoolMode.MEAN),
                                           ("weighted_sum", PoolMode.WEIGHTED_SUM))}
CMD_BITS = CommandDescriptor.as_shape().size
FLAGS_LSB = dict((n, o) for n, o, _ in COMMAND.fields)["flags"]
U32 = (1 << 32) - 1


@dataclass
class Case:
    op: str                                  # lookup, update, ckpt_update, log, nop
    cmd: NdpCommand
    descs: list[dict]
    offsets: np.ndarray                      # int64, the whole offsets region
    indices: np.ndarray                      # int64, the whole indices region
    weights: np.ndarray                      # float32, the whole weights region
    grads: list[np.ndarray]
    faults: list[str] = field(default_factory=list)
    flag_reserved: int = 0
    tail: int = 0                            # bits after the struct in the 64-byte line

    def line(self) -> int:
        return self.cmd.pack() | (FLAGS.pack(reserved=self.flag_reserved) << FLAGS_LSB) | (self.tail << CMD_BITS)

    def desc_lines(self) -> list[int]:
        return [TABLE.pack(**d) for d in self.descs]

    @property
    def nbags(self) -> int:
        """Bags of the arrays as generated (the layout's T*B; a fault may change the command's)."""
        return len(self.descs) * len(self.grads[0])


@dataclass(frozen=True)
class Fault:
    ops: tuple[str, ...]                     # the valid ops it is applied to
    apply: Callable[["FuzzGen", Case], None]
    accepted: bool = False                   # the device must accept the command
    combinable: bool = True                  # may be mixed with other faults


def _span(g, c):      # out / gradient array lines
    return c.cmd.batch_size * c.cmd.row_pitch_lines


def _beyond(g: "FuzzGen", lines: int, bits: int = 32) -> int:
    """A base address whose ``lines`` lines reach past the device's end: just past, or far."""
    r = g.rng.random()
    if r < 0.4:                              # the last line is the first one past the end
        return max(0, g.cap - lines + 1)
    if r < 0.6:
        return max(0, g.cap - lines + 1) + int(g.rng.integers(1, 4))
    if r < 0.8:
        return g.cap + int(g.rng.integers(0, 1 << 12))
    return int(g.rng.integers(g.cap, 1 << bits))


def _table(g, c) -> int:
    return int(g.rng.integers(0, len(c.descs)))


def _set_cmd(**kw):
    def apply(g, c):
        c.cmd = c.cmd.replace(**{k: (v(g, c) if callable(v) else v) for k, v in kw.items()})
    return apply


def _set_desc(name, value):
    def apply(g, c):
        t = _table(g, c)
        c.descs[t][name] = value(g, c, t)
    return apply


def _lpr(c, t):
    return c.descs[t]["dim"] // 16 if c.descs[t]["dim"] % 16 == 0 and c.descs[t]["dim"] else 1


def _bad_dim(g, c, t):
    return int(g.rng.choice([0, 8, 15, 17, 24, 100, 257, 272, 512, 0xFFFF]))


def _offsets_decrease(g, c):
    cand = [i for i in range(1, c.nbags) if c.offsets[i - 1] > 0]
    i = int(g.rng.choice(cand)) if cand else 1
    c.offsets[i] = int(g.rng.integers(0, max(1, c.offsets[i - 1])))
    if c.offsets[i] >= c.offsets[i - 1]:
        c.offsets[i - 1] += 1                # offsets[i-1] was 0: make the step down real


def _offset_above_last(g, c):
    i = int(g.rng.integers(1, c.nbags))
    c.offsets[i] = int(c.offsets[c.nbags]) + int(g.rng.integers(1, 20))


def _offsets_first(g, c):
    c.offsets[0] = int(g.rng.choice([1, 2, int(g.rng.integers(1, 1 << 16)), U32]))


def _offsets_last(g, c):
    end = int(c.offsets[c.nbags])
    c.offsets[c.nbags] = max(1, end + int(g.rng.choice([-3, -1, 1, 2, 7])))


def _index_count(g, c):
    n = c.cmd.index_count
    c.cmd = c.cmd.replace(index_count=int(g.rng.choice([max(0, n - 1), n + 1, n + 16, U32])))


def _index_range(g, c):
    """An index of table t (a non-empty one) set to rows(t) or more."""
    B = g.layout.batch_size
    spans = [(t, int(c.offsets[t * B]), int(c.offsets[(t + 1) * B])) for t in range(len(c.descs))]
    spans = [s for s in spans if s[2] > s[1]] or [(0, 0, 1)]
    t, lo, hi = spans[int(g.rng.integers(0, len(spans)))]
    rows = c.descs[t]["rows"]
    c.indices[int(g.rng.integers(lo, hi))] = int(g.rng.choice([rows, rows, rows, rows + 1,
                                                               rows + int(g.rng.integers(0, 1000)), U32])) & U32


def _long_bag(g, c):
    """One bag longer than 65535: in the MEAN table for LOOKUP (the limit is MEAN's there), in
    any table for UPDATE. The later offsets move with it; index_count follows."""
    B = c.cmd.batch_size
    t = MEAN_TABLE if c.op == "lookup" else int(g.rng.integers(0, len(c.descs)))
    k = t * B + int(g.rng.integers(0, B))
    extra = MAX_BAG + 1 + int(g.rng.integers(0, 64)) - int(c.offsets[k + 1] - c.offsets[k])
    c.offsets[k + 1:c.nbags + 1] += extra
    c.cmd = c.cmd.replace(index_count=int(c.offsets[c.nbags]))


def _pitch_huge(g, c):
    """A row pitch whose B rows reach past the end from the outputs (LOOKUP) / gradients (UPDATE)."""
    field = "out_addr" if c.op == "lookup" else "grad_addr"
    batch = max(1, c.cmd.batch_size)
    base = getattr(c.cmd, field)
    if (g.cap - base) // batch + 1 > 0xFFFF:
        # on a large device no 16-bit pitch reaches the end from here (the command would be
        # legal, its rows somewhere else): the array starts nearer the end instead
        base = g.cap - batch * 0x8000
        c.cmd = c.cmd.replace(**{field: base})
    low = max(1, (g.cap - base) // batch + 1)
    c.cmd = c.cmd.replace(row_pitch_lines=int(g.rng.integers(low, 1 << 16)))


def _many_tables(g) -> int:
    return int(g.rng.choice([MAX_TABLES + 1, int(g.rng.integers(MAX_TABLES + 1, 1 << 16))]))


def _huge_batch(g, c) -> int:
    """Offsets past the end (T*B+1 elements), or T*B at / past the u32 limit."""
    t = max(1, c.cmd.num_tables)
    return int(g.rng.choice([int(g.rng.integers(g.cap * 16, 1 << 32)), U32, min(U32, U32 // t + 1), U32 // t]))


def _lr(g, c):
    bits = int(g.rng.choice([0x7FC00000, 0xFFC00000, 0x7F800000, 0xFF800000, 0x00000001, 0x807FFFFF,
                             0x80000000, 0x00000000, f32_bits(-0.5), f32_bits(3.0e38)]))
    c.cmd = c.cmd.replace(lr=float(np.uint32(bits).view(np.float32)))


def _unused(g, c):
    """Random values in every field the opcode does not use, reserved flag bits, the line's tail."""
    r = g.rng
    kw = {"batch": int(r.integers(0, 1 << 32)), "mlp_offset": int(r.integers(0, 1 << 32)),
          "mlp_count": int(r.integers(0, 1 << 32)), "mlp_slot": int(r.integers(0, 2))}
    if c.op in ("lookup", "log"):
        kw.update(grad_addr=int(r.integers(0, 1 << 32)), lr=float(np.uint32(r.integers(0, 1 << 32)).view(np.float32)),
                  checkpoint=bool(r.integers(0, 2)))
    if c.op in ("update", "log"):
        kw.update(out_addr=int(r.integers(0, 1 << LINE_ADDR_BITS)), out_to_host=bool(r.integers(0, 2)))
    if c.op == "log":
        del kw["batch"]                      # LOG's batch names its slot
    c.cmd = c.cmd.replace(**kw)
    c.flag_reserved = int(r.integers(1, 16))
    c.tail = int.from_bytes(r.bytes(64), "little") >> CMD_BITS


def _table_reserved(g, c):
    t = _table(g, c)
    c.descs[t]["reserved"] = int(g.rng.integers(1, 1 << 14))


LUL = ("lookup", "update", "log")
FAULTS: dict[str, Fault] = {
    # command descriptor
    "opcode_reserved": Fault(LUL, _set_cmd(opcode=lambda g, c: int(g.rng.integers(6, 256)))),
    "num_tables_zero": Fault(LUL, _set_cmd(num_tables=0)),
    "num_tables_over": Fault(LUL, _set_cmd(num_tables=lambda g, c: _many_tables(g))),
    "batch_size_zero": Fault(LUL, _set_cmd(batch_size=0)),
    "batch_size_huge": Fault(LUL, _set_cmd(batch_size=lambda g, c: _huge_batch(g, c))),
    "tables_addr_end": Fault(LUL, _set_cmd(tables_addr=lambda g, c: _beyond(g, c.cmd.num_tables))),
    "offsets_addr_end": Fault(LUL, _set_cmd(offsets_addr=lambda g, c: _beyond(
        g, lines_for(c.cmd.num_tables * c.cmd.batch_size + 1)))),
    "out_addr_end": Fault(("lookup",), _set_cmd(out_addr=lambda g, c: _beyond(g, _span(g, c), LINE_ADDR_BITS))),
    "grad_addr_end": Fault(("update",), _set_cmd(grad_addr=lambda g, c: _beyond(g, _span(g, c)))),
    "indices_addr_end": Fault(LUL,
                              _set_cmd(indices_addr=lambda g, c: _beyond(g, lines_for(c.cmd.index_count)))),
    "weights_addr_end": Fault(("lookup", "update"),
                              _set_cmd(weights_addr=lambda g, c: _beyond(g, lines_for(c.cmd.index_count)))),
    "row_pitch_small": Fault(LUL,
                             _set_cmd(row_pitch_lines=lambda g, c: int(g.rng.integers(0, c.cmd.row_pitch_lines)))),
    "row_pitch_huge": Fault(("lookup", "update"), lambda g, c: _pitch_huge(g, c)),
    "index_count_mismatch": Fault(LUL, _index_count),
    "weights_flag_clear": Fault(LUL, _set_cmd(has_weights=False)),
    "checkpoint_not_logged": Fault(("update",), lambda g, c: g.not_logged(c)),
    "lr_special": Fault(("update",), _lr, accepted=True, combinable=False),
    "unused_fields_garbage": Fault(LUL, _unused, accepted=True),
    # table descriptor
    "dim_bad": Fault(LUL, _set_desc("dim", _bad_dim)),
    "rows_zero": Fault(LUL, _set_desc("rows", lambda g, c, t: 0)),
    "rows_fewer": Fault(LUL,
                        _set_desc("rows", lambda g, c, t: int(g.rng.integers(1, max(2, c.descs[t]["rows"]))))),
    "rows_past_end": Fault(LUL, _set_desc("rows", lambda g, c, t: int(g.rng.integers(
        max(1, (g.cap - c.descs[t]["base_addr"]) // _lpr(c, t) + 1), 1 << 32)))),
    "mode_reserved": Fault(LUL, _set_desc("mode", lambda g, c, t: 3)),
    "base_addr_end": Fault(LUL,
                           _set_desc("base_addr", lambda g, c, t: _beyond(g, c.descs[t]["rows"] * _lpr(c, t)))),
    "col_lines_bad": Fault(LUL, _set_desc("col_lines", lambda g, c, t: int(
        c.cmd.row_pitch_lines - _lpr(c, t) + 1 + g.rng.integers(0, 4)) & 0xFFFF)),
    "table_reserved_garbage": Fault(LUL, _table_reserved, accepted=True),
    # argument arrays
    "offsets_decrease": Fault(LUL, _offsets_decrease),
    "offset_above_last": Fault(LUL, _offset_above_last),
    "offsets_first_nonzero": Fault(LUL, _offsets_first),
    "offsets_last_mismatch": Fault(LUL, _offsets_last),
    "index_out_of_range": Fault(LUL, _index_range),
    "bag_too_long": Fault(LUL, _long_bag, combinable=False),
}
RING_FAULTS = ("ring_doorbell_repeat", "ring_tail_beyond_ring")
ALL_KINDS = tuple(FAULTS) + RING_FAULTS


class FuzzGen:
    def __init__(self, capacity_lines: int, rng: np.random.Generator, ring_slots: int = 8):
        self.cap = capacity_lines
        self.rng = rng
        self.layout = plan_layout(FUZZ_TABLES, batch_size=FUZZ_BATCH, max_indices=MAX_INDICES,
                                  capacity_lines=capacity_lines, has_weights=True, ring_slots=ring_slots,
                                  emb_log=True)
        self.logged: dict[int, int] = {}     # slot -> batch of its LOGGED record (the bench updates it)
        self._tag = 0

    def tag(self) -> int:
        self._tag = (self._tag + 1) & 0xFFFF
        return self._tag

    # ---- a batch
    def batch(self):
        lay, r = self.layout, self.rng
        T, B = len(lay.tables), lay.batch_size
        lengths = r.integers(0, MAX_BAG_LEN + 1, T * B)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        n = int(offsets[-1])
        idx = np.empty(n, np.int64)
        for t, tab in enumerate(lay.tables):
            lo, hi = offsets[t * B], offsets[(t + 1) * B]
            hot = r.integers(0, tab.rows, 3)          # a few hot rows: duplicates in and across bags
            pick = r.random(hi - lo) < 0.3
            idx[lo:hi] = np.where(pick, r.choice(hot, hi - lo), r.integers(0, tab.rows, hi - lo))
        weights = (r.uniform(-2.0, 2.0, n)).astype(np.float32)
        # the regions' remaining elements: known random values (some indices out of every range)
        off_pad = r.integers(0, 1 << 32, lay.offsets.lines * 16 - offsets.size)
        idx_pad = r.integers(0, 2 * max(t.rows for t in lay.tables), lay.indices.lines * 16 - n)
        w_pad = r.uniform(-2.0, 2.0, lay.weights.lines * 16 - n).astype(np.float32)
        grads = [r.standard_normal((B, tab.dim)).astype(np.float32) for tab in lay.tables]
        return (np.concatenate([offsets, off_pad]), np.concatenate([idx, idx_pad]),
                np.concatenate([weights, w_pad]), grads, n)

    def descs(self) -> list[dict]:
        return [TABLE.unpack(v) for v in self.layout.table_descriptors()]

    # ---- cases
    def valid(self, op: str) -> Case:
        lay = self.layout
        offsets, indices, weights, grads, n = self.batch()
        if op == "lookup":
            cmd = lookup_command(lay, index_count=n, has_weights=True, tag=self.tag())
        elif op == "update":
            cmd = update_command(lay, index_count=n, lr=LR, has_weights=True, tag=self.tag())
        elif op == "ckpt_update":
            slot = int(self.rng.choice(sorted(self.logged)))
            cmd = update_command(lay, index_count=n, lr=LR, has_weights=True, tag=self.tag(),
                                 checkpoint_batch=self.logged[slot])
        elif op == "log":
            cmd = log_command(lay, int(self.rng.integers(0, 1 << 32)), index_count=n, has_weights=True, tag=self.tag())
        elif op == "nop":
            r = self.rng
            cmd = NdpCommand(NdpOpcode.NOP, *(int(r.integers(0, 1 << b)) for b in (16, 32, 32, 32, 32, 16)),
                             weights_addr=int(r.integers(0, 1 << 32)), grad_addr=int(r.integers(0, 1 << 32)),
                             out_addr=int(r.integers(0, 1 << LINE_ADDR_BITS)), tag=self.tag(),
                             index_count=int(r.integers(0, 1 << 32)), batch=int(r.integers(0, 1 << 32)))
        else:
            raise ValueError(op)
        return Case(op, cmd, self.descs(), offsets, indices, weights, grads)

    def malformed(self, kinds: list[str]) -> Case:
        ops = set(FAULTS[kinds[0]].ops)
        for k in kinds[1:]:
            ops &= set(FAULTS[k].ops)
        op = str(self.rng.choice(sorted(ops)))
        case = self.valid(op)
        for k in kinds:
            FAULTS[k].apply(self, case)
            case.faults.append(k)
        return case

    def pick_kinds(self, multi: bool) -> list[str]:
        kinds = list(FAULTS)
        first = str(self.rng.choice(kinds))
        if not multi or not FAULTS[first].combinable:
            return [first]
        ops, chosen = set(FAULTS[first].ops), [first]
        rest = [k for k in kinds if k != first and FAULTS[k].combinable]
        for k in self.rng.choice(rest, int(self.rng.integers(1, 3)), replace=False):
            if ops & set(FAULTS[str(k)].ops):
                ops &= set(FAULTS[str(k)].ops)
                chosen.append(str(k))
        return chosen

    def not_logged(self, case: Case) -> None:
        """flags.checkpoint with a batch whose slot holds no LOGGED record of it."""
        while True:
            k = int(self.rng.integers(0, 1 << 32))
            if self.logged.get(k & 1) != k:
                break
        case.cmd = case.cmd.replace(checkpoint=True, batch=k)


def modes_of(descs: list[dict]) -> list[str]:
    return [MODE_NAMES[d["mode"]] for d in descs]

