"""Estimated LUT depth of a netlist before LUT mapping, naming the RTL nets on each deep path.

Why: after ABC9 every net inside a module is renamed, so ``tools/logic_depth.py`` can say how
deep a block is but not through which logic. This module reads the same block stopped just
before ``synth_xilinx``'s ``map_luts`` step (flip-flops, block/LUT RAM, DSPs and carry chains
already mapped; the rest still Yosys' fine gates ``$_AND_``, ``$_MUX_`` ...), where the RTL's
names are still on the nets, and maps the gates itself on paper.

Contract: ``analyze(netlist, module=None, top_paths=5, k=6, cuts_per_node=8) -> dict`` with the
keys of ``logic_depth.analyze`` (``logic_levels``, ``paths`` with ``from`` / ``to`` / ``via``: one
per register, its deepest bit, so the list shows different logic,
``by_group``, ``cells``, ``loops``, ``unknown_cells``) plus ``gates``: how many fine gates were
mapped. ``logic_levels`` is an *estimate* of what a depth-oriented K-LUT mapper reaches:
priority cuts (Mishchenko et al., ICCAD 2007; ABC's ``if`` mapper) with at most
``cuts_per_node`` cuts of at most ``k`` leaves kept per node, without ABC's restructuring.
It is usually within a level or two of ABC9 on the same block (both directions: ABC9 also
balances and re-synthesises; it also trades depth for area off the critical path); the figure
to report is still ``logic_depth``'s. ``via`` lists every RTL-named net on the gate-level path
inside each LUT as well as at LUT boundaries, start first, which is what this module is for.

Cells: fine gates (``$_NOT_``, ``$_AND_`` ... ``$_MUX_``, ``$_AOI4_``) and ``$lut`` / LUT1-6
are what the cuts cover; MUXF7/8/9, CARRY4/8, INV/BUF and a combinational DSP pass through
(their inputs must be LUT outputs, no level added); a LUT RAM's or SRL's read adds one level
from its read address; everything else is a boundary, as in ``logic_depth``.
"""
from __future__ import annotations

import pathlib
import re
from collections import deque

from tools.logic_depth import (_is_rtl_name, _names, _pick_module, _sink_label, cell_graph, classify, group_of,
                               load_netlist)

GATE = re.compile(r"\$_(BUF|NOT|AND|NAND|OR|NOR|XOR|XNOR|ANDNOT|ORNOT|MUX|NMUX|AOI3|OAI3|AOI4|OAI4)_|\$lut")


def _kind(cell: dict) -> str:
    """``gate`` (covered by cuts), ``through`` (no level, a hard boundary for cuts), ``read``
    (one level from a LUT RAM's read address), ``seq`` or ``unknown``."""
    if GATE.fullmatch(cell["type"]):
        return "gate"
    k = classify(cell)
    return {"lut": "gate", "muxf": "through", "carry": "through", "wire": "through", "dsp": "through",
            "lutram": "read", "srl": "read"}.get(k, k)


