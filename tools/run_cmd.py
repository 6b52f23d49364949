"""``trainingcxl run``: a DLRM model's embedding phase on the RTL, verified bit-exactly, with figures.

  trainingcxl run --model M --config cxl-d --phase embedding --batches N --json FILE
                  [--seed S] [--rows-cap R] [--batch-size B] [--out host|device] [--fp32-pipeline compact|deep]
                  [--lookup-cache-lines N] [--lookup-contexts C]
  trainingcxl run --model M --trace FILE [--batches N] ...

With ``--trace`` the tables, rows, batch size and batches come from the file (generated or
imported; tools/trace_source.py checks it against the model and names the field that
conflicts); the seed still seeds the initial tables and the gradients.

Steps: generate the trace (sim/model/trace.py ``generate_trace`` with the knobs; the seed
also seeds the initial tables and the gradients); plan the device-memory layout
(sim/bfm/ndp_host.py ``plan_layout``) on the default simulation device
(``DeviceConfig.for_simulation()``), or, only when the model does not fit there, on the
smallest larger one (each distinct device is a separate Verilator build of a few minutes);
build the harness; run every batch's LOOKUP then UPDATE on the RTL through the cocotb test
``embedding_run`` (sim/tb/ndp_run_tb.py), which checks every pooled vector and every
updated row against the golden model; write the JSON and print a table.

JSON keys (the contract): ``verified`` (every check passed), ``model``, ``config``,
``phase``, ``seed``, ``knobs`` (rows_cap, batch_size, batches, out), ``trace_source`` (which
trace ran: ``{"kind": "preset", "preset", "seed", "knobs"}`` or ``{"kind": "file", "file",
"sha256", "origin", ...}``, tools/trace_source.py), ``lookups`` (index
occurrences), ``lines_read`` (media lines the LOOKUPs read, from their completions),
``lookup_row_lines`` / ``lookup_cache_hits`` / ``lookup_cache_hit_rate`` (row lines asked for,
served by the row cache, and their ratio; null rate when the device has no row cache),
``feeder_bound_cycles_lookup`` / ``lookup_feeder_efficiency`` (the lookup feeder's one work item
per cycle: occurrences plus empty bags, over the cycles),
``cycles_lookup`` / ``cycles_update`` (sum of the completions' cycle counts: descriptor
fetch to durable completion), ``bound_cycles_lookup`` / ``bound_cycles_update``,
``lookup_efficiency`` / ``update_efficiency`` (bound / cycles: media utilisation),
``physical_bound_cycles_*`` and ``lookup_physical_efficiency`` / ``update_physical_efficiency``
(the least traffic the command needs over the same cycles, sim/tb/min_traffic.py),
``efficiency_bounds`` (what each figure's bound counts), ``durable_cycles_*`` (the
same plus the completion write until durable: NDP_LAST_CYCLES), ``sim_cycles_per_second``
(simulated cycles per wall second over the batch loop, backdoor loads and golden model
included),
``batches`` (the same figures per batch plus per-channel media counts), ``lookup_stats`` /
``update_stats`` (the engines' completion stats summed), ``device`` (the DeviceConfig),
``wall_seconds``, ``error`` (when not verified).

Bound: for each command, max over channels c of (reads_c * RD_COST_Q8 + writes_c *
WR_COST_Q8) / 256, the busiest channel's media occupancy in cycles (pmem_media
stat_reads / stat_writes sampled before and after the command; RD/WR_COST_Q8 from
sim/model/pmem_params.py), and for a LOOKUP that pushes its outputs over CXL.cache at least
its pushed lines (the D2H data channel moves one line per cycle); a phase's bound is the
sum over its commands. ``bound_source`` says whether the media counters were visible
("media-counters") or the engines' line counts spread evenly over the channels were used
("engine-stats-even-spread", a lower bound of the same figure).

``--config`` and ``--phase`` take one value each (cxl-d, embedding): this command runs the
device's embedding phase as CXL-D uses it. The five configurations with the MLP and the
checkpoints run in ``trainingcxl eval`` (tools/eval_cmd.py).
"""
from __future__ import annotations

import argparse
import dataclasses
import pathlib
import random
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.cli_args import CliError, non_negative_int, positive_int, seed_int  # noqa: E402


