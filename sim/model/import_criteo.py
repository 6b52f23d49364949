"""Criteo click logs (Kaggle ``train.txt``, Terabyte ``day_N``) -> trace format v1, streaming.

Input: one sample per line, tab-separated: label, 13 integer dense features, 26 categorical
features as hex (8 digits in the released files); any feature may be empty; plain text or
gzip (detected by its magic bytes). ``import_criteo(path, ...)`` returns ``(manifest, batch
iterator)`` for ``trace.write_trace``; nothing but one batch of lines is ever held in memory.

Preprocessing, as facebookresearch/dlrm ``data_utils.py`` (``getCriteoAdData``) does it:
- label: kept as given; it must be exactly ``0`` or ``1``;
- dense: empty -> 0; negative -> 0; then log(1 + x) (float32);
- categorical: empty -> 0 (DLRM's "set missing values to zero"), hex -> integer, then folded
  into the table's rows by ``value % rows`` (DLRM's ``--max-ind-range`` modulo). DLRM first
  maps values to dense ids with a dictionary built over the whole dataset; a streaming
  importer cannot, so the modulo applies to the raw 32-bit value (a hash fold).
Rows of table t: the preset's rows for that feature (``kaggle``: the Kaggle cardinalities,
already capped at 2**18) when the preset has 26 tables, capped at ``rows_cap``; with a
preset of another table count ``rows_cap`` is required. Dims likewise: the preset's, or
``dim``. Every bag has one index (one-hot; pooling mode sum). ``tables`` keeps a subset of
the 26 features, in the order given. Samples after the last whole batch are dropped (the
manifest's origin says how many).

Two passes: the first hashes the file (SHA-256 of the bytes as stored) and counts its lines
(up to batches * batch_size), the second parses. A bad line raises ``TraceImportError``
naming the file, the line number (1-based) and the fault.
"""
from __future__ import annotations

import re
from typing import Iterator

import numpy as np

from sim.model.dlrm import DlrmPreset, get_preset
from sim.model.import_common import (base_manifest, fail, file_digest, open_input, origin,
                                     parse_tables)
from sim.model.trace import TraceBatch

FORMAT_NAME = "criteo-tsv"
NUM_DENSE = 13
NUM_CAT = 26
FIELDS = 1 + NUM_DENSE + NUM_CAT
_HEX = re.compile(r"[0-9a-fA-F]{1,16}\Z")
_INT = re.compile(r"-?[0-9]+\Z")


def _count_lines(path, limit: int | None) -> int:
    """Lines in the (decompressed) file, stopping at ``limit``; a truncated gzip fails here."""
    n, last = 0, b"\n"
    try:
        with open_input(path) as f:
            while chunk := f.read(1 << 20):
                n += chunk.count(b"\n")
                last = chunk[-1:]
                if limit is not None and n >= limit:
                    return limit
    except (EOFError, OSError) as e:       # gzip.BadGzipFile is an OSError
        fail(path, None, f"truncated or corrupt gzip ({e})")
    return n + (last != b"\n")


def parse_line(path, lineno: int, raw: bytes, picked: list[int], rows: list[int]):
    """(label, dense[13] float32, rows[T]) of one line, or TraceImportError."""
    try:
        text = raw.decode("ascii").rstrip("\r\n")
    except UnicodeDecodeError:
        fail(path, f"line {lineno}", "not ASCII text")
    fields = text.split("\t")
    if len(fields) != FIELDS:
        fail(path, f"line {lineno}", f"{len(fields)} tab-separated fields, expected {FIELDS} "
                                     f"(label, {NUM_DENSE} dense, {NUM_CAT} categorical)")
    if fields[0] not in ("0", "1"):
        fail(path, f"line {lineno}", f"label {fields[0]!r} is not 0 or 1")
    dense = np.zeros(NUM_DENSE, dtype=np.float64)
    for i, v in enumerate(fields[1:1 + NUM_DENSE]):
        if v:
            if not _INT.match(v):
                fail(path, f"line {lineno}", f"dense feature {i + 1} {v!r} is not an integer")
            dense[i] = max(int(v), 0)
    cats = fields[1 + NUM_DENSE:]
    out = []
    for j, t in enumerate(picked):
        v = cats[t]
        if v and not _HEX.match(v):
            fail(path, f"line {lineno}", f"categorical feature {t + 1} {v!r} is not hex")
        out.append((int(v, 16) if v else 0) % rows[j])
    return int(fields[0]), np.log1p(dense).astype(np.float32), out


