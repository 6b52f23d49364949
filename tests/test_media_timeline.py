"""sim/bfm/media_timeline.py: a window's occupancy and the text chart (pure Python; the
sampling on the RTL is checked in tests/test_ndp.py ``test_run_command_end_to_end``: the
windows tile each command and add up to its media counters)."""
from __future__ import annotations

import pytest

from sim.bfm.media_timeline import MediaTimeline, format_timeline


class _Env:
    class config:
        channels = 2


def test_window_occupancy_counts_reads_and_writes_at_their_costs():
    t = MediaTimeline.__new__(MediaTimeline)          # no simulator: only the arithmetic
    t.costs, t.rows = (512, 2560), []                 # 2 and 10 cycles per line
    t._record(100, 100, [(10, 0), (0, 0)], [(30, 1), (10, 9)])
    assert t.rows == [{"cycle": 100, "cycles": 100, "reads": [20, 10], "writes": [1, 9],
                       "occupancy": [0.5, 1.1]}]


def test_window_must_be_positive():
    with pytest.raises(ValueError, match="window"):
        MediaTimeline(_Env(), 0, 512, 2560)


def test_chart_has_one_bar_per_channel_and_window():
    rows = [{"cycle": 0, "cycles": 10, "reads": [1, 0], "writes": [0, 0], "occupancy": [0.25, 1.5]}]
    text = format_timeline(rows, width=8)
    assert text.splitlines()[1].split() == ["0", "##......", "0.25", "########", "1.50"]
    assert format_timeline([]) == "(no media counters)"
