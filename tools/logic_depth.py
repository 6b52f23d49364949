"""Register-to-register logic depth of a Xilinx-mapped netlist (Yosys ``write_json``), in LUT levels.

Contract: ``analyze(netlist, module=None, top_paths=5) -> dict`` takes the parsed JSON of a
design after ``synth_xilinx`` (one module: flatten first, or name it) and returns:

- ``logic_levels``: the most LUT levels on any path that starts at a sequential element (or a
  module input) and ends at one (or a module output);
- ``muxf`` / ``carry`` / ``dsp``: the MUXF7/8/9, CARRY4/8 and combinational DSP cells on
  that same path (reported, not counted as LUT levels);
- ``paths``: the ``top_paths`` deepest paths with distinct endpoints, each ``{levels, muxf,
  carry, dsp, from, to}``; ``from`` / ``to`` name the register (its output net), memory, DSP
  or port at each end (``port:NAME`` for a module port: a path through a block's port
  continues in the next block, so a block's own figure can understate the device's) and
  ``via``: the named nets the path runs through, start to end (the RTL's own signal names;
  synthesis-made nets left out), to tell which logic to pipeline;
- ``by_group``: the deepest path ending in each first-level instance (``group_of``: after
  flattening the device, each top-level block), deepest first, each ``{levels, from, to, via}``;
- ``cells``: how many cells the graph held, ``loops``: combinational loops broken (0 expected).

The graph: nodes are net bits. A LUT1..LUT6 adds one level. A LUT RAM (RAM32M, RAM64X1D,
RAM32M16 ...) and a variable SRL (SRL16E / SRLC32E) are sequential for their written
contents but their read is asynchronous, so each read port's address pins reach that port's
data outputs through one LUT level (what the timing of the LUT they are would show;
``read_ports``: a write address reaches only the output that reads at it); their write pins
are endpoints. MUXF7/8/9 and CARRY4/8 pass through without a LUT level, and so do INV / BUF
(synth_xilinx leaves some INVs; the vendor flow folds them into the next LUT or flip-flop). A DSP48E1/E2 whose
A/B, M and P registers are all off (AREG=BREG=MREG=PREG=0) is combinational and passes
through; otherwise it is a boundary, as are flip-flops (FD*), block RAM (RAMB*), UltraRAM
(URAM288) and every cell type this module does not know (listed in ``unknown_cells``).
"""
from __future__ import annotations

import json
import pathlib
import re

LUT = re.compile(r"LUT[1-6]")
MUXF = re.compile(r"MUXF[789]")
CARRY = re.compile(r"CARRY[48]")
WIRE = re.compile(r"INV|BUF")                     # pass through, no level (absorbed into a LUT or FF)
DSP = re.compile(r"DSP48E\d")
LUTRAM = re.compile(r"RAM(32|64|128|256|512)(M\d*|X\d+[SD])")
SRL = re.compile(r"SRL(16E|C32E)")
SEQUENTIAL = re.compile(r"FD[RSCP]E(_1)?|RAMB(18|36)E\d|URAM288(_BASE)?|BUFG.*|\$scopeinfo")
DSP_REGS = ("AREG", "BREG", "MREG", "PREG")
# Path cost: (LUT levels, MUXF, CARRY, DSP); compared LUT levels first.
ZERO = (0, 0, 0, 0)
STEP = {"lut": (1, 0, 0, 0), "muxf": (0, 1, 0, 0), "carry": (0, 0, 1, 0), "dsp": (0, 0, 0, 1), "wire": ZERO}


