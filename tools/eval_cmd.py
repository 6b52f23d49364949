"""``trainingcxl eval``: the paper's evaluation, PMEM / PCIe / CXL-D / CXL-B / CXL on RM1-RM4.

  trainingcxl eval [--models rm1,rm2,rm3,rm4] [--configs pmem,pcie,cxl-d,cxl-b,cxl]
                   [--batches N] [--seed S] [--json FILE] [--report DIR]
                   [--batch-size B] [--rows-cap R] [--mlp-probe L]
  trainingcxl eval --models M --trace FILE [--batches N] ...

``--trace FILE``: train on a trace file (generated or imported) instead of the generated one;
one model (any preset, e.g. kaggle), which gives the MLP and optimizer, while tables, rows, batch
size and batches come from the file (the first ``--batches`` of them; default all). Conflicts are
one-line errors naming the field (tools/trace_source.py). Every result and ``meta.trace_sources``
record which trace ran (preset and seed, or the file's SHA-256 and origin); so does the report.

Per model: generate the trace (the model's ``SETUP``: batch size and rows cap, chosen because
the paper does not give them, and kept), train ``--batches`` batches through the device on the
RTL (sim/tb/eval_tb.py, sim/system.py) in the ``exact`` order (for pmem, pcie, cxl-d, cxl-b)
and, if cxl is asked for, the ``relaxed`` order (the two simulations run side by side), with
every embedding result, the losses and the final tables checked bit for bit against the golden
training; then compose every configuration's steady-state batch time, breakdown, timeline and
energy from the measured command cycles (sim/model/system_timing.py, parameters in
sim/model/system_params.py). Steady state = the mean over batches 1..N-1 (batch 0 pays the
first LOG's dedup-set clear and, relaxed, an unoverlapped lookup), or batch 0 alone when N = 1.

Writes the JSON (``{"results": [{"model", "config", "batch_time_ms", "verified", "breakdown_ms",
"energy_mj", "energy_breakdown_mj", "speedup_vs_pmem", "timeline", "loss", ...}], "meta":
{...}}``), and, with ``--report``, a Markdown report with the Fig. 11-13 style PNGs
(tools/eval_report.py). The JSON's ``meta.runs`` keeps every run's measured cycles: ``--recompose
FILE`` composes them again (after a parameter change) without simulating. Prints progress and
a table. Exit 0 when every result is verified, 1 when a check failed, 2 on a bad request.

``verified`` of pmem: the host computes the embedding operators of the golden model, so its
verification is that of the exact-order run (the same training on the device, bit-exact).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import pathlib
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.cli_args import CliError, add_shard_options, positive_int, seed_int  # noqa: E402
from tools.harness_run import NoResult, run_harness_test, write_json  # noqa: E402

MODELS = ("rm1", "rm2", "rm3", "rm4")
EXTRA_MODELS = ("rm-tiny",)              # for quick checks; not part of the paper's set
CONFIGS = ("pmem", "pcie", "cxl-d", "cxl-b", "cxl")
# Batch size and rows per table (the paper gives neither). Chosen so that every model with
# both logs fits the simulated device of the time (16 MiB; 1 GiB now: one build serves all) and the
# default evaluation runs in the documented time; kept fixed across configurations.
SETUP = {"rm1": {"batch_size": 64, "rows_cap": 2048},
         "rm2": {"batch_size": 16, "rows_cap": 512},
         "rm3": {"batch_size": 64, "rows_cap": 2048},
         "rm4": {"batch_size": 64, "rows_cap": 4096},
         "rm-tiny": {"batch_size": None, "rows_cap": None}}
# --scale paper: batch 512 (DLRM's reference runs use 128-2048; 512 is inside that range and the
# largest whose four models run in a few hours on one 2-core machine) and every preset's whole
# tables (2**16 rows per table for RM1-RM3; RM4's real cardinalities capped at 2**18, smaller
# real tables keep their size), on the 1 GiB simulated device. The sweep adds the batch sizes of
# the sensitivity table. Nothing here is tuned to a paper figure.
PAPER_SETUP = {m: {"batch_size": 512, "rows_cap": None} for m in MODELS}
PAPER_SWEEP = (64, 128, 256)
SCALES = ("default", "paper")
PAPER = {"speedup_cxl_over_pmem_avg": 5.2, "cxl_d_over_pcie": 1.23, "cxl_over_cxl_b": 1.14,
         "energy_saving_vs_pmem": 0.76}
DEFAULT_MLP_PROBE = 4096
# Equal durability (issue 21): every configuration logs the whole MLP every K batches, so all
# recover to the same point. K = 1 is the paper's policy for PMEM, PCIe, CXL-D and CXL-B, and the
# strictest; CXL then copies a whole image per batch in its chunk window. The second table of the
# report keeps each configuration's own policy (CXL over up to MAX_MLP_LAG batches).
DEFAULT_MLP_INTERVAL = 1
DEFAULT_SEEDS = 1
# Labels that depend on the features (sim/model/trace.py step 5), so the losses show learning;
# they change no device cycle (the commands never read labels).
DEFAULT_LABELS = "learnable"


class EvalError(CliError):
    """A bad request (exit 2)."""


def add_eval_parser(sub) -> None:
    p = sub.add_parser("eval", help="the paper's evaluation: 5 configurations x RM1-RM4, on the RTL",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS), help="comma-separated, of " + ",".join(MODELS))
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated, of " + ",".join(CONFIGS))
    p.add_argument("--batches", type=positive_int, default=None,
                   help="training batches per model and order (default 3; with --trace all of the file's)")
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="train on this trace file (one --models entry gives the MLP); see trainingcxl trace import")
    p.add_argument("--seed", type=seed_int, default=1)
    p.add_argument("--json", default="build/eval.json")
    p.add_argument("--report", default=None, help="directory for report.md and the PNG plots")
    p.add_argument("--batch-size", type=positive_int, default=None, help="override every model's batch size")
    p.add_argument("--rows-cap", type=positive_int, default=None, help="override every model's rows per table")
    p.add_argument("--mlp-probe", type=positive_int, default=DEFAULT_MLP_PROBE,
                   help="MLP image lines MLP_LOG copies on the RTL (the whole image's time is scaled)")
    p.add_argument("--scale", choices=SCALES, default="default",
                   help="paper: batch 512 and the presets' whole tables, plus a batch-size sweep "
                        f"({','.join(map(str, PAPER_SWEEP))}) for the sensitivity table; runs for hours")
    p.add_argument("--sweep-batch-sizes", default=None, metavar="B,B,..",
                   help="also simulate these batch sizes for the sensitivity table (default: none; "
                        "with --scale paper: " + ",".join(map(str, PAPER_SWEEP)) + "; '' for none)")
    p.add_argument("--seeds", type=positive_int, default=DEFAULT_SEEDS, metavar="N",
                   help=f"trace seeds --seed .. --seed+N-1 (default {DEFAULT_SEEDS}): every figure also as "
                        "min/median/max over the seeds' steady batches")
    p.add_argument("--labels", choices=("random", "learnable"), default=DEFAULT_LABELS,
                   help=f"generated traces' labels (default {DEFAULT_LABELS}: a function of the dense features)")
    p.add_argument("--mlp-interval", type=positive_int, default=DEFAULT_MLP_INTERVAL, metavar="K",
                   help="equal durability: every configuration logs the whole MLP every K batches "
                        f"(default {DEFAULT_MLP_INTERVAL}); each configuration's own policy is reported too")
    add_shard_options(p, "models x orders x sweep batch sizes")
    p.add_argument("--recompose", metavar="JSON[,JSON..]", default=None,
                   help="no simulation: compose the runs stored in earlier eval JSONs (several: their models "
                        "merged) with the current parameters")
    p.set_defaults(func=main)


def _split(text: str, allowed: tuple[str, ...], what: str) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in items if x not in allowed]
    if bad or not items:
        raise EvalError(f"unknown {what} {', '.join(bad) or '(none given)'}; choose from {', '.join(allowed)}")
    return list(dict.fromkeys(items))


def check_request(args) -> tuple[list[str], list[str]]:
    from sim.model.dlrm import PRESETS
    trace = getattr(args, "trace", None)
    models = _split(args.models, tuple(PRESETS) if trace else MODELS + EXTRA_MODELS, "model")
    configs = _split(args.configs, CONFIGS, "configuration")
    if trace:
        if len(models) != 1:
            raise EvalError(f"--trace: models: one --models entry (the MLP of the file's tables), got {len(models)}")
        for flag, value in (("--rows-cap", args.rows_cap), ("--batch-size", args.batch_size)):
            if value is not None:
                raise EvalError(f"{flag} applies to a generated trace; with --trace the file fixes it "
                                f"(re-import with {flag})")
        if getattr(args, "seeds", 1) > 1:
            raise EvalError("--seeds applies to generated traces; a --trace file is one trace")
    elif args.batches is None:
        args.batches = 3
    args.sweep = parse_sweep(args)
    if args.batches is not None and args.batches < 1:
        raise EvalError(f"--batches must be >= 1, got {args.batches}")
    for name in ("batch_size", "rows_cap", "mlp_probe"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise EvalError(f"--{name.replace('_', '-')} must be >= 1, got {v}")
    return models, configs


def parse_sweep(args) -> list[int]:
    """The extra batch sizes of the sensitivity sweep (--sweep-batch-sizes, or PAPER_SWEEP)."""
    text = getattr(args, "sweep_batch_sizes", None)
    paper = getattr(args, "scale", "default") == "paper"
    if getattr(args, "trace", None) and (text is not None or paper):
        raise EvalError(f"{'--scale paper' if paper else '--sweep-batch-sizes'} applies to generated traces; "
                        "a --trace file fixes the batch size and rows")
    if text is None:
        return list(PAPER_SWEEP) if paper else []
    if not text.strip():                    # given empty: no sweep, even with --scale paper
        return []
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        sizes = []
    if not sizes or any(b < 1 for b in sizes):
        raise EvalError(f"--sweep-batch-sizes takes a comma list of positive batch sizes, got {text!r}")
    return sorted(set(sizes))


def knobs_of(model: str, args) -> dict:
    bound = getattr(args, "bound_traces", {}).get(model)
    if bound is not None:
        return {"batch_size": bound[1].batch_size, "rows_cap": None}
    s = (PAPER_SETUP if getattr(args, "scale", "default") == "paper" else SETUP)[model]
    return {"batch_size": args.batch_size or s["batch_size"], "rows_cap": args.rows_cap or s["rows_cap"],
            "labels": getattr(args, "labels", DEFAULT_LABELS)}


def check_fits(model: str, args) -> None:
    """Raise EvalError (saying what does not fit) before any simulation when the model's
    layout does not fit the default simulation device."""
    from hw.config import DeviceConfig
    from sim.bfm.gpu_agent import mlp_image_lines
    from sim.bfm.ndp_host import LayoutError
    from sim.model.dlrm import get_preset
    from sim.model.trace import TraceKnobs, generate_trace
    from sim.tb.ckpt_run import plan_checkpoint_layout
    from sim.tb.ndp_run_tb import HOST_MEMORY_MIN_LINE
    from tools.trace_source import TraceSourceError, diagnose_fit
    k = knobs_of(model, args)
    bound = getattr(args, "bound_traces", {}).get(model)
    cfg = DeviceConfig.for_simulation()
    probe = min(args.mlp_probe, mlp_image_lines(model))
    if bound is not None:
        try:
            diagnose_fit(lambda tr: plan_checkpoint_layout(tr, cfg.capacity_lines, HOST_MEMORY_MIN_LINE, probe),
                         bound[1])
        except TraceSourceError as e:
            raise EvalError(f"{e} (eval runs on the {cfg.capacity_bytes >> 20} MiB simulated device)") from None
        return
    trace = generate_trace(get_preset(model), args.batches, args.seed, TraceKnobs(**k))
    try:
        plan_checkpoint_layout(trace, cfg.capacity_lines, HOST_MEMORY_MIN_LINE, probe)
    except LayoutError as e:
        raise EvalError(f"{model} at batch size {k['batch_size']}, rows cap {k['rows_cap']} does not fit the "
                        f"{cfg.capacity_bytes >> 20} MiB simulated device: {e}") from None


def run_order(model: str, order: str, args) -> dict:
    k = knobs_of(model, args)
    env = {"TCXL_EVAL_MODEL": model, "TCXL_EVAL_ORDER": order, "TCXL_EVAL_BATCHES": str(args.batches),
           "TCXL_EVAL_MLP_PROBE": str(args.mlp_probe), "TCXL_SEED": str(args.seed)}
    env.update({f"TCXL_EVAL_{key.upper()}": str(v) for key, v in k.items() if v is not None})
    bound = getattr(args, "bound_traces", {}).get(model)
    if bound is not None:
        env["TCXL_EVAL_TRACE"] = str(bound[0])
    t0 = time.perf_counter()
    print(f"[eval] {model} {order}: training {args.batches} batches on the RTL "
          f"(batch size {k['batch_size'] or 'preset'}, rows cap {k['rows_cap'] or 'preset'})...",
          file=sys.stderr, flush=True)
    try:
        res = run_harness_test("training_eval", env, "sim.tb.eval_tb",
                               label=f"training_eval-{model}-{order}-b{k['batch_size'] or 'preset'}")
    except NoResult as e:
        res = {"verified": False, "error": str(e)}
    state = "verified" if res.get("verified") else f"FAILED: {res.get('error', '?')[:300]}"
    print(f"[eval] {model} {order}: {state} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    return res


def steady(values: list[float]) -> float:
    vals = values[1:] if len(values) > 1 else values
    return sum(vals) / len(vals)


def steady_batches(run: dict) -> list[int]:
    """The batches a steady-state figure counts: 1..N-1, or batch 0 alone when N = 1."""
    n = len(run["commands"])
    return list(range(1, n)) if n > 1 else [0]


def measured_of(exact: dict | None, relaxed: dict | None, order: str, batch: int | None = None):
    """``Measured`` and ``Workload`` for one order from the runs' per-batch figures: the mean
    over the steady batches (``batch`` None) or one batch's own figures."""
    from sim.model.system_timing import Measured, Workload
    run = exact if order == "exact" else relaxed
    cmds = run["commands"]
    rel_cmds = relaxed["commands"] if relaxed is not None and relaxed.get("commands") else []

    def pick(key, source):
        vals = [c[key] for c in source if key in c and (batch is None or c.get("batch", -1) == batch)]
        if batch is None:
            return steady(vals) if key != "lookup_relaxed" else (sum(vals) / len(vals) if vals else None)
        return vals[0] if vals else None
    rel_lookup = pick("lookup_relaxed", rel_cmds)
    lookup = pick("lookup", cmds)
    lookup = rel_lookup if lookup is None else lookup
    m = Measured(run["clock_mhz"], lookup, rel_lookup if rel_lookup is not None else lookup, pick("log", cmds),
                 pick("update", cmds), pick("mlp_log", cmds), run["mlp_probe_lines"])
    wl = run["workload"] if batch is None else [run["workload"][batch]]
    w = Workload(run["batch_size"], *(round(steady([b[key] for b in wl])) for key in
                                      ("lookups", "lookup_lines", "unique_rows", "unique_lines", "output_bytes")),
                 run["image_lines"], table_lines=table_lines_of(run),
                 mlp_params=run.get("mlp_params") or 16 * run["image_lines"])   # runs stored before: within a line
    return m, w


