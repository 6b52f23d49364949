"""The evaluation: configuration composition, golden DLRM training, relaxed lookup, the eval command.

The pure tests check the composition rules of sim/model/system_timing.py on hand-made cycle
counts and the golden training of sim/system.py; the sim test runs a reduced ``trainingcxl
eval`` on the RTL (every embedding result, loss and table bit-exact against the golden
training, protocol monitors clean) and checks its JSON and report.
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from sim.bfm.gpu_agent import mlp_timing
from sim.model import embedding
from sim.model.dlrm import get_preset
from sim.model.system_params import DEFAULT_PARAMS, describe
from sim.model.system_timing import (BREAKDOWN, CONFIGS, MAX_MLP_LAG, Measured, Workload, compose,
                                     cpu_memory_ms, transfer_ms)
from sim.model.trace import generate_trace

WORK = Workload(batch_size=64, lookups=100_000, lookup_lines=200_000, unique_rows=16_000, unique_lines=32_000,
                output_bytes=64 * 20 * 32 * 4, image_lines=1_000_000)
MEAS = Measured(clock_mhz=500, lookup_cycles=150_000, lookup_relaxed_cycles=150_000, log_cycles=350_000,
                update_cycles=260_000, mlp_probe_cycles=14_000, mlp_probe_lines=4096)


def _all(work=WORK, meas=MEAS, model="rm1"):
    mlp = mlp_timing(model, work.batch_size, meas.clock_mhz)
    return {c: compose(c, work, meas, mlp) for c in CONFIGS}, mlp


def test_breakdown_sums_to_batch_time_and_timeline_fits():
    results, _ = _all()
    for c, r in results.items():
        assert set(r.breakdown_ms) == set(BREAKDOWN)
        assert sum(r.breakdown_ms.values()) == pytest.approx(r.batch_time_ms, rel=1e-9), c
        assert all(v >= 0 for v in r.breakdown_ms.values()), c
        assert max(i["end_ms"] for i in r.timeline) <= r.batch_time_ms + 1e-6, c
        assert min(i["start_ms"] for i in r.timeline) >= 0, c
        assert sum(r.energy_breakdown_mj.values()) == pytest.approx(r.energy_mj), c


def test_schedules_follow_their_rules():
    results, mlp = _all()
    ms = MEAS.ms
    log, mlplog = ms(MEAS.log_cycles), ms(MEAS.mlp_probe_cycles) / MEAS.mlp_probe_lines * WORK.image_lines
    # CXL-D: LOG and the whole MLP log on the critical path.
    assert results["cxl-d"].breakdown_ms["checkpoint_stall"] == pytest.approx(log + mlplog)
    # CXL-B: only what the MLP time does not hide.
    hidden = max(0.0, log + mlplog - mlp.seconds * 1e3)
    assert results["cxl-b"].breakdown_ms["checkpoint_stall"] == pytest.approx(hidden)
    # The same device work otherwise.
    for key in ("lookup", "update", "mlp"):
        assert results["cxl-b"].breakdown_ms[key] == pytest.approx(results["cxl-d"].breakdown_ms[key])
    # CXL: the MLP log spreads over batches, never more than MAX_MLP_LAG.
    assert 1 <= results["cxl"].extra["mlp_log_lag_batches"] <= MAX_MLP_LAG
    # PCIe pays software copies that CXL-D does not.
    assert results["pcie"].breakdown_ms["transfer"] > results["cxl-d"].breakdown_ms["transfer"]


def test_relaxed_mlp_log_hides_when_the_window_is_free():
    """A cheap device (short LOG and LOOKUP): the chunk fills the GPU's cache window, no stall."""
    meas = Measured(500, 1000, 1000, 1000, 1000, 14_000, 4096)
    results, mlp = _all(meas=meas, model="rm4")
    r = results["cxl"]
    assert r.breakdown_ms["checkpoint_stall"] == 0.0
    w0, w1 = mlp.window
    assert 1000 + 1000 < w0, "LOG + relaxed LOOKUP end before the window opens, so all of it is free"
    chunk = r.extra["mlp_log_chunk_lines"]
    assert chunk == pytest.approx((w1 - w0) * 4096 / 14_000, rel=0.01)   # window cycles x measured lines/cycle


