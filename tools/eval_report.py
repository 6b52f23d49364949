"""Report of a ``trainingcxl eval`` run: Markdown tables, a console table and Fig. 11-13 style PNGs.

API (the contract):

  write_report(result, out_dir) -> list[Path]
      Writes ``report.md``, ``fig11_speedup.png``, ``fig12_timeline_<model>.png`` (one per model;
      characters outside ``[A-Za-z0-9_.-]`` in the model name become ``_``) and ``fig13_energy.png``
      into ``out_dir`` (created if needed) and returns their paths in that order.
  text_table(result) -> str
      Fixed-width console table: model, config, batch ms, speedup vs PMEM, lookup / transfer / mlp /
      update / checkpoint-stall ms, energy mJ, verified; followed by one line per failed result.
  geomean(xs) -> float
      Geometric mean of positive numbers; ValueError on an empty input or a value <= 0 (or not finite).
  ordering_holds(result, model) -> bool
      True iff ``batch_time_ms`` is strictly decreasing in the order pmem, pcie, cxl-d, cxl-b, cxl
      for ``model``. False when any of the five is missing or has no finite batch time. Verification
      is not considered here; the report marks an ordering that rests on unverified results.

Input: the dict of the ``trainingcxl eval`` JSON file, ``{"results": [...], "meta": {...}}``. Each
result has ``model``, ``config``, ``batch_time_ms``, ``verified``, ``breakdown_ms`` (lookup, transfer,
mlp, update, checkpoint_stall), ``energy_mj``, ``energy_breakdown_mj`` (any component keys),
``speedup_vs_pmem``, ``timeline`` (``lane``, ``phase``, ``start_ms``, ``end_ms``), optionally ``error``.
Unknown keys are ignored. Any field except ``model`` and ``config`` may be missing or null (typical
for a failed result); the report shows "n/a" and the plots leave a labelled gap. A (model, config)
pair must occur at most once (ValueError otherwise).

Rules:
  * Speedups and ratios are recomputed from ``batch_time_ms`` (PMEM time / time); the result's
    ``speedup_vs_pmem`` is only used when the PMEM time is missing, and a disagreement of more than
    1% is listed under "Consistency checks".
  * Failed results (``verified`` not true) are never dropped from tables: they are listed at the top
    of report.md with their error, marked ``NO`` in tables and hatched / labelled in plots. They are
    excluded from the summary means and the "geomean" bars (the report says which models count).
  * Configurations in the order pmem, pcie, cxl-d, cxl-b, cxl, then any others (``meta.configs`` order,
    then first appearance). Models in ``meta.models`` order, then first appearance.
  * Output is deterministic: matplotlib's default style, the Agg backend, no PNG "Software" metadata.
"""
from __future__ import annotations

import math
import pathlib
import re
from collections.abc import Iterable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import NullFormatter, ScalarFormatter  # noqa: E402

CONFIG_ORDER = ("pmem", "pcie", "cxl-d", "cxl-b", "cxl")
CONFIG_LABELS = {"pmem": "PMEM", "pcie": "PCIe", "cxl-d": "CXL-D", "cxl-b": "CXL-B", "cxl": "CXL"}
BREAKDOWN_KEYS = ("lookup", "transfer", "mlp", "update", "checkpoint_stall")
LANES = ("host", "device", "gpu", "link")

FIGSIZE = (10, 5)
DPI = 120
_PNG_META = {"Software": None}

_FALLBACK_COLORS = ("tab:cyan", "#8c564b", "#e377c2", "#bcbd22", "#17becf", "#aec7e8", "#ffbb78",
                    "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5")
_CONFIG_COLORS = {"pmem": "#7f7f7f", "pcie": "#ff7f0e", "cxl-d": "#9ecae1", "cxl-b": "#4292c6",
                  "cxl": "#08519c"}
_PHASE_COLORS = {"lookup": "#1f77b4", "transfer": "#ff7f0e", "mlp": "#2ca02c", "update": "#d62728",
                 "log": "#9467bd", "mlp_log": "#8c564b", "sync": "#e377c2", "patch": "#bcbd22",
                 "checkpoint": "#7f7f7f", "checkpoint_stall": "#7f7f7f"}
_ENERGY_COLORS = {"pmem_media": "#1f77b4", "dram": "#ff7f0e", "host_cpu": "#d62728", "gpu": "#2ca02c",
                  "link": "#9467bd", "device_logic": "#8c564b", "static": "#7f7f7f"}

_REL_TOL = 0.01  # consistency checks: relative tolerance
_ABS_TOL = 1e-3  # and absolute tolerance (ms or mJ)


# ----------------------------------------------------------------------------- helpers
def geomean(xs: Iterable[float]) -> float:
    """Geometric mean of positive finite numbers (ValueError on empty input or a value <= 0)."""
    vals = [float(x) for x in xs]
    if not vals:
        raise ValueError("geomean of an empty sequence")
    for v in vals:
        if not math.isfinite(v) or v <= 0:
            raise ValueError(f"geomean needs positive finite values, got {v!r}")
    return math.exp(math.fsum(math.log(v) for v in vals) / len(vals))


