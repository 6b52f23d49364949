"""Campaigns sharded on Ray (tools/shard.py): results in unit order whatever finishes first,
a failed unit named, progress on stderr; and end to end, a chunked crash campaign and a small
evaluation give the same JSON serially and on 2 local Ray workers (``wall_seconds`` aside: it
is the only key that differs between any two runs).
"""
from __future__ import annotations

import argparse
import json
import time

import pytest

from tools.shard import ShardError, run_units


def slow_square(x: int) -> int:
    time.sleep(0.05 * (4 - x % 4))             # later units finish first
    if x == 13:
        raise ValueError("unlucky")
    return x * x


def _strip_wall(obj):
    if isinstance(obj, dict):
        return {k: _strip_wall(v) for k, v in obj.items() if k != "wall_seconds"}
    if isinstance(obj, list):
        return [_strip_wall(v) for v in obj]
    return obj


def test_serial_units_keep_order_name_failures_and_report_progress(capsys):
    assert run_units(range(5), slow_square, label="sq") == [0, 1, 4, 9, 16]
    err = capsys.readouterr().err
    assert "[sq] 1/5 done" in err and "[sq] 5/5 done" in err and "s left" in err
    with pytest.raises(ShardError, match=r"sq: unit 13 failed: ValueError: unlucky"):
        run_units([1, 13, 2], slow_square, label="sq")


def test_ray_units_keep_order_and_name_failures(capsys, monkeypatch):
    import pathlib
    # The workers import this module (pytest runs it as `test_shard`): its folder on their path.
    monkeypatch.setenv("PYTHONPATH", str(pathlib.Path(__file__).parent))
    assert run_units(range(8), slow_square, workers=2, label="sq") == [x * x for x in range(8)]
    assert "[sq] 8/8 done" in capsys.readouterr().err
    with pytest.raises(ShardError, match=r"sq: unit 13 failed: ValueError: unlucky"):
        run_units([1, 13, 2], slow_square, workers=2, label="sq")


def test_merge_counts():
    from tools.shard import chunk_counts, merge_counts
    assert chunk_counts(5, 2) == [2, 2, 1] and chunk_counts(5, None) == [5] and chunk_counts(4, 8) == [4]
    a = {"target": "ndp", "clean": True, "hangs": 0, "errors": {"OFFSETS": 2}, "sim_cycles": 10, "rate": 0.5,
         "failures": [1]}
    b = {"target": "ndp", "clean": False, "hangs": 1, "errors": {"OFFSETS": 1, "ADDRESS": 4}, "sim_cycles": 5,
         "rate": 0.25, "failures": [2]}
    assert merge_counts([a, b]) == {"target": "ndp", "clean": True, "hangs": 1, "errors": {"OFFSETS": 3, "ADDRESS": 4},
                                    "sim_cycles": 15, "rate": 0.75, "failures": [1, 2]}


def test_crash_chunks_merge():
    from tools.crash_cmd import campaign_units, merge_chunks
    from tools.shard import chunk_seed
    args = argparse.Namespace(points=5, chunk_points=2, seed=9, model="rm-tiny", schedule="cxl-b")
    units = campaign_units(args)
    assert [(k, n) for k, _, n, _ in units] == [(0, 2), (1, 2), (2, 1)]
    assert units[0][1] == 9 and len({s for _, s, _, _ in units}) == 3 and chunk_seed(9, 1, "crash") == units[1][1]
    chunk = {"verified": True, "points": 2, "consistent": 2, "inconsistent": 0, "cuts": 3, "sim_cycles": 10,
             "phases_hit": {"lookup": 1, "idle": 1}, "phases_aimed": {"lookup": 2}, "failures": []}
    bad = {**chunk, "verified": False, "inconsistent": 1, "failures": [{"point": 0}], "error": "boom"}
    merged = merge_chunks(args, units, [chunk, bad, chunk])
    assert merged["points"] == 6 and merged["cuts"] == 9 and merged["phases_hit"] == {"lookup": 3, "idle": 3}
    assert not merged["verified"] and merged["failures"] == [{"point": 0, "chunk": 1}]
    assert merged["error"].startswith(f"chunk 1 (seed {units[1][1]}): boom")
    assert [c["seed"] for c in merged["chunks"]] == [s for _, s, _, _ in units]


@pytest.mark.sim
def test_crash_campaign_on_two_ray_workers_equals_serial(harness, tmp_path, capsys):
    from tools.crash_cmd import cmd_crash
    from sim.tb.crash_tb import PHASES
    out = {}
    for workers in (1, 2):
        path = tmp_path / f"crash-{workers}.json"
        args = argparse.Namespace(model="rm-tiny", points=4, seed=21, json=path, phases=",".join(PHASES),
                                  schedule="cxl-b", rows_cap=None, batch_size=None, chunk_points=2,
                                  workers=workers, ray_address=None)
        assert cmd_crash(args) == 0, capsys.readouterr().out[-3000:]
        out[workers] = json.loads(path.read_text())
    assert out[1]["verified"] and len(out[1]["chunks"]) == 2 and out[1]["points"] == 4
    assert _strip_wall(out[1]) == _strip_wall(out[2])
    assert "[crash] 2/2 done" in capsys.readouterr().err


@pytest.mark.sim
def test_eval_on_two_ray_workers_equals_serial(harness, tmp_path):
    from tools.eval_cmd import main
    out = {}
    for workers in (1, 2):
        path = tmp_path / f"eval-{workers}.json"
        args = argparse.Namespace(models="rm-tiny", configs="pmem,cxl-b,cxl", batches=2, seed=5, json=str(path),
                                  report=None, batch_size=None, rows_cap=None, mlp_probe=256, recompose=None,
                                  scale="default", sweep_batch_sizes="4", workers=workers, ray_address=None)
        assert main(args) == 0
        out[workers] = json.loads(path.read_text())
    assert list(out[1]["meta"]["sweep_runs"]) == ["4"]
    assert _strip_wall(out[1]) == _strip_wall(out[2])
