"""DLRM presets, the trace generator and the trace file format (sim/model/trace.py).

Determinism (same seed, same bytes), the effect of every knob, the round trip, and that each
malformed file is rejected with a message naming the fault. Also ``trainingcxl trace``
(tools/trace_cmd.py) through its argparse entry point.
"""
from __future__ import annotations

import argparse
import io
import json
import zipfile

import numpy as np
import pytest

from sim.model.dlrm import PRESETS, get_preset
from sim.model.trace import (TraceBatch, TraceFormatError, TraceKnobs, generate_trace, make_manifest, read_trace,
                             stream_trace, summarize, write_trace)
from tools.trace_cmd import add_trace_parser


def table_indices(batch: TraceBatch, t: int, B: int) -> list[np.ndarray]:
    """The bags of table t in a batch."""
    offs = batch.offsets.astype(np.int64)
    return [batch.indices[offs[t * B + b]:offs[t * B + b + 1]] for b in range(B)]


# --------------------------------------------------------------------------------------------
# presets
# --------------------------------------------------------------------------------------------
def test_presets_follow_the_sources():
    assert set(PRESETS) == {"rm1", "rm2", "rm3", "rm4", "kaggle", "terabyte", "dcnv2", "rm-tiny"}
    table3 = {"rm1": (20, 32, 80, (13, 8192, 2048, 32), (256, 64, 1)),
              "rm2": (80, 32, 80, (13, 8192, 2048, 32), (512, 128, 1)),
              "rm3": (20, 32, 20, (13, 10240, 4096, 32), (512, 128, 1)),
              "rm4": (52, 16, 1, (13, 16384, 2048, 512, 16), (512, 128, 1))}
    for name, (tables, dim, lookups, bottom, top) in table3.items():
        p = get_preset(name)
        assert (p.num_tables, p.bottom_mlp, p.top_mlp) == (tables, bottom, top)
        assert all(t.dim == dim and t.lookups == lookups for t in p.tables)
    dcn = get_preset("dcnv2")
    assert dcn.lookups_per_sample == 214 and dcn.optimizer.name == "rowwise_adagrad"
    assert get_preset("kaggle").interaction_width == 27 * 26 // 2 + 16
    assert get_preset("rm-tiny").table_bytes < 1 << 20          # fits the 16 MiB device easily
    with pytest.raises(ValueError, match="unknown DLRM preset 'rm9'"):
        get_preset("rm9")


# --------------------------------------------------------------------------------------------
# determinism and round trip
# --------------------------------------------------------------------------------------------
KNOBS = TraceKnobs(batch_size=16, empty_prob=0.1, reuse=0.3, weights=True)


def test_same_seed_same_bytes(tmp_path):
    a, b, c = tmp_path / "a.npz", tmp_path / "b.npz", tmp_path / "c.npz"
    write_trace(a, generate_trace("rm-tiny", 3, 11, KNOBS))
    write_trace(b, generate_trace("rm-tiny", 3, 11, KNOBS))
    write_trace(c, generate_trace("rm-tiny", 3, 12, KNOBS))
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()


def test_round_trip_and_numpy_can_read_it(tmp_path):
    trace = generate_trace("rm-tiny", 3, 5, KNOBS)
    path = write_trace(tmp_path / "t.npz", trace)
    back = read_trace(path)
    assert back.manifest == json.loads(json.dumps(trace.manifest))
    for got, want in zip(back.batches, trace.batches, strict=True):
        for name in ("offsets", "indices", "weights", "dense", "labels"):
            np.testing.assert_array_equal(getattr(got, name), getattr(want, name))
            assert getattr(got, name).dtype == getattr(want, name).dtype
    with np.load(path) as z:
        np.testing.assert_array_equal(z["b000002_indices"], trace.batches[2].indices)
    # the streaming writer gives the same file
    write_trace(tmp_path / "s.npz", stream_trace("rm-tiny", 3, 5, KNOBS))
    assert (tmp_path / "s.npz").read_bytes() == path.read_bytes()


