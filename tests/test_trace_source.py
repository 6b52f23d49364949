"""``--trace FILE`` on the simulation commands (tools/trace_source.py, tools/run_cmd.py).

Pure Python: binding a file to a model, every conflict as a one-line error naming the field,
the source record. One short simulation (marked sim): an imported Criteo sample through
``trainingcxl run --trace`` on the RTL, verified, its JSON naming the file's hash and origin.
"""
from __future__ import annotations

import argparse
import json

import pytest

from sim.model.import_criteo import import_criteo
from sim.model.trace import TraceKnobs, generate_trace, read_trace, write_trace
from tools.trace_source import TraceSourceError, check_against_model, load_bound_trace
from tools.workload_samples import criteo_lines


@pytest.fixture
def criteo_trace(tmp_path):
    src = tmp_path / "criteo.txt"
    src.write_text("".join(criteo_lines(24, 2)))
    return write_trace(tmp_path / "criteo.npz", import_criteo(src, preset="kaggle", batch_size=4, rows_cap=64))


def test_bound_trace_takes_the_model_mlp_and_keeps_the_file(criteo_trace):
    from sim.model.dlrm import get_preset
    preset, trace, source = load_bound_trace(criteo_trace, "kaggle", batches=2)
    assert preset is get_preset("kaggle") and len(trace.batches) == 2 and trace.manifest["num_batches"] == 2
    m = trace.manifest
    assert m["preset"] == "kaggle" and m["bottom_mlp"] == list(preset.bottom_mlp)
    rows = [t["rows"] for t in m["tables"]]
    assert m["origin"]["format"] == "criteo-tsv" and max(rows) == 64 and min(rows) == 3
    assert source["kind"] == "file" and source["origin"] == "criteo-tsv" and len(source["sha256"]) == 64
    assert source["origin_file"] == "criteo.txt"
    assert read_trace(criteo_trace).manifest["num_batches"] == 6            # the file is untouched


def test_generated_file_records_its_preset_and_seed(tmp_path):
    path = write_trace(tmp_path / "g.npz", generate_trace("rm-tiny", 2, 9, TraceKnobs(batch_size=4)))
    _, _, source = load_bound_trace(path, "rm-tiny")
    assert source["origin"] == "generated" and source["generated_from"] == {"preset": "rm-tiny", "seed": 9}


@pytest.mark.parametrize("model, field", [("rm1", "tables: the trace has 26 tables but model rm1"),
                                          ("dcnv2", "optimizer: model dcnv2 trains with rowwise_adagrad")])
def test_conflicts_name_the_field(criteo_trace, model, field):
    with pytest.raises(TraceSourceError, match=f"^--trace: {field}"):
        load_bound_trace(criteo_trace, model)


def test_dim_and_dense_conflicts(criteo_trace):
    from sim.model.dlrm import get_preset
    m = read_trace(criteo_trace).manifest
    wide = dict(m, tables=[dict(t, dim=32) for t in m["tables"]])
    with pytest.raises(TraceSourceError, match="dim: table 0 has dim 32 but model kaggle's bottom MLP ends at "
                                               "width 16"):
        check_against_model(wide, get_preset("kaggle"))
    with pytest.raises(TraceSourceError, match="num_dense: the trace has 5 dense features"):
        check_against_model(dict(m, num_dense=5), get_preset("kaggle"))
    with pytest.raises(TraceSourceError, match="batches: --batches 9 but criteo.npz has 6"):
        load_bound_trace(criteo_trace, "kaggle", batches=9)


def _run(argv, capsys):
    from tools.run_cmd import add_run_parser
    p = argparse.ArgumentParser()
    add_run_parser(p.add_subparsers())
    args = p.parse_args(["run", *argv])
    code = args.func(args)
    return code, capsys.readouterr()


def test_run_trace_errors_are_one_line(criteo_trace, tmp_path, capsys):
    cases = [(["--model", "rm1", "--trace", str(criteo_trace)], "tables: the trace has 26 tables"),
             (["--model", "kaggle", "--trace", str(criteo_trace), "--rows-cap", "8"], "--rows-cap applies to a "
                                                                                      "generated trace"),
             (["--model", "kaggle", "--trace", str(tmp_path / "nope.npz")], "no such file"),
             (["--model", "kaggle"], "--batches is required")]
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    cases.append((["--model", "kaggle", "--trace", str(bad)], "not a trace file"))
    for argv, msg in cases:
        code, cap = _run(argv + ["--seed", "1", "--json", str(tmp_path / "r.json")], capsys)
        assert code == 2 and msg in cap.err, (argv, cap.err)
        assert len(cap.err.strip().splitlines()) == 1 and not (tmp_path / "r.json").exists()


def test_run_trace_rows_that_do_not_fit_name_rows(tmp_path, capsys):
    src = tmp_path / "c.txt"
    src.write_text("".join(criteo_lines(8, 1)))
    big = write_trace(tmp_path / "big.npz", import_criteo(src, preset="kaggle", batch_size=4))   # 2**18 rows
    m = read_trace(big).manifest
    m["tables"] = [dict(t, rows=(1 << 32) - 1) for t in m["tables"]]
    from tools.run_cmd import RunError, choose_device
    from sim.model.trace import Trace
    with pytest.raises(RunError, match=r"^--trace: rows: \d+ rows"):
        choose_device(Trace(m, read_trace(big).batches), "host", "--trace")


