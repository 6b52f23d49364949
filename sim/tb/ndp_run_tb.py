"""Embedding LOOKUP + UPDATE on the RTL, batch by batch, checked bit-exactly against the golden model.

``EmbeddingRun(env, manifest, layout, out=...)`` owns one model's tables on the device:
``await setup()`` draws the initial tables (seeded), loads them through the backdoor, writes
the table descriptors over CXL.mem and programs the rings; ``await run_batch(k, batch)``
loads the batch's arguments, runs LOOKUP, compares every pooled vector with
``embedding.tbe_forward``, loads seeded pooled-output gradients, runs UPDATE, applies
``embedding.tbe_sgd_step`` to the golden tables and compares every row the batch touched
(``verify_tables="all"`` compares whole tables after every batch); it returns the batch's
figures. ``verify_all_tables()`` compares every row of every table. Comparisons are bit for
bit (NaN equals any NaN, architecture.md §5); a mismatch raises ``AssertionError`` naming
the batch, table, sample/row and lane. Outputs go to device memory (``out="device"``) or are
pushed to host memory over CXL.cache (``out="host"``, with a ``HostMemorySide``).

Figures (per batch and summed by ``summary()``): the completion's cycles (descriptor fetch to
the completion write) and engine stats of each command, NDP_LAST_CYCLES (``durable_cycles``:
until the completion is durable, i.e. plus one media write latency), and the media lines each
channel completed during it (``MediaCounters``).
``bound_cycles`` of a command = max over channels of (reads_c * RD_COST_Q8 + writes_c *
WR_COST_Q8) / 256 (the busiest channel's media occupancy), and for a LOOKUP that pushes its
outputs at least ``lines_pushed`` (the D2H data channel moves one line per cycle). A phase's
bound is the sum over its commands; efficiency = bound / cycles. Without VPI access to the
media counters the bound falls back to the engine's own line counts spread evenly over the
channels (a lower bound of the same quantity; ``bound_source`` says which was used). That
is *media utilisation*; ``physical_bound_cycles`` and ``*_physical_efficiency`` measure the
same cycles against the least traffic the command needs (sim/tb/min_traffic.py).

The cocotb test ``embedding_run`` (driven by ``trainingcxl run``, tools/run_cmd.py) reads:
TCXL_TRACE (trace file), TCXL_RUN_OUT (device | host), TCXL_RESULT_JSON, TCXL_SEED (the
seed of the tables and gradients; the trace has its own), TCXL_RING_SLOTS (optional),
TCXL_MEDIA_TIMELINE (optional, a window in cycles: each batch's figures then carry
``media_timeline_lookup`` / ``_update``, sim/bfm/media_timeline.py).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import time

import cocotb
import numpy as np

from hw.ndp.command import NdpOpcode
from sim.bfm.media_timeline import MediaTimeline
from sim.bfm.ndp_host import (HostMemorySide, MediaCounters, NdpHost, lookup_command, plan_layout,
                              tables_from_manifest, update_command)
from sim.env import DeviceEnv
from sim.model import embedding
from sim.model.fp32_ref import same_fp32
from sim.model.pmem_params import media_verilog_parameters
from sim.tb.min_traffic import MinimumTraffic

HOST_MEMORY_MIN_LINE = 1 << 24


def host_output_base(env) -> int:
    """A host line address above the HDM window (the home agent's memory)."""
    end = env.monitor.window[0] + env.config.capacity_lines
    return max(HOST_MEMORY_MIN_LINE, 1 << (end - 1).bit_length())


def initial_tables(manifest: dict, seed: int) -> list[np.ndarray]:
    """Seeded initial tables, uniform in [-1, 1) (one rng per table)."""
    return [np.random.default_rng([seed, 3, t]).uniform(-1.0, 1.0, (tab["rows"], tab["dim"])).astype(np.float32)
            for t, tab in enumerate(manifest["tables"])]


def batch_gradients(manifest: dict, seed: int, k: int) -> list[np.ndarray]:
    """Seeded pooled-output gradients of batch k, one (B, dim) fp32 array per table."""
    rng = np.random.default_rng([seed, 2, k])
    B = manifest["batch_size"]
    return [rng.standard_normal((B, tab["dim"])).astype(np.float32) for tab in manifest["tables"]]


def media_costs(clock_mhz: float) -> tuple[int, int]:
    p = media_verilog_parameters(clock_mhz, depth_lines=1, id_width=1, addr_width=7)
    return p["RD_COST_Q8"], p["WR_COST_Q8"]


def media_bound_cycles(per_channel: list[tuple[int, int]], rd_cost_q8: int, wr_cost_q8: int) -> float:
    """The busiest channel's media occupancy in cycles: max_c (reads_c*RD + writes_c*WR) / 256."""
    return max((r * rd_cost_q8 + w * wr_cost_q8) / 256 for r, w in per_channel) if per_channel else 0.0


def even_spread(lines_read: int, lines_written: int, channels: int) -> list[tuple[int, int]]:
    """Engine line counts spread as evenly as possible over the channels (the fallback)."""
    return [(math.ceil(lines_read / channels), math.ceil(lines_written / channels))] + \
        [(lines_read // channels, lines_written // channels)] * (channels - 1)


EFFICIENCY_BOUNDS = {
    "lookup_efficiency, update_efficiency": "media utilisation: the busiest channel's media lines the command "
                                            "moved (its counters), in cycles, over the command's cycles; with the "
                                            "LOOKUP row cache on, only the lines that reached the media (cache hits "
                                            "are not in it)",
    "lookup_physical_efficiency, update_physical_efficiency":
        "physical: the least traffic the command needs (sim/tb/min_traffic.py) on the busiest channel, over the "
        "command's cycles; LOOKUP: arguments once and every occurrence's row (the floor of a device without a "
        "row cache: above 1 when the row cache serves enough hits); UPDATE: arguments once, the non-empty bags' "
        "gradients, each distinct row read and written once",
    "lookup_cache_hit_rate": "row lines the LOOKUP row cache served (lookup_stats.cache_hits) over all "
                             "occurrences' row lines (lookup_row_lines); null without the cache",
    "lookup_feeder_efficiency": "the lookup feeder's floor: one work item per cycle (an index occurrence or an "
                                "empty bag, hw/ndp/lookup_feeder.py), over the command's cycles",
}


def _first_mismatches(expected: np.ndarray, got: np.ndarray, label) -> list[str]:
    eb, gb = expected.view(np.uint32), got.view(np.uint32)
    bad = np.argwhere(~same_fp32(eb, gb))
    return [f"{label(int(i), int(j))} lane {int(j)}: expected {int(eb[i, j]):#010x} ({expected[i, j]!r}), "
            f"got {int(gb[i, j]):#010x} ({got[i, j]!r})" for i, j in bad[:8]] + \
        ([f"... {len(bad)} mismatching lanes in all"] if len(bad) > 8 else [])


class EmbeddingRun:
    def __init__(self, env, manifest: dict, layout, *, out: str = "device", verify_tables: str = "touched",
                 host_memory: HostMemorySide | None = None, timeout_scale: float = 1.0,
                 timeline_window: int | None = None):
        if out not in ("device", "host"):
            raise ValueError(f"out must be 'device' or 'host', got {out!r}")
        if out == "host" and host_memory is None:
            raise ValueError("out='host' needs a HostMemorySide")
        self.env = env
        self.manifest = manifest
        self.layout = layout
        self.out = out
        self.verify_tables = verify_tables
        self.host_memory = host_memory
        self.timeout_scale = timeout_scale
        self.driver = NdpHost(env, layout, host_memory=host_memory)
        self.modes = [t["mode"] for t in manifest["tables"]]
        self.lr = float(manifest["optimizer"]["lr"])
        self.has_weights = bool(manifest["has_weights"])
        self.golden: list[np.ndarray] = []
        self.costs = media_costs(env.config.clock_mhz)
        self.host_out_line = host_output_base(env) if out == "host" else None
        self.minimum = MinimumTraffic(layout, env.config.channels, self.has_weights, out)
        self.row_cache = env.config.lookup_cache_lines > 0
        self.batches: list[dict] = []
        self._tag = 0
        self.timeline = MediaTimeline(env, timeline_window, *self.costs) if timeline_window else None
        self.last_timeline: list[dict] | None = None

    async def setup(self, tables: list[np.ndarray] | None = None) -> None:
        self.golden = [t.copy() for t in (tables if tables is not None else
                                          initial_tables(self.manifest, self.env.seed))]
        self.driver.load_tables(self.golden)
        await self.driver.write_table_descriptors()
        await self.driver.start()

    # ---- commands
    def next_tag(self) -> int:
        self._tag = (self._tag + 1) & 0xFFFF
        return self._tag

    def lookup_cmd(self, index_count: int):
        return lookup_command(self.layout, index_count=index_count, has_weights=self.has_weights,
                              out_to_host=self.out == "host", out_line=self.host_out_line, tag=self.next_tag())

    def update_cmd(self, index_count: int):
        return update_command(self.layout, index_count=index_count, lr=self.lr, has_weights=self.has_weights,
                              tag=self.next_tag())

    def timeout_for(self, n_indices: int) -> int:
        row_lines = n_indices * max(t.lines_per_row for t in self.layout.tables)
        return int(self.timeout_scale * (200_000 + 60 * row_lines + 8 * self.layout.grads.lines))

    async def measured(self, cmd, timeout: int):
        """Execute ``cmd``; return (completion, per-channel media (reads, writes) or None).
        With a ``timeline_window``, ``self.last_timeline`` holds the command's MediaTimeline rows."""
        before = self.driver.media.sample()
        if self.timeline is not None:
            self.timeline.start()
        completion = await self.driver.execute(cmd, timeout_cycles=timeout)
        if self.timeline is not None:
            self.last_timeline = await self.timeline.stop()
        return completion, MediaCounters.delta(before, self.driver.media.sample())

    def bound(self, completion, media) -> tuple[float, str]:
        if media is None:
            s = completion.stats
            media, source = even_spread(s["lines_read"], s["lines_written"], self.env.config.channels), \
                "engine-stats-even-spread"
        else:
            source = "media-counters"
        bound = media_bound_cycles(media, *self.costs)
        if completion.opcode == NdpOpcode.LOOKUP.value:
            bound = max(bound, completion.stats["lines_pushed"])
        return bound, source

    # ---- one batch
    async def run_batch(self, k: int, batch, *, grads: list[np.ndarray] | None = None,
                        garbage: np.random.Generator | None = None) -> dict:
        """LOOKUP then UPDATE of ``batch``, both checked bit for bit. ``grads``: the pooled-output
        gradients (default: seeded, ``batch_gradients``); ``garbage``: random stale words in
        every argument-array element outside the batch (``NdpHost.load_batch``) and in the
        gradients' padding lines (``NdpHost.load_gradients``)."""
        B = self.manifest["batch_size"]
        n = int(batch.indices.size)
        self.driver.load_batch(batch.offsets, batch.indices, batch.weights if self.has_weights else None,
                               garbage=garbage)
        timeout = self.timeout_for(n)

        lookup, media_l = await self.measured(self.lookup_cmd(n), timeout)
        timeline_l = self.last_timeline if self.timeline is not None else None
        got = self.driver.read_outputs(self.host_out_line, from_host=self.out == "host")
        want = embedding.tbe_forward(self.golden, batch.offsets, batch.indices, self.modes, B, batch.weights)
        problems = []
        for t, (w, g) in enumerate(zip(want, got)):
            problems += _first_mismatches(w, g, lambda b, j, t=t: f"batch {k} LOOKUP table {t} sample {b}")
        assert not problems, f"seed {self.env.seed}: pooled outputs differ:\n" + "\n".join(problems)

        if grads is None:
            grads = batch_gradients(self.manifest, self.env.seed, k)
        self.driver.load_gradients(grads, garbage=garbage)
        update, media_u = await self.measured(self.update_cmd(n), timeout)
        embedding.tbe_sgd_step(self.golden, batch.offsets, batch.indices, self.modes, B, grads, self.lr,
                               batch.weights)
        unique = self.check_tables(k, batch)
        self.check_stats(k, n, unique, lookup.stats, update.stats)

        bound_l, source = self.bound(lookup, media_l)
        bound_u, _ = self.bound(update, media_u)
        phys_l = max(media_bound_cycles(self.minimum.lookup(batch.offsets, batch.indices), *self.costs),
                     lookup.stats["lines_pushed"])
        phys_u = media_bound_cycles(self.minimum.update(batch.offsets, batch.indices), *self.costs)
        row_lines = self.minimum.row_lines(batch.offsets)
        items = n + int(np.count_nonzero(np.diff(batch.offsets.astype(np.int64)) == 0))
        hits = lookup.stats["cache_hits"]
        figures = {
            "batch": k, "lookups": n, "unique_rows": unique,
            "lookup_row_lines": row_lines, "lookup_cache_hits": hits,
            "lookup_cache_hit_rate": round(hits / row_lines, 4) if row_lines and self.row_cache else None,
            "feeder_bound_cycles_lookup": items,
            "lookup_feeder_efficiency": round(items / lookup.cycles, 4) if lookup.cycles else None,
            "cycles_lookup": lookup.cycles, "cycles_update": update.cycles,
            "durable_cycles_lookup": lookup.total_cycles, "durable_cycles_update": update.total_cycles,
            "bound_cycles_lookup": round(bound_l, 1), "bound_cycles_update": round(bound_u, 1),
            "lookup_efficiency": round(bound_l / lookup.cycles, 4) if lookup.cycles else None,
            "update_efficiency": round(bound_u / update.cycles, 4) if update.cycles else None,
            "physical_bound_cycles_lookup": round(phys_l, 1), "physical_bound_cycles_update": round(phys_u, 1),
            "lookup_physical_efficiency": round(phys_l / lookup.cycles, 4) if lookup.cycles else None,
            "update_physical_efficiency": round(phys_u / update.cycles, 4) if update.cycles else None,
            "lookup_stats": lookup.stats, "update_stats": update.stats,
            "media_lookup": media_l, "media_update": media_u, "bound_source": source,
        }
        if self.timeline is not None:
            figures.update({"media_timeline_lookup": timeline_l, "media_timeline_update": self.last_timeline})
        self.batches.append(figures)
        return figures

    def check_stats(self, k: int, n: int, unique: int, lookup: dict, update: dict) -> None:
        """The engines' counters against what the batch implies (hw/ndp/command.py EngineStats)."""
        problems = []
        if lookup["lookups"] != n or update["lookups"] != n:
            problems.append(f"lookups counted {lookup['lookups']} (LOOKUP) / {update['lookups']} (UPDATE), "
                            f"the batch has {n}")
        # (rows_written may exceed rows_read: the update engine's cleaner writes a row back early
        # and again if it is hit after that)
        if update["unique_rows"] != 0 or not unique <= update["rows_read"] <= update["rows_written"]:
            problems.append(f"UPDATE unique_rows {update['unique_rows']} (UPDATE counts none), rows_read "
                            f"{update['rows_read']}, rows_written {update['rows_written']}: the batch has {unique} "
                            "distinct rows, each read at least once and written back at least as often")
        pushed = self.layout.batch_size * self.layout.vector_lines if self.out == "host" else 0
        if lookup["lines_pushed"] != pushed:
            problems.append(f"LOOKUP pushed {lookup['lines_pushed']} lines, expected {pushed}")
        assert not problems, f"seed {self.env.seed}: batch {k} stats: " + "; ".join(problems)

    def check_tables(self, k: int, batch) -> int:
        """Compare the tables with the golden ones (touched rows, or all); return the number of
        distinct (table, row) pairs the batch touched."""
        B = self.manifest["batch_size"]
        offs = batch.offsets.astype(np.int64)
        problems, unique = [], 0
        for t in range(len(self.golden)):
            rows = np.unique(batch.indices[offs[t * B]:offs[(t + 1) * B]])
            unique += rows.size
            if self.verify_tables == "all":
                got, want, names = self.driver.read_table(t), self.golden[t], None
            else:
                got, want, names = self.driver.read_rows(t, rows), self.golden[t][rows], rows
            problems += _first_mismatches(
                want, got, lambda i, j, t=t, names=names: f"batch {k} UPDATE table {t} row "
                                                          f"{i if names is None else int(names[i])}")
        assert not problems, f"seed {self.env.seed}: updated tables differ:\n" + "\n".join(problems)
        return unique

    def verify_all_tables(self, what: str = "final") -> None:
        problems = []
        for t, want in enumerate(self.golden):
            problems += _first_mismatches(want, self.driver.read_table(t),
                                          lambda i, j, t=t: f"{what}: table {t} row {i}")
        assert not problems, f"seed {self.env.seed}: tables differ:\n" + "\n".join(problems)

    # ---- totals
    def summary(self) -> dict:
        bs = self.batches

        def total(key):
            return sum(b[key] for b in bs)

        def stat(phase, key):
            return sum(b[f"{phase}_stats"][key] for b in bs)
        cycles_l, cycles_u = total("cycles_lookup"), total("cycles_update")
        durable = {f"durable_cycles_{p}": sum(b[f"durable_cycles_{p}"] or 0 for b in bs) for p in ("lookup", "update")}
        bound_l, bound_u = total("bound_cycles_lookup"), total("bound_cycles_update")
        phys_l, phys_u = total("physical_bound_cycles_lookup"), total("physical_bound_cycles_update")
        keys = bs[0]["lookup_stats"].keys() if bs else ()
        row_lines, hits = total("lookup_row_lines"), total("lookup_cache_hits")
        items = total("feeder_bound_cycles_lookup")
        return {
            "lookups": total("lookups"),
            "lines_read": stat("lookup", "lines_read"),
            "lookup_row_lines": row_lines, "lookup_cache_hits": hits,
            "lookup_cache_hit_rate": round(hits / row_lines, 4) if row_lines and self.row_cache else None,
            "feeder_bound_cycles_lookup": items,
            "lookup_feeder_efficiency": round(items / cycles_l, 4) if cycles_l else None,
            "cycles_lookup": cycles_l, "cycles_update": cycles_u,
            "bound_cycles_lookup": round(bound_l, 1), "bound_cycles_update": round(bound_u, 1),
            "lookup_efficiency": round(bound_l / cycles_l, 4) if cycles_l else None,
            "update_efficiency": round(bound_u / cycles_u, 4) if cycles_u else None,
            "physical_bound_cycles_lookup": round(phys_l, 1), "physical_bound_cycles_update": round(phys_u, 1),
            "lookup_physical_efficiency": round(phys_l / cycles_l, 4) if cycles_l else None,
            "update_physical_efficiency": round(phys_u / cycles_u, 4) if cycles_u else None,
            "efficiency_bounds": EFFICIENCY_BOUNDS,
            "lookup_stats": {key: stat("lookup", key) for key in keys},
            "update_stats": {key: stat("update", key) for key in keys},
            "bound_source": bs[0]["bound_source"] if bs else None,
            **durable,
        }


def plan_for_trace(env, trace, out: str, ring_slots: int = 16):
    """The device layout for a whole trace (the largest batch's indices)."""
    m = trace.manifest
    max_indices = max(int(b.indices.size) for b in trace.batches)
    return plan_layout(tables_from_manifest(m), batch_size=m["batch_size"], max_indices=max_indices,
                       capacity_lines=env.config.capacity_lines, has_weights=m["has_weights"],
                       ring_slots=ring_slots, outputs_in_device=out == "device")


def write_result(result: dict) -> None:
    path = os.environ.get("TCXL_RESULT_JSON")
    if path:
        with open(path, "w") as fh:
            json.dump(result, fh, indent=2, sort_keys=True)


@contextlib.contextmanager
def recorded(result: dict):
    """Around a test's body: an exception is stored in ``result["error"]`` (and re-raised),
    and ``wall_seconds`` is set and the result written however the body ends."""
    t0 = time.perf_counter()
    try:
        yield
    except BaseException as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"[:4000]
        raise
    finally:
        result["wall_seconds"] = round(time.perf_counter() - t0, 1)
        write_result(result)


@cocotb.test()
async def embedding_run(dut):
    """``trainingcxl run``: every batch of TCXL_TRACE, LOOKUP then UPDATE, verified."""
    from sim.model.trace import read_trace
    trace = read_trace(os.environ["TCXL_TRACE"])
    out = os.environ.get("TCXL_RUN_OUT", "device")
    env = await DeviceEnv.create(dut)
    layout = plan_for_trace(env, trace, out, int(os.environ.get("TCXL_RING_SLOTS", "16")))
    host = HostMemorySide(env, host_output_base(env), 1 << 20) if out == "host" else None
    window = int(os.environ.get("TCXL_MEDIA_TIMELINE", "0")) or None
    run = EmbeddingRun(env, trace.manifest, layout, out=out, host_memory=host, timeline_window=window)
    result = {"seed": env.seed, "verified": False, "batches": []}
    n = len(trace.batches)
    try:
        await run.setup()
        start_cycle, t0 = env.host.cycle, time.perf_counter()
        for k, batch in enumerate(trace.batches):
            f = await run.run_batch(k, batch)
            dut._log.info(f"batch {k + 1}/{n}: {f['lookups']} lookups, LOOKUP {f['cycles_lookup']} cycles "
                          f"(efficiency {f['lookup_efficiency']}), UPDATE {f['cycles_update']} cycles "
                          f"(efficiency {f['update_efficiency']}), {f['unique_rows']} unique rows")
        wall = time.perf_counter() - t0
        run.verify_all_tables()
        summary = await env.finish()
        env.assert_clean()
        if host is not None:
            host.finish()
        sim_cycles = env.host.cycle - start_cycle
        result.update(run.summary())
        result.update({"verified": True, "batches": run.batches, "sim_cycles": sim_cycles,
                       "sim_wall_seconds": round(wall, 2),
                       "sim_cycles_per_second": round(sim_cycles / wall) if wall else None,
                       "protocol_violations": summary["protocol_violations"],
                       "mismatches": summary["mismatches"], "layout": layout.describe().splitlines()})
    except BaseException as exc:
        result.update(run.summary() if run.batches else {})
        result.update({"batches": run.batches, "error": f"{type(exc).__name__}: {exc}"[:4000]})
        raise
    finally:
        write_result(result)