def table_shapes(preset: DlrmPreset, picked: list[int], rows_cap: int | None, dim: int | None,
                 path) -> list[dict]:
    """Rows / dim of the picked features (module docstring)."""
    match = preset.num_tables == NUM_CAT
    if not match and rows_cap is None:
        fail(path, "--rows-cap", f"preset {preset.name} has {preset.num_tables} tables, not {NUM_CAT}: "
                                 f"give --rows-cap for the rows of each table")
    if not match and dim is None:
        fail(path, "--dim", f"preset {preset.name} has {preset.num_tables} tables, not {NUM_CAT}: give --dim")
    tables = []
    for t in picked:
        uncapped = preset.tables[t].rows if match else rows_cap
        rows = min(uncapped, rows_cap) if rows_cap else uncapped
        d = dim if dim is not None else preset.tables[t].dim
        tables.append({"rows": rows, "rows_uncapped": uncapped, "dim": d, "mode": "sum",
                       "pooling": {"kind": "fixed", "mean": 1, "std": 0.0, "max_len": 1, "empty_prob": 0.0},
                       "alpha": None, "feature": t})
    return tables


def import_criteo(path, *, preset: DlrmPreset | str = "kaggle", batch_size: int | None = None,
                  batches: int | None = None, tables: str | None = None, rows_cap: int | None = None,
                  dim: int | None = None, seed: int = 0) -> tuple[dict, Iterator[TraceBatch]]:
    """(manifest, lazy batches) of a Criteo TSV file; raises TraceImportError on bad input."""
    preset = get_preset(preset) if isinstance(preset, str) else preset
    B = batch_size or preset.batch_size
    if B < 1 or (batches is not None and batches < 1) or (rows_cap is not None and rows_cap < 1):
        fail(path, "options", "--batch-size, --batches and --rows-cap must be >= 1")
    if dim is not None and (dim < 16 or dim % 16):
        fail(path, "--dim", f"{dim} is not a positive multiple of 16")
    picked = parse_tables(tables, NUM_CAT, path)
    shapes = table_shapes(preset, picked, rows_cap, dim, path)
    sha, size = file_digest(path)
    if size == 0:
        fail(path, None, "empty file")
    lines = _count_lines(path, batches * B if batches else None)
    if lines == 0:
        fail(path, None, "empty file (no lines after decompression)")
    n = lines // B if batches is None else min(batches, lines // B)
    if n == 0:
        fail(path, None, f"{lines} lines, fewer than one batch of {B}")
    options = {"preset": preset.name, "batch_size": B, "batches": batches, "tables": picked, "rows_cap": rows_cap,
               "dim": dim, "seed": seed, "fold": "modulo", "empty_categorical": "0"}
    org = origin(FORMAT_NAME, path, sha, size, options, generated=[], samples=n * B,
                 samples_unused=(lines - n * B) if batches is None else None,
                 note="dense log(1+max(x,0)), empty -> 0; categorical hex % rows, empty -> 0; labels as given")
    manifest = base_manifest(preset, seed=seed, batch_size=B, num_batches=n, num_dense=NUM_DENSE,
                             tables=shapes, org=org)
    return manifest, _batches(path, n, B, picked, [t["rows"] for t in shapes])


def _batches(path, n: int, B: int, picked: list[int], rows: list[int]) -> Iterator[TraceBatch]:
    T = len(picked)
    offsets = np.arange(T * B + 1, dtype=np.uint32)        # one index per bag
    try:
        with open_input(path) as f:
            lineno = 0
            for _ in range(n):
                labels = np.empty(B, dtype=np.float32)
                dense = np.empty((B, NUM_DENSE), dtype=np.float32)
                idx = np.empty((T, B), dtype=np.uint32)
                for b in range(B):
                    lineno += 1
                    labels[b], dense[b], idx[:, b] = parse_line(path, lineno, f.readline(), picked, rows)
                yield TraceBatch(offsets.copy(), idx.reshape(-1), None, dense, labels)
    except (EOFError, OSError) as e:       # gzip.BadGzipFile is an OSError
        fail(path, f"line {lineno}", f"truncated or corrupt gzip ({e})")