def _num(x) -> float | None:
    """x as a finite float, else None (None, NaN, inf, strings, bools)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _pos(x) -> float | None:
    v = _num(x)
    return v if v is not None and v > 0 else None


def _ok(r: dict | None) -> bool:
    return bool(r) and r.get("verified") is True


def _index(result: dict) -> dict[tuple[str, str], dict]:
    idx: dict[tuple[str, str], dict] = {}
    for r in result.get("results") or []:
        key = (str(r.get("model")), str(r.get("config")))
        if key in idx:
            raise ValueError(f"duplicate result for model {key[0]!r} config {key[1]!r}")
        idx[key] = r
    return idx


def _ordered(first: Iterable[str], seen: Iterable[str]) -> list[str]:
    out: list[str] = []
    for x in list(first) + list(seen):
        if x not in out:
            out.append(x)
    return out


def _models(result: dict) -> list[str]:
    meta = result.get("meta") or {}
    return _ordered([str(m) for m in meta.get("models") or []],
                    [str(r.get("model")) for r in result.get("results") or []])


def _configs(result: dict) -> list[str]:
    """Configurations to show: the canonical five that are expected or present, then the others."""
    meta = result.get("meta") or {}
    named = [str(c) for c in meta.get("configs") or []] + [str(r.get("config")) for r in result.get("results") or []]
    known = [c for c in CONFIG_ORDER if c in named] if named else []
    return _ordered(known, [c for c in named if c not in CONFIG_ORDER])


def _label(config: str) -> str:
    return CONFIG_LABELS.get(config, config)


def _color(key: str, table: dict[str, str], extra: list[str]) -> str:
    if key in table:
        return table[key]
    return _FALLBACK_COLORS[extra.index(key) % len(_FALLBACK_COLORS)] if key in extra else "#000000"


def _fmt(x, unit: str = "") -> str:
    v = _num(x)
    if v is None:
        return "n/a"
    a = abs(v)
    if a == 0:
        s = "0"
    elif a >= 1000:
        s = f"{v:.1f}"
    elif a >= 0.01:
        s = f"{v:.3f}"
    else:
        s = f"{v:.3g}"
    return s + unit


def _fmt_x(x) -> str:
    v = _num(x)
    return "n/a" if v is None else f"{v:.2f}x"


def _fmt_pct(x) -> str:
    v = _num(x)
    return "n/a" if v is None else f"{100 * v:.1f}%"


def _safe_name(model: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", model) or "_"


def _speedup(idx: dict, model: str, config: str) -> float | None:
    """PMEM batch time / this batch time; the result's own field when the PMEM time is unknown."""
    r = idx.get((model, config))
    if r is None:
        return None
    base = idx.get((model, "pmem"))
    t, tp = _pos(r.get("batch_time_ms")), _pos(base.get("batch_time_ms")) if base else None
    if t is not None and tp is not None:
        return tp / t
    return _pos(r.get("speedup_vs_pmem"))


def _why_invalid(idx: dict, model: str, config: str) -> str:
    """Short plot label for a speedup that does not rest on two verified results."""
    if not _ok(idx.get((model, config))):
        return "unverified"
    return "no PMEM run" if (model, "pmem") not in idx else "PMEM unverified"


def _speedup_valid(idx: dict, model: str, config: str) -> bool:
    return _ok(idx.get((model, config))) and _ok(idx.get((model, "pmem")))


def _energy_saving(idx: dict, model: str, config: str) -> float | None:
    r, base = idx.get((model, config)), idx.get((model, "pmem"))
    e = _num(r.get("energy_mj")) if r else None
    ep = _pos(base.get("energy_mj")) if base else None
    return None if e is None or ep is None else 1.0 - e / ep


def ordering_holds(result: dict, model: str) -> bool:
    """batch_time_ms strictly decreasing over pmem, pcie, cxl-d, cxl-b, cxl for ``model``."""
    idx = _index(result)
    times = []
    for c in CONFIG_ORDER:
        r = idx.get((model, c))
        t = _num(r.get("batch_time_ms")) if r else None
        if t is None:
            return False
        times.append(t)
    return all(a > b for a, b in zip(times, times[1:]))


def _failures(result: dict) -> list[dict]:
    return [r for r in result.get("results") or [] if not _ok(r)]


def _error_text(r: dict) -> str:
    err = r.get("error")
    if err:
        return str(err)
    if "verified" not in r:
        return "(no 'verified' key)"
    return f"(verified = {r.get('verified')!r}, no error message)"


