"""Bulk bit-exact campaigns for the binary32 units (hw/common/fp32.py, hw/common/fp32_div.py).

- ``gen_vectors(op, n, rng)`` -> (a, b, c) uint32 arrays rich in special values (signed
  zeros, subnormals, boundaries, Inf, quiet/signalling NaN), exact ties, FMA cancellation,
  under/overflow regions and uniform random bit patterns. ``directed(op)`` -> the fixed edge
  set (cross products of special values). For "div", b holds the integer L (x = a).
- ``pipeline``: which pipeline of the units runs, "compact" (the default, what the engines
  use), "deep" (``Fp32Fma(pipeline="deep")``, ``Fp32DivInt(pipeline="deep")``) or
  "deep_late_c" (the deep FMA taking its addend two cycles late, ``late_addend_fma``). Each has
  its own generated Verilog (same module names) and harness build, with the latencies as
  the harness's FMA_LAT / DIV_LAT.
- ``simulate(ops, a, b, c, gap=False, pipeline="compact")`` runs one Verilator simulation
  of sim/rtl/fp32_harness.sv over all vectors (files in, files out; no per-vector Python)
  and returns (fma_results, div_results, seconds).
- ``results(op_names, a, b, c, gap=False, pipeline="compact")`` -> (raw result patterns,
  simulation seconds); ``run_mixed`` checks them (mismatch mask, first lines, seconds).
- ``run_fp32_campaign(op, n, seed, pipeline="compact")`` -> {"op", "pipeline", "vectors",
  "mismatches", "seconds", "seed", "first_mismatches"}: n random vectors (plus, for
  n >= 10000, the directed set) checked bit for bit against sim.model.fp32_ref; "seconds" is
  the wall time of generation, simulation and checking.
Command line: ``python -m sim.tb.fp32_campaign --op fma --n 1000000 --seed 1`` (op: fma, add,
mul, div, all; ``--pipeline compact|deep|deep_late_c|both``, both = every pipeline).
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import pathlib
import time
import uuid

import numpy as np

from sim import runner
from sim.model import fp32_ref

OPS = {"fma": 0, "add": 1, "mul": 2, "div": 3}
DEPTH = 1 << 20
TOP = "fp32_harness"
SV = runner.REPO / "sim" / "rtl" / "fp32_harness.sv"
GEN = runner.BUILD / "fp32"
PIPELINES = ("compact", "deep", "deep_late_c")

SPECIALS = np.array([
    0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x00000002, 0x007FFFFF, 0x807FFFFF,
    0x00400000, 0x00800000, 0x80800000, 0x00800001, 0x00FFFFFF, 0x7F7FFFFF, 0xFF7FFFFF,
    0x7F000000, 0x7EFFFFFF, 0x3F800000, 0xBF800000, 0x3F7FFFFF, 0x3F800001, 0x40000000,
    0x34000000, 0x33800000, 0x4B800000, 0x5F800000, 0x1F800000, 0x0C000000, 0x7F800000,
    0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FBFFFFF, 0xFFFFFFFF,
], dtype=np.uint32)
SMALL_SPECIALS = np.array([
    0x00000000, 0x80000000, 0x00000001, 0x807FFFFF, 0x00800000, 0x7F7FFFFF, 0xFF7FFFFF,
    0x3F800000, 0xBF800000, 0x3F800001, 0x33800000, 0x7F800000, 0xFF800000, 0x7FC00000,
    0x7F800001, 0x5F800000,
], dtype=np.uint32)
DIV_LS = np.array([0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 13, 16, 17, 100, 255, 256, 1000, 4095, 4096,
                   32767, 32768, 32769, 65533, 65534, 65535], dtype=np.uint32)


# ------------------------------------------------------------------ operand generators --
def _mk(sign, exp, mant):
    return ((np.asarray(sign, np.uint32) & 1) << 31) | ((np.asarray(exp, np.uint32) & 0xFF) << 23) | \
        (np.asarray(mant, np.uint32) & 0x7FFFFF)


def _rand_bits(rng, n):
    return rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32)


def _moderate(rng, n, lo=100, hi=154):
    return _mk(rng.integers(0, 2, n), rng.integers(lo, hi + 1, n), rng.integers(0, 1 << 23, n))


def _with_exp(rng, exp):
    exp = np.asarray(exp)
    n = exp.size
    e = np.clip(exp, 0, 254)
    return _mk(rng.integers(0, 2, n), e, rng.integers(0, 1 << 23, n))


def _specials(rng, n, other):
    pick = rng.random(n) < 0.5
    return np.where(pick, SPECIALS[rng.integers(0, len(SPECIALS), n)], other)


def _tie_operands(rng, n):
    """a = +-(1 + i/2^12) 2^ea, b = +-(1 + j/2^12) 2^eb: products with 25 significant bits
    (exact ties when i*j is odd) or fewer."""
    i, j = rng.integers(0, 1 << 12, n), rng.integers(0, 1 << 12, n)
    i |= rng.integers(0, 2, n)
    j |= 1
    ea, eb = rng.integers(90, 165, n), rng.integers(90, 165, n)
    a = _mk(rng.integers(0, 2, n), ea, i << 11)
    b = _mk(rng.integers(0, 2, n), eb, j << 11)
    return a, b


def _add_ties(rng, n):
    """a normal with exponent E, c = +-2^(E-24) (* 1, 3 or 5): a+c exactly halfway, or near."""
    ea = rng.integers(26, 255, n)
    a = _mk(rng.integers(0, 2, n), ea, rng.integers(0, 1 << 23, n))
    mant = rng.choice(np.array([0, 1 << 22, 1 << 21], np.uint32), n)
    c = _mk(rng.integers(0, 2, n), ea - 24 + rng.integers(-1, 2, n), mant)
    return a, c


def _tiny_huge(rng, n):
    """Exponent pairs whose product lands near the subnormal range or near overflow."""
    ea = rng.integers(1, 255, n)
    target = np.where(rng.random(n) < 0.7, rng.integers(-30, 6, n), rng.integers(250, 262, n))
    eb = np.clip(target - ea + 127, 0, 254)
    a = _with_exp(rng, ea)
    b = _with_exp(rng, eb)
    b = np.where(eb == 0, b & 0x807FFFFF, b)
    return a, b


def gen_vectors(op: str, n: int, rng: np.random.Generator):
    """n operand sets for ``op`` (see the module docstring); returns uint32 (a, b, c)."""
    if op == "div":
        kind = rng.integers(0, 5, n)
        x = np.select([kind == 0, kind == 1, kind == 2, kind == 3],
                      [_rand_bits(rng, n), _specials(rng, n, _rand_bits(rng, n)),
                       np.full(n, 0x3F800000, np.uint32),
                       _mk(rng.integers(0, 2, n), 0, rng.integers(0, 1 << 23, n))],
                      _moderate(rng, n, 1, 254))
        lk = rng.integers(0, 10, n)
        ls = np.select([lk < 5, lk < 7, lk < 8, lk < 9],
                       [rng.integers(1, 65536, n), rng.integers(1, 65, n),
                        np.left_shift(1, rng.integers(0, 16, n)),
                        65535 - rng.integers(0, 4, n)],
                       DIV_LS[rng.integers(1, len(DIV_LS), n)])
        return x.astype(np.uint32), ls.astype(np.uint32), np.zeros(n, np.uint32)
    kind = rng.integers(0, 20, n)
    a, b, c = _rand_bits(rng, n), _rand_bits(rng, n), _rand_bits(rng, n)
    sa, sb, sc = _specials(rng, n, a), _specials(rng, n, b), _specials(rng, n, c)
    ma, mb = _moderate(rng, n), _moderate(rng, n)
    ta, tb = _tie_operands(rng, n)
    ha, hb = _tiny_huge(rng, n)
    if op == "add":
        aa, ac = _add_ties(rng, n)
        ea = (ma >> 23) & 0xFF
        near = _with_exp(rng, ea.astype(np.int64) + rng.integers(-30, 31, n))
        cancel = (ma ^ 0x80000000) + rng.integers(-3, 4, n).astype(np.uint32)
        sub = _mk(rng.integers(0, 2, n), rng.integers(0, 3, n), rng.integers(0, 1 << 23, n))
        sub2 = _mk(rng.integers(0, 2, n), rng.integers(0, 3, n), rng.integers(0, 1 << 23, n))
        big = _with_exp(rng, rng.integers(250, 255, n))
        big2 = _with_exp(rng, rng.integers(250, 255, n))
        conds = [kind < 4, kind < 7, kind < 12, kind < 15, kind < 18, kind < 19]
        a = np.select(conds, [a, sa, ma, ma, aa, sub], big)
        c = np.select(conds, [c, sc, near, cancel, ac, sub2], big2)
        return a, b, c
    if op == "mul":
        conds = [kind < 4, kind < 7, kind < 12, kind < 15]
        a = np.select(conds, [a, sa, ma, ta], ha)
        b = np.select(conds, [b, sb, mb, tb], hb)
        return a, b, c
    # fma
    prod = fp32_ref.mul(ma, mb)
    pe = ((prod >> 23) & 0xFF).astype(np.int64)
    near = _with_exp(rng, pe + rng.integers(-30, 31, n))
    cancel = (prod ^ 0x80000000) + rng.integers(-3, 4, n).astype(np.uint32)
    tprod = fp32_ref.mul(ta, tb)
    tpe = ((tprod >> 23) & 0xFF).astype(np.int64)
    tcancel = tprod ^ 0x80000000          # exact zero, or a residue of 2^-24 relative
    # c for tie products: 0 (a tie), a c within the 53-bit window, or a c so small that a
    # float64 sum would round onto the tie (the double-rounding trap).
    tk = rng.integers(0, 3, n)
    tie_c = np.select([tk == 0, tk == 1],
                      [np.uint32(0), _with_exp(rng, tpe - rng.integers(20, 30, n)) & 0xFFF00000],
                      _with_exp(rng, tpe - rng.integers(50, 90, n)))
    small = _mk(rng.integers(0, 2, n), rng.integers(0, 4, n), rng.integers(0, 1 << 23, n))
    conds = [kind < 3, kind < 6, kind < 10, kind < 12, kind < 13, kind < 16, kind < 18]
    a = np.select(conds, [a, sa, ma, ma, ta, ta, ha], ma)
    b = np.select(conds, [b, sb, mb, mb, tb, tb, hb], np.full(n, 0x3F800000, np.uint32))
    one_tie = _add_ties(rng, n)
    a = np.where(kind >= 18, one_tie[0], a)
    c = np.select(conds, [c, sc, near, cancel, tcancel, tie_c, small], one_tie[1])
    return a.astype(np.uint32), b.astype(np.uint32), c.astype(np.uint32)


def directed(op: str):
    """Fixed edge cases: all pairs (triples for fma, of a smaller set) of special values."""
    if op == "div":
        x, ls = np.meshgrid(SPECIALS, DIV_LS, indexing="ij")
        return x.ravel(), ls.ravel().astype(np.uint32), np.zeros(x.size, np.uint32)
    if op == "fma":
        a, b, c = np.meshgrid(SMALL_SPECIALS, SMALL_SPECIALS, SMALL_SPECIALS, indexing="ij")
        return a.ravel(), b.ravel(), c.ravel()
    x, y = np.meshgrid(SPECIALS, SPECIALS, indexing="ij")
    x, y = x.ravel(), y.ravel()
    if op == "add":
        return x, np.full(x.size, 0x12345678, np.uint32), y
    return x, y, np.full(x.size, 0x7FC00000, np.uint32)   # mul: c must be ignored


def reference(op: str, a, b, c) -> np.ndarray:
    if op == "fma":
        return fp32_ref.fma(a, b, c)
    if op == "add":
        return fp32_ref.add(a, c)
    if op == "mul":
        return fp32_ref.mul(a, b)
    return fp32_ref.div_int(a, b & 0xFFFF)


# ------------------------------------------------------------------------ simulation --
def late_addend_fma(tag_width: int):
    """The deep FMA with its late addend (``Fp32Fma(pipeline="deep", c_delay=LATE_C)``) behind
    the plain unit's ports: c passes LATE_C registers, so it reaches the unit LATE_C cycles
    after the a, b and op it belongs to, as the late addend's contract asks; the outputs are
    the unit's. So the same harness and checks run it."""
    from amaranth import Module, Signal
    from amaranth.lib import wiring
    from hw.common.fp32 import Fp32Fma

    class LateAddendFma(wiring.Component):
        latency = Fp32Fma.DEEP_LATENCY

        def __init__(self):
            self.unit = Fp32Fma(tag_width, pipeline="deep", c_delay=Fp32Fma.LATE_C)
            super().__init__(dict(self.unit.signature.members))

        def elaborate(self, platform):
            m = Module()
            m.submodules.unit = u = self.unit
            c = self.c
            for i in range(Fp32Fma.LATE_C):
                nxt = Signal(32, name=f"c_late{i}")
                m.d.sync += nxt.eq(c)
                c = nxt
            m.d.comb += [u.a.eq(self.a), u.b.eq(self.b), u.c.eq(c), u.op.eq(self.op), u.i_valid.eq(self.i_valid),
                         u.i_tag.eq(self.i_tag), self.o_result.eq(u.o_result), self.o_valid.eq(u.o_valid),
                         self.o_tag.eq(u.o_tag)]
            return m

    return LateAddendFma()


