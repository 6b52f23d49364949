"""binary32 units (hw/common/fp32.py, hw/common/fp32_div.py) and their golden model.

- The golden model (sim/model/fp32_ref.py) is checked against an independent exact oracle
  written here with Python Fractions (exact value, then explicit round-to-nearest-even with
  subnormals and overflow), on generated vectors including the float64 double-rounding
  traps; numpy's add/mul/div are checked the same way.
- The RTL runs through the bulk harness (sim/tb/fp32_campaign.py) once per pipeline
  ("compact", the default the engines use, "deep", and "deep_late_c": the deep FMA with its
  addend fed two cycles after a, b and op, as UPDATE's deep datapath feeds it; a c taken at
  any other time than the contract's would add the wrong vector's c): every directed edge set plus 20,000
  random vectors per operator (fma, add, mul, div), with valid bubbles; any mismatch fails
  and lists the first ones in hex. The deep units also return the very same bit patterns as
  the compact ones (NaNs included) on the directed sets plus 5,000 random vectors per
  operator. FP32_SEED=<n> repeats a run.
- Amaranth's simulator (no Verilator): deep and compact agree bit for bit on a sample of
  the directed sets plus random vectors (both units), and match the golden model.
- Lint: the generated Verilog (every pipeline) passes verilator --lint-only -Wall with the
  Amaranth waivers.
Longer runs: ``python -m sim.tb.fp32_campaign --op all --n 1000000 --seed 1 --pipeline both`` (every pipeline).
"""
from __future__ import annotations

import gc
import os
import subprocess
from fractions import Fraction

import numpy as np
import pytest

from sim.model import fp32_ref
from sim.tb import fp32_campaign as fc

SEED = int(os.environ.get("FP32_SEED", "0")) or int.from_bytes(os.urandom(4), "little")
N_RANDOM = 20_000


# ------------------------------------------------------------- independent exact oracle --
def _decode(bits: int):
    """(kind, sign, Fraction value) with kind in 'num', 'inf', 'nan'."""
    s, e, f = bits >> 31, (bits >> 23) & 0xFF, bits & 0x7FFFFF
    if e == 255:
        return ("nan" if f else "inf"), s, None
    v = Fraction(f, 1 << 149) if e == 0 else Fraction(f | (1 << 23)) * Fraction(2) ** (e - 150)
    return "num", s, -v if s else v


def _round(q: Fraction, zero_sign: int) -> int:
    """Round an exact rational to binary32 (RNE, subnormals, overflow to Inf)."""
    if q == 0:
        return zero_sign << 31
    sign = 1 if q < 0 else 0
    q = abs(q)
    e = q.numerator.bit_length() - q.denominator.bit_length()
    while Fraction(2) ** e > q:
        e -= 1
    while Fraction(2) ** (e + 1) <= q:
        e += 1
    lsb = max(e - 23, -149)
    scaled = q / Fraction(2) ** lsb
    m = scaled.numerator // scaled.denominator
    rem = scaled - m
    if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and m & 1):
        m += 1
    if m == 1 << 24:
        m, lsb = m >> 1, lsb + 1
    if m >= 1 << 23:
        biased = lsb + 150
        if biased >= 255:
            return (sign << 31) | 0x7F800000
        return (sign << 31) | (biased << 23) | (m - (1 << 23))
    return (sign << 31) | m


def oracle_fma(a: int, b: int, c: int) -> int:
    (ka, sa, va), (kb, sb, vb), (kc, sc, vc) = _decode(a), _decode(b), _decode(c)
    sp = sa ^ sb
    if "nan" in (ka, kb, kc):
        return fp32_ref.QNAN
    if (ka == "inf" and kb == "num" and vb == 0) or (kb == "inf" and ka == "num" and va == 0):
        return fp32_ref.QNAN
    if "inf" in (ka, kb):
        if kc == "inf" and sc != sp:
            return fp32_ref.QNAN
        return (sp << 31) | 0x7F800000
    if kc == "inf":
        return (sc << 31) | 0x7F800000
    p = va * vb
    zero_sign = sp & sc if p == 0 and vc == 0 else 0
    return _round(p + vc, zero_sign)


