"""The evaluation's statistics: every composed figure as min / median / max over the steady
batches of every seed (no simulation here).

A *sample* is one (seed, steady batch): that batch's measured command cycles and workload,
composed alone (``measured_of(..., batch=k)``) with the same parameters and MLP-log interval as
the headline. Ratios pair the two configurations' samples of the same (seed, batch), which
trained on the same trace batch. The headline ratios' geomean over the models is taken per
sample, then summarised.

- ``result_stats(runs_by_seed, model, configs, mlp_interval)`` -> {config: {figure: summary}}
  for ``batch_time_ms``, ``energy_mj``, ``speedup_vs_pmem`` and each breakdown key
  (``breakdown_ms.KEY``);
- ``ratio_stats(runs_by_seed, models, mlp_interval)`` -> {ratio: summary} for the RATIOS of
  tools/eval_sensitivity.py;
- a summary is ``{"min", "median", "max", "n"}``.
"""
from __future__ import annotations

import math
import statistics

from tools.eval_sensitivity import RATIOS, compose_run


def summary(values: list[float]) -> dict:
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "n": len(values)}


def _samples(runs: dict, model: str, config: str, mlp_interval: int | None) -> dict:
    """{steady batch: BatchResult} of one seed's runs of ``model`` under ``config``."""
    from tools.eval_cmd import steady_batches
    model_runs = runs.get(model) or {}
    run = model_runs.get("relaxed" if config == "cxl" else "exact") or {}
    if not run.get("commands"):
        return {}
    return {k: compose_run(model_runs, model, config, mlp_interval, batch=k) for k in steady_batches(run)}


def _all_samples(runs_by_seed: dict, model: str, config: str, mlp_interval: int | None) -> dict:
    """{(seed, batch): BatchResult} over every seed."""
    return {(seed, k): r for seed, runs in runs_by_seed.items()
            for k, r in _samples(runs, model, config, mlp_interval).items()}


def result_stats(runs_by_seed: dict, model: str, configs: list[str], mlp_interval: int | None) -> dict:
    samples = {c: _all_samples(runs_by_seed, model, c, mlp_interval) for c in configs}
    base = samples.get("pmem") or {}
    out = {}
    for c, s in samples.items():
        if not s:
            continue
        figs = {"batch_time_ms": summary([r.batch_time_ms for r in s.values()]),
                "energy_mj": summary([r.energy_mj for r in s.values()])}
        paired = [base[key].batch_time_ms / r.batch_time_ms for key, r in s.items() if key in base]
        if paired:
            figs["speedup_vs_pmem"] = summary(paired)
        for part in next(iter(s.values())).breakdown_ms:
            figs[f"breakdown_ms.{part}"] = summary([r.breakdown_ms[part] for r in s.values()])
        out[c] = figs
    return out


def ratio_stats(runs_by_seed: dict, models: list[str], mlp_interval: int | None) -> dict:
    out = {}
    for name, (slow, fast) in RATIOS.items():
        per_model = []
        for model in models:
            a = _all_samples(runs_by_seed, model, slow, mlp_interval)
            b = _all_samples(runs_by_seed, model, fast, mlp_interval)
            per_model.append({key: a[key].batch_time_ms / b[key].batch_time_ms for key in a if key in b})
        keys = set.intersection(*(set(p) for p in per_model)) if per_model else set()
        if keys:
            out[name] = summary([math.exp(sum(math.log(p[key]) for p in per_model) / len(per_model))
                                 for key in sorted(keys)])
    return out


def fmt(s: dict | None, digits: int = 2, suffix: str = "x") -> str:
    """``median [min, max]`` of a summary, for tables."""
    if not s:
        return "-"
    return f"{s['median']:.{digits}f}{suffix} [{s['min']:.{digits}f}, {s['max']:.{digits}f}]"
