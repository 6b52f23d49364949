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
from amaranth.back import rtlil, verilog
from amaranth.lib.memory import Memory

from tools.mem_audit import FF_LIMIT_BITS
from tools.synth_cmd import (
    COUNT_KEYS,
    MemoryLog,
    SynthError,
    add_parser,
    block_of,
    blocks_script,
    dedupe_modules,
    design_modules,
    design_suffix,
    device_blocks,
    empty_block,
    format_blocks,
    format_result,
    generate_design,
    main,
    merge_blocks,
    module_names,
    parse_blocks,
    summarize,
    synthesize,
    synthesize_blocks,
)


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
    assert (a.target, a.json, a.top, a.keep, a.timeout, a.func, a.share, a.hierarchical) == \
        ("xcup", "build/synth.json", "trainingcxl_device", "build/synth", None, main, "fast", False)
    assert _parse("--target", "xc7", "--share", "full").target == "xc7"
    with pytest.raises(SystemExit):
        _parse("--target", "ice40")
    assert (a.blocks, a.block_timeout) == (None, 900.0)
    assert _parse("--blocks", "csr,bias", "--block-timeout", "60").blocks == "csr,bias"


def test_device_config_from_arguments():
    """--fp32-pipeline / --lookup-contexts change only those fields of the default device."""
    import dataclasses
    from hw.config import DeviceConfig
    from tools.synth_cmd import device_config
    assert device_config(_parse()) == DeviceConfig()
    deep = device_config(_parse("--fp32-pipeline", "deep", "--lookup-contexts", "8"))
    assert deep == dataclasses.replace(DeviceConfig(), fp32_pipeline="deep", lookup_contexts=8)


@pytest.mark.parametrize("argv, message", [
    (["--timeout", "0"], "--timeout must be a positive"),
    (["--top", "lookup"], "--top must be trainingcxl_device or one of its blocks"),
    (["--blocks", "all", "--block-timeout", "-1"], "--block-timeout must be a positive"),
    (["--blocks", "csr", "--top", "trainingcxl_device.csr"], "--blocks and --top exclude each other"),
    (["--premap"], "--premap works per block"),
    (["--blocks", "csr", "--keep-netlist"], "--keep-netlist keeps one design's netlist"),
    (["--fp32-pipeline", "deep", "--frontend", "verilog"], "need the rtlil frontend"),
    (["--lookup-contexts", "3"], "lookup_contexts must be a power of two"),
])
def test_bad_requests_exit_2(argv, message, capsys, tmp_path):
    assert main(_parse("--json", str(tmp_path / "s.json"), "--keep", str(tmp_path), *argv)) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "s.json").exists()


def test_stat_sample_is_json():
    json.dumps(summarize(STAT))      # the result is what write_json gets


# Per-block mode (--blocks): the block list from the module names, the Verilog split, the
# script, the merge of per-block results; one real run of a two-block toy device (both
# blocks complete) and one where every block times out (the restart path).
class Counter(Elaboratable):
    def __init__(self):
        self.count = Signal(16)

    def elaborate(self, platform):
        m = Module()
        m.d.sync += self.count.eq(self.count + 1)
        return m


class ToyDevice(Elaboratable):
    """``trainingcxl_device`` with blocks ``alpha`` (Tiny) and ``beta`` (a counter holding a
    counter: the nested module ``trainingcxl_device.beta.inner``)."""

    def __init__(self):
        self.tiny, self.inner = Tiny(), Counter()
        self.sum = Signal(16)

    def elaborate(self, platform):
        m = Module()
        m.submodules.alpha = self.tiny
        m.submodules.beta = beta = Module()
        beta.submodules.inner = self.inner
        m.d.sync += self.sum.eq(self.inner.count ^ self.tiny.count[:16])
        return m


@pytest.fixture(scope="module")
def toy_verilog():
    d = ToyDevice()
    return verilog.convert(d, name="trainingcxl_device", ports=_ports(d.tiny) + [d.sum], emit_src=False)


@pytest.fixture(scope="module")
def toy_rtlil():
    d = ToyDevice()
    return rtlil.convert(d, name="trainingcxl_device", ports=_ports(d.tiny) + [d.sum], emit_src=False)


@pytest.fixture(scope="module", params=["verilog", "rtlil"])
def toy_design(request, toy_verilog, toy_rtlil):
    """The toy device as either frontend reads it: (text, file suffix)."""
    return (toy_verilog, ".v") if request.param == "verilog" else (toy_rtlil, ".il")


