"""The physical-efficiency bound (sim/tb/min_traffic.py) against lines enumerated one by one."""
from __future__ import annotations

import numpy as np
import pytest

from hw.mem.port import split_line_address
from sim.bfm.ndp_host import NdpTable, lines_for, plan_layout
from sim.tb.min_traffic import MinimumTraffic, lines_per_channel

CHANNELS = 4


def _count(lines, channels=CHANNELS) -> list[int]:
    """Lines per channel, one line at a time through the device's own address split."""
    out = [0] * channels
    for line in lines:
        out[split_line_address(int(line), channels)[0]] += 1
    return out


def test_lines_per_channel_matches_enumeration():
    rng = np.random.default_rng(7)
    starts, counts = rng.integers(0, 1000, 200), np.concatenate([rng.integers(0, 17, 190), rng.integers(0, 300, 10)])
    lines = [s + i for s, n in zip(starts, counts) for i in range(n)]
    for channels in (1, 2, 4, 8):
        assert list(lines_per_channel(starts, counts, channels)) == _count(lines, channels)


@pytest.mark.parametrize("out", ["device", "host"])
def test_lookup_and_update_minimum_by_hand(out):
    # Two tables (dim 32 each: 2 lines per row), batch 3; table 0's bags {3, 3}, {},
    # {5}; table 1's {0}, {0}, {0, 1}: the repeats cost LOOKUP every time and UPDATE once.
    tables = [NdpTable(rows=8, dim=32, mode="sum"), NdpTable(rows=4, dim=32, mode="sum")]   # 4 lines: a padded pitch
    B = 3
    lay = plan_layout(tables, batch_size=B, max_indices=16, capacity_lines=1 << 12, outputs_in_device=out == "device")
    offsets = np.array([0, 2, 2, 3, 4, 5, 7], dtype=np.uint32)
    indices = np.array([3, 3, 5, 0, 0, 0, 1], dtype=np.uint32)
    mt = MinimumTraffic(lay, CHANNELS, has_weights=False, out=out)

    def row(t, r):
        return [lay.row_line(t, r) + i for i in range(tables[t].lines_per_row)]

    args = [lay.offsets.base + i for i in range(lines_for(2 * B + 1))] + \
        [lay.indices.base + i for i in range(lines_for(7))]
    occurrences = row(0, 3) * 2 + row(0, 5) + row(1, 0) * 3 + row(1, 1)
    # the vectors only: with an even sum of dim/16 the pitch has a padding line, never written
    outputs = [lay.vector_line(lay.outputs.base, t, b) + i for t in range(len(tables)) for b in range(B)
               for i in range(tables[t].lines_per_row)] if out == "device" else []
    assert mt.lookup(offsets, indices) == list(zip(_count(args + occurrences), _count(outputs)))

    # Gradients: table 0's bags 0 and 2 (bag 1 is empty), table 1's three bags.
    grads = [lay.vector_line(lay.grads.base, t, b) + i for t, b in [(0, 0), (0, 2), (1, 0), (1, 1), (1, 2)]
             for i in range(tables[t].lines_per_row)]
    distinct = row(0, 3) + row(0, 5) + row(1, 0) + row(1, 1)
    assert mt.update(offsets, indices) == list(zip(_count(args + grads + distinct), _count(distinct)))


def test_weights_are_read_once():
    tables = [NdpTable(rows=8, dim=16, mode="weighted_sum")]
    lay = plan_layout(tables, batch_size=2, max_indices=40, capacity_lines=1 << 12)
    offsets, indices = np.array([0, 20, 40], dtype=np.uint32), np.arange(40, dtype=np.uint32) % 8
    with_w = MinimumTraffic(lay, CHANNELS, has_weights=True, out="device").update(offsets, indices)
    without = MinimumTraffic(lay, CHANNELS, has_weights=False, out="device").update(offsets, indices)
    extra = _count(lay.weights.base + i for i in range(lines_for(40)))
    assert [r - r0 for (r, _), (r0, _) in zip(with_w, without)] == extra
