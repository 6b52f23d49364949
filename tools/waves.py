"""``trainingcxl waves TEST``: open the last waveform of a test in GTKWave, grouped by channel.

Tests dump waves when run with ``WAVES=1`` (FST with liblz4-dev, else VCD); sim/runner.py
copies each dump to ``build/waves/<test>.fst|vcd``. This writes ``build/waves/<test>.gtkw``
with one group per interface (CXL.mem and CXL.cache channels, the cache port, the CSR port,
each PMEM channel), the
signal widths taken from the layouts in hw/ (never retyped), then starts GTKWave. Without
a display it only writes the save file and prints the command to use.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

from tools.cli_args import CliError

REPO = pathlib.Path(__file__).resolve().parent.parent
WAVES = REPO / "build" / "waves"
TOP = "tcxl_harness"


def _groups():
    from hw.config import DeviceConfig
    from sim.harness import DeviceHarness, DEVICE_PORTS
    cfg = DeviceConfig.for_simulation()
    harness = DeviceHarness(cfg)
    groups = []
    top = harness.signature.members
    for name in DEVICE_PORTS:
        if name not in top or top[name].is_port:
            continue
        sigs = []
        for (path, member) in _members(top[name]):
            sigs.append((f"{TOP}.{name}__{'__'.join(path)}", _width(member)))
        groups.append((name, sigs))
    axi = harness.device.signature.members["pmem0"].signature.members
    for c in range(cfg.channels):
        sigs = [(f"{TOP}.media{c}.{pname}", _width(m)) for pname, m in axi.items()]
        groups.append((f"pmem{c}", sigs))
    groups.append(("power", [(f"{TOP}.power_fail", 1), (f"{TOP}.irq", 1),
                             (f"{TOP}.rst", 1)]))
    return groups


def _members(member, path=()):
    if member.is_port:
        yield path, member
        return
    for name, sub in member.signature.members.items():
        yield from _members(sub, path + (name,))


def _width(member) -> int:
    from amaranth.hdl import Shape
    return Shape.cast(member.shape).width


def write_gtkw(test: str, dump: pathlib.Path) -> pathlib.Path:
    lines = [f'[dumpfile] "{dump}"', f'[savefile] "{dump.with_suffix(".gtkw")}"',
             "[timestart] 0", "@28", f"{TOP}.clk"]
    for group, sigs in _groups():
        lines += ["@800200", f"-{group}"]
        for name, width in sigs:
            if width == 1:
                lines += ["@28", name]
            else:
                lines += ["@22", f"{name}[{width - 1}:0]"]
        lines += ["@1000200", f"-{group}"]
    path = dump.with_suffix(".gtkw")
    path.write_text("\n".join(lines) + "\n")
    return path


def find_dump(test: str) -> pathlib.Path | None:
    for ext in ("fst", "vcd"):
        p = WAVES / f"{test}.{ext}"
        if p.exists():
            return p
    return None


def open_waves(test: str, *, no_gui: bool = False) -> int:
    dump = find_dump(test)
    if dump is None:
        have = sorted({p.stem for ext in ("fst", "vcd") for p in WAVES.glob(f"*.{ext}")})
        raise CliError(f"no waveform for {test!r} in {WAVES} (have: {', '.join(have) or 'none'}); "
                       f"run the test with waves first: WAVES=1 make sim PYTEST_ARGS='-k {test}'")
    gtkw = write_gtkw(test, dump)
    print(f"wrote {gtkw}")
    cmd = ["gtkwave", str(dump), str(gtkw)]
    if no_gui or not os.environ.get("DISPLAY") or not shutil.which("gtkwave"):
        why = "gtkwave is not installed (apt-get install gtkwave)" if not shutil.which(
            "gtkwave") else "no DISPLAY" if not os.environ.get("DISPLAY") else "--no-gui"
        print(f"not starting GTKWave ({why}); open it with:\n  {' '.join(cmd)}")
        return 0
    return subprocess.call(cmd)
