"""``trainingcxl trace``: write a seeded DLRM trace file (format: sim/model/trace.py docstring).

  trainingcxl trace --preset P --batches N [--seed S] -o FILE
                    [--rows-cap R] [--batch-size B] [--alpha A] [--pooling fixed|uniform|normal]
                    [--empty-prob p] [--duplicates | --no-duplicates] [--reuse f] [--weights | --no-weights]
  trainingcxl trace import --format fbgemm-pt|criteo-tsv IN -o OUT.npz ...   (tools/trace_import_cmd.py)
  trainingcxl trace stats FILE [--json OUT]                                   (tools/trace_stats_cmd.py)

``add_trace_parser(subparsers)`` registers the subcommand (its handler is ``cmd_trace``);
``cmd_trace(args)`` prints the seed first (a run without --seed draws one, so it can be
replayed), then a short summary: tables, lookups, unique rows, empty bags, file size.
Returns 0 on success, 2 on a bad argument.
"""
from __future__ import annotations

import argparse
import pathlib
import random
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.cli_args import positive_int, seed_int  # noqa: E402


def lookups_line(s: dict) -> str:
    """The lookups / unique rows / empty bags line of a ``summarize`` result."""
    return (f"lookups {s['lookups']}, unique rows {s['unique_rows']} "
            f"({100 * s['unique_share_per_batch']:.1f}% of lookups unique per batch), empty bags {s['empty_bags']}")


def cmd_trace(args) -> int:
    from sim.model.dlrm import PRESETS
    from sim.model.trace import TraceKnobs, generate_trace, summarize, write_trace

    missing = [flag for flag, value in (("--preset", args.preset), ("--batches", args.batches),
                                        ("-o", args.output)) if value is None]
    if missing:
        print(f"error: trace needs {', '.join(missing)} (or a subcommand: import, stats)", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    print(f"seed {seed}", flush=True)
    if args.preset not in PRESETS:
        print(f"error: unknown preset {args.preset!r}; known: {', '.join(PRESETS)}", file=sys.stderr)
        return 2
    try:
        knobs = TraceKnobs(rows_cap=args.rows_cap, batch_size=args.batch_size, alpha=args.alpha,
                           pooling=args.pooling, empty_prob=args.empty_prob, duplicates=args.duplicates,
                           reuse=args.reuse, weights=args.weights)
        start = time.perf_counter()
        trace = generate_trace(args.preset, args.batches, seed, knobs)
        path = write_trace(args.output, trace)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    elapsed = time.perf_counter() - start
    s = summarize(trace)
    m = trace.manifest
    rows = sum(t["rows"] for t in m["tables"])
    print(f"preset {m['preset']}: {s['tables']} tables ({rows} rows in all), batch {s['batch_size']}, "
          f"{s['batches']} batches, optimizer {m['optimizer']['name']} lr {m['optimizer']['lr']}")
    print(lookups_line(s))
    print(f"wrote {path} ({path.stat().st_size} bytes) in {elapsed:.2f} s")
    return 0


def add_trace_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``trace`` on an argparse subparsers object; returns the new parser."""
    p = subparsers.add_parser("trace", help="write a seeded DLRM trace (.npz)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", help="rm1 rm2 rm3 rm4 kaggle terabyte dcnv2 rm-tiny (required)")
    p.add_argument("--batches", type=positive_int, help="number of batches (required)")
    p.add_argument("--seed", type=seed_int, default=None,
                   help="generator seed (default: drawn and printed)")
    p.add_argument("-o", "--output", help="trace file to write (.npz) (required)")
    p.add_argument("--rows-cap", type=positive_int, default=None, help="cap every table at R rows")
    p.add_argument("--batch-size", type=positive_int, default=None, help="samples per batch (default: the preset's)")
    p.add_argument("--alpha", type=float, default=None, help="Zipf alpha of every table (0 = uniform)")
    p.add_argument("--pooling", choices=("fixed", "uniform", "normal"), default=None,
                   help="bag-length distribution of every table (default: per table from the preset)")
    p.add_argument("--empty-prob", type=float, default=None, help="probability that a bag is empty")
    p.add_argument("--duplicates", action=argparse.BooleanOptionalAction, default=True,
                   help="allow the same row twice in a bag (default: yes)")
    p.add_argument("--reuse", type=float, default=0.0, help="fraction of indices reused from the previous batch")
    p.add_argument("--weights", action=argparse.BooleanOptionalAction, default=None,
                   help="store per-index weights (default: iff a table pools weighted_sum)")
    p.set_defaults(func=cmd_trace)
    sub = p.add_subparsers(dest="trace_command", metavar="{import,stats}")
    from tools.trace_import_cmd import add_import_parser
    from tools.trace_stats_cmd import add_stats_parser
    add_import_parser(sub)
    add_stats_parser(sub)
    return p