def oracle_div(x: int, y: int) -> int:
    (kx, sx, vx), (ky, sy, vy) = _decode(x), _decode(y)
    s = sx ^ sy
    if "nan" in (kx, ky) or (kx == "inf" and ky == "inf") or (kx == ky == "num" and vx == 0 and vy == 0):
        return fp32_ref.QNAN
    if kx == "inf" or (ky == "num" and vy == 0):
        return (s << 31) | 0x7F800000
    if ky == "inf" or vx == 0:
        return s << 31
    return _round(vx / vy, s)


def _assert_same(name, args, got, exp):
    bad = np.flatnonzero(~fp32_ref.same_fp32(np.asarray(got, np.uint32), np.asarray(exp, np.uint32)))
    lines = [f"{name} " + " ".join(f"{int(x[i]):08x}" for x in args) + f" got={int(got[i]):08x} "
             f"exact={int(exp[i]):08x}" for i in bad[:10]]
    assert not len(bad), f"{len(bad)} mismatches (seed {SEED}):\n" + "\n".join(lines)


def _vectors(op, n):
    print(f"FP32_SEED={SEED}")
    rng = np.random.default_rng([SEED, list(fc.OPS).index(op)])
    a, b, c = fc.gen_vectors(op, n, rng)
    da, db, dc = fc.directed(op)
    return np.concatenate([da, a]), np.concatenate([db, b]), np.concatenate([dc, c])


# --------------------------------------------------------------------- golden model --
def test_ref_fma_exact():
    a, b, c = _vectors("fma", 6000)
    exp = [oracle_fma(int(x), int(y), int(z)) for x, y, z in zip(a, b, c)]
    _assert_same("fma", (a, b, c), fp32_ref.fma(a, b, c), exp)


def test_ref_fma_beats_float64_double_rounding():
    # a*b = 1 + 2^-11 + 2^-24 is a binary32 tie; c = +-2^-80 breaks it. float64 loses c.
    a = b = np.array([0x3F800800, 0x3F800800], np.uint32)
    c = np.array([0x17800000, 0x97800000], np.uint32)          # +-2^-80
    got = fp32_ref.fma(a, b, c)
    assert [int(g) for g in got] == [oracle_fma(int(x), int(y), int(z)) for x, y, z in zip(a, b, c)]
    assert [int(g) for g in got] == [0x3F801001, 0x3F801000]


def test_ref_add_mul_div_exact():
    a, b, c = _vectors("add", 4000)
    _assert_same("add", (a, c), fp32_ref.add(a, c), [oracle_fma(int(x), 0x3F800000, int(z)) for x, z in zip(a, c)])
    a, b, c = _vectors("mul", 4000)
    _assert_same("mul", (a, b), fp32_ref.mul(a, b), [oracle_fma(int(x), int(y), 0x80000000) for x, y in zip(a, b)])
    a, b, c = _vectors("div", 4000)
    yl = fp32_ref.to_bits(b.astype(np.float32))
    assert all(float(fp32_ref.to_f32(y)) == float(ll) for y, ll in zip(yl, b))   # exact conversion
    _assert_same("div", (a, b), fp32_ref.div_int(a, b), [oracle_div(int(x), int(y)) for x, y in zip(a, yl)])


def test_ref_fma_special_forms():
    """fma(a, 1, c) == a + c and fma(a, b, -0) == a * b bit for bit (the RTL's ADD/MUL)."""
    a, b, c = _vectors("fma", 20000)
    assert fp32_ref.same_fp32(fp32_ref.fma(a, np.full_like(b, 0x3F800000), c), fp32_ref.add(a, c)).all()
    assert fp32_ref.same_fp32(fp32_ref.fma(a, b, np.full_like(c, 0x80000000)), fp32_ref.mul(a, b)).all()


