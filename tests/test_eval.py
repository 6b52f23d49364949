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
from sim.model.system_params import (CXL_X16, DEFAULT_PARAMS, DEVICE_CHANNELS, MODELLING_CHOICES, PCIE3_X16,
                                     PCIE5_X16, describe, paper_choices, serial_link_gbps, with_modelling)
from sim.model.system_timing import (BREAKDOWN, CONFIGS, MAX_MLP_LAG, Measured, Workload, compose,
                                     cpu_memory_ms, dense_sgd_ms, host_traffic, staged_ms, transfer_ms)
from sim.model.trace import generate_trace

WORK = Workload(batch_size=64, lookups=100_000, lookup_lines=200_000, unique_rows=16_000, unique_lines=32_000,
                output_bytes=64 * 20 * 32 * 4, image_lines=1_000_000, mlp_params=16_000_000)
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
    # CXL-B: only what the GPU's launch and MLP time do not hide (LOG starts with the launch).
    hidden = max(0.0, log + mlplog - DEFAULT_PARAMS.software.launch_us * 1e-3 - mlp.seconds * 1e3)
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
    for p, channels in ((DEFAULT_PARAMS, DEVICE_CHANNELS), (paper_choices(), 2)):
        # Latency bound: 72 misses in flight at 240 ns -> 0.3 lines/ns; bandwidth: 15.36 GB/s per channel.
        assert p.host_channels == channels
        t = cpu_memory_ms(p, 1_000_000, 0)
        lat = 1_000_000 * p.pmem.read_latency_ns * 1e-9 / (p.host.cores * p.host.misses_in_flight_per_core)
        bw = 1_000_000 * 64 / (p.pmem.read_bw_gbps * 1e9) / channels
        assert t == pytest.approx(max(lat, bw) / p.host.software_efficiency * 1e3)
    p = DEFAULT_PARAMS
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
                sweep_batch_sizes=None, mlp_interval=1, seeds=1, labels="learnable")
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
    own = {(r["model"], r["config"]): r["own_policy"]["batch_time_ms"] for r in res["results"]}
    assert sens["mlp_interval"][0]["cxl_over_pmem"]["rm4"] == pytest.approx(own["rm4", "pmem"] / own["rm4", "cxl"])
    # Equal durability is the headline (K = 1), each configuration's own policy beside it; the
    # fairness ablation's first row is the default composition, one row per switch, then all off.
    assert all(r["mlp_interval"] == 1 and r["own_policy"]["batch_time_ms"] > 0 for r in res["results"])
    fair = res["fairness"]
    assert [r["setting"] for r in fair] == ["fair", "equal_channels", "same_link_model", "pipelined_staging",
                                            "host_cache", "launch_everywhere", "dense_sgd", "earlier"]
    def ratios(row):
        return {k: v for k, v in row.items() if k != "mlp_interval"}
    assert fair[0]["equal"] == ratios(sens["mlp_interval"][1]) and fair[0]["own"] == ratios(sens["mlp_interval"][0])
    assert fair[0]["equal"]["cxl_over_pmem"]["rm4"] == pytest.approx(pmem["rm4"] / cxl["rm4"])
    assert fair[-1]["own"] != fair[0]["own"]            # the earlier choices move the ratios
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## Sensitivity" in md and "(fig_sensitivity.png)" in md and "## Fairness ablation" in md
    assert "## Assumptions" in md and res["assumptions"]["gpu_efficiency"][1]["default"]
    assert "## Training" in md and "| rm4 | learnable |" in md and "**Spread**" in md
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


# ---- the fairness switches (sim/model/system_params.py Modelling)
def _one(config, params, work=WORK, **kw):
    return compose(config, work, MEAS, mlp_timing("rm1", work.batch_size, MEAS.clock_mhz), params, **kw)


