"""IEEE-754 binary32 fused multiply-add unit (and the shared rounding back end).

``Fp32Fma`` -- one result per cycle, plain pipeline (no backpressure):
- Inputs: ``a``, ``b``, ``c`` (32-bit binary32 bit patterns), ``op`` (2 bits, ``FmaOp``),
  ``i_valid``, ``i_tag`` (``tag_width`` bits, opaque).
- Outputs: ``o_result`` (32 bits), ``o_valid``, ``o_tag``. An operand set presented with
  ``i_valid=1`` in cycle n appears with ``o_valid=1`` and its ``i_tag`` in cycle
  n + ``LATENCY`` (= 5 registers). Every cycle may carry a new operand set; there is no
  ready/stall (a consumer that can stall must hold LATENCY results of skid space itself).
  ``o_result``/``o_tag`` are don't-care when ``o_valid=0``. ``rst`` clears the valid bits only.
- ``op``: FMA (0) = a*b+c, rounded once; ADD (1) = a+c (b ignored; computed as fma(a, 1.0, c),
  which is exact, so it rounds once); MUL (2) = a*b (b and a; c ignored; computed as
  fma(a, b, -0.0), which equals fp32(a*b) including the sign of zero: (+-0) + (-0) keeps the
  sign of the product's zero, a nonzero product is unchanged); 3 is reserved and acts as FMA.
- Rounding: round to nearest, ties to even. Subnormal inputs and outputs are kept (no flush).
  Overflow gives +-Inf. An exact zero sum of operands of opposite sign is +0; (+-0)+(+-0)
  keeps the common sign.
- Special cases: any NaN input, Inf*0 and Inf-Inf (product Inf plus c Inf of the other sign)
  give the canonical quiet NaN 0x7FC00000 (no payload propagation, no exception flags);
  otherwise an Inf product or an Inf c gives that Inf.
- Bit-exact: every non-NaN result equals the exactly rounded IEEE result (numpy float32 for
  add/mul; an exact FMA for fma, ``sim.model.fp32_ref``); NaN results are 0x7FC00000.

Datapath (single-precision version of the classic 3p+2 FMA window): a and b are normalised
(subnormals shifted up, exponent extended), the 48-bit product sits at bits [0, 48) of a
74-bit window and c is placed 50 bits higher, then shifted right by 50 + e(p) - e(c)
(clamped to [0, 74]); the bits shifted out of c form one sticky bit below the window. When c
is clamped at the top (or the product is zero) the product is at least two bits below c's
LSB and only counts as sticky; when c has shifted-out bits, the normalised product is
>= 2^46 so the result's round bit lies above the sticky bit. ``round_pack_stage1/2`` then
normalise (leading-zero count, clamped at the subnormal exponent), round and pack.
"""
from __future__ import annotations

import enum

from amaranth import Cat, Const, Module, Mux, Signal, signed
from amaranth.hdl import Value
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

QNAN = 0x7FC00000
INF = 0x7F800000
ONE = 0x3F800000
NEG_ZERO = 0x80000000


class FmaOp(enum.IntEnum):
    FMA = 0
    ADD = 1
    MUL = 2


def reg(m, value, name, *, reset_less=True):
    """A register of ``value``'s shape, loaded every cycle (pipeline stage)."""
    value = Value.cast(value)
    r = Signal(value.shape(), name=name, reset_less=reset_less)
    m.d.sync += r.eq(value)
    return r


def lzc(m, v, name):
    """Leading-zero count of ``v`` (len(v) when v == 0), combinational."""
    w = len(v)
    cnt = Signal(range(w + 1), name=name, init=w)
    for i in range(w):           # the last true If (highest set bit) wins
        with m.If(v[i]):
            m.d.comb += cnt.eq(w - 1 - i)
    return cnt


def unpack(m, x, name):
    """Fields and class of a binary32 pattern ``x``; ``elsb`` = exponent of the mantissa LSB."""
    e, f = x[23:31], x[:23]
    d = {
        "sign": x[31],
        "zero": (e == 0) & (f == 0),
        "inf": (e == 255) & (f == 0),
        "nan": (e == 255) & (f != 0),
        "mant": Cat(f, e != 0),
    }
    elsb = Signal(signed(10), name=f"{name}_elsb")
    m.d.comb += elsb.eq(Mux(e == 0, 1, e) - 150)
    d["elsb"] = elsb
    return d


