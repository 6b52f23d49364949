"""Golden numpy model of the embedding operators, bit-exact with PyTorch (architecture.md §5).

Contract
--------
All arithmetic is IEEE-754 binary32, round-to-nearest-even, subnormals kept; every operation
below is performed in exactly the order §5 states, one rounding per operation:

- ``pool(table, offsets, indices, mode, weights)`` -- forward of one table. ``offsets`` has
  B+1 entries (absolute positions in ``indices``), bag b = indices[offsets[b]:offsets[b+1]].
  SUM: acc = +0.0; acc = acc + row per index in order (each addition rounded).
  WEIGHTED_SUM: acc = +0.0; acc = fma(w_j, row, acc) (one rounding, ``fma_f32``).
  MEAN: the SUM result / fp32(L) (a correctly rounded division). Empty bag: +0.0 always.
- ``contributions(gout, offsets, mode, weights)`` -- the gradient each index occurrence sends
  to its row: gout[b] (SUM), fp32(gout[b] * w_j) (WEIGHTED_SUM), fp32(gout[b] * fp32(1/L))
  (MEAN), one row per index occurrence, in input order.
- ``sgd_apply(table, indices, contribution, lr)`` -- PyTorch's (non-coalesced) sparse SGD:
  for every occurrence in input order, row = fma(-fp32(lr), contribution, row). In place.
- ``tbe_forward`` / ``tbe_sgd_step`` -- the same over a table-batched (TBE) argument set:
  offsets of length T*B+1, table t's bags are offsets[t*B:(t+1)*B+1]; the update runs table
  by table, bag by bag, index by index.
- ``relaxed_pool`` -- the CXL configuration's relaxed lookup (see its docstring for the
  exact patch arithmetic this model defines).

Bad input (offsets not starting at 0, decreasing, or not ending at len(indices); an index
>= rows; wrong shapes or dtypes; a missing weight array) raises ``EmbeddingInputError``
before any table is written, as the device must end such a command before any table write.

Vectorization never changes the arithmetic: loops run over the position inside a bag (all
bags advance one index together) and, for the update, over the occurrence rank of a row (all
rows' k-th occurrences at once); within one step every element is an independent fp32
operation. fp32 fma is exact by round-to-odd in float64 (see ``fma_f32``).
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np

from . import fp32_ref

MODES = ("sum", "mean", "weighted_sum")


class EmbeddingInputError(ValueError):
    """Malformed embedding arguments (the device's bad-input error)."""


# --------------------------------------------------------------------------------------------
# fp32 fused multiply-add
# --------------------------------------------------------------------------------------------
def fma_f32(a, b, c) -> np.ndarray:
    """Correctly rounded fp32 fma(a, b, c) = RN(a*b + c), elementwise, with broadcasting.

    The one implementation is ``sim/model/fp32_ref.fma`` (exact float64 product, TwoSum,
    round to odd, then one rounding to fp32; the proof sketch is there); this adapts it to
    float32 values. ``fma_f32_reference`` below checks it independently with rationals.
    """
    a, b, c = (np.asarray(v, dtype=np.float32) for v in (a, b, c))
    shape = np.broadcast_shapes(a.shape, b.shape, c.shape)
    bits = fp32_ref.fma(a.view(np.uint32), b.view(np.uint32), c.view(np.uint32))
    return np.asarray(bits, dtype=np.uint32).view(np.float32).reshape(shape)


def _round_fraction_f32(x: Fraction) -> np.float32:
    """Exact rational -> nearest fp32 (ties to even), subnormals and overflow included."""
    if x == 0:
        return np.float32(0.0)
    sign = -1 if x < 0 else 1
    m = abs(x)
    e = m.numerator.bit_length() - m.denominator.bit_length()
    if Fraction(2) ** e > m:
        e -= 1
    quantum = Fraction(2) ** (max(e, -126) - 23)
    scaled = m / quantum
    n = scaled.numerator // scaled.denominator
    rem = scaled - n
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and n % 2):
        n += 1
    value = n * quantum
    if value >= Fraction(2) ** 128:
        return np.float32(sign * np.inf)
    return np.float32(sign * float(value))


def fma_f32_reference(a: float, b: float, c: float) -> np.float32:
    """Scalar fp32 fma through exact rationals (slow; the independent check of ``fma_f32``).

    Finite inputs only. An exact zero result takes the sign IEEE gives a sum of zeros
    (-0 only when both a*b and c are -0).
    """
    a, b, c = (np.float32(v) for v in (a, b, c))
    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    if exact == 0:
        both_negative_zeros = (a == 0 or b == 0) and c == 0 and np.signbit(a) != np.signbit(b) and np.signbit(c)
        return np.float32(-0.0) if both_negative_zeros else np.float32(0.0)
    return _round_fraction_f32(exact)


