"""Where a simulation command's trace comes from: a preset and a seed, or a user's file (``--trace``).

Contract
--------
``load_bound_trace(path, model, batches=None)`` reads a trace file (generated or imported,
sim/model/trace.py), checks it against the model preset named by ``--model`` and returns
``(preset, trace, source)``: the ``DlrmPreset`` resolved once here, the trace *bound* to it
(a copy whose manifest names the model as ``preset`` and carries its optimizer and MLP
widths, so the MLP shape comes from the model while tables, batches and rows come from the
file; the file's ``origin`` is kept), and the ``source`` record every result JSON carries.
``generated_source(preset, seed, knobs)`` is the record of a generated trace.

``check_against_model(manifest, preset)`` raises ``TraceSourceError`` (one line naming the
field) when the file cannot train with the model's MLP:
- ``tables``: the table count differs from the model's (its top MLP's input, the dot
  interaction of tables + 1 features, is sized for the model's count);
- ``dim``: a table's dim exceeds the bottom MLP's output width (DLRM needs equal dims; the
  project zero-pads narrower ones, sim/model/dlrm_mlp.py);
- ``num_dense``: the dense features differ from the bottom MLP's input width;
- ``optimizer``: the model does not train with SGD (the device's UPDATE).
``diagnose_fit(plan, trace)`` turns a layout failure into ``rows`` (the tables alone do
not fit the device) or ``batch_size`` (the tables fit, a batch's arguments do not).

``source`` records: ``{"kind": "preset", "preset", "seed", "knobs"}`` or ``{"kind": "file",
"file", "sha256", "origin", "model", "batches"}`` (``origin``: the manifest's origin format, or
"generated" for a file written by ``trainingcxl trace`` with its preset and seed).
"""
from __future__ import annotations

import copy
import dataclasses
import pathlib

from sim.model.import_common import file_digest


class TraceSourceError(ValueError):
    """The trace file does not fit the command or the model; one line naming the field."""


def generated_source(preset: str, seed: int, knobs=None) -> dict:
    return {"kind": "preset", "preset": preset, "seed": seed,
            "knobs": dataclasses.asdict(knobs) if dataclasses.is_dataclass(knobs) else knobs}


def check_against_model(m: dict, preset, where: str = "--trace") -> None:
    T, width = len(m["tables"]), preset.bottom_mlp[-1]
    if T != preset.num_tables:
        raise TraceSourceError(f"{where}: tables: the trace has {T} tables but model {preset.name}'s top MLP "
                               f"takes {preset.num_tables} (interaction of {preset.num_tables} + 1 features); "
                               f"choose a --model with {T} tables or import with --tables")
    for t, tab in enumerate(m["tables"]):
        if tab["dim"] > width:
            raise TraceSourceError(f"{where}: dim: table {t} has dim {tab['dim']} but model {preset.name}'s bottom "
                                   f"MLP ends at width {width} (a table's dim must be <= it)")
    if m["num_dense"] != preset.num_dense:
        raise TraceSourceError(f"{where}: num_dense: the trace has {m['num_dense']} dense features but model "
                               f"{preset.name}'s bottom MLP takes {preset.num_dense}")
    if preset.optimizer.name != "sgd":
        raise TraceSourceError(f"{where}: optimizer: model {preset.name} trains with {preset.optimizer.name}; "
                               f"the device's UPDATE is SGD")


def bind(trace, preset):
    """A copy of ``trace`` whose manifest takes the model's name, optimizer and MLP widths."""
    from sim.model.trace import Trace
    m = copy.deepcopy(trace.manifest)
    m.update(preset=preset.name, bottom_mlp=list(preset.bottom_mlp), top_mlp=list(preset.top_mlp),
             optimizer={"name": preset.optimizer.name, "lr": preset.optimizer.lr, "eps": preset.optimizer.eps})
    return Trace(m, trace.batches)


def load_bound_trace(path, model: str, batches: int | None = None, where: str = "--trace"):
    """(preset, bound trace, source record) of a trace file for ``--model model``."""
    from sim.model.dlrm import get_preset
    from sim.model.trace import Trace, read_trace
    preset = get_preset(model)
    path = pathlib.Path(path)
    if not path.is_file():
        raise TraceSourceError(f"{where}: {path}: no such file")
    trace = read_trace(path)                 # TraceFormatError (a ValueError) names member and fault
    n = len(trace.batches)
    if batches is not None:
        if batches > n:
            raise TraceSourceError(f"{where}: batches: --batches {batches} but {path.name} has {n}")
        trace = Trace(dict(trace.manifest, num_batches=batches), trace.batches[:batches])
    check_against_model(trace.manifest, preset, where)
    sha, _ = file_digest(path)
    org = trace.manifest.get("origin")
    source = {"kind": "file", "file": str(path), "sha256": sha, "model": model, "batches": len(trace.batches),
              "origin": org["format"] if org else "generated",
              "origin_sha256": org["sha256"] if org else None,
              "origin_file": org["file"] if org else None,
              "generated_from": None if org else {"preset": trace.manifest["preset"], "seed": trace.manifest["seed"]}}
    return preset, bind(trace, preset), source


def diagnose_fit(plan, trace, where: str = "--trace"):
    """``plan(trace)``; on a LayoutError raise TraceSourceError naming ``rows`` (the tables do not
    fit even with one empty sample per batch) or ``batch_size`` (they do: the batches do not)."""
    import numpy as np
    from sim.bfm.ndp_host import LayoutError
    from sim.model.trace import Trace, TraceBatch
    try:
        return plan(trace)
    except LayoutError as e:
        full = e
    m = trace.manifest
    T = len(m["tables"])
    empty = TraceBatch(np.zeros(T + 1, np.uint32), np.zeros(0, np.uint32), None,
                       np.zeros((1, m["num_dense"]), np.float32), np.zeros(1, np.float32))
    try:
        plan(Trace(dict(m, batch_size=1, num_batches=1), [empty]))
    except LayoutError:
        rows = sum(t["rows"] for t in m["tables"])
        mib = sum(t["rows"] * t["dim"] * 4 for t in m["tables"]) / (1 << 20)
        hint = "; re-import with a smaller --rows-cap" if where == "--trace" else ""
        raise TraceSourceError(f"{where}: rows: {rows} rows ({mib:.1f} MiB of tables) do not fit the device: "
                               f"{full}{hint}") from None
    hint = "; re-import with a smaller --batch-size" if where == "--trace" else ""
    raise TraceSourceError(f"{where}: batch_size: the tables fit but batches of {m['batch_size']} do not: "
                           f"{full}{hint}") from None