def test_manifest_records_preset_and_knobs():
    m = make_manifest("rm1", 2, 9, TraceKnobs(rows_cap=1000, batch_size=4, alpha=0.9, reuse=0.5))
    assert m["seed"] == 9 and m["batch_size"] == 4 and m["num_batches"] == 2 and m["preset"] == "rm1"
    assert all(t["rows"] == 1000 and t["rows_uncapped"] == 1 << 16 and t["alpha"] == 0.9 for t in m["tables"])
    assert m["generator"]["reuse"] == 0.5 and m["optimizer"] == {"name": "sgd", "lr": 0.1, "eps": 0.0}
    assert m["has_weights"] is False
    assert make_manifest("rm-tiny", 1, 0)["has_weights"] is True    # rm-tiny has a weighted table


# --------------------------------------------------------------------------------------------
# knobs
# --------------------------------------------------------------------------------------------
def top_share(indices: np.ndarray, rows: int, fraction: float = 0.01) -> float:
    """Share of accesses that go to the most-accessed ``fraction`` of rows."""
    counts = np.sort(np.bincount(indices.astype(np.int64), minlength=rows))[::-1]
    return counts[:max(1, int(rows * fraction))].sum() / counts.sum()


def test_zipf_concentrates_accesses_and_permutation_scatters_them():
    rows = 4096
    knobs = dict(rows_cap=rows, batch_size=512)
    skewed = generate_trace("rm3", 1, 1, TraceKnobs(alpha=1.15, **knobs)).batches[0]
    uniform = generate_trace("rm3", 1, 1, TraceKnobs(alpha=0.0, **knobs)).batches[0]
    # per table: each table has its own permutation, so its own hot rows
    s = min(top_share(np.concatenate(table_indices(skewed, t, 512)), rows) for t in range(20))
    u = max(top_share(np.concatenate(table_indices(uniform, t, 512)), rows) for t in range(20))
    assert u < 0.05 and s > 0.55, (s, u)     # Zipf(1.15) over 4096 rows: 64% in the top 1%
    # hot rows are scattered by the per-table permutation, and differ between tables
    hottest = [np.bincount(np.concatenate(table_indices(skewed, t, 512)).astype(np.int64)).argmax() for t in range(20)]
    assert len(set(hottest)) > 15 and max(hottest) > rows // 4


def test_empty_bag_probability_is_respected():
    B = 512
    trace = generate_trace("rm-tiny", 4, 3, TraceKnobs(batch_size=B, empty_prob=0.3, pooling="fixed"))
    empty = np.mean([np.diff(b.offsets.astype(np.int64)) == 0 for b in trace.batches])
    assert abs(empty - 0.3) < 0.03, empty
    none = generate_trace("rm-tiny", 2, 3, TraceKnobs(batch_size=B, empty_prob=0.0, pooling="fixed"))
    assert all(np.all(np.diff(b.offsets.astype(np.int64)) > 0) for b in none.batches)


def test_pooling_distributions():
    B = 256
    for kind in ("fixed", "uniform", "normal"):
        trace = generate_trace("rm-tiny", 1, 4, TraceKnobs(batch_size=B, pooling=kind, empty_prob=0.0))
        lengths = np.diff(trace.batches[0].offsets.astype(np.int64)).reshape(4, B)
        for t, tab in enumerate(trace.tables):
            mean, L = tab["pooling"]["mean"], lengths[t]
            if kind == "fixed":
                assert np.all(L == mean)
            elif kind == "uniform":
                assert L.min() >= 1 and L.max() <= mean and (mean == 1 or len(set(L)) > 1)
            else:
                assert L.min() >= 1 and L.max() <= tab["pooling"]["max_len"] and abs(L.mean() - mean) < 0.5


