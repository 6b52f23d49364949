"""Run one cocotb test on the device harness and collect the result JSON it writes.

``run_harness_test(testcase, env, module, config=None)`` builds (or reuses) the Verilator
harness for ``config`` (default ``DeviceConfig.for_simulation()``), runs ``module::testcase``
with ``TCXL_CONFIG`` and ``TCXL_RESULT_JSON`` set on top of ``env``, and returns the JSON the
test wrote. A failing test still returns its result, with ``error`` set to the runner's
message; a test that wrote nothing raises ``NoResult``. ``label`` (sim/runner.py) keeps the
results of runs sharing the build directory at the same time apart. ``write_json(path, result)`` writes a
command's result (sorted keys, parent folders made) and says where.

Progress and the simulator's log go to stderr (``progress_to_stderr``: the simulator process
inherits it as its stdout), so a command's stdout carries only its result table.
"""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import sys
import tempfile


class NoResult(Exception):
    """The simulation ended without writing its result."""


@contextlib.contextmanager
def progress_to_stderr():
    """Point file descriptor 1 at stderr for the block (child processes included)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def run_harness_test(testcase: str, env: dict[str, str], module: str, config=None, label: str | None = None) -> dict:
    from hw.config import DeviceConfig
    from sim import runner
    from sim.harness import TOPLEVEL, build_harness
    cfg = DeviceConfig.for_simulation() if config is None else config
    print(f"building the Verilator model ({cfg.channels} channels, {cfg.capacity_bytes >> 20} MiB)...",
          file=sys.stderr, flush=True)
    with progress_to_stderr():
        bdir = build_harness(cfg)
    with tempfile.TemporaryDirectory() as tmp:
        result_path = pathlib.Path(tmp) / "result.json"
        full_env = {"TCXL_CONFIG": json.dumps(cfg.__dict__), "TCXL_RESULT_JSON": str(result_path), **env}
        print(f"running {testcase}...", file=sys.stderr, flush=True)
        error = None
        try:
            with progress_to_stderr():
                runner.run(bdir, TOPLEVEL, module, testcase, env=full_env, label=label)
        except RuntimeError as exc:       # a failed check: the result is still written
            error = str(exc)
        if not result_path.exists():
            raise NoResult(f"{testcase} produced no result ({error or 'no error reported'})")
        result = json.loads(result_path.read_text())
    if error and "error" not in result:
        result["error"] = error
    return result


def write_json(path, result: dict) -> None:
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(f"wrote {path}")