def _units(pipeline: str):
    """(FMA factory, divider factory, FMA latency, divider latency) of ``pipeline``; each
    factory takes the tag width. "deep_late_c": the deep FMA fed its addend late
    (``late_addend_fma``) beside the deep divider."""
    from hw.common.fp32 import Fp32Fma
    from hw.common.fp32_div import Fp32DivInt
    if pipeline not in PIPELINES:
        raise ValueError(f"pipeline must be one of {PIPELINES}, not {pipeline!r}")
    if pipeline == "deep_late_c":
        return late_addend_fma, lambda t: Fp32DivInt(t, pipeline="deep"), Fp32Fma.DEEP_LATENCY, \
            Fp32DivInt.DEEP_LATENCY
    return (lambda t: Fp32Fma(t, pipeline=pipeline), lambda t: Fp32DivInt(t, pipeline=pipeline),
            Fp32Fma.LATENCIES[pipeline], Fp32DivInt.LATENCIES[pipeline])


def generate_verilog(pipeline: str = "compact") -> list[pathlib.Path]:
    """Amaranth -> fp32_fma.v and fp32_div_int.v (rewritten only when changed), in build/fp32/
    for the compact pipeline, build/fp32/<pipeline>/ for another."""
    from amaranth.back import verilog
    gen = GEN if pipeline == "compact" else GEN / pipeline
    gen.mkdir(parents=True, exist_ok=True)
    out = []
    fma, div, _, _ = _units(pipeline)
    for name, unit in (("fp32_fma", fma), ("fp32_div_int", div)):
        path = gen / f"{name}.v"
        text = verilog.convert(unit(20), name=name, emit_src=False)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        out.append(path)
    return out