def test_mlp_log_interval_gives_every_configuration_the_same_recovery_point():
    """K = 1 is the baselines' own policy; K > 1 is the mean of one batch that copies the
    whole image and K - 1 that do not; CXL then logs at least image/K lines per batch."""
    mlp = mlp_timing("rm1", WORK.batch_size, MEAS.clock_mhz)
    bare_work = Workload(**{**WORK.__dict__, "image_lines": 0})
    for c in ("pmem", "pcie", "cxl-d", "cxl-b"):
        own = compose(c, WORK, MEAS, mlp)
        assert compose(c, WORK, MEAS, mlp, mlp_interval=1).batch_time_ms == pytest.approx(own.batch_time_ms)
        bare = compose(c, bare_work, MEAS, mlp).batch_time_ms
        times = [compose(c, WORK, MEAS, mlp, mlp_interval=k) for k in (8, 64)]
        for k, r in zip((8, 64), times):
            assert r.batch_time_ms == pytest.approx((own.batch_time_ms + (k - 1) * bare) / k), (c, k)
            assert sum(r.breakdown_ms.values()) == pytest.approx(r.batch_time_ms)
            assert sum(r.energy_breakdown_mj.values()) == pytest.approx(r.energy_mj)
        assert own.batch_time_ms > times[0].batch_time_ms > times[1].batch_time_ms > bare, c
    every = compose("cxl", WORK, MEAS, mlp, mlp_interval=1)
    assert every.extra["mlp_log_chunk_lines"] == WORK.image_lines and every.extra["mlp_log_lag_batches"] == 1
    assert every.batch_time_ms > compose("cxl", WORK, MEAS, mlp).batch_time_ms
    eight = compose("cxl", WORK, MEAS, mlp, mlp_interval=8)
    assert eight.extra["mlp_log_lag_batches"] <= 8 and eight.extra["mlp_log_interval"] == 8
    with pytest.raises(ValueError, match="mlp_interval"):
        compose("cxl-d", WORK, MEAS, mlp, mlp_interval=0)


def test_cpu_model_bounds():
    p = DEFAULT_PARAMS
    # Latency bound: 72 misses in flight at 240 ns -> 0.3 lines/ns over 2 channels of 15.36 GB/s = 0.48 lines/ns.
    t = cpu_memory_ms(p, 1_000_000, 0)
    lat = 1_000_000 * p.pmem.read_latency_ns * 1e-9 / (p.host.cores * p.host.misses_in_flight_per_core)
    bw = 1_000_000 * 64 / (p.pmem.read_bw_gbps * 1e9) / p.host.memory_channels
    assert t == pytest.approx(max(lat, bw) / p.host.software_efficiency * 1e3)
    assert cpu_memory_ms(p, 0, 1000) > cpu_memory_ms(p, 1000, 0)          # PMEM writes are slower
    assert transfer_ms(p.cxl, 0) == pytest.approx(p.cxl.latency_ns * 1e-6)


def test_params_describe_and_bad_config():
    d = describe()
    assert d["pmem"]["write_bw_ratio"] == 0.1 and d["host"]["cores"] == 6
    with pytest.raises(ValueError, match="config"):
        compose("ssd", WORK, MEAS, mlp_timing("rm1", 64))


# ---- golden training
def _training(relaxed: bool, batches: int = 6):
    from sim.model.checkpoint import CheckpointedTraining
    from sim.bfm.gpu_agent import GpuAgent
    from sim.system import DlrmTraining, dlrm_initial_tables
    trace = generate_trace(get_preset("rm-tiny"), batches, 5)
    m = trace.manifest
    tr = DlrmTraining("rm-tiny", trace.batches, m["batch_size"], relaxed=relaxed)
    gpu = GpuAgent("rm-tiny", seed=5, step_fn=tr.step_fn)
    golden = CheckpointedTraining(dlrm_initial_tables(m, 5), [t["mode"] for t in m["tables"]], m["batch_size"],
                                  trace.batches, tr.grads, float(m["optimizer"]["lr"]), mlp=gpu)
    tr.attach(golden, gpu)
    return tr, trace


