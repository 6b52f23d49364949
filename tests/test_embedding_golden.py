"""The golden embedding model (sim/model/embedding.py) against hand-computed cases and PyTorch.

(a) pure numpy: fp32 fma against exact rationals, and every rule of architecture.md §5 on
    cases small enough to compute by hand (empty bags, order of additions, duplicates, MEAN
    division, fma != multiply-then-add, subnormals, bad input leaving tables untouched).
(b) PyTorch itself (torch==2.13.0, CPU) as the oracle: EmbeddingBag(sparse=True) forward in
    the three modes and backward + SGD.step(), compared bit for bit on rm-tiny traces with
    duplicates and empty bags. Skipped when torch is not importable.
"""
from __future__ import annotations

import numpy as np
import pytest

from sim.model.embedding import (EmbeddingInputError, contributions, fma_f32, fma_f32_reference, occurrence_rounds,
                                 pool, relaxed_pool, sgd_apply, tbe_forward, tbe_sgd_step)
from sim.model.trace import TraceKnobs, generate_trace

f32 = np.float32


def bits(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).view(np.int32)


def assert_bits_equal(got, want, what=""):
    got_bits, want_bits = bits(got), bits(want)
    bad = np.nonzero(got_bits != want_bits)
    assert got_bits.shape == want_bits.shape, what
    assert bad[0].size == 0, f"{what}: {bad[0].size} values differ, first at {tuple(b[0] for b in bad)}: " \
                             f"{np.asarray(got)[bad][0]!r} vs {np.asarray(want)[bad][0]!r}"


def offsets_of(lengths) -> np.ndarray:
    return np.r_[0, np.cumsum(lengths)].astype(np.uint32)


# --------------------------------------------------------------------------------------------
# (a) fp32 fma
# --------------------------------------------------------------------------------------------
def test_fma_where_float64_then_round_double_rounds():
    # a*a = 1 + 2^-11 + 2^-24 is an fp32 midpoint; c = 2^-80 pushes the exact sum above it, but
    # float64 absorbs c and the tie then rounds down to even: the naive way is wrong.
    a, c = f32(1 + 2.0 ** -12), f32(2.0 ** -80)
    naive = f32(np.float64(a) * np.float64(a) + np.float64(c))
    want = f32(1 + 2.0 ** -11 + 2.0 ** -23)
    assert naive == f32(1 + 2.0 ** -11)
    assert fma_f32(a, a, c) == want
    assert fma_f32_reference(a, a, c) == want
    # and the mirror image below the midpoint
    assert fma_f32(a, a, -c) == f32(1 + 2.0 ** -11)


def test_fma_matches_exact_rationals_on_hard_cases():
    rng = np.random.default_rng(20240601)
    n = 4000
    a = rng.standard_normal(n).astype(np.float32)
    b = (rng.standard_normal(n) * 2.0 ** rng.integers(-140, 20, n)).astype(np.float32)
    # c close to -a*b: massive cancellation; and c random: ordinary rounding; subnormal scales too
    near = (-(a.astype(np.float64) * b)).astype(np.float32) * (1 + rng.integers(-4, 5, n) * f32(2.0 ** -23))
    far = (rng.standard_normal(n) * 2.0 ** rng.integers(-149, 10, n)).astype(np.float32)
    for c in (near.astype(np.float32), far):
        got = fma_f32(a, b, c)
        want = np.array([fma_f32_reference(x, y, z) for x, y, z in zip(a, b, c)], dtype=np.float32)
        assert_bits_equal(got, want, "fma_f32 vs exact rationals")


def test_fma_signed_zeros_inf_nan():
    assert bits(fma_f32(f32(-0.0), f32(1.0), f32(-0.0))) == bits(f32(-0.0))
    assert bits(fma_f32(f32(-0.0), f32(1.0), f32(0.0))) == bits(f32(0.0))
    assert bits(fma_f32(f32(1.0), f32(1.0), f32(-1.0))) == bits(f32(0.0))
    assert fma_f32(f32(np.inf), f32(2.0), f32(1.0)) == np.inf
    assert np.isnan(fma_f32(f32(np.inf), f32(0.0), f32(1.0)))
    assert fma_f32(f32(3e38), f32(2.0), f32(0.0)) == np.inf


