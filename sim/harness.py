"""The Verilator top: TrainingCxlDevice plus one PMEM media model per memory channel.

``DeviceHarness(config, timing)`` is an Amaranth component whose ports are the device's
CXL.mem streams, its CSR AXI4-Lite port and irq, plus ``power_fail`` and ``tear_seed`` for
the media (sim/rtl/pmem_media.sv). The media are instances ``media0``..``media{N-1}``
(their lines are in C++ stores the backdoor reaches by ctypes: sim/bfm/pmem.py); the device is instance ``device``.
``build_harness(config)`` writes the Verilog and compiles it once per configuration.

Built for simulation speed (issue 14): Verilator re-evaluates every logic cone fed by a
top-level input or a VPI-writable signal after every input change. So only the ports are
public (``ports_control_file``; the media's watch and statistics by sim/rtl/harness.vlt), the device's reset
is a flip-flop of ``rst`` (the device leaves reset one cycle after ``rst`` falls), and the
media drive no output combinationally from ``power_fail`` or their arrays.
"""
from __future__ import annotations

import gc
import hashlib
import json
import pathlib
import warnings

from amaranth import ClockDomain, ClockSignal, DomainRenamer, Instance, Module, ResetSignal, Signal
from amaranth.back import verilog
from amaranth.hdl import UnusedElaboratable
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.config import DeviceConfig
from hw.top import TrainingCxlDevice
from .model.pmem_params import media_verilog_parameters
from . import runner

TOPLEVEL = "tcxl_harness"
# Device ports passed through to the Verilator top (cache_port only in the sim config).
DEVICE_PORTS = ("m2s_req", "m2s_rwd", "s2m_ndr", "s2m_drs", "d2h_req", "d2h_rsp", "d2h_data",
                "h2d_req", "h2d_rsp", "h2d_data", "cache_port", "csr", "irq")
MEDIA_SV = pathlib.Path(__file__).resolve().parent / "rtl" / "pmem_media.sv"
MEDIA_VLT = MEDIA_SV.with_name("harness.vlt")
MEDIA_STORE = MEDIA_SV.with_name("pmem_store.cpp")     # the media's sparse line store (DPI-C)
MEDIA_SOURCES = (MEDIA_SV, MEDIA_STORE)