_BUILT: dict[str, pathlib.Path] = {}


def build_harness(pipeline: str = "compact") -> pathlib.Path:
    """Generate the units' Verilog and build the harness (once per process and pipeline)."""
    if pipeline in _BUILT:
        return _BUILT[pipeline]
    _, _, fma_lat, div_lat = _units(pipeline)
    lock = runner.BUILD / "sim" / ".fp32.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        sources = generate_verilog(pipeline) + [SV]
        bdir = runner.build("fp32_harness" if pipeline == "compact" else f"fp32_harness_{pipeline}", sources, TOP,
                            parameters={"FMA_LAT": fma_lat, "DIV_LAT": div_lat})
    _BUILT[pipeline] = bdir
    return bdir


_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def _write_hex(path: pathlib.Path, words: np.ndarray) -> None:
    """words: (n, k) uint32, most significant first -> n lines of 8k hex digits."""
    n, k = words.shape
    shifts = np.arange(28, -1, -4, dtype=np.uint32)
    nib = (words[:, :, None] >> shifts) & 0xF
    lines = np.empty((n, 8 * k + 1), dtype=np.uint8)
    lines[:, :-1] = _HEX[nib.reshape(n, 8 * k)]
    lines[:, -1] = ord("\n")
    path.write_bytes(lines.tobytes())


