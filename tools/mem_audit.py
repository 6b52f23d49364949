"""`trainingcxl memaudit`: every on-chip memory of a device build, classified by FPGA rules.

What it does: elaborates ``TrainingCxlDevice(config)`` (seconds, no synthesis), finds every
``amaranth.lib.memory.Memory`` in the hierarchy and classifies it by its ports, the way
Yosys' ``memory_libmap`` maps memories on Xilinx UltraScale+ (synth_xilinx):

- ``bram``: one write port, synchronous reads only: block RAM (or UltraRAM when deep and
  wide); one replica per read port. A read transparent to the write port is a block RAM
  write-first mode or a bypass Yosys adds.
- ``lutram``: one write port and asynchronous reads: distributed (LUT) RAM, one replica per
  read port (64 bits per LUT); also small synchronous memories (depth <= 64 or <= 4 kbit),
  LUT RAM with a registered output.
- ``ff``: two or more write ports: no RAM primitive has them with independent addresses, so
  the memory becomes flip-flops plus a write decoder and read multiplexers per port.
- ``rom``: no write port (constant contents).

The rule the device follows (issue 13): no ``ff`` memory above ``FF_LIMIT_BITS``; an engine
that needs more ports banks or replicates a memory and resolves same-cycle read-after-write
with an explicit bypass register. Resource figures are estimates from the geometry (BRAM36:
the best of the 32Kx1 .. 512x72 aspect ratios per replica; LUTs: bits / 64 per replica),
not synthesis results (``trainingcxl synth`` gives those).

Contract: ``audit(config) -> list[MemoryReport]`` (sorted by path); ``violations(reports,
limit)``: the ``ff`` memories above ``limit`` bits. The command prints a table, writes JSON
with ``--json``, and exits 1 when there are violations.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import pathlib
from tools.cli_args import CliParser, non_negative_int

FF_LIMIT_BITS = 4096
SMALL_DEPTH = 64             # synchronous memories this shallow go to LUT RAM (memory_libmap's cost)
# BRAM36 aspect ratios (depth, width) in SDP/TDP mode.
BRAM36_SHAPES = ((32768, 1), (16384, 2), (8192, 4), (4096, 9), (2048, 18), (1024, 36), (512, 72))


@dataclasses.dataclass(frozen=True)
class MemoryReport:
    path: str                    # hierarchy path, e.g. "update.scratch"
    depth: int
    width: int
    write_ports: int
    async_reads: int
    sync_reads: int
    transparent_reads: int       # read ports transparent for some write port
    mapping: str                 # bram | lutram | ff | rom
    reason: str

    @property
    def bits(self) -> int:
        return self.depth * self.width

    @property
    def bram36(self) -> int:
        if self.mapping != "bram":
            return 0
        one = min(math.ceil(self.depth / d) * math.ceil(self.width / w) for d, w in BRAM36_SHAPES)
        return one * max(self.sync_reads, 1)

    @property
    def lut_estimate(self) -> int:
        if self.mapping != "lutram":
            return 0
        return math.ceil(self.bits / 64) * max(self.async_reads + self.sync_reads, 1)

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "bits": self.bits, "bram36_estimate": self.bram36,
                "lutram_luts_estimate": self.lut_estimate}


def classify(write_ports: int, async_reads: int, sync_reads: int, depth: int = 1 << 16,
             bits: int = 1 << 30) -> tuple[str, str]:
    if write_ports == 0:
        return "rom", "no write port"
    if write_ports > 1:
        return "ff", f"{write_ports} write ports (a RAM primitive has one per independent address)"
    if async_reads:
        return "lutram", "asynchronous read" + (f"s ({async_reads} replicas)" if async_reads > 1 else "")
    replicas = f" ({sync_reads} replicas)" if sync_reads > 1 else ""
    if depth <= SMALL_DEPTH or bits <= FF_LIMIT_BITS:
        return "lutram", "synchronous read, small: LUT RAM with a registered output" + replicas
    return "bram", "synchronous read" + replicas


def _reports(fragment, path: str) -> list[MemoryReport]:
    from amaranth.hdl import Shape
    from amaranth.lib import memory
    found = []
    for sub, name, *_ in fragment.subfragments:
        here = f"{path}.{name}" if path else str(name)
        mem = next((o for o in (getattr(sub, "origins", None) or ()) if isinstance(o, memory.Memory)), None)
        if mem is not None:
            reads = mem.read_ports
            a = sum(r.domain == "comb" for r in reads)
            s = len(reads) - a
            width = Shape.cast(mem.shape).width
            mapping, reason = classify(len(mem.write_ports), a, s, mem.depth, mem.depth * width)
            found.append(MemoryReport(here, mem.depth, width, len(mem.write_ports), a, s,
                                      sum(bool(r.transparent_for) for r in reads), mapping, reason))
        found += _reports(sub, here)
    return found


def audit(config=None, top=None) -> list[MemoryReport]:
    """Every memory of ``top`` (default: ``TrainingCxlDevice(config)``, config default
    ``DeviceConfig()``)."""
    from amaranth.hdl import Fragment
    if top is None:
        from hw.config import DeviceConfig
        from hw.top import TrainingCxlDevice
        top = TrainingCxlDevice(config if config is not None else DeviceConfig())
    return sorted(_reports(Fragment.get(top, None), ""), key=lambda r: r.path)


def violations(reports: list[MemoryReport], limit: int = FF_LIMIT_BITS) -> list[MemoryReport]:
    return [r for r in reports if r.mapping == "ff" and r.bits > limit]


def summary(reports: list[MemoryReport], limit: int = FF_LIMIT_BITS) -> dict:
    by = {k: [r for r in reports if r.mapping == k] for k in ("bram", "lutram", "ff", "rom")}
    return {
        "memories": len(reports),
        "ff_limit_bits": limit,
        "bram36_estimate": sum(r.bram36 for r in reports),
        "lutram_luts_estimate": sum(r.lut_estimate for r in reports),
        "ff_bits": sum(r.bits for r in by["ff"]),
        "counts": {k: len(v) for k, v in by.items()},
        "violations": [r.path for r in violations(reports, limit)],
    }


def format_table(reports: list[MemoryReport], limit: int = FF_LIMIT_BITS) -> str:
    rows = [f"{'memory':44s} {'depth':>6s} {'width':>5s} {'kbit':>7s} {'W':>2s} {'Ra':>2s} {'Rs':>2s} "
            f"{'map':7s} {'BRAM36':>6s} {'LUT':>6s}  note"]
    for r in sorted(reports, key=lambda r: (-r.bits, r.path)):
        flag = "  <-- flip-flops above the limit" if r in violations(reports, limit) else ""
        rows.append(f"{r.path:44s} {r.depth:6d} {r.width:5d} {r.bits / 1024:7.1f} {r.write_ports:2d} "
                    f"{r.async_reads:2d} {r.sync_reads:2d} {r.mapping:7s} {r.bram36:6d} {r.lut_estimate:6d}  "
                    f"{r.reason}{flag}")
    s = summary(reports, limit)
    rows.append(f"{s['memories']} memories: {s['counts']}; ~{s['bram36_estimate']} BRAM36, "
                f"~{s['lutram_luts_estimate']} LUTs of LUT RAM, {s['ff_bits'] / 1024:.1f} kbit in flip-flops; "
                f"{len(s['violations'])} flip-flop memories above {limit} bits")
    return "\n".join(rows)


def cmd_memaudit(args) -> int:
    from hw.config import DeviceConfig
    cfg = DeviceConfig.for_simulation() if args.config == "sim" else DeviceConfig()
    reports = audit(cfg)
    print(format_table(reports, args.ff_limit_bits))
    if args.json:
        from tools.harness_run import write_json
        write_json(pathlib.Path(args.json), {"config": args.config, **summary(reports, args.ff_limit_bits),
                                             "memories_detail": [r.as_dict() for r in reports]})
    return 1 if violations(reports, args.ff_limit_bits) else 0


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("memaudit", help="every on-chip memory classified by FPGA rules (BRAM / LUT RAM / FF)")
    p.add_argument("--config", choices=("default", "sim"), default="default",
                   help="the default (64 GiB) build or the simulation build")
    p.add_argument("--ff-limit-bits", type=non_negative_int, default=FF_LIMIT_BITS,
                   help="largest memory allowed in flip-flops (default %(default)s)")
    p.add_argument("--json", help="write the report as JSON")
    p.set_defaults(func=cmd_memaudit)
    return p


if __name__ == "__main__":     # pragma: no cover
    parser = CliParser()
    add_parser(parser.add_subparsers(required=True))
    a = parser.parse_args()
    raise SystemExit(a.func(a))