def analyze(netlist: dict, module: str | None = None, top_paths: int = 5, k: int = 6, cuts_per_node: int = 8) -> dict:
    """The estimated depth of one unmapped module (see the module docstring)."""
    name, mod = _pick_module(netlist, module)
    cells = mod.get("cells", {})
    edges, sinks, unknown = cell_graph(mod, _kind, ("gate", "through"), {"read": "read"})
    fanin = {b: (kind, ins) for b, (kind, _, ins) in edges.items()}      # comb output bit -> (kind, inputs)
    gates = sum(1 for c in cells.values() if c["type"] != "$scopeinfo" and _kind(c) == "gate")
    order, loops = _topological(fanin)
    label: dict[int, int] = {}                          # bit -> LUT levels to produce it (0: a boundary)
    best: dict[int, frozenset] = {}                     # gate bit -> the leaves of its chosen LUT
    cutsets: dict[int, list[frozenset]] = {}
    uses = {b: 0 for b in fanin}
    for b in order:
        for x in fanin[b][1]:
            if x in uses:
                uses[x] += 1
    for b in order:
        kind, ins = fanin[b]
        if kind != "gate":
            label[b] = max((label.get(x, 0) for x in ins), default=0) + (kind == "read")
        else:
            merged = [frozenset()]
            for x in dict.fromkeys(ins):
                theirs = cutsets.get(x) or [frozenset((x,))]
                merged = _prune({a | c for a in merged for c in theirs if len(a | c) <= k}, label, cuts_per_node)
            if not merged:                              # more than k distinct inputs: not one LUT
                merged = [frozenset(ins)]
            best[b] = merged[0]
            label[b] = _depth(merged[0], label)
            cutsets[b] = merged + [frozenset((b,))]
        for x in ins:                                   # free what no later node needs
            if x in uses:
                uses[x] -= 1
                if uses[x] == 0:
                    cutsets.pop(x, None)
    names = _names(mod)

    def start_and_via(b: int) -> tuple[str, list[str]]:
        out, seen = [], set()
        while b in fanin and b not in seen:
            seen.add(b)
            kind, ins = fanin[b]
            if kind != "gate":
                out += _named([b], names)
                b = max(ins, key=lambda x: label.get(x, 0)) if ins else b
                continue
            leaf = max(best[b], key=lambda x: label.get(x, 0))
            out += _named(_inside(b, leaf, best[b], fanin), names)
            if leaf == b:
                break
            b = leaf
        out += _named([b], names)
        via = []
        for n in out[::-1]:
            if not via or re.sub(r"\[\d+\]$", "", via[-1]) != re.sub(r"\[\d+\]$", "", n):
                via.append(n)
        return names.get(b, f"net {b}"), via

    per_end: dict[str, tuple[int, int, str]] = {}     # one entry per register, not per bit of it
    for b, where in sinks:
        lv = label.get(b, 0)
        end = where if where.startswith("port:") else _sink_label(where, names, cells, b)
        reg = re.sub(r"\[\d+\]$", "", end)
        if reg not in per_end or lv > per_end[reg][0]:
            per_end[reg] = (lv, b, end)
    ranked = sorted(per_end.values(), key=lambda v: v[0], reverse=True)
    paths = []
    for lv, b, end in ranked[:top_paths]:
        start, via = start_and_via(b)
        paths.append({"levels": lv, "from": start, "to": end, "via": via})
    by_group: dict[str, dict] = {}
    for lv, b, end in ranked:
        g = group_of(end)
        if g not in by_group:
            by_group[g] = {"levels": lv, "from": start_and_via(b)[0], "to": end}
    return {"module": name, "logic_levels": paths[0]["levels"] if paths else 0, "estimate": "priority cuts",
            "k": k, "cuts_per_node": cuts_per_node, "paths": paths, "by_group": by_group, "cells": len(cells),
            "gates": gates, "loops": loops, "unknown_cells": unknown}


def _depth(cut: frozenset, label: dict) -> int:
    return 1 + max((label.get(x, 0) for x in cut), default=0)


def _prune(cuts: set, label: dict, keep: int) -> list[frozenset]:
    """The ``keep`` best cuts: shallowest, then fewest leaves (ABC's depth-first order)."""
    return sorted(cuts, key=lambda c: (_depth(c, label), len(c), sorted(c)))[:keep]


def _inside(root: int, leaf: int, cut: frozenset, fanin: dict) -> list[int]:
    """The bits on one gate path from ``leaf`` to ``root`` inside the LUT ``cut`` (root first)."""
    prev, todo = {root: None}, deque([root])
    while todo:
        b = todo.popleft()
        if b == leaf:
            path = []
            while b is not None:
                path.append(b)
                b = prev[b]
            return path[::-1]                     # walked leaf -> root: root first
        if b in cut or b not in fanin or fanin[b][0] != "gate":
            continue
        for x in fanin[b][1]:
            if x not in prev:
                prev[x] = b
                todo.append(x)
    return [root]


def _named(bits: list[int], names: dict) -> list[str]:
    return [names[b] for b in bits if b in names and _is_rtl_name(names[b])]


def _topological(fanin: dict) -> tuple[list[int], int]:
    """The combinational bits in an order where every input comes first; bits on a loop are
    left out (they count as boundaries) and counted."""
    pending = {b: sum(1 for x in ins if x in fanin) for b, (_, ins) in fanin.items()}
    users: dict[int, list[int]] = {}
    for b, (_, ins) in fanin.items():
        for x in ins:
            if x in fanin:
                users.setdefault(x, []).append(b)
    ready = deque(b for b, n in pending.items() if n == 0)
    order = []
    while ready:
        b = ready.popleft()
        order.append(b)
        for u in users.get(b, ()):
            pending[u] -= 1
            if pending[u] == 0:
                ready.append(u)
    return order, len(fanin) - len(order)


def analyze_file(path: pathlib.Path, module: str | None = None, top_paths: int = 5) -> dict:
    return analyze(load_netlist(path), module, top_paths)
