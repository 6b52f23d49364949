"""``trainingcxl trace import``: a workload file of another format -> the project's trace format v1.

  trainingcxl trace import --format fbgemm-pt|criteo-tsv IN -o OUT.npz
                           [--preset P] [--batch-size B] [--batches N] [--tables 0,3,5]
                           [--rows-cap R] [--dim D] [--seed S]

Formats, preprocessing and what each keeps: sim/model/import_criteo.py (Criteo Kaggle /
Terabyte click logs, streamed) and sim/model/import_fbgemm.py (Meta's dlrm_datasets /
FBGEMM TBE request files). ``--preset`` (default kaggle) gives the MLP widths, optimizer,
default batch size and, when its table count matches, rows (Criteo) and dims. The input's
SHA-256, its name and every option land in the manifest's ``origin`` (sim/model/trace.py).

Prints a summary (tables, batches, lookups, unique rows, the input's hash). Exit 0 on
success; 2 on bad input or options, with one line naming the file, the line or member, and
the fault; then nothing is written (the writer renames a temporary file when done).
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.cli_args import positive_int, seed_int  # noqa: E402


FORMATS = ("fbgemm-pt", "criteo-tsv")


def import_trace(args):
    """(manifest, batches) of the input per the options; raises ValueError on bad input."""
    from sim.model.dlrm import get_preset
    from sim.model.import_criteo import import_criteo
    from sim.model.import_fbgemm import import_fbgemm
    from sim.model.import_common import TraceImportError
    path = pathlib.Path(args.input)
    if not path.is_file():
        raise TraceImportError(f"{path}: no such file")
    importer = {"fbgemm-pt": import_fbgemm, "criteo-tsv": import_criteo}[args.format]
    return importer(path, preset=get_preset(args.preset), batch_size=args.batch_size, batches=args.batches,
                    tables=args.tables, rows_cap=args.rows_cap, dim=args.dim, seed=args.seed)


def cmd_import(args) -> int:
    from sim.model.trace import read_trace, summarize, write_trace
    from tools.trace_cmd import lookups_line
    out = pathlib.Path(args.output)
    start = time.perf_counter()
    try:
        manifest, batches = import_trace(args)
        write_trace(out, (manifest, batches))
    except ValueError as e:          # TraceImportError, TraceFormatError, unknown preset
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:             # the output cannot be written (the input's faults are ValueErrors)
        print(f"error: {out}: cannot write ({e.strerror or e})", file=sys.stderr)
        return 2
    elapsed = time.perf_counter() - start
    trace = read_trace(out)
    s, org = summarize(trace), manifest["origin"]
    rows = sum(t["rows"] for t in manifest["tables"])
    unused = org["samples_unused"]
    rest = "the rest not read" if unused is None else f"{unused} dropped"
    print(f"{org['format']} {org['file']} (sha256 {org['sha256'][:16]}..., {org['bytes']} bytes): "
          f"{s['tables']} tables ({rows} rows in all), batch {s['batch_size']}, {s['batches']} batches, "
          f"{org['samples']} samples used, {rest}")
    print(f"{lookups_line(s)}; generated from seed {manifest['seed']}: {', '.join(org['generated']) or 'nothing'}")
    print(f"wrote {out} ({out.stat().st_size} bytes) in {elapsed:.2f} s")
    return 0


def add_import_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("import", help="convert an FBGEMM .pt or a Criteo TSV file to a trace (.npz)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--format", required=True, choices=FORMATS, help="the input's format")
    p.add_argument("input", help="input file (gzip detected by its magic bytes)")
    p.add_argument("-o", "--output", required=True, help="trace file to write (.npz)")
    p.add_argument("--preset", default="kaggle", help="MLP widths, optimizer and defaults (default kaggle)")
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help="samples per batch (default: criteo the preset's, fbgemm the file's)")
    p.add_argument("--batches", type=positive_int, default=None,
                   help="keep the first N batches (default: all whole ones)")
    p.add_argument("--tables", default=None, help="comma list of the tables (features) to keep, in order")
    p.add_argument("--rows-cap", type=positive_int, default=None, help="fold indices into R rows (index %% R)")
    p.add_argument("--dim", type=positive_int, default=None,
                   help="embedding dim of every table (default: the preset's)")
    p.add_argument("--seed", type=seed_int, default=0,
                   help="seed of what the file lacks (fbgemm: dense features, labels; default 0)")
    p.set_defaults(func=cmd_import)
    return p
