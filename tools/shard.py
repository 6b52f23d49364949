"""Run independent work units one after another or on Ray; results in unit order.

  run_units(units, fn, *, workers=1, ray_address=None, label="units", name=str) -> list

- ``fn(unit)`` for every unit; the list of results is in the order of ``units`` whatever the
  order in which they finish, so a merged result does not depend on scheduling.
- Serial (``workers`` <= 1 and no ``ray_address``): in this process, Ray not imported.
- Otherwise on Ray: a local instance with ``workers`` CPUs (started here, shut down at the end),
  or the cluster at ``ray_address`` (``ray start --head`` prints it; every node must hold this
  repository at the same path with the same environment). One task per unit, one CPU each (a
  unit runs a simulator subprocess). ``fn`` must be a module-level function and units and
  results picklable.
- Progress on stderr after every unit: ``[label] 3/8 done, 41 s elapsed, ~68 s left``.
- A unit that raises ends the run with ``ShardError`` naming the unit (``name(unit)``); the
  units still running on Ray are cancelled.

Helpers for chunked campaigns: ``chunk_seed(seed, k, what)`` (chunk 0 keeps ``seed``, so one
chunk is the unchunked run; the others derive theirs by SHA-256), ``chunk_counts(total, size)``
and ``merge_counts(results)`` (numbers summed, dicts merged key by key, lists concatenated,
other values from the first result).
"""
from __future__ import annotations

import os
import pathlib
import sys
import time
from typing import Callable, Sequence

REPO = pathlib.Path(__file__).resolve().parent.parent


def chunk_seed(seed: int, k: int, what: str) -> int:
    if k == 0:
        return seed
    import hashlib
    return int.from_bytes(hashlib.sha256(f"{what}-chunk:{seed}:{k}".encode()).digest()[:4], "little")


def chunk_counts(total: int, size: int | None) -> list[int]:
    """``total`` split into chunks of ``size`` (None: one chunk), the last one shorter."""
    size = size or total
    return [min(size, total - start) for start in range(0, total, size)]


def merge_counts(results: Sequence[dict]) -> dict:
    out: dict = {}
    for r in results:
        for k, v in r.items():
            if k not in out:
                out[k] = merge_counts([v]) if isinstance(v, dict) else (list(v) if isinstance(v, list) else v)
            elif isinstance(v, bool) or not isinstance(v, (int, float, dict, list)):
                continue
            elif isinstance(v, dict) and isinstance(out[k], dict):
                out[k] = merge_counts([out[k], v])
            elif isinstance(v, list) and isinstance(out[k], list):
                out[k] = out[k] + list(v)
            elif isinstance(out[k], (int, float)) and not isinstance(out[k], bool):
                out[k] = out[k] + v
    return out


class ShardError(RuntimeError):
    """A work unit failed."""


class _Progress:
    def __init__(self, label: str, total: int):
        self.label, self.total, self.done, self.t0 = label, total, 0, time.monotonic()

    def step(self) -> None:
        self.done += 1
        elapsed = time.monotonic() - self.t0
        left = elapsed / self.done * (self.total - self.done)
        print(f"[{self.label}] {self.done}/{self.total} done, {elapsed:.0f} s elapsed, ~{left:.0f} s left",
              file=sys.stderr, flush=True)


def run_units(units: Sequence, fn: Callable, *, workers: int = 1, ray_address: str | None = None,
              label: str = "units", name: Callable = str) -> list:
    units = list(units)
    progress = _Progress(label, len(units))
    if workers <= 1 and not ray_address:
        out = []
        for u in units:
            try:
                out.append(fn(u))
            except Exception as e:
                raise ShardError(f"{label}: unit {name(u)} failed: {type(e).__name__}: {e}") from e
            progress.step()
        return out
    return _on_ray(units, fn, workers, ray_address, progress, name)


def _at_priority(fn: Callable, unit, nice: int):
    """``fn(unit)`` at the driver's CPU priority: Ray starts its workers at niceness 15, so a
    unit would otherwise yield the cores to anything else running (the simulator it starts
    inherits the worker's niceness). Lowering niceness needs privileges; without, it stays."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except PermissionError:
        pass
    return fn(unit)


def _on_ray(units: list, fn: Callable, workers: int, address: str | None, progress: _Progress,
            name: Callable) -> list:
    import ray
    env = {"PYTHONPATH": os.pathsep.join([str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                         if p])}
    started = not ray.is_initialized()
    if started:
        kw = {"address": address} if address else {"num_cpus": workers, "include_dashboard": False}
        ray.init(runtime_env={"env_vars": env}, log_to_driver=False, configure_logging=False, **kw)
    try:
        task = ray.remote(num_cpus=1)(_at_priority)
        nice = os.getpriority(os.PRIO_PROCESS, 0)
        refs = [task.remote(fn, u, nice) for u in units]
        index = {ref: i for i, ref in enumerate(refs)}
        results: list = [None] * len(units)
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            i = index[ready[0]]
            try:
                results[i] = ray.get(ready[0])
            except Exception as e:
                for ref in pending:
                    ray.cancel(ref, force=True)
                cause = getattr(e, "cause", None) or e
                raise ShardError(f"{progress.label}: unit {name(units[i])} failed: "
                                 f"{type(cause).__name__}: {cause}") from None
            progress.step()
        return results
    finally:
        if started:
            ray.shutdown()