def test_block_list_is_derived_from_module_names(toy_verilog):
    modules = design_modules(toy_verilog)
    assert set(modules) == module_names(toy_verilog)
    assert {"trainingcxl_device", "trainingcxl_device.alpha", "trainingcxl_device.beta.inner"} <= set(modules)
    assert all(t.rstrip().endswith("endmodule") and t.count("\nmodule ") + t.startswith("module ") == 1
               for t in modules.values())
    assert sum(map(len, modules.values())) <= len(toy_verilog) < sum(map(len, modules.values())) + 200
    assert device_blocks(modules) == ["alpha", "beta"]
    assert device_blocks(["trainingcxl_device", "trainingcxl_device.x.y.z", "other.q", "trainingcxl_device.a"]) \
        == ["a", "x"]
    assert (block_of("trainingcxl_device.beta.inner"), block_of("trainingcxl_device"), block_of("trainingcxl_x.a")) \
        == ("beta", None, None)
    assert parse_blocks("all", ["a", "b"]) == ["a", "b"]
    assert parse_blocks(" b, trainingcxl_device.a ,b", ["a", "b"]) == ["b", "a"]
    for bad in ("c", "a,c", ","):
        with pytest.raises(SynthError, match="the device has: a, b"):
            parse_blocks(bad, ["a", "b"])
    pre = blocks_script("blocks-1.v", ["a"], "xcup", before_luts=True).splitlines()
    assert "synth_xilinx -family xcup -top trainingcxl_device.a -flatten -noiopad -noclkbuf -uram " \
        "-run map_memory:map_luts" in pre and "blackbox =A:whitebox" in pre
    script = blocks_script("blocks-1.v", ["a", "b"], "xc7").splitlines()
    assert script[:2] == ["read_verilog blocks-1.v", "design -save read"] and script.count("design -load read") == 2
    assert "synth_xilinx -family xc7 -top trainingcxl_device.b -flatten -noiopad -noclkbuf -run :coarse" in script
    assert "synth_xilinx -family xc7 -top trainingcxl_device.b -flatten -noiopad -noclkbuf -run map_memory:" in script
    assert "share -fast" in script and "share" not in script
    assert script[-3:] == ["tee -q -o b.stats.json stat -json", "write_json b.net.json", "log BLOCK-END b"]
    full = blocks_script("blocks-1.v", ["a"], "xcup", share="full").splitlines()
    assert "synth_xilinx -family xcup -top trainingcxl_device.a -flatten -noiopad -noclkbuf -uram" in full


def _done(lut, ff, bram, seconds, mapping):
    r = empty_block()
    r.update(summarize({"modules": {"\\m": {"num_cells_by_type": {"LUT6": lut, "FDRE": ff, "RAMB18E1": bram}}}}))
    r.pop("yosys_version")
    return {**r, "ok": True, "seconds": seconds, "memory_mapping": mapping}


def test_merge_sums_completed_blocks_only():
    timed_out = {**empty_block(), "timed_out": True, "error": "timed out after 900 s in MEMORY_MAP pass",
                 "seconds": 900.0, "memory_mapping": {"scratch": "FF", "trainingcxl_device.update.tags": "FF"}}
    failed = {**empty_block(), "error": "yosys exited with 1"}
    r = merge_blocks({"csr": _done(10, 20, 1, 3.0, {}), "lookup": _done(5, 7, 4, 9.5, {"rows": "BLOCKRAM_SDP"}),
                      "update": timed_out, "bias": failed})
    s = r["sum_of_completed_blocks"]
    assert (s["lut"], s["ff"], s["ramb18"], s["bram36_equiv"], s["dsp"], s["blocks"]) == (15, 27, 5, 2.5, 0, 2)
    assert set(s) == set(COUNT_KEYS) | {"blocks", "logic_levels", "estimated_levels"}
    assert s["logic_levels"] is None and s["estimated_levels"] is None
    assert r["incomplete_blocks"] == ["update", "bias"] and not r["ok"]
    assert r["error"] == "2 of 4 blocks did not complete: update (timed out), bias (failed)"
    assert r["memory_mapping"] == {"lookup.rows": "BLOCKRAM_SDP", "update.scratch": "FF", "update.tags": "FF"}
    assert merge_blocks({"csr": _done(1, 1, 0, 1.0, {})})["ok"] and not merge_blocks({})["ok"]
    table = format_blocks({**r, "target": "xc7", "top": "trainingcxl_device"})
    assert "TIMED OUT: timed out after 900 s" in table
    assert "FF memories: scratch, trainingcxl_device.update.tags" in table
    assert "sum (2 ok)" in table and "incomplete: update, bias" in table
    json.dumps(r)


