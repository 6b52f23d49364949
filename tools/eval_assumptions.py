"""How much the evaluation's assumed constants move its figures, composed from measured runs
(no simulation here).

Two sweeps, each at equal durability (every configuration logs the MLP every
``mlp_interval`` batches):

- ``gpu_efficiency``: the GPU's achieved fraction of its FP32 peak (sim/bfm/gpu_agent.py
  ``DEFAULT_EFFICIENCY`` = 0.5, an assumption) at GPU_EFFICIENCIES; each row holds the
  RATIOS of tools/eval_sensitivity.py (per model and their geomean).
- ``energy``: every field of sim/model/system_params.py ``Energy`` (specs and assumptions
  alike) at ENERGY_SCALES times its value, one field at a time; each row holds the energy
  saving of CXL against PMEM (per model, and the mean of 1 - E_CXL/E_PMEM as the report's
  summary takes it).
"""
from __future__ import annotations

import dataclasses
import math

from tools.eval_sensitivity import compose_run, ratio_row

GPU_EFFICIENCIES = (0.25, 0.5, 0.75)
ENERGY_SCALES = (0.5, 2.0)


def energy_saving(runs: dict, models: list[str], mlp_interval: int, params) -> dict:
    """{model: 1 - E_CXL / E_PMEM, "mean": their mean} over the models that ran both."""
    per = {}
    for model in models:
        pmem = compose_run(runs[model], model, "pmem", mlp_interval, params)
        cxl = compose_run(runs[model], model, "cxl", mlp_interval, params)
        if pmem is not None and cxl is not None and pmem.energy_mj > 0:
            per[model] = 1.0 - cxl.energy_mj / pmem.energy_mj
    if per:
        per["mean"] = math.fsum(per.values()) / len(per)
    return per


def assumption_rows(runs: dict, models: list[str], mlp_interval: int) -> dict:
    """The ``assumptions`` object of the eval JSON (see the module docstring)."""
    from sim.model.system_params import DEFAULT_PARAMS
    gpu = [{"gpu_efficiency": e, "default": e == DEFAULT_PARAMS.gpu_efficiency,
            **ratio_row(runs, models, mlp_interval, dataclasses.replace(DEFAULT_PARAMS, gpu_efficiency=e))}
           for e in GPU_EFFICIENCIES]
    energy = [{"field": "default", "scale": 1.0, "value": None,
               "energy_saving": energy_saving(runs, models, mlp_interval, DEFAULT_PARAMS)}]
    for f in dataclasses.fields(DEFAULT_PARAMS.energy):
        base = getattr(DEFAULT_PARAMS.energy, f.name)
        for scale in ENERGY_SCALES:
            params = dataclasses.replace(DEFAULT_PARAMS,
                                         energy=dataclasses.replace(DEFAULT_PARAMS.energy, **{f.name: base * scale}))
            energy.append({"field": f.name, "scale": scale, "value": base * scale,
                           "energy_saving": energy_saving(runs, models, mlp_interval, params)})
    return {"mlp_interval": mlp_interval, "gpu_efficiency": gpu, "energy": energy}


def text_rows(assumptions: dict) -> list[str]:
    """Markdown lines: the GPU-efficiency table, then the energy table."""
    from tools.eval_sensitivity import RATIOS
    lines = ["| GPU efficiency (fraction of FP32 peak) | " + " | ".join(RATIOS) + " |",
             "|" + "---|" * (1 + len(RATIOS))]
    for r in assumptions.get("gpu_efficiency", []):
        label = f"{r['gpu_efficiency']:g}" + (" (default)" if r["default"] else "")
        lines.append("| " + " | ".join([label] + [f"{r[k]['geomean']:.2f}x" if k in r else "-" for k in RATIOS])
                     + " |")
    lines += ["", "| energy constant | value | CXL energy saving vs PMEM (mean) |", "|---|---|---|"]
    for r in assumptions.get("energy", []):
        saving = r["energy_saving"].get("mean")
        cell = "-" if saving is None else f"{100 * saving:.1f}%"
        label = "every constant at its default" if r["field"] == "default" else f"{r['field']} x{r['scale']:g}"
        value = "" if r["value"] is None else f"{r['value']:g}"
        lines.append(f"| {label} | {value} | {cell} |")
    return lines
