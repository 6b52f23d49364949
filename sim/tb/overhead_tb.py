"""Checkpoint overhead: the per-batch cost of LOG, MLP_LOG and the checkpointed UPDATE, on the RTL.

The cocotb test ``checkpoint_overhead`` (driven by ``trainingcxl bench``) trains the same
batches twice through a ``CheckpointedRun`` (sim/tb/ckpt_run.py) from the same initial
tables: once without checkpointing (LOOKUP, plain UPDATE) and once with it, commands one
after the other (LOOKUP, LOG, MLP_LOG, checkpointed UPDATE). Every pooled vector and the final
tables of both passes are checked bit for bit against the golden model. The GPU's MLP time
is not simulated (the device is idle then); it comes from the GPU agent's timing model
(sim/bfm/gpu_agent.py) at the run's batch size.

Per batch, from the completions' NDP_LAST_CYCLES (descriptor fetch to durable completion):
- T_none  = lookup + gpu + update_plain
- T_cxl_d = lookup + gpu + log + mlp_log + update_ckpt   (logging after the gradients arrive)
- T_cxl_b = lookup + max(gpu, log + mlp_log) + update_ckpt   (logging during the GPU's MLPs)
and ``overhead_<schedule>`` = sum(T_schedule) / sum(T_none) - 1 over the batches after the
first (batch 0 of each pass is a warm-up: the first LOG after reset also clears the undo
log's dedup set; ``TCXL_OVH_BATCHES`` counts the measured ones). Composing the
schedule from the measured commands is exact while the device does nothing else during the
GPU's MLP time, which holds in both schedules (host polling and doorbells are left out).
``log_floor`` is the least media time any LOG of this log format needs (``log_floor_cycles``),
``log_floor_efficiency`` = sum(log_floor) / sum(log), and ``overhead_cxl_b_emb_only_at_log_floor``
the embedding-log-only overhead with LOG at that floor: when it exceeds a target, no faster
LOG engine (own ports, more overlap) meets it; only fewer lines written would.

The model's MLP image (68 MB for rm1) does not fit the simulated device, so MLP_LOG copies
its first ``TCXL_OVH_MLP_PROBE`` lines on the RTL and the whole image's copy time is that
measurement scaled by image lines / probe lines (``mlp_log_cycles_full``; the rate is what
scales, the per-command cost is a few hundred cycles).

Reads TCXL_OVH_MODEL, TCXL_OVH_BATCH_SIZE, TCXL_OVH_ROWS_CAP, TCXL_OVH_BATCHES,
TCXL_OVH_MLP_PROBE, TCXL_SEED; writes TCXL_RESULT_JSON.
"""
from __future__ import annotations

import os

import cocotb

from hw.checkpoint.log_format import group_lines
from sim.env import DeviceEnv
from sim.model.dlrm import get_preset
from sim.model.trace import TraceKnobs, generate_trace
from sim.tb.ckpt_run import CheckpointedRun
from sim.tb.eval_tb import batch_workload
from sim.tb.ndp_run_tb import even_spread, media_bound_cycles, media_costs, recorded


def log_floor_cycles(workload: dict, channels: int, rd_cost_q8: int, wr_cost_q8: int) -> float:
    """The least media time a LOG of this log format needs (sim/tb/eval_tb.py ``batch_workload``
    counts): every distinct row's lines read once; its lines written, a group line per
    GROUP_ENTRIES rows (hw/checkpoint/log_format.py), plus the slot's two record writes; spread
    evenly over the channels (the index arrays' reads are left out, so it is a lower bound)."""
    reads = workload["unique_lines"]
    writes = workload["unique_lines"] + group_lines(workload["unique_rows"]) + 2
    return media_bound_cycles(even_spread(reads, writes, channels), rd_cost_q8, wr_cost_q8)


