"""tools/eval_report.py on synthetic ``trainingcxl eval`` results (no simulation)."""
import copy
import math

import pytest

from tools import eval_report as er

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CONFIGS = ("pmem", "pcie", "cxl-d", "cxl-b", "cxl")
# batch time (ms) per model and config; rm1 ordered, rm2 ordered too (rm2/cxl-b fails verification)
TIMES = {"rm1": (30.0, 10.0, 8.0, 6.4, 5.0), "rm2": (60.0, 16.0, 12.5, 10.0, 8.0)}


def _result(model, config, t, verified=True):
    bd = {"lookup": 0.4 * t, "transfer": 0.1 * t, "mlp": 0.3 * t, "update": 0.15 * t, "checkpoint_stall": 0.05 * t}
    e = 2.0 * t
    ebd = {"pmem_media": 0.5 * e, "host_cpu": 0.2 * e, "gpu": 0.2 * e, "static": 0.1 * e}
    tl = [{"lane": "host", "phase": "lookup", "start_ms": 0.0, "end_ms": 0.4 * t},
          {"lane": "link", "phase": "transfer", "start_ms": 0.4 * t, "end_ms": 0.5 * t},
          {"lane": "gpu", "phase": "mlp", "start_ms": 0.5 * t, "end_ms": 0.8 * t},
          {"lane": "gpu", "phase": "mlp_log", "start_ms": 0.55 * t, "end_ms": 0.7 * t},  # overlap, other phase
          {"lane": "device", "phase": "update", "start_ms": 0.8 * t, "end_ms": 0.95 * t},
          {"lane": "device", "phase": "log", "start_ms": 0.95 * t, "end_ms": t}]
    r = {"model": model, "config": config, "batch_time_ms": t, "verified": verified, "breakdown_ms": bd,
         "energy_mj": e, "energy_breakdown_mj": ebd, "speedup_vs_pmem": TIMES[model][0] / t, "timeline": tl,
         "loss": [0.7, 0.69], "batches": 2, "batch_size": 64, "unknown_key": {"x": 1}}
    if not verified:
        r["error"] = "pooled vector mismatch | table 3 row 17\nexpected 1.0 got 2.0"
    return r


@pytest.fixture
def result():
    rs = [_result(m, c, t, verified=not (m == "rm2" and c == "cxl-b"))
          for m, ts in TIMES.items() for c, t in zip(CONFIGS, ts)]
    return {"results": rs,
            "meta": {"models": list(TIMES), "configs": list(CONFIGS), "batches": 2, "seed": 7, "clock_mhz": 250.0,
                     "wall_seconds": 12.5,
                     "paper": {"speedup_cxl_over_pmem_avg": 5.2, "cxl_d_over_pcie": 1.23, "cxl_over_cxl_b": 1.14,
                               "energy_saving_vs_pmem": 0.76},
                     "notes": ["synthetic note one", "synthetic note two"]}}


def test_geomean():
    assert er.geomean([2, 8]) == pytest.approx(4.0)
    assert er.geomean([1, 10, 100]) == pytest.approx(10.0)
    assert er.geomean(iter([5.0])) == pytest.approx(5.0)
    for bad in ([], [1.0, 0.0], [-1.0], [float("nan")]):
        with pytest.raises(ValueError):
            er.geomean(bad)


def test_ordering_holds(result):
    assert er.ordering_holds(result, "rm1")
    assert er.ordering_holds(result, "rm2")  # timing-only: the unverified rm2/cxl-b still counts
    assert not er.ordering_holds(result, "rm9")  # no results at all
    swapped = copy.deepcopy(result)
    for r in swapped["results"]:
        if r["model"] == "rm1" and r["config"] == "cxl-b":
            r["batch_time_ms"] = 8.5  # CXL-B slower than CXL-D
    assert not er.ordering_holds(swapped, "rm1")
    assert er.ordering_holds(swapped, "rm2")
    tie = copy.deepcopy(result)
    for r in tie["results"]:
        if r["model"] == "rm1" and r["config"] == "cxl":
            r["batch_time_ms"] = 6.4  # equal to CXL-B: not strictly decreasing
    assert not er.ordering_holds(tie, "rm1")
    gone = copy.deepcopy(result)
    gone["results"] = [r for r in gone["results"] if (r["model"], r["config"]) != ("rm1", "pcie")]
    assert not er.ordering_holds(gone, "rm1")


def test_summary_figures(result):
    s = {row["name"].split(" (")[0]: row for row in er._summary(result)}
    cxl = s["CXL speedup over PMEM"]
    assert cxl["value"] == f"{math.sqrt(6.0 * 7.5):.2f}x" and cxl["used"] == ["rm1", "rm2"]
    cxld = s["CXL-D faster than PCIe"]
    assert cxld["value"].startswith(f"{math.sqrt(1.25 * 1.28):.2f}x")
    cxlb = s["CXL faster than CXL-B"]  # rm2/cxl-b unverified: only rm1 counts
    assert cxlb["used"] == ["rm1"] and cxlb["value"].startswith("1.28x")
    assert "rm2 (cxl-b not verified)" in cxlb["excluded"]
    # energy is proportional to time: saving = 1 - t_cxl/t_pmem, mean over models
    assert s["Energy saving of CXL vs PMEM"]["value"] == f"{100 * (1 - (5 / 30 + 8 / 60) / 2):.1f}%"