# ----------------------------------------------------------------------------- summary
def _summary(result: dict) -> list[dict]:
    """The four headline figures: value, models counted, models excluded with reasons, paper value."""
    idx = _index(result)
    models = _models(result)
    paper = (result.get("meta") or {}).get("paper") or {}

    def pair_ratio(num_cfg: str, den_cfg: str, energy: bool = False, key: str = "batch_time_ms"):
        vals, used, excluded = [], [], []
        for m in models:
            a, b = idx.get((m, num_cfg)), idx.get((m, den_cfg))
            missing = [c for c, r in ((num_cfg, a), (den_cfg, b)) if r is None]
            failed = [c for c, r in ((num_cfg, a), (den_cfg, b)) if r is not None and not _ok(r)]
            key = "energy_mj" if energy else key
            if missing or failed:
                why = ", ".join([f"{c} missing" for c in missing] + [f"{c} not verified" for c in failed])
                excluded.append(f"{m} ({why})")
                continue
            x, y = _pos(_field(a, key)), _pos(_field(b, key))
            if x is None or y is None:
                excluded.append(f"{m} (no {key})")
                continue
            vals.append(x / y)
            used.append(m)
        return vals, used, excluded

    rows = []
    v, used, exc = pair_ratio("pmem", "cxl")
    rows.append({"name": "CXL speedup over PMEM (geomean of PMEM/CXL batch time)",
                 "value": _fmt_x(geomean(v)) if v else "n/a", "used": used, "excluded": exc,
                 "paper": _fmt_x(paper.get("speedup_cxl_over_pmem_avg"))})
    v, used, exc = pair_ratio("pcie", "cxl-d")
    g = geomean(v) if v else None
    rows.append({"name": "CXL-D faster than PCIe (geomean of PCIe/CXL-D batch time)",
                 "value": "n/a" if g is None else f"{_fmt_x(g)} (by {100 * (g - 1):.1f}%)",
                 "used": used, "excluded": exc, "paper": _paper_ratio(paper.get("cxl_d_over_pcie"))})
    v, used, exc = pair_ratio("cxl-b", "cxl")
    g = geomean(v) if v else None
    rows.append({"name": "CXL faster than CXL-B (geomean of CXL-B/CXL batch time)",
                 "value": "n/a" if g is None else f"{_fmt_x(g)} (by {100 * (g - 1):.1f}%)",
                 "used": used, "excluded": exc, "paper": _paper_ratio(paper.get("cxl_over_cxl_b"))})
    v, used, exc = pair_ratio("cxl", "pmem", energy=True)
    rows.append({"name": "Energy saving of CXL vs PMEM (mean of 1 - E_CXL/E_PMEM)",
                 "value": _fmt_pct(math.fsum(1 - x for x in v) / len(v)) if v else "n/a",
                 "used": used, "excluded": exc, "paper": _fmt_pct(paper.get("energy_saving_vs_pmem"))})
    # The same ratios with each configuration's own MLP-log policy (``own_policy``, the paper's)
    # and without any MLP log (``batch_time_ms_without_mlp_log``), when the results have them.
    paper_of = {"pmem": paper.get("speedup_cxl_over_pmem_avg"), "pcie": paper.get("cxl_d_over_pcie"),
                "cxl-b": paper.get("cxl_over_cxl_b")}
    for key, what in (("own_policy.batch_time_ms", "each configuration's own MLP-log policy (the paper's)"),
                      ("batch_time_ms_without_mlp_log", "without the MLP log")):
        for num, den, name in (("pmem", "cxl", "CXL speedup over PMEM"), ("pcie", "cxl-d", "CXL-D over PCIe"),
                               ("cxl-b", "cxl", "CXL over CXL-B")):
            v, used, exc = pair_ratio(num, den, key=key)
            if v:
                rows.append({"name": f"{name}, {what} (geomean of {key})", "value": _fmt_x(geomean(v)),
                             "used": used, "excluded": exc,
                             "paper": _fmt_x(paper_of[num]) if key.startswith("own") else "n/a"})
    return rows


def _field(r: dict, key: str):
    """``r[key]``, or a nested field for a dotted key (``own_policy.batch_time_ms``)."""
    for part in key.split("."):
        r = r.get(part) if isinstance(r, dict) else None
    return r


def _paper_ratio(x) -> str:
    v = _num(x)
    return "n/a" if v is None else f"{v:.2f}x (by {100 * (v - 1):.0f}%)"


# ----------------------------------------------------------------------------- consistency checks
def _close(a: float, b: float) -> bool:
    return abs(a - b) <= max(_ABS_TOL, _REL_TOL * max(abs(a), abs(b)))


def _checks(result: dict) -> list[str]:
    """Factual mismatches between fields of the results (sums, speedups, timeline extent)."""
    idx = _index(result)
    out = []
    for (m, c), r in idx.items():
        tag = f"{m}/{c}"
        t = _num(r.get("batch_time_ms"))
        bd = r.get("breakdown_ms")
        if t is not None and isinstance(bd, dict) and bd:
            vals = [_num(v) for v in bd.values()]
            if all(v is not None for v in vals) and not _close(math.fsum(vals), t):
                out.append(f"{tag}: breakdown_ms sums to {_fmt(math.fsum(vals))} ms, batch_time_ms is {_fmt(t)} ms")
        e = _num(r.get("energy_mj"))
        ebd = r.get("energy_breakdown_mj")
        if e is not None and isinstance(ebd, dict) and ebd:
            vals = [_num(v) for v in ebd.values()]
            if all(v is not None for v in vals) and not _close(math.fsum(vals), e):
                out.append(f"{tag}: energy_breakdown_mj sums to {_fmt(math.fsum(vals))} mJ, "
                           f"energy_mj is {_fmt(e)} mJ")
        base = idx.get((m, "pmem"))
        tp = _pos(base.get("batch_time_ms")) if base else None
        given = _num(r.get("speedup_vs_pmem"))
        if given is not None and tp is not None and _pos(t) is not None:
            calc = tp / t
            if abs(calc - given) > _REL_TOL * abs(calc):
                out.append(f"{tag}: speedup_vs_pmem is {given:.3f}, batch times give {calc:.3f} "
                           "(report uses the latter)")
        tl = r.get("timeline")
        if isinstance(tl, list) and tl:
            ends = [_num(s.get("end_ms")) for s in tl if isinstance(s, dict)]
            starts = [_num(s.get("start_ms")) for s in tl if isinstance(s, dict)]
            bad = sum(1 for s in tl if not isinstance(s, dict) or _segment(s) is None)
            if bad:
                out.append(f"{tag}: {bad} timeline entries lack lane/phase/start_ms/end_ms or have end < start")
            ends = [x for x in ends if x is not None]
            starts = [x for x in starts if x is not None]
            if starts and min(starts) < -_ABS_TOL:
                out.append(f"{tag}: timeline starts at {_fmt(min(starts))} ms (< 0)")
            if t is not None and ends and max(ends) > t + max(_ABS_TOL, _REL_TOL * t):
                out.append(f"{tag}: timeline ends at {_fmt(max(ends))} ms, after batch_time_ms {_fmt(t)} ms")
            for lane, phase, a, b in _same_phase_overlaps(tl):
                out.append(f"{tag}: lane {lane} has overlapping '{phase}' intervals ({_fmt(a)}-{_fmt(b)} ms)")
    return out


