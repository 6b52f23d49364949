"""``trainingcxl crash``: the power-failure campaign on the RTL, JSON + table.

  trainingcxl crash --model M --points N --seed S --json FILE
                    [--phases lookup,logging,...] [--schedule cxl-b|cxl-d] [--mlp-spread K]
                    [--rows-cap R] [--batch-size B] [--chunk-points K [--workers N | --ray-address A]]
  trainingcxl crash --model M --trace FILE --points N ...
  trainingcxl crash --exhaustive [--boundaries A:B] [--stride S] [--classes C,..] [--offsets -1,0,1]
                    [--target-batch K] [--rows-cap R] [--batch-size B] --seed S --json FILE

``--exhaustive`` (env TCXL_CRASH_EXHAUSTIVE=1 for the test bench; sim/tb/crash_exhaustive.py
has the details): instead of random points, one batch (K, default 2) is recorded with every
media write acknowledgement (its persist boundaries: log entries, records, row write-backs,
MLP image lines, completions, ring writes), then power is cut at each boundary's ack edge plus
each offset (default -1, 0, +1 edges: torn in flight, just durable, one edge after), each
time from the same state before K, and every recovery is checked as in the campaign.
``--boundaries A:B`` takes a slice of the boundary ordinals (the way to shard the long run),
``--stride S`` every S-th of them, ``--classes C,..`` only boundaries of those classes.
Its JSON keys: ``boundaries``, ``boundaries_by_class``,
``batch_edges``, ``selected``, ``cuts``, ``consistent``, ``inconsistent``,
``lost_acknowledged_writes``, ``lost_durable_records``, ``recovered_batches``,
``unverified_cuts``, ``rerecord_matches``, ``failures``, ``verified``, ``protocol_violations``,
``sim_cycles``, ``wall_seconds``, ``model``, ``seed``, ``schedule``, ``target_batch``,
``offsets``, ``slice``, ``stride``, ``error``. Default trace knobs: batch size 4, rows cap 64.

``--trace FILE``: the campaign trains on the file's batches (cycled: batch k is file batch
k % n) instead of 4 generated ones; --model gives the MLP; conflicts are one-line errors naming
the field (tools/trace_source.py). ``trace_source`` in the JSON says which trace ran.

``--mlp-spread K`` (default 1): the relaxed MLP log. The image is copied in K chunks, one
MLP_LOG per batch (chunk j in the copy's batch j; the MLP_LOGGED record comes with the last
chunk and names the copy's first batch). Recovery must then restore, bit for bit, chunk j as
the GPU's image while batch (named batch + j) ran: the patchwork of versions the relaxed log
keeps. The tables are checked as always. ``mlp_spread`` in the JSON says which ran.

Trains a DLRM model through the device (LOOKUP, LOG, MLP_LOG over CXL.cache, checkpointed
UPDATE per batch), cuts power N times at chosen points (every phase in turn: lookup,
logging, flag_write, update, mlp_log, release, recovery), recovers with RECOVER after each
cut and checks the tables and the MLP log against the golden model, then resumes; the
campaign is sim/tb/crash_tb.py (its docstring has the details).

``--chunk-points K``: the N points run as chunks of K, each its own simulation (it trains from
scratch) with a seed derived from --seed (chunk 0 keeps --seed itself, so one chunk is the
unchunked campaign); the result sums the chunks in chunk order and lists them under ``chunks``
(seed, points, verified, sim_cycles); ``failures`` carry their ``chunk``. ``--workers N`` runs
the chunks N at a time on a local Ray instance, ``--ray-address A`` on a cluster
(tools/shard.py): the JSON is the same as the serial run's but for ``wall_seconds``.

JSON keys (the contract): ``points`` (points run), ``consistent`` / ``inconsistent``,
``lost_acknowledged_writes`` (acknowledged UPDATEs / MLP logs a recovery lost),
``phases_hit`` (phase -> cuts that landed in it; ``idle`` = between commands),
``phases_aimed``, ``all_phases_hit``, ``cuts`` (a recovery point cuts twice), ``rolled_back``
(recoveries that rolled a batch back), ``mlp_logs_checked`` (recoveries that found a complete
MLP log and compared it), ``mlp_spread``, ``batches_trained``, ``failures`` (the first
inconsistent point's problems; the campaign stops there), ``verified`` (every point
consistent, the final tables equal the golden model, no protocol violation), ``seed``,
``model``, ``schedule``, ``sim_cycles``, ``wall_seconds``, ``error``, ``trace_source``.

The model must fit the default simulation device (1 GiB) with both logs: rm-tiny does, and
so do rm1 and rm4 with their whole MLP images (68-142 MB), but a batch of theirs is millions
of simulated cycles (minutes each); rm2 does not fit.
"""
from __future__ import annotations

