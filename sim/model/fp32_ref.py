"""Golden binary32 arithmetic on bit patterns (numpy uint32 arrays or Python ints).

- ``add``, ``mul``, ``div``, ``div_int``: numpy float32 (IEEE, round to nearest even,
  subnormals kept); results as uint32 bit patterns.
- ``fma``: the exactly rounded a*b+c (one rounding), vectorized:
  1. p = a*b in float64 is exact (24+24 = 48 significant bits <= 53; float32 products, even
     of subnormals, are >= 2^-298 and <= 2^256, inside float64's normal range).
  2. s = fl64(p + c) and its exact error e = (p + c) - s by TwoSum (exact in binary64 with
     subnormals, no overflow possible here).
  3. Round to odd at 53 bits: if e != 0 and s has an even significand, the exact value lies
     strictly between s and its neighbour towards e, which is odd: take that neighbour.
  4. Round the round-to-odd value to float32 (numpy, RNE). Rounding to odd at p+2 or more
     bits followed by RNE to p bits equals a direct RNE (Boldo & Melquiond, "Emulation of
     FMA and correctly rounded sums: proved algorithms using rounding to odd", IEEE TC 2008);
     53 >= 24+2, also for float32 subnormal results (float64 keeps all 53 bits there).
  Zero signs follow IEEE (s keeps them: (+-0)+(+-0) and exact cancellation to +0).
  ``tests/test_fp32.py`` checks this against an independent Fraction computation.
- NaN results: any NaN; ``same_fp32`` treats all NaN patterns as equal, everything else
  (including the sign of zero) must match bit for bit.
"""
from __future__ import annotations

import numpy as np

QNAN = 0x7FC00000


def _u32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.int64).astype(np.uint32) if not isinstance(x, np.ndarray) \
        else x.astype(np.uint32, copy=False)


def to_f32(bits) -> np.ndarray:
    return _u32(bits).view(np.float32)


def to_bits(f) -> np.ndarray:
    return np.asarray(f, dtype=np.float32).view(np.uint32)


def is_nan(bits) -> np.ndarray:
    b = _u32(bits)
    return ((b & 0x7F800000) == 0x7F800000) & ((b & 0x007FFFFF) != 0)


def same_fp32(x_bits, y_bits) -> np.ndarray | bool:
    """Element-wise: equal bit patterns, or both NaN."""
    x, y = _u32(x_bits), _u32(y_bits)
    r = (x == y) | (is_nan(x) & is_nan(y))
    return bool(r) if r.ndim == 0 else r


def add(a, c) -> np.ndarray:
    with np.errstate(all="ignore"):
        return to_bits(to_f32(a) + to_f32(c))


def mul(a, b) -> np.ndarray:
    with np.errstate(all="ignore"):
        return to_bits(to_f32(a) * to_f32(b))


def div(x, y) -> np.ndarray:
    with np.errstate(all="ignore"):
        return to_bits(to_f32(x) / to_f32(y))


def div_int(x, l_int) -> np.ndarray:
    """x / fp32(L) for integers L (exact conversion for L < 2^24)."""
    return div(x, to_bits(np.asarray(l_int, dtype=np.int64).astype(np.float32)))


def fma(a, b, c) -> np.ndarray:
    """Exactly rounded binary32 a*b+c (see the module docstring for the proof sketch)."""
    with np.errstate(all="ignore"):
        a64 = to_f32(a).astype(np.float64)
        b64 = to_f32(b).astype(np.float64)
        c64 = to_f32(c).astype(np.float64)
        p = a64 * b64                                   # exact
        s = p + c64
        bp = s - c64                                    # TwoSum (Knuth)
        bc = s - bp
        e = (p - bp) + (c64 - bc)
        s_bits = np.atleast_1d(s).view(np.uint64)
        fix = np.isfinite(s) & (np.atleast_1d(e) != 0) & ((s_bits & 1) == 0)
        ro = np.where(fix, np.nextafter(s, s + np.sign(e) * np.inf), s)
        return to_bits(ro.astype(np.float32))
