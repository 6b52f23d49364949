"""Failure tolerance on the whole device: the checkpoint tests and the power-failure campaign.

RTL (marked ``sim``): sim/tb/checkpoint_tb.py (the undo log and MLP log of real batches
against the golden log, NOT_LOGGED, a torn log entry detected as LOG_CORRUPT) and
sim/tb/crash_tb.py through ``trainingcxl crash``: a directed campaign with one power cut
aimed at each phase (lookup, logging, flag write, update, MLP log, release, recovery) and a
50-point random campaign. Each recovery is checked against the golden model (tables bit for
bit at the reported batch, the MLP log against the GPU's parameters, no acknowledged write
lost); the monitors check every CXL.mem and CXL.cache message. Random runs print their seed;
replay with ``trainingcxl crash --points N --seed S`` or TCXL_SEED=<seed> for the tb tests.
Pure Python: the command's argument handling.
"""
from __future__ import annotations

import argparse
import json

import pytest

from conftest import run_cocotb
from tools.crash_cmd import cmd_crash
from sim.tb.crash_tb import PHASES


def _args(**kw):
    base = dict(model="rm-tiny", points=7, seed=None, json=None, phases=",".join(PHASES), schedule="cxl-b",
                rows_cap=None, batch_size=None, chunk_points=None, workers=1, ray_address=None, mlp_spread=1)
    base.update(kw)
    return argparse.Namespace(**base)


@pytest.mark.parametrize("kw, message", [
    (dict(phases="lookup,boot"), "--phases takes a comma list"),
    (dict(model="rm2", seed=1), "does not fit device memory"),
    (dict(model="no-such-model", seed=1), "no-such-model"),
    (dict(mlp_spread=1 << 30, seed=1), "exceeds the"),
])
def test_crash_rejects_bad_requests(kw, message, capsys):
    assert cmd_crash(_args(**kw)) == 2
    assert message in capsys.readouterr().err


@pytest.mark.sim
@pytest.mark.parametrize("testcase", ["checkpointed_batches_log_and_recover", "update_without_its_log_is_refused",
                                      "torn_log_entry_is_detected"])
def test_checkpoint_rtl(harness, testcase):
    run_cocotb(harness, "sim.tb.checkpoint_tb", testcase)


def _campaign(harness, tmp_path, capsys, **kw) -> dict:
    out = tmp_path / "crash.json"
    code = cmd_crash(_args(json=out, **kw))
    text = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert code == 0, text[-4000:]
    assert result["verified"] and result["inconsistent"] == 0 and result["lost_acknowledged_writes"] == 0
    assert result["consistent"] == result["points"] == kw["points"]
    return result


@pytest.mark.sim
def test_crash_at_each_phase(harness, tmp_path, capsys):
    """One point aimed at each phase (7 points): every phase is hit, every recovery consistent."""
    result = _campaign(harness, tmp_path, capsys, points=len(PHASES), seed=3)
    assert result["all_phases_hit"], result["phases_hit"]
    assert result["phases_aimed"] == {p: 1 for p in PHASES}
    assert result["rolled_back"] >= 1 and result["batches_trained"] >= 3


@pytest.mark.sim
@pytest.mark.parametrize("points", [
    2 * len(PHASES),                                  # make test: two rounds over the phases
    pytest.param(50, marks=pytest.mark.long),         # make sim-long
])
def test_crash_campaign_random(harness, tmp_path, capsys, points):
    """Random points (random seed, printed) under the batch-aware schedule."""
    result = _campaign(harness, tmp_path, capsys, points=points)
    assert result["all_phases_hit"], result["phases_hit"]
    assert result["cuts"] >= points + result["phases_aimed"]["recovery"] - 1


@pytest.mark.sim
def test_crash_campaign_cxl_d(harness, tmp_path, capsys):
    """The critical-path schedule (LOG / MLP_LOG after the GPU's MLP time) recovers the same way."""
    _campaign(harness, tmp_path, capsys, points=7, schedule="cxl-d", seed=4)


@pytest.mark.sim
def test_crash_campaign_relaxed_mlp_log(harness, tmp_path, capsys):
    """The MLP image copied over 3 batches (one chunk each): every recovered MLP slot must hold
    chunk j as the GPU's image while the copy's batch j ran, bit for bit (sim/tb/ckpt_run.py
    ``mlp_image_of_copy``); cuts land in first, middle and last chunks."""
    result = _campaign(harness, tmp_path, capsys, points=2 * len(PHASES), seed=6, mlp_spread=3)
    assert result["mlp_spread"] == 3 and result["all_phases_hit"], result["phases_hit"]
    assert result["mlp_logs_checked"] >= 2, result          # complete spread copies were compared


