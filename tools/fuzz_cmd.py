"""``trainingcxl fuzz``: seeded adversarial traffic against the device, JSON + table.

  trainingcxl fuzz --target cxl-mem   --messages N --seed S --json FILE
  trainingcxl fuzz --target cxl-cache --messages N --seed S --json FILE
  trainingcxl fuzz --target ndp       --commands N --seed S --json FILE

Each target is one cocotb test on the simulation harness (``TARGETS`` below names it): it
reads TCXL_SEED, TCXL_FUZZ_COUNT (messages or commands) and TCXL_RESULT_JSON, drives legal
and illegal traffic mixed, checks everything with the protocol monitors and the scoreboards,
and writes its result. The test module's docstring says what it generates and checks.

JSON keys (the contract; every target): ``target``, ``seed``, the count key (``messages`` or
``commands``), ``hangs`` (requests or commands without an answer within the bounded drain),
``mismatches`` (answers that differ from the golden model, bit for bit), ``protocol_violations``
(the CXL monitors' count), ``sim_cycles``, ``wall_seconds``, ``clean`` (no error, and every
key of the target's ``must_be_zero`` is 0), ``error`` (when the run failed), plus per-target
counts (``opcodes`` for cxl-mem, ``rejected`` / ``table_bytes_changed_by_rejected`` /
``errors`` for ndp, ...). Exit status 0 when clean, 1 when not, 2 on a bad argument.

``--chunk K`` runs the count as chunks of K, each its own simulation (seed derived from --seed;
chunk 0 keeps it), merged in chunk order (counts summed, per-second rates dropped, ``chunks``
lists each); ``--workers N`` / ``--ray-address A`` run the chunks on Ray (tools/shard.py) with
the same JSON as serially but for ``wall_seconds``.
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass

from tools.harness_run import NoResult, run_harness_test, write_json
from tools.cli_args import add_shard_options, positive_int, seed_int
from tools.shard import ShardError, chunk_counts, chunk_seed, merge_counts, run_units


@dataclass(frozen=True)
class FuzzTarget:
    module: str                     # cocotb test module (sim/tb/)
    test: str                       # cocotb test in it
    count_key: str                  # "messages" or "commands": the CLI flag and the JSON key
    title: str
    must_be_zero: tuple[str, ...]   # result keys that a clean run has at 0
    default_count: int              # without --messages / --commands


COMMON_ZERO = ("hangs", "mismatches", "protocol_violations")

TARGETS = {
    "cxl-mem": FuzzTarget("sim.tb.fuzz_cxl_mem_tb", "fuzz_cxl_mem", "messages",
                          "CXL.mem fuzz (M2S requests and data, every opcode)", COMMON_ZERO, 10_000),
    "cxl-cache": FuzzTarget("sim.tb.fuzz_cxl_cache_tb", "fuzz_cxl_cache", "messages",
                            "CXL.cache fuzz (H2D snoops, responses and data, random timing)",
                            COMMON_ZERO + ("coherence_violations",), 10_000),
    "ndp": FuzzTarget("sim.tb.fuzz_ndp_tb", "fuzz_ndp", "commands",
                      "NDP command fuzz (malformed commands and descriptors among valid ones)",
                      COMMON_ZERO + ("table_bytes_changed_by_rejected", "wrong_error_codes", "wrong_error_info"), 500),
}


def is_clean(target: FuzzTarget, result: dict) -> bool:
    """No error and every ``must_be_zero`` key present and 0 (a missing key is not clean)."""
    return not result.get("error") and all(result.get(k) == 0 for k in target.must_be_zero)


def _format(title: str, result: dict) -> str:
    flat = {k: v for k, v in result.items() if not isinstance(v, (dict, list))}
    width = max(len(k) for k in flat)
    lines = [title, "-" * len(title)] + [f"{k:<{width}}  {v}" for k, v in sorted(flat.items())]
    for name, table in sorted((k, v) for k, v in result.items() if isinstance(v, dict)):
        lines += ["", f"{name}:"] + [f"  {k:<24}  {v}" for k, v in sorted(table.items(), key=str)]
    return "\n".join(lines)


def run_chunk(unit: tuple) -> dict:
    """One chunk: the target's test with the chunk's seed and count (module level: a Ray task)."""
    k, seed, count, name = unit
    target = TARGETS[name]
    try:
        return run_harness_test(target.test, {"TCXL_SEED": str(seed), "TCXL_FUZZ_COUNT": str(count)}, target.module,
                                label=f"{target.test}-{seed}-{k}")
    except NoResult as e:
        raise RuntimeError(str(e)) from None


def merge_chunks(units: list[tuple], results: list[dict]) -> dict:
    """Counts summed over the chunks (tools/shard.py merge_counts), rates dropped (they do not
    add up), ``chunks`` lists each chunk's seed, count and verdict; the first error is kept."""
    merged = merge_counts([{k: v for k, v in r.items() if not k.endswith("_per_second") and k != "error"}
                           for r in results])
    errors = [f"chunk {k} (seed {seed}): {r['error']}" for (k, seed, *_), r in zip(units, results) if r.get("error")]
    if errors:
        merged["error"] = errors[0]
    merged["chunks"] = [{"chunk": k, "seed": seed, "count": n, "error": r.get("error")}
                        for (k, seed, n, _), r in zip(units, results)]
    return merged