def test_text_table(result):
    t = er.text_table(result)
    lines = t.splitlines()
    for m in TIMES:
        for c in CONFIGS:
            assert any(ln.split()[:2] == [m, er.CONFIG_LABELS[c]] for ln in lines), (m, c)
    assert "FAILED: 1 of 10" in t and "rm2/cxl-b: pooled vector mismatch" in t
    row = next(ln for ln in lines if ln.split()[:2] == ["rm1", "CXL"])
    assert "6.00x" in row and "5.000" in row and row.rstrip().endswith("yes")
    assert next(ln for ln in lines if ln.split()[:2] == ["rm2", "CXL-B"]).rstrip().endswith("NO")
    assert len({len(ln) for ln in lines[:12]}) <= 2  # fixed width (trailing verified column varies)


def test_write_report(result, tmp_path):
    paths = er.write_report(result, tmp_path / "out")
    names = [p.name for p in paths]
    assert names == ["report.md", "fig11_speedup.png", "fig12_timeline_rm1.png", "fig12_timeline_rm2.png",
                     "fig13_energy.png"]
    for p in paths:
        assert p.is_file()
        if p.suffix == ".png":
            data = p.read_bytes()
            assert data[:8] == PNG_MAGIC and len(data) > 10_000, p
            assert b"Software" not in data and b"matplotlib" not in data.lower()
    md = (tmp_path / "out" / "report.md").read_text()
    for m in TIMES:
        assert f"### {m}" in md
    table_rows = [ln for ln in md.splitlines() if ln.startswith("| ")]
    for m in TIMES:
        sect = md.split(f"### {m}")[1].split("###")[0]
        for c in CONFIGS:
            assert any(ln.startswith(f"| {er.CONFIG_LABELS[c]} |") for ln in sect.splitlines()), (m, c)
    assert len(table_rows) >= 2 * 6
    assert "1 of 10 results FAILED" in md and "rm2 / CXL-B" in md
    assert "pooled vector mismatch | table 3 row 17" in md  # full error in a fenced block
    assert "**NO**" in md
    assert md.count("**holds**") == 2
    assert "5.20x" in md and "76.0%" in md and "1.23x" in md and "1.14x" in md
    assert "- synthetic note one" in md and "- synthetic note two" in md
    for name in names[1:]:
        assert f"({name})" in md
    assert "seed: 7" in md and "250.000 MHz" in md
    assert "None found" in md  # the synthetic data is self-consistent


def test_deterministic(result, tmp_path):
    a = er.write_report(result, tmp_path / "a")
    b = er.write_report(result, tmp_path / "b")
    for pa, pb in zip(a, b):
        assert pa.read_bytes() == pb.read_bytes(), pa.name


def test_missing_and_broken_results(result, tmp_path):
    """Missing combos, a failed result with no numbers, a broken ordering and inconsistent sums."""
    r = copy.deepcopy(result)
    r["results"] = [x for x in r["results"] if (x["model"], x["config"]) not in {("rm1", "cxl-d"), ("rm2", "pmem")}]
    r["results"].append({"model": "rm3", "config": "cxl", "verified": False, "error": "Verilator build failed"})
    for x in r["results"]:
        if (x["model"], x["config"]) == ("rm1", "pcie"):
            x["batch_time_ms"] = 40.0  # slower than PMEM; breakdown and speedup field now disagree
    paths = er.write_report(r, tmp_path)
    assert [p.name for p in paths][-2:] == ["fig12_timeline_rm3.png", "fig13_energy.png"]
    for p in paths[1:]:
        assert p.read_bytes()[:8] == PNG_MAGIC
    md = paths[0].read_text()
    assert "2 of 9 results FAILED" in md and "Verilator build failed" in md
    assert "rm1/CXL-D" in md and "rm2/PMEM" in md and "rm3/PMEM" in md  # listed as missing
    assert "**does NOT hold**" in md and "**holds**" not in md
    assert "rm1/pcie: breakdown_ms sums to" in md and "rm1/pcie: speedup_vs_pmem is" in md
    assert "excluded rm2 (pmem missing); rm3 (pmem missing, cxl not verified)" in md
    t = er.text_table(r)
    assert "rm3/cxl: Verilator build failed" in t and "0.75x" in t


def test_duplicate_rejected(result, tmp_path):
    result["results"].append(copy.deepcopy(result["results"][0]))
    with pytest.raises(ValueError, match="duplicate"):
        er.write_report(result, tmp_path)
