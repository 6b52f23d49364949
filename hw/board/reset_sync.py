"""AresetnSynchronizer: the board's active-low reset into a domain's synchronous reset.

Ports
- ``aresetn`` In(1): active low, from the board (a push button, the MIG's ``ui_clk_sync_rst``
  inverted, a processor system reset...). It may assert and release at any time, unrelated
  to the clock.
- ``rst`` Out(1): active high, for the domain's (synchronous) reset.

Behaviour
- ``aresetn`` low clears all ``stages`` flip-flops at once, asynchronously (they have
  ``aresetn`` on their clear pin), so ``rst`` asserts at once, even with no clock running.
- After ``aresetn`` rises, a one shifts through the chain on the domain's clock: ``rst``
  falls on the ``stages``-th rising edge, synchronously, so every flip-flop of the domain
  leaves reset in the same cycle. The first flip-flop may go metastable if ``aresetn`` rose
  close to the edge; the following ones give it a cycle each to settle.
- The chain carries ``ASYNC_REG = "TRUE"`` (Vivado places the flip-flops next to each other
  and keeps them out of shift-register extraction); the timing path from ``aresetn`` to their
  clear pins is a false path in the XDC that ``trainingcxl verilog --board`` writes.
"""
from amaranth import Cat, ClockDomain, ClockSignal, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out


class AresetnSynchronizer(wiring.Component):
    """Asynchronous assertion, synchronous release of ``domain``'s reset (``stages`` >= 2)."""

    aresetn: In(1)
    rst: Out(1)

    def __init__(self, *, domain="sync", stages=3):
        if stages < 2:
            raise ValueError(f"a reset synchronizer needs at least 2 stages, got {stages}")
        self.domain = domain
        self.stages = stages
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        # A local domain on the same clock whose flip-flops are cleared by ~aresetn.
        m.domains.arst = arst = ClockDomain("arst", async_reset=True, local=True)
        m.d.comb += [arst.clk.eq(ClockSignal(self.domain)), arst.rst.eq(~self.aresetn)]
        chain = Signal(self.stages, name="stage", init=0, attrs={"ASYNC_REG": "TRUE"})
        m.d.arst += chain.eq(Cat(1, chain[:-1]))
        m.d.comb += self.rst.eq(~chain[-1])
        return m
