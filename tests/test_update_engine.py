"""UpdateEngine (hw/ndp/update/engine.py): sparse SGD next to memory, bit-exact with the golden model.

The engine is converted alone to build/update_engine/<variant>/update_engine.v, linted with
verilator -Wall (Amaranth's habitual warnings waived), built with Verilator and driven by
the cocotb module tests/update_engine_tb.py (processor + out-of-order memory stand-ins; every
command is checked against sim.model.embedding.tbe_sgd_step bit for bit) in two
configurations: the default scratchpad (1024 lines) and a small one (64 lines) where batches
overflow the scratchpad. TCXL_SEED=<n> replays a run (the seed is printed).
"""
from __future__ import annotations

import hashlib
import os
import pathlib
import random
import re
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# The build's address space; UE_TEST_ADDR_BITS / UE_TEST_CAPACITY replay a device layout (a
# separate build: the Verilog is keyed on them).
ADDR_BITS = int(os.environ.get("UE_TEST_ADDR_BITS", "16"))
CAPACITY = int(os.environ.get("UE_TEST_CAPACITY", "60000"))   # not a power of two: the range checks compare exactly
# variant -> (scratch lines, FP32 pipeline)
VARIANTS = {"update_engine": (1024, "compact"), "update_engine_small": (64, "compact"),
            "update_engine_deep": (1024, "deep")}
TESTS = {
    "update_engine": ["test_mixed_modes", "test_hot_rows_and_dim256", "test_shared_table_pair",
                      "test_scratchpad_overflow", "test_errors",
                      "test_media_error", "test_perf", "test_rm4_trace",
                      "test_tag_conflicts_under_backpressure"],
    "update_engine_small": ["test_mixed_modes", "test_hot_rows_and_dim256", "test_shared_table_pair",
                            "test_scratchpad_overflow",
                            "test_rm4_trace", "test_tag_conflicts_under_backpressure"],
    # the 12-cycle FMA: hot rows exercise the longer same-line hazard window and forwarding
    "update_engine_deep": ["test_mixed_modes", "test_hot_rows_and_dim256", "test_scratchpad_overflow"],
}
# Warnings Amaranth's Verilog raises under -Wall (docs/toolchain.md, hw/trainingcxl.vlt).
AMARANTH_WARNINGS = {"WIDTHEXPAND", "WIDTHTRUNC", "CASEINCOMPLETE", "PROCASSINIT", "UNUSEDSIGNAL",
                     "DECLFILENAME", "UNDRIVEN", "ALWNEVER"}
SEED = int(os.environ.get("TCXL_SEED", "0")) or random.randrange(1, 1 << 31)


def _write_if_changed(path: pathlib.Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


# Converting the engine takes ~15 s of Amaranth time per variant; the Verilog is reused while
# the hw/ sources, the parameters and the Amaranth version are unchanged. The key is the digest
# of hw/ as this process imported it (sim/harness.py LOADED_DIGEST), not of the files now: a
# hand-kept list of files missed hw/common/ram.py, and files edited during a long session
# would have stamped Verilog of the code as loaded with the digest of the code as edited.


def _verilog(variant: str) -> pathlib.Path:
    import amaranth
    from sim.harness import LOADED_DIGEST
    path = REPO / "build" / "update_engine" / variant / "update_engine.v"
    stamp = path.with_suffix(".sha256")
    h = hashlib.sha256(f"{amaranth.__version__} {ADDR_BITS} {CAPACITY} {VARIANTS[variant]}".encode())
    h.update(LOADED_DIGEST.encode())
    key = h.hexdigest()
    if path.exists() and stamp.exists() and stamp.read_text() == key:
        return path
    from amaranth.back import verilog
    from hw.ndp.update import UpdateEngine
    scratch, pipeline = VARIANTS[variant]
    dut = UpdateEngine(addr_bits=ADDR_BITS, capacity_lines=CAPACITY, scratch_lines=scratch, fp32_pipeline=pipeline)
    _write_if_changed(path, verilog.convert(dut, name="update_engine", emit_src=False))
    stamp.write_text(key)
    return path


_BUILT: dict = {}


def _built(variant: str) -> tuple[pathlib.Path, pathlib.Path]:
    """(Verilog file, Verilator build folder) of ``variant``, built once per session."""
    if variant not in _BUILT:
        from sim import runner
        v = _verilog(variant)
        _BUILT[variant] = (v, runner.build(variant, [v], "update_engine"))
    return _BUILT[variant]


def test_constructor_contract():
    from hw.ndp.update import UpdateEngine
    assert UpdateEngine.required_ctx_bits(1024) == 13
    e = UpdateEngine(addr_bits=20, capacity_lines=1 << 20)
    assert e.ctx_bits == 13 and e.signature.members["mem"].signature.members["req"].signature is not None
    assert UpdateEngine(addr_bits=20, capacity_lines=1000, ctx_bits=16).ctx_bits == 16
    for bad in (dict(ctx_bits=8), dict(scratch_lines=8), dict(scratch_lines=100), dict(capacity_lines=1 << 21)):
        kw = {"addr_bits": 20, "capacity_lines": 1 << 20, **bad}
        with pytest.raises(ValueError):
            UpdateEngine(**kw)


@pytest.mark.sim
def test_update_engine_lint():
    from sim import runner
    runner.setup_path()
    v = _verilog("update_engine")
    res = subprocess.run(["verilator", "--lint-only", "-Wall", "-Wno-fatal", v.name],
                         cwd=v.parent, capture_output=True, text=True)
    codes = set(re.findall(r"%Warning-([A-Z0-9_]+)", res.stderr))
    print("verilator -Wall warnings on update_engine.v:", sorted(codes))
    assert res.returncode == 0 and "%Error" not in res.stderr, res.stderr[-4000:]
    assert codes <= AMARANTH_WARNINGS, sorted(codes - AMARANTH_WARNINGS)


@pytest.mark.sim
@pytest.mark.parametrize("variant,testcase", [(v, t) for v in VARIANTS for t in TESTS[v]])
def test_update_engine_rtl(variant, testcase):
    from sim import runner
    print(f"TCXL_SEED={SEED}")
    env = {"UE_ADDR_BITS": str(ADDR_BITS), "UE_CAPACITY": str(CAPACITY), "UE_SCRATCH": str(VARIANTS[variant][0]),
           "TCXL_SEED": str(SEED)}
    runner.run(_built(variant)[1], "update_engine", "tests.update_engine_tb", testcase, env=env)
