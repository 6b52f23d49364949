"""``trainingcxl trace stats`` (sim/model/trace_stats.py, tools/trace_stats_cmd.py).

Each figure on a hand-made trace whose answer is known, the Zipf fit on traces drawn with a
known exponent, the LRU row cache against stack distances computed one access at a time, and
the command (file and --preset) with its JSON and table.
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from sim.model.trace import Trace, TraceBatch, TraceKnobs, generate_trace, make_manifest, write_trace
from sim.model.trace_stats import fit_zipf, row_cache_hits, trace_stats
from tools.trace_cmd import add_trace_parser


def hand_trace(bags_per_batch: list[list[list[int]]]) -> Trace:
    """One table of 10 rows; each batch a list of B bags."""
    B = len(bags_per_batch[0])
    m = make_manifest("rm-tiny", len(bags_per_batch), 0, TraceKnobs(batch_size=B))
    m["tables"] = [dict(m["tables"][0], rows=10)]
    batches = []
    for bags in bags_per_batch:
        lens = [len(b) for b in bags]
        batches.append(TraceBatch(np.r_[0, np.cumsum(lens)].astype(np.uint32),
                                  np.array([i for b in bags for i in b], dtype=np.uint32), None,
                                  np.zeros((B, m["num_dense"]), np.float32), np.zeros(B, np.float32)))
    m["has_weights"] = False
    return Trace(m, batches)


def test_figures_on_a_hand_made_trace():
    # batch 0: bags [1,1,2] [3] -> 4 lookups, rows {1,2,3}, one in-bag repeat
    # batch 1: bags [2,4] [] -> rows {2,4}; of them 2 was in batch 0 -> reuse 1/2
    s = trace_stats(hand_trace([[[1, 1, 2], [3]], [[2, 4], []]]))
    t = s["per_table"][0]
    assert t["lookups_per_batch"] == 3.0 and t["rows_touched_per_batch"] == 2.5
    assert t["repeat_in_bag"] == round(1 / 6, 4)
    assert t["repeat_in_batch"] == round(1 / 6, 4)         # the only repeat is in a bag
    assert t["reuse_prev_batch"] == 0.5 and t["empty_bags"] == 0.25
    s2 = trace_stats(hand_trace([[[1, 2], [2, 3]]]))["per_table"][0]
    assert s2["repeat_in_bag"] == 0.0 and s2["repeat_in_batch"] == 0.25 and s2["reuse_prev_batch"] is None
    assert s["total"]["lookups"] == 6 and s["trace"] == {"preset": "rm-tiny", "seed": 0}


@pytest.mark.parametrize("alpha", [0.6, 1.15, 1.6])
def test_zipf_fit_recovers_the_exponent(alpha):
    rows = 2000
    rng = np.random.default_rng(4)
    p = np.arange(1, rows + 1, dtype=np.float64) ** -alpha
    counts = rng.multinomial(200_000, p / p.sum())
    assert abs(fit_zipf(rng.permutation(counts), rows) - alpha) < 0.05


def test_uniform_fits_near_zero_with_many_lookups():
    rng = np.random.default_rng(5)
    assert fit_zipf(np.bincount(rng.integers(0, 100, 100_000), minlength=100), 100) < 0.1


def test_generated_preset_shows_its_skew_and_reuse_knob():
    knobs = TraceKnobs(batch_size=256, rows_cap=1000)
    s = trace_stats(generate_trace("rm3", 3, 1, knobs))
    fitted = [t["zipf_alpha"] for t in s["per_table"]]
    assert all(abs(a - 1.15) < 0.1 for a in fitted), fitted
    low = trace_stats(generate_trace("rm-tiny", 4, 1, TraceKnobs(batch_size=32, reuse=0.0)))["total"]
    high = trace_stats(generate_trace("rm-tiny", 4, 1, TraceKnobs(batch_size=32, reuse=0.9)))["total"]
    assert high["reuse_prev_batch"] > low["reuse_prev_batch"] + 0.2


def run(argv, capsys):
    parser = argparse.ArgumentParser(prog="trainingcxl")
    add_trace_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args), capsys.readouterr()


def test_stats_command_file_and_preset(tmp_path, capsys):
    path = write_trace(tmp_path / "t.npz", generate_trace("rm-tiny", 3, 2, TraceKnobs(batch_size=16)))
    code, cap = run(["trace", "stats", str(path), "--json", str(tmp_path / "s.json")], capsys)
    assert code == 0, cap.err
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["tables"] == 4 and len(s["per_table"]) == 4 and s["trace"] == {"preset": "rm-tiny", "seed": 2}
    assert "zipf_alpha" in cap.out and "reuse_prev_batch" in cap.out and "total" in cap.out
    assert [c["kib"] for c in s["row_cache"]] == [256, 1024, 4096] and "LRU row cache 256 KiB" in cap.out
    code, cap = run(["trace", "stats", "--preset", "rm-tiny", "--seed", "2", "--batches", "3",
                     "--batch-size", "16"], capsys)
    assert code == 0 and json.loads(cap.out.strip().splitlines()[-1]) == s["total"]
    code, cap = run(["trace", "stats", str(tmp_path / "missing.npz")], capsys)
    assert code == 2 and "not a trace file" in cap.err and len(cap.err.strip().splitlines()) == 1
    code, cap = run(["trace", "stats"], capsys)
    assert code == 2 and "one of them" in cap.err
    code, cap = run(["trace", "stats", str(path), "--row-cache-kib", "64,x"], capsys)
    assert code == 2 and "--row-cache-kib" in cap.err and len(cap.err.strip().splitlines()) == 1
    code, cap = run(["trace", "stats", str(path), "--row-cache-kib", "64", "--json", str(tmp_path / "c.json")],
                    capsys)
    assert code == 0 and [c["kib"] for c in json.loads((tmp_path / "c.json").read_text())["row_cache"]] == [64]


# ---- the LRU row cache (sizing issue 15's hot-row cache)
def test_row_cache_by_hand():
    # 1-line rows, 2 lines of cache: 1 miss, 2 miss, 1 hit, 3 miss (evicts 2), 2 miss (evicts 1)
    tr = hand_trace([[[1, 2], [1, 3]], [[2], []]])
    tr.manifest["tables"][0]["dim"] = 16
    c = row_cache_hits(tr, 2)
    assert (c["occurrences"], c["hits"], c["media_lines"], c["lines"]) == (5, 1, 4, 5)
    assert row_cache_hits(tr, 3)["hits"] == 2           # 2 is still there at its second use


def test_row_cache_is_lru_by_stack_distance():
    """A row hits iff the distinct rows used since its last use, itself included, fit: the
    LRU stack property, computed here access by access (rows of 1 and 2 lines)."""
    rng = np.random.default_rng(3)
    B = 4
    m = make_manifest("rm-tiny", 3, 0, TraceKnobs(batch_size=B))
    m["tables"] = [dict(m["tables"][0], rows=12, dim=16), dict(m["tables"][1], rows=9, dim=32)]
    m["has_weights"] = False
    batches = []
    for _ in range(3):
        lens = rng.integers(0, 4, 2 * B)
        idx = np.concatenate([rng.zipf(1.3, n) % (12 if i < B else 9) for i, n in enumerate(lens)])
        batches.append(TraceBatch(np.r_[0, np.cumsum(lens)].astype(np.uint32), idx.astype(np.uint32), None,
                                  np.zeros((B, m["num_dense"]), np.float32), np.zeros(B, np.float32)))
    tr = Trace(m, batches)
    stream = []                                          # (key, lines) in command order
    for b in batches:
        offs = b.offsets.astype(int)
        for t, lines in ((0, 1), (1, 2)):
            stream += [((t, int(r)), lines) for r in b.indices[offs[t * B]:offs[(t + 1) * B]]]
    for capacity in range(2, 9):
        hits = 0
        for i, (key, lines) in enumerate(stream):
            prev = max((j for j in range(i) if stream[j][0] == key), default=None)
            if prev is not None:
                between = {k: n for k, n in stream[prev + 1:i] if k != key}
                hits += sum(between.values()) + lines <= capacity
        got = row_cache_hits(tr, capacity)
        assert got["hits"] == hits, capacity
        assert got["lines"] == sum(n for _, n in stream) and got["occurrences"] == len(stream)
