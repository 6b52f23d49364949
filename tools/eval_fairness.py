"""The evaluation's fairness ablation: the headline ratios with each modelling choice of
sim/model/system_params.py ``Modelling`` switched back to the earlier one, alone and all
together, composed from measured runs (no simulation here).

Rows: ``fair`` (every switch on: the default composition), one row per switch off (named by
the switch, ``MODELLING_CHOICES``), and ``earlier`` (all off: the composition before issue 21).
Each row holds the RATIOS of tools/eval_sensitivity.py twice: ``equal`` with every
configuration logging the MLP every ``mlp_interval`` batches, ``own`` with each configuration's
own MLP-log policy (the paper's).
"""
from __future__ import annotations

from tools.eval_sensitivity import RATIOS, ratio_row

LABELS = {   # what the earlier choice was, for the report
    "equal_channels": "host PMEM on 2 channels (the i5-9600K's), device on 4",
    "same_link_model": "PCIe 3.0 at 12 GB/s against CXL at flit efficiency (60.2 GB/s)",
    "pipelined_staging": "two-stage copies one stage after the other",
    "host_cache": "host lookup misses on every occurrence, update repeats hit",
    "launch_everywhere": "only PMEM and PCIe pay the GPU launch",
    "dense_sgd": "no dense SGD step in the GPU's time",
}


def fairness_rows(runs: dict, models: list[str], mlp_interval: int) -> list[dict]:
    """The ``fairness`` rows of the eval JSON (see the module docstring)."""
    from sim.model.system_params import DEFAULT_PARAMS, MODELLING_CHOICES, paper_choices, with_modelling
    settings = [("fair", "every fair choice (the default composition)", DEFAULT_PARAMS)]
    settings += [(name, LABELS[name], with_modelling(DEFAULT_PARAMS, **{name: False})) for name in MODELLING_CHOICES]
    settings.append(("earlier", "every earlier choice (the composition before issue 21)", paper_choices()))
    return [{"setting": key, "label": label, "mlp_interval": mlp_interval,
             "equal": ratio_row(runs, models, mlp_interval, params), "own": ratio_row(runs, models, None, params)}
            for key, label, params in settings]


def text_rows(rows: list[dict]) -> list[str]:
    """Markdown table lines: geomean ratios, equal durability then own policies."""
    k = rows[0]["mlp_interval"] if rows else 1
    head = ["modelling"] + [f"{name} (MLP log every {k})" for name in RATIOS] + [f"{name} (own)" for name in RATIOS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        label = r["label"] if r["setting"] in ("fair", "earlier") else f"{r['setting']} off: {r['label']}"
        cells = [f"{r[part][name]['geomean']:.2f}x" if name in r[part] else "-"
                 for part in ("equal", "own") for name in RATIOS]
        lines.append("| " + " | ".join([label] + cells) + " |")
    return lines