def test_blocks_run_in_one_process(toy_design, tmp_path):
    text, suffix = toy_design
    assert design_suffix(text) == suffix
    modules = design_modules(text)
    r = synthesize_blocks(modules, ["beta", "alpha"], "xc7", tmp_path, block_timeout=120, timeout=240,
                          say=lambda *a, **kw: None)
    assert r["ok"] and r["incomplete_blocks"] == [] and r["yosys_processes"] == 1, r
    assert list(r["blocks"]) == ["beta", "alpha"]
    a, b = r["blocks"]["alpha"], r["blocks"]["beta"]
    assert (a["ramb36"], a["dsp"], a["timed_out"]) == (1, 1, False) and a["seconds"] > 0
    assert list(a["memory_mapping"].items())[0][1].startswith("BLOCKRAM") and list(r["memory_mapping"]) == \
        [f"alpha.{list(a['memory_mapping'])[0]}"] and not list(a["memory_mapping"])[0].startswith("trainingcxl")
    assert 16 <= b["ff"] < 40 and b["ramb36"] == 0                  # the inner counter, nothing of alpha
    assert r["sum_of_completed_blocks"]["ff"] == a["ff"] + b["ff"]
    assert r["yosys_version"].startswith("Yosys 0.")
    v = (tmp_path / f"blocks-1{suffix}").read_text()
    assert "trainingcxl_device.beta.inner" in v and "trainingcxl_device\n" not in v and "device(" not in v
    assert (tmp_path / "run-1.ys").read_text().startswith(("read_verilog " if suffix == ".v" else "read_rtlil ")
                                                         + f"blocks-1{suffix}\n")


def test_block_timeout_restarts_for_the_rest(toy_verilog, tmp_path):
    r = synthesize_blocks(design_modules(toy_verilog), ["alpha", "beta"], "xc7", tmp_path, block_timeout=0.2,
                          say=lambda *a, **kw: None)
    assert r["incomplete_blocks"] == ["alpha", "beta"] and not r["ok"]
    assert all(b["timed_out"] and "timed out after 0.2 s" in b["error"] for b in r["blocks"].values())
    assert r["yosys_processes"] == 2 and "alpha" not in (tmp_path / "blocks-2.v").read_text()
    assert r["sum_of_completed_blocks"]["blocks"] == 0


def test_memory_log_sizes_the_flip_flop_memories():
    log = MemoryLog()
    lines = ["using FF mapping for memory trainingcxl_device.update.scratch",
             "mapping memory trainingcxl_device.lookup.rows via $__XILINX_BLOCKRAM_SDP_",
             "mapping memory trainingcxl_device.undo_log.seen via $__XILINX_URAM_",
             "Mapping memory \\scratch in module \\trainingcxl_device.update:",
             "created 1024 $dff cells and 0 static cells of width 512.",
             "Mapping memory $auto$proc_rom$7 in module \\trainingcxl_device.update:",
             "created 4 $dff cells and 0 static cells of width 8.",
             "Executing OPT pass."]
    assert [log.feed(t) for t in lines] == [True] * 7 + [False]
    assert log.mapping == {"trainingcxl_device.update.scratch": "FF", "trainingcxl_device.lookup.rows": "BLOCKRAM_SDP",
                           "trainingcxl_device.undo_log.seen": "URAM"}
    assert log.ff_bits == {"trainingcxl_device.update.scratch": 1024 * 512}


# One block of the real default device on the default target (xcup), the way `--blocks` runs it:
# the contract keys, a positive depth, and no memory of the block in flip-flops above the
# memory audit's limit (sizes from memory_map's log lines). About a minute of Verilog
# generation and under a minute of Yosys.
CI_BLOCK = "cxl_mem"


@pytest.fixture(scope="module")
def device_modules(tmp_path_factory):
    return design_modules(generate_design(tmp_path_factory.mktemp("device")).read_text())


