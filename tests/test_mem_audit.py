"""FPGA memory rules (issue 13): tools/mem_audit.py's classification, the device's memories,
and the rebuilt bias table's single write port (Amaranth's simulator).

The device test: no memory of the default device becomes flip-flops above the 4-kbit limit
(README, Synthesis); the memories rebuilt in issue 13 (the update engine's scratchpad and tag
store, the CXL.cache agent's tracker data) are named, so a regression says which one."""
import pytest
from amaranth import Module
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In
from amaranth.sim import Simulator

from hw.config import DeviceConfig
from hw.cxl_controller.bias import BiasTable
from tools.mem_audit import FF_LIMIT_BITS, audit, classify, format_table, summary, violations

# Multi-write-port memories rebuilt in issue 13 (hw/common/ram.py) and what they became.
REBUILT = {"update.scratch": "bram", "update.tags_way": "bram", "cxl_cache.t_data": "lutram"}


@pytest.mark.parametrize("w, ra, rs, depth, bits, want", [
    (0, 1, 0, 16, 512, "rom"),
    (1, 0, 1, 1024, 1 << 19, "bram"),
    (1, 0, 2, 1024, 1 << 19, "bram"),
    (1, 0, 1, 8, 4096, "lutram"),          # small synchronous: LUT RAM with an output register
    (1, 2, 0, 1 << 16, 1 << 16, "lutram"),
    (2, 0, 1, 1024, 1 << 19, "ff"),
    (3, 1, 0, 64, 64, "ff"),
])
def test_classify(w, ra, rs, depth, bits, want):
    assert classify(w, ra, rs, depth, bits)[0] == want


