"""The least media traffic an embedding command needs: the physical-efficiency bound.

``trainingcxl run`` reports two efficiencies per command (tools/run_cmd.py):

- *media utilisation* (``lookup_efficiency`` / ``update_efficiency``): the engine's own media
  lines (the channels' counters) over its cycles. Redundant traffic (UPDATE's second pass
  over the arguments, re-reads after scratchpad evictions) raises this bound.
- *physical efficiency* (``lookup_physical_efficiency`` / ``update_physical_efficiency``):
  the traffic the command cannot avoid, placed on the channels by the device's interleave
  (hw/mem/port.py ``split_line_address``), over the same cycles:

  - LOOKUP: the offsets, indices (and weights) once, and every occurrence's row lines (the
    floor of a device without a row cache, where every occurrence is a media read; with the
    LOOKUP row cache on, the physical efficiency can exceed 1); writes: the pooled
    outputs when they stay in device memory. When they are pushed to the host the D2H data
    channel's one line per cycle is a floor, as in the media bound.
  - UPDATE: the offsets, indices (and weights) once, the gradients of the non-empty bags,
    every distinct (table, row) read once and written once.

  The command descriptor and the completion line (one line each) are left out of both.

A channel's bound is (reads * RD_COST_Q8 + writes * WR_COST_Q8) / 256 cycles; the command's is
the busiest channel's (sim/tb/ndp_run_tb.py ``media_bound_cycles``).
"""
from __future__ import annotations

import numpy as np

from hw.mem.port import split_line_address
from sim.bfm.ndp_host import lines_for


def lines_per_channel(starts, counts, channels: int) -> np.ndarray:
    """How many lines of the ranges [start, start + count) fall on each channel (the device's
    interleave, hw/mem/port.py); an array of ``channels`` counts. Every whole aligned group of
    N lines puts one line on each channel; only the partial groups at a range's two ends
    (fewer than 2N lines each) are mapped line by line."""
    s = np.asarray(starts, dtype=np.int64).reshape(-1)
    n = np.asarray(counts, dtype=np.int64).reshape(-1)
    keep = n > 0
    s, e = s[keep], s[keep] + n[keep]
    lo = -(-s // channels) * channels                 # first group boundary at or after start
    hi = e // channels * channels                     # last group boundary at or before end
    whole = lo < hi
    out = np.full(channels, int(((hi - lo)[whole] // channels).sum()), dtype=np.int64)
    # The lines outside whole groups: [s, lo) and [hi, e) where a whole group exists, else [s, e).
    parts = [(s[whole], lo[whole]), (hi[whole], e[whole]), (s[~whole], e[~whole])]
    for a, b in parts:
        for k in range(2 * channels):
            lines = a[a + k < b] + k
            if lines.size:
                out += np.bincount(split_line_address(lines, channels)[0], minlength=channels)
    return out


class MinimumTraffic:
    """Per-channel (reads, writes) a batch's LOOKUP and UPDATE cannot avoid on ``layout``."""

    def __init__(self, layout, channels: int, has_weights: bool, out: str):
        self.layout, self.channels, self.has_weights, self.out = layout, channels, has_weights, out

    def _arguments(self, n_indices: int) -> np.ndarray:
        L = self.layout
        starts = [L.offsets.base, L.indices.base]
        counts = [lines_for(len(L.tables) * L.batch_size + 1), lines_for(n_indices)]
        if self.has_weights:
            starts.append(L.weights.base)
            counts.append(lines_for(n_indices))
        return lines_per_channel(starts, counts, self.channels)

    def _bags(self, offsets):
        """Per table t: (t, its B bag sizes, (lo, hi): its occurrences' span in the indices)."""
        offs = np.asarray(offsets, dtype=np.int64)
        B = self.layout.batch_size
        for t in range(len(self.layout.tables)):
            yield t, np.diff(offs[t * B:(t + 1) * B + 1]), (int(offs[t * B]), int(offs[(t + 1) * B]))

    def _rows(self, t: int, rows: np.ndarray) -> np.ndarray:
        L = self.layout
        lpr = L.tables[t].lines_per_row
        return lines_per_channel(L.table_regions[t].base + rows * lpr, np.full(rows.size, lpr), self.channels)

    def row_lines(self, offsets) -> int:
        """Row lines of all the batch's occurrences (what LOOKUP asks its ports for)."""
        return sum(int(hi - lo) * self.layout.tables[t].lines_per_row for t, _, (lo, hi) in self._bags(offsets))

    def lookup(self, offsets, indices) -> list[tuple[int, int]]:
        idx = np.asarray(indices, dtype=np.int64)
        reads = self._arguments(idx.size)
        for t, _, (lo, hi) in self._bags(offsets):
            reads = reads + self._rows(t, idx[lo:hi])
        writes = np.zeros(self.channels, dtype=np.int64)
        if self.out == "device":
            L = self.layout
            bags = np.arange(L.batch_size)
            for t, spec in enumerate(L.tables):    # the vectors only: the pitch's padding line is not written
                writes = writes + lines_per_channel(L.outputs.base + bags * L.row_pitch_lines + L.col_lines[t],
                                                    np.full(bags.size, spec.lines_per_row), self.channels)
        return [(int(r), int(w)) for r, w in zip(reads, writes)]

    def update(self, offsets, indices) -> list[tuple[int, int]]:
        L = self.layout
        idx = np.asarray(indices, dtype=np.int64)
        reads = self._arguments(idx.size)
        rows = np.zeros(self.channels, dtype=np.int64)
        for t, sizes, (lo, hi) in self._bags(offsets):
            bags = np.flatnonzero(sizes)
            lpr = L.tables[t].lines_per_row
            reads = reads + lines_per_channel(L.grads.base + bags * L.row_pitch_lines + L.col_lines[t],
                                              np.full(bags.size, lpr), self.channels)
            rows = rows + self._rows(t, np.unique(idx[lo:hi]))
        return [(int(r), int(w)) for r, w in zip(reads + rows, rows)]
