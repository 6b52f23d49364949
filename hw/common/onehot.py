"""One-hot selection helpers (combinational, balanced OR trees: log depth, no priority chain).

``one_hot_index(bits)``: the index of the set bit of a one-hot (or all-zero: 0) vector.
``one_hot_select(bits, values)``: the value whose bit is set (0 when none).
Both assume at most one bit is set; with two set they return the OR of both choices, so
callers state why their vector is one-hot.
"""
from amaranth import Const, Mux


def _or_tree(terms):
    while len(terms) > 1:
        terms = [terms[i] | terms[i + 1] if i + 1 < len(terms) else terms[i] for i in range(0, len(terms), 2)]
    return terms[0]


def one_hot_index(bits):
    if len(bits) == 1:
        return Const(0, 1)
    return _or_tree([Const(0, range(len(bits)))] + [Mux(bits[i], i, 0) for i in range(1, len(bits))])


def one_hot_select(bits, values):
    assert len(bits) == len(values)
    return _or_tree([Mux(bits[i], values[i], 0) for i in range(len(bits))])
