"""The CXL.cache agent's snoop state rule (``snoop_next_state`` in
hw/cxl_controller/cxl_cache.py) in Amaranth's simulator, for every 3-bit snoop opcode and
every MESI state.

The agent applies the rule at each holder (the cache's state for a hit, each tracker's
eviction state for an evicted line), so it must equal the CXL 3.2 snoop semantics (Table
3-26) on its own: SnpInv leaves the line I; SnpData leaves a valid line S and an I line I;
SnpCur and the reserved opcodes change nothing (the agent answers those RspIHitI). The
expected table is written here from the specification, not computed by the RTL's function.
"""
from amaranth import Module, Signal
from amaranth.sim import Simulator

from hw.common.cxl_cache import H2DReqOpcode
from hw.cxl_controller.cxl_cache import Mesi, snoop_next_state


def expected(opcode: int, state: Mesi) -> Mesi:
    if opcode == H2DReqOpcode.SNP_INV.value:
        return Mesi.I
    if opcode == H2DReqOpcode.SNP_DATA.value:
        return Mesi.I if state == Mesi.I else Mesi.S
    return state                     # SnpCur, reserved opcodes


def test_snoop_next_state_every_opcode_and_state():
    m = Module()
    opcode = Signal(3)
    state = Signal(Mesi)
    nxt = Signal(Mesi)
    m.d.comb += nxt.eq(snoop_next_state(opcode, state))
    sim = Simulator(m)
    seen = []

    async def bench(ctx):
        for op in range(8):
            for st in Mesi:
                ctx.set(opcode, op)
                ctx.set(state, st)
                got = ctx.get(nxt)
                assert got == expected(op, st), f"opcode {op:03b}, state {st.name}: got {got}"
                seen.append((op, st))

    sim.add_testbench(bench)
    sim.run()
    assert len(seen) == 8 * len(Mesi)
