"""Meta's embedding-lookup traces (dlrm_datasets, FBGEMM TBE benchmark) -> trace format v1.

Input: one ``torch.save``d tuple ``(indices, offsets, lengths)`` per file, optionally gzip
compressed (detected by its magic bytes), as FBGEMM's TBE benchmark reads with
``--requests_data_file``: ``lengths`` int [T, B] (bag lengths, table-major), ``offsets``
int [T*B + 1] (TBE offsets: bag (t, b) is indices[offsets[t*B+b] : offsets[t*B+b+1]]),
``indices`` int [offsets[-1]] (rows, int64 in the published files). Loaded with
``torch.load(..., weights_only=True)``; torch is imported here only, and its absence is a
``TraceImportError`` saying how to install it.

``import_fbgemm(path, ...)`` returns ``(manifest, batch iterator)`` for ``write_trace``:
- ``tables`` keeps a subset of the T tables, in the order given (FBGEMM's ``--tables``);
- the file's B samples are cut into batches of ``batch_size`` (default B: the whole file is
  one batch), the first ``batches`` of them (default all whole ones); the rest is dropped;
- rows of a table: its largest index + 1 over the kept batches, or, with ``rows_cap``,
  ``min(that, rows_cap)`` with every index folded by ``index % rows_cap``;
- dims: ``dim``, or the preset's per-table dims when it has as many tables as are kept;
- pooling mode sum (FBGEMM's benchmark default); no per-index weights;
- dense features (preset's ``num_dense``, log(1 + Exp(1))) and labels (Bernoulli(0.25)) are
  not in the file: they are drawn from ``seed`` (rng [seed, 5, k] per batch) and the
  manifest's ``origin.generated`` says so.
Faults (wrong arity, non-tensor members, lengths that disagree with offsets, negative or
fractional indices, truncated gzip, empty file) raise ``TraceImportError`` naming the file,
the member and the fault.
"""
from __future__ import annotations

import io
from typing import Iterator

import numpy as np

from sim.model.dlrm import DlrmPreset, get_preset
from sim.model.import_common import (base_manifest, fail, file_digest, is_gzip, open_input, origin, parse_tables,
                                     pooling_summary)
from sim.model.trace import CLICK_RATE, TraceBatch

FORMAT_NAME = "fbgemm-pt"
MEMBERS = ("indices", "offsets", "lengths")


def _load(path):
    try:
        import torch
    except ImportError:
        fail(path, None, "reading fbgemm-pt needs torch (pip install -e '.[oracle]')")
    try:
        with open_input(path) as f:
            data = f.read()
    except (EOFError, OSError) as e:
        fail(path, None, f"truncated or corrupt gzip ({e})")
    if not data:
        fail(path, None, "empty file" + (" (after decompression)" if is_gzip(path) else ""))
    try:
        return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception as e:                      # torch raises many kinds; each is a bad file
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        fail(path, None, f"not a torch.save file ({msg[:200]})")


def _as_int_array(path, name: str, value, ndim: int) -> np.ndarray:
    import torch
    if not isinstance(value, torch.Tensor):
        fail(path, f"member {name}", f"is a {type(value).__name__}, expected a tensor")
    arr = value.detach().cpu().numpy()
    if arr.ndim != ndim:
        fail(path, f"member {name}", f"has {arr.ndim} dimensions {tuple(arr.shape)}, expected {ndim}")
    if arr.dtype.kind == "f":
        bad = np.nonzero(arr != np.floor(arr))[0] if ndim == 1 else np.argwhere(arr != np.floor(arr))
        if len(bad):
            pos = tuple(int(x) for x in np.atleast_1d(bad[0]))
            fail(path, f"member {name}", f"fractional value {float(arr[pos])} at {pos[0] if ndim == 1 else pos}")
        fail(path, f"member {name}", f"dtype {arr.dtype}, expected an integer type")
    if arr.dtype.kind not in "iu":
        fail(path, f"member {name}", f"dtype {arr.dtype}, expected an integer type")
    arr = arr.astype(np.int64)
    if arr.size and arr.min() < 0:
        pos = np.argwhere(arr < 0)[0]
        where = int(pos[0]) if ndim == 1 else tuple(int(x) for x in pos)
        fail(path, f"member {name}", f"negative value {int(arr[tuple(pos)])} at {where}")
    return arr