# --------------------------------------------------------------------------------------------
# (a) forward
# --------------------------------------------------------------------------------------------
def test_empty_bags_are_positive_zero_in_every_mode():
    table = np.full((4, 16), -1.5, dtype=np.float32)
    offsets = offsets_of([0, 2, 0])
    indices = np.array([1, 3], dtype=np.uint32)
    weights = np.array([2.0, -1.0], dtype=np.float32)
    for mode in ("sum", "mean", "weighted_sum"):
        out = pool(table, offsets, indices, mode, weights)
        assert_bits_equal(out[0], np.zeros(16, np.float32), mode)
        assert_bits_equal(out[2], np.zeros(16, np.float32), mode)


def test_sum_adds_in_index_order_from_positive_zero():
    table = np.zeros((3, 16), dtype=np.float32)
    table[0], table[1], table[2] = 1e8, 1.0, -1e8
    # ((+0 + 1e8) + 1) + -1e8 = 0 in fp32 (1e8 + 1 rounds back to 1e8); other orders give 1
    out = pool(table, offsets_of([3, 3]), np.array([0, 1, 2, 0, 2, 1], dtype=np.uint32), "sum")
    assert np.all(out[0] == 0.0) and np.all(out[1] == 1.0)
    # a bag of one -0.0 row is +0.0 (acc starts at +0.0)
    table[1] = -0.0
    out = pool(table, offsets_of([1]), np.array([1], dtype=np.uint32), "sum")
    assert_bits_equal(out[0], np.zeros(16, np.float32), "-0.0 row")


def test_weighted_sum_is_fused():
    table = np.zeros((2, 16), dtype=np.float32)
    table[0], table[1] = -1.0, 1 + 2.0 ** -12
    weights = np.array([1.0, 1 + 2.0 ** -12], dtype=np.float32)
    out = pool(table, offsets_of([2]), np.array([0, 1], dtype=np.uint32), "weighted_sum", weights)
    # fma(w1, row1, -1) = 2^-11 + 2^-24 exactly; multiply-then-add would give 2^-11
    assert np.all(out[0] == f32(2.0 ** -11 + 2.0 ** -24))
    assert f32(weights[1] * table[1, 0]) + f32(-1.0) == f32(2.0 ** -11)


def test_mean_divides_the_sum_by_length():
    table = np.zeros((2, 16), dtype=np.float32)
    table[0] = 1.1
    out = pool(table, offsets_of([5]), np.array([0, 1, 1, 1, 1], dtype=np.uint32), "mean")
    assert np.all(out[0] == f32(1.1) / f32(5))
    assert f32(1.1) / f32(5) != f32(1.1) * (f32(1) / f32(5))     # the case tells them apart


def test_subnormals_are_kept():
    tiny = f32(2.0 ** -149)
    table = np.full((2, 16), tiny, dtype=np.float32)
    out = pool(table, offsets_of([2]), np.array([0, 1], dtype=np.uint32), "sum")
    assert np.all(out == f32(2.0 ** -148))
    table[0] = f32(2.0 ** -130)
    out = pool(table, offsets_of([1]), np.array([0], dtype=np.uint32), "weighted_sum",
               np.array([2.0 ** -10], dtype=np.float32))
    assert np.all(out == f32(2.0 ** -140)) and 0 < out[0, 0] < np.finfo(np.float32).tiny


# --------------------------------------------------------------------------------------------
# (a) backward and update
# --------------------------------------------------------------------------------------------
def test_contributions_per_mode():
    gout = np.full((2, 16), 1.1, dtype=np.float32)
    offsets = offsets_of([5, 0])
    assert_bits_equal(contributions(gout, offsets, "sum"), np.full((5, 16), 1.1, np.float32))
    mean = contributions(gout, offsets, "mean")
    assert np.all(mean == f32(1.1) * (f32(1) / f32(5)))             # 0.22000001, not 1.1/5
    assert f32(1.1) * (f32(1) / f32(5)) != f32(1.1) / f32(5)
    w = np.array([0.5, 3.0, 1 / 3, -1, 0], dtype=np.float32)
    assert_bits_equal(contributions(gout, offsets, "weighted_sum", w), (gout[0] * w[:, None]).astype(np.float32))


def test_update_applies_duplicates_one_by_one_in_order():
    table = np.ones((3, 16), dtype=np.float32)
    g = np.full((2, 16), -(2.0 ** -24), dtype=np.float32)
    sgd_apply(table, np.array([1, 1], dtype=np.uint32), g, lr=1.0)
    # 1 + 2^-24 is a tie that rounds to 1, twice; a coalesced update would give 1 + 2^-23
    assert np.all(table == 1.0)
    # order matters and is the input order: fma(-lr, g, row) with lr rounded to fp32
    table = np.zeros((2, 16), dtype=np.float32)
    contrib = np.array([[3e-8] * 16, [1.0] * 16, [-7.0] * 16], dtype=np.float32)
    idx = np.array([1, 0, 1], dtype=np.uint32)
    sgd_apply(table, idx, contrib, lr=0.1)
    want = np.zeros((2, 16), dtype=np.float32)
    for j, r in enumerate(idx):
        want[r] = [fma_f32_reference(-f32(0.1), c, x) for c, x in zip(contrib[j], want[r])]
    assert_bits_equal(table, want, "sequential update")