def read_ports(conns: dict, dirs: dict) -> list[tuple[list[int], list[int]]]:
    """The asynchronous reads of a LUT RAM or SRL: (output bits, the address bits they read
    at) per output. ``DOx`` reads at ``ADDRx`` (RAM32M/RAM64M/RAM32M16/RAM64M8: ``ADDRD`` /
    ``ADDRH`` is also the write address, so only that port's output follows it); ``DPO`` at
    ``DPRA``; ``SPO`` / ``O`` / ``Q`` at ``A`` (the write address of RAMxX1D/S; an SRL's
    tap). Other outputs (an SRL's ``Q31``) and outputs whose address is constant (a fixed-length
    SRL) are registered: no entry."""
    def ints(bits):
        return [b for b in bits if isinstance(b, int)]
    a_pins = [b for p, bits in conns.items() if re.fullmatch(r"A\d*", p) for b in ints(bits)]
    dpra = [b for p, bits in conns.items() if re.fullmatch(r"DPRA\d*", p) for b in ints(bits)]
    out = []
    for p, bits in conns.items():
        if dirs.get(p) != "output":
            continue
        if m := re.fullmatch(r"DO([A-H])", p):
            addr = ints(conns.get(f"ADDR{m.group(1)}", []))
        elif p == "DPO":
            addr = dpra
        elif p in ("SPO", "O", "Q"):
            addr = a_pins
        else:
            addr = []
        if addr and ints(bits):
            out.append((ints(bits), addr))
    return out


def cell_graph(mod: dict, kind_of, through: tuple, reads: dict):
    """The combinational graph of a module's cells: ``edges`` (output bit -> (kind, cell name,
    input bits)) for the cells ``kind_of`` puts in ``through`` (every input reaches every
    output) or in ``reads`` (LUT RAM / SRL: ``read_ports``, edge kind ``reads[kind]``);
    ``sinks`` ((bit, cell name or ``port:NAME``): every input of a cell that is not in
    ``through``, and the module's output ports); ``unknown`` (cell type -> count: ``kind_of``
    said ``unknown``; treated as boundaries)."""
    edges: dict[int, tuple[str, str, list[int]]] = {}
    sinks: list[tuple[int, str]] = []
    unknown: dict[str, int] = {}
    for cname, cell in mod.get("cells", {}).items():
        if cell["type"] == "$scopeinfo":
            continue
        dirs, conns = cell.get("port_directions"), cell.get("connections", {})
        if dirs is None:
            raise NetlistError(f"cell {cname} ({cell['type']}) has no port_directions: read the cell library first")
        kind = kind_of(cell)
        ins = [b for p, bits in conns.items() if dirs.get(p) != "output" for b in bits if isinstance(b, int)]
        if kind == "unknown":
            unknown[cell["type"]] = unknown.get(cell["type"], 0) + 1
        if kind in through:
            for b in (b for p, bits in conns.items() if dirs.get(p) == "output" for b in bits if isinstance(b, int)):
                edges[b] = (kind, cname, ins)
            continue
        for obits, addr in read_ports(conns, dirs) if kind in reads else ():
            for b in obits:
                edges[b] = (reads[kind], cname, addr)
        sinks += [(b, cname) for b in ins]
    for pname, port in mod.get("ports", {}).items():
        if port["direction"] != "input":
            sinks += [(b, f"port:{pname}") for b in port["bits"] if isinstance(b, int)]
    return edges, sinks, unknown


class NetlistError(Exception):
    """The JSON is not a netlist this module can read (one-line message)."""


def _param_int(value) -> int:
    if isinstance(value, int):
        return value
    s = str(value).strip()
    return int(s, 2) if set(s) <= {"0", "1"} and s else int(s or 0)


def classify(cell: dict) -> str:
    """``lut``, ``muxf``, ``carry``, ``wire`` (INV/BUF), ``dsp`` (combinational DSP), ``lutram``,
    ``srl``, ``seq`` (a boundary) or ``unknown``."""
    t = cell["type"].lstrip("\\")
    if DSP.fullmatch(t):
        p = cell.get("parameters", {})
        return "dsp" if all(_param_int(p.get(k, 1)) == 0 for k in DSP_REGS) else "seq"
    for pattern, kind in ((LUT, "lut"), (MUXF, "muxf"), (CARRY, "carry"), (WIRE, "wire"), (LUTRAM, "lutram"),
                          (SRL, "srl"), (SEQUENTIAL, "seq")):
        if pattern.fullmatch(t):
            return kind
    return "unknown"