class _Two(wiring.Component):
    """A block with one memory of each kind, to check the hierarchy walk."""
    def __init__(self):
        super().__init__({"x": In(1)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.bram = bram = memory.Memory(shape=64, depth=1024, init=[])
        bram.write_port(), bram.read_port()
        m.submodules.ff = ff = memory.Memory(shape=8, depth=1024, init=[])
        ff.write_port(), ff.write_port(), ff.read_port(domain="comb")
        m.submodules.inner = inner = Module()
        inner.submodules.lut = lut = memory.Memory(shape=32, depth=32, init=[])
        lut.write_port(), lut.read_port(domain="comb"), lut.read_port(domain="comb")
        return m


def test_audit_walks_the_hierarchy():
    reports = {r.path: r for r in audit(top=_Two())}
    assert set(reports) == {"bram", "ff", "inner.lut"}
    assert reports["bram"].mapping == "bram" and reports["bram"].bram36 == 2     # 1024 x 64: 2 x (1K x 36)
    assert reports["ff"].mapping == "ff" and reports["ff"].write_ports == 2 and reports["ff"].bits == 8192
    assert reports["inner.lut"].mapping == "lutram" and reports["inner.lut"].async_reads == 2
    assert [r.path for r in violations(list(reports.values()))] == ["ff"]
    assert summary(list(reports.values()))["violations"] == ["ff"]
    assert "flip-flops above the limit" in format_table(list(reports.values()))


def test_default_device_flip_flop_memories():
    """No memory of the default device maps to flip-flops above FF_LIMIT_BITS; the rebuilt
    ones are one-write banks of block RAM / LUT RAM with only a small flip-flop LVT."""
    reports = audit(DeviceConfig())
    bad = violations(reports, FF_LIMIT_BITS)
    assert not bad, "flip-flop memories above the limit:\n" + format_table(bad)
    for prefix, mapping in REBUILT.items():
        parts = [r for r in reports if r.path.startswith(prefix)]
        banks = [r for r in parts if not r.path.endswith(".lvt")]
        assert banks and all(r.mapping == mapping and r.write_ports == 1 for r in banks), \
            format_table(parts)
        assert sum(r.bits for r in parts if r.mapping == "ff") <= 1024, format_table(parts)
    bias = next(r for r in reports if r.path == "bias.bits")
    assert bias.mapping == "lutram" and bias.write_ports == 1


# --------------------------------------------------------------------------------------------
# the bias table's one write port
# --------------------------------------------------------------------------------------------
def _bias_bench(body):
    dut = BiasTable(pages=16, page_line_bits=2, window=4)

    async def bench(ctx):
        ctx.set(dut.port.req.ready, 1)
        await body(ctx, dut)

    sim = Simulator(dut)
    sim.add_clock(1e-9)

    async def answers(ctx):        # the host answers every ACQUIRE two cycles later
        pending = []
        while True:
            await ctx.tick()
            if ctx.get(dut.port.req.valid) and ctx.get(dut.port.req.ready):
                pending.append(2)
            pending = [p - 1 for p in pending]
            due = bool(pending) and pending[0] <= 0
            ctx.set(dut.port.rsp.valid, int(due))
            if due:
                pending.pop(0)

    sim.add_testbench(answers, background=True)
    sim.add_testbench(bench)
    sim.run()


async def _flip(ctx, dut, page, to_device, seq, max_cycles=200):
    ctx.set(dut.flip_page, page)
    ctx.set(dut.flip_to_device, int(to_device))
    ctx.set(dut.flip_seq, seq)
    for _ in range(max_cycles):
        await ctx.tick()
        if ctx.get(dut.done_seq) == seq:
            return
    raise AssertionError(f"flip {seq} of page {page} did not finish")


def _bit(ctx, dut, page):
    ctx.set(dut.query_page, page)
    return ctx.get(dut.query_device)


def test_bias_host_and_engine_writes_share_one_port():
    async def body(ctx, dut):
        await _flip(ctx, dut, 5, True, 1)
        await _flip(ctx, dut, 9, True, 2)
        assert (_bit(ctx, dut, 5), _bit(ctx, dut, 9)) == (1, 1)
        # Same cycle: the host flips page 9 to host bias while the engine is asked to flip
        # page 5 to host bias. The host's write goes first; the engine's follows a cycle later.
        ctx.set(dut.host_page, 9)
        assert ctx.get(dut.host_device) == 1
        ctx.set(dut.host_flip_page, 9)
        ctx.set(dut.host_to_host, 1)
        ctx.set(dut.flip_page, 5)
        ctx.set(dut.flip_to_device, 0)
        ctx.set(dut.flip_seq, 3)
        assert ctx.get(dut.host_device) == 1           # a read in the write's cycle: the old bit
        await ctx.tick()
        ctx.set(dut.host_to_host, 0)
        assert ctx.get(dut.host_device) == 0           # the next cycle: the new bit
        assert ctx.get(dut.done_seq) == 2 and _bit(ctx, dut, 5) == 1    # the engine waited
        await ctx.tick()
        assert ctx.get(dut.done_seq) == 3 and _bit(ctx, dut, 5) == 0 and _bit(ctx, dut, 9) == 0
        # Back to back: the host flips pages 1, 2, 3 in consecutive cycles while a flip of page 4
        # to device finishes; every write lands.
        await _flip(ctx, dut, 1, True, 4)
        await _flip(ctx, dut, 2, True, 5)
        await _flip(ctx, dut, 3, True, 6)
        ctx.set(dut.flip_page, 4)
        ctx.set(dut.flip_to_device, 1)
        ctx.set(dut.flip_seq, 7)
        for page in (1, 2, 3) * 8:                     # host traffic while the engine acquires
            ctx.set(dut.host_flip_page, page)
            ctx.set(dut.host_to_host, 1)
            await ctx.tick()
        ctx.set(dut.host_to_host, 0)
        for _ in range(100):
            if ctx.get(dut.done_seq) == 7:
                break
            await ctx.tick()
        await ctx.tick()
        assert [_bit(ctx, dut, p) for p in (1, 2, 3, 4)] == [0, 0, 0, 1]
        assert ctx.get(dut.error) == 0
    _bias_bench(body)