def test_relaxed_patch_approximates_the_exact_lookup():
    """Old-table lookup + patch = new-table lookup up to fp32 rounding (not bit for bit)."""
    tr, trace = _training(relaxed=True)
    g = tr.golden
    for k in (1, 2, 3):
        b = trace.batches[k]
        exact = embedding.tbe_forward(g.tables_after(k), b.offsets, b.indices, g.modes, tr.B, b.weights)
        relaxed = tr.pooled(k)
        for e, r in zip(exact, relaxed):
            np.testing.assert_allclose(r, e, rtol=1e-4, atol=1e-5)
        stale = embedding.tbe_forward(g.tables_after(k - 1), b.offsets, b.indices, g.modes, tr.B, b.weights)
        assert any(not np.allclose(s, e, rtol=1e-4, atol=1e-5) for s, e in zip(stale, exact)), \
            "the patch must matter: the old-table lookup alone differs"


def test_golden_training_loss_falls():
    tr, _ = _training(relaxed=False, batches=40)
    losses = [tr.loss(k) for k in range(40)]
    assert np.mean(losses[-10:]) < 0.9 * np.mean(losses[:10]), losses


# ---- the command
def _args(**kw):
    base = dict(models="rm1", configs="pmem,cxl", batches=3, seed=1, json="x.json", report=None,
                batch_size=None, rows_cap=None, mlp_probe=4096, recompose=None, scale="default",
                sweep_batch_sizes=None)
    base.update(kw)
    return argparse.Namespace(**base)


@pytest.mark.parametrize("kw,match", [({"models": "rm9"}, "unknown model rm9"),
                                      ({"configs": "cxl,ssd"}, "unknown configuration ssd"),
                                      ({"batches": 0}, "--batches"),
                                      ({"rows_cap": 0}, "--rows-cap"),
                                      ({"sweep_batch_sizes": "64,x"}, "--sweep-batch-sizes takes a comma list"),
                                      ({"sweep_batch_sizes": "0"}, "--sweep-batch-sizes takes a comma list"),
                                      ({"scale": "paper", "trace": "t.npz"}, "--scale paper applies to generated")])
def test_bad_requests_are_one_line_errors(kw, match):
    from tools.eval_cmd import EvalError, check_request
    with pytest.raises(EvalError, match=match):
        check_request(_args(**kw))


def test_a_model_that_does_not_fit_is_refused_before_simulating(monkeypatch):
    import hw.config
    from tools.eval_cmd import EvalError, check_fits
    monkeypatch.setattr(hw.config, "SIM_CAPACITY_BYTES", 16 << 20)   # no preset is refused at 1 GiB
    with pytest.raises(EvalError, match="does not fit the 16 MiB simulated device"):
        check_fits("rm2", _args(rows_cap=1 << 16, batch_size=64))


def test_recompose_refuses_a_file_without_runs(tmp_path):
    from tools.eval_cmd import EvalError, evaluate
    bad = tmp_path / "bad.json"
    bad.write_text('{"results": []}')
    with pytest.raises(EvalError, match="not an eval JSON"):
        evaluate(_args(recompose=str(bad)))