def _segment(s: dict):
    lane, phase = s.get("lane"), s.get("phase")
    a, b = _num(s.get("start_ms")), _num(s.get("end_ms"))
    if lane is None or phase is None or a is None or b is None or b < a:
        return None
    return str(lane), str(phase), a, b


def _same_phase_overlaps(tl: list) -> list[tuple[str, str, float, float]]:
    by: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for s in tl:
        seg = _segment(s) if isinstance(s, dict) else None
        if seg:
            by.setdefault(seg[:2], []).append(seg[2:])
    out = []
    for (lane, phase), iv in sorted(by.items()):
        iv.sort()
        reach = iv[0][1]
        for a, b in iv[1:]:
            if a < reach - 1e-9:
                out.append((lane, phase, a, min(b, reach)))
                break
            reach = max(reach, b)
    return out


# ----------------------------------------------------------------------------- trace sources
def trace_sources_text(meta: dict) -> list[str]:
    """One line per model saying which trace ran: preset and seed, or the file's hash and origin."""
    out = []
    for model, src in sorted((meta.get("trace_sources") or {}).items()):
        if not isinstance(src, dict):
            continue
        if src.get("kind") == "file":
            made = src.get("generated_from")
            how = (f"generated from preset {made['preset']} seed {made['seed']}" if made else
                   f"imported {src.get('origin')} from {src.get('origin_file')} "
                   f"(input sha256 {str(src.get('origin_sha256'))[:16]}...)")
            out.append(f"{model}: file {pathlib.Path(str(src.get('file'))).name} "
                       f"(sha256 {str(src.get('sha256'))[:16]}...), {how}, {src.get('batches')} batches")
        else:
            out.append(f"{model}: generated from preset {src.get('preset')} seed {src.get('seed')}")
    return out


# ----------------------------------------------------------------------------- text table
def text_table(result: dict) -> str:
    """Fixed-width console table of every (model, config) result, failures listed underneath."""
    idx = _index(result)
    head = ["model", "config", "batch ms", "vs PMEM", "lookup", "transfer", "mlp", "update", "ckpt-stall",
            "energy mJ", "verified"]
    rows = []
    for m in _models(result):
        for c in _configs(result):
            r = idx.get((m, c))
            if r is None:
                continue
            bd = r.get("breakdown_ms") if isinstance(r.get("breakdown_ms"), dict) else {}
            rows.append([m, _label(c), _fmt(r.get("batch_time_ms")), _fmt_x(_speedup(idx, m, c))]
                        + [_fmt(bd.get(k)) for k in BREAKDOWN_KEYS]
                        + [_fmt(r.get("energy_mj")), "yes" if _ok(r) else "NO"])
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]
    left = {0, 1}

    def line(cells):
        return "  ".join(x.ljust(w) if i in left else x.rjust(w) for i, (x, w) in enumerate(zip(cells, widths)))

    out = [line(head), "  ".join("-" * w for w in widths)] + [line(r) for r in rows]
    out += [f"trace {t}" for t in trace_sources_text(result.get("meta") or {})]
    fails = _failures(result)
    if fails:
        out.append("")
        out.append(f"FAILED: {len(fails)} of {len(idx)} results not verified")
        for r in fails:
            err = " ".join(_error_text(r).split())
            out.append(f"  {r.get('model')}/{r.get('config')}: {err}")
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------- markdown
def _md_cell(x: str) -> str:
    return " ".join(str(x).split()).replace("|", "\\|")