# --------------------------------------------------------------------------------------------
# argument checks
# --------------------------------------------------------------------------------------------
def _as_int_array(name: str, a) -> np.ndarray:
    arr = np.asarray(a)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise EmbeddingInputError(f"{name} must be a 1-D integer array, got dtype {arr.dtype} shape {arr.shape}")
    return arr.astype(np.int64)


def check_bags(offsets, indices, rows: int, num_bags: int | None = None, *, base: int | None = 0,
               what: str = "table") -> tuple[np.ndarray, np.ndarray]:
    """Validate one table's bags; return (offsets, indices) as int64.

    ``base``: the value offsets[0] must have (None: any). ``offsets[-1]`` must not exceed
    len(indices) (equal to it when base is 0 and the offsets cover a whole argument set).
    """
    offs = _as_int_array(f"{what} offsets", offsets)
    idx = _as_int_array(f"{what} indices", indices)
    if offs.size < 1:
        raise EmbeddingInputError(f"{what}: offsets must have at least one entry")
    if num_bags is not None and offs.size != num_bags + 1:
        raise EmbeddingInputError(f"{what}: offsets has {offs.size} entries, expected {num_bags + 1}")
    if base is not None and offs[0] != base:
        raise EmbeddingInputError(f"{what}: offsets[0] = {offs[0]}, expected {base}")
    steps = np.diff(offs)
    if np.any(steps < 0):
        b = int(np.nonzero(steps < 0)[0][0])
        raise EmbeddingInputError(f"{what}: offsets decrease at bag {b} ({offs[b]} -> {offs[b + 1]})")
    if offs[-1] > idx.size or offs[0] < 0:
        raise EmbeddingInputError(f"{what}: offsets range [{offs[0]}, {offs[-1]}] exceeds {idx.size} indices")
    used = idx[offs[0]:offs[-1]]
    if used.size and (used.max() >= rows or used.min() < 0):
        pos = int(np.nonzero((used >= rows) | (used < 0))[0][0]) + int(offs[0])
        raise EmbeddingInputError(f"{what}: index {idx[pos]} at position {pos} out of range (rows = {rows})")
    return offs, idx


def _check_mode(mode: str, weights, n_indices: int, what: str):
    if mode not in MODES:
        raise EmbeddingInputError(f"{what}: pooling mode {mode!r} not in {MODES}")
    if mode != "weighted_sum":
        return None
    if weights is None:
        raise EmbeddingInputError(f"{what}: weighted_sum needs per-index weights")
    w = np.asarray(weights)
    if w.dtype != np.float32 or w.ndim != 1 or w.size < n_indices:
        raise EmbeddingInputError(f"{what}: weights must be 1-D float32 covering every index, got "
                                  f"dtype {w.dtype} shape {w.shape} for {n_indices} indices")
    return w


def _check_table(table, what: str) -> np.ndarray:
    if not isinstance(table, np.ndarray) or table.dtype != np.float32 or table.ndim != 2:
        raise EmbeddingInputError(f"{what}: table must be a 2-D float32 numpy array")
    return table


# --------------------------------------------------------------------------------------------
# forward
# --------------------------------------------------------------------------------------------
def _pool_sum(table, starts, lengths, idx, mode, weights) -> np.ndarray:
    """Un-divided pooled sum: SUM or WEIGHTED_SUM accumulation, bag positions in order."""
    acc = np.zeros((lengths.size, table.shape[1]), dtype=np.float32)    # +0.0
    for k in range(int(lengths.max(initial=0))):
        live = np.nonzero(lengths > k)[0]
        pos = starts[live] + k
        rows = table[idx[pos]]
        if mode == "weighted_sum":
            acc[live] = fma_f32(weights[pos][:, None], rows, acc[live])
        else:
            acc[live] = acc[live] + rows
    return acc