def table_lines_of(run: dict) -> int:
    """The lines of every table of a run (``table_lines``, written by sim/tb/eval_tb.py; for a
    run stored before it, from the preset and the rows cap; 0 when neither is known)."""
    if run.get("table_lines"):
        return int(run["table_lines"])
    from sim.model.dlrm import get_preset
    try:
        preset = get_preset(run["model"])
    except (KeyError, ValueError):
        return 0
    if run.get("rows_cap"):
        preset = preset.with_rows_cap(run["rows_cap"])
    return sum(t.rows * (t.dim // 16) for t in preset.tables)


def compose_model(model: str, configs: list[str], runs: dict,
                  mlp_interval: int = DEFAULT_MLP_INTERVAL) -> list[dict]:
    """One result per configuration: batch time, breakdown, timeline and energy with every
    configuration logging the MLP every ``mlp_interval`` batches (equal durability), and the
    same under each configuration's own MLP-log policy (``own_policy``)."""
    from sim.model.system_params import DEFAULT_PARAMS
    from sim.model.system_timing import compose
    from tools.eval_sensitivity import gpu_mlp_timing
    out = []
    for config in configs:
        order = "relaxed" if config == "cxl" else "exact"
        run = runs.get(order) or {}
        entry = {"model": model, "config": config, "order": order, "verified": bool(run.get("verified")),
                 "trace_source": run.get("trace_source"),
                 "batches": run.get("batches"), "batch_size": run.get("batch_size"), "rows_cap": run.get("rows_cap"),
                 "clock_mhz": run.get("clock_mhz"), "loss": run.get("losses", [])}
        if run.get("error"):
            entry["error"] = run["error"]
        if run.get("commands"):
            m, w = measured_of(runs.get("exact"), runs.get("relaxed"), order)
            mlp = gpu_mlp_timing(model, w.batch_size, m.clock_mhz, DEFAULT_PARAMS)
            r = compose(config, w, m, mlp, mlp_interval=mlp_interval)
            own = compose(config, w, m, mlp)
            # The same batch without any MLP log: how much of the difference the MLP image makes.
            no_mlp_log = compose(config, dataclasses.replace(w, image_lines=0), m, mlp).batch_time_ms
            entry.update(batch_time_ms=r.batch_time_ms, breakdown_ms=r.breakdown_ms, timeline=r.timeline,
                         energy_mj=r.energy_mj, energy_breakdown_mj=r.energy_breakdown_mj, **r.extra,
                         measured_cycles={"lookup": m.lookup_cycles, "lookup_relaxed": m.lookup_relaxed_cycles,
                                          "log": m.log_cycles, "update": m.update_cycles,
                                          "mlp_log_probe": m.mlp_probe_cycles, "mlp_probe_lines": m.mlp_probe_lines},
                         workload=w.__dict__, gpu_mlp_ms=mlp.seconds * 1e3,
                         batch_time_ms_without_mlp_log=no_mlp_log, mlp_interval=mlp_interval,
                         own_policy={"batch_time_ms": own.batch_time_ms, "breakdown_ms": own.breakdown_ms,
                                     "energy_mj": own.energy_mj, **own.extra})
        out.append(entry)
    base = next((e.get("batch_time_ms") for e in out if e["config"] == "pmem"), None)
    base_no = next((e.get("batch_time_ms_without_mlp_log") for e in out if e["config"] == "pmem"), None)
    base_own = next((e["own_policy"]["batch_time_ms"] for e in out if e["config"] == "pmem" and "own_policy" in e),
                    None)
    for e in out:
        if base and e.get("batch_time_ms"):
            e["speedup_vs_pmem"] = base / e["batch_time_ms"]
            e["speedup_vs_pmem_without_mlp_log"] = base_no / e["batch_time_ms_without_mlp_log"]
            e["own_policy"]["speedup_vs_pmem"] = base_own / e["own_policy"]["batch_time_ms"]
    return out


def eval_seeds(args) -> list[int]:
    """The trace seeds: --seed, then the next --seeds - 1 integers."""
    return [args.seed + i for i in range(getattr(args, "seeds", 1))]


def simulation_units(args, models: list[str], configs: list[str]) -> list[tuple]:
    """The independent simulations: (key, model, order, args) for the main runs (key None), the
    further seeds' runs (key ``("seed", S)``) and each sweep batch size other than theirs (key
    the batch size as a string; first seed only), in the order results are merged."""
    from sim.model.dlrm import get_preset
    orders = [o for o, need in (("exact", any(c != "cxl" for c in configs)), ("relaxed", "cxl" in configs)) if need]
    plans = [(None, args)]
    plans += [(("seed", s), argparse.Namespace(**{**vars(args), "seed": s})) for s in eval_seeds(args)[1:]]
    for b in args.sweep:
        if any((knobs_of(m, args)["batch_size"] or get_preset(m).batch_size) != b for m in models):
            plans.append((str(b), argparse.Namespace(**{**vars(args), "batch_size": b})))
    return [(key, model, order, a) for key, a in plans for model in models for order in orders]


def run_unit(unit: tuple) -> dict:
    """One simulation unit (``simulation_units``); module level so Ray can ship it."""
    _, model, order, args = unit
    return run_order(model, order, args)


def unit_name(unit: tuple) -> str:
    key, model, order, _ = unit
    if isinstance(key, tuple):
        return f"{model} {order} (seed {key[1]})"
    return f"{model} {order}" + (f" (sweep batch {key})" if key else "")


def simulate(args, models: list[str], configs: list[str]) -> tuple[dict, dict, dict]:
    """(runs, sweep_runs, seed_runs): {model: {order: training_eval result}}, {batch size: such
    runs} and {seed: such runs} for the seeds after the first.
    Without Ray, two simulations run side by side (2 cores); with ``--workers N`` (N > 1) or
    ``--ray-address``, every unit is a Ray task (tools/shard.py). Either way the merged result
    is the same: results are placed by unit, not by finishing order."""
    from tools.shard import run_units
    units = simulation_units(args, models, configs)
    workers, address = getattr(args, "workers", 1), getattr(args, "ray_address", None)
    if workers > 1 or address:
        results = run_units(units, run_unit, workers=workers, ray_address=address, label="eval", name=unit_name)
    else:
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            results = list(pool.map(run_unit, units))
    runs: dict = {}
    sweep_runs: dict = {}
    seed_runs: dict = {}
    for (key, model, order, _), res in zip(units, results):
        if key is None:
            into = runs
        elif isinstance(key, tuple):
            into = seed_runs.setdefault(str(key[1]), {})
        else:
            into = sweep_runs.setdefault(key, {})
        into.setdefault(model, {})[order] = res
    return runs, sweep_runs, seed_runs


NOTES = [
    "Device command cycles are measured on the RTL (completion NDP_LAST_CYCLES); links, GPU MLP time, host "
    "CPU and software costs are composed around them (sim/model/system_timing.py).",
    "MLP_LOG copies a probe of the MLP image on the RTL (the whole image would add millions of simulated "
    "cycles per batch) and the whole image's copy time is the measured per-line time times the image lines.",
    "PMEM: the host computes the golden model's embedding operators, so its 'verified' is the exact-order run's.",
    "Steady state: the mean of batches 1..N-1 (batch 0 warms up).",
]


def compose_all(runs: dict, models: list[str], configs: list[str], meta: dict,
                mlp_interval: int = DEFAULT_MLP_INTERVAL) -> dict:
    from sim.model.system_params import describe
    from tools.eval_assumptions import assumption_rows
    from tools.eval_fairness import fairness_rows
    from tools.eval_sensitivity import sensitivity
    from tools.eval_stats import ratio_stats, result_stats
    results = []
    sources = meta.get("trace_sources") or {}
    runs_by_seed = {str(meta.get("seed")): runs, **(meta.get("seed_runs") or {})}
    for model in models:
        entries = compose_model(model, configs, runs[model], mlp_interval)
        stats = result_stats(runs_by_seed, model, configs, mlp_interval)
        for e in entries:
            if e["config"] in stats:
                e["stats"] = stats[e["config"]]
        results += entries
    for r in results:           # the command's record (file and input hashes) over the bench's short one
        r["trace_source"] = sources.get(r["model"]) or r.get("trace_source")
    clock = next((r.get("clock_mhz") for r in results if r.get("clock_mhz")), 500)
    by_batch = {str(b): r for b, r in (meta.get("sweep_runs") or {}).items()}
    if by_batch:                # the main runs are one more point of the batch-size sweep
        main_b = next((r.get("batch_size") for r in results if r.get("batch_size")), None)
        if main_b is not None:
            by_batch.setdefault(str(main_b), runs)
    first = next((r for m in models for r in runs[m].values() if r.get("commands")), None)
    return {"results": results,
            "statistics": {"seeds": [int(s) if s.isdigit() else s for s in runs_by_seed], "mlp_interval": mlp_interval,
                           "steady_batches": steady_batches(first) if first else [],
                           "samples": "every (seed, steady batch), each composed alone",
                           "ratios": ratio_stats(runs_by_seed, models, mlp_interval)},
            "sensitivity": sensitivity(runs, models, by_batch),
            "fairness": fairness_rows(runs, models, mlp_interval),
            "assumptions": assumption_rows(runs, models, mlp_interval),
            "meta": {**meta, "models": models, "configs": configs, "clock_mhz": clock, "paper": PAPER,
                     "mlp_interval": mlp_interval,
                     "notes": NOTES, "params": describe(), "runs": runs}}


def load_stored_runs(spec: str) -> tuple[dict, list[str], list[str], dict]:
    """(runs, models, configs, meta) of one eval JSON, or of several (comma list: e.g. models
    evaluated by separate commands) merged: same batches, seed and configurations; each model
    in one file only; sweep runs merged per batch size."""
    merged = None
    for name in [x for x in spec.split(",") if x]:
        try:
            old = json.loads(pathlib.Path(name).read_text())
            runs, models, configs = old["meta"]["runs"], old["meta"]["models"], old["meta"]["configs"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise EvalError(f"--recompose {name}: not an eval JSON with stored runs ({e})") from None
        # sweep_runs stay in meta: the sensitivity table is composed again from them too
        meta = {k: v for k, v in old["meta"].items() if k not in ("runs", "params", "notes", "paper")}
        if merged is None:
            merged = (dict(runs), list(models), list(configs), meta)
            continue
        m_runs, m_models, m_configs, m_meta = merged
        for key in ("batches", "seed", "seeds"):
            if meta.get(key) != m_meta.get(key):
                raise EvalError(f"--recompose {name}: {key} {meta.get(key)} differs from the first file's "
                                f"{m_meta.get(key)}")
        if configs != m_configs:
            raise EvalError(f"--recompose {name}: configurations {','.join(configs)} differ from the first "
                            f"file's {','.join(m_configs)}")
        if set(models) & set(m_models):
            raise EvalError(f"--recompose {name}: model(s) {','.join(sorted(set(models) & set(m_models)))} "
                            f"already in an earlier file")
        m_runs.update(runs)
        m_models += models
        for key in ("sweep_runs", "seed_runs"):          # per batch size / per seed, by model
            for b, more in (meta.get(key) or {}).items():
                m_meta.setdefault(key, {}).setdefault(b, {}).update(more)
        for key in ("setup", "trace_sources"):
            m_meta.setdefault(key, {}).update(meta.get(key) or {})
        m_meta["wall_seconds"] = (m_meta.get("wall_seconds") or 0) + (meta.get("wall_seconds") or 0)
    if merged is None:
        raise EvalError("--recompose: no file given")
    return merged


def evaluate(args) -> dict:
    if args.recompose:
        runs, models, configs, meta = load_stored_runs(args.recompose)
        print(f"[eval] recomposing the runs in {args.recompose} with the current parameters",
              file=sys.stderr, flush=True)
        return compose_all(runs, models, configs, meta, getattr(args, "mlp_interval", DEFAULT_MLP_INTERVAL))
    models, configs = check_request(args)
    with tempfile.TemporaryDirectory() as tmp:
        sources = bind_traces(args, models, pathlib.Path(tmp))
        for model in models:
            check_fits(model, args)
        for b in args.sweep:                # every sweep point fits too, before anything runs
            for model in models:
                check_fits(model, argparse.Namespace(**{**vars(args), "batch_size": b}))
        t0 = time.perf_counter()
        runs, sweep_runs, seed_runs = simulate(args, models, configs)
    meta = {"batches": args.batches, "seed": args.seed, "seeds": eval_seeds(args), "scale": args.scale,
            "setup": {m: knobs_of(m, args) for m in models},
            "mlp_probe_lines": args.mlp_probe, "wall_seconds": round(time.perf_counter() - t0, 1),
            "trace_sources": sources}
    if sweep_runs:
        meta["sweep_runs"] = sweep_runs
    if seed_runs:
        meta["seed_runs"] = seed_runs
    return compose_all(runs, models, configs, meta, getattr(args, "mlp_interval", DEFAULT_MLP_INTERVAL))


def bind_traces(args, models: list[str], tmp: pathlib.Path) -> dict:
    """{model: source record}; with --trace the file bound to the model is written to ``tmp``
    and kept in ``args.bound_traces`` ({model: (path, trace)}) for the runs."""
    from sim.model.trace import TraceKnobs, write_trace
    from tools.trace_source import generated_source, load_bound_trace
    args.bound_traces = {}
    if not getattr(args, "trace", None):
        return {m: generated_source(m, args.seed, TraceKnobs(**knobs_of(m, args))) for m in models}
    model = models[0]
    try:
        _, trace, source = load_bound_trace(args.trace, model, args.batches)
    except ValueError as e:             # TraceSourceError, TraceFormatError
        raise EvalError(str(e)) from None
    args.batches = len(trace.batches)
    args.bound_traces[model] = (write_trace(tmp / "trace.npz", trace), trace)
    return {model: source}


def main(args) -> int:
    from tools.eval_report import text_table, write_report
    result = evaluate(args)             # an EvalError is a CliError: one line, exit status 2
    write_json(args.json, result)
    print(text_table(result))
    if result.get("sensitivity"):
        from tools.eval_sensitivity import text_rows
        print("\n".join(["sensitivity (geomean over the models):"] + text_rows(result["sensitivity"])))
    if result.get("fairness"):
        from tools.eval_fairness import text_rows as fairness_text
        print("\n".join(["fairness ablation (geomean over the models; each earlier modelling choice alone):"]
                        + fairness_text(result["fairness"])))
    if args.report:
        for path in write_report(result, pathlib.Path(args.report)):
            print(f"wrote {path}")
    ok = all(r["verified"] for r in result["results"])
    return 0 if ok else 1