class DeviceHarness(wiring.Component):
    def __init__(self, config: DeviceConfig):
        self.config = config
        self.device = TrainingCxlDevice(config)
        dev_sig = self.device.signature.members
        super().__init__({
            **{name: dev_sig[name] for name in DEVICE_PORTS if name in dev_sig},
            "power_fail": In(1),
            "tear_seed": In(32),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self.config
        # The device runs in its own domain whose reset is a flip-flop of the harness's `rst`
        # (one cycle later), as a board's reset synchronizer gives it (hw/board/reset_sync.py).
        # Why here: Amaranth folds a synchronous reset into every register's next-state logic,
        # so with `rst` a top-level input Verilator would put almost the whole device in its
        # input-combinational region and evaluate it again after every input change.
        m.domains.dev = dev_domain = ClockDomain("dev", local=True)
        rst_q = Signal(init=1)
        m.d.sync += rst_q.eq(ResetSignal())
        m.d.comb += [dev_domain.clk.eq(ClockSignal()), dev_domain.rst.eq(rst_q)]
        m.submodules.device = DomainRenamer("dev")(self.device)
        dev = self.device
        for name in DEVICE_PORTS:
            if name == "irq" or name not in self.signature.members:
                continue
            if self.signature.members[name].flow == In:
                wiring.connect(m, wiring.flipped(getattr(self, name)), getattr(dev, name))
            else:
                wiring.connect(m, getattr(dev, name), wiring.flipped(getattr(self, name)))
        m.d.comb += self.irq.eq(dev.irq)
        params = media_verilog_parameters(
            cfg.clock_mhz, depth_lines=cfg.lines_per_channel,
            id_width=len(dev.pmem0.arid), addr_width=len(dev.pmem0.araddr))
        for c in range(cfg.channels):
            axi = getattr(dev, f"pmem{c}")
            ports = {}
            for pname, member in axi.signature.members.items():
                direction = "i" if member.flow == Out else "o"   # manager Out -> media input
                ports[f"{direction}_{pname}"] = getattr(axi, pname)
            m.submodules[f"media{c}"] = Instance(
                "pmem_media",
                **{f"p_{k}": v for k, v in params.items()},
                i_clk=ClockSignal(), i_power_fail=self.power_fail, i_tear_seed=self.tear_seed,
                **ports)
        return m


def config_key(config: DeviceConfig) -> str:
    blob = json.dumps(config.__dict__, sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()[:10]


def source_digest() -> str:
    """SHA-1 over everything the harness Verilog is generated from: every file of hw/, this
    file, the media parameters (sim/model/pmem_params.py) and the Amaranth version."""
    import amaranth
    here = pathlib.Path(__file__).resolve()
    hw = runner.REPO / "hw"
    files = [(f.relative_to(hw).as_posix(), f) for f in sorted(hw.rglob("*.py"))]
    files += [("sim/harness.py", here), ("sim/model/pmem_params.py", here.parent / "model" / "pmem_params.py")]
    h = hashlib.sha1(amaranth.__version__.encode())
    for name, f in files:
        h.update(name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


# The digest of the sources this process has loaded (hw.top and everything it imports are
# imported above, before this line).
LOADED_DIGEST = source_digest()


def build_harness(config: DeviceConfig) -> pathlib.Path:
    """Generate and compile the harness for ``config``; returns the build folder.

    The Verilog (about 40 s of Amaranth conversion) is generated again only when
    ``LOADED_DIGEST`` (the sources as this process imported them) differs from the one
    stamped next to it; Verilator's make then
    rebuilds only when the Verilog changed. Next to it, ``ports.vlt`` (``ports_control_file``)."""
    name = f"harness-{config_key(config)}"
    vdir = runner.BUILD / "sim" / "src" / name
    vdir.mkdir(parents=True, exist_ok=True)
    vfile, stamp = vdir / f"{TOPLEVEL}.v", vdir / "source.sha1"
    # The Verilog comes from the hw/ modules this process imported, so it is stamped with
    # their digest as loaded, not with the files' digest now: a long test session whose hw/
    # files were edited after it started stamped its stale Verilog with the new digest, and
    # every later process reused it.
    digest = LOADED_DIGEST
    if source_digest() != digest:
        warnings.warn("hw/ changed since this process imported it: the harness Verilog is "
                      "generated from the code as loaded", stacklevel=2)
    with runner.build_lock(vdir):   # another worker may be writing the same file
        if not (vfile.exists() and stamp.exists() and stamp.read_text() == digest):
            text = verilog.convert(DeviceHarness(config), name=TOPLEVEL, emit_src=False)
            if not vfile.exists() or vfile.read_text() != text:   # keep mtime: no needless rebuild
                vfile.write_text(text)
            stamp.write_text(digest)
        ports_vlt = vdir / "ports.vlt"
        with warnings.catch_warnings():
            # A harness built only for its signature: its submodules, never elaborated, would
            # each warn (UnusedElaboratable) when collected, in every simulation's log.
            warnings.simplefilter("ignore", UnusedElaboratable)
            harness = DeviceHarness(config)
            text = ports_control_file(harness)
            del harness
            gc.collect()
        if not ports_vlt.exists() or ports_vlt.read_text() != text:
            ports_vlt.write_text(text)
    return runner.build(name, [vfile, *MEDIA_SOURCES, MEDIA_VLT, ports_vlt], TOPLEVEL, public_top=False)


def ports_control_file(harness: DeviceHarness) -> str:
    """A Verilator control file that makes exactly the harness's ports public (inputs
    writable, outputs readable), in place of --public-depth 1.

    Why: --public-depth 1 also makes every wire of the top module public and writable, and
    Amaranth puts all the wiring between the harness's submodules there; Verilator must treat
    a VPI-writable signal like an input and re-evaluates everything combinationally downstream
    of it on every evaluation ('ico' region), which was most of the device."""
    lines = ["`verilator_config", "// generated by sim/harness.py ports_control_file"]
    ports = [("clk", In), ("rst", In)]
    for path, member, _value in harness.signature.flatten(harness):
        ports.append(("__".join(str(p) for p in path), member.flow))
    for name, flow in ports:
        kind = "public_flat_rw" if flow == In else "public_flat_rd"
        lines.append(f'{kind} -module "{TOPLEVEL}" -var "{name}"')
    return "\n".join(lines) + "\n"
