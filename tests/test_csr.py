"""CSR map, generators and CsrBlock RTL.

Pure Python: the map's invariants and validation, the Markdown / Python / C generators
(tools/regmap.py). RTL: CsrBlock converted alone to build/csr/<variant>/csr_block.v, linted
with verilator -Wall, built with Verilator and driven by the cocotb module tests/csr_tb.py
in two configurations: the device one (32-bit counters, narrow accesses allowed) and a
small one (4-bit counters so saturation is reachable, strict_align=True).
"""
from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from hw.cxl_controller import csr_map                          # noqa: E402
from hw.cxl_controller.csr_map import REG, Access, Field, Register  # noqa: E402
from tools import regmap                                        # noqa: E402

# Warnings Amaranth's Verilog raises under -Wall (docs/toolchain.md); anything else fails.
AMARANTH_WARNINGS = {"WIDTHEXPAND", "WIDTHTRUNC", "CASEINCOMPLETE", "PROCASSINIT",
                     "UNUSEDSIGNAL", "DECLFILENAME"}

VARIANTS = {
    "csr_block": dict(kwargs={}, env={}),
    "csr_block_small": dict(kwargs=dict(counter_width=4, strict_align=True),
                            env={"CSR_COUNTER_WIDTH": "4", "CSR_STRICT_ALIGN": "1"}),
}


# ----------------------------------------------------------------------------- the map
def test_offsets_unique_aligned_inside_bar():
    offs = [r.offset for r in csr_map.REGISTERS]
    assert len(set(offs)) == len(offs)
    assert all(o % 4 == 0 and 0 <= o < csr_map.BAR_SIZE for o in offs)
    assert offs == sorted(offs)
    assert len({r.name for r in csr_map.REGISTERS}) == len(offs)


def test_fields_fit_and_do_not_overlap():
    for r in csr_map.REGISTERS:
        used = 0
        for f in r.fields:
            assert 0 <= f.lsb and f.lsb + f.width <= 32, (r.name, f.name)
            assert f.mask & used == 0, (r.name, f.name)
            used |= f.mask
            assert f.reset < (1 << f.width)


def test_brief_layout():
    assert REG.HDM_BASE_LO == 0x20 and REG.STAT_INV == 0x8C and REG.DEVICE_ID == 0
    assert csr_map.register("DEVICE_ID").reset == 0x5443584C
    f = csr_map.field("HDM_BASE_LO", "ADDR")
    assert (f.lsb, f.width, f.access) == (6, 26, Access.RW)
    assert csr_map.field(csr_map.register("VERSION"), "MAJOR").mask == 0xFFFF0000
    assert csr_map.field("OUTSTANDING", "WRITES").mask == 0xFFFF0000
    assert csr_map.register("SCRATCH").whole
    with pytest.raises(KeyError):
        csr_map.register("NOPE")
    with pytest.raises(KeyError):
        csr_map.field("STATUS", "NOPE")


def test_port_names():
    ports = {p.name: (p.direction, p.width) for p in csr_map.ports()}
    expect = {
        "hdm_base_lo_addr": ("out", 26), "hdm_base_hi_addr": ("out", 20),
        "hdm_size_lo_size": ("out", 26), "hdm_size_hi_size": ("out", 20),
        "hdm_ctrl_enable": ("out", 1), "scratch": ("out", 32),
        "irq_enable_error": ("out", 1), "irq_enable_poison": ("out", 1),
        "status_error_set": ("in", 1), "status_error": ("out", 1),
        "status_poison_set": ("in", 1), "status_poison": ("out", 1),
        "err_out_of_window_rd_inc": ("in", 1), "stat_inv_inc": ("in", 1),
        "version_major": ("in", 16), "channels_count": ("in", 8),
        "outstanding_reads": ("in", 16), "capacity_lo": ("in", 32), "clock_mhz": ("in", 32),
    }
    for name, dw in expect.items():
        assert ports.get(name) == dw, name
    assert "device_id" not in ports                    # CONST: no port
    assert len(ports) == len(csr_map.ports())          # unique


