"""Where a command's media time goes: per-channel occupancy in fixed windows of cycles.

``MediaTimeline(env, window)`` samples the media counters (``MediaCounters``: completed reads
and writes per channel) every ``window`` cycles between ``start()`` and ``await stop()``, and
returns one row per window: the cycle it began (relative to ``start``), per channel the lines
read and written in it, and its occupancy, (reads * RD_COST_Q8 + writes * WR_COST_Q8) / 256 /
window: the fraction of the window the channel's media was busy. Counters count completions,
so a window shows the work that finished in it (each op lags its service start by its
latency, at most WR_LAT cycles). Without VPI access to the counters it records nothing.

It answers the question the per-command bound cannot: whether a command that runs at half
its media bound leaves every channel half idle all along, or idles in one stretch (a start
or a tail), or keeps one channel busy while the others wait.
"""
from __future__ import annotations

import cocotb
from cocotb.triggers import ClockCycles

from sim.bfm.ndp_host import MediaCounters


class MediaTimeline:
    def __init__(self, env, window: int, rd_cost_q8: int, wr_cost_q8: int):
        if window < 1:
            raise ValueError(f"window must be >= 1 cycle, got {window}")
        self.env, self.window = env, window
        self.costs = (rd_cost_q8, wr_cost_q8)
        self.counters = MediaCounters(env)
        self.rows: list[dict] = []
        self._task = None

    def start(self) -> None:
        self.rows = []
        self._began = self.env.host.cycle
        if self.counters.available:
            self._task = cocotb.start_soon(self._sample())

    async def _sample(self) -> None:
        self._last, self._cycle = self.counters.sample(), 0
        while True:
            await ClockCycles(self.env.clk, self.window)
            after = self.counters.sample()
            self._record(self._cycle, self.window, self._last, after)
            self._last, self._cycle = after, self._cycle + self.window

    def _record(self, cycle: int, length: int, before, after) -> None:
        rd, wr = self.costs
        delta = MediaCounters.delta(before, after)
        self.rows.append({"cycle": cycle, "cycles": length, "reads": [r for r, _ in delta],
                          "writes": [w for _, w in delta],
                          "occupancy": [round((r * rd + w * wr) / 256 / length, 3) for r, w in delta]})

    async def stop(self) -> list[dict]:
        if self._task is not None:
            self._task.cancel()
            self._task = None
            tail = self.env.host.cycle - self._began - self._cycle
            if tail > 0:                    # the last, partial window
                self._record(self._cycle, tail, self._last, self.counters.sample())
        return self.rows


def format_timeline(rows: list[dict], width: int = 40) -> str:
    """A text chart: one line per window, each channel's occupancy as a bar of ``width``."""
    if not rows:
        return "(no media counters)"
    channels = len(rows[0]["occupancy"])
    lines = [f"{'cycle':>9}  " + "  ".join(f"ch{c} busy".ljust(width + 6) for c in range(channels))]
    for row in rows:
        bars = []
        for occ in row["occupancy"]:
            filled = min(width, round(occ * width))
            bars.append(f"{'#' * filled}{'.' * (width - filled)} {occ:4.2f}")
        lines.append(f"{row['cycle']:>9}  " + "  ".join(bars))
    return "\n".join(lines)