import argparse
import pathlib
import random
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sim.tb.crash_tb import PHASES  # noqa: E402
from tools.cli_args import CliError, add_shard_options, non_negative_int, positive_int, seed_int  # noqa: E402
from tools.harness_run import write_json  # noqa: E402

EXHAUSTIVE_KEYS = ("verified", "model", "schedule", "seed", "target_batch", "boundaries", "selected", "cuts",
                   "consistent", "inconsistent", "lost_acknowledged_writes", "lost_durable_records",
                   "unverified_cuts", "rerecord_matches", "batch_edges", "sim_cycles", "wall_seconds", "error")
EXHAUSTIVE_DEFAULTS = {"batch_size": 4, "rows_cap": 64}    # a few hundred boundaries per batch
SUMMARY_KEYS = ("verified", "model", "schedule", "seed", "points", "consistent", "inconsistent",
                "lost_acknowledged_writes", "all_phases_hit", "cuts", "rolled_back", "batches_trained",
                "sim_cycles", "wall_seconds", "error")


class CrashError(CliError):
    """A bad request (exit code 2)."""


def check_spread(args) -> None:
    """--mlp-spread K: at most one chunk per image line."""
    from sim.bfm.gpu_agent import mlp_image_lines
    from sim.model.dlrm import get_preset
    try:
        lines = mlp_image_lines(get_preset(args.model))
    except (KeyError, ValueError) as e:
        raise CrashError(str(e)) from None
    if getattr(args, "mlp_spread", 1) > lines:
        raise CrashError(f"--mlp-spread {args.mlp_spread} exceeds the {lines} lines of {args.model}'s MLP image")


def check_fits(args, tmp: pathlib.Path | None = None) -> dict:
    """Plan the checkpointed layout in Python first: a model that does not fit is reported
    before any build. Returns the trace source record; with --trace the file bound to the model
    is written to ``tmp`` and its path kept in ``args.bound_trace``."""
    from hw.config import DeviceConfig
    from sim.bfm.ndp_host import LayoutError
    from sim.model.dlrm import get_preset
    from sim.model.trace import TraceKnobs, generate_trace, write_trace
    from sim.tb.ckpt_run import plan_checkpoint_layout
    from tools.trace_source import diagnose_fit, generated_source, load_bound_trace
    args.bound_trace = None
    if getattr(args, "trace", None):
        for flag, value in (("--rows-cap", args.rows_cap), ("--batch-size", args.batch_size)):
            if value is not None:
                raise CrashError(f"{flag} applies to a generated trace; with --trace the file fixes it")
        cap = DeviceConfig.for_simulation().capacity_lines
        try:
            _, trace, source = load_bound_trace(args.trace, args.model)
            diagnose_fit(lambda tr: plan_checkpoint_layout(tr, cap), trace)
        except ValueError as e:                 # TraceSourceError, TraceFormatError, unknown preset
            raise CrashError(f"{e}") from None
        args.bound_trace = write_trace(tmp / "trace.npz", trace)
        return source
    try:
        preset = get_preset(args.model)
    except (KeyError, ValueError) as e:
        raise CrashError(str(e)) from None
    if preset.optimizer.name != "sgd":
        raise CrashError(f"model {args.model} trains with {preset.optimizer.name}; the device's UPDATE is SGD")
    trace = generate_trace(preset, 4, args.seed, TraceKnobs(rows_cap=args.rows_cap, batch_size=args.batch_size))
    try:
        plan_checkpoint_layout(trace, DeviceConfig.for_simulation().capacity_lines)
    except LayoutError as e:
        raise CrashError(f"{e} (the crash campaign runs on the default simulation device; "
                         f"try --model rm-tiny)") from None
    return generated_source(args.model, args.seed, TraceKnobs(rows_cap=args.rows_cap, batch_size=args.batch_size))