@pytest.mark.parametrize("bad", [
    lambda: Register("A", 0x2, (Field("A", 0, 32, Access.RW),)),                 # misaligned
    lambda: Register("A", 0x0, (Field("X", 0, 8, Access.RW), Field("Y", 4, 8, Access.RW))),
    lambda: Register("A", 0x0, (Field("X", 30, 4, Access.RW),)),                # past bit 31
    lambda: Register("A", 0x0, (Field("X", 0, 4, Access.RW, reset=0x10),)),     # reset too big
    lambda: Register("A", 0x0, (Field("A", 0, 16, Access.COUNTER),)),           # short counter
    lambda: csr_map.check_map([*csr_map.REGISTERS, Register("X", 0x48, (Field("X", 0, 32, Access.RW),))]),
    lambda: csr_map.check_map([*csr_map.REGISTERS, Register("SCRATCH", 0x200, (Field("SCRATCH", 0, 32, Access.RW),))]),
    lambda: csr_map.check_map([*csr_map.REGISTERS, Register("X", 0x1000, (Field("X", 0, 32, Access.RW),))]),
    # port name clash: HDM_BASE.LO_ADDR -> hdm_base_lo_addr, like HDM_BASE_LO.ADDR
    lambda: csr_map.check_map([*csr_map.REGISTERS,
                               Register("HDM_BASE", 0x200, (Field("LO_ADDR", 0, 8, Access.RW),))]),
    lambda: csr_map.check_map([*csr_map.REGISTERS, Register("X", 0x200, (
        Field("X", 0, 32, Access.COUNTER, sets=("STATUS.NOPE",)),))]),
])
def test_check_map_rejects(bad):
    with pytest.raises(ValueError):
        bad()


def test_map_extends():
    """A later register (e.g. a doorbell) is one more entry; generators and RTL follow."""
    from hw.cxl_controller.csr import CsrBlock
    extra = Register("DOORBELL", 0x200, (Field("TAIL", 0, 16, Access.RW, reset=0x5, doc="t"),), "d")
    regs = (*csr_map.REGISTERS, extra)
    assert "| 0x200 | [DOORBELL]" in regmap.markdown(regs)
    ns = {}
    exec(regmap.python_constants(regs), ns)
    assert ns["DOORBELL_OFFSET"] == 0x200 and ns["DOORBELL_TAIL_MASK"] == 0xFFFF
    from amaranth.back import verilog
    text = verilog.convert(CsrBlock(regs), name="csr_ext", emit_src=False)
    assert "doorbell_tail" in text


# ----------------------------------------------------------------------------- generators
def test_markdown_lists_every_register_and_field():
    md = regmap.markdown()
    for r in csr_map.REGISTERS:
        assert re.search(rf"^\| 0x{r.offset:03X} \| \[{r.name}\]", md, re.M), r.name
        assert f"### {r.name}\n" in md
        for f in r.fields:
            assert re.search(rf"^\| {re.escape(f.bits)} \| {f.name} \| {f.access.value} \|", md, re.M), \
                (r.name, f.name)
    assert "0x5443584C" in md and "hdm_ctrl_enable" in md and "status_error_set" in md


def test_python_constants_match_map():
    text = regmap.python_constants()
    ns = {}
    exec(compile(text, "csr_constants.py", "exec"), ns)
    assert ns["BAR_SIZE"] == 4096 and ns["DEVICE_ID_VALUE"] == 0x5443584C
    for r in csr_map.REGISTERS:
        assert ns[f"{r.name}_OFFSET"] == r.offset
        assert ns["OFFSETS"][r.name] == r.offset
        if r.reset is not None:
            assert ns[f"{r.name}_RESET"] == r.reset
        for f in r.fields:
            stem = r.name if r.whole else f"{r.name}_{f.name}"
            assert ns[f"{stem}_MASK"] == f.mask
            assert ns[f"{stem}_SHIFT"] == f.lsb and ns[f"{stem}_WIDTH"] == f.width
    assert ns["HDM_BASE_LO_ADDR_MASK"] == 0xFFFFFFC0 and ns["STATUS_POISON_SHIFT"] == 1


