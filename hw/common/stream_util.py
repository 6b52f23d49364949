"""Small stream building blocks shared by the device blocks.

``RoundRobinArbiter``: N input streams of one payload shape to one output stream.
Combinational (0 cycles): ``o.valid`` = any input valid, the granted input sees ``o.ready``.
The grant rotates past the last input that completed a transfer, so every input that keeps
``valid`` high is served within N transfers (no starvation). Payloads are never reordered
within one input.
"""
from amaranth import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out


class RoundRobinArbiter(wiring.Component):
    def __init__(self, shape, n):
        self._n = n
        super().__init__({
            **{f"i{k}": In(stream.Signature(shape)) for k in range(n)},
            "o": Out(stream.Signature(shape)),
        })

    @property
    def inputs(self):
        return [getattr(self, f"i{k}") for k in range(self._n)]

    def elaborate(self, platform):
        m = Module()
        n = self._n
        inputs = self.inputs
        last = Signal(range(n), init=n - 1)     # last input granted a transfer
        grant = Signal(range(n))
        any_valid = Signal()
        m.d.comb += any_valid.eq(sum(i.valid for i in inputs) != 0) if n > 1 else \
            any_valid.eq(inputs[0].valid)
        # Priority order starting after `last`: scan candidates from highest to lowest
        # priority so the last assignment (highest priority) wins.
        for offset in reversed(range(1, n + 1)):
            for k in range(n):
                with m.If((last == (k - offset) % n) & inputs[k].valid):
                    m.d.comb += grant.eq(k)
        with m.Switch(grant):
            for k in range(n):
                with m.Case(k):
                    m.d.comb += [
                        self.o.payload.eq(inputs[k].payload),
                        inputs[k].ready.eq(self.o.ready),
                    ]
        m.d.comb += self.o.valid.eq(any_valid)
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += last.eq(grant)
        return m