SUMMED = ("points", "consistent", "inconsistent", "lost_acknowledged_writes", "cuts", "rolled_back", "mlp_logs_checked",
          "batches_trained", "sim_cycles", "protocol_violations")


def campaign_units(args) -> list[tuple]:
    """(chunk index, seed, points, args) per chunk of --chunk-points (default: one chunk)."""
    from tools.shard import chunk_counts, chunk_seed
    counts = chunk_counts(args.points, getattr(args, "chunk_points", None))
    return [(k, chunk_seed(args.seed, k, "crash"), n, args) for k, n in enumerate(counts)]


def run_chunk(unit: tuple) -> dict:
    """One chunk of the campaign in its own simulation (module level: a Ray task)."""
    from tools.harness_run import NoResult, run_harness_test
    k, seed, points, args = unit
    env = {"TCXL_SEED": str(seed), "TCXL_CRASH_MODEL": args.model, "TCXL_CRASH_POINTS": str(points),
           "TCXL_CRASH_PHASES": ",".join(args.phases), "TCXL_CRASH_SCHEDULE": args.schedule,
           "TCXL_CRASH_MLP_SPREAD": str(getattr(args, "mlp_spread", 1))}
    for name, value in (("TCXL_CRASH_ROWS_CAP", args.rows_cap), ("TCXL_CRASH_BATCH_SIZE", args.batch_size),
                        ("TCXL_CRASH_TRACE", getattr(args, "bound_trace", None))):
        if value is not None:
            env[name] = str(value)
    try:
        return run_harness_test("crash_campaign", env, "sim.tb.crash_tb", label=f"crash_campaign-{args.seed}-{k}")
    except NoResult as e:
        raise CrashError(str(e)) from None


def merge_chunks(args, units: list[tuple], results: list[dict]) -> dict:
    """One campaign result from its chunks, in chunk order: counts summed, failures listed
    with their chunk, ``chunks`` records each chunk's seed, points and verdict."""
    if len(results) == 1:
        return dict(results[0])
    out = {"model": args.model, "seed": args.seed, "schedule": args.schedule,
           "mlp_spread": getattr(args, "mlp_spread", 1), "verified": all(r.get("verified") for r in results)}
    for key in SUMMED:
        if any(key in r for r in results):
            out[key] = sum(r.get(key, 0) for r in results)
    for key in ("phases_hit", "phases_aimed"):
        out[key] = {}
        for r in results:
            for phase, n in r.get(key, {}).items():
                out[key][phase] = out[key].get(phase, 0) + n
    out["failures"] = [{**f, "chunk": k} for (k, *_), r in zip(units, results) for f in r.get("failures", [])]
    errors = [f"chunk {k} (seed {seed}): {r['error']}" for (k, seed, *_), r in zip(units, results) if r.get("error")]
    if errors:
        out["error"] = errors[0]
    out["chunks"] = [{"chunk": k, "seed": seed, "points": n, "verified": bool(r.get("verified")),
                      "sim_cycles": r.get("sim_cycles")} for (k, seed, n, _), r in zip(units, results)]
    return out


def run_campaign(args) -> dict:
    from tools.shard import ShardError, run_units
    t0 = time.perf_counter()
    units = campaign_units(args)
    print(f"{args.points} power-failure points ({args.schedule}) in {len(units)} chunk(s); progress is logged "
          f"per point", file=sys.stderr, flush=True)
    try:
        results = run_units(units, run_chunk, workers=args.workers, ray_address=args.ray_address,
                            label="crash", name=lambda u: f"chunk {u[0]} (seed {u[1]}, {u[2]} points)")
    except ShardError as e:
        raise CrashError(str(e)) from None
    result = merge_chunks(args, units, results)
    aimed = [p for p in PHASES if p in args.phases]
    result["all_phases_hit"] = all(result["phases_hit"].get(p, 0) > 0 for p in aimed)
    result["verified"] = bool(result.get("verified")) and not result.get("error")
    result["wall_seconds"] = round(time.perf_counter() - t0, 1)
    return result


