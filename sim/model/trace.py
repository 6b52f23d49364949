"""Seeded DLRM training traces and their file format.

File format (version 1)
-----------------------
A trace is ONE file, conventionally ``*.npz``: a ZIP archive (members stored uncompressed,
timestamps fixed at 1980-01-01, members in the order below) that ``numpy.load`` can open.
Members:

``manifest.json``  UTF-8 JSON object, keys sorted:
    format        "trainingcxl-trace"         version  1
    preset        preset name (sim/model/dlrm.py)   seed  int >= 0 (the generator seed)
    batch_size    B                           num_batches  N
    num_dense     dense features per sample   has_weights  bool
    checkpoint_every  batches per checkpoint (1 = every batch; consumers may ignore)
    optimizer     {"name": "sgd" | "rowwise_adagrad", "lr": float, "eps": float}
    bottom_mlp, top_mlp  layer widths (lists of int, as in the preset)
    tables        list of T objects, in TBE order:
                  {"rows": int, "rows_uncapped": int, "dim": int (multiple of 16),
                   "mode": "sum" | "mean" | "weighted_sum",
                   "pooling": {"kind": "fixed" | "uniform" | "normal", "mean": int,
                               "std": float, "max_len": int, "empty_prob": float},
                   "alpha": float (Zipf exponent; 0 = uniform)}
    generator     the knobs used: {"rows_cap", "batch_size", "alpha", "pooling", "empty_prob",
                  "duplicates", "reuse", "weights", "labels"} (null = the preset's value); null in an
                  imported trace
    origin        optional; absent = generated from preset and seed. An imported trace
                  (``trainingcxl trace import``) has {"format": "criteo-tsv" | "fbgemm-pt",
                  "file": input file name, "sha256": 64 hex digits of the input's bytes,
                  "bytes": its size, "options": every importer option (null = default),
                  "generated": the arrays drawn from ``seed`` because the file lacks them
                  (e.g. ["dense", "labels"]), plus importer facts (samples used, ...)}.
                  There ``preset`` names the preset that gave the MLP widths, optimizer and
                  defaults, the tables' ``pooling`` is the measured bag-length summary,
                  ``alpha`` is null (unknown; ``trainingcxl trace stats`` fits it), and each
                  table has ``feature``: its table / categorical feature number in the input.

For every batch k = 0..N-1 (``kkkkkk`` = k zero-padded to 6 digits), ``.npy`` arrays:
``bkkkkkk_offsets.npy``  uint32 [T*B+1]  TBE offsets: bag (t, b) is
                         indices[offsets[t*B+b] : offsets[t*B+b+1]]; offsets[0] = 0,
                         non-decreasing, offsets[-1] = len(indices)
``bkkkkkk_indices.npy``  uint32 [n]      row numbers; those of table t are < tables[t].rows
``bkkkkkk_weights.npy``  float32 [n]     per-index weights, present iff has_weights; tables
                         whose mode is not weighted_sum ignore theirs
``bkkkkkk_dense.npy``    float32 [B, num_dense]  dense features
``bkkkkkk_labels.npy``   float32 [B]     click labels, 0.0 or 1.0

``read_trace`` rejects anything else (missing or extra members, wrong dtype or shape, bad
offsets, an index >= rows, ...) with ``TraceFormatError`` naming the member and the fault.

Generator
---------
``generate_trace(preset, num_batches, seed, knobs)`` is a pure function of its arguments
(same seed -> identical arrays -> identical file bytes). Per table t a random permutation of
its rows (rng seeded [seed, 0, t]) scatters hot rows; per batch k one rng seeded [seed, 1, k]
draws, table by table:
1. bag lengths from the table's pooling distribution (``dlrm.PoolingDistribution``), then
   empties a bag with probability empty_prob; without duplicates L is capped at rows;
2. row ranks r in [0, rows) with P(r) proportional to (r+1)^-alpha (bounded Zipf, inverse
   CDF), mapped through the permutation (FBGEMM's benchmark scheme);
3. with probability ``reuse`` an index is replaced by one drawn uniformly from the previous
   batch's indices of the same table (FBGEMM's inter-batch reuse);
4. without duplicates, an index repeating one earlier in its bag is redrawn until none do;
5. weights uniform in [0, 1), dense features log(1 + Exp(1)), labels Bernoulli(0.25)
   (``labels="random"``, the default) or, with ``labels="learnable"``, a function of the
   features at the same positive rate: 1 when dense features 0 and 1 both exceed
   log(1 + ln 2) (each true for half the samples; the uniform draw is still made, so every
   other array is the same as with random labels).
"""
from __future__ import annotations

