"""tools/cut_depth.py: estimated LUT depth of an unmapped (pre-ABC9) netlist, with RTL names.

Hand-built gate netlists pin the mapping rules against depths known from first principles (a
chain of 12 two-input ANDs over 13 inputs needs 3 LUT6 levels: a 2-level cover would need a
LUT with 8 leaves; 6 inputs are one LUT; a CARRY passes without a level but its inputs must
be LUT outputs; a LUT RAM read is one level). ``via`` must list the named nets inside the
LUTs of the deepest path, not only at their boundaries. One real YoWASP run stops
``synth_xilinx`` before ``map_luts`` on XOR trees and checks the estimate against ABC9's mapped
depth of the same design (tools/logic_depth.py): equal on every register.
"""
from __future__ import annotations

import json
import subprocess

from amaranth.back import verilog

from tests.test_logic_depth import XorTrees, _cell, _ff, _netlist
from tools import cut_depth, logic_depth
from tools.synth_cmd import _yosys_argv, synth_commands


def _gate(name, kind, ins, out):
    pins = "ABCD"[:len(ins)] if kind != "MUX" else "ABS"
    return {name: _cell(f"$_{kind}_", {**{p: "input" for p in pins}, "Y": "output"},
                        {**{p: [b] for p, b in zip(pins, ins)}, "Y": [out]})}


def _and_chain(inputs):
    """Registers q[0..inputs-1] (bits 100...) and the chain a1 = q0 & q1, a_i = a_{i-1} & q_i
    (a_i is bit 200 + i); returns the cells."""
    cells = {f"ff{i}": _ff(f"ff{i}", 1, 100 + i)[f"ff{i}"] for i in range(inputs)}
    prev = 100
    for i in range(1, inputs):
        cells.update(_gate(f"g{i}", "AND", [prev, 100 + i], 200 + i))
        prev = 200 + i
    return cells


def test_and_chain_needs_three_levels_and_via_names_inner_nets():
    cells = _and_chain(13)
    cells.update(_ff("r", 212, 300))
    names = {"q": list(range(100, 113)), "r": [300], "mid_and": [206], "$auto$12": [209]}
    r = cut_depth.analyze(_netlist(cells, names))
    assert r["logic_levels"] == 3 and r["gates"] == 12 and r["loops"] == 0
    p = r["paths"][0]
    assert p["to"] == "r" and p["from"].startswith("q[")
    # The named net in the middle of the chain is inside a LUT; the synthesis-made one is left out.
    assert "mid_and" in p["via"] and not any("$" in n for n in p["via"]), p
    assert p["via"][0].startswith("q[")


def test_six_inputs_one_level_carry_and_lutram():
    # Five ANDs over six register bits: one LUT6. Then a CARRY4 (no level) whose input is that
    # LUT, then a LUT RAM read (one level) addressed by the carry's output, into FF z.
    cells = _and_chain(6)
    cells["carry"] = _cell("CARRY4", {"S": "input", "DI": "input", "CO": "output"},
                           {"S": [205], "DI": [100], "CO": [210]})
    cells["ram"] = _cell("RAM64X1D", {"A0": "input", "DPRA0": "input", "D": "input", "WE": "input",
                                      "WCLK": "input", "SPO": "output", "DPO": "output"},
                         {"A0": [1], "DPRA0": [210], "D": [1], "WE": [1], "WCLK": [1], "SPO": [211], "DPO": [212]})
    cells.update(_ff("z", 212, 300))
    cells.update(_ff("y", 205, 301))
    r = cut_depth.analyze(_netlist(cells, {"q": list(range(100, 106)), "z": [300], "y": [301], "co": [210]}),
                          top_paths=10)
    depth = {p["to"]: p["levels"] for p in r["paths"]}
    assert depth["y"] == 1 and depth["z"] == 2 and r["logic_levels"] == 2
    assert "co" in r["paths"][0]["via"]


def test_estimate_matches_abc9_on_xor_trees(tmp_path):
    d = XorTrees()
    (tmp_path / "x.v").write_text(verilog.convert(d, name="xortrees", ports=[d.x, d.out], emit_src=False))
    before = "\n".join(synth_commands("xcup", "xortrees", before_luts=True))
    after = "\n".join(synth_commands("xcup", "xortrees"))
    (tmp_path / "pre.ys").write_text(f"read_verilog x.v\n{before}\nwrite_json pre.json\n")
    (tmp_path / "post.ys").write_text(f"read_verilog x.v\n{after}\nwrite_json post.json\n")
    for script in ("pre.ys", "post.ys"):
        subprocess.run(_yosys_argv() + ["-q", "-s", script], cwd=tmp_path, check=True, timeout=120)
    pre = json.loads((tmp_path / "pre.json").read_text())
    assert not any(c["type"].startswith("LUT") for m in pre["modules"].values() for c in m.get("cells", {}).values()
                   if not m.get("attributes", {}).get("blackbox")), "the pre-map netlist must not be LUT-mapped yet"
    est = cut_depth.analyze(pre, top_paths=200)
    real = logic_depth.analyze_file(tmp_path / "post.json", top_paths=200)
    e = {p["to"]: p["levels"] for p in est["paths"]}
    a = {p["to"]: p["levels"] for p in real["paths"]}
    for reg in ("w6", "w12", "w30", "w100", "out"):
        assert e[reg] == a[reg], (reg, e, a)
    assert est["logic_levels"] == real["logic_levels"] and est["gates"] > 0 and est["loops"] == 0
    json.dumps(est)