def _divide_mean(acc: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    nonempty = lengths > 0                     # empty bags stay +0.0
    acc[nonempty] = acc[nonempty] / lengths[nonempty].astype(np.float32)[:, None]
    return acc


def pool(table: np.ndarray, offsets, indices, mode: str = "sum", weights=None) -> np.ndarray:
    """Pooled output (B, dim) fp32 of one table; ``offsets`` has B+1 absolute entries."""
    table = _check_table(table, "pool")
    offs, idx = check_bags(offsets, indices, table.shape[0], base=None)
    w = _check_mode(mode, weights, idx.size, "pool")
    starts, lengths = offs[:-1], np.diff(offs)
    acc = _pool_sum(table, starts, lengths, idx, mode, w)
    return _divide_mean(acc, lengths) if mode == "mean" else acc


def _table_offsets(offsets: np.ndarray, t: int, batch_size: int) -> np.ndarray:
    return offsets[t * batch_size:(t + 1) * batch_size + 1]


def check_tbe(tables, offsets, indices, modes, weights, batch_size: int):
    """Validate a whole TBE argument set; return (offsets, indices) as int64."""
    num_tables = len(tables)
    if len(modes) != num_tables:
        raise EmbeddingInputError(f"{len(modes)} pooling modes for {num_tables} tables")
    offs = _as_int_array("offsets", offsets)
    idx = _as_int_array("indices", indices)
    if offs.size != num_tables * batch_size + 1:
        raise EmbeddingInputError(f"offsets has {offs.size} entries, expected T*B+1 = {num_tables * batch_size + 1}")
    if offs[0] != 0 or offs[-1] != idx.size:
        raise EmbeddingInputError(f"offsets must run from 0 to len(indices) = {idx.size}, got {offs[0]}..{offs[-1]}")
    for t, table in enumerate(tables):
        _check_table(table, f"table {t}")
        check_bags(_table_offsets(offs, t, batch_size), idx, table.shape[0], batch_size, base=None,
                   what=f"table {t}")
        _check_mode(modes[t], weights, idx.size, f"table {t}")
    return offs, idx


def tbe_forward(tables, offsets, indices, modes, batch_size: int, weights=None) -> list[np.ndarray]:
    """Pooled outputs of every table: a list of (B, dim_t) fp32 arrays."""
    offs, idx = check_tbe(tables, offsets, indices, modes, weights, batch_size)
    return [pool(tables[t], _table_offsets(offs, t, batch_size), idx, modes[t], weights)
            for t in range(len(tables))]


# --------------------------------------------------------------------------------------------
# backward and update
# --------------------------------------------------------------------------------------------
def contributions(gout: np.ndarray, offsets, mode: str = "sum", weights=None) -> np.ndarray:
    """Per-occurrence gradient rows (n, dim) fp32 for indices[offsets[0]:offsets[-1]]."""
    offs = _as_int_array("offsets", offsets)
    gout = np.asarray(gout)
    if gout.dtype != np.float32 or gout.ndim != 2 or gout.shape[0] != offs.size - 1:
        raise EmbeddingInputError(f"gout must be float32 (B, dim) with B = {offs.size - 1}, got "
                                  f"{gout.dtype} {gout.shape}")
    lengths = np.diff(offs)
    if np.any(lengths < 0):
        raise EmbeddingInputError("offsets decrease")
    bag_of = np.repeat(np.arange(lengths.size), lengths)
    g = gout[bag_of]
    if mode == "sum":
        return g
    if mode == "weighted_sum":
        w = _check_mode(mode, weights, int(offs[-1]), "contributions")[offs[0]:offs[-1]]
        return g * w[:, None]
    if mode == "mean":
        with np.errstate(divide="ignore"):
            inv = np.float32(1.0) / lengths.astype(np.float32)     # fp32(1/L), unused when L = 0
        return g * inv[bag_of][:, None]
    raise EmbeddingInputError(f"pooling mode {mode!r} not in {MODES}")


def occurrence_rounds(indices: np.ndarray) -> list[np.ndarray]:
    """Positions of ``indices`` grouped into rounds: round k holds every row's k-th occurrence.

    Each round touches distinct rows, and a row's occurrences fall in successive rounds in
    input order, so applying rounds in order is the sequential per-occurrence order.
    """
    idx = np.asarray(indices, dtype=np.int64)
    n = idx.size
    if n == 0:
        return []
    by_row = np.argsort(idx, kind="stable")
    sorted_rows = idx[by_row]
    group_start = np.r_[0, np.nonzero(np.diff(sorted_rows))[0] + 1]
    group_len = np.diff(np.r_[group_start, n])
    rank = np.empty(n, dtype=np.int64)
    rank[by_row] = np.arange(n) - np.repeat(group_start, group_len)
    order = np.lexsort((np.arange(n), rank))
    counts = np.bincount(rank)
    return np.split(order, np.cumsum(counts)[:-1])


def sgd_apply(table: np.ndarray, indices, contribution: np.ndarray, lr: float) -> None:
    """In place: row = fma(-fp32(lr), contribution, row) per occurrence, in input order."""
    table = _check_table(table, "sgd_apply")
    idx = _as_int_array("indices", indices)
    if idx.size and (idx.max() >= table.shape[0] or idx.min() < 0):
        raise EmbeddingInputError(f"sgd_apply: index out of range (rows = {table.shape[0]})")
    if contribution.shape != (idx.size, table.shape[1]) or contribution.dtype != np.float32:
        raise EmbeddingInputError(f"sgd_apply: contribution must be float32 {(idx.size, table.shape[1])}")
    neg_lr = -np.float32(lr)
    for positions in occurrence_rounds(idx):
        rows = idx[positions]
        table[rows] = fma_f32(neg_lr, contribution[positions], table[rows])


def tbe_sgd_step(tables, offsets, indices, modes, batch_size: int, gouts, lr: float, weights=None) -> None:
    """Backward + sparse SGD of every table, in place; all checks happen before any write."""
    offs, idx = check_tbe(tables, offsets, indices, modes, weights, batch_size)
    if len(gouts) != len(tables):
        raise EmbeddingInputError(f"{len(gouts)} output gradients for {len(tables)} tables")
    per_table = []
    for t, table in enumerate(tables):
        toffs = _table_offsets(offs, t, batch_size)
        contrib = contributions(gouts[t], toffs, modes[t], weights)
        if contrib.shape[1] != table.shape[1]:
            raise EmbeddingInputError(f"table {t}: gout dim {contrib.shape[1]} != table dim {table.shape[1]}")
        per_table.append((idx[toffs[0]:toffs[-1]], contrib))
    for table, (tidx, contrib) in zip(tables, per_table):
        sgd_apply(table, tidx, contrib, lr)


# --------------------------------------------------------------------------------------------
# relaxed lookup (CXL configuration)
# --------------------------------------------------------------------------------------------
def relaxed_pool(stale_table: np.ndarray, updated_table: np.ndarray, updated_rows, offsets, indices,
                 mode: str = "sum", weights=None) -> np.ndarray:
    """Relaxed lookup of batch N+1 for one table.

    ``stale_table`` is the table before batch N's update, ``updated_table`` after it, and
    ``updated_rows`` the rows batch N's update touched (its indices). The order this model
    defines (architecture.md §5 names the idea, not the arithmetic; the RTL must follow this):
    1. pool the un-divided SUM / WEIGHTED_SUM of every bag from ``stale_table`` exactly as
       ``pool`` does (acc = +0.0, index by index);
    2. delta[r] = fp32(updated[r] - stale[r]) for every row r in ``updated_rows``;
    3. then, per bag, for every index j of the bag in order whose row was updated:
       acc = acc + delta[row] (SUM, MEAN) or acc = fma(w_j, delta[row], acc) (WEIGHTED_SUM);
    4. MEAN divides the patched sum by fp32(L) last; empty bags stay +0.0.
    The result differs from ``pool(updated_table, ...)`` in the last bits, by design.
    """
    stale_table = _check_table(stale_table, "relaxed_pool stale table")
    updated_table = _check_table(updated_table, "relaxed_pool updated table")
    if stale_table.shape != updated_table.shape:
        raise EmbeddingInputError("relaxed_pool: stale and updated tables differ in shape")
    offs, idx = check_bags(offsets, indices, stale_table.shape[0], base=None)
    w = _check_mode(mode, weights, idx.size, "relaxed_pool")
    changed = np.zeros(stale_table.shape[0], dtype=bool)
    touched = np.asarray(updated_rows)
    touched = _as_int_array("updated_rows", touched.astype(np.int64) if touched.size == 0 else touched)
    if touched.size and (touched.max() >= changed.size or touched.min() < 0):
        raise EmbeddingInputError(f"relaxed_pool: updated row out of range (rows = {changed.size})")
    changed[touched] = True
    delta = np.zeros_like(stale_table)
    delta[changed] = updated_table[changed] - stale_table[changed]
    starts, lengths = offs[:-1], np.diff(offs)
    acc = _pool_sum(stale_table, starts, lengths, idx, mode, w)
    for k in range(int(lengths.max(initial=0))):
        live = np.nonzero(lengths > k)[0]
        pos = starts[live] + k
        hit = changed[idx[pos]]
        live, pos = live[hit], pos[hit]
        rows = delta[idx[pos]]
        if mode == "weighted_sum":
            acc[live] = fma_f32(w[pos][:, None], rows, acc[live])
        else:
            acc[live] = acc[live] + rows
    return _divide_mean(acc, lengths) if mode == "mean" else acc
