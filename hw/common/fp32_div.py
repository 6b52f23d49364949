"""binary32 division by a small integer: x / fp32(L), correctly rounded, one result per cycle.

``Fp32DivInt(tag_width=8, pipeline="compact")`` -- plain pipeline (no backpressure), like
``hw.common.fp32.Fp32Fma``:
- Inputs: ``x`` (binary32 pattern), ``l`` (16-bit unsigned integer L), ``i_valid``, ``i_tag``.
- Outputs: ``o_result``, ``o_valid``, ``o_tag``; an operand set presented in cycle n comes out
  in cycle n + ``latency``: ``LATENCY`` (= 12 registers) for the default pipeline "compact",
  ``DEEP_LATENCY`` (= 18) for "deep" (``LATENCIES``). ``rst`` clears the valid bits only.
- Result: the IEEE-754 division x / fp32(L) (fp32(L) is exact for L < 2^24), round to nearest
  even, subnormals kept. With x = 1.0 it gives fp32(1/L). Bit-exact with numpy
  ``np.float32(x) / np.float32(L)`` for every x and every L in 0..65535.
- Special cases: NaN x -> 0x7FC00000; +-Inf x -> +-Inf; +-0 x -> +-0; L = 0 (outside the
  1..65535 contract, still IEEE): finite nonzero x -> +-Inf, +-0 -> NaN, Inf -> Inf.

Datapath: x's mantissa is normalised to [2^23, 2^24), L to [2^15, 2^16) (``lzc``); a
restoring digit recurrence produces q = floor(mx * 2^18 / mL) (27 bits, >= 2^25), BITS_PER_STAGE
quotient bits per pipeline stage, and the remainder's nonzero-ness is the sticky bit. The
exact quotient lies in (q, q+1) or equals q, so q plus sticky round exactly like the real
quotient (``round_pack_stage1/2`` of ``hw.common.fp32``, which also handle subnormal results).

Pipelines (same ports, same results bit for bit; LUT levels per stage measured as in
``hw.common.fp32``'s docstring, with ``Fp32DivInt`` and ``-top fp32_div_int``):
- "compact" (default, 12 registers; the engines take the divider's results by ``o_valid``
  and tag, so its latency is theirs to absorb): 1 classify, normalise x and L (12 levels from
  the ports); 2..10 restoring recurrence, BITS_PER_STAGE = 3 bits a stage (9, 9, 9, then 14:
  about 5 levels a bit: compare, then select the remainder); 11 normalise (12); 12 round,
  pack, special select (3). Max 14. (Before issue 13's depth work: 4 bits a stage, 10
  registers, max 20.)
- "deep" (registers ``d<k>_*``): d1 unpack x (4 from the ports); d2 special cases, tree
  leading-zero counts of x's mantissa and of L (6); d3 normalise both, d and -d, first
  partial remainder, exponent (5); d4..d12 non-restoring recurrence (``nonrestoring_step``:
  one add of +-d per bit, picked by the remainder's sign), DEEP_BITS_PER_STAGE = 3 bits a
  stage (5, 6, 6, then 3 once only zeros are brought down; each bit is also a 17-bit carry
  chain); d13 sticky bit (the restoring remainder is r, or r + d when r < 0) (5);
  d14..d17 ``normalise_round_deep`` of hw.common.fp32 (5, 4, 5, 4); output: round, pack,
  special select (3). Max 6 (<= 8 for 250 MHz).
"""
from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.common.fp32 import (DEEP_ROUND_STAGES, INF, QNAN, UNPACK_FIELDS, Stages, lzc, lzc_tree, normalize24,
                             normalise_round_deep, reg, round_pack_stage1, round_pack_stage2, unpack)

QBITS = 27          # quotient bits of the recurrence
BITS_PER_STAGE = 3
DEEP_BITS_PER_STAGE = 3


def div_special_cases(ux, lzero):
    """(special, special value) of x / L from x's ``unpack`` fields and L == 0 (expressions):
    NaN x or 0/0 -> NaN; Inf x or x/0 -> Inf; zero x -> zero (sign of x)."""
    nan = ux["nan"] | (ux["zero"] & lzero)
    inf = ux["inf"] | (lzero & ~ux["zero"])
    special = nan | inf | ux["zero"]
    spval = Mux(nan, QNAN, Mux(inf, Cat(Const(INF, 31), ux["sign"]), Cat(Const(0, 31), ux["sign"])))
    return special, spval


def nonrestoring_step(m, r, bit, d, nd, name):
    """One quotient bit of a non-restoring division, as a signal: r' = 2r + bit - d when
    r >= 0, 2r + bit + d when r < 0 (``nd`` = -d). The quotient bit is r' >= 0, the same bit
    as the restoring recurrence's (whose remainder is r', or r' + d when r' < 0); r and r'
    lie in [-d, d), 17 bits signed."""
    out = Signal(signed(17), name=name)
    m.d.comb += out.eq(Cat(bit, r).as_signed() + Mux(r[-1], d, nd))
    return out