import dataclasses
import io
import json
import pathlib
import zipfile
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

from sim.model.dlrm import LENGTH_KINDS, POOLING_MODES, DlrmPreset, get_preset

FORMAT = "trainingcxl-trace"
VERSION = 1
MANIFEST = "manifest.json"
ARRAYS = ("offsets", "indices", "weights", "dense", "labels")
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)
CLICK_RATE = 0.25          # Criteo's positive rate is ~0.25
LABEL_KINDS = ("random", "learnable")
_DEDUP_ROUNDS = 64         # redraw rounds before the exhaustive fallback


class TraceFormatError(ValueError):
    """A trace file or trace object that does not follow the format."""


@dataclass(frozen=True)
class TraceKnobs:
    """Generator knobs; None keeps the preset's value."""
    rows_cap: int | None = None
    batch_size: int | None = None
    alpha: float | None = None
    pooling: str | None = None           # override every table's length distribution kind
    empty_prob: float | None = None
    duplicates: bool = True
    reuse: float = 0.0
    weights: bool | None = None          # None: iff some table pools weighted_sum
    labels: str = "random"               # or "learnable": a function of the features (step 5)

    def __post_init__(self):
        if self.rows_cap is not None and self.rows_cap < 1:
            raise ValueError(f"rows_cap must be >= 1, got {self.rows_cap}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.alpha is not None and self.alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {self.alpha}")
        if self.pooling is not None and self.pooling not in LENGTH_KINDS:
            raise ValueError(f"pooling must be one of {LENGTH_KINDS}, got {self.pooling!r}")
        if self.empty_prob is not None and not 0.0 <= self.empty_prob <= 1.0:
            raise ValueError(f"empty_prob must be in [0, 1], got {self.empty_prob}")
        if not 0.0 <= self.reuse <= 1.0:
            raise ValueError(f"reuse must be in [0, 1], got {self.reuse}")
        if self.labels not in LABEL_KINDS:
            raise ValueError(f"labels must be one of {LABEL_KINDS}, got {self.labels!r}")


