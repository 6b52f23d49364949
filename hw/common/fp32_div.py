"""binary32 division by a small integer: x / fp32(L), correctly rounded, one result per cycle.

``Fp32DivInt`` -- plain pipeline (no backpressure), like ``hw.common.fp32.Fp32Fma``:
- Inputs: ``x`` (binary32 pattern), ``l`` (16-bit unsigned integer L), ``i_valid``, ``i_tag``.
- Outputs: ``o_result``, ``o_valid``, ``o_tag``; an operand set presented in cycle n comes out
  in cycle n + ``LATENCY`` (= 10 registers). ``rst`` clears the valid bits only.
- Result: the IEEE-754 division x / fp32(L) (fp32(L) is exact for L < 2^24), round to nearest
  even, subnormals kept. With x = 1.0 it gives fp32(1/L). Bit-exact with numpy
  ``np.float32(x) / np.float32(L)`` for every x and every L in 0..65535.
- Special cases: NaN x -> 0x7FC00000; +-Inf x -> +-Inf; +-0 x -> +-0; L = 0 (outside the
  1..65535 contract, still IEEE): finite nonzero x -> +-Inf, +-0 -> NaN, Inf -> Inf.

Datapath: x's mantissa is normalised to [2^23, 2^24), L to [2^15, 2^16) (``lzc``); a
restoring digit recurrence produces q = floor(mx * 2^18 / mL) (27 bits, >= 2^25), four
quotient bits per pipeline stage, and the remainder's nonzero-ness is the sticky bit. The
exact quotient lies in (q, q+1) or equals q, so q plus sticky round exactly like the real
quotient (``round_pack_stage1/2`` of ``hw.common.fp32``, which also handle subnormal results).
"""
from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.common.fp32 import INF, QNAN, lzc, normalize24, reg, round_pack_stage1, round_pack_stage2, unpack

QBITS = 27          # quotient bits of the recurrence
BITS_PER_STAGE = 4


class Fp32DivInt(wiring.Component):
    """x / fp32(L) for integer L, pipelined; see the module docstring."""
    LATENCY = 1 + (QBITS + BITS_PER_STAGE - 1) // BITS_PER_STAGE + 2

    def __init__(self, tag_width: int = 8):
        self.tag_width = tag_width
        super().__init__({
            "x": In(32), "l": In(16),
            "i_valid": In(1), "i_tag": In(tag_width),
            "o_result": Out(32), "o_valid": Out(1), "o_tag": Out(tag_width),
        })

    def elaborate(self, platform):
        m = Module()
        # ---- stage 1: classify, normalise x and L ---------------------------------------
        ux = unpack(m, self.x, "x")
        lzero = self.l == 0
        nan = ux["nan"] | (ux["zero"] & lzero)
        inf = ux["inf"] | (lzero & ~ux["zero"])
        special = nan | inf | ux["zero"]
        spval = Mux(nan, QNAN, Mux(inf, Cat(Const(INF, 31), ux["sign"]), Cat(Const(0, 31), ux["sign"])))
        mx, ex = normalize24(m, ux["mant"], ux["elsb"], "x")
        sl = lzc(m, self.l, "l_lz")
        ml = Signal(16)
        m.d.comb += ml.eq((self.l << sl)[:16])
        etop = Signal(signed(12))
        # q's LSB has exponent ex + sl - 18; the window Cat(sticky, q) is 28 bits wide.
        m.d.comb += etop.eq(ex + sl + 8)
        v = reg(m, self.i_valid, "v1", reset_less=False)
        t = reg(m, self.i_tag, "t1")
        rem = reg(m, mx[9:24], "r1")                  # < 2^15 <= mL: first partial remainder
        num = reg(m, Cat(Const(0, 18), mx[:9]), "n1")  # bits still to bring down, MSB first
        d = reg(m, ml, "d1")
        q = reg(m, Const(0, QBITS), "q1")
        side = [reg(m, ux["sign"], "s1"), reg(m, etop, "e1"), reg(m, special, "spc1"), reg(m, spval, "spv1")]

        # ---- stages 2..: restoring recurrence, BITS_PER_STAGE quotient bits per stage -------
        done = 0
        k = 2
        while done < QBITS:
            r, qq, nn = rem, q, num
            for _ in range(min(BITS_PER_STAGE, QBITS - done)):
                r2 = Cat(nn[QBITS - 1], r)[:17]
                ge = r2 >= d
                r = Mux(ge, r2 - d, r2)[:16]
                qq = Cat(ge, qq[:QBITS - 1])
                nn = Cat(Const(0, 1), nn[:QBITS - 1])
                done += 1
            rem, q, num = reg(m, r, f"r{k}"), reg(m, qq, f"q{k}"), reg(m, nn, f"n{k}")
            d = reg(m, d, f"d{k}")
            v = reg(m, v, f"v{k}", reset_less=False)
            t = reg(m, t, f"t{k}")
            side = [reg(m, s, f"side{k}_{i}") for i, s in enumerate(side)]
            k += 1
        sign, etop_q, spc, spv = side

        # ---- normalise, then round and pack ---------------------------------------------
        n, st, efm = round_pack_stage1(m, Cat(rem != 0, q), etop_q, "rp")
        v = reg(m, v, "v_n", reset_less=False)
        t = reg(m, t, "t_n")
        n_r, st_r, efm_r = reg(m, n, "n_n"), reg(m, st, "st_n"), reg(m, efm, "efm_n")
        sign_r, spc_r, spv_r = reg(m, sign, "sign_n"), reg(m, spc, "spc_n"), reg(m, spv, "spv_n")
        fin = round_pack_stage2(m, n_r, st_r, efm_r, sign_r, "rp")
        m.d.sync += [self.o_valid.eq(v), self.o_tag.eq(t), self.o_result.eq(Mux(spc_r, spv_r, fin))]
        return m