def test_same_fp32():
    x = np.array([0x7FC00000, 0xFFC00001, 0x7F800001, 0x00000000, 0x80000000, 0x7F800000], np.uint32)
    y = np.array([0x7F800001, 0x7FC00000, 0xFFFFFFFF, 0x80000000, 0x80000000, 0x7F800000], np.uint32)
    assert fp32_ref.same_fp32(x, y).tolist() == [True, True, True, False, True, True]
    assert fp32_ref.same_fp32(0x7FC00000, 0x7FC00001) is True
    assert fp32_ref.same_fp32(0x7F800000, 0x7FC00000) is False


def test_check_reports_mismatches():
    a, b, c = fc.directed("mul")
    got = fp32_ref.mul(a, b).copy()
    got[5] ^= 1
    bad, lines = fc.check(np.full(len(a), "mul"), a, b, c, got)
    assert bad.sum() == 1 and lines and "rtl=" in lines[0]


# ------------------------------------------------------------------------------ RTL --
def _all_ops(n):
    """(op names, a, b, c): every directed set + n random vectors per operator."""
    names, va, vb, vc = [], [], [], []
    for op in fc.OPS:
        a, b, c = _vectors(op, n)
        names.append(np.full(len(a), op))
        va.append(a)
        vb.append(b)
        vc.append(c)
    return np.concatenate(names), np.concatenate(va), np.concatenate(vb), np.concatenate(vc)


@pytest.mark.sim
@pytest.mark.parametrize("pipeline", fc.PIPELINES)
def test_rtl_bit_exact(pipeline):
    """All directed sets + N_RANDOM random vectors per operator, one simulation, bubbles on."""
    names, a, b, c = _all_ops(N_RANDOM)
    bad, lines, _ = fc.run_mixed(names, a, b, c, gap=True, pipeline=pipeline)
    counts = {op: int((names == op).sum()) for op in fc.OPS}
    assert not bad.any(), (f"{pipeline}: {bad.sum()} mismatches of {counts} (FP32_SEED={SEED}); first:\n"
                           + "\n".join(lines))


@pytest.mark.sim
def test_rtl_deep_same_patterns_as_compact():
    """The deep pipelines return the compact ones' exact bit patterns (NaN included)."""
    names, a, b, c = _all_ops(5000)
    compact, _ = fc.results(names, a, b, c, pipeline="compact")
    deep, _ = fc.results(names, a, b, c, gap=True, pipeline="deep")
    bad = np.flatnonzero(compact != deep)
    assert not len(bad), f"{len(bad)} differences (FP32_SEED={SEED}); first:\n" + "\n".join(
        f"{names[i]} {a[i]:08x} {b[i]:08x} {c[i]:08x} compact={compact[i]:08x} deep={deep[i]:08x}" for i in bad[:10])


# ------------------------------------------------------- pipelines in Amaranth's simulator --
@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_pipeline_parameters():
    from hw.common.fp32 import Fp32Fma
    from hw.common.fp32_div import Fp32DivInt
    for unit in (Fp32Fma, Fp32DivInt):
        compact, deep = unit(), unit(pipeline="deep")
        assert (compact.pipeline, compact.latency) == ("compact", unit.LATENCY)
        assert (deep.pipeline, deep.latency) == ("deep", unit.DEEP_LATENCY)
        assert unit.DEEP_LATENCY > unit.LATENCY
        with pytest.raises(ValueError):
            unit(pipeline="fast")
        del compact, deep
        gc.collect()                              # the UnusedElaboratable warnings, here
    assert (Fp32Fma.LATENCY, Fp32DivInt.LATENCY) == (5, 12)
    # The late addend exists in the deep FMA only, and only LATE_C cycles late.
    late = Fp32Fma(pipeline="deep", c_delay=Fp32Fma.LATE_C)
    assert (late.c_delay, late.latency) == (Fp32Fma.LATE_C, Fp32Fma.DEEP_LATENCY)
    for kwargs in ({"c_delay": Fp32Fma.LATE_C}, {"pipeline": "deep", "c_delay": 1}):
        with pytest.raises(ValueError, match="c_delay"):
            Fp32Fma(**kwargs)
    del late
    gc.collect()


