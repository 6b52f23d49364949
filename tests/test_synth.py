"""``trainingcxl synth`` (tools/synth_cmd.py): the Yosys invocation and the resource parser.

One real YoWASP Yosys run (synth_xilinx, the script the command uses) on a small Amaranth
block with a 1024 x 32 synchronous memory, a multiplier, a counter and a parity: the memory
must come out as one 36 Kb block RAM (not flip-flops), the multiplier as a DSP48E1, the
counter as CARRY4s and FFs, the parity as LUTs. The counting rules on a captured
``stat -json`` sample; the timeout path (exit 1 material) on a run cut short; the bad
requests (exit 2) before any build.
Everything here takes well under a minute; the full device runs only from the command.
"""
from __future__ import annotations

import argparse
import json

import pytest
from amaranth import Elaboratable, Module, Signal
from amaranth.back import verilog
from amaranth.lib.memory import Memory

from tools.synth_cmd import add_parser, format_result, main, module_names, summarize, synthesize


class Tiny(Elaboratable):
    def __init__(self):
        self.wa, self.ra = Signal(10), Signal(10)
        self.we, self.wd, self.rd = Signal(), Signal(32), Signal(32)
        self.a, self.b, self.p = Signal(16), Signal(16), Signal(32)
        self.count, self.parity = Signal(24), Signal()

    def elaborate(self, platform):
        m = Module()
        m.submodules.mem = mem = Memory(shape=32, depth=1024, init=[])
        wr, rd = mem.write_port(), mem.read_port()
        m.d.comb += [wr.addr.eq(self.wa), wr.data.eq(self.wd), wr.en.eq(self.we), rd.addr.eq(self.ra),
                     self.rd.eq(rd.data)]
        m.d.sync += [self.p.eq(self.a * self.b), self.count.eq(self.count + 1),
                     self.parity.eq((self.a ^ self.b).xor())]
        return m


def _ports(t):
    return [t.wa, t.ra, t.we, t.wd, t.rd, t.a, t.b, t.p, t.count, t.parity]


@pytest.fixture(scope="module")
def tiny_verilog(tmp_path_factory):
    t = Tiny()
    path = tmp_path_factory.mktemp("tiny") / "tiny.v"
    path.write_text(verilog.convert(t, name="tiny", ports=_ports(t), emit_src=False))
    return path


def test_tiny_block_synthesizes_to_bram_dsp_and_luts(tiny_verilog, tmp_path):
    lines = []
    r = synthesize(tiny_verilog, "tiny", "xc7", tmp_path / "keep", timeout=120,
                   say=lambda s, **kw: lines.append(s))
    assert r["ok"] and r["error"] is None, r
    assert (r["ramb36"], r["ramb18"], r["bram36_equiv"]) == (1, 0, 1.0)
    assert r["dsp"] == 1
    assert [v.startswith("BLOCKRAM") for v in r["memory_mapping"].values()] == [True]
    assert r["lut"] > 0 and r["carry4"] >= 6           # a 24-bit counter: 6 CARRY4
    assert 25 <= r["ff"] < 100                          # counter and parity, not a memory in FFs
    assert r["cells_total"] == sum(r["cells"].values())
    assert r["yosys_version"].startswith("Yosys 0.")
    assert any("ABC9" in s for s in lines)              # progress followed the log past ABC
    keep = tmp_path / "keep"
    assert "synth_xilinx -family xc7 -top tiny -flatten -noiopad -noclkbuf" in (keep / "synth.ys").read_text()
    assert "End of script" in (keep / "yosys.log").read_text()
    assert "trainingcxl synth: tiny on xc7" in format_result(r)


def test_timeout_is_a_failed_run(tiny_verilog, tmp_path):
    r = synthesize(tiny_verilog, "tiny", "xc7", tmp_path, timeout=0.5, say=lambda *a, **kw: None)
    assert not r["ok"] and "timed out" in r["error"]
    assert "timed out" in format_result(r)


STAT = {
    "creator": "Yosys 0.70 (git sha1 28ba3cb92, Release, Clang ...)",
    "modules": {"\\top": {"num_cells": 999}},
    "design": {"num_cells": 57, "num_cells_by_type": {
        "LUT1": 1, "LUT2": 2, "LUT3": 3, "LUT4": 4, "LUT5": 5, "LUT6": 6, "MUXF7": 2, "MUXF8": 1,
        "FDRE": 10, "FDSE": 2, "FDCE": 3, "FDPE": 1, "RAMB36E1": 2, "RAMB18E1": 3, "DSP48E1": 4,
        "RAM64M": 2, "RAM32M": 1, "RAM32X1D": 1, "RAM128X1D": 1, "SRLC32E": 1, "SRL16E": 1, "CARRY4": 2}},
}


def test_summarize_counts_each_category():
    r = summarize(STAT)
    assert (r["lut"], r["ff"], r["dsp"], r["lutram"], r["srl"], r["carry4"]) == (21, 16, 4, 5, 2, 2)
    assert (r["ramb36"], r["ramb18"], r["bram36_equiv"]) == (2, 3, 3.5)
    assert r["cells_total"] == 57 and r["cells"]["MUXF7"] == 2
    assert r["yosys_version"] == "Yosys 0.70 (git sha1 28ba3cb92)"


def test_summarize_one_module_without_design_totals():
    stat = {"modules": {"\\top": STAT["design"]}}
    assert summarize(stat)["lut"] == 21
    with pytest.raises(ValueError):
        summarize({"modules": {"\\a": {}, "\\b": {}}})


def test_module_names():
    text = "module top(a, b);\nendmodule\nmodule \\top.sub (clk);\nendmodule\n"
    assert module_names(text) == {"top", "top.sub"}


def _parse(*argv):
    p = argparse.ArgumentParser()
    add_parser(p.add_subparsers())
    return p.parse_args(["synth", *argv])


def test_parser_defaults():
    a = _parse()
    assert (a.target, a.json, a.top, a.keep, a.timeout, a.func) == \
        ("xc7", "build/synth.json", "trainingcxl_device", "build/synth", None, main)
    with pytest.raises(SystemExit):
        _parse("--target", "ice40")


@pytest.mark.parametrize("argv, message", [
    (["--timeout", "0"], "--timeout must be a positive"),
    (["--top", "lookup"], "--top must be trainingcxl_device or one of its blocks"),
])
def test_bad_requests_exit_2(argv, message, capsys, tmp_path):
    assert main(_parse("--json", str(tmp_path / "s.json"), "--keep", str(tmp_path), *argv)) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "s.json").exists()


def test_stat_sample_is_json():
    json.dumps(summarize(STAT))      # the result is what write_json gets
