"""``trainingcxl trace stats`` (sim/model/trace_stats.py, tools/trace_stats_cmd.py).

Each figure on a hand-made trace whose answer is known, the Zipf fit on traces drawn with a
known exponent, and the command (file and --preset) with its JSON and table.
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from sim.model.trace import Trace, TraceBatch, TraceKnobs, generate_trace, make_manifest, write_trace
from sim.model.trace_stats import fit_zipf, trace_stats
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
    code, cap = run(["trace", "stats", "--preset", "rm-tiny", "--seed", "2", "--batches", "3",
                     "--batch-size", "16"], capsys)
    assert code == 0 and json.loads(cap.out.strip().splitlines()[-1]) == s["total"]
    code, cap = run(["trace", "stats", str(tmp_path / "missing.npz")], capsys)
    assert code == 2 and "not a trace file" in cap.err and len(cap.err.strip().splitlines()) == 1
    code, cap = run(["trace", "stats"], capsys)
    assert code == 2 and "one of them" in cap.err
