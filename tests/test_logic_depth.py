"""tools/logic_depth.py: register-to-register depth in LUT levels of a synth_xilinx netlist.

Hand-built netlists pin the counting rules (LUTs count, MUXF/CARRY are reported apart, a LUT
RAM's read address is one level, a registered DSP is a boundary, loops are broken). One real
YoWASP Yosys run (synth_xilinx -family xcup, a few seconds) maps XOR trees between registers
whose depth is known from first principles: a 6-input parity is exactly one LUT level, a
12-input parity exactly two, a 4-input parity of registers one; 30 and 100 inputs at least 2
and 3 (measured: 3 and 4, ABC9 keeps Yosys' balanced tree), and the deepest path must run from
r1 to the 100-input parity.
"""
from __future__ import annotations

import json

import pytest
from amaranth import Elaboratable, Module, Signal
from amaranth.back import verilog

from tools.logic_depth import NetlistError, analyze, analyze_file, classify, format_paths
from tools.synth_cmd import _yosys_argv


def _cell(type_, dirs, conns, **params):
    return {"type": type_, "port_directions": dirs, "connections": conns, "parameters": params}


def _ff(name, d, q):
    return {name: _cell("FDRE", {"D": "input", "C": "input", "Q": "output"}, {"D": [d], "C": [1], "Q": [q]})}


def _lut(name, ins, out):
    return {name: _cell(f"LUT{len(ins)}", {**{f"I{i}": "input" for i in range(len(ins))}, "O": "output"},
                        {**{f"I{i}": [b] for i, b in enumerate(ins)}, "O": [out]})}


def _netlist(cells, netnames, ports=None):
    return {"modules": {"top": {"attributes": {"top": "00000000000000000000000000000001"}, "ports": ports or {},
                                "cells": cells, "netnames": {k: {"bits": v, "hide_name": 0}
                                                             for k, v in netnames.items()}}}}


def test_luts_count_muxf_reported_apart():
    # q0 -> LUT -> LUT + LUT -> MUXF7 -> LUT -> FF q1: 3 LUT levels, 1 MUXF7.
    cells = {**_ff("ff0", 20, 10), **_lut("l1", [10], 11), **_lut("l2a", [11, 10], 12), **_lut("l2b", [11], 13),
             "mx": _cell("MUXF7", {"I0": "input", "I1": "input", "S": "input", "O": "output"},
                         {"I0": [12], "I1": [13], "S": [10], "O": [14]}),
             **_lut("l3", [14], 15), **_ff("ff1", 15, 16), **_lut("short", [10], 17), **_ff("ff2", 17, 18)}
    r = analyze(_netlist(cells, {"q0": [10], "q1": [16], "q2": [18], "d0": [20], "mux_out": [14],
                                 "$abc$7$n12": [11]}))
    assert (r["logic_levels"], r["muxf"], r["carry"], r["loops"]) == (3, 1, 0, 0)
    # via: the RTL-named nets on the path, start first; the synthesis-made $abc net is left out.
    assert r["paths"][0] == {"levels": 3, "muxf": 1, "carry": 0, "dsp": 0, "from": "q0", "to": "q1",
                             "via": ["q0", "mux_out"]}
    assert [p["to"] for p in r["paths"]] == ["q1", "q2", "q0"] and r["paths"][1]["levels"] == 1
    assert "3 LUT levels" in format_paths(r) and "deepest via: q0 -> mux_out" in format_paths(r)


def test_lutram_read_is_a_level_and_registered_dsp_a_boundary():
    ram = _cell("RAM64X1D", {"A0": "input", "DPRA0": "input", "D": "input", "WE": "input", "WCLK": "input",
                             "SPO": "output", "DPO": "output"},
                {"A0": [11], "DPRA0": [11], "D": [12], "WE": [1], "WCLK": [1], "SPO": [13], "DPO": [14]})
    dsp = _cell("DSP48E2", {"A": "input", "P": "output"}, {"A": [13], "P": [15]}, AREG=0, BREG=0, MREG=0, PREG=1)
    cells = {**_ff("ff0", 1, 10), **_lut("a", [10], 11), **_lut("w", [10], 12), "ram": ram, "dsp": dsp,
             **_lut("b", [15], 16), **_ff("ff1", 16, 17), **_lut("c", [14], 18), **_ff("ff2", 18, 19)}
    r = analyze(_netlist(cells, {"q0": [10], "q1": [17], "q2": [19]}), top_paths=10)
    # q0 -> LUT a -> RAM read -> LUT c -> q2: 3 levels; the DSP (PREG=1) cuts the other path.
    assert r["logic_levels"] == 3 and r["paths"][0]["to"] == "q2" and r["paths"][0]["from"] == "q0"
    assert classify(dsp) == "seq" and classify({**dsp, "parameters": dict.fromkeys(("AREG", "BREG", "MREG",
                                                                                      "PREG"), "0")}) == "dsp"
    assert {p["to"]: p["levels"] for p in r["paths"]}["q1"] == 1