def compose(plain: list[dict], ckpt: list[dict], mlp_scale: float, log_floor: list[float] | None = None) -> dict:
    """Batch times of the three schedules from the per-batch completion cycles of both passes;
    ``log_floor`` (per batch, ``log_floor_cycles``) adds the embedding-log-only schedule with LOG
    at that floor: what no LOG of this log format can beat."""
    rows = []
    for i, (p, c) in enumerate(zip(plain, ckpt)):
        gpu = p["gpu_cycles"]
        log, mlp = c["cycles_logging"], c["cycles_mlp_log"] * mlp_scale
        floor = log if log_floor is None else log_floor[i]
        rows.append({
            "batch": p["batch"], "gpu": gpu, "lookup": p["cycles_lookup"], "update_plain": p["cycles_update"],
            "log": log, "mlp_log_probe": c["cycles_mlp_log"], "mlp_log_full": round(mlp),
            "update_ckpt": c["cycles_update"],
            "t_none": p["cycles_lookup"] + gpu + p["cycles_update"],
            "t_cxl_d": c["cycles_lookup"] + gpu + log + mlp + c["cycles_update"],
            "t_cxl_b": c["cycles_lookup"] + max(gpu, log + mlp) + c["cycles_update"],
            "t_cxl_b_emb_only": c["cycles_lookup"] + max(gpu, log) + c["cycles_update"],
            "log_floor": round(floor),
            "t_cxl_b_emb_only_at_log_floor": c["cycles_lookup"] + max(gpu, floor) + c["cycles_update"],
        })
    total = {k: sum(r[k] for r in rows) for k in ("t_none", "t_cxl_d", "t_cxl_b", "t_cxl_b_emb_only",
                                                  "t_cxl_b_emb_only_at_log_floor", "log", "log_floor")}
    return {"batches": rows,
            "overhead_cxl_b": round(total["t_cxl_b"] / total["t_none"] - 1, 4),
            "overhead_cxl_d": round(total["t_cxl_d"] / total["t_none"] - 1, 4),
            "overhead_cxl_b_emb_only": round(total["t_cxl_b_emb_only"] / total["t_none"] - 1, 4),
            "overhead_cxl_b_emb_only_at_log_floor": round(total["t_cxl_b_emb_only_at_log_floor"] / total["t_none"] - 1,
                                                          4),
            "log_floor_efficiency": round(total["log_floor"] / total["log"], 4) if total["log"] else None,
            **{f"sum_{k}": round(v) for k, v in total.items()}}


@cocotb.test()
async def checkpoint_overhead(dut):
    env = await DeviceEnv.create(dut)
    model = os.environ.get("TCXL_OVH_MODEL", "rm-tiny")
    batches = int(os.environ.get("TCXL_OVH_BATCHES", "2"))
    probe = int(os.environ.get("TCXL_OVH_MLP_PROBE", "4096"))
    knobs = TraceKnobs(rows_cap=int(os.environ["TCXL_OVH_ROWS_CAP"]) if os.environ.get("TCXL_OVH_ROWS_CAP") else None,
                       batch_size=int(os.environ["TCXL_OVH_BATCH_SIZE"]) if os.environ.get("TCXL_OVH_BATCH_SIZE")
                       else None)
    trace = generate_trace(get_preset(model), batches + 1, env.seed, knobs)
    result = {"model": model, "seed": env.seed, "batch_size": trace.manifest["batch_size"], "verified": False}
    with recorded(result):
        run = CheckpointedRun(env, trace, total_batches=batches + 1, schedule="none", gpu_wait=False,
                              mlp_lines=min(probe, get_gpu_lines(model)))
        result.update({"mlp_image_lines": run.gpu.lines, "mlp_probe_lines": run.mlp_lines,
                       "gpu_cycles_per_batch": run.gpu.mlp_time_cycles(), "clock_mhz": env.config.clock_mhz})
        await run.setup()
        plain = [await run.run_batch(k) for k in range(batches + 1)]
        run.verify_all_tables("without checkpointing")
        dut._log.info(f"{model}: {batches} batches without checkpointing: {plain}")
        run.driver.load_tables(run.golden.tables_after(0))          # the same run again, checkpointed
        run.next_batch = run.acked_batches = 0
        run.schedule = "cxl-d"
        run.gpu.advance(0)
        ckpt = [await run.run_batch(k) for k in range(batches + 1)]
        run.verify_all_tables("with checkpointing")
        dut._log.info(f"{model}: {batches} batches with checkpointing: {ckpt}")
        costs = media_costs(env.config.clock_mhz)
        floor = [log_floor_cycles(batch_workload(trace.manifest, trace.batches[k]), env.config.channels, *costs)
                 for k in range(1, batches + 1)]
        result.update(compose(plain[1:], ckpt[1:], run.gpu.lines / run.mlp_lines, floor))
        await run.finish_checked()
        result["verified"] = True


def get_gpu_lines(model: str) -> int:
    from sim.bfm.gpu_agent import mlp_image_lines
    return mlp_image_lines(model)