def _pick_module(netlist: dict, module: str | None) -> tuple[str, dict]:
    mods = {k: v for k, v in netlist.get("modules", {}).items() if not v.get("attributes", {}).get("blackbox")}
    if module is not None:
        if module not in mods:
            raise NetlistError(f"no module {module!r} in the netlist (it has {len(mods)})")
        return module, mods[module]
    tops = [k for k, v in mods.items() if _param_int(v.get("attributes", {}).get("top", 0))]
    if len(tops) == 1:
        return tops[0], mods[tops[0]]
    if len(mods) == 1:
        return next(iter(mods.items()))
    raise NetlistError(f"{len(mods)} modules and no single top: flatten the design or name the module")


def _names(mod: dict) -> dict[int, str]:
    """Net bit -> a readable name with its bit index: a public name first, then the deepest in
    the hierarchy (after flattening, a register is named where it is driven, not after the
    parent's wire it also feeds), then the shortest."""
    out: dict[int, tuple[int, str]] = {}
    for name, net in mod.get("netnames", {}).items():
        hidden = int(net.get("hide_name", 0))
        bits = net["bits"]
        for i, b in enumerate(bits):
            if isinstance(b, int):
                label = name if len(bits) == 1 else f"{name}[{i}]"
                rank = (hidden, -name.count("."), len(name))
                if b not in out or rank < out[b][0]:
                    out[b] = (rank, label)
    return {b: v[1] for b, v in out.items()}


def analyze(netlist: dict, module: str | None = None, top_paths: int = 5) -> dict:
    """The logic depth of one mapped module (see the module docstring)."""
    name, mod = _pick_module(netlist, module)
    cells = mod.get("cells", {})
    edges, sinks, unknown = cell_graph(mod, classify, ("lut", "muxf", "carry", "dsp", "wire"),
                                       {"lutram": "lut", "srl": "lut"})
    names = _names(mod)
    cost: dict[int, tuple] = {}
    best_in: dict[int, int | None] = {}
    loops = 0
    for root in list(edges):
        if root in cost:
            continue
        stack, on_stack = [root], {root}
        while stack:
            b = stack[-1]
            e = edges.get(b)
            pending = [i for i in e[2] if i in edges and i not in cost] if e else []
            todo = [i for i in pending if i not in on_stack]
            if len(todo) < len(pending):
                loops += 1                               # break the loop at this edge
                for i in pending:
                    if i in on_stack:
                        cost[i], best_in[i] = ZERO, None
            if todo:
                stack.append(todo[0])
                on_stack.add(todo[0])
                continue
            stack.pop()
            on_stack.discard(b)
            if b in cost:
                continue
            top, arg = ZERO, None
            for i in e[2]:
                c = cost.get(i, ZERO)
                if arg is None or c > top:
                    top, arg = c, i
            cost[b] = tuple(x + y for x, y in zip(top, STEP[e[0]]))
            best_in[b] = arg

    def start_of(b: int) -> str:
        seen = set()
        while b in edges and best_in.get(b) is not None and b not in seen:
            seen.add(b)
            b = best_in[b]
        return _label(b)

    def via_of(b: int) -> list[str]:
        """Named nets on the path that ends at ``b``, start first (consecutive bits of one
        signal once)."""
        out, seen = [], set()
        while b is not None and b not in seen:
            seen.add(b)
            n = names.get(b)
            if n is not None and _is_rtl_name(n):
                base = re.sub(r"\[\d+\]$", "", n)
                if not out or re.sub(r"\[\d+\]$", "", out[-1]) != base:
                    out.append(n)
            b = best_in.get(b) if b in edges else None
        return out[::-1]

    def _label(b: int) -> str:
        n = names.get(b, f"net {b}")
        return f"port:{n}" if any(b in p["bits"] and p["direction"] == "input"
                                  for p in mod.get("ports", {}).values()) else n

    per_end: dict[str, tuple] = {}
    for b, label in sinks:
        c = cost.get(b, ZERO)
        end = label if label.startswith("port:") else _sink_label(label, names, cells, b)
        if end not in per_end or c > per_end[end][0]:
            per_end[end] = (c, b)
    ranked = sorted(per_end.items(), key=lambda kv: kv[1][0], reverse=True)
    paths = [{"levels": c[0], "muxf": c[1], "carry": c[2], "dsp": c[3], "from": start_of(b), "to": end,
              "via": via_of(b)}
             for end, (c, b) in ranked[:top_paths]]
    by_group: dict[str, dict] = {}
    for end, (c, b) in ranked:                     # deepest first: the first seen per group wins
        g = group_of(end)
        if g not in by_group:
            by_group[g] = {"levels": c[0], "from": start_of(b), "to": end, "via": via_of(b)}
    deepest = paths[0] if paths else {"levels": 0, "muxf": 0, "carry": 0, "dsp": 0}
    return {"module": name, "logic_levels": deepest["levels"], "muxf": deepest["muxf"], "carry": deepest["carry"],
            "dsp": deepest["dsp"], "paths": paths, "by_group": by_group, "cells": len(cells), "loops": loops,
            "unknown_cells": unknown}