@pytest.mark.sim
def test_run_trace_end_to_end(criteo_trace, tmp_path, capsys):
    out = tmp_path / "run.json"
    code, cap = _run(["--model", "kaggle", "--trace", str(criteo_trace), "--batches", "2", "--seed", "3",
                      "--json", str(out)], capsys)
    assert code == 0, cap.out[-3000:] + cap.err
    r = json.loads(out.read_text())
    assert r["verified"] and len(r["batches"]) == 2 and r["knobs"]["batch_size"] == 4
    src = r["trace_source"]
    assert src["kind"] == "file" and src["origin"] == "criteo-tsv" and src["origin_file"] == "criteo.txt"
    assert r["lookups"] == 2 * 4 * 26 and "trace: file" in cap.err


# --------------------------------------------------------------------------------------------
# eval and crash: the same checks, before any simulation
# --------------------------------------------------------------------------------------------
def _eval_args(**kw):
    base = dict(models="kaggle", configs="pmem,cxl", batches=None, seed=1, json="x.json", report=None,
                batch_size=None, rows_cap=None, mlp_probe=4096, recompose=None, trace=None)
    base.update(kw)
    return argparse.Namespace(**base)


def test_eval_trace_requests_are_checked(criteo_trace, tmp_path):
    from tools.eval_cmd import EvalError, bind_traces, check_fits, check_request
    for kw, msg in [(dict(models="kaggle,rm1"), "--trace: models: one --models entry"),
                    (dict(rows_cap=8), "--rows-cap applies to a generated trace")]:
        with pytest.raises(EvalError, match=msg):
            check_request(_eval_args(trace=str(criteo_trace), **kw))
    args = _eval_args(models="rm1", trace=str(criteo_trace))
    models, _ = check_request(args)
    with pytest.raises(EvalError, match="^--trace: tables: the trace has 26 tables but model rm1"):
        bind_traces(args, models, tmp_path)
    args = _eval_args(trace=str(criteo_trace), batches=2)
    models, _ = check_request(args)
    sources = bind_traces(args, models, tmp_path)
    assert args.batches == 2 and sources["kaggle"]["origin"] == "criteo-tsv"
    check_fits("kaggle", args)                 # 26 x 64 rows and batch 4 fit the device
    assert read_trace(args.bound_traces["kaggle"][0]).manifest["preset"] == "kaggle"
    # a generated run records its preset and seed
    args = _eval_args(models="rm-tiny")
    assert bind_traces(args, check_request(args)[0], tmp_path)["rm-tiny"]["kind"] == "preset" and args.batches == 3


def test_eval_report_names_the_trace():
    from tools.eval_report import trace_sources_text
    meta = {"trace_sources": {"kaggle": {"kind": "file", "file": "/x/c.npz", "sha256": "ab" * 32, "batches": 2,
                                         "origin": "criteo-tsv", "origin_file": "train.txt",
                                         "origin_sha256": "cd" * 32, "generated_from": None},
                              "rm1": {"kind": "preset", "preset": "rm1", "seed": 1}}}
    lines = trace_sources_text(meta)
    assert lines[0].startswith("kaggle: file c.npz (sha256 abababab")
    assert "imported criteo-tsv from train.txt" in lines[0]
    assert lines[1] == "rm1: generated from preset rm1 seed 1"


def test_crash_trace_requests_are_checked(criteo_trace, tmp_path, capsys):
    from tools.crash_cmd import cmd_crash
    from sim.tb.crash_tb import PHASES
    base = dict(model="kaggle", points=2, seed=1, json=str(tmp_path / "c.json"), phases=",".join(PHASES),
                schedule="cxl-b", rows_cap=None, batch_size=None, trace=str(criteo_trace))
    for kw, msg in [(dict(model="rm-tiny"), "--trace: tables: the trace has 26 tables but model rm-tiny"),
                    (dict(batch_size=2), "--batch-size applies to a generated trace")]:
        assert cmd_crash(argparse.Namespace(**(base | kw))) == 2
        err = capsys.readouterr().err
        assert msg in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "c.json").exists()


def test_every_eval_result_carries_the_command_trace_source():
    from tools.eval_cmd import compose_all
    src = {"kind": "file", "file": "c.npz", "sha256": "ab" * 32, "origin": "criteo-tsv"}
    runs = {"kaggle": {"exact": {"verified": False, "error": "x", "trace_source": {"kind": "file"}}}}
    out = compose_all(runs, ["kaggle"], ["pmem", "cxl-d"], {"trace_sources": {"kaggle": src}})
    assert [r["trace_source"] for r in out["results"]] == [src, src]
    assert out["meta"]["trace_sources"] == {"kaggle": src}


def test_eval_trace_whose_rows_do_not_fit_names_rows(tmp_path, monkeypatch):
    import hw.config
    from tools.eval_cmd import EvalError, bind_traces, check_fits, check_request
    monkeypatch.setattr(hw.config, "SIM_CAPACITY_BYTES", 64 << 20)   # the default 1 GiB holds them
    src = tmp_path / "c.txt"
    src.write_text("".join(criteo_lines(8, 1)))
    big = write_trace(tmp_path / "big.npz", import_criteo(src, preset="kaggle", batch_size=4))   # Kaggle rows: 113 MiB
    args = _eval_args(trace=str(big))
    models, _ = check_request(args)
    bind_traces(args, models, tmp_path)
    with pytest.raises(EvalError, match=r"^--trace: rows: \d+ rows \([\d.]+ MiB of tables\) do not fit the device"):
        check_fits("kaggle", args)