@dataclass(frozen=True)
class TraceBatch:
    offsets: np.ndarray          # uint32 [T*B+1]
    indices: np.ndarray          # uint32 [n]
    weights: np.ndarray | None   # float32 [n]
    dense: np.ndarray            # float32 [B, num_dense]
    labels: np.ndarray           # float32 [B]

    def table_slice(self, t: int, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
        """(offsets of table t's B bags, B+1 absolute entries; the whole indices array)."""
        return self.offsets[t * batch_size:(t + 1) * batch_size + 1], self.indices


@dataclass
class Trace:
    manifest: dict
    batches: list[TraceBatch]

    @property
    def batch_size(self) -> int:
        return self.manifest["batch_size"]

    @property
    def tables(self) -> list[dict]:
        return self.manifest["tables"]

    @property
    def modes(self) -> list[str]:
        return [t["mode"] for t in self.tables]


# --------------------------------------------------------------------------------------------
# manifest
# --------------------------------------------------------------------------------------------
def make_manifest(preset: DlrmPreset | str, num_batches: int, seed: int, knobs: TraceKnobs | None = None) -> dict:
    """The manifest of a trace: the preset with the knobs applied."""
    preset = get_preset(preset) if isinstance(preset, str) else preset
    knobs = knobs or TraceKnobs()
    if num_batches < 1:
        raise ValueError(f"num_batches must be >= 1, got {num_batches}")
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an int >= 0, got {seed!r}")
    tables = []
    for spec in preset.tables:
        pool = spec.pooling
        kind = knobs.pooling or pool.kind
        std = pool.std if pool.std or kind != "normal" else max(1.0, pool.mean / 4)
        tables.append({
            "rows": min(spec.rows, knobs.rows_cap) if knobs.rows_cap else spec.rows,
            "rows_uncapped": spec.rows,
            "dim": spec.dim,
            "mode": spec.mode,
            "pooling": {"kind": kind, "mean": pool.mean, "std": float(std),
                        "max_len": pool.max_len or 2 * pool.mean,
                        "empty_prob": float(pool.empty_prob if knobs.empty_prob is None else knobs.empty_prob)},
            "alpha": float(spec.alpha if knobs.alpha is None else knobs.alpha),
        })
    has_weights = knobs.weights if knobs.weights is not None else any(t["mode"] == "weighted_sum" for t in tables)
    return {
        "format": FORMAT, "version": VERSION, "preset": preset.name, "seed": seed,
        "batch_size": knobs.batch_size or preset.batch_size, "num_batches": num_batches,
        "num_dense": preset.num_dense, "has_weights": bool(has_weights), "checkpoint_every": 1,
        "optimizer": {"name": preset.optimizer.name, "lr": preset.optimizer.lr, "eps": preset.optimizer.eps},
        "bottom_mlp": list(preset.bottom_mlp), "top_mlp": list(preset.top_mlp),
        "tables": tables, "generator": dataclasses.asdict(knobs),
    }


def _fail(where: str, msg: str):
    raise TraceFormatError(f"{where}: {msg}")


def _req(d: dict, key: str, types, where: str):
    if not isinstance(d, dict) or key not in d:
        _fail(where, f"missing key {key!r}")
    value = d[key]
    allowed = types if isinstance(types, tuple) else (types,)
    # bool is an int in Python; a JSON true is not a count.
    if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
        _fail(where, f"{key!r} has type {type(value).__name__}")
    return value


def validate_manifest(m: dict) -> None:
    """Raise TraceFormatError unless ``m`` is a well-formed version-1 manifest."""
    w = MANIFEST
    if not isinstance(m, dict):
        _fail(w, "not a JSON object")
    if m.get("format") != FORMAT:
        _fail(w, f"format is {m.get('format')!r}, expected {FORMAT!r}")
    if m.get("version") != VERSION:
        _fail(w, f"unsupported version {m.get('version')!r} (this reader knows {VERSION})")
    for key in ("seed", "batch_size", "num_batches", "num_dense", "checkpoint_every"):
        if _req(m, key, int, w) < (0 if key == "seed" else 1):
            _fail(w, f"{key!r} = {m[key]} out of range")
    _req(m, "preset", str, w)
    _req(m, "has_weights", bool, w)
    opt = _req(m, "optimizer", dict, w)
    _req(opt, "name", str, w + " optimizer")
    _req(opt, "lr", (int, float), w + " optimizer")
    tables = _req(m, "tables", list, w)
    if not tables:
        _fail(w, "no tables")
    for t, tab in enumerate(tables):
        where = f"{w} table {t}"
        if _req(tab, "rows", int, where) < 1 or tab["rows"] >= 1 << 32:
            _fail(where, f"rows = {tab['rows']} out of range [1, 2**32)")
        dim = _req(tab, "dim", int, where)
        if dim < 16 or dim % 16:
            _fail(where, f"dim = {dim} is not a positive multiple of 16")
        if _req(tab, "mode", str, where) not in POOLING_MODES:
            _fail(where, f"mode {tab['mode']!r} not in {POOLING_MODES}")
        pooling = _req(tab, "pooling", dict, where)
        if _req(pooling, "kind", str, where) not in LENGTH_KINDS:
            _fail(where, f"pooling kind {pooling['kind']!r} not in {LENGTH_KINDS}")
        if tab["mode"] == "weighted_sum" and not m["has_weights"]:
            _fail(where, "mode weighted_sum but the trace has no weights")
        alpha = tab.get("alpha", 0.0)
        if not (isinstance(alpha, (int, float)) and not isinstance(alpha, bool) and alpha >= 0) and \
                not (alpha is None and "origin" in m):
            _fail(where, f"alpha = {alpha!r} is not a number >= 0 (null only in an imported trace)")
    if "origin" in m:
        validate_origin(m["origin"])


ORIGIN_FORMATS = ("criteo-tsv", "fbgemm-pt")


def validate_origin(org) -> None:
    """Raise TraceFormatError unless ``org`` is a well-formed ``origin`` object."""
    w = MANIFEST + " origin"
    if not isinstance(org, dict):
        _fail(w, "not a JSON object")
    if _req(org, "format", str, w) not in ORIGIN_FORMATS:
        _fail(w, f"format {org['format']!r} not in {ORIGIN_FORMATS}")
    _req(org, "file", str, w)
    sha = _req(org, "sha256", str, w)
    if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        _fail(w, f"sha256 {sha!r} is not 64 lower-case hex digits")
    if _req(org, "bytes", int, w) < 0:
        _fail(w, "bytes < 0")
    _req(org, "options", dict, w)
    if not all(isinstance(g, str) and g in ARRAYS for g in _req(org, "generated", list, w)):
        _fail(w, f"generated {org['generated']!r} names something other than {ARRAYS}")


# --------------------------------------------------------------------------------------------
# batch validation
# --------------------------------------------------------------------------------------------
def _check_array(where: str, arr, dtype, shape: tuple) -> None:
    if not isinstance(arr, np.ndarray):
        _fail(where, f"not an array ({type(arr).__name__})")
    if arr.dtype != dtype:
        _fail(where, f"dtype {arr.dtype}, expected {np.dtype(dtype)}")
    if arr.shape != shape:
        _fail(where, f"shape {arr.shape}, expected {shape}")


def validate_batch(manifest: dict, k: int, batch: TraceBatch) -> None:
    """Raise TraceFormatError unless batch ``k`` matches the manifest."""
    B, tables = manifest["batch_size"], manifest["tables"]
    T = len(tables)
    pre = f"batch {k} "
    if not isinstance(batch.indices, np.ndarray):
        _fail(pre + "indices", "not an array")
    n = batch.indices.shape[0] if batch.indices.ndim == 1 else -1
    _check_array(pre + "offsets", batch.offsets, np.uint32, (T * B + 1,))
    _check_array(pre + "indices", batch.indices, np.uint32, (max(n, 0),))
    offs = batch.offsets.astype(np.int64)
    if offs[0] != 0:
        _fail(pre + "offsets", f"offsets[0] = {offs[0]}, expected 0")
    steps = np.diff(offs)
    if np.any(steps < 0):
        bag = int(np.nonzero(steps < 0)[0][0])
        _fail(pre + "offsets", f"offsets decrease at bag {bag} (table {bag // B}, sample {bag % B}): "
                               f"{offs[bag]} -> {offs[bag + 1]}")
    if offs[-1] != n:
        _fail(pre + "offsets", f"offsets[-1] = {offs[-1]} but there are {n} indices")
    for t, tab in enumerate(tables):
        idx = batch.indices[offs[t * B]:offs[(t + 1) * B]]
        if idx.size and int(idx.max()) >= tab["rows"]:
            pos = int(np.argmax(idx >= tab["rows"])) + int(offs[t * B])
            _fail(pre + "indices", f"index {batch.indices[pos]} at position {pos} >= rows {tab['rows']} of table {t}")
    if manifest["has_weights"]:
        if batch.weights is None:
            _fail(pre + "weights", "missing (the manifest says has_weights)")
        _check_array(pre + "weights", batch.weights, np.float32, (n,))
    elif batch.weights is not None:
        _fail(pre + "weights", "present but the manifest says no weights")
    _check_array(pre + "dense", batch.dense, np.float32, (B, manifest["num_dense"]))
    _check_array(pre + "labels", batch.labels, np.float32, (B,))
    if not np.all((batch.labels == 0) | (batch.labels == 1)):
        _fail(pre + "labels", "labels must be 0.0 or 1.0")


# --------------------------------------------------------------------------------------------
# generator
# --------------------------------------------------------------------------------------------
class _RankSampler:
    """Bounded Zipf ranks in [0, rows): P(r) ~ (r+1)^-alpha, by inverse CDF (cached per table)."""

    def __init__(self, rows: int, alpha: float):
        self.rows = rows
        self.cdf = None
        if alpha > 0:
            weights = np.arange(1, rows + 1, dtype=np.float64) ** -alpha
            cdf = np.cumsum(weights)
            self.cdf = cdf / cdf[-1]

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.cdf is None:
            return rng.integers(0, self.rows, n, dtype=np.int64)
        ranks = np.searchsorted(self.cdf, rng.random(n), side="right")
        return np.minimum(ranks, self.rows - 1)


def _bag_lengths(rng: np.random.Generator, pooling: dict, B: int, rows: int, duplicates: bool) -> np.ndarray:
    kind, mean = pooling["kind"], pooling["mean"]
    if kind == "fixed" or mean == 0:
        lengths = np.full(B, mean, dtype=np.int64)
    elif kind == "uniform":
        lengths = rng.integers(1, mean + 1, B, dtype=np.int64)
    else:
        lengths = np.clip(np.rint(rng.normal(mean, pooling["std"], B)), 1, pooling["max_len"]).astype(np.int64)
    lengths[rng.random(B) < pooling["empty_prob"]] = 0
    return lengths if duplicates else np.minimum(lengths, rows)


def _in_bag_duplicates(bag_of: np.ndarray, idx: np.ndarray, rows: int) -> np.ndarray:
    """Mask of the positions whose row already occurred earlier in the same bag."""
    key = bag_of * rows + idx
    _, first = np.unique(key, return_index=True)
    dup = np.ones(idx.size, dtype=bool)
    dup[first] = False
    return dup


def _dedup(rng, sampler: _RankSampler, perm: np.ndarray, bag_of: np.ndarray, idx: np.ndarray) -> np.ndarray:
    rows = perm.size
    for _ in range(_DEDUP_ROUNDS):
        dup = _in_bag_duplicates(bag_of, idx, rows)
        if not dup.any():
            return idx
        idx[dup] = perm[sampler.draw(rng, int(dup.sum()))]
    # Very skewed small tables: finish each remaining bag with rows it does not use yet.
    dup = _in_bag_duplicates(bag_of, idx, rows)
    for bag in np.unique(bag_of[dup]):
        where = np.nonzero(bag_of == bag)[0]
        bad = where[dup[where]]
        free = np.setdiff1d(np.arange(rows), idx[where[~dup[where]]])
        idx[bad] = rng.choice(free, bad.size, replace=False)
    return idx


def stream_trace(preset: DlrmPreset | str, num_batches: int, seed: int,
                 knobs: TraceKnobs | None = None) -> tuple[dict, Iterator[TraceBatch]]:
    """(manifest, lazy iterator over the batches): constant memory for large traces."""
    manifest = make_manifest(preset, num_batches, seed, knobs)
    knobs = knobs or TraceKnobs()
    return manifest, _batches(manifest, knobs)


def _batches(m: dict, knobs: TraceKnobs) -> Iterator[TraceBatch]:
    seed, B, tables = m["seed"], m["batch_size"], m["tables"]
    perms = [np.random.default_rng([seed, 0, t]).permutation(tab["rows"]) for t, tab in enumerate(tables)]
    samplers = [_RankSampler(tab["rows"], tab["alpha"]) for tab in tables]
    previous: list[np.ndarray | None] = [None] * len(tables)
    for k in range(m["num_batches"]):
        rng = np.random.default_rng([seed, 1, k])
        lengths_all, indices_all = [], []
        for t, tab in enumerate(tables):
            lengths = _bag_lengths(rng, tab["pooling"], B, tab["rows"], knobs.duplicates)
            n = int(lengths.sum())
            idx = perms[t][samplers[t].draw(rng, n)]
            prev = previous[t]
            if knobs.reuse > 0 and prev is not None and prev.size:
                reuse = rng.random(n) < knobs.reuse
                idx[reuse] = prev[rng.integers(0, prev.size, int(reuse.sum()))]
            if not knobs.duplicates:
                idx = _dedup(rng, samplers[t], perms[t], np.repeat(np.arange(B), lengths), idx)
            previous[t] = idx
            lengths_all.append(lengths)
            indices_all.append(idx)
        lengths = np.concatenate(lengths_all)
        indices = np.concatenate(indices_all).astype(np.uint32)
        offsets = np.r_[0, np.cumsum(lengths)].astype(np.uint32)
        weights = rng.random(indices.size, dtype=np.float32) if m["has_weights"] else None
        dense = np.log1p(rng.exponential(1.0, (B, m["num_dense"]))).astype(np.float32)
        labels = (rng.random(B) < CLICK_RATE).astype(np.float32)
        if knobs.labels == "learnable":     # P(Exp(1) > ln 2) = 1/2 per feature: CLICK_RATE in all
            labels = (dense[:, :2] > np.log1p(np.log(2.0))).all(axis=1).astype(np.float32)
        yield TraceBatch(offsets, indices, weights, dense, labels)


def generate_trace(preset: DlrmPreset | str, num_batches: int, seed: int, knobs: TraceKnobs | None = None) -> Trace:
    """The whole trace in memory."""
    manifest, batches = stream_trace(preset, num_batches, seed, knobs)
    return Trace(manifest, list(batches))


# --------------------------------------------------------------------------------------------
# file I/O
# --------------------------------------------------------------------------------------------
def _member(k: int, name: str) -> str:
    return f"b{k:06d}_{name}.npy"


def _write_member(zf: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=_ZIP_DATE)
    info.compress_type = zipfile.ZIP_STORED
    info.external_attr = 0o644 << 16
    zf.writestr(info, data)


def write_trace(path, trace: Trace | tuple[dict, Iterable[TraceBatch]]) -> pathlib.Path:
    """Validate and write a trace (a Trace, or (manifest, batch iterable) from stream_trace)."""
    manifest, batches = (trace.manifest, trace.batches) if isinstance(trace, Trace) else trace
    validate_manifest(manifest)
    path = pathlib.Path(path)
    tmp = path.with_name(path.name + ".partial")
    count = 0
    try:
        with zipfile.ZipFile(tmp, "w", allowZip64=True) as zf:
            _write_member(zf, MANIFEST, json.dumps(manifest, sort_keys=True, indent=1).encode())
            for k, batch in enumerate(batches):
                validate_batch(manifest, k, batch)
                for name in ARRAYS:
                    arr = getattr(batch, name)
                    if arr is None:
                        continue
                    buf = io.BytesIO()
                    np.lib.format.write_array(buf, np.ascontiguousarray(arr), allow_pickle=False)
                    _write_member(zf, _member(k, name), buf.getvalue())
                count += 1
        if count != manifest["num_batches"]:
            _fail(str(path), f"{count} batches written but the manifest says {manifest['num_batches']}")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_trace(path) -> Trace:
    """Read and fully validate a trace file."""
    path = pathlib.Path(path)
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise TraceFormatError(f"{path}: not a trace file ({e})") from None
    with zf:
        names = zf.namelist()
        if MANIFEST not in names:
            _fail(str(path), f"no {MANIFEST} member")
        try:
            manifest = json.loads(zf.read(MANIFEST).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise TraceFormatError(f"{path}: {MANIFEST} is not valid JSON ({e})") from None
        validate_manifest(manifest)
        expected = {MANIFEST}
        for k in range(manifest["num_batches"]):
            expected |= {_member(k, a) for a in ARRAYS if a != "weights" or manifest["has_weights"]}
        missing, extra = sorted(expected - set(names)), sorted(set(names) - expected)
        if missing:
            _fail(str(path), f"missing member(s) {', '.join(missing[:5])}")
        if extra:
            _fail(str(path), f"unexpected member(s) {', '.join(extra[:5])}")

        def load(name: str) -> np.ndarray:
            try:
                with zf.open(name) as f:
                    return np.lib.format.read_array(io.BytesIO(f.read()), allow_pickle=False)
            except ValueError as e:
                raise TraceFormatError(f"{path}: member {name} is not a valid .npy array ({e})") from None

        batches = []
        for k in range(manifest["num_batches"]):
            arrays = {a: load(_member(k, a)) if a != "weights" or manifest["has_weights"] else None for a in ARRAYS}
            batch = TraceBatch(**arrays)
            validate_batch(manifest, k, batch)
            batches.append(batch)
    return Trace(manifest, batches)


def summarize(trace: Trace) -> dict:
    """Counts a human wants to see: lookups, unique rows, empty bags, per-batch unique share."""
    B, T = trace.batch_size, len(trace.tables)
    lookups = sum(int(b.indices.size) for b in trace.batches)
    unique_total, unique_per_batch, empty = 0, 0, 0
    seen = [set() for _ in range(T)]
    for batch in trace.batches:
        offs = batch.offsets.astype(np.int64)
        empty += int(np.sum(np.diff(offs) == 0))
        for t in range(T):
            rows = np.unique(batch.indices[offs[t * B]:offs[(t + 1) * B]])
            unique_per_batch += rows.size
            seen[t].update(rows.tolist())
    unique_total = sum(len(s) for s in seen)
    return {"tables": T, "batch_size": B, "batches": len(trace.batches), "lookups": lookups,
            "unique_rows": unique_total, "unique_share_per_batch": unique_per_batch / lookups if lookups else 0.0,
            "empty_bags": empty}