def test_c_header_compiles_and_matches(tmp_path):
    import shutil
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    (tmp_path / "tcxl_csr.h").write_text(regmap.c_header())
    lines = ['#include <stdio.h>', '#include "tcxl_csr.h"', '#include "tcxl_csr.h"',
             "int main(void) {"]
    checks = []
    for r in csr_map.REGISTERS:
        checks.append((f"TCXL_CSR_{r.name}_OFFSET", r.offset))
        for f in r.fields:
            stem = r.name if r.whole else f"{r.name}_{f.name}"
            checks += [(f"TCXL_CSR_{stem}_MASK", f.mask), (f"TCXL_CSR_{stem}_SHIFT", f.lsb)]
    for name, _ in checks:
        lines.append(f'  printf("%lu\\n", (unsigned long){name});')
    lines += ['  printf("%lu\\n", (unsigned long)TCXL_CSR_GET(VERSION, MINOR, 0x12345678u));',
              "  return 0;", "}"]
    (tmp_path / "t.c").write_text("\n".join(lines) + "\n")
    subprocess.run([cc, "-std=c99", "-Wall", "-Werror", "-o", str(tmp_path / "t"),
                    str(tmp_path / "t.c")], check=True)
    out = subprocess.run([str(tmp_path / "t")], check=True, capture_output=True, text=True)
    values = [int(x) for x in out.stdout.split()]
    assert values == [v for _, v in checks] + [0x56]


# ----------------------------------------------------------------------------- RTL
def _write_if_changed(path: pathlib.Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def _verilog(variant: str) -> pathlib.Path:
    from amaranth.back import verilog
    from hw.cxl_controller.csr import CsrBlock
    dut = CsrBlock(**VARIANTS[variant]["kwargs"])
    text = verilog.convert(dut, name="csr_block", emit_src=False)
    path = REPO / "build" / "csr" / variant / "csr_block.v"
    _write_if_changed(path, text)
    return path


@pytest.fixture(scope="module")
def verilog_files():
    return {v: _verilog(v) for v in VARIANTS}


def test_csr_block_ports():
    from amaranth.lib.wiring import In, Out
    from hw.cxl_controller.csr import CsrBlock
    from amaranth.hdl import Fragment
    dut = CsrBlock()
    Fragment.get(dut, None)                            # elaborates (and marks it used)
    members = dut.signature.members
    assert members["irq"] == Out(1)
    assert members["hdm_base_lo_addr"] == Out(26)
    assert members["status_error_set"] == In(1) and members["status_error"] == Out(1)
    assert members["err_out_of_window_rd_inc"] == In(1)
    assert members["version_major"] == In(16)
    assert members["bus"].flow == In


@pytest.mark.sim
def test_csr_lint(verilog_files):
    from sim import runner
    runner.setup_path()
    v = verilog_files["csr_block"]
    res = subprocess.run(["verilator", "--lint-only", "-Wall", "-Wno-fatal", v.name],
                         cwd=v.parent, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    codes = set(re.findall(r"%Warning-([A-Z0-9_]+)", res.stderr))
    print("verilator -Wall warnings on csr_block.v:", sorted(codes))
    assert "%Error" not in res.stderr, res.stderr
    assert codes <= AMARANTH_WARNINGS, sorted(codes - AMARANTH_WARNINGS)


@pytest.mark.sim
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_csr_rtl(verilog_files, variant):
    from sim import runner
    bdir = runner.build(variant, [verilog_files[variant]], "csr_block")
    runner.run(bdir, "csr_block", "tests.csr_tb", env=VARIANTS[variant]["env"])
