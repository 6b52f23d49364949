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
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass

from tools.harness_run import NoResult, run_harness_test, write_json
from tools.cli_args import positive_int, seed_int


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
    env = {"TCXL_SEED": str(seed), "TCXL_FUZZ_COUNT": str(count)}
    try:
        result = run_harness_test(target.test, env, target.module)
    except NoResult as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
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
    p.set_defaults(func=cmd_fuzz)
    return p