@pytest.fixture(scope="module")
def ci_block(device_modules, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ci_block")
    r = synthesize_blocks(device_modules, [CI_BLOCK], "xcup", folder, block_timeout=300, timeout=400,
                          say=lambda *a, **kw: None)
    return r, folder


def test_device_block_on_xcup(ci_block):
    r, tmp_path = ci_block
    b = r["blocks"][CI_BLOCK]
    assert r["ok"] and b["ok"], b["error"]
    assert r["target"] == "xcup" and r["share"] == "fast"
    assert {"lut", "ff", "bram36_equiv", "uram", "dsp", "logic_levels", "ff_memory_bits"} <= set(b)
    assert b["lut"] > 0 and b["ff"] > 0 and b["bram36_equiv"] == b["ramb36"] + b["ramb18"] / 2
    assert type(b["logic_levels"]) is int and b["logic_levels"] > 0
    assert b["depth"]["paths"][0]["levels"] == b["logic_levels"] and b["depth"]["loops"] == 0
    assert b["memory_mapping"], "the block has memories: memory_libmap's decisions must be in the log"
    in_ffs = {m for m, how in b["memory_mapping"].items() if how == "FF"}
    assert set(b["ff_memory_bits"]) == in_ffs                # every flip-flop memory was sized
    too_big = {m: bits for m, bits in b["ff_memory_bits"].items() if bits > FF_LIMIT_BITS}
    assert not too_big, f"memories of {CI_BLOCK} in flip-flops above {FF_LIMIT_BITS} bits: {too_big}"
    assert not (tmp_path / f"{CI_BLOCK}.net.json").exists()   # the netlist is analysed, then dropped


def test_device_block_premap_estimate(ci_block, device_modules, tmp_path):
    """``--premap``: the same block stopped before ABC9. tools/cut_depth.py's depth-oriented
    estimate is at most a level above ABC9's mapped depth (ABC9 may restructure below it, and
    it relaxes paths off its delay-critical one for area, so it is often deeper: cxl_mem 5
    against 7), and its paths must name RTL nets (what it is for)."""
    mapped = ci_block[0]["blocks"][CI_BLOCK]
    r = synthesize_blocks(device_modules, [CI_BLOCK], "xcup", tmp_path, block_timeout=300, timeout=400,
                          say=lambda *a, **kw: None, before_luts=True)
    b = r["blocks"][CI_BLOCK]
    assert r["ok"] and r["premap"] and b["ok"], b["error"]
    assert b["logic_levels"] is None and b["lut"] is None and b["ff"] == mapped["ff"]
    assert 1 <= b["estimated_levels"] <= mapped["logic_levels"] + 1, (b["estimated_levels"], mapped["logic_levels"])
    assert r["sum_of_completed_blocks"]["estimated_levels"] == b["estimated_levels"]
    deepest = b["depth"]["paths"][0]
    assert deepest["levels"] == b["estimated_levels"] and b["depth"]["gates"] > 0 and b["depth"]["loops"] == 0
    assert deepest["via"] and all("$" not in n.replace("$flatten", "") for n in deepest["via"]), deepest
    table = format_blocks(r)
    assert f"~{b['estimated_levels']}" in table and " via " in table


@pytest.mark.parametrize("top", ["trainingcxl_device.update.div", "trainingcxl_device.lookup.unit0.div"])
def test_fp32_divider_maps_from_rtlil(device_modules, tmp_path, top):
    """The FP32 dividers read as RTLIL. Without RTLIL_PREP (Amaranth's ``proc -nomux
    -norom``) synth_xilinx made ROMs of update's divider's switch statements and ABC9's
    ``&verify`` aborted Yosys 0.70 there, which ended a whole-device ``make synth`` after 18
    minutes; the same check aborted on the lookup units' divider (x not constant) after the
    normaliser's rebuild, 35 minutes in: ABC9_NO_VERIFY turns the check off."""
    (tmp_path / "div.il").write_text("".join(t for n, t in device_modules.items() if n == top or
                                             n.startswith(top + ".")))
    r = synthesize(tmp_path / "div.il", top, "xcup", tmp_path / "keep", timeout=300, say=lambda *a, **kw: None)
    assert r["ok"], r["error"]
    assert r["lut"] > 0 and r["logic_levels"] > 0


def test_tiny_block_on_xcup(tiny_verilog, tmp_path):
    r = synthesize(tiny_verilog, "tiny", "xcup", tmp_path, timeout=120, say=lambda *a, **kw: None)
    assert r["ok"], r
    assert (r["ramb36"], r["dsp"], r["uram"]) == (1, 1, 0)
    assert r["cells"].get("RAMB36E2") == 1 and r["cells"].get("DSP48E2") == 1
    assert r["carry4"] + r["carry8"] >= 3          # Yosys 0.70 maps adders to CARRY4 on xcup too
    assert type(r["logic_levels"]) is int and r["logic_levels"] >= 1 and r["depth"]["paths"]
    script = (tmp_path / "synth.ys").read_text()
    assert "-family xcup" in script and "-uram" in script and "share -fast" in script
    assert not (tmp_path / "netlist.json").exists()
    assert "logic levels" in format_result(r)
    # --keep-netlist: the same run leaves the mapped netlist, and its depth reads the same.
    kept = synthesize(tiny_verilog, "tiny", "xcup", tmp_path / "k", timeout=120, say=lambda *a, **kw: None,
                      keep_netlist=True)
    assert kept["ok"] and kept["logic_levels"] == r["logic_levels"]
    from tools import logic_depth
    assert logic_depth.analyze_file(tmp_path / "k" / "netlist.json")["logic_levels"] == r["logic_levels"]


def test_hierarchical_device_sums_the_modules(toy_design, tmp_path):
    text, suffix = toy_design
    (tmp_path / f"toy{suffix}").write_text(text)
    r = synthesize(tmp_path / f"toy{suffix}", "trainingcxl_device", "xcup", tmp_path, timeout=180,
                   say=lambda *a, **kw: None, flatten=False)
    assert r["ok"] and not r["flatten"], r
    assert r["ramb36"] == 1 and r["dsp"] == 1 and r["ff"] >= 16 + 16 + 24    # alpha and beta counted once each
    assert "-flatten" not in (tmp_path / "synth.ys").read_text()
    assert {"alpha", "beta"} <= set(r["logic_levels_by_block"]), r["logic_levels_by_block"]
    assert r["logic_levels"] == max(r["logic_levels_by_block"].values())


def test_dedupe_folds_identical_modules_of_a_block():
    def child(name, k, op="~a"):
        return (f"module \\{name} (a, y);\n  reg \\$auto$verilog_backend.cc:2355:dump_module${k}  = 0;\n  input a;\n"
                f"  output y;\n  assign y = {op};\nendmodule\n")
    text = ("module trainingcxl_device(a, y, z, w);\n  \\trainingcxl_device.x.u0  u0 (.a(a), .y(y));\n"
            "  \\trainingcxl_device.x.u1  u1 (.a(a), .y(z));\n  \\trainingcxl_device.x.u2  u2 (.a(a), .y(w));\n"
            "  \\trainingcxl_device.v.u0  v0 (.a(a), .y(w));\nendmodule\n"
            + child("trainingcxl_device.x.u0", 1) + child("trainingcxl_device.x.u1", 2)
            + child("trainingcxl_device.x.u2", 3, op="a") + child("trainingcxl_device.v.u0", 4))
    mods, renamed = dedupe_modules(design_modules(text))
    assert renamed == {"trainingcxl_device.x.u1": "trainingcxl_device.x.u0"}      # not u2 (differs), not v.u0
    assert set(mods) == {"trainingcxl_device", "trainingcxl_device.x.u0", "trainingcxl_device.x.u2",
                         "trainingcxl_device.v.u0"}
    top = mods["trainingcxl_device"]
    assert top.count("\\trainingcxl_device.x.u0  u") == 2 and "x.u1" not in top


class TwinBlock(Elaboratable):
    """``trainingcxl_device`` whose block ``x`` holds two identical counters and whose block
    ``y`` holds a third: Amaranth writes three modules; the two of ``x`` fold into one."""

    def __init__(self):
        self.counters = [Counter() for _ in range(3)]
        self.sum = Signal(16)

    def elaborate(self, platform):
        m = Module()
        m.submodules.x = x = Module()
        m.submodules.y = y = Module()
        x.submodules.c0, x.submodules.c1 = self.counters[:2]
        y.submodules.c0 = self.counters[2]
        m.d.sync += self.sum.eq(self.counters[0].count ^ self.counters[1].count ^ self.counters[2].count)
        return m


def test_rtlil_modules_split_and_fold(tmp_path):
    twin = TwinBlock()
    text = rtlil.convert(twin, name="trainingcxl_device", ports=[twin.sum], emit_src=False)
    assert design_suffix(text) == ".il"
    modules = design_modules(text)
    assert set(modules) == module_names(text) == {
        "trainingcxl_device", "trainingcxl_device.x", "trainingcxl_device.x.c0", "trainingcxl_device.x.c1",
        "trainingcxl_device.y", "trainingcxl_device.y.c0"}
    assert "".join(modules.values()) == text[:len("".join(modules.values()))]     # a partition, in order
    assert all(t.rstrip().endswith("\nend") for t in modules.values())           # process/switch ends stay inside
    mods, renamed = dedupe_modules(modules)
    assert renamed == {"trainingcxl_device.x.c1": "trainingcxl_device.x.c0"}      # not y.c0: another block
    assert mods["trainingcxl_device.x"].count("cell \\trainingcxl_device.x.c0 ") == 2
    (tmp_path / "twin.il").write_text("".join(mods.values()))
    r = synthesize(tmp_path / "twin.il", "trainingcxl_device", "xc7", tmp_path, timeout=120,
                   say=lambda *a, **kw: None, flatten=False)
    assert r["ok"], r["error"]
    assert r["ff"] == 4 * 16                 # three counters (x.c0 counted twice by stat -top) and the sum