def run_exhaustive(args) -> dict:
    from tools.harness_run import NoResult, run_harness_test
    t0 = time.perf_counter()
    env = {"TCXL_SEED": str(args.seed), "TCXL_CRASH_MODEL": args.model, "TCXL_CRASH_SCHEDULE": args.schedule,
           "TCXL_CRASH_EXHAUSTIVE": "1", "TCXL_CRASH_EXH_TARGET": str(args.target_batch),
           "TCXL_CRASH_EXH_OFFSETS": args.offsets, "TCXL_CRASH_EXH_BOUNDARIES": args.boundaries,
           "TCXL_CRASH_EXH_STRIDE": str(args.stride),
           "TCXL_CRASH_EXH_CLASSES": args.classes, "TCXL_CRASH_EXH_PROGRESS": str(args.progress),
           "TCXL_CRASH_ROWS_CAP": str(args.rows_cap), "TCXL_CRASH_BATCH_SIZE": str(args.batch_size)}
    print(f"exhaustive persist-point cuts of batch {args.target_batch} (boundaries {args.boundaries}, stride "
          f"{args.stride}, offsets {args.offsets}); progress every {args.progress} cuts", flush=True)
    try:
        # shards of one run share the build directory: each its own results XML
        label = "crash_exhaustive-" + "".join(c if c.isalnum() else "_" for c in f"{args.boundaries}-{args.seed}")
        result = run_harness_test("crash_exhaustive", env, "sim.tb.crash_exhaustive", label=label)
    except NoResult as e:
        raise CrashError(str(e)) from None
    result["verified"] = bool(result.get("verified")) and not result.get("error")
    result["wall_seconds"] = round(time.perf_counter() - t0, 1)
    return result


def check_exhaustive_args(args) -> None:
    if getattr(args, "mlp_spread", 1) != 1:
        raise CrashError("--exhaustive cuts one batch whose MLP_LOG copies the whole image; --mlp-spread is for "
                         "the random campaign")
    if getattr(args, "trace", None):
        raise CrashError("--exhaustive runs on a generated trace (--batch-size, --rows-cap); --trace is not supported")
    for name, value in EXHAUSTIVE_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    try:
        offsets = [int(x) for x in args.offsets.split(",") if x]
        a, b = args.boundaries.split(":")
        _ = (int(a) if a else 0, int(b) if b else 0)
    except ValueError:
        raise CrashError(f"--offsets takes a comma list of integers and --boundaries A:B (either side may be "
                         f"empty); got {args.offsets!r}, {args.boundaries!r}") from None
    if not offsets or args.stride < 1 or args.target_batch < 1:
        raise CrashError("--offsets needs at least one offset, --stride and --target-batch at least 1")


def format_exhaustive(result: dict) -> str:
    rows = {k: result[k] for k in EXHAUSTIVE_KEYS if k in result}
    rows.update({f"class.{k}": v for k, v in result.get("boundaries_by_class", {}).items()})
    rows.update({f"recovered_batches.{k}": v for k, v in result.get("recovered_batches", {}).items()})
    width = max(len(k) for k in rows)
    title = f"trainingcxl crash --exhaustive: {result.get('model')} {result.get('schedule')}"
    lines = [title, "-" * len(title)] + [f"{k:<{width}}  {v}" for k, v in rows.items()]
    for f in result.get("failures", [])[:3]:
        lines += ["", f"INCONSISTENT: {f}"]
    return "\n".join(lines)


def format_result(result: dict) -> str:
    rows = {k: result[k] for k in SUMMARY_KEYS if k in result}
    rows.update({f"phases_hit.{k}": v for k, v in result.get("phases_hit", {}).items()})
    width = max(len(k) for k in rows)
    title = f"trainingcxl crash: {result.get('model')} {result.get('schedule')}, {result.get('points')} points"
    lines = [title, "-" * len(title)] + [f"{k:<{width}}  {v}" for k, v in rows.items()]
    for f in result.get("failures", [])[:3]:
        lines += ["", f"INCONSISTENT point {f['point']} (aimed {f['aimed']}, landed {f['landed']}):"] + \
                 [f"  {p}" for p in f["problems"]]
    return "\n".join(lines)