CONFIGS = ("cxl-d",)             # the other configurations: trainingcxl eval
PHASES = ("embedding",)
# Simulated devices, smallest first: the first is DeviceConfig.for_simulation()'s default;
# each other one is a separate Verilator build (a few minutes). The media store is sparse, so
# capacity costs memory only where written.
DEVICE_CAPACITIES = (1 << 30, 2 << 30, 4 << 30)


class RunError(CliError):
    """A bad request, reported as one line (exit code 2)."""


def choose_device(trace, out: str, where: str = "--model"):
    """(DeviceConfig, layout): the default simulation device if the model fits, else the
    smallest larger one (DEVICE_CAPACITIES). When none
    fits, the one-line error names ``rows`` or ``batch_size`` (tools/trace_source.py)."""
    from hw.config import DeviceConfig
    from sim.bfm.ndp_host import LayoutError, plan_layout, tables_from_manifest
    from tools.trace_source import TraceSourceError, diagnose_fit
    default = DeviceConfig.for_simulation()

    def planner(cfg):
        def plan(tr):
            return plan_layout(tables_from_manifest(tr.manifest), batch_size=tr.manifest["batch_size"],
                               max_indices=max(int(b.indices.size) for b in tr.batches),
                               capacity_lines=cfg.capacity_lines, has_weights=tr.manifest["has_weights"],
                               outputs_in_device=out == "device")
        return plan
    first_error = None
    for capacity in DEVICE_CAPACITIES:
        cfg = default if capacity == default.capacity_bytes else DeviceConfig.for_simulation(capacity)
        try:
            return cfg, planner(cfg)(trace)
        except LayoutError as e:
            first_error = first_error or e
    try:
        diagnose_fit(planner(cfg), trace, where)
    except TraceSourceError as e:
        raise RunError(f"{e} (tried devices up to {DEVICE_CAPACITIES[-1] >> 20} MiB; "
                       f"on the first, {DEVICE_CAPACITIES[0] >> 20} MiB: {first_error})") from None
    raise RunError(f"no device fits ({first_error})")


def resolve_trace(args):
    """(trace, source record): the --trace file bound to --model, or the model's generated trace.
    The preset is resolved here, once (tools/trace_source.py)."""
    from sim.model.dlrm import get_preset
    from sim.model.trace import TraceKnobs, generate_trace, make_manifest
    from tools.trace_source import generated_source, load_bound_trace
    if args.trace:
        for flag, value in (("--rows-cap", args.rows_cap), ("--batch-size", args.batch_size)):
            if value is not None:
                raise RunError(f"{flag} applies to a generated trace; with --trace the file fixes it "
                               f"(re-import with {flag})")
        _, trace, source = load_bound_trace(args.trace, args.model, args.batches)
        return trace, source
    preset = get_preset(args.model)
    if preset.optimizer.name != "sgd":
        raise RunError(f"model {args.model} trains with {preset.optimizer.name}; the device's UPDATE is SGD "
                       f"(row-wise Adagrad comes with a later issue)")
    knobs = TraceKnobs(rows_cap=args.rows_cap, batch_size=args.batch_size)
    refuse_hopeless(make_manifest(preset, args.batches, args.seed, knobs), args.out)
    print(f"generating the trace ({args.batches} batches)...", file=sys.stderr, flush=True)
    return generate_trace(preset, args.batches, args.seed, knobs), generated_source(args.model, args.seed, knobs)


def refuse_hopeless(manifest: dict, out: str) -> None:
    """Raise RunError, before any trace is generated, when even the fewest indices a batch of
    this manifest can have (every bag at its shortest non-empty length, times the chance it is
    not empty, halved for the sampling spread) do not fit the largest simulated device: a batch
    of a million samples would otherwise take minutes to generate before ``choose_device`` could
    refuse it."""
    from hw.config import DeviceConfig
    from sim.bfm.ndp_host import LayoutError, plan_layout, tables_from_manifest
    B = manifest["batch_size"]
    fewest = sum((1.0 - t["pooling"]["empty_prob"]) *
                 (t["pooling"]["mean"] if t["pooling"]["kind"] == "fixed" else min(1, t["pooling"]["mean"]))
                 for t in manifest["tables"]) * B / 2
    largest = DeviceConfig.for_simulation(DEVICE_CAPACITIES[-1])
    try:
        plan_layout(tables_from_manifest(manifest), batch_size=B, max_indices=int(fewest),
                    capacity_lines=largest.capacity_lines, has_weights=manifest["has_weights"],
                    outputs_in_device=out == "device")
    except LayoutError as e:
        raise RunError(f"batch_size: batches of {B} samples (at least ~{int(fewest)} indices) do not fit the "
                       f"largest simulated device ({largest.capacity_bytes >> 20} MiB): {e}") from None


