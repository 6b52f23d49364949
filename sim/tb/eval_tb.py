"""DLRM training through the device for the evaluation: one model, one command order, measured cycles.

The cocotb test ``training_eval`` (driven by ``trainingcxl eval``, tools/eval_cmd.py) trains
``TCXL_EVAL_BATCHES`` batches of ``TCXL_EVAL_MODEL`` through a ``SystemRun`` (sim/system.py)
in the order ``TCXL_EVAL_ORDER`` (``exact`` or ``relaxed``): LOOKUP, LOG, MLP_LOG (the first
``TCXL_EVAL_MLP_PROBE`` lines of the MLP image) and the checkpointed UPDATE on the RTL, the
real numpy MLP on the GPU side. Every pooled vector, the GPU's loss and gradients, and the
final tables are checked bit for bit against the golden training; the protocol monitors and
the CXL.cache home agent must be clean at the end.

Trace knobs: ``TCXL_EVAL_BATCH_SIZE``, ``TCXL_EVAL_ROWS_CAP`` (optional), or ``TCXL_EVAL_TRACE``
(a trace file bound to the model, whose first TCXL_EVAL_BATCHES batches run); ``TCXL_SEED`` seeds
the trace, the tables and the MLP.

Writes ``TCXL_RESULT_JSON``: ``model``, ``order``, ``seed``, ``batch_size``, ``rows_cap``,
``verified`` (every check passed), ``error``, ``commands`` (per batch: device cycles of
lookup / lookup_relaxed, log, mlp_log, update, and the loss), ``losses``, ``workload`` (per
batch: lookups, lookup_lines, unique_rows, unique_lines, output_bytes), ``image_lines``,
``mlp_probe_lines``, ``clock_mhz``, ``wall_seconds``.
"""
from __future__ import annotations

import os
import time

import cocotb

from sim.bfm.gpu_agent import mlp_image_lines, mlp_param_count
from sim.env import DeviceEnv
from sim.model.checkpoint import batch_rows
from sim.model.dlrm import get_preset
from sim.model.trace import TraceKnobs, generate_trace, read_trace
from sim.system import TRAINING_LR, SystemRun
from sim.tb.ndp_run_tb import recorded


def batch_workload(manifest: dict, batch) -> dict:
    """What one batch moves: index occurrences and lines, distinct rows and lines, output bytes."""
    B, tables = manifest["batch_size"], manifest["tables"]
    row_lines = [t["dim"] // 16 for t in tables]
    offs = batch.offsets
    per_table = [int(offs[(t + 1) * B] - offs[t * B]) for t in range(len(tables))]
    rows = batch_rows(batch.offsets, batch.indices, B, len(tables))
    return {"lookups": int(batch.indices.size),
            "lookup_lines": sum(n * row_lines[t] for t, n in enumerate(per_table)),
            "unique_rows": len(rows), "unique_lines": sum(row_lines[t] for t, _ in rows),
            "output_bytes": B * sum(t["dim"] for t in tables) * 4}


def _int_env(name: str) -> int | None:
    return int(os.environ[name]) if os.environ.get(name) else None


@cocotb.test()
async def training_eval(dut):
    env = await DeviceEnv.create(dut)
    model = os.environ.get("TCXL_EVAL_MODEL", "rm-tiny")
    order = os.environ.get("TCXL_EVAL_ORDER", "exact")
    batches = int(os.environ.get("TCXL_EVAL_BATCHES", "3"))
    probe = int(os.environ.get("TCXL_EVAL_MLP_PROBE", "4096"))
    knobs = TraceKnobs(rows_cap=_int_env("TCXL_EVAL_ROWS_CAP"), batch_size=_int_env("TCXL_EVAL_BATCH_SIZE"),
                       labels=os.environ.get("TCXL_EVAL_LABELS", "random"))
    preset = get_preset(model)                  # resolved once here and passed down
    if os.environ.get("TCXL_EVAL_TRACE"):       # a file already bound to the model (tools/trace_source.py)
        trace = read_trace(os.environ["TCXL_EVAL_TRACE"])
        org = trace.manifest.get("origin")
        source = {"kind": "file", "origin": org["format"] if org else "generated",
                  "origin_sha256": org["sha256"] if org else None}
    else:
        trace = generate_trace(preset, batches, env.seed, knobs)
        source = {"kind": "preset", "preset": model, "seed": env.seed}
    m = trace.manifest
    # The eval trains tables and MLP at TRAINING_LR (sim/system.py says why not the presets'
    # DLRM rate); the manifest of the trace it trains says so, and SystemRun reads it there.
    m["optimizer"] = {**m["optimizer"], "lr": TRAINING_LR}
    result = {"model": model, "order": order, "seed": env.seed, "batch_size": m["batch_size"], "trace_source": source,
              "rows_cap": knobs.rows_cap, "batches": batches, "verified": False, "clock_mhz": env.config.clock_mhz,
              "workload": [batch_workload(m, b) for b in trace.batches],
              "table_lines": sum(t["rows"] * (t["dim"] // 16) for t in m["tables"]), "lr": TRAINING_LR}
    t0 = time.perf_counter()
    with recorded(result):
        image = mlp_image_lines(preset)
        run = SystemRun(env, trace, total_batches=batches, order=order, mlp_lines=min(probe, image), preset=preset)
        result.update(image_lines=image, mlp_params=mlp_param_count(preset), mlp_probe_lines=run.mlp_lines)
        await run.setup()
        for k in range(batches):
            cyc = await run.run_batch(k)
            dut._log.info(f"{model} {order}: batch {k + 1}/{batches}: loss {cyc['loss']:.6f}, device cycles "
                          + ", ".join(f"{key} {v}" for key, v in cyc.items() if key not in ("batch", "loss"))
                          + f" ({time.perf_counter() - t0:.0f} s)")
        result["commands"] = run.command_cycles
        result["losses"] = run.trainer.losses
        run.verify_all_tables("after training")
        await run.finish_checked()
        result["verified"] = True