def cmd_crash(args) -> int:
    """``trainingcxl crash``: the random campaign, or with --exhaustive the enumeration; a bad
    request is one line on stderr and exit status 2."""
    try:
        return cmd_exhaustive(args) if getattr(args, "exhaustive", False) else cmd_campaign(args)
    except CrashError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def cmd_campaign(args) -> int:
    if args.points is None:
        print("error: --points N is required (or --exhaustive)", file=sys.stderr)
        return 2
    args.phases = [p for p in args.phases.split(",") if p]
    unknown = [p for p in args.phases if p not in PHASES]
    if unknown or not args.phases:
        print(f"error: --phases takes a comma list of {', '.join(PHASES)}; got {unknown or 'none'}", file=sys.stderr)
        return 2
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 31)
    print(f"seed {args.seed} (replay with --seed {args.seed})", flush=True)
    check_spread(args)
    with tempfile.TemporaryDirectory() as tmp:
        source = check_fits(args, pathlib.Path(tmp))
        result = run_campaign(args)
    return _report(args, result, source, format_result)


def _report(args, result: dict, source: dict, formatter) -> int:
    """Table on stdout, JSON to --json; exit status 0 only when every point was consistent."""
    result["trace_source"] = source
    print(formatter(result))
    if args.json:
        write_json(args.json, result)
    ok = result["verified"] and not result.get("inconsistent") and not result.get("lost_acknowledged_writes")
    return 0 if ok else 1


def cmd_exhaustive(args) -> int:
    if getattr(args, "workers", 1) > 1 or getattr(args, "ray_address", None) or getattr(args, "chunk_points", None):
        raise CrashError("--workers, --ray-address and --chunk-points apply to the random campaign; shard "
                         "--exhaustive with --boundaries A:B slices")
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 31)
    print(f"seed {args.seed} (replay with --seed {args.seed})", flush=True)
    check_exhaustive_args(args)
    source = check_fits(args)
    return _report(args, run_exhaustive(args), source, format_exhaustive)


def add_crash_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``crash`` on an argparse subparsers object; returns the new parser."""
    p = subparsers.add_parser("crash", help="power-failure campaign: cut, recover, check, resume (JSON)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="rm-tiny", help="DLRM preset (must fit the 1 GiB simulated device)")
    p.add_argument("--points", type=positive_int, default=None,
                   help="power cuts to recover from (the random campaign)")
    p.add_argument("--seed", type=seed_int, default=None, help="campaign, trace and table seed")
    p.add_argument("--json", help="write the result here")
    p.add_argument("--phases", default=",".join(PHASES), help="comma list of phases to aim at (default: all)")
    p.add_argument("--schedule", choices=("cxl-b", "cxl-d"), default="cxl-b",
                   help="when LOG / MLP_LOG run: overlapping the GPU (cxl-b) or after it (cxl-d)")
    p.add_argument("--mlp-spread", type=positive_int, default=1, metavar="K",
                   help="copy the MLP image over K batches, one chunk per batch (the relaxed MLP log); recovery "
                        "must restore chunk j as the GPU's image while the copy's batch j ran (default 1)")
    p.add_argument("--rows-cap", type=positive_int, default=None, help="cap every table at R rows")
    p.add_argument("--batch-size", type=positive_int, default=None, help="samples per batch")
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="train on this trace file's batches (cycled) instead of 4 generated ones")
    p.add_argument("--chunk-points", type=positive_int, default=None, metavar="K",
                   help="split the points into chunks of K, each its own simulation with a seed derived from "
                        "--seed (chunk 0 keeps it); the result merges them in chunk order")
    add_shard_options(p, "the chunks of --chunk-points")
    p.add_argument("--exhaustive", action="store_true",
                   help="cut at every persist boundary (media write ack) of one batch instead of random points")
    p.add_argument("--target-batch", type=non_negative_int, default=2,
                   help="--exhaustive: the batch whose boundaries are cut")
    p.add_argument("--boundaries", default=":", metavar="A:B", help="--exhaustive: a slice of the boundary ordinals")
    p.add_argument("--stride", type=positive_int, default=1, help="--exhaustive: every S-th boundary of the slice")
    p.add_argument("--classes", default="", help="--exhaustive: comma list, only boundaries of these classes "
                   "(log_entry, record_FREE, record_LOGGED, record_APPLIED, record_MLP_LOGGED, mlp_image, "
                   "row_writeback, completion, submission, lookup_output)")
    p.add_argument("--offsets", default="-1,0,1", help="--exhaustive: cut edges relative to each ack edge")
    p.add_argument("--progress", type=positive_int, default=25, help="--exhaustive: log progress every N cuts")
    p.set_defaults(func=cmd_crash)
    return p