def test_occurrence_rounds_keep_input_order_per_row():
    idx = np.array([5, 2, 5, 5, 2, 9], dtype=np.int64)
    rounds = occurrence_rounds(idx)
    assert [r.tolist() for r in rounds] == [[0, 1, 5], [2, 4], [3]]


def test_bad_input_is_rejected_before_any_write():
    tables = [np.ones((10, 16), np.float32), np.ones((4, 32), np.float32)]
    before = [t.copy() for t in tables]
    B = 2
    offsets = np.array([0, 1, 2, 3, 4], dtype=np.uint32)
    gouts = [np.ones((B, 16), np.float32), np.ones((B, 32), np.float32)]
    bad_index = np.array([0, 1, 2, 4], dtype=np.uint32)      # table 1 has 4 rows
    with pytest.raises(EmbeddingInputError, match="index 4 .*rows = 4"):
        tbe_sgd_step(tables, offsets, bad_index, ["sum", "sum"], B, gouts, 0.1)
    for t, b in zip(tables, before):
        assert_bits_equal(t, b, "table written despite bad input")
    good = np.array([0, 1, 2, 3], dtype=np.uint32)
    with pytest.raises(EmbeddingInputError, match="decrease"):
        tbe_forward(tables, np.array([0, 2, 1, 3, 4], np.uint32), good, ["sum", "sum"], B)
    with pytest.raises(EmbeddingInputError, match="T\\*B\\+1"):
        tbe_forward(tables, offsets[:-1], good, ["sum", "sum"], B)
    with pytest.raises(EmbeddingInputError, match="len\\(indices\\)"):
        tbe_forward(tables, np.array([0, 1, 2, 3, 3], np.uint32), good, ["sum", "sum"], B)
    with pytest.raises(EmbeddingInputError, match="needs per-index weights"):
        tbe_forward(tables, offsets, good, ["weighted_sum", "sum"], B)
    with pytest.raises(EmbeddingInputError, match="integer"):
        pool(tables[0], offsets, good.astype(np.float32))


# --------------------------------------------------------------------------------------------
# (a) relaxed lookup
# --------------------------------------------------------------------------------------------
def test_relaxed_pool_patches_stale_sum_with_deltas():
    stale = np.zeros((4, 16), dtype=np.float32)
    stale[0], stale[1], stale[2] = 1e8, 3.0, 5.0
    updated = stale.copy()
    updated[1] = 4.0                    # batch N changed row 1 (delta 1.0) and row 3 (none here)
    offsets = offsets_of([3, 1, 0])
    indices = np.array([0, 1, 2, 2], dtype=np.uint32)
    out = relaxed_pool(stale, updated, [1, 3], offsets, indices, "sum")
    # bag 0: ((0 + 1e8) + 3) + 5 = 1e8 + 8 (fp32 steps of 8), then + delta 1 -> 1e8 + 8
    assert np.all(out[0] == f32(f32(f32(f32(1e8) + f32(3)) + f32(5)) + f32(1)))
    assert np.all(out[1] == 5.0) and np.all(out[2] == 0.0)
    # with no updated rows it is the plain lookup of the stale table
    for mode in ("sum", "mean", "weighted_sum"):
        w = np.array([0.5, 2, 3, 1], np.float32)
        assert_bits_equal(relaxed_pool(stale, updated, [], offsets, indices, mode, w),
                          pool(stale, offsets, indices, mode, w), mode)
    # MEAN patches the sum, then divides
    out = relaxed_pool(stale, updated, [1], offsets_of([2]), np.array([1, 2], np.uint32), "mean")
    assert np.all(out[0] == f32(f32(f32(3) + f32(5)) + f32(1)) / f32(2))


# --------------------------------------------------------------------------------------------
# (b) PyTorch as the oracle
# --------------------------------------------------------------------------------------------
try:
    import torch
    TORCH_SKIP = None
except ImportError as e:    # pragma: no cover - depends on the environment
    torch = None
    TORCH_SKIP = f"torch is not importable ({e}); install the oracle: pip install torch==2.13.0"

needs_torch = pytest.mark.skipif(torch is None, reason=TORCH_SKIP or "")
TORCH_SEEDS = (1, 2, 3)
LR = 0.05