class Fp32DivInt(wiring.Component):
    """x / fp32(L) for integer L, pipelined; see the module docstring.

    Parameters: ``tag_width``; ``pipeline``, "compact" (default) or "deep".
    Attributes: ``pipeline``, ``latency``; class attributes ``LATENCY`` (the compact
    pipeline's, 12), ``DEEP_LATENCY``, ``LATENCIES``."""
    LATENCY = 1 + (QBITS + BITS_PER_STAGE - 1) // BITS_PER_STAGE + 2     # the default (compact) pipeline
    DEEP_LATENCY = 3 + (QBITS + DEEP_BITS_PER_STAGE - 1) // DEEP_BITS_PER_STAGE + 1 + DEEP_ROUND_STAGES + 1
    LATENCIES = {"compact": LATENCY, "deep": DEEP_LATENCY}

    def __init__(self, tag_width: int = 8, pipeline: str = "compact"):
        if pipeline not in self.LATENCIES:
            raise ValueError(f"pipeline must be one of {tuple(self.LATENCIES)}, not {pipeline!r}")
        self.tag_width = tag_width
        self.pipeline = pipeline
        self.latency = self.LATENCIES[pipeline]
        super().__init__({
            "x": In(32), "l": In(16),
            "i_valid": In(1), "i_tag": In(tag_width),
            "o_result": Out(32), "o_valid": Out(1), "o_tag": Out(tag_width),
        })

    def elaborate(self, platform):
        m = Module()
        if self.pipeline == "deep":
            self._elaborate_deep(m)
            return m
        # ---- stage 1: classify, normalise x and L ---------------------------------------
        ux = unpack(m, self.x, "x")
        special, spval = div_special_cases(ux, self.l == 0)
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
        n, st, efm = round_pack_stage1(m, Cat(rem != 0, q), etop_q + 126, "rp")
        v = reg(m, v, "v_n", reset_less=False)
        t = reg(m, t, "t_n")
        n_r, st_r, efm_r = reg(m, n, "n_n"), reg(m, st, "st_n"), reg(m, efm, "efm_n")
        sign_r, spc_r, spv_r = reg(m, sign, "sign_n"), reg(m, spc, "spc_n"), reg(m, spv, "spv_n")
        fin = round_pack_stage2(m, n_r, st_r, efm_r, sign_r, "rp")
        m.d.sync += [self.o_valid.eq(v), self.o_tag.eq(t), self.o_result.eq(Mux(spc_r, spv_r, fin))]
        return m

    def _elaborate_deep(self, m):
        """The deep pipeline: DEEP_LATENCY registers, each stage a few LUT levels (module docstring)."""
        st = Stages(m)
        # d1: fields and class of x
        fields = {f"x_{k}": v for k, v in unpack(m, self.x, "x").items()}
        s = st.cut({"v": self.i_valid, "tag": self.i_tag}, l=self.l, **fields)
        ux = {k: s[f"x_{k}"] for k in UNPACK_FIELDS}
        # d2: special cases; leading zeros of x's mantissa and of L
        special, spval = div_special_cases(ux, s["l"] == 0)
        s = st.cut(s, drop=fields, mx=ux["mant"], lzx=lzc_tree(m, ux["mant"], "xlz"), ex=ux["elsb"],
                   lzl=lzc_tree(m, s["l"], "llz"), sign=ux["sign"], spc=special, spv=spval)
        # d3: normalise x to [2^23, 2^24) and L to [2^15, 2^16); the first partial remainder
        # (the top 15 bits of x, < d), the bits still to bring down, d and -d; q's exponent
        mx = (s["mx"] << s["lzx"])[:24]
        d = (s["l"] << s["lzl"])[:16]
        s = st.cut(s, drop=("mx", "lzx", "ex", "l", "lzl"),
                   r=Cat(mx[9:24], Const(0, 2)).as_signed(), num=Cat(Const(0, QBITS - 9), mx[:9]),
                   q=Const(0, QBITS), d=d, nd=-d, etop=(s["ex"] - s["lzx"]) + s["lzl"] + 8)
        # d4..: non-restoring recurrence, DEEP_BITS_PER_STAGE quotient bits per stage
        done = 0
        while done < QBITS:
            r, q, num = s["r"], s["q"], s["num"]
            for _ in range(min(DEEP_BITS_PER_STAGE, QBITS - done)):
                r = nonrestoring_step(m, r, num[QBITS - 1], s["d"], s["nd"], f"nr{done}")
                q = Cat(~r[-1], q[:QBITS - 1])
                num = Cat(Const(0, 1), num[:QBITS - 1])
                done += 1
            s = st.cut(s, r=r, q=q, num=num)
        # the restoring remainder is r, or r + d when r < 0: nonzero unless r == 0 or r == -d
        s = st.cut(s, drop=("r", "q", "num", "d", "nd"),
                   mag=Cat((s["r"] != 0) & ((s["r"] + s["d"])[:17] != 0), s["q"]))
        # normalise; then round, pack and the special select into the outputs
        s, fin = normalise_round_deep(st, s)
        m.d.sync += [self.o_valid.eq(s["v"]), self.o_tag.eq(s["tag"]),
                     self.o_result.eq(Mux(s["spc"], s["spv"], fin))]
        assert st.count + 1 == self.DEEP_LATENCY, st.count