def _read_hex32(path: pathlib.Path, n: int) -> np.ndarray:
    raw = np.frombuffer(path.read_bytes(), dtype=np.uint8)
    if raw.size == 9 * n and (raw[8::9] == ord("\n")).all():      # Verilator: "%08x\n" per word
        d = raw.reshape(n, 9)[:, :8].astype(np.uint32)
        d = np.where(d >= ord("a"), d - ord("a") + 10, np.where(d >= ord("A"), d - ord("A") + 10, d - ord("0")))
        return (d << np.arange(28, -1, -4, dtype=np.uint32)).sum(axis=1, dtype=np.uint64).astype(np.uint32)
    toks = [t for t in path.read_bytes().split() if not t.startswith(b"@") and not t.startswith(b"//")]
    if len(toks) != n:
        raise RuntimeError(f"{path}: {len(toks)} results, expected {n}")
    return np.array([int(t, 16) for t in toks], dtype=np.uint32)


def simulate(ops, a, b, c, *, gap: bool = False, pipeline: str = "compact"):
    """Run every vector through both units (one simulation); returns (fma, div, seconds)."""
    n = len(a)
    if not 0 < n <= DEPTH:
        raise ValueError(f"1..{DEPTH} vectors per simulation, got {n}")
    bdir = build_harness(pipeline)
    work = bdir / "runs" / uuid.uuid4().hex
    work.mkdir(parents=True)
    words = np.stack([np.asarray(ops, np.uint32), a, b, c], axis=1).astype(np.uint32)
    fin, ffma, fdiv = work / "in.hex", work / "fma.hex", work / "div.hex"
    _write_hex(fin, words)
    t0 = time.monotonic()
    runner.run(bdir, TOP, "sim.tb.fp32_tb", env={"FP32_N": str(n)},
               plusargs=(f"+fp32_n={n}", f"+fp32_in={fin}", f"+fp32_fma_out={ffma}",
                         f"+fp32_div_out={fdiv}", f"+fp32_gap={int(gap)}"))
    seconds = time.monotonic() - t0
    fma, div = _read_hex32(ffma, n), _read_hex32(fdiv, n)
    for f in (fin, ffma, fdiv):
        f.unlink()
    work.rmdir()
    return fma, div, seconds