def cmd_fuzz(args) -> int:
    target = TARGETS[args.target]
    count = getattr(args, target.count_key)
    other = "commands" if target.count_key == "messages" else "messages"
    if getattr(args, other) is not None:
        print(f"error: --{other} does not apply to --target {args.target} (use --{target.count_key})",
              file=sys.stderr)
        return 2
    if count is None:
        count = target.default_count
    if count < 1:
        print(f"error: --{target.count_key} must be at least 1", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    print(f"seed {seed} (replay with --seed {seed})", flush=True)
    t0 = time.perf_counter()
    units = [(k, chunk_seed(seed, k, "fuzz"), n, args.target)
             for k, n in enumerate(chunk_counts(count, getattr(args, "chunk", None)))]
    try:
        results = run_units(units, run_chunk, workers=getattr(args, "workers", 1),
                            ray_address=getattr(args, "ray_address", None), label="fuzz",
                            name=lambda u: f"chunk {u[0]} (seed {u[1]}, {u[2]} {target.count_key})")
    except ShardError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    result = results[0] if len(results) == 1 else merge_chunks(units, results)
    result.update({"target": args.target, "seed": seed, target.count_key: result.get(target.count_key, count),
                   "wall_seconds": round(time.perf_counter() - t0, 1)})
    result["clean"] = is_clean(target, result)
    print(_format(f"{target.title}, seed {seed}", result))
    if args.json:
        write_json(args.json, result)
    return 0 if result["clean"] else 1


def add_fuzz_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``fuzz`` on an argparse subparsers object; returns the new parser."""
    p = subparsers.add_parser("fuzz", help="adversarial traffic: CXL.mem, CXL.cache or NDP commands (JSON)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--target", required=True, choices=tuple(TARGETS))
    p.add_argument("--messages", type=positive_int, default=None,
                   help="(cxl-mem, cxl-cache) messages to send (default 10000)")
    p.add_argument("--commands", type=positive_int, default=None, help="(ndp) commands to submit (default 500)")
    p.add_argument("--seed", type=seed_int, default=None, help="replay a run")
    p.add_argument("--json", help="write the result here")
    p.add_argument("--chunk", type=positive_int, default=None, metavar="K",
                   help="split the messages / commands into chunks of K, each its own simulation with a seed "
                        "derived from --seed (chunk 0 keeps it); counts are summed in chunk order")
    add_shard_options(p, "the chunks of --chunk")
    p.set_defaults(func=cmd_fuzz)
    return p
