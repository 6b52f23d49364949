"""What the trace importers (import_criteo.py, import_fbgemm.py) share.

Contract
--------
``TraceImportError`` is the one error an importer raises for bad input or a bad option; its
message is one line: ``<file>: <line N | member M>: <fault>``. ``open_input(path)`` opens a
file for binary reading, decompressing it when it starts with the gzip magic bytes (1f 8b)
whatever its name. ``file_digest(path)`` is (SHA-256 of the file's bytes as stored, size in
bytes), read in 1 MiB chunks. ``parse_tables(text, count)`` turns ``--tables 0,3,5`` into
a list of table numbers. ``origin(...)`` builds the manifest's ``origin`` object (trace.py).
``base_manifest(...)`` the parts of a manifest that come from the preset (MLP, optimizer).
``pooling_summary(lengths)`` the measured ``pooling`` entry of an imported table.
"""
from __future__ import annotations

import gzip
import hashlib
import pathlib

import numpy as np

from sim.model.dlrm import DlrmPreset
from sim.model.trace import FORMAT, VERSION

GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 20


class TraceImportError(ValueError):
    """Bad input or options for an importer; the message is one line naming file and fault."""


def fail(path, where: str | None, fault: str):
    name = pathlib.Path(path).name
    raise TraceImportError(f"{name}: {where}: {fault}" if where else f"{name}: {fault}")


def is_gzip(path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def open_input(path):
    """Binary file object over the (decompressed) content of ``path``."""
    path = pathlib.Path(path)
    try:
        return gzip.open(path, "rb") if is_gzip(path) else open(path, "rb")
    except OSError as e:
        fail(path, None, f"cannot open ({e.strerror or e})")


def file_digest(path) -> tuple[str, int]:
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def parse_tables(text: str | None, count: int, path) -> list[int]:
    """``--tables`` ("0,3,5"; None = all) -> table numbers in [0, count), in the given order."""
    if text is None:
        return list(range(count))
    try:
        picked = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        fail(path, "--tables", f"{text!r} is not a comma list of table numbers")
    bad = [t for t in picked if not 0 <= t < count]
    if bad or not picked:
        fail(path, "--tables", f"table {bad[0] if bad else '(none)'} not in [0, {count}) (the file has {count})")
    if len(set(picked)) != len(picked):
        fail(path, "--tables", f"{text!r} names a table twice")
    return picked


def origin(fmt: str, path, sha256: str, size: int, options: dict, generated: list[str], **facts) -> dict:
    """The manifest's ``origin`` object (documented in sim/model/trace.py)."""
    return {"format": fmt, "file": pathlib.Path(path).name, "sha256": sha256, "bytes": size,
            "options": dict(sorted(options.items())), "generated": list(generated), **facts}


def base_manifest(preset: DlrmPreset, *, seed: int, batch_size: int, num_batches: int, num_dense: int,
                  tables: list[dict], org: dict) -> dict:
    """A version-1 manifest for an imported trace; MLP widths and optimizer from the preset."""
    return {
        "format": FORMAT, "version": VERSION, "preset": preset.name, "seed": seed,
        "batch_size": batch_size, "num_batches": num_batches, "num_dense": num_dense,
        "has_weights": False, "checkpoint_every": 1,
        "optimizer": {"name": preset.optimizer.name, "lr": preset.optimizer.lr, "eps": preset.optimizer.eps},
        "bottom_mlp": list(preset.bottom_mlp), "top_mlp": list(preset.top_mlp),
        "tables": tables, "generator": None, "origin": org,
    }


def pooling_summary(lengths: np.ndarray) -> dict:
    """Measured bag lengths as a ``pooling`` entry: kind fixed iff every non-empty bag has one length."""
    lengths = np.asarray(lengths, dtype=np.int64)
    nonempty = lengths[lengths > 0]
    mean = float(nonempty.mean()) if nonempty.size else 0.0
    fixed = nonempty.size == 0 or bool(np.all(nonempty == nonempty[0]))
    return {"kind": "fixed" if fixed else "normal", "mean": int(round(mean)),
            "std": float(nonempty.std()) if nonempty.size else 0.0,
            "max_len": int(lengths.max()) if lengths.size else 0,
            "empty_prob": float(np.mean(lengths == 0)) if lengths.size else 0.0}