def count_in_bag_duplicates(trace) -> int:
    B, dups = trace.batch_size, 0
    for batch in trace.batches:
        for t in range(len(trace.tables)):
            dups += sum(bag.size - np.unique(bag).size for bag in table_indices(batch, t, B))
    return dups


def test_duplicates_on_and_off():
    knobs = dict(batch_size=64, alpha=1.3, rows_cap=16, reuse=0.5)
    with_dups = generate_trace("rm-tiny", 3, 8, TraceKnobs(duplicates=True, **knobs))
    without = generate_trace("rm-tiny", 3, 8, TraceKnobs(duplicates=False, **knobs))
    assert count_in_bag_duplicates(with_dups) > 100
    assert count_in_bag_duplicates(without) == 0
    # a bag can never be longer than the table without duplicates
    tiny = generate_trace("rm-tiny", 1, 8, TraceKnobs(duplicates=False, rows_cap=3, batch_size=32, pooling="fixed"))
    assert count_in_bag_duplicates(tiny) == 0
    assert np.diff(tiny.batches[0].offsets.astype(np.int64)).max() == 3


def reused_share(trace) -> float:
    """Share of indices of batch k (k >= 1) whose row was accessed in batch k-1, same table."""
    B, hits, total = trace.batch_size, 0, 0
    for prev, cur in zip(trace.batches, trace.batches[1:]):
        for t in range(len(trace.tables)):
            before = np.concatenate(table_indices(prev, t, B))
            now = np.concatenate(table_indices(cur, t, B))
            hits += np.isin(now, before).sum()
            total += now.size
    return hits / total


def test_reuse_fraction():
    knobs = dict(batch_size=32, alpha=0.0, rows_cap=100000)
    base = reused_share(generate_trace("rm3", 3, 2, TraceKnobs(reuse=0.0, **knobs)))
    reuse = reused_share(generate_trace("rm3", 3, 2, TraceKnobs(reuse=0.6, **knobs)))
    assert base < 0.02 and 0.58 < reuse < 0.64, (base, reuse)


def test_summary_counts():
    trace = generate_trace("rm-tiny", 2, 1, TraceKnobs(batch_size=8))
    s = summarize(trace)
    assert s["lookups"] == sum(b.indices.size for b in trace.batches)
    assert 0 < s["unique_rows"] <= s["lookups"] and s["tables"] == 4


def test_bad_knobs_are_rejected():
    for kwargs, msg in [(dict(reuse=1.5), "reuse"), (dict(empty_prob=-0.1), "empty_prob"), (dict(alpha=-1), "alpha"),
                        (dict(rows_cap=0), "rows_cap"), (dict(batch_size=0), "batch_size"),
                        (dict(pooling="poisson"), "pooling")]:
        with pytest.raises(ValueError, match=msg):
            TraceKnobs(**kwargs)
    with pytest.raises(ValueError, match="num_batches"):
        generate_trace("rm-tiny", 0, 1)
    with pytest.raises(ValueError, match="seed"):
        generate_trace("rm-tiny", 1, -1)


# --------------------------------------------------------------------------------------------
# rejection of malformed files
# --------------------------------------------------------------------------------------------
def npy(arr) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, allow_pickle=True)
    return buf.getvalue()


@pytest.fixture
def good(tmp_path):
    """A valid trace file's members as a dict name -> bytes, and a writer of variants."""
    path = write_trace(tmp_path / "good.npz", generate_trace("rm-tiny", 2, 1, TraceKnobs(batch_size=4)))
    with zipfile.ZipFile(path) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}

    def variant(change: dict) -> str:
        out = tmp_path / "bad.npz"
        merged = {**members, **change}
        with zipfile.ZipFile(out, "w") as zf:
            for name, data in merged.items():
                if data is not None:
                    zf.writestr(name, data)
        return str(out)

    manifest = json.loads(members["manifest.json"])
    b0 = {n.split("_", 1)[1][:-4]: np.load(io.BytesIO(members[n])) for n in members if n.startswith("b000000_")}
    return variant, manifest, b0