def _is_rtl_name(name: str) -> bool:
    """A net the RTL named (``tags_way5.r0_data[6]``, ``\\$flatten\\update.\\s2_addr``), not
    one synthesis made (``$abc$123$n45``, or ``$techmap12$abc$7$lut.A[5]``: a cell's pin):
    no ``$`` left once the flatten prefixes are taken out."""
    return "$" not in name.replace("$flatten", "")


def group_of(label: str) -> str:
    """The first level of hierarchy an endpoint lies in (the instance name inside the analysed
    module: a top-level block after flattening the device), ``(ports)`` or ``(top)``."""
    if label.startswith("port:"):
        return "(ports)"
    m = re.search(r"\$flatten\\([^.\\$]+)", label)
    if m:
        return m.group(1)
    s = label.lstrip("\\")
    return s.split(".")[0] if "." in s and not s.startswith("$") else "(top)"


def _sink_label(cname: str, names: dict, cells: dict, bit: int) -> str:
    """A flip-flop endpoint is named by the register it writes (its Q net); others by cell name."""
    cell = cells.get(cname)
    if cell is not None and re.fullmatch(r"\\?FD[RSCP]E(_1)?", cell["type"]):
        q = [b for b in cell["connections"].get("Q", []) if isinstance(b, int)]
        if q:
            return names.get(q[0], cname)
    return f"{cname.lstrip(chr(92))} ({cell['type'].lstrip(chr(92))})" if cell is not None else cname


def load_netlist(path: pathlib.Path) -> dict:
    try:
        return json.loads(pathlib.Path(path).read_text())
    except (OSError, ValueError) as e:
        raise NetlistError(f"cannot read netlist {path}: {e}") from e


def analyze_file(path: pathlib.Path, module: str | None = None, top_paths: int = 5) -> dict:
    return analyze(load_netlist(path), module, top_paths)


def format_paths(r: dict) -> str:
    lines = [f"{r['module']}: {r['logic_levels']} LUT levels (+{r['muxf']} MUXF, {r['carry']} CARRY, {r['dsp']} DSP)"]
    for p in r["paths"]:
        lines.append(f"  {p['levels']:>3} LUT  {p['from']}  ->  {p['to']}"
                     + (f"  (+{p['muxf']} MUXF, {p['carry']} CARRY)" if p["muxf"] or p["carry"] else ""))
    if r["paths"] and r["paths"][0].get("via"):
        lines.append("  deepest via: " + " -> ".join(r["paths"][0]["via"]))
    return "\n".join(lines)