def normalize24(m, mant, elsb, name):
    """Shift a 24-bit mantissa up to bit 23 set (subnormals); returns (mant, elsb)."""
    n = lzc(m, mant, f"{name}_lz")
    mn = Signal(24, name=f"{name}_mn")
    en = Signal(signed(11), name=f"{name}_en")
    m.d.comb += [mn.eq((mant << n)[:24]), en.eq(elsb - n)]
    return mn, en


def round_pack_stage1(m, s, etop, name):
    """Normalise the exact magnitude ``s`` (bit len(s)-1 has exponent ``etop``).

    Shifts left by the leading-zero count, but never below the subnormal exponent
    (top bit exponent >= -126); if the whole window lies below it, shifts right and keeps a
    sticky bit. Returns (n, sticky, efm) as combinational values: the top 24 bits of ``n``
    are the mantissa (with hidden bit), the next one the round bit, the rest and ``sticky``
    are sticky; ``efm`` = biased exponent - 1 for a normal result (0 when subnormal).
    """
    w = len(s)
    lz = lzc(m, s, f"{name}_lz")
    lim = Signal(signed(14), name=f"{name}_lim")
    t = Signal(signed(14), name=f"{name}_t")
    m.d.comb += lim.eq(etop + 126)
    m.d.comb += t.eq(Mux(lim < lz, lim, lz))
    n = Signal(w, name=f"{name}_n")
    sticky = Signal(name=f"{name}_st")
    rs = Signal(range(w + 1), name=f"{name}_rs")
    wide = Signal(2 * w, name=f"{name}_wide")
    with m.If(t >= 0):
        m.d.comb += n.eq((s << t[:len(rs)])[:w])
    with m.Else():
        m.d.comb += rs.eq(Mux(-t > w, w, -t))
        m.d.comb += wide.eq(Cat(Const(0, w), s) >> rs)
        m.d.comb += [n.eq(wide[w:]), sticky.eq(wide[:w] != 0)]
    efm = Signal(signed(14), name=f"{name}_efm")
    m.d.comb += efm.eq(etop - t + 126)
    return n, sticky, efm


def round_pack_stage2(m, n, sticky, efm, sign, name):
    """Round to nearest even and pack; returns the 32-bit pattern (finite or +-Inf)."""
    w = len(n)
    mant = n[w - 24:]
    rbit = n[w - 25]
    st = (n[:w - 25] != 0) | sticky
    up = rbit & (st | mant[0])
    pack = Signal(32, name=f"{name}_pack")
    m.d.comb += pack.eq((efm[:9] << 23) + mant + up)
    out = Signal(32, name=f"{name}_out")
    with m.If(efm >= 254):
        m.d.comb += out.eq(Cat(Const(INF, 31), sign))
    with m.Else():
        m.d.comb += out.eq(Cat(pack[:31], sign))
    return out