def test_ports_loops_and_errors():
    cells = {**_lut("x", [3, 5], 4), **_lut("y", [4], 5), **_lut("z", [2], 6)}
    ports = {"i": {"direction": "input", "bits": [2]}, "o": {"direction": "output", "bits": [6, 4]}}
    r = analyze(_netlist(cells, {"i": [2], "o": [6, 4], "loop": [5]}, ports))
    assert r["loops"] >= 1 and r["logic_levels"] >= 1
    assert any(p["from"] == "port:i" and p["to"] == "port:o" for p in r["paths"])
    with pytest.raises(NetlistError, match="no port_directions"):
        analyze(_netlist({"l": {"type": "LUT1", "connections": {"I0": [2], "O": [3]}}}, {}))
    with pytest.raises(NetlistError, match="no module 'nope'"):
        analyze(_netlist({}, {}), module="nope")


class XorTrees(Elaboratable):
    """x -> r1 (100 FFs) -> parities of r1's first 6, 12, 30 and 100 bits -> w6, w12, w30, w100;
    their parity -> out. (One signal per statement: Amaranth names them after the attribute.)"""

    def __init__(self):
        self.x = Signal(100)
        self.r1 = Signal(100)
        self.w6 = Signal()
        self.w12 = Signal()
        self.w30 = Signal()
        self.w100 = Signal()
        self.out = Signal()

    def elaborate(self, platform):
        m = Module()
        m.d.sync += [self.r1.eq(self.x), self.w6.eq(self.r1[:6].xor()), self.w12.eq(self.r1[:12].xor()),
                     self.w30.eq(self.r1[:30].xor()), self.w100.eq(self.r1.xor()),
                     self.out.eq(self.w6 ^ self.w12 ^ self.w30 ^ self.w100)]
        return m


def test_known_depth_after_synth_xilinx(tmp_path):
    import subprocess
    d = XorTrees()
    (tmp_path / "x.v").write_text(verilog.convert(d, name="xortrees", ports=[d.x, d.out], emit_src=False))
    (tmp_path / "x.ys").write_text("read_verilog x.v\nsynth_xilinx -family xcup -top xortrees -flatten -noiopad "
                                   "-noclkbuf\nwrite_json net.json\n")
    subprocess.run(_yosys_argv() + ["-q", "-s", "x.ys"], cwd=tmp_path, check=True, timeout=120)
    r = analyze_file(tmp_path / "net.json", top_paths=200)
    depth = {p["to"]: p["levels"] for p in r["paths"]}
    # Exact: 6 inputs fit one LUT6; 12 cannot fit one level (8 inputs at most, with MUXF8) and
    # fit two; out is a 4-input parity of registers; r1 comes straight from the port.
    assert (depth["w6"], depth["w12"], depth["out"], depth["r1[0]"]) == (1, 2, 1, 0), format_paths(r)
    # Bounds: 30 and 100 inputs need at least 2 and 3 levels (8^2 = 64 < 100); ABC9 maps the
    # balanced XOR trees Yosys builds at two XOR levels per LUT.
    assert 2 <= depth["w30"] <= depth["w100"] and depth["w100"] >= 3, format_paths(r)
    assert r["logic_levels"] == depth["w100"] and r["paths"][0]["to"] == "w100", format_paths(r)
    assert r["paths"][0]["from"].startswith("r1["), format_paths(r)
    assert r["loops"] == 0 and r["unknown_cells"] == {}
    json.dumps(r)


def test_lutram_write_address_reaches_only_its_own_read_port():
    """RAM32M: port D's address is also the write address. A deep path into ADDRD reaches DOD
    (port D reads at it) but not DOA, which reads at ADDRA; an SRL's Q31 is a register."""
    cells = {**_ff("ff0", 1, 10), **_lut("l1", [10], 11), **_lut("l2", [11], 12), **_lut("l3", [12], 13)}
    cells["ram"] = _cell("RAM32M", {"ADDRA": "input", "ADDRD": "input", "DIA": "input", "WE": "input",
                                    "WCLK": "input", "DOA": "output", "DOD": "output"},
                         {"ADDRA": [10], "ADDRD": [13], "DIA": [10], "WE": [1], "WCLK": [1], "DOA": [20], "DOD": [21]})
    cells["srl"] = _cell("SRLC32E", {"A": "input", "D": "input", "CE": "input", "CLK": "input", "Q": "output",
                                     "Q31": "output"},
                         {"A": [13], "D": [10], "CE": [1], "CLK": [1], "Q": [22], "Q31": [23]})
    cells.update({**_lut("a", [20], 30), **_ff("fa", 30, 40), **_lut("d", [21], 31), **_ff("fd", 31, 41),
                  **_lut("q", [22], 32), **_ff("fq", 32, 42), **_lut("q31", [23], 33), **_ff("f31", 33, 43)})
    r = analyze(_netlist(cells, {"q0": [10], "ra": [40], "rd": [41], "rq": [42], "r31": [43]}), top_paths=20)
    depth = {p["to"]: p["levels"] for p in r["paths"]}
    # ra: ADDRA (a register) -> read -> LUT = 2; rd: 3 LUTs -> ADDRD -> read -> LUT = 5.
    assert (depth["ra"], depth["rd"], depth["rq"], depth["r31"]) == (2, 5, 5, 1), depth
