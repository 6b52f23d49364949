"""The evaluation's sensitivity tables: the paper's three headline ratios against the MLP-log
interval and against the batch size, composed from measured runs (no simulation here).

Ratios (batch time of the first configuration over the second, per model and their
geometric mean): ``cxl_over_pmem`` (the paper: 5.2x), ``cxl_d_over_pcie`` (1.23) and
``cxl_over_cxl_b`` (1.14).

- ``interval_rows(runs, models, intervals)``: one row per MLP-log interval K (a whole MLP
  image logged every K batches by every configuration, the same recovery point for all;
  sim/model/system_timing.py ``compose(mlp_interval=K)``), plus a first row with each
  configuration's own policy (the paper's: every batch for PMEM..CXL-B, CXL over up to
  MAX_MLP_LAG batches).
- ``batch_rows(runs_by_batch, models)``: one row per simulated batch size (``eval
  --sweep-batch-sizes``), each configuration with its own policy and at K = 1.

A row is ``{"mlp_interval" | "batch_size": ..., ratio: {model: x, "geomean": g}}``; a ratio
whose runs are missing (a configuration not evaluated) is left out.
"""
from __future__ import annotations

import math

RATIOS = {"cxl_over_pmem": ("pmem", "cxl"), "cxl_d_over_pcie": ("pcie", "cxl-d"),
          "cxl_over_cxl_b": ("cxl-b", "cxl")}
PAPER_RATIOS = {"cxl_over_pmem": 5.2, "cxl_d_over_pcie": 1.23, "cxl_over_cxl_b": 1.14}
DEFAULT_INTERVALS = (1, 8, 64, 1024)
OWN_POLICY = "own"                   # the mlp_interval label of each configuration's own policy


def compose_run(runs: dict, model: str, config: str, mlp_interval: int | None, params=None,
                batch: int | None = None):
    """``BatchResult`` of ``config`` from one model's runs ({order: training_eval result}):
    the steady-state mean (``batch`` None) or one batch alone, composed with ``params``
    (sim/model/system_params.py; None: the defaults); None when the order did not run."""
    from sim.model.system_params import DEFAULT_PARAMS
    from sim.model.system_timing import compose
    from tools.eval_cmd import measured_of
    order = "relaxed" if config == "cxl" else "exact"
    if not (runs.get(order) or {}).get("commands"):
        return None
    params = params or DEFAULT_PARAMS
    m, w = measured_of(runs.get("exact"), runs.get("relaxed"), order, batch=batch)
    return compose(config, w, m, gpu_mlp_timing(model, w.batch_size, m.clock_mhz, params), params,
                   mlp_interval=mlp_interval)


def gpu_mlp_timing(model: str, batch_size: int, clock_mhz: float, params):
    """The GPU's MLP timing under ``params`` (its peak FLOP/s and achieved fraction)."""
    from sim.bfm.gpu_agent import mlp_timing
    return mlp_timing(model, batch_size, clock_mhz, params.gpu_efficiency, params.gpu_peak_flops)


def batch_times(runs: dict, model: str, mlp_interval: int | None, params=None) -> dict:
    """{config: steady-state batch time (ms)} of one model's runs."""
    from sim.model.system_timing import CONFIGS
    results = {config: compose_run(runs, model, config, mlp_interval, params) for config in CONFIGS}
    return {config: r.batch_time_ms for config, r in results.items() if r is not None}


def ratio_row(runs: dict, models: list[str], mlp_interval: int | None, params=None) -> dict:
    """{ratio: {model: x, "geomean": g}} for the RATIOS whose configurations were run."""
    times = {model: batch_times(runs[model], model, mlp_interval, params) for model in models}
    row = {}
    for name, (slow, fast) in RATIOS.items():
        per = {model: t[slow] / t[fast] for model, t in times.items() if slow in t and fast in t}
        if per:
            per["geomean"] = math.exp(sum(math.log(v) for v in per.values()) / len(per))
            row[name] = per
    return row


def interval_rows(runs: dict, models: list[str], intervals=DEFAULT_INTERVALS) -> list[dict]:
    return [{"mlp_interval": OWN_POLICY if k is None else k, **ratio_row(runs, models, k)}
            for k in (None, *intervals)]


def batch_rows(runs_by_batch: dict, models: list[str]) -> list[dict]:
    rows = []
    for batch_size in sorted(runs_by_batch, key=int):
        runs = runs_by_batch[batch_size]
        for k in (None, 1):
            rows.append({"batch_size": int(batch_size), "mlp_interval": OWN_POLICY if k is None else k,
                         **ratio_row(runs, [m for m in models if m in runs], k)})
    return rows


def sensitivity(runs: dict, models: list[str], runs_by_batch: dict | None = None) -> dict:
    """The ``sensitivity`` object of the eval JSON."""
    out = {"paper": PAPER_RATIOS, "ratios": {k: f"{a} / {b} batch time" for k, (a, b) in RATIOS.items()},
           "mlp_interval": interval_rows(runs, models)}
    if runs_by_batch:
        out["batch_size"] = batch_rows(runs_by_batch, models)
    return out


def text_rows(sens: dict) -> list[str]:
    """Markdown table lines: geomean ratios per row, the paper's figures in the header."""
    head = ["setting"] + [f"{k} (paper {PAPER_RATIOS[k]})" for k in RATIOS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    def every(k):
        return "MLP log every batch" if k == 1 else f"MLP log every {k} batches"
    rows = [(every(r["mlp_interval"]) if r["mlp_interval"] != OWN_POLICY
             else "each configuration's own MLP-log policy", r) for r in sens.get("mlp_interval", [])]
    rows += [(f"batch {r['batch_size']}, " + ("own policy" if r["mlp_interval"] == OWN_POLICY
                                               else every(r["mlp_interval"])), r)
             for r in sens.get("batch_size", [])]
    for label, r in rows:
        cells = [f"{r[k]['geomean']:.2f}x" if k in r else "-" for k in RATIOS]
        lines.append("| " + " | ".join([label] + cells) + " |")
    return lines