def manifest_with(manifest: dict, **changes) -> bytes:
    return json.dumps({**manifest, **changes}).encode()


def test_rejects_files_that_are_not_traces(tmp_path, good):
    variant, manifest, _ = good
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not a zip")
    with pytest.raises(TraceFormatError, match="not a trace file"):
        read_trace(junk)
    with pytest.raises(TraceFormatError, match="not a trace file"):
        read_trace(tmp_path / "missing.npz")
    with pytest.raises(TraceFormatError, match="no manifest.json"):
        read_trace(variant({"manifest.json": None}))
    with pytest.raises(TraceFormatError, match="not valid JSON"):
        read_trace(variant({"manifest.json": b"{oops"}))


@pytest.mark.parametrize("changes, msg", [
    (dict(format="other"), "format is 'other'"),
    (dict(version=2), "unsupported version 2"),
    (dict(batch_size=0), "'batch_size' = 0 out of range"),
    (dict(num_batches="2"), "'num_batches' has type str"),
    (dict(has_weights=1), "'has_weights' has type int"),
    (dict(tables=[]), "no tables"),
    (dict(seed=-3), "'seed' = -3"),
])
def test_rejects_bad_manifests(good, changes, msg):
    variant, manifest, _ = good
    with pytest.raises(TraceFormatError, match=msg):
        read_trace(variant({"manifest.json": manifest_with(manifest, **changes)}))


@pytest.mark.parametrize("table_change, msg", [
    (dict(dim=24), "table 0: dim = 24 is not a positive multiple of 16"),
    (dict(rows=0), "table 0: rows = 0 out of range"),
    (dict(mode="max"), "table 0: mode 'max'"),
    (dict(pooling={"kind": "zipf"}), "pooling kind 'zipf'"),
    (dict(mode="weighted_sum"), None),      # valid: rm-tiny's trace has weights
])
def test_rejects_bad_tables(good, table_change, msg):
    variant, manifest, _ = good
    tables = [dict(manifest["tables"][0], **table_change)] + manifest["tables"][1:]
    path = variant({"manifest.json": manifest_with(manifest, tables=tables)})
    if msg is None:
        read_trace(path)
    else:
        with pytest.raises(TraceFormatError, match=msg):
            read_trace(path)


def test_rejects_missing_and_extra_members(good):
    variant, manifest, _ = good
    with pytest.raises(TraceFormatError, match="missing member.*b000001_labels.npy"):
        read_trace(variant({"b000001_labels.npy": None}))
    with pytest.raises(TraceFormatError, match="unexpected member.*b000002_offsets.npy"):
        read_trace(variant({"b000002_offsets.npy": b""}))
    no_weights = manifest_with(manifest, has_weights=False,
                               tables=[dict(t, mode="sum") for t in manifest["tables"]])
    with pytest.raises(TraceFormatError, match="unexpected member.*weights"):
        read_trace(variant({"manifest.json": no_weights}))
    with pytest.raises(TraceFormatError, match="weighted_sum but the trace has no weights"):
        read_trace(variant({"manifest.json": manifest_with(manifest, has_weights=False)}))


