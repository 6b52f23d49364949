"""``trainingcxl trace stats``: the access figures that drive near-memory performance, JSON + table.

  trainingcxl trace stats FILE [--json OUT] [--row-cache-kib 256,1024,4096]
  trainingcxl trace stats --preset P [--batches N] [--seed S] [--batch-size B] [--rows-cap R] [--json OUT]
                          [--row-cache-kib ...]

The figures and their definitions: sim/model/trace_stats.py. With ``--preset`` the trace is
generated in memory (as ``trainingcxl trace`` would write it), to check whether a preset has
the skew it claims (``zipf_alpha`` against ``alpha_claimed``). Exit 0, or 2 with one line on
a bad file or option.
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.cli_args import positive_int, seed_int  # noqa: E402


def cmd_stats(args) -> int:
    from sim.model.trace import TraceKnobs, generate_trace, read_trace
    from sim.model.trace_stats import format_stats, trace_stats
    if (args.file is None) == (args.preset is None):
        print("error: trace stats takes a trace FILE or --preset P (one of them)", file=sys.stderr)
        return 2
    try:
        if args.file is not None:
            trace = read_trace(args.file)
        else:
            trace = generate_trace(args.preset, args.batches, args.seed,
                                   TraceKnobs(batch_size=args.batch_size, rows_cap=args.rows_cap))
    except (ValueError, OSError) as e:          # TraceFormatError, unknown preset, bad knob
        print(f"error: {e}", file=sys.stderr)
        return 2
    from sim.model.trace_stats import ROW_CACHE_KIB
    spec = args.row_cache_kib
    try:
        kib = list(ROW_CACHE_KIB) if spec is None else [int(x) for x in spec.split(",") if x]
    except ValueError:
        kib = [0]
    if not kib or min(kib) < 1:
        print(f"error: --row-cache-kib takes a comma list of positive sizes in KiB, got {args.row_cache_kib!r}",
              file=sys.stderr)
        return 2
    stats = trace_stats(trace, kib)
    print(format_stats(stats))
    if args.json:
        from tools.harness_run import write_json
        write_json(args.json, stats)
    else:
        print(json.dumps(stats["total"], sort_keys=True))
    return 0


def add_stats_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("stats", help="rows touched, repeats, reuse and Zipf skew of a trace (JSON + table)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("file", nargs="?", default=None, help="trace file (.npz)")
    p.add_argument("--preset", default=None, help="generate the preset's trace instead of reading a file")
    p.add_argument("--batches", type=positive_int, default=4, help="with --preset: batches (default 4)")
    p.add_argument("--seed", type=seed_int, default=1, help="with --preset: seed (default 1)")
    p.add_argument("--batch-size", type=positive_int, default=None, help="with --preset: samples per batch")
    p.add_argument("--rows-cap", type=positive_int, default=None, help="with --preset: cap every table at R rows")
    p.add_argument("--json", default=None, help="write the full JSON here")
    p.add_argument("--row-cache-kib", default=None, metavar="K,..",
                   help="LRU row-cache sizes to simulate (KiB, comma list; default: "
                        "sim/model/trace_stats.py ROW_CACHE_KIB, 256,1024,4096)")
    p.set_defaults(func=cmd_stats)
    return p