def check(op_names, a, b, c, got) -> tuple[np.ndarray, list[str]]:
    """Mismatch mask and hex lines for the first few mismatches (per-element op names)."""
    op_names = np.asarray(op_names)
    bad = np.zeros(len(a), bool)
    exp = np.zeros(len(a), np.uint32)
    for op in OPS:
        sel = op_names == op
        if sel.any():
            exp[sel] = reference(op, a[sel], b[sel], c[sel])
            bad[sel] = ~fp32_ref.same_fp32(got[sel], exp[sel])
    lines = [f"{op_names[i]} a={a[i]:08x} b={b[i]:08x} c={c[i]:08x} rtl={got[i]:08x} ref={exp[i]:08x}"
             for i in np.flatnonzero(bad)[:10]]
    return bad, lines


def results(op_names, a, b, c, *, gap: bool = False, pipeline: str = "compact"):
    """Simulate vectors of any ops (chunks of DEPTH); returns (result patterns, sim s)."""
    op_names = np.asarray(op_names)
    codes = np.zeros(len(a), np.uint32)
    for op, code in OPS.items():
        codes[op_names == op] = code
    got = np.zeros(len(a), np.uint32)
    sim_s = 0.0
    for lo in range(0, len(a), DEPTH):
        hi = min(lo + DEPTH, len(a))
        fma, div, s = simulate(codes[lo:hi], a[lo:hi], b[lo:hi], c[lo:hi], gap=gap, pipeline=pipeline)
        got[lo:hi] = np.where(codes[lo:hi] == OPS["div"], div, fma)
        sim_s += s
    return got, sim_s


def run_mixed(op_names, a, b, c, *, gap: bool = False, pipeline: str = "compact"):
    """Simulate vectors of any ops (chunks of DEPTH); returns (mismatch mask, lines, sim s)."""
    got, sim_s = results(op_names, a, b, c, gap=gap, pipeline=pipeline)
    bad, lines = check(op_names, a, b, c, got)
    return bad, lines, sim_s


def run_fp32_campaign(op: str, n: int, seed: int, pipeline: str = "compact") -> dict:
    """n random vectors of ``op`` (+ the directed set when n >= 10000), bit-exact check."""
    if op not in OPS:
        raise ValueError(f"op must be one of {list(OPS)}")
    t0 = time.monotonic()
    print(f"fp32 campaign: op={op} n={n} seed={seed} pipeline={pipeline}", flush=True)
    rng = np.random.default_rng(seed)
    a, b, c = gen_vectors(op, n, rng)
    if n >= 10000:
        da, db, dc = directed(op)
        a, b, c = np.concatenate([da, a]), np.concatenate([db, b]), np.concatenate([dc, c])
    bad, lines, sim_s = run_mixed(np.full(len(a), op), a, b, c, pipeline=pipeline)
    return {"op": op, "pipeline": pipeline, "vectors": int(len(a)), "mismatches": int(bad.sum()),
            "seconds": round(time.monotonic() - t0, 3), "sim_seconds": round(sim_s, 3),
            "seed": seed, "first_mismatches": lines}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--op", default="all", choices=[*OPS, "all"])
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--seed", type=int, default=int.from_bytes(os.urandom(4), "little"))
    p.add_argument("--pipeline", default="compact", choices=[*PIPELINES, "both"])
    args = p.parse_args(argv)
    fails = 0
    for pipeline in (PIPELINES if args.pipeline == "both" else [args.pipeline]):
        for op in (list(OPS) if args.op == "all" else [args.op]):
            r = run_fp32_campaign(op, args.n, args.seed, pipeline)
            print(json.dumps(r), flush=True)
            fails += r["mismatches"]
    return 1 if fails else 0


if __name__ == "__main__":
    raise SystemExit(main())