def random_tables(rng, trace) -> list[np.ndarray]:
    """Tables with mixed magnitudes so roundings of all kinds happen (and a few -0.0)."""
    tables = []
    for tab in trace.tables:
        scale = 2.0 ** rng.integers(-20, 20, (tab["rows"], tab["dim"]))
        t = (rng.standard_normal((tab["rows"], tab["dim"])) * scale).astype(np.float32)
        t[rng.random(t.shape) < 0.01] = -0.0
        tables.append(t)
    return tables


def torch_bag(table: np.ndarray, mode: str):
    bag = torch.nn.EmbeddingBag(table.shape[0], table.shape[1], mode="sum" if mode == "weighted_sum" else mode,
                                sparse=True)
    with torch.no_grad():
        bag.weight.copy_(torch.from_numpy(table))
    return bag


@needs_torch
@pytest.mark.parametrize("seed", TORCH_SEEDS)
@pytest.mark.parametrize("mode", ["sum", "mean", "weighted_sum"])
def test_against_torch_forward_backward_sgd(seed, mode, record_property):
    """Train every rm-tiny table in ``mode`` over a trace, comparing outputs and tables bit for bit."""
    trace = generate_trace("rm-tiny", 4, seed, TraceKnobs(batch_size=32, empty_prob=0.15, weights=True))
    rng = np.random.default_rng(seed)
    tables = random_tables(rng, trace)
    B = trace.batch_size
    bags = [torch_bag(t, mode) for t in tables]
    opts = [torch.optim.SGD(b.parameters(), lr=LR) for b in bags]
    compared, duplicates, empties = 0, 0, 0
    for batch in trace.batches:
        offs = batch.offsets.astype(np.int64)
        for t, table in enumerate(tables):
            toffs = offs[t * B:(t + 1) * B + 1]
            idx = batch.indices[toffs[0]:toffs[-1]].astype(np.int64)
            w = batch.weights[toffs[0]:toffs[-1]]
            local = toffs - toffs[0]
            duplicates += idx.size - np.unique(idx).size
            empties += int(np.sum(np.diff(local) == 0))
            gout = (rng.standard_normal((B, table.shape[1])) * 2.0 ** rng.integers(-10, 10, (B, 1))).astype(np.float32)

            out = bags[t](torch.from_numpy(idx), torch.from_numpy(local[:-1]),
                          per_sample_weights=torch.from_numpy(w) if mode == "weighted_sum" else None)
            want_out = out.detach().numpy()
            got_out = pool(table, local, idx, mode, w)
            assert_bits_equal(got_out, want_out, f"forward seed {seed} table {t}")

            opts[t].zero_grad()
            out.backward(torch.from_numpy(gout))
            opts[t].step()
            sgd_apply(table, idx, contributions(gout, local, mode, w), LR)
            assert_bits_equal(table, bags[t].weight.detach().numpy(), f"update seed {seed} table {t}")
            compared += got_out.size + table.size
    assert duplicates > 0 and empties > 0      # the trace exercised both
    record_property("values_compared", compared)
    print(f"seed {seed} mode {mode}: {compared} fp32 values equal to torch, "
          f"{duplicates} in-table duplicates, {empties} empty bags")


@needs_torch
@pytest.mark.parametrize("mode", ["sum", "mean", "weighted_sum"])
def test_against_torch_empty_bags_next_to_nonfinite_weights(mode):
    """An empty bag's offsets[b] is the next bag's first position: a +-Inf / NaN weight there
    belongs to the next bag only. PyTorch pools the empty bag to +0.0 and the golden model
    must too, forward and through one SGD step (the RTL is held to the golden model)."""
    table = (np.arange(8 * 16, dtype=np.float32).reshape(8, 16) - 40.0) / 8
    lengths = [0, 2, 0, 0, 1, 0, 3]                 # empty bags before every non-empty one
    offsets = offsets_of(lengths)
    indices = np.array([1, 2, 5, 7, 7, 0], dtype=np.int64)
    weights = np.array([np.inf, 0.5, np.nan, -np.inf, 2.0, 1.0], dtype=np.float32)   # at offsets[0,2,3,5]
    gout = np.linspace(-1, 1, len(lengths) * 16, dtype=np.float32).reshape(len(lengths), 16)
    bag = torch_bag(table, mode)
    opt = torch.optim.SGD(bag.parameters(), lr=LR)
    out = bag(torch.from_numpy(indices), torch.from_numpy(offsets[:-1].astype(np.int64)),
              per_sample_weights=torch.from_numpy(weights) if mode == "weighted_sum" else None)
    got = pool(table, offsets, indices, mode, weights)
    assert_bits_equal(got, out.detach().numpy(), mode)
    for b in np.flatnonzero(np.diff(offsets) == 0):
        assert_bits_equal(got[b], np.zeros(16, np.float32), f"{mode} empty bag {b}")
    out.backward(torch.from_numpy(gout))
    opt.step()
    sgd_apply(table, indices, contributions(gout, offsets, mode, weights), LR)
    assert_bits_equal(table, bag.weight.detach().numpy(), f"{mode} update")