def test_earlier_choices_reproduce_the_composition_before_issue_21():
    """Every switch off gives the batch times the composition gave before issue 21 (commit
    5710ac5, computed there on this WORK/MEAS; the dense step is 0 without its switch)."""
    before = {"pmem": 21.527532036036032, "pcie": 14.226740166666666, "cxl-d": 8.7270135, "cxl-b": 8.3591575,
              "cxl": 1.549995730896322}
    for c, t in before.items():
        assert _one(c, paper_choices()).batch_time_ms == pytest.approx(t, rel=1e-12), c
    assert all(_one(c, DEFAULT_PARAMS).batch_time_ms != pytest.approx(before[c]) for c in CONFIGS)


def test_links_share_one_efficiency_model():
    assert serial_link_gbps(32, 16, 64, 4) == pytest.approx(32 * 16 / 8 * 128 / 130 * 64 / 68)
    assert CXL_X16.bandwidth_gbps == pytest.approx(59.31, abs=0.01)
    assert PCIE5_X16.bandwidth_gbps == pytest.approx(57.61, abs=0.01)      # 256-byte TLPs, 24 bytes each
    assert DEFAULT_PARAMS.links == (PCIE5_X16, CXL_X16)
    pcie, cxl = with_modelling(same_link_model=False).links
    assert pcie is PCIE3_X16 and cxl.bandwidth_gbps == pytest.approx(64 * 64 / 68)
    # PCIe's copies are slower on PCIe 3.0; CXL-D does not use PCIe.
    slow = with_modelling(same_link_model=False)
    assert _one("pcie", slow).breakdown_ms["transfer"] > _one("pcie", DEFAULT_PARAMS).breakdown_ms["transfer"]


def test_staged_copies_stream_when_pipelined():
    on, off = DEFAULT_PARAMS, with_modelling(pipelined_staging=False)
    assert staged_ms(on, [1.0, 3.0]) == pytest.approx(3.0)
    assert staged_ms(off, [1.0, 3.0]) == pytest.approx(4.0)
    for c in ("pmem", "pcie"):
        a, b = _one(c, on), _one(c, off)
        assert a.batch_time_ms < b.batch_time_ms, c
        assert a.breakdown_ms["checkpoint_stall"] < b.breakdown_ms["checkpoint_stall"], c
    for c in ("cxl-d", "cxl-b", "cxl"):                      # no software copies to stream
        assert _one(c, on).batch_time_ms == pytest.approx(_one(c, off).batch_time_ms), c