# --------------------------------------------------------------------------------------------
# checkpoint overhead (sim/tb/overhead_tb.py, the bench's checkpoint_overhead_* figures)
# --------------------------------------------------------------------------------------------
def test_overhead_composes_the_schedules():
    from sim.tb.overhead_tb import compose
    plain = [{"batch": 1, "gpu_cycles": 1000, "cycles_lookup": 100, "cycles_update": 200}]
    ckpt = [{"batch": 1, "gpu_cycles": 1000, "cycles_lookup": 100, "cycles_update": 210, "cycles_logging": 300,
             "cycles_mlp_log": 50}]
    r = compose(plain, ckpt, mlp_scale=10.0)          # the whole MLP image: 500 cycles
    b = r["batches"][0]
    assert b["t_none"] == 1300
    assert b["t_cxl_d"] == 100 + 1000 + 300 + 500 + 210
    assert b["t_cxl_b"] == 100 + max(1000, 800) + 210          # hidden behind the GPU
    assert b["t_cxl_b_emb_only"] == 100 + 1000 + 210
    assert r["overhead_cxl_b"] == round(1310 / 1300 - 1, 4)
    assert r["overhead_cxl_d"] == round(2110 / 1300 - 1, 4)
    r = compose(plain, ckpt, mlp_scale=40.0)          # 2000 cycles: no longer hidden
    assert r["batches"][0]["t_cxl_b"] == 100 + 2300 + 210
    # LOG at its media floor: 1200 cycles would not hide behind the GPU's 1000 even at the floor.
    r = compose(plain, [dict(ckpt[0], cycles_logging=1500)], mlp_scale=1.0, log_floor=[1200.0])
    assert r["batches"][0]["t_cxl_b_emb_only_at_log_floor"] == 100 + 1200 + 210
    assert r["overhead_cxl_b_emb_only"] == round((100 + 1500 + 210) / 1300 - 1, 4)
    assert r["overhead_cxl_b_emb_only_at_log_floor"] == round(1510 / 1300 - 1, 4)
    assert r["log_floor_efficiency"] == 0.8


def test_log_floor_counts_the_log_format():
    """Distinct rows' lines read once; their lines, a group line per four rows and two records
    written; even spread."""
    from sim.tb.overhead_tb import log_floor_cycles
    w = {"unique_rows": 10, "unique_lines": 20}          # dim-32 rows: 2 lines each
    # 4 channels: reads 5 per channel, writes 20 + 3 + 2 = 25 -> 7 on the busiest channel; RD 2
    # and WR 10 cycles a line.
    assert log_floor_cycles(w, 4, rd_cost_q8=2 * 256, wr_cost_q8=10 * 256) == 5 * 2 + 7 * 10
    assert log_floor_cycles(w, 1, rd_cost_q8=256, wr_cost_q8=256) == 20 + 25


@pytest.mark.sim
def test_checkpoint_overhead_rtl(harness, tmp_path):
    """The overhead measurement on rm-tiny: both passes verified bit for bit, figures consistent."""
    out = tmp_path / "ovh.json"
    run_cocotb(harness, "sim.tb.overhead_tb", "checkpoint_overhead", TCXL_OVH_MODEL="rm-tiny",
               TCXL_OVH_BATCHES=2, TCXL_OVH_MLP_PROBE=128, TCXL_RESULT_JSON=out)
    r = json.loads(out.read_text())
    assert r["verified"] and len(r["batches"]) == 2 and r["mlp_probe_lines"] == 128
    for b in r["batches"]:
        assert b["log"] > 0 and b["mlp_log_probe"] > 0 and b["update_ckpt"] >= b["update_plain"] * 0.9
        assert b["t_none"] < b["t_cxl_b"] <= b["t_cxl_d"]
    assert r["overhead_cxl_d"] >= r["overhead_cxl_b"] >= r["overhead_cxl_b_emb_only"] > 0
    # LOG's media floor is a lower bound of LOG's time: a LOG faster than it means a wrong floor.
    assert 0 < r["log_floor_efficiency"] <= 1, r
    assert r["overhead_cxl_b_emb_only_at_log_floor"] <= r["overhead_cxl_b_emb_only"], r