def read_tbe(path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(indices int64 [n], offsets int64 [T*B+1], lengths int64 [T, B]), validated."""
    obj = _load(path)
    if not isinstance(obj, (tuple, list)):
        fail(path, None, f"holds a {type(obj).__name__}, expected a tuple (indices, offsets, lengths)")
    if len(obj) != 3:
        fail(path, None, f"tuple of {len(obj)} members, expected 3 (indices, offsets, lengths)")
    indices = _as_int_array(path, "indices", obj[0], 1)
    offsets = _as_int_array(path, "offsets", obj[1], 1)
    lengths = _as_int_array(path, "lengths", obj[2], 2)
    T, B = lengths.shape
    if T * B == 0:
        fail(path, "member lengths", f"shape {(T, B)}: no bags")
    if offsets.size != T * B + 1:
        fail(path, "member offsets", f"{offsets.size} entries, expected T*B+1 = {T * B + 1} (lengths is {T}x{B})")
    if offsets[0] != 0:
        fail(path, "member offsets", f"offsets[0] = {offsets[0]}, expected 0")
    steps = np.diff(offsets)
    if np.any(steps < 0):
        bag = int(np.nonzero(steps < 0)[0][0])
        fail(path, "member offsets", f"decrease at bag {bag} (table {bag // B}, sample {bag % B})")
    if offsets[-1] != indices.size:
        fail(path, "member offsets", f"offsets[-1] = {offsets[-1]} but indices has {indices.size} entries")
    flat = lengths.reshape(-1)
    if np.any(flat != steps):
        bag = int(np.nonzero(flat != steps)[0][0])
        fail(path, "member lengths", f"lengths[{bag // B}, {bag % B}] = {flat[bag]} disagrees with the offsets "
                                     f"(bag of {steps[bag]})")
    return indices, offsets, lengths


def import_fbgemm(path, *, preset: DlrmPreset | str = "kaggle", batch_size: int | None = None,
                  batches: int | None = None, tables: str | None = None, rows_cap: int | None = None,
                  dim: int | None = None, seed: int = 0) -> tuple[dict, Iterator[TraceBatch]]:
    """(manifest, batches) of an FBGEMM TBE request file; raises TraceImportError on bad input."""
    preset = get_preset(preset) if isinstance(preset, str) else preset
    if (batch_size is not None and batch_size < 1) or (batches is not None and batches < 1) or \
            (rows_cap is not None and rows_cap < 1):
        fail(path, "options", "--batch-size, --batches and --rows-cap must be >= 1")
    if dim is not None and (dim < 16 or dim % 16):
        fail(path, "--dim", f"{dim} is not a positive multiple of 16")
    sha, size = file_digest(path)
    if size == 0:
        fail(path, None, "empty file")
    indices, offsets, lengths = read_tbe(path)
    T_file, B_file = lengths.shape
    picked = parse_tables(tables, T_file, path)
    T = len(picked)
    B = batch_size or B_file
    if B > B_file:
        fail(path, "--batch-size", f"{B} is larger than the file's {B_file} samples")
    n = B_file // B if batches is None else min(batches, B_file // B)
    if dim is None and preset.num_tables != T:
        fail(path, "--dim", f"{T} tables kept but preset {preset.name} has {preset.num_tables}: give --dim")
    dims = [dim] * T if dim is not None else [t.dim for t in preset.tables]
    # Per kept table: its bags over the kept samples, folded.
    per_table = []
    for t in picked:
        lo, hi = int(offsets[t * B_file]), int(offsets[t * B_file + n * B])
        idx = indices[lo:hi]
        if rows_cap is not None:
            idx = idx % rows_cap
        per_table.append((offsets[t * B_file:t * B_file + n * B + 1] - lo, idx))
    shapes = []
    for j, (t, (offs, _)) in enumerate(zip(picked, per_table)):
        uncapped = int(indices[offsets[t * B_file]:offsets[t * B_file + n * B]].max(initial=0)) + 1
        rows = min(uncapped, rows_cap) if rows_cap else uncapped
        if rows >= 1 << 32:
            fail(path, "member indices", f"table {t} has index {rows - 1} >= 2**32: fold it with --rows-cap")
        shapes.append({"rows": rows, "rows_uncapped": uncapped, "dim": dims[j], "mode": "sum",
                       "pooling": pooling_summary(np.diff(offs)), "alpha": None, "feature": t})
    options = {"preset": preset.name, "batch_size": batch_size, "batches": batches, "tables": picked,
               "rows_cap": rows_cap, "dim": dim, "seed": seed, "fold": "modulo"}
    org = origin(FORMAT_NAME, path, sha, size, options, generated=["dense", "labels"],
                 file_tables=T_file, file_batch_size=B_file, samples=n * B, samples_unused=B_file - n * B,
                 note="indices, offsets and lengths from the file; dense features and labels drawn from the seed")
    manifest = base_manifest(preset, seed=seed, batch_size=B, num_batches=n, num_dense=preset.num_dense,
                             tables=shapes, org=org)
    return manifest, _batches(per_table, n, B, preset.num_dense, seed)


def _batches(per_table, n: int, B: int, num_dense: int, seed: int) -> Iterator[TraceBatch]:
    for k in range(n):
        lengths, parts = [], []
        for offs, idx in per_table:
            o = offs[k * B:(k + 1) * B + 1]
            lengths.append(np.diff(o))
            parts.append(idx[o[0]:o[-1]])
        lens = np.concatenate(lengths)
        offsets = np.r_[0, np.cumsum(lens)].astype(np.uint32)
        rng = np.random.default_rng([seed, 5, k])
        dense = np.log1p(rng.exponential(1.0, (B, num_dense))).astype(np.float32)
        labels = (rng.random(B) < CLICK_RATE).astype(np.float32)
        yield TraceBatch(offsets, np.concatenate(parts).astype(np.uint32), None, dense, labels)