@needs_torch
def test_against_torch_tbe_helpers():
    """tbe_forward / tbe_sgd_step (the TBE-layout entry points) agree with torch per table."""
    trace = generate_trace("rm-tiny", 2, 7, TraceKnobs(batch_size=16, empty_prob=0.2))
    rng = np.random.default_rng(7)
    tables = random_tables(rng, trace)
    ref = [t.copy() for t in tables]
    B, modes = trace.batch_size, trace.modes
    for batch in trace.batches:
        gouts = [rng.standard_normal((B, t.shape[1])).astype(np.float32) for t in tables]
        outs = tbe_forward(tables, batch.offsets, batch.indices, modes, B, batch.weights)
        tbe_sgd_step(tables, batch.offsets, batch.indices, modes, B, gouts, trace.manifest["optimizer"]["lr"],
                     batch.weights)
        offs = batch.offsets.astype(np.int64)
        for t in range(len(tables)):
            toffs = offs[t * B:(t + 1) * B + 1]
            idx = torch.from_numpy(batch.indices[toffs[0]:toffs[-1]].astype(np.int64))
            w = batch.weights[toffs[0]:toffs[-1]]
            bag = torch_bag(ref[t], modes[t])
            out = bag(idx, torch.from_numpy(toffs[:-1] - toffs[0]),
                      per_sample_weights=torch.from_numpy(w) if modes[t] == "weighted_sum" else None)
            assert_bits_equal(outs[t], out.detach().numpy(), f"tbe forward table {t}")
            out.backward(torch.from_numpy(gouts[t]))
            torch.optim.SGD(bag.parameters(), lr=trace.manifest["optimizer"]["lr"]).step()
            ref[t] = bag.weight.detach().numpy().copy()
            assert_bits_equal(tables[t], ref[t], f"tbe update table {t}")


def test_relaxed_pool_matches_a_scalar_loop_and_stays_close_to_strict():
    """Random rm-tiny batches: the vectorized relaxed lookup equals a plain per-bag loop, and
    differs from the strict (post-update) lookup only by rounding."""
    trace = generate_trace("rm-tiny", 2, 21, TraceKnobs(batch_size=16, empty_prob=0.1, weights=True))
    rng = np.random.default_rng(21)
    B = trace.batch_size
    first, second = trace.batches
    for t, tab in enumerate(trace.tables):
        stale = rng.standard_normal((tab["rows"], tab["dim"])).astype(np.float32)
        o1 = first.offsets.astype(np.int64)[t * B:(t + 1) * B + 1]
        touched = first.indices[o1[0]:o1[-1]].astype(np.int64)
        updated = stale.copy()
        gout = rng.standard_normal((B, tab["dim"])).astype(np.float32)
        sgd_apply(updated, touched, contributions(gout, o1, "sum"), 0.5)
        o2 = second.offsets.astype(np.int64)[t * B:(t + 1) * B + 1]
        for mode in ("sum", "mean", "weighted_sum"):
            got = relaxed_pool(stale, updated, touched, o2, second.indices, mode, second.weights)
            changed = set(touched.tolist())
            want = np.zeros_like(got)
            for b in range(B):
                bag = range(o2[b], o2[b + 1])
                acc = np.zeros(tab["dim"], np.float32)
                for j in bag:        # stale pooling, then the patches, in bag order
                    row, w = stale[second.indices[j]], second.weights[j]
                    acc = fma_f32(w, row, acc) if mode == "weighted_sum" else acc + row
                for j in bag:
                    r = int(second.indices[j])
                    if r in changed:
                        delta = updated[r] - stale[r]
                        acc = fma_f32(second.weights[j], delta, acc) if mode == "weighted_sum" else acc + delta
                if mode == "mean" and len(bag):
                    acc = acc / np.float32(len(bag))
                want[b] = acc
            assert_bits_equal(got, want, f"relaxed table {t} {mode}")
            strict = pool(updated, o2, second.indices, mode, second.weights)
            np.testing.assert_allclose(got, strict, rtol=1e-4, atol=1e-5)
