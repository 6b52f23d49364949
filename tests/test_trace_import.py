"""``trainingcxl trace import`` (tools/trace_import_cmd.py, sim/model/import_*.py).

Criteo TSV: DLRM's preprocessing, the modulo fold, streaming (memory bounded by a batch), the
manifest's origin. FBGEMM .pt: the TBE layout, table subsets, batch cuts, folding, gzip.
Every bad input gets one line naming the file and the line or member, exit 2, no file. All
input files are written by the tests (no download).
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import tracemalloc

import numpy as np
import pytest

from sim.model.import_common import TraceImportError
from sim.model.import_criteo import import_criteo, parse_line
from sim.model.trace import read_trace, write_trace
from tools.trace_cmd import add_trace_parser
from tools.workload_samples import criteo_lines, tbe_arrays

torch = pytest.importorskip("torch")


def run(argv, capsys):
    parser = argparse.ArgumentParser(prog="trainingcxl")
    add_trace_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code = args.func(args)
    return code, capsys.readouterr()


def line(label="0", dense=None, cats=None) -> str:
    dense = dense if dense is not None else [str(i) for i in range(13)]
    cats = cats if cats is not None else [f"{i:08x}" for i in range(26)]
    return "\t".join([label, *dense, *cats]) + "\n"


# --------------------------------------------------------------------------------------------
# Criteo
# --------------------------------------------------------------------------------------------
def test_criteo_preprocessing_follows_dlrm(tmp_path):
    dense = ["", "-3", "0", "7"] + ["1"] * 9
    cats = ["", "ffffffff", "0000000a"] + [f"{i:08x}" for i in range(23)]
    src = tmp_path / "day_0"
    src.write_text(line("1", dense, cats) + line("0") * 3)
    manifest, batches = import_criteo(src, preset="kaggle", batch_size=2)
    b0 = next(batches)
    np.testing.assert_array_equal(b0.labels, [1, 0])
    want = np.log1p(np.array([0, 0, 0, 7] + [1] * 9, dtype=np.float64)).astype(np.float32)
    np.testing.assert_array_equal(b0.dense[0], want)
    rows = [t["rows"] for t in manifest["tables"]]
    assert rows[:3] == [1460, 583, 1 << 18]             # the Kaggle cardinalities, capped
    B = 2
    assert b0.indices[0 * B] == 0                         # empty -> 0
    assert b0.indices[1 * B] == 0xFFFFFFFF % 583           # modulo fold
    assert b0.indices[2 * B] == 10
    np.testing.assert_array_equal(b0.offsets, np.arange(26 * B + 1))


def test_criteo_import_manifest_records_origin_and_round_trips(tmp_path, capsys):
    src = tmp_path / "train.txt"
    src.write_text("".join(criteo_lines(50, 3)))
    out = tmp_path / "c.npz"
    code, cap = run(["trace", "import", "--format", "criteo-tsv", str(src), "-o", str(out), "--batch-size", "8",
                     "--tables", "3,0,25", "--rows-cap", "100", "--dim", "32"], capsys)
    assert code == 0, cap.err
    m = read_trace(out).manifest
    org = m["origin"]
    assert org["format"] == "criteo-tsv" and org["file"] == "train.txt"
    assert org["sha256"] == hashlib.sha256(src.read_bytes()).hexdigest() and org["bytes"] == src.stat().st_size
    assert org["options"]["tables"] == [3, 0, 25] and org["options"]["rows_cap"] == 100
    assert org["samples"] == 48 and org["samples_unused"] == 2 and org["generated"] == []
    assert m["num_batches"] == 6 and m["batch_size"] == 8 and m["preset"] == "kaggle"
    assert [t["feature"] for t in m["tables"]] == [3, 0, 25]
    assert all(t["rows"] == 100 and t["dim"] == 32 and t["alpha"] is None for t in m["tables"])
    assert "wrote" in cap.out and "criteo-tsv train.txt" in cap.out
    # the first batch's feature 3 is line by line the 4th categorical field folded
    first = criteo_lines(50, 3)[:8]
    want = [int(f.split("\t")[14 + 3] or "0", 16) % 100 for f in first]
    np.testing.assert_array_equal(read_trace(out).batches[0].indices[:8], want)


def test_criteo_gzip_and_batches_option(tmp_path):
    text = "".join(criteo_lines(40, 4))
    plain, gz = tmp_path / "a.txt", tmp_path / "a.bin"          # gzip found by magic, not by name
    plain.write_text(text)
    gz.write_bytes(gzip.compress(text.encode()))
    write_trace(tmp_path / "p.npz", import_criteo(plain, batch_size=8, batches=2))
    write_trace(tmp_path / "g.npz", import_criteo(gz, batch_size=8, batches=2))
    p, g = read_trace(tmp_path / "p.npz"), read_trace(tmp_path / "g.npz")
    assert p.manifest["num_batches"] == 2
    for a, b in zip(p.batches, g.batches, strict=True):
        np.testing.assert_array_equal(a.indices, b.indices)
    assert p.manifest["origin"]["sha256"] != g.manifest["origin"]["sha256"]


def test_criteo_streams_with_memory_bounded_by_a_batch(tmp_path):
    """Importing 40x more lines must not need more memory (only the batch is held)."""
    def peak(lines: int) -> int:
        src = tmp_path / f"s{lines}.txt"
        src.write_text(line("1") * lines)
        tracemalloc.start()
        write_trace(tmp_path / f"s{lines}.npz", import_criteo(src, batch_size=16))
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return top
    small, large = peak(160), peak(6400)
    assert large < 2 * small + (256 << 10), (small, large)


CRITEO_BAD = [
    ("fields", line()[:-1] + "\textra\n", "line 2: 41 tab-separated fields, expected 40"),
    ("short", "0\t1\t2\n", "line 2: 3 tab-separated fields"),
    ("hex", line(cats=["zz123456"] + ["0"] * 25), "line 2: categorical feature 1 'zz123456' is not hex"),
    ("label", line(label="2"), "line 2: label '2' is not 0 or 1"),
    ("label-empty", line(label=""), "line 2: label '' is not 0 or 1"),
    ("dense", line(dense=["1.5"] + ["0"] * 12), "line 2: dense feature 1 '1.5' is not an integer"),
]


@pytest.mark.parametrize("name,bad,msg", CRITEO_BAD, ids=[c[0] for c in CRITEO_BAD])
def test_criteo_bad_line_is_one_line_error_and_nothing_written(tmp_path, capsys, name, bad, msg):
    src = tmp_path / "bad.tsv"
    src.write_text(line() + bad + line() * 2)
    out = tmp_path / "out.npz"
    code, cap = run(["trace", "import", "--format", "criteo-tsv", str(src), "-o", str(out), "--batch-size", "2"],
                    capsys)
    assert code == 2
    assert cap.err.strip() == f"error: bad.tsv: {msg}" or cap.err.startswith(f"error: bad.tsv: {msg}")
    assert len(cap.err.strip().splitlines()) == 1 and "Traceback" not in cap.err
    assert not out.exists() and list(tmp_path.iterdir()) == [src]


def test_criteo_empty_and_truncated_files(tmp_path, capsys):
    cases = {"empty.txt": b"", "empty.gz": gzip.compress(b""),
             "trunc.gz": gzip.compress(("".join(criteo_lines(200, 1))).encode())[:-300]}
    msgs = {"empty.txt": "empty.txt: empty file", "empty.gz": "empty.gz: empty file",
            "trunc.gz": "trunc.gz: truncated or corrupt gzip"}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        out = tmp_path / f"{name}.npz"
        code, cap = run(["trace", "import", "--format", "criteo-tsv", str(tmp_path / name), "-o", str(out),
                         "--batch-size", "4"], capsys)
        assert code == 2 and cap.err.startswith(f"error: {msgs[name]}"), cap.err
        assert len(cap.err.strip().splitlines()) == 1 and not out.exists()


def test_criteo_option_errors(tmp_path, capsys):
    src = tmp_path / "t.txt"
    src.write_text(line() * 4)
    for extra, msg in [(["--tables", "26"], "--tables: table 26 not in [0, 26)"),
                       (["--preset", "rm1"], "--rows-cap: preset rm1 has 20 tables, not 26"),
                       (["--dim", "20"], "--dim: 20 is not a positive multiple of 16"),
                       (["--batch-size", "5"], "4 lines, fewer than one batch of 5")]:
        code, cap = run(["trace", "import", "--format", "criteo-tsv", str(src), "-o", str(tmp_path / "o.npz"),
                         *extra], capsys)
        assert code == 2 and msg in cap.err, (extra, cap.err)
    with pytest.raises(TraceImportError, match="not ASCII"):
        parse_line("f", 1, "é\n".encode(), [0], [10])


# --------------------------------------------------------------------------------------------
# FBGEMM
# --------------------------------------------------------------------------------------------
def save(path, obj, compress=False):
    import io
    buf = io.BytesIO()
    torch.save(obj, buf)
    data = buf.getvalue()
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


def tbe(T=3, B=8, seed=1, rows=50):
    return tuple(torch.from_numpy(a) for a in tbe_arrays(T, B, seed, rows=rows))


def test_fbgemm_import_layout_subset_batches_and_generated_fields(tmp_path, capsys):
    indices, offsets, lengths = tbe(T=3, B=8)
    src = save(tmp_path / "fbgemm_t3_bs8.pt.gz", (indices, offsets, lengths), compress=True)
    out = tmp_path / "f.npz"
    code, cap = run(["trace", "import", "--format", "fbgemm-pt", str(src), "-o", str(out), "--tables", "2,0",
                     "--batch-size", "3", "--dim", "16", "--seed", "7"], capsys)
    assert code == 0, cap.err
    trace = read_trace(out)
    m = trace.manifest
    assert m["num_batches"] == 2 and m["batch_size"] == 3 and len(m["tables"]) == 2
    org = m["origin"]
    assert org["generated"] == ["dense", "labels"] and org["samples_unused"] == 2
    assert org["file_tables"] == 3 and org["file_batch_size"] == 8 and org["options"]["seed"] == 7
    assert org["sha256"] == hashlib.sha256(src.read_bytes()).hexdigest()
    off, idx = offsets.numpy(), indices.numpy()
    B = 8
    # batch 1, table slot 0 = file table 2, samples 3..5
    b1 = trace.batches[1]
    for s in range(3):
        want = idx[off[2 * B + 3 + s]:off[2 * B + 4 + s]]
        got = b1.indices[b1.offsets[s]:b1.offsets[s + 1]]
        np.testing.assert_array_equal(got, want)
    for slot, t in enumerate((2, 0)):
        kept = idx[off[t * B]:off[t * B + 6]]
        assert m["tables"][slot]["rows"] == kept.max() + 1
    # dense and labels are reproducible from the seed
    code, _ = run(["trace", "import", "--format", "fbgemm-pt", str(src), "-o", str(tmp_path / "g.npz"),
                   "--tables", "2,0", "--batch-size", "3", "--dim", "16", "--seed", "7"], capsys)
    assert (tmp_path / "g.npz").read_bytes() == out.read_bytes()


def test_fbgemm_rows_cap_folds_and_preset_dims(tmp_path):
    from sim.model.import_fbgemm import import_fbgemm
    indices, offsets, lengths = tbe(T=26, B=4, rows=900)
    src = save(tmp_path / "f.pt", (indices, offsets, lengths))
    manifest, batches = import_fbgemm(src, preset="kaggle", rows_cap=64)
    b = next(batches)
    assert all(t["rows"] <= 64 and t["dim"] == 16 for t in manifest["tables"])
    np.testing.assert_array_equal(b.indices, indices.numpy() % 64)
    np.testing.assert_array_equal(b.offsets, offsets.numpy())


def fb_bad_cases():
    i, o, l = tbe(T=2, B=4)
    frac = i.double()
    frac[3] = 2.5
    neg = i.clone()
    neg[5] = -1
    l2 = l.clone()
    l2[1, 2] += 1
    return [
        ("arity", (i, o), "tuple of 2 members, expected 3 (indices, offsets, lengths)"),
        ("arity4", (i, o, l, l), "tuple of 4 members"),
        ("not-tuple", {"indices": i}, "holds a dict, expected a tuple"),
        ("lengths", (i, o, l2), "member lengths: lengths[1, 2]"),
        ("negative", (neg, o, l), "member indices: negative value -1 at 5"),
        ("fractional", (frac, o, l), "member indices: fractional value 2.5 at 3"),
        ("offsets-len", (i, o[:-1], l), "member offsets: 8 entries, expected T*B+1 = 9"),
        ("offsets-end", (i[:-1], o, l), "member offsets: offsets[-1] ="),
        ("not-tensor", (i.tolist(), o, l), "member indices: is a list, expected a tensor"),
    ]


@pytest.mark.parametrize("name,obj,msg", fb_bad_cases(), ids=[c[0] for c in fb_bad_cases()])
def test_fbgemm_bad_input_is_one_line_error_and_nothing_written(tmp_path, capsys, name, obj, msg):
    src = save(tmp_path / "bad.pt", obj)
    out = tmp_path / "out.npz"
    code, cap = run(["trace", "import", "--format", "fbgemm-pt", str(src), "-o", str(out), "--dim", "16"], capsys)
    assert code == 2 and cap.err.startswith(f"error: bad.pt: {msg}"), cap.err
    assert len(cap.err.strip().splitlines()) == 1 and not out.exists()


def test_fbgemm_truncated_gzip_empty_and_not_torch(tmp_path, capsys):
    good = save(tmp_path / "g.pt", tbe(), compress=True).read_bytes()
    cases = {"trunc.pt.gz": (good[:len(good) // 2], "truncated or corrupt gzip"),
             "empty.pt": (b"", "empty file"),
             "text.pt": (b"hello", "not a torch.save file")}
    for name, (data, msg) in cases.items():
        (tmp_path / name).write_bytes(data)
        out = tmp_path / "o.npz"
        code, cap = run(["trace", "import", "--format", "fbgemm-pt", str(tmp_path / name), "-o", str(out),
                         "--dim", "16"], capsys)
        assert code == 2 and cap.err.startswith(f"error: {name}: {msg}"), cap.err
        assert len(cap.err.strip().splitlines()) == 1 and not out.exists()
    code, cap = run(["trace", "import", "--format", "fbgemm-pt", str(tmp_path / "nope.pt"), "-o",
                     str(tmp_path / "o.npz")], capsys)
    assert code == 2 and "no such file" in cap.err


def test_manifest_origin_is_validated(tmp_path):
    from sim.model.trace import TraceFormatError, validate_manifest
    src = tmp_path / "t.txt"
    src.write_text(line() * 2)
    m, _ = import_criteo(src, batch_size=2)
    validate_manifest(json.loads(json.dumps(m)))
    for mutate, msg in [(lambda o: o.update(sha256="xyz"), "sha256"), (lambda o: o.update(format="csv"), "format"),
                        (lambda o: o.update(generated=["bogus"]), "generated")]:
        bad = json.loads(json.dumps(m))
        mutate(bad["origin"])
        with pytest.raises(TraceFormatError, match=msg):
            validate_manifest(bad)
    gen = json.loads(json.dumps(m))
    del gen["origin"]
    with pytest.raises(TraceFormatError, match="alpha = None"):
        validate_manifest(gen)


def test_unwritable_output_is_one_line(tmp_path, capsys):
    src = tmp_path / "t.txt"
    src.write_text(line() * 2)
    code, cap = run(["trace", "import", "--format", "criteo-tsv", str(src), "-o", str(tmp_path / "no" / "o.npz"),
                     "--batch-size", "2"], capsys)
    assert code == 2 and "cannot write" in cap.err and len(cap.err.strip().splitlines()) == 1
