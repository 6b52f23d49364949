"""What drives near-memory embedding performance, measured on a trace (``trace_stats(trace)``).

Per table, and for all tables together (``total``):
- ``lookups_per_batch``: index occurrences per batch (mean over batches);
- ``rows_touched_per_batch``: distinct rows per batch (mean) -- the lines LOOKUP reads and
  UPDATE writes once per row;
- ``repeat_in_bag``: share of lookups whose row already occurred earlier in the same bag;
- ``repeat_in_batch``: share of lookups whose row already occurred earlier in the batch
  (1 - rows touched / lookups; includes the in-bag repeats);
- ``reuse_prev_batch``: share of the rows a batch touches that the previous batch touched too
  (|U_k & U_k-1| / |U_k|, mean over batches 1..N-1; null with one batch). TrainingCXL's
  relaxed lookup counts on about 80 % (ScratchPipe);
- ``empty_bags``: share of bags with no index;
- ``zipf_alpha``: the exponent of a bounded Zipf law P(r) ~ r^-alpha over the table's rows,
  fitted by maximum likelihood to the rank-frequency of the rows over the whole trace (rank 1
  = the most used row; rows never used count as the lowest ranks). A uniform table fits near
  0 only when lookups far outnumber rows (ranking by observed counts biases small samples
  upwards); ``lookups`` says how much data the fit had. ``alpha_claimed`` is the manifest's
  alpha (null for an imported trace).
``total`` sums counts over tables; its ``zipf_alpha`` is the lookup-weighted mean of the
tables' fits. The result is plain JSON (floats rounded to 4 digits).

``row_cache`` (one entry per size in ``cache_kib``, default ROW_CACHE_KIB): what an on-chip
row cache of that many KiB in the device would serve (issue 15's hot-row cache, sized before
it is built). ``row_cache_hits``: one LRU cache of whole rows shared by all tables, holding
``kib * 16`` 64-byte lines, persisting across batches; LOOKUP's occurrences in command order
(batch by batch, table by table, bag by bag); a miss reads the row from the media and inserts
it, evicting least recently used rows until it fits (a row larger than the cache is never
kept). Figures: ``hit_rate`` (occurrences served on chip), ``media_lines`` (the missed rows'
lines: what LOOKUP's physical bound would count with the cache) and ``media_line_share``
(media_lines over all occurrences' lines).
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from hw.common.cxl_mem import LINE_BYTES
from hw.ndp.command import FLOATS_PER_LINE
from sim.model.trace import Trace

ALPHA_MAX = 4.0
ROW_CACHE_KIB = (256, 1024, 4096)     # 0.25 / 1 / 4 MiB: ~7 / 28 / 114 UltraRAMs of 36 KiB


def fit_zipf(counts: np.ndarray, rows: int) -> float:
    """Maximum-likelihood Zipf exponent of occurrence ``counts`` (any order) over ``rows`` ranks."""
    c = np.sort(np.asarray(counts, dtype=np.float64)[np.asarray(counts) > 0])[::-1]
    n = c.sum()
    if n == 0 or rows < 2:
        return 0.0
    log_r = np.log(np.arange(1, c.size + 1, dtype=np.float64))
    s = float(np.dot(c, log_r))
    log_all = np.log(np.arange(1, rows + 1, dtype=np.float64))

    def nll(a: float) -> float:       # -log L / n up to a constant
        m = -a * log_all
        top = m.max()
        return a * s / n + top + float(np.log(np.exp(m - top).sum()))

    lo, hi = 0.0, ALPHA_MAX           # golden-section search; nll is convex in a
    g = (np.sqrt(5) - 1) / 2
    x1, x2 = hi - g * (hi - lo), lo + g * (hi - lo)
    f1, f2 = nll(x1), nll(x2)
    for _ in range(60):
        if f1 < f2:
            hi, x2, f2 = x2, x1, f1
            x1 = hi - g * (hi - lo)
            f1 = nll(x1)
        else:
            lo, x1, f1 = x1, x2, f2
            x2 = lo + g * (hi - lo)
            f2 = nll(x2)
    return (lo + hi) / 2


def _table_batch(batch, t: int, B: int):
    offs = batch.offsets.astype(np.int64)
    lo, hi = offs[t * B], offs[(t + 1) * B]
    return batch.indices[lo:hi].astype(np.int64), np.diff(offs[t * B:(t + 1) * B + 1])


def row_cache_hits(trace: Trace, capacity_lines: int) -> dict:
    """LOOKUP's occurrences through an LRU cache of whole rows (the module docstring)."""
    B = trace.batch_size
    row_lines = [tab["dim"] // FLOATS_PER_LINE for tab in trace.tables]
    cache: OrderedDict = OrderedDict()
    held = occurrences = hits = lines = media_lines = 0
    for batch in trace.batches:
        for t, per_row in enumerate(row_lines):
            idx, _ = _table_batch(batch, t, B)
            occurrences += idx.size
            lines += idx.size * per_row
            for row in idx.tolist():
                key = (t, row)
                if key in cache:
                    cache.move_to_end(key)
                    hits += 1
                    continue
                media_lines += per_row
                if per_row > capacity_lines:
                    continue
                while held + per_row > capacity_lines:
                    held -= cache.popitem(last=False)[1]
                cache[key] = per_row
                held += per_row
    return {"capacity_lines": capacity_lines, "occurrences": occurrences, "hits": hits,
            "hit_rate": round(hits / occurrences, 4) if occurrences else None, "lines": lines,
            "media_lines": media_lines, "media_line_share": round(media_lines / lines, 4) if lines else None}


def trace_stats(trace: Trace, cache_kib=ROW_CACHE_KIB) -> dict:
    m, B = trace.manifest, trace.batch_size
    N = len(trace.batches)
    per_table = []
    sums = {"lookups": 0, "touched": 0, "in_bag": 0, "reused": 0, "touched_after_first": 0, "bags": 0, "empty": 0}
    alphas = []
    for t, tab in enumerate(trace.tables):
        counts = np.zeros(tab["rows"], dtype=np.int64)
        lookups = touched = in_bag = reused = touched_after_first = empty = 0
        prev = None
        for batch in trace.batches:
            idx, lengths = _table_batch(batch, t, B)
            np.add.at(counts, idx, 1)
            bag_of = np.repeat(np.arange(B), lengths)
            in_bag += idx.size - np.unique(bag_of * tab["rows"] + idx).size
            rows = np.unique(idx)
            lookups += idx.size
            touched += rows.size
            empty += int(np.sum(lengths == 0))
            if prev is not None:
                reused += np.intersect1d(rows, prev, assume_unique=True).size
                touched_after_first += rows.size
            prev = rows
        alpha = fit_zipf(counts, tab["rows"])
        alphas.append((alpha, lookups))
        per_table.append(_figures(lookups, touched, in_bag, reused, touched_after_first, B * N, empty, N) |
                         {"table": t, "rows": tab["rows"], "lookups": lookups, "zipf_alpha": round(alpha, 4),
                          "alpha_claimed": tab.get("alpha")})
        for key, v in (("lookups", lookups), ("touched", touched), ("in_bag", in_bag), ("reused", reused),
                       ("touched_after_first", touched_after_first), ("bags", B * N), ("empty", empty)):
            sums[key] += v
    weight = sum(n for _, n in alphas)
    total = _figures(sums["lookups"], sums["touched"], sums["in_bag"], sums["reused"], sums["touched_after_first"],
                     sums["bags"], sums["empty"], N) | {
        "lookups": sums["lookups"],
        "zipf_alpha": round(sum(a * n for a, n in alphas) / weight, 4) if weight else 0.0}
    org = m.get("origin")
    source = ({"origin": org["format"], "file": org["file"], "sha256": org["sha256"]} if org
              else {"preset": m["preset"], "seed": m["seed"]})
    row_cache = [{"kib": kib, **row_cache_hits(trace, kib * 1024 // LINE_BYTES)} for kib in cache_kib]
    return {"trace": source, "tables": len(trace.tables), "batch_size": B, "batches": N,
            "total": total, "per_table": per_table, "row_cache": row_cache}


def _figures(lookups, touched, in_bag, reused, touched_after_first, bags, empty, N) -> dict:
    def share(a, b):
        return round(a / b, 4) if b else None
    return {"lookups_per_batch": round(lookups / N, 4), "rows_touched_per_batch": round(touched / N, 4),
            "repeat_in_bag": share(in_bag, lookups), "repeat_in_batch": share(lookups - touched, lookups),
            "reuse_prev_batch": share(reused, touched_after_first), "empty_bags": share(empty, bags)}


COLUMNS = ("table", "rows", "lookups_per_batch", "rows_touched_per_batch", "repeat_in_bag", "repeat_in_batch",
           "reuse_prev_batch", "empty_bags", "zipf_alpha", "alpha_claimed")


def format_stats(stats: dict, max_rows: int = 40) -> str:
    """A human table: one line per table (the first ``max_rows``), then the total."""
    src = stats["trace"]
    title = (f"trace stats: {src['origin']} {src['file']} (sha256 {src['sha256'][:16]}...)" if "origin" in src
             else f"trace stats: preset {src['preset']} seed {src['seed']}")
    title += f", {stats['tables']} tables, batch {stats['batch_size']}, {stats['batches']} batches"
    widths = [max(len(c), 8) for c in COLUMNS]

    def cell(v, w):
        if v is None:
            v = "-"
        elif isinstance(v, float):
            v = f"{v:.4g}"
        return f"{v!s:>{w}}"
    lines = [title, "-" * len(title), "  ".join(f"{c:>{w}}" for c, w in zip(COLUMNS, widths))]
    for row in stats["per_table"][:max_rows]:
        lines.append("  ".join(cell(row.get(c), w) for c, w in zip(COLUMNS, widths)))
    if len(stats["per_table"]) > max_rows:
        lines.append(f"... {len(stats['per_table']) - max_rows} more tables in the JSON")
    lines.append("  ".join(cell(({"table": "total"} | stats["total"]).get(c), w) for c, w in zip(COLUMNS, widths)))
    for c in stats.get("row_cache", []):
        lines.append(f"LRU row cache {c['kib']} KiB: hit rate {c['hit_rate']}, media lines {c['media_lines']} of "
                     f"{c['lines']} ({c['media_line_share']})")
    return "\n".join(lines)
