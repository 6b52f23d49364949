"""Small synthetic input files in the two importable formats (README, "Your own workload").

  python tools/workload_samples.py [--out build/samples] [--lines 512] [--seed 1]

writes ``criteo-sample.txt`` (Criteo Kaggle layout: label, 13 integer dense features, 26
categorical features as 8-digit hex, tab-separated; some fields empty, some dense values
negative, as in the real logs) and ``fbgemm-sample.pt`` (a ``torch.save``d tuple
(indices, offsets, lengths) in TBE layout, int64, as Meta's dlrm_datasets files; needs torch).
Both are synthetic, drawn from the seed (the same seed writes the same bytes); they are not
real data. ``criteo_lines`` and ``tbe_arrays`` are the generators, for tests.
"""
from __future__ import annotations

import pathlib
import sys

import numpy as np

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:        # run as a script: python tools/workload_samples.py
    sys.path.insert(0, str(REPO))

from tools.cli_args import CliParser, positive_int, seed_int  # noqa: E402


def criteo_lines(n: int, seed: int, *, empty_prob: float = 0.05, values_per_feature: int = 5000) -> list[str]:
    """``n`` Criteo-format lines (with the trailing newline)."""
    rng = np.random.default_rng([seed, 0xC7])
    # Per feature a vocabulary of 32-bit hashes; values drawn Zipf-like so some repeat.
    vocab = rng.integers(0, 1 << 32, (26, values_per_feature), dtype=np.uint64)
    out = []
    for _ in range(n):
        label = "1" if rng.random() < 0.25 else "0"
        dense = [("" if rng.random() < empty_prob else str(int(rng.geometric(0.05)) - 2)) for _ in range(13)]
        ranks = np.minimum(rng.zipf(1.3, 26) - 1, values_per_feature - 1)
        cats = ["" if rng.random() < empty_prob else f"{int(vocab[j, r]):08x}" for j, r in enumerate(ranks)]
        out.append("\t".join([label, *dense, *cats]) + "\n")
    return out


def tbe_arrays(tables: int, batch: int, seed: int, *, rows: int = 1000, mean_len: int = 4):
    """(indices, offsets, lengths) int64 numpy arrays in TBE layout, Zipf-skewed rows."""
    rng = np.random.default_rng([seed, 0xFB])
    lengths = rng.integers(0, 2 * mean_len + 1, (tables, batch)).astype(np.int64)
    offsets = np.r_[0, np.cumsum(lengths.reshape(-1))].astype(np.int64)
    perm = rng.permutation(rows)
    indices = perm[np.minimum(rng.zipf(1.2, int(offsets[-1])) - 1, rows - 1)].astype(np.int64)
    return indices, offsets, lengths


def write_fbgemm(path, tables: int, batch: int, seed: int, **kw) -> pathlib.Path:
    import torch
    indices, offsets, lengths = tbe_arrays(tables, batch, seed, **kw)
    torch.save((torch.from_numpy(indices), torch.from_numpy(offsets), torch.from_numpy(lengths)), path)
    return pathlib.Path(path)


def main(argv=None) -> int:
    p = CliParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(REPO / "build" / "samples"), help="output folder (default build/samples)")
    p.add_argument("--lines", type=positive_int, default=512, help="Criteo sample lines (default 512)")
    p.add_argument("--seed", type=seed_int, default=1)
    p.add_argument("--tables", type=positive_int, default=8, help="FBGEMM sample tables (default 8)")
    p.add_argument("--batch", type=positive_int, default=64, help="FBGEMM sample samples per table (default 64)")
    args = p.parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    criteo = out / "criteo-sample.txt"
    criteo.write_text("".join(criteo_lines(args.lines, args.seed)))
    print(f"wrote {criteo} ({args.lines} lines)")
    try:
        fb = write_fbgemm(out / "fbgemm-sample.pt", args.tables, args.batch, args.seed)
        print(f"wrote {fb} ({args.tables} tables x {args.batch} samples)")
    except ImportError:
        print("torch is not installed: no fbgemm-sample.pt (pip install -e '.[oracle]')", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
