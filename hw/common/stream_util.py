"""Small stream building blocks shared by the device blocks.

``SkidBuffer``: one input stream to one output stream, in order, nothing lost or repeated.
0 cycles when empty (``o`` shows ``i`` combinationally); ``i.ready`` is a flip-flop (low
while one payload is held), so a ready chain ends here: what ``o.ready`` depends on never
reaches the producer in the same cycle. Holds one payload while ``o`` stalls.

``RegisterSlice``: the same contract with both directions registered: ``o.valid`` /
``o.payload`` and ``i.ready`` are flip-flops, so neither a valid nor a ready chain crosses
it. 1 cycle of latency; a payload per cycle while ``o.ready`` stays high; two entries (the
output register and a skid register).

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


class SkidBuffer(wiring.Component):
    def __init__(self, shape):
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))})

    def elaborate(self, platform):
        m = Module()
        held = Signal.like(self.i.payload)
        held_valid = Signal()
        m.d.comb += [
            self.i.ready.eq(~held_valid),
            self.o.valid.eq(held_valid | self.i.valid),
        ]
        with m.If(held_valid):
            m.d.comb += self.o.payload.eq(held)
            with m.If(self.o.ready):
                m.d.sync += held_valid.eq(0)
        with m.Else():
            m.d.comb += self.o.payload.eq(self.i.payload)
            with m.If(self.i.valid & ~self.o.ready):
                m.d.sync += [held.eq(self.i.payload), held_valid.eq(1)]
        return m


class RegisterSlice(wiring.Component):
    def __init__(self, shape):
        super().__init__({"i": In(stream.Signature(shape)), "o": Out(stream.Signature(shape))})

    def elaborate(self, platform):
        m = Module()
        out = Signal.like(self.i.payload)
        out_valid = Signal()
        skid = Signal.like(self.i.payload)
        skid_valid = Signal()
        m.d.comb += [self.i.ready.eq(~skid_valid), self.o.valid.eq(out_valid), self.o.payload.eq(out)]
        with m.If(~out_valid | self.o.ready):        # the output register takes the next payload
            with m.If(skid_valid):
                m.d.sync += [out.eq(skid), skid_valid.eq(0)]
            with m.Else():
                m.d.sync += [out.eq(self.i.payload), out_valid.eq(self.i.valid)]
        with m.Elif(self.i.valid & ~skid_valid):     # output stalled: the input goes aside
            m.d.sync += [skid.eq(self.i.payload), skid_valid.eq(1)]
        return m
