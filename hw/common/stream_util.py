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
from amaranth import Cat, Const, Module, Mux, Signal, Value
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .onehot import one_hot_select


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
        valid = Signal(n)
        m.d.comb += valid.eq(Cat(i.valid for i in inputs))
        # One-hot grant: the first valid input after the last one granted (``after``: a
        # register, the inputs above it), else the first valid input. Prefix ORs of the
        # valid bits, not a scan over every (last, input) pair: the grant's index came out
        # of an n * n priority chain and fed the payload mux and every input's ready
        # (12 LUT levels on the shared memory port's 7-way merge).
        after = Signal(n)                   # inputs k > last granted (none after reset)
        pick_after = Signal(n)
        pick_any = Signal(n)
        grant = Signal(n)

        def first_set(bits):
            return Cat(bits[k] & ~bits[:k].any() if k else bits[0] for k in range(n))
        m.d.comb += [
            pick_after.eq(first_set(valid & after)),
            pick_any.eq(first_set(valid)),
            grant.eq(Mux((valid & after).any(), pick_after, pick_any)),
            self.o.valid.eq(valid.any()),
            self.o.payload.eq(one_hot_select(grant, [Value.cast(i.payload) for i in inputs])),
        ]
        for k, inp in enumerate(inputs):
            m.d.comb += inp.ready.eq(grant[k] & self.o.ready)
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += after.eq(Cat(grant[:k].any() if k else Const(0, 1) for k in range(n)))
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