def test_host_cache_model_is_one_model_for_lookup_and_update():
    llc_lines = DEFAULT_PARAMS.host.llc_bytes // 64
    big = Workload(**{**WORK.__dict__, "table_lines": 10 * llc_lines})
    fits_tables = Workload(**{**WORK.__dict__, "table_lines": llc_lines // 2})
    assert WORK.unique_lines <= llc_lines
    t = host_traffic(DEFAULT_PARAMS, big)          # the batch's distinct rows fit: repeats hit, for both
    assert (t["fits"], t["lookup_reads"], t["update_reads"], t["update_writes"]) == \
        ("batch", WORK.unique_lines, 0, WORK.unique_lines)
    t = host_traffic(DEFAULT_PARAMS, fits_tables)  # every table fits: only the durable writes reach PMEM
    assert (t["fits"], t["lookup_reads"], t["update_reads"], t["update_writes"], t["log_writes"]) == \
        ("tables", 0, 0, WORK.unique_lines, WORK.unique_lines)
    huge = Workload(**{**WORK.__dict__, "unique_lines": 2 * llc_lines, "lookup_lines": 4 * llc_lines})
    t = host_traffic(DEFAULT_PARAMS, huge)         # nothing fits (table_lines 0: unknown)
    assert (t["fits"], t["lookup_reads"], t["update_reads"]) == ("none", huge.lookup_lines, huge.unique_lines)
    t = host_traffic(with_modelling(host_cache=False), fits_tables)
    assert (t["lookup_reads"], t["update_reads"]) == (WORK.lookup_lines, WORK.unique_lines)
    assert _one("pmem", DEFAULT_PARAMS, fits_tables).breakdown_ms["lookup"] < \
        _one("pmem", DEFAULT_PARAMS, big).breakdown_ms["lookup"] < \
        _one("pmem", with_modelling(host_cache=False), big).breakdown_ms["lookup"]
    assert _one("pmem", DEFAULT_PARAMS, big).extra["host_cache_fits"] == "batch"


def test_every_configuration_launches_and_steps_the_dense_layers():
    on = DEFAULT_PARAMS
    sgd = dense_sgd_ms(on, WORK)
    assert sgd == pytest.approx(12 * WORK.mlp_params / (on.gpu_memory_gbps * 1e9) * 1e3)
    assert dense_sgd_ms(with_modelling(dense_sgd=False), WORK) == 0.0
    launch = on.software.launch_us * 1e-3
    for c in CONFIGS:
        r = _one(c, on)
        assert r.extra["dense_sgd_ms"] == pytest.approx(sgd), c
        steps = [i for i in r.timeline if i["phase"] == "dense_sgd"]
        assert len(steps) == 1 and steps[0]["lane"] == "gpu", c
        assert steps[0]["end_ms"] <= r.batch_time_ms + 1e-9, c      # the next forward waits for it
        no_launch = _one(c, with_modelling(launch_everywhere=False))
        if c in ("pmem", "pcie"):                                   # they always paid it
            assert no_launch.batch_time_ms == pytest.approx(r.batch_time_ms), c
        elif c == "cxl-d":
            assert r.breakdown_ms["transfer"] - no_launch.breakdown_ms["transfer"] == pytest.approx(launch), c
    # The dense step runs beside the checkpoint, the gradient transfer and the update: the batch
    # ends when both are done. A device that is quick after the MLP exposes the step.
    for meas, exposed in ((MEAS, False), (Measured(500, 150_000, 150_000, 10, 10, 1, 4096), True)):
        for c in ("pmem", "cxl-d", "cxl"):
            mlp = mlp_timing("rm1", 64, 500)
            a = compose(c, WORK, meas, mlp, on)
            b = compose(c, WORK, meas, mlp, with_modelling(dense_sgd=False))
            mlp_end = next(i["end_ms"] for i in b.timeline if i["phase"] == "mlp")
            patch = sum(i["end_ms"] - i["start_ms"] for i in b.timeline if i["phase"] == "patch")
            expect = max(b.batch_time_ms - patch, mlp_end + sgd) + patch
            assert a.batch_time_ms == pytest.approx(expect, abs=2e-6), (c, exposed)      # timeline: 1 ns rounding
            assert (a.batch_time_ms > b.batch_time_ms + 1e-9) == (exposed and c != "pmem"), (c, exposed)


def test_modelling_switches_are_the_documented_six():
    assert MODELLING_CHOICES == ("equal_channels", "same_link_model", "pipelined_staging", "host_cache",
                                 "launch_everywhere", "dense_sgd")
    assert all(getattr(DEFAULT_PARAMS.modelling, n) for n in MODELLING_CHOICES)
    assert not any(getattr(paper_choices().modelling, n) for n in MODELLING_CHOICES)
    assert describe()["modelling"] == dict.fromkeys(MODELLING_CHOICES, True)
    with pytest.raises(TypeError):
        with_modelling(no_such_switch=False)


# ---- statistics over seeds x steady batches (tools/eval_stats.py) and the seed units
def _fake_run(order: str, log_cycles: list[int], lookups: list[int], model: str = "rm1") -> dict:
    """A training_eval-shaped result without a simulation: per-batch command cycles and workload."""
    cmds = []
    for k, (log, n) in enumerate(zip(log_cycles, lookups)):
        c = {"batch": k, "log": log, "update": 2 * n, "mlp_log": 14_000}
        c["lookup_relaxed" if order == "relaxed" and k else "lookup"] = n
        cmds.append(c)
    wl = [{"lookups": n, "lookup_lines": 2 * n, "unique_rows": n // 4, "unique_lines": n // 2, "output_bytes": 8192}
          for n in lookups]
    return {"model": model, "order": order, "clock_mhz": 500, "mlp_probe_lines": 4096, "batch_size": 64,
            "image_lines": 100_000, "mlp_params": 1_600_000, "rows_cap": 2048, "table_lines": 10**7,
            "commands": cmds, "workload": wl}


def _fake_runs(log_cycles, lookups, model="rm1"):
    return {model: {o: _fake_run(o, log_cycles, lookups, model) for o in ("exact", "relaxed")}}


def test_statistics_span_seeds_and_steady_batches_only():
    from tools.eval_sensitivity import compose_run
    from tools.eval_stats import ratio_stats, result_stats
    # Batch 0 is 100x slower (a warm-up): it must not count. Seed 2 has a longer LOG.
    seeds = {"1": _fake_runs([10**8, 100_000, 120_000], [9000, 10_000, 11_000]),
             "2": _fake_runs([10**8, 300_000, 200_000], [9000, 12_000, 10_500])}
    st = result_stats(seeds, "rm1", ["pmem", "cxl-d", "cxl"], 1)
    per = {(s, k): compose_run(seeds[s]["rm1"], "rm1", "cxl-d", 1, batch=k).batch_time_ms
           for s in seeds for k in (1, 2)}
    got = st["cxl-d"]["batch_time_ms"]
    assert got["n"] == 4 and (got["min"], got["max"]) == (min(per.values()), max(per.values()))
    assert got["median"] == pytest.approx(sorted(per.values())[1] / 2 + sorted(per.values())[2] / 2)
    assert got["max"] < compose_run(seeds["1"]["rm1"], "rm1", "cxl-d", 1, batch=0).batch_time_ms / 10
    # Speedups pair the same (seed, batch): PMEM's time over CXL-D's.
    pmem = {(s, k): compose_run(seeds[s]["rm1"], "rm1", "pmem", 1, batch=k).batch_time_ms
            for s in seeds for k in (1, 2)}
    paired = sorted(pmem[key] / per[key] for key in per)
    sp = st["cxl-d"]["speedup_vs_pmem"]
    assert (sp["min"], sp["max"], sp["n"]) == (pytest.approx(paired[0]), pytest.approx(paired[-1]), 4)
    assert {f"breakdown_ms.{k}" for k in BREAKDOWN} <= set(st["cxl"])
    # The headline ratios: the geomean over the models of each (seed, batch) sample.
    two = {s: {**r, **{"rm4": _fake_runs([10**8, 50_000, 60_000], [3000, 3100, 3200], "rm4")["rm4"]}}
           for s, r in seeds.items()}
    ratios = ratio_stats(two, ["rm1", "rm4"], 1)["cxl_d_over_pcie"]
    rm4 = {(s, k): compose_run(two[s]["rm4"], "rm4", "pcie", 1, batch=k).batch_time_ms
           / compose_run(two[s]["rm4"], "rm4", "cxl-d", 1, batch=k).batch_time_ms for s in two for k in (1, 2)}
    rm1 = {(s, k): compose_run(two[s]["rm1"], "rm1", "pcie", 1, batch=k).batch_time_ms / per[(s, k)]
           for s in two for k in (1, 2)}
    geo = sorted((rm1[key] * rm4[key]) ** 0.5 for key in rm1)
    assert ratios["n"] == 4 and ratios["min"] == pytest.approx(geo[0]) and ratios["max"] == pytest.approx(geo[-1])


def test_seed_units_and_their_placement(monkeypatch):
    from tools import eval_cmd
    args = _args(models="rm4", configs="pmem,cxl", seeds=3, seed=7, sweep=[])
    units = eval_cmd.simulation_units(args, ["rm4"], ["pmem", "cxl"])
    assert [(k, o, a.seed) for k, _, o, a in units] == [
        (None, "exact", 7), (None, "relaxed", 7), (("seed", 8), "exact", 8), (("seed", 8), "relaxed", 8),
        (("seed", 9), "exact", 9), (("seed", 9), "relaxed", 9)]
    assert eval_cmd.unit_name(units[2]) == "rm4 exact (seed 8)"
    monkeypatch.setattr(eval_cmd, "run_unit", lambda unit: {"seed": unit[3].seed, "order": unit[2]})
    runs, sweep_runs, seed_runs = eval_cmd.simulate(args, ["rm4"], ["pmem", "cxl"])
    assert runs == {"rm4": {"exact": {"seed": 7, "order": "exact"}, "relaxed": {"seed": 7, "order": "relaxed"}}}
    assert sweep_runs == {} and {s: r["rm4"]["relaxed"]["seed"] for s, r in seed_runs.items()} == {"8": 8, "9": 9}
    with pytest.raises(eval_cmd.EvalError, match="--seeds applies to generated traces"):
        eval_cmd.check_request(_args(models="rm4", trace="x.npz", seeds=2))


# ---- the assumed constants' sensitivity (tools/eval_assumptions.py)
def test_assumptions_move_only_what_they_touch():
    import dataclasses

    from sim.model.system_params import DEFAULT_PARAMS
    from tools.eval_assumptions import assumption_rows, text_rows
    from tools.eval_sensitivity import compose_run, ratio_row
    runs = {**_fake_runs([10**8, 100_000, 120_000], [9000, 10_000, 11_000]),
            **_fake_runs([10**8, 50_000, 60_000], [3000, 3100, 3200], "rm4")}
    a = assumption_rows(runs, ["rm1", "rm4"], 1)
    gpu = {r["gpu_efficiency"]: r for r in a["gpu_efficiency"]}
    assert sorted(gpu) == [0.25, 0.5, 0.75] and [r["default"] for r in a["gpu_efficiency"]] == [False, True, False]
    assert {k: v for k, v in gpu[0.5].items() if k not in ("gpu_efficiency", "default")} == ratio_row(
        runs, ["rm1", "rm4"], 1)
    # A slower GPU takes longer per batch in every configuration: the GPU's time must reach the
    # composition (it did not before: SystemParams.gpu_efficiency was never read).
    slow = dataclasses.replace(DEFAULT_PARAMS, gpu_efficiency=0.25)
    assert compose_run(runs["rm1"], "rm1", "cxl", 1, slow).batch_time_ms > \
        compose_run(runs["rm1"], "rm1", "cxl", 1).batch_time_ms
    assert gpu[0.25]["cxl_over_pmem"] != gpu[0.75]["cxl_over_pmem"]
    # Energy: the default row is 1 - E_CXL/E_PMEM per model; a change of a power moves it, and
    # GPU efficiency rows leave energy alone (they are about time).
    rows = {(r["field"], r["scale"]): r["energy_saving"] for r in a["energy"]}
    e = {c: compose_run(runs["rm4"], "rm4", c, 1).energy_mj for c in ("pmem", "cxl")}
    assert rows["default", 1.0]["rm4"] == pytest.approx(1 - e["cxl"] / e["pmem"])
    default = rows["default", 1.0]
    assert default["mean"] == pytest.approx((default["rm1"] + default["rm4"]) / 2)
    assert rows["cpu_active_w", 2.0]["mean"] > rows["default", 1.0]["mean"] > rows["cpu_active_w", 0.5]["mean"]
    assert rows["device_active_w", 2.0]["mean"] < rows["default", 1.0]["mean"]
    assert len(rows) == 1 + 2 * len(dataclasses.fields(DEFAULT_PARAMS.energy))
    md = "\n".join(text_rows(a))
    assert "| 0.5 (default) |" in md and "| cpu_active_w x2 | 190 |" in md