def test_rejects_bad_arrays(good):
    variant, manifest, b0 = good
    offs, idx = b0["offsets"], b0["indices"]
    T, B = len(manifest["tables"]), manifest["batch_size"]
    decreasing = offs.copy()
    decreasing[4] = offs[3] - 1            # table 0 of rm-tiny has 4 indices per bag: offs[3] = 12
    shifted = offs.copy()
    shifted[0] = 1
    short_end = offs.copy()
    short_end[-1] -= 1
    big_index = idx.copy()
    big_index[offs[3 * B]] = manifest["tables"][3]["rows"]       # first index of table 3
    cases = [
        ("offsets", offs.astype(np.int64), "batch 0 offsets: dtype int64, expected uint32"),
        ("offsets", offs[:-1], f"batch 0 offsets: shape \\({T * B},\\), expected \\({T * B + 1},\\)"),
        ("offsets", shifted, "offsets\\[0\\] = 1, expected 0"),
        ("offsets", decreasing, "offsets decrease at bag 3 \\(table 0, sample 3\\)"),
        ("offsets", short_end, f"offsets\\[-1\\] = {offs[-1] - 1} but there are {idx.size} indices"),
        ("indices", big_index, f"index {manifest['tables'][3]['rows']} at position {offs[3 * B]} >= rows "
                               f"{manifest['tables'][3]['rows']} of table 3"),
        ("indices", idx.astype(np.int32), "indices: dtype int32, expected uint32"),
        ("weights", b0["weights"][:-1], "weights: shape"),
        ("dense", b0["dense"][:, :5], "dense: shape \\(4, 5\\), expected \\(4, 13\\)"),
        ("labels", b0["labels"] + 0.5, "labels must be 0.0 or 1.0"),
        ("labels", np.array([object()] * B), "not a valid .npy array"),
    ]
    for name, arr, msg in cases:
        with pytest.raises(TraceFormatError, match=msg):
            read_trace(variant({f"b000000_{name}.npy": npy(arr)}))


def test_write_rejects_inconsistent_traces(tmp_path):
    trace = generate_trace("rm-tiny", 2, 1, TraceKnobs(batch_size=4))
    trace.batches.pop()
    with pytest.raises(TraceFormatError, match="1 batches written but the manifest says 2"):
        write_trace(tmp_path / "x.npz", trace)
    assert not (tmp_path / "x.npz").exists() and not list(tmp_path.iterdir())
    trace = generate_trace("rm-tiny", 1, 1, TraceKnobs(batch_size=4))
    b = trace.batches[0]
    trace.batches[0] = TraceBatch(b.offsets, b.indices, None, b.dense, b.labels)
    with pytest.raises(TraceFormatError, match="weights: missing"):
        write_trace(tmp_path / "y.npz", trace)


# --------------------------------------------------------------------------------------------
# trainingcxl trace
# --------------------------------------------------------------------------------------------
def parse(argv):
    parser = argparse.ArgumentParser(prog="trainingcxl")
    add_trace_parser(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_trace_command(tmp_path, capsys):
    out = tmp_path / "t.npz"
    args = parse(["trace", "--preset", "rm-tiny", "--batches", "3", "--seed", "0x2a", "-o", str(out),
                  "--batch-size", "16", "--alpha", "1.1", "--empty-prob", "0.1", "--no-duplicates", "--reuse", "0.2"])
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0] == "seed 42"
    assert "4 tables" in text and "lookups" in text and "unique rows" in text
    assert f"({out.stat().st_size} bytes)" in text
    m = read_trace(out).manifest
    assert m["seed"] == 42 and m["batch_size"] == 16 and m["generator"]["duplicates"] is False
    assert all(t["alpha"] == 1.1 and t["pooling"]["empty_prob"] == 0.1 for t in m["tables"])
    # the same command again writes the same bytes
    first = out.read_bytes()
    assert args.func(args) == 0 and out.read_bytes() == first


def test_trace_command_bad_arguments(tmp_path, capsys):
    args = parse(["trace", "--preset", "rm9", "--batches", "1", "-o", str(tmp_path / "t.npz")])
    assert args.func(args) == 2
    captured = capsys.readouterr()
    assert captured.out.startswith("seed ") and "unknown preset 'rm9'" in captured.err
    args = parse(["trace", "--preset", "rm-tiny", "--batches", "1", "--reuse", "2", "-o", str(tmp_path / "t.npz")])
    assert args.func(args) == 2 and "reuse must be in [0, 1]" in capsys.readouterr().err