class Fp32Fma(wiring.Component):
    """binary32 a*b+c / a+c / a*b, pipelined, one result per cycle; see the module docstring."""
    LATENCY = 5

    def __init__(self, tag_width: int = 8):
        self.tag_width = tag_width
        super().__init__({
            "a": In(32), "b": In(32), "c": In(32), "op": In(2),
            "i_valid": In(1), "i_tag": In(tag_width),
            "o_result": Out(32), "o_valid": Out(1), "o_tag": Out(tag_width),
        })

    def elaborate(self, platform):
        m = Module()
        # ---- stage 1: operand select, classify, normalise a and b -------------------------
        b = Mux(self.op == FmaOp.ADD, ONE, self.b)
        c = Mux(self.op == FmaOp.MUL, NEG_ZERO, self.c)
        ua, ub, uc = unpack(m, self.a, "a"), unpack(m, b, "b"), unpack(m, c, "c")
        sp = ua["sign"] ^ ub["sign"]
        prod_inf = ua["inf"] | ub["inf"]
        nan = (ua["nan"] | ub["nan"] | uc["nan"] | (ua["inf"] & ub["zero"]) | (ua["zero"] & ub["inf"])
               | (prod_inf & uc["inf"] & (sp != uc["sign"])))
        special = nan | prod_inf | uc["inf"]
        spval = Mux(nan, QNAN, Mux(prod_inf, Cat(Const(INF, 31), sp), Cat(Const(INF, 31), uc["sign"])))
        ma, ea = normalize24(m, ua["mant"], ua["elsb"], "a")
        mb, eb = normalize24(m, ub["mant"], ub["elsb"], "b")
        v1 = reg(m, self.i_valid, "v1", reset_less=False)
        t1 = reg(m, self.i_tag, "t1")
        ma1, mb1, ea1, eb1 = reg(m, ma, "ma1"), reg(m, mb, "mb1"), reg(m, ea, "ea1"), reg(m, eb, "eb1")
        mc1, ec1 = reg(m, uc["mant"], "mc1"), reg(m, uc["elsb"], "ec1")
        sp1, sc1 = reg(m, sp, "sp1"), reg(m, uc["sign"], "sc1")
        pz1 = reg(m, ua["zero"] | ub["zero"], "pz1")
        spc1, spv1 = reg(m, special, "spc1"), reg(m, spval, "spv1")

        # ---- stage 2: product, alignment distance -----------------------------------------
        ep = Signal(signed(12))
        sraw = Signal(signed(13))
        m.d.comb += [ep.eq(ea1 + eb1), sraw.eq(ep - ec1 + 50)]
        clamp = pz1 | (sraw < 0)
        shift = Mux(clamp, 0, Mux(sraw > 74, 74, sraw))[:7]
        base = Mux(clamp, ec1 - 50, ep)
        v2 = reg(m, v1, "v2", reset_less=False)
        t2 = reg(m, t1, "t2")
        p2 = reg(m, ma1 * mb1, "p2")
        sh2 = reg(m, shift, "sh2")
        base2 = Signal(signed(12), name="base2", reset_less=True)
        m.d.sync += base2.eq(base)
        mc2, sp2, sc2 = reg(m, mc1, "mc2"), reg(m, sp1, "sp2"), reg(m, sc1, "sc2")
        spc2, spv2 = reg(m, spc1, "spc2"), reg(m, spv1, "spv2")

        # ---- stage 3: align c (sticky below the window), add / subtract, magnitude ---------
        wide = Signal(148)
        m.d.comb += wide.eq(Cat(Const(0, 74 + 50), mc2) >> sh2)
        cx = Cat(wide[:74] != 0, wide[74:])          # 75 bits: sticky, then c
        px = Cat(Const(0, 1), p2)                     # 49 bits
        sub = sp2 ^ sc2
        diff = Signal(signed(77))
        m.d.comb += diff.eq(px - cx)
        neg = diff < 0
        mag = Mux(sub, Mux(neg, -diff, diff), px + cx)[:76]
        v3 = reg(m, v2, "v3", reset_less=False)
        t3 = reg(m, t2, "t3")
        s3 = reg(m, mag, "s3")
        sign3 = reg(m, Mux(sub & neg, sc2, sp2), "sign3")
        zs3 = reg(m, sp2 & sc2, "zs3")
        etop3 = Signal(signed(12), name="etop3", reset_less=True)
        m.d.sync += etop3.eq(base2 + 74)
        spc3, spv3 = reg(m, spc2, "spc3"), reg(m, spv2, "spv3")

        # ---- stage 4: normalise ---------------------------------------------------------
        n, st, efm = round_pack_stage1(m, s3, etop3, "rp")
        v4 = reg(m, v3, "v4", reset_less=False)
        t4 = reg(m, t3, "t4")
        n4, st4 = reg(m, n, "n4"), reg(m, st, "st4")
        efm4 = reg(m, efm, "efm4")
        sign4, zero4 = reg(m, sign3, "sign4"), reg(m, s3 == 0, "zero4")
        zs4 = reg(m, zs3, "zs4")
        spc4, spv4 = reg(m, spc3, "spc4"), reg(m, spv3, "spv4")

        # ---- stage 5: round, pack, select special ----------------------------------------
        fin = round_pack_stage2(m, n4, st4, efm4, sign4, "rp")
        res = Mux(spc4, spv4, Mux(zero4, Cat(Const(0, 31), zs4), fin))
        m.d.sync += [self.o_valid.eq(v4), self.o_tag.eq(t4), self.o_result.eq(res)]
        return m