def run_embedding(args) -> dict:
    from sim.model.trace import summarize, write_trace
    from tools.harness_run import NoResult, run_harness_test

    t0 = time.perf_counter()
    trace, source = resolve_trace(args)
    cfg, layout = choose_device(trace, args.out, "--trace" if args.trace else "--model")
    if args.fp32_pipeline != cfg.fp32_pipeline:
        cfg = dataclasses.replace(cfg, fp32_pipeline=args.fp32_pipeline)
    contexts = getattr(args, "lookup_contexts", None)
    if contexts is not None and contexts != cfg.lookup_contexts:
        cfg = dataclasses.replace(cfg, lookup_contexts=contexts)
    cache_lines = getattr(args, "lookup_cache_lines", None)
    if cache_lines is not None and cache_lines != cfg.lookup_cache_lines:
        cfg = dataclasses.replace(cfg, lookup_cache_lines=cache_lines)
    s = summarize(trace)
    origin = f"file {source['file']} ({source['origin']}, sha256 {source['sha256'][:16]}...)" \
        if source["kind"] == "file" else f"preset {args.model}, seed {args.seed}"
    print(f"trace: {origin}", file=sys.stderr, flush=True)
    print(f"model {args.model}: {s['tables']} tables, batch {s['batch_size']}, {s['batches']} batches, "
          f"{s['lookups']} lookups; device {cfg.capacity_bytes >> 20} MiB "
          f"({cfg.lines_per_channel} lines per channel), tables at lines "
          f"{layout.table_regions[0].base}..{layout.table_regions[-1].end - 1}", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        trace_path = write_trace(pathlib.Path(tmp) / "trace.npz", trace)
        env = {"TCXL_SEED": str(args.seed), "TCXL_TRACE": str(trace_path), "TCXL_RUN_OUT": args.out}
        if getattr(args, "media_timeline", None):
            env["TCXL_MEDIA_TIMELINE"] = str(args.media_timeline)
        print(f"{len(trace.batches)} batches (LOOKUP + UPDATE each)", file=sys.stderr, flush=True)
        try:
            result = run_harness_test("embedding_run", env, "sim.tb.ndp_run_tb", config=cfg)
        except NoResult as e:
            raise RunError(str(e)) from None
    error = result.get("error")
    result["verified"] = bool(result.get("verified")) and error is None
    result.update({"model": args.model, "config": args.config, "phase": args.phase,
                   "knobs": {"rows_cap": args.rows_cap, "batch_size": trace.batch_size, "batches": len(trace.batches),
                             "out": args.out},
                   "trace": s, "trace_source": source, "device": dict(cfg.__dict__),
                   "wall_seconds": round(time.perf_counter() - t0, 1)})
    return result


SUMMARY_KEYS = ("verified", "model", "seed", "lookups", "lines_read", "lookup_cache_hit_rate", "cycles_lookup",
                "bound_cycles_lookup", "lookup_feeder_efficiency",
                "lookup_efficiency", "lookup_physical_efficiency", "cycles_update", "bound_cycles_update",
                "update_efficiency", "update_physical_efficiency",
                "sim_cycles_per_second", "bound_source", "wall_seconds", "error")
BATCH_COLUMNS = ("batch", "lookups", "unique_rows", "cycles_lookup", "bound_cycles_lookup", "lookup_efficiency",
                 "lookup_physical_efficiency", "cycles_update", "bound_cycles_update", "update_efficiency",
                 "update_physical_efficiency")


def format_result(result: dict) -> str:
    rows = {k: result[k] for k in SUMMARY_KEYS if k in result}
    for phase in ("lookup", "update"):
        for k, v in (result.get(f"{phase}_stats") or {}).items():
            rows[f"{phase}.{k}"] = v
    width = max(len(k) for k in rows)
    title = f"trainingcxl run: {result.get('model')} {result.get('config')} {result.get('phase')}"
    lines = [title, "-" * len(title)]
    for k, v in rows.items():
        lines.append(f"{k:<{width}}  {v:.4g}" if isinstance(v, float) else f"{k:<{width}}  {v}")
    batches = result.get("batches") or []
    if batches:
        lines += ["", "  ".join(f"{c:>{max(len(c), 8)}}" for c in BATCH_COLUMNS)]
        for b in batches:
            lines.append("  ".join(f"{b.get(c)!s:>{max(len(c), 8)}}" for c in BATCH_COLUMNS))
    return "\n".join(lines)


def cmd_run(args) -> int:
    from tools.harness_run import write_json
    if args.batches is None and not args.trace:
        print("error: --batches is required (or --trace FILE: all its batches)", file=sys.stderr)
        return 2
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 31)
    print(f"seed {args.seed} (replay with --seed {args.seed})", flush=True)
    try:
        result = run_embedding(args)
    except (RunError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_result(result))
    if args.media_timeline and result.get("batches"):
        from sim.bfm.media_timeline import format_timeline
        last = result["batches"][-1]
        for phase in ("lookup", "update"):
            print(f"\nbatch {last['batch']} {phase.upper()}: media occupancy per {args.media_timeline} cycles")
            print(format_timeline(last.get(f"media_timeline_{phase}") or []))
    if args.json:
        write_json(args.json, result)
    return 0 if result["verified"] else 1