def _md_table(head: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    out = ["| " + " | ".join(head) + " |",
           "|" + "|".join("---:" if i in right else "---" for i in range(len(head))) + "|"]
    out += ["| " + " | ".join(_md_cell(x) for x in r) + " |" for r in rows]
    return out


def _fence(text: str) -> list[str]:
    n = 3
    while "`" * n in text:
        n += 1
    return ["`" * n + "text"] + text.rstrip("\n").splitlines() + ["`" * n]


def _training(result: dict, models: list[str], idx: dict) -> list[str]:
    """The loss of every batch per model and order (main seed), with the trace's label kind."""
    setup = (result.get("meta") or {}).get("setup") or {}
    rows = []
    for m in models:
        exact = next((idx[(m, c)].get("loss") for c in ("cxl-d", "pmem", "pcie", "cxl-b") if (m, c) in idx), None)
        relaxed = (idx.get((m, "cxl")) or {}).get("loss")
        kind = (setup[m].get("labels") or "random") if setup.get(m) else "from the trace"   # older runs: random
        rows.append([m, kind,
                     ", ".join(f"{x:.4f}" for x in exact or []) or "-",
                     ", ".join(f"{x:.4f}" for x in relaxed or []) or "-"])
    if not any(r[2] != "-" or r[3] != "-" for r in rows):
        return []
    return ["## Training", "", "Loss of each batch (batch 0 first), exact order (PMEM, PCIe, CXL-D, CXL-B) and "
            "relaxed order (CXL). Labels `learnable` depend on the dense features (sim/model/trace.py), so "
            "the loss falls; `random` labels leave nothing to learn.", ""] + \
        _md_table(["model", "labels", "exact", "relaxed"], rows, set()) + [""]


def _markdown(result: dict, figs: dict[str, str]) -> str:
    idx = _index(result)
    meta = result.get("meta") or {}
    models, configs = _models(result), _configs(result)
    md = ["# TrainingCXL evaluation report", ""]

    md += ["## Run", ""]
    md += [f"- models: {', '.join(models) or 'n/a'}",
           f"- configs: {', '.join(_label(c) for c in configs) or 'n/a'}",
           f"- batches: {meta.get('batches', 'n/a')}",
           f"- seed: {meta.get('seed', 'n/a')}",
           f"- clock: {_fmt(meta.get('clock_mhz'), ' MHz')}",
           f"- durability: every configuration logs the whole MLP every {meta.get('mlp_interval', 'n/a')} "
           "batch(es) (the same recovery point for all); each configuration's own policy is in the Summary",
           f"- wall time: {_fmt(meta.get('wall_seconds'), ' s')}",
           f"- results: {len(idx)} ({len(idx) - len(_failures(result))} verified)"]
    md += [f"- trace {_md_cell(t)}" for t in trace_sources_text(meta)] + [""]

    fails = _failures(result)
    md += ["## Failures", ""]
    if fails:
        md += [f"**{len(fails)} of {len(idx)} results FAILED verification** (kept in every table, marked `NO`):", ""]
        for r in fails:
            md += [f"- **{_md_cell(r.get('model'))} / {_md_cell(_label(str(r.get('config'))))}**:", ""]
            md += ["  " + x if x else x for x in _fence(_error_text(r))] + [""]
    else:
        md += ["None: every result verified.", ""]
    missing = [(m, c) for m in models for c in configs if (m, c) not in idx]
    if missing:
        md += ["Missing results (no entry in the JSON): "
               + ", ".join(f"{m}/{_label(c)}" for m, c in missing) + ".", ""]

    md += ["## Results per model", ""]
    for m in models:
        extra = sorted({k for c in configs for k in ((idx.get((m, c)) or {}).get("breakdown_ms") or {})
                        if k not in BREAKDOWN_KEYS})
        head = (["config", "batch ms", "batch ms [min, max]", "speedup vs PMEM"]
                + [f"{k.replace('_', ' ')} ms" for k in BREAKDOWN_KEYS]
                + [f"{k} ms" for k in extra] + ["energy mJ", "energy saving vs PMEM", "verified"])
        rows = []
        for c in configs:
            r = idx.get((m, c))
            if r is None:
                rows.append([_label(c), "missing"] + [""] * (len(head) - 3) + ["NO (no result)"])
                continue
            bd = r.get("breakdown_ms") if isinstance(r.get("breakdown_ms"), dict) else {}
            sp = _speedup(idx, m, c)
            spread = (r.get("stats") or {}).get("batch_time_ms")
            rows.append([_label(c), _fmt(r.get("batch_time_ms")),
                         f"[{_fmt(spread['min'])}, {_fmt(spread['max'])}] (n={spread['n']})" if spread else "-",
                         _fmt_x(sp)]
                        + [_fmt(bd.get(k)) for k in BREAKDOWN_KEYS] + [_fmt(bd.get(k)) for k in extra]
                        + [_fmt(r.get("energy_mj")), _fmt_pct(_energy_saving(idx, m, c)),
                           "yes" if _ok(r) else "**NO**"])
        md += [f"### {m}", ""] + _md_table(head, rows, set(range(1, len(head) - 1))) + [""]
        holds = ordering_holds(result, m)
        chain = " > ".join(_label(c) for c in CONFIG_ORDER)
        line = f"Ordering {chain} (batch time): **{'holds' if holds else 'does NOT hold'}**"
        absent = [_label(c) for c in CONFIG_ORDER if _num((idx.get((m, c)) or {}).get("batch_time_ms")) is None]
        unver = [_label(c) for c in CONFIG_ORDER if (m, c) in idx and not _ok(idx[(m, c)])]
        if absent:
            line += f" (no batch time for {', '.join(absent)})"
        if unver:
            line += f" (includes unverified results: {', '.join(unver)})"
        md += [line + ".", ""]
        if m in figs:
            md += [f"![{m} timeline]({figs[m]})", ""]

    md += _training(result, models, idx)
    md += ["## Summary", "", "Over verified results only; each line says which models count.", ""]
    rows = []
    for s in _summary(result):
        counted = f"{len(s['used'])} of {len(models)}: {', '.join(s['used']) or '-'}"
        if s["excluded"]:
            counted += f"; excluded {'; '.join(s['excluded'])}"
        rows.append([s["name"], s["value"], s["paper"], counted])
    md += _md_table(["figure", "this run", "paper", "models"], rows, {1, 2}) + [""]
    stats = result.get("statistics") or {}
    if stats.get("ratios"):
        from tools.eval_sensitivity import PAPER_RATIOS, RATIOS
        from tools.eval_stats import fmt
        md += [f"**Spread** over {len(stats.get('seeds', []))} seed(s) x steady batches "
               f"{stats.get('steady_batches')} (each sample composed alone; MLP log every "
               f"{stats.get('mlp_interval')} batch(es)): median [min, max] of the geomean over the models.", ""]
        md += _md_table(["ratio", "median [min, max]", "samples", "paper"],
                        [[f"{name} ({a} / {b} batch time)", fmt(stats["ratios"].get(name)),
                          str((stats["ratios"].get(name) or {}).get("n", "-")), _fmt_x(PAPER_RATIOS[name])]
                         for name, (a, b) in RATIOS.items()], {1, 2, 3}) + [""]

    md += ["## Notes", ""]
    notes = meta.get("notes") or []
    md += [f"- {_md_cell(n)}" for n in notes] if notes else ["- (none)"]
    md += [""]

    md += ["## Consistency checks", ""]
    checks = _checks(result)
    md += [f"- {_md_cell(x)}" for x in checks] if checks else ["None found (sums, speedups, timeline extent)."]
    md += [""]

    sens = result.get("sensitivity")
    if sens:
        from tools.eval_sensitivity import text_rows
        md += ["## Sensitivity", "",
               "The paper's three ratios (geometric mean over the models; batch time of the first "
               "configuration over the second) when every configuration logs the whole MLP image every K "
               "batches (the same recovery point for all), next to each configuration's own policy (the "
               "paper's: every batch, CXL over up to 1024 batches), and per simulated batch size. The "
               "JSON's `sensitivity` has the per-model values.", ""]
        md += text_rows(sens) + [""]
        if "sensitivity" in figs:
            md += [f"![Sensitivity]({figs['sensitivity']})", ""]
    fair = result.get("fairness")
    if fair:
        from tools.eval_fairness import text_rows as fairness_rows
        md += ["## Fairness ablation", "",
               "The default composition makes six modelling choices the fair way (sim/model/system_params.py "
               "`Modelling`): the PMEM host on as many PMEM channels as the device, PCIe and CXL on the same PHY "
               "generation with one efficiency model, two-stage copies streamed, one host cache model for the "
               "lookup and the update, the GPU launch paid by every configuration, and the dense SGD step in the "
               "GPU's time. Each row below switches one of them back to the choice this evaluation made before "
               "(or all of them, last row) and gives the paper's three ratios (geomean over the models), with "
               "equal durability and with each configuration's own MLP-log policy. The JSON's `fairness` has "
               "the per-model values.", ""]
        md += fairness_rows(fair) + [""]
    assumed = result.get("assumptions")
    if assumed:
        from tools.eval_assumptions import text_rows as assumption_text
        md += ["## Assumptions", "",
               "How far the assumed constants move the figures (equal durability: the MLP logged "
               + ("every batch" if assumed["mlp_interval"] == 1 else f"every {assumed['mlp_interval']} batches")
               + "). First the GPU's achieved fraction of its FP32 peak (0.5 is "
               "an assumption, sim/bfm/gpu_agent.py), then each energy constant of sim/model/system_params.py "
               "`Energy` at half and twice its value, one at a time (the field's comment says whether it is a "
               "spec or an assumption). The JSON's `assumptions` has the per-model values.", ""]
        md += assumption_text(assumed) + [""]
    md += ["## Figures", "", f"![Fig. 11 speedup over PMEM]({figs['fig11']})", "",
           f"![Fig. 13 energy per batch normalised to PMEM]({figs['fig13']})", ""]
    md += [f"- [{m} timeline]({figs[m]})" for m in models if m in figs] + [""]
    return "\n".join(md)


# ----------------------------------------------------------------------------- plots
def _save(fig, path: pathlib.Path) -> None:
    fig.savefig(path, dpi=DPI, metadata=_PNG_META, bbox_inches="tight")
    plt.close(fig)


def _fig11(result: dict, path: pathlib.Path) -> None:
    idx = _index(result)
    models, configs = _models(result), _configs(result)
    extra = [c for c in configs if c not in _CONFIG_COLORS]
    groups = models + ["geomean"]
    vals: dict[tuple[str, str], tuple[float | None, bool]] = {}
    for m in models:
        for c in configs:
            vals[(m, c)] = (_speedup(idx, m, c), _speedup_valid(idx, m, c))
    for c in configs:
        ok = [vals[(m, c)][0] for m in models if vals[(m, c)][1] and vals[(m, c)][0] is not None]
        vals[("geomean", c)] = (geomean(ok) if ok else None, True)
    present = [v for v, _ in vals.values() if v is not None]
    log = bool(present) and max(present) / min(present) > 20

    fig, ax = plt.subplots(figsize=FIGSIZE)
    n = max(len(configs), 1)
    w = 0.8 / n
    top = max(present) if present else 1.0
    bottom = min(present + [1.0]) / 1.5 if log else 0.0
    for j, c in enumerate(configs):
        xs = [i - 0.4 + w * (j + 0.5) for i in range(len(groups))]
        for x, g in zip(xs, groups):
            v, valid = vals[(g, c)]
            if v is None:
                ax.text(x, bottom if log else 0, " n/a", rotation=90, ha="center", va="bottom", fontsize=7,
                        color="#b00000")
                continue
            ax.bar(x, v, w, color=_color(c, _CONFIG_COLORS, extra), edgecolor="#b00000" if not valid else "black",
                   linewidth=0.5, hatch=None if valid else "//", label=None)
            txt = f"{v:.2f}" if valid else f"{v:.2f} {_why_invalid(idx, g, c)}"
            ax.text(x, v * (1.05 if log else 1.0) + (0 if log else 0.01 * top), txt, rotation=90, ha="center",
                    va="bottom", fontsize=7, color="black" if valid else "#b00000")
    ax.set_xticks(range(len(groups)), groups)
    ax.axhline(1.0, color="black", linewidth=0.6, linestyle=":")
    ax.set_ylabel("speedup over PMEM (PMEM = 1.0)")
    if log:
        ax.set_yscale("log")
        ax.set_ylim(bottom, top * 4)
    else:
        ax.set_ylim(0, top * 1.3 if present else 2)
    handles = [Patch(facecolor=_color(c, _CONFIG_COLORS, extra), edgecolor="black", label=_label(c))
               for c in configs]
    if any(not valid for (g, _c), (v, valid) in vals.items() if v is not None):
        handles.append(Patch(facecolor="white", edgecolor="#b00000", hatch="//", label="not verified"))
    ax.legend(handles=handles, ncol=len(handles), loc="upper left", fontsize=8)
    ax.set_title("Training batch speedup over PMEM (geomean over verified results)")
    ax.grid(axis="y", linewidth=0.3)
    ax.set_axisbelow(True)
    _save(fig, path)


def _all_phases(result: dict) -> list[str]:
    found = set()
    for r in result.get("results") or []:
        for s in r.get("timeline") or []:
            seg = _segment(s) if isinstance(s, dict) else None
            if seg:
                found.add(seg[1])
    return sorted(p for p in found if p not in _PHASE_COLORS)


def _pack(segs: list[tuple[str, float, float]]) -> tuple[list[int], int]:
    """Greedy interval packing: a sub-row per segment so overlapping segments sit side by side."""
    order = sorted(range(len(segs)), key=lambda i: (segs[i][1], segs[i][2], segs[i][0]))
    ends: list[float] = []
    row = [0] * len(segs)
    for i in order:
        _p, a, b = segs[i]
        for k, e in enumerate(ends):
            if e <= a + 1e-12:
                row[i], ends[k] = k, b
                break
        else:
            row[i] = len(ends)
            ends.append(b)
    return row, max(len(ends), 1)


def _fig12(result: dict, model: str, path: pathlib.Path, extra_phases: list[str]) -> None:
    idx = _index(result)
    configs = [c for c in _configs(result)]
    n = max(len(configs), 1)
    fig, axes = plt.subplots(n, 1, figsize=(FIGSIZE[0], 1.0 + 1.35 * n), sharex=True, squeeze=False)
    axes = axes[:, 0]
    xmax = 0.0
    used_phases: list[str] = []
    for c in configs:
        r = idx.get((model, c)) or {}
        xmax = max([xmax, _num(r.get("batch_time_ms")) or 0.0]
                   + [seg[3] for s in r.get("timeline") or [] if isinstance(s, dict) and (seg := _segment(s))])
    xmax = xmax or 1.0
    for ax, c in zip(axes, configs):
        r = idx.get((model, c))
        segs = [seg for s in ((r or {}).get("timeline") or []) if isinstance(s, dict) and (seg := _segment(s))]
        lanes = list(LANES) + sorted({s[0] for s in segs} - set(LANES))
        status = "" if _ok(r) else ("  [missing]" if r is None else "  [NOT VERIFIED]")
        ax.set_ylabel(_label(c) + status, rotation=0, ha="right", va="center", fontsize=9,
                      color="black" if _ok(r) else "#b00000")
        ax.set_yticks(range(len(lanes)), lanes, fontsize=8)
        ax.set_ylim(len(lanes) - 0.5, -0.5)
        for li, lane in enumerate(lanes):
            ls = [(p, a, b) for (ln, p, a, b) in segs if ln == lane]
            rows, k = _pack(ls)
            h = 0.8 / k
            for (p, a, b), rw in zip(ls, rows):
                if p not in used_phases:
                    used_phases.append(p)
                y0 = li - 0.4 + rw * h
                ax.broken_barh([(a, b - a)], (y0, h), facecolors=_color(p, _PHASE_COLORS, extra_phases),
                               edgecolors="black", linewidth=0.3)
        t = _num((r or {}).get("batch_time_ms"))
        if t is not None:
            ax.axvline(t, color="#b00000" if not _ok(r) else "black", linewidth=1.0, linestyle="--")
            ax.text(t, -0.5, f" {_fmt(t)} ms", ha="left", va="bottom", fontsize=8)
        if not segs:
            msg = "no result" if r is None else "no timeline"
            if r is not None and not _ok(r):
                msg += ": " + " ".join(_error_text(r).split())[:100]
            ax.text(0.5, 0.5, msg, transform=ax.transAxes, ha="center", va="center", fontsize=8, color="#b00000")
        ax.grid(axis="x", linewidth=0.3)
        ax.set_axisbelow(True)
    axes[-1].set_xlim(0, xmax * 1.12)
    axes[-1].set_xlabel("time within one steady-state batch (ms)")
    order = [p for p in _PHASE_COLORS if p in used_phases] + sorted(p for p in used_phases if p not in _PHASE_COLORS)
    axes[0].set_title(f"{model}: one training batch per configuration", pad=30 if order else 6)
    if order:
        axes[0].legend(handles=[Patch(facecolor=_color(p, _PHASE_COLORS, extra_phases), edgecolor="black", label=p)
                                for p in order], loc="lower center", ncol=min(len(order), 8), fontsize=8,
                       bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.tight_layout()
    _save(fig, path)


def _fig13(result: dict, path: pathlib.Path) -> None:
    idx = _index(result)
    models, configs = _models(result), _configs(result)
    comps_seen: list[str] = []
    for r in result.get("results") or []:
        for k in (r.get("energy_breakdown_mj") or {}) if isinstance(r.get("energy_breakdown_mj"), dict) else {}:
            if k not in comps_seen:
                comps_seen.append(k)
    comps = [k for k in _ENERGY_COLORS if k in comps_seen] + sorted(k for k in comps_seen if k not in _ENERGY_COLORS)
    extra = [k for k in comps if k not in _ENERGY_COLORS] + ["total (no breakdown)"]

    fig, ax = plt.subplots(figsize=FIGSIZE)
    n = max(len(configs), 1)
    w = 0.8 / n
    ticks, labels, top, any_unver, any_total = [], [], 1.0, False, False
    for i, m in enumerate(models):
        base = idx.get((m, "pmem"))
        ep = _pos(base.get("energy_mj")) if base else None
        if ep is None:
            ax.text(i, 0.05, "no PMEM energy:\ncannot normalise", ha="center", va="bottom", fontsize=8,
                    color="#b00000")
        for j, c in enumerate(configs):
            x = i - 0.4 + w * (j + 0.5)
            ticks.append(x)
            labels.append(_label(c))
            r = idx.get((m, c))
            e = _num(r.get("energy_mj")) if r else None
            if ep is None:
                continue
            if r is None or e is None:
                ax.text(x, 0.02, " n/a", rotation=90, ha="center", va="bottom", fontsize=7, color="#b00000")
                continue
            valid = _ok(r) and _ok(base)
            any_unver |= not valid
            ebd = r.get("energy_breakdown_mj") if isinstance(r.get("energy_breakdown_mj"), dict) else {}
            parts = [(k, _num(ebd.get(k))) for k in comps if _num(ebd.get(k)) is not None]
            if not parts:
                parts = [("total (no breakdown)", e)]
                any_total = True
            y = 0.0
            for k, v in parts:
                ax.bar(x, v / ep, w, bottom=y, color=_color(k, _ENERGY_COLORS, extra), linewidth=0.3,
                       edgecolor="#b00000" if not valid else "black", hatch=None if valid else "//")
                y += v / ep
            top = max(top, y, e / ep)
            txt = f"{e / ep:.2f}" + ("" if valid else " unverified")
            ax.text(x, max(y, e / ep) + 0.01, txt, rotation=90, ha="center", va="bottom", fontsize=7,
                    color="black" if valid else "#b00000")
    ax.set_xticks(ticks, labels, rotation=90, fontsize=7)
    for i, m in enumerate(models):
        ax.text(i, -0.16, m, transform=ax.get_xaxis_transform(), ha="center", va="top", fontsize=10,
                fontweight="bold")
    ax.set_xlim(-0.6, max(len(models), 1) - 0.4)
    ax.set_ylim(0, top * 1.25)
    ax.axhline(1.0, color="black", linewidth=0.6, linestyle=":")
    ax.set_ylabel("energy per batch / PMEM energy per batch")
    handles = [Patch(facecolor=_color(k, _ENERGY_COLORS, extra), edgecolor="black", label=k) for k in comps]
    if any_total:
        handles.append(Patch(facecolor=_color("total (no breakdown)", _ENERGY_COLORS, extra), edgecolor="black",
                             label="total (no breakdown)"))
    if any_unver:
        handles.append(Patch(facecolor="white", edgecolor="#b00000", hatch="//", label="unverified"))
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    ax.set_title("Energy per training batch, normalised to PMEM, by component")
    ax.grid(axis="y", linewidth=0.3)
    ax.set_axisbelow(True)
    _save(fig, path)


def _fig_sensitivity(sens: dict, path: pathlib.Path) -> None:
    """Geomean ratios against the MLP-log interval K (left) and the batch size (right, own
    policies), the paper's figures as dotted lines."""
    from tools.eval_sensitivity import OWN_POLICY, PAPER_RATIOS, RATIOS
    by_k = [r for r in sens.get("mlp_interval", []) if r["mlp_interval"] != OWN_POLICY]
    by_b = [r for r in sens.get("batch_size", []) if r["mlp_interval"] == OWN_POLICY]
    panels = [("MLP log every K batches (all configurations)", "K", by_k, "mlp_interval")]
    if by_b:
        panels.append(("batch size (own MLP-log policies)", "batch size", by_b, "batch_size"))
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    for ax, (title, xlabel, rows, key) in zip(axes[0], panels):
        for i, name in enumerate(RATIOS):
            pts = [(r[key], r[name]["geomean"]) for r in rows if name in r]
            if not pts:
                continue
            color = f"C{i}"
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", color=color, label=name)
            ax.axhline(PAPER_RATIOS[name], color=color, linestyle=":", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(xlabel)
        ax.set_ylabel("ratio (geomean over models)")
        ax.set_title(title, fontsize=10)
        ax.grid(linewidth=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Sensitivity of the headline ratios (dotted: the paper's figures)")
    fig.tight_layout()
    _save(fig, path)


# ----------------------------------------------------------------------------- entry points
def write_report(result: dict, out_dir: pathlib.Path) -> list[pathlib.Path]:
    """Write report.md and the figures into out_dir; return the paths (report.md, fig11, fig12_*, fig13)."""
    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _index(result)  # duplicate check before anything is written
    models = _models(result)
    names: dict[str, str] = {"fig11": "fig11_speedup.png", "fig13": "fig13_energy.png"}
    used: set[str] = set()
    for m in models:
        name = f"fig12_timeline_{_safe_name(m)}.png"
        k = 2
        while name in used:
            name = f"fig12_timeline_{_safe_name(m)}_{k}.png"
            k += 1
        used.add(name)
        names[m] = name
    with plt.style.context("default"):
        _fig11(result, out_dir / names["fig11"])
        extra_phases = _all_phases(result)
        for m in models:
            _fig12(result, m, out_dir / names[m], extra_phases)
        _fig13(result, out_dir / names["fig13"])
        if result.get("sensitivity"):
            names["sensitivity"] = "fig_sensitivity.png"
            _fig_sensitivity(result["sensitivity"], out_dir / names["sensitivity"])
    report = out_dir / "report.md"
    report.write_text(_markdown(result, names), encoding="utf-8")
    return ([report, out_dir / names["fig11"]] + [out_dir / names[m] for m in models]
            + [out_dir / names["fig13"]] + ([out_dir / names["sensitivity"]] if "sensitivity" in names else []))


def main(argv: list[str] | None = None) -> int:
    """``python -m tools.eval_report RESULT.json OUT_DIR``: write the report, print the table."""
    import argparse
    import json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", type=pathlib.Path)
    ap.add_argument("out_dir", type=pathlib.Path)
    args = ap.parse_args(argv)
    result = json.loads(args.json.read_text(encoding="utf-8"))
    print(text_table(result), end="")
    for p in write_report(result, args.out_dir):
        print(p)
    return 0 if not _failures(result) else 1


if __name__ == "__main__":
    raise SystemExit(main())