def _pysim_pair(unit, ports, vectors):
    """Run ``vectors`` (a list of port value tuples) through the compact and the deep
    ``unit`` side by side, one per cycle, in Amaranth's simulator; returns both result lists."""
    from amaranth import Module
    from amaranth.sim import Simulator
    m = Module()
    m.submodules.compact = compact = unit(16)
    m.submodules.deep = deep = unit(16, pipeline="deep")
    out = {compact: {}, deep: {}}

    async def bench(ctx):
        for i in range(len(vectors) + deep.latency + 1):
            for u in (compact, deep):
                ctx.set(u.i_valid, i < len(vectors))
                ctx.set(u.i_tag, i & 0xFFFF)
                for port, value in zip(ports, vectors[min(i, len(vectors) - 1)]):
                    ctx.set(getattr(u, port), int(value))
            await ctx.tick()
            for u in (compact, deep):
                if ctx.get(u.o_valid):
                    out[u][i - u.latency + 1] = ctx.get(u.o_result)
                    assert ctx.get(u.o_tag) == (i - u.latency + 1) & 0xFFFF

    sim = Simulator(m)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return [[out[u][i] for i in range(len(vectors))] for u in (compact, deep)]


def _sample(rng, n, *arrays):
    pick = rng.choice(len(arrays[0]), min(n, len(arrays[0])), replace=False)
    return [x[pick] for x in arrays]


def test_pysim_deep_matches_compact():
    from hw.common.fp32 import Fp32Fma
    from hw.common.fp32_div import Fp32DivInt
    rng = np.random.default_rng([SEED, 99])
    names, a, b, c = [], [], [], []
    for op in ("fma", "add", "mul"):
        da, db, dc = _sample(rng, 300, *fc.directed(op))
        ra, rb, rc = fc.gen_vectors(op, 500, rng)
        names.append(np.full(len(da) + len(ra), op))
        a += [da, ra]
        b += [db, rb]
        c += [dc, rc]
    names, a, b, c = map(np.concatenate, (names, a, b, c))
    ops = [fc.OPS[n] for n in names]
    compact, deep = _pysim_pair(Fp32Fma, ("a", "b", "c", "op"), list(zip(a, b, c, ops)))
    assert compact == deep
    bad, lines = fc.check(names, a, b, c, np.array(deep, np.uint32))
    assert not bad.any(), "\n".join(lines)

    da, dl, _ = fc.directed("div")
    ra, rl, _ = fc.gen_vectors("div", 1000, rng)
    x, ls = np.concatenate([da, ra]), np.concatenate([dl, rl])
    compact, deep = _pysim_pair(Fp32DivInt, ("x", "l"), list(zip(x, ls)))
    assert compact == deep
    bad, lines = fc.check(np.full(len(x), "div"), x, ls, np.zeros_like(x), np.array(deep, np.uint32))
    assert not bad.any(), "\n".join(lines)


@pytest.mark.sim
def test_campaign_api():
    r = fc.run_fp32_campaign("div", 3000, 5)
    assert r["op"] == "div" and r["vectors"] == 3000 and r["mismatches"] == 0 and r["seed"] == 5
    assert r["seconds"] > 0


def test_lint(tmp_path):
    """verilator --lint-only -Wall on the generated Verilog, with hw/trainingcxl.vlt's waivers."""
    from sim import runner
    runner.setup_path()
    vlt = (runner.REPO / "hw" / "trainingcxl.vlt").read_text()
    for v in [v for pipeline in fc.PIPELINES for v in fc.generate_verilog(pipeline)]:
        waiver = tmp_path / f"{v.parent.name}_{v.stem}.vlt"
        waiver.write_text(vlt.replace('"*trainingcxl_device.v"', f'"*{v.name}"'))
        r = subprocess.run(["verilator-cli", "--lint-only", "-Wall", str(waiver), str(v)],
                           capture_output=True, text=True, cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "%Warning" not in r.stderr, r.stderr