def add_run_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``run`` on an argparse subparsers object; returns the new parser."""
    p = subparsers.add_parser("run", help="a model's embedding phase on the RTL, verified, with figures (JSON)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="DLRM preset: rm1 rm2 rm3 rm4 kaggle terabyte rm-tiny")
    p.add_argument("--config", default="cxl-d", choices=CONFIGS,
                   help="system configuration: cxl-d (the others run in trainingcxl eval)")
    p.add_argument("--phase", default="embedding", choices=PHASES,
                   help="what to run: the embedding phase (LOOKUP + UPDATE per batch)")
    p.add_argument("--batches", type=positive_int, default=None,
                   help="number of batches (required without --trace; with it the first N of the file)")
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="run this trace file (trainingcxl trace / trace import) instead of the model's generated "
                        "one; --model gives the MLP and optimizer, the file the tables, rows and batches")
    p.add_argument("--json", help="write the result here")
    p.add_argument("--seed", type=seed_int, default=None, help="trace, table and gradient seed")
    p.add_argument("--rows-cap", type=positive_int, default=None, help="cap every table at R rows")
    p.add_argument("--batch-size", type=positive_int, default=None, help="samples per batch (default: the model's)")
    p.add_argument("--out", choices=("device", "host"), default="host",
                   help="pooled outputs to host memory over CXL.cache (CXL-D) or to device memory")
    from hw.common.fp32 import Fp32Fma
    p.add_argument("--fp32-pipeline", choices=tuple(Fp32Fma.LATENCIES), default="compact",
                   help="the engines' FP32 pipelines (hw/config.py fp32_pipeline): compact = FMA 5 cycles, "
                        "deep = 12 cycles at <= 6 LUT levels (same results)")
    p.add_argument("--lookup-cache-lines", type=non_negative_int, default=None, metavar="N",
                   help="each lookup unit's row cache in 64-byte lines (hw/config.py lookup_cache_lines; "
                        "0 = none, the paper's design; default: the device's, 1024; another value is another "
                        "Verilator build)")
    p.add_argument("--lookup-contexts", type=positive_int, default=None, metavar="C",
                   help="bag contexts per lookup unit (hw/config.py lookup_contexts: a power of two in 2..16; "
                        "default: the device's, 2; more hide the deep FMA's latency; another Verilator build)")
    p.add_argument("--media-timeline", type=positive_int, default=None, metavar="CYCLES",
                   help="sample each channel's media occupancy every CYCLES cycles during every command: "
                        "the JSON's batches carry media_timeline_lookup/_update, and the last batch's are "
                        "printed as bar charts (sim/bfm/media_timeline.py)")
    p.set_defaults(func=cmd_run)
    return p