@pytest.mark.sim
def test_reduced_eval_on_the_rtl(tmp_path):
    """CI's reduced evaluation: rm-tiny and rm4 (small batch), every configuration, verified."""
    from tools.eval_cmd import main
    out = tmp_path / "eval.json"
    rc = main(_args(models="rm-tiny,rm4", configs="pmem,pcie,cxl-d,cxl-b,cxl", batches=2, batch_size=8,
                    rows_cap=256, json=str(out), report=str(tmp_path / "report"), sweep_batch_sizes="4,8"))
    res = json.loads(out.read_text())
    assert rc == 0, [r.get("error") for r in res["results"]]
    assert len(res["results"]) == 10 and all(r["verified"] for r in res["results"])
    for r in res["results"]:
        assert r["batch_time_ms"] > 0 and len(r["loss"]) == 2
    assert (tmp_path / "report" / "report.md").exists()
    assert (tmp_path / "report" / "fig11_speedup.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The sensitivity: every K row and both batch sizes (8 = the main runs, not simulated twice),
    # each ratio per model and as a geomean, in the report with its figure.
    sens = res["sensitivity"]
    assert [r["mlp_interval"] for r in sens["mlp_interval"]] == ["own", 1, 8, 64, 1024]
    assert sorted({r["batch_size"] for r in sens["batch_size"]}) == [4, 8]
    assert list(res["meta"]["sweep_runs"]) == ["4"]
    for row in sens["mlp_interval"] + sens["batch_size"]:
        for name in ("cxl_over_pmem", "cxl_d_over_pcie", "cxl_over_cxl_b"):
            assert set(row[name]) == {"rm-tiny", "rm4", "geomean"} and row[name]["geomean"] > 0
    own8 = next(r for r in sens["batch_size"] if r["batch_size"] == 8 and r["mlp_interval"] == "own")
    assert own8["cxl_over_pmem"] == sens["mlp_interval"][0]["cxl_over_pmem"]
    pmem = {r["model"]: r["batch_time_ms"] for r in res["results"] if r["config"] == "pmem"}
    cxl = {r["model"]: r["batch_time_ms"] for r in res["results"] if r["config"] == "cxl"}
    assert sens["mlp_interval"][0]["cxl_over_pmem"]["rm4"] == pytest.approx(pmem["rm4"] / cxl["rm4"])
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## Sensitivity" in md and "(fig_sensitivity.png)" in md
    assert (tmp_path / "report" / "fig_sensitivity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The stored runs compose again without simulating, to the same figures.
    again = tmp_path / "again.json"
    assert main(_args(recompose=str(out), json=str(again))) == 0
    redo = json.loads(again.read_text())
    assert [r["batch_time_ms"] for r in redo["results"]] == [r["batch_time_ms"] for r in res["results"]]
    assert redo["sensitivity"] == res["sensitivity"]
    # Models evaluated by separate commands merge: split the stored runs by model, recompose both.
    parts = []
    for model in ("rm-tiny", "rm4"):
        meta = {**res["meta"], "models": [model], "runs": {model: res["meta"]["runs"][model]},
                "sweep_runs": {b: {model: r[model]} for b, r in res["meta"]["sweep_runs"].items()}}
        parts.append(tmp_path / f"{model}.json")
        parts[-1].write_text(json.dumps({"results": [], "meta": meta}))
    merged = tmp_path / "merged.json"
    assert main(_args(recompose=f"{parts[0]},{parts[1]}", json=str(merged))) == 0
    merged = json.loads(merged.read_text())
    assert merged["results"] == redo["results"] and merged["sensitivity"] == res["sensitivity"]
    from tools.eval_cmd import EvalError
    with pytest.raises(EvalError, match="already in an earlier file"):
        main(_args(recompose=f"{parts[0]},{parts[0]}", json=str(tmp_path / "never.json")))


def test_batch_workload_counts():
    """Two tables (dims 16 and 32), B = 2: occurrences, lines, distinct rows and output bytes by hand."""
    from types import SimpleNamespace

    from sim.tb.eval_tb import batch_workload
    manifest = {"batch_size": 2, "tables": [{"dim": 16}, {"dim": 32}]}
    # table 0: bags [1, 1], [2]; table 1: bags [5], [5, 6]
    batch = SimpleNamespace(offsets=np.array([0, 2, 3, 4, 6], dtype=np.uint32),
                            indices=np.array([1, 1, 2, 5, 5, 6], dtype=np.uint32))
    w = batch_workload(manifest, batch)
    assert w == {"lookups": 6, "lookup_lines": 3 * 1 + 3 * 2, "unique_rows": 4, "unique_lines": 2 * 1 + 2 * 2,
                 "output_bytes": 2 * (16 + 32) * 4}
