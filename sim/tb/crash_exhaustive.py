"""Exhaustive persist-point crash consistency: a power cut at every media write acknowledgement of one batch.

What a persist boundary is. The PMEM media model (sim/rtl/pmem_media.sv) applies a write to
``mem`` at its B handshake edge and counts it in ``stat_writes`` at that same edge; before it
the write is in flight, and the first rising edge with ``power_fail`` high tears every
in-flight write (each 8-byte word old or new). So the B handshake (the "ack") is the one edge
where a write becomes durable. Every ack of target batch k is a boundary: log entries and
records (FREE / LOGGED / APPLIED / MLP_LOGGED), table row write-backs, MLP image lines,
completions, the host's submission-ring lines (its CXL.mem writes reach the media too).

Recording pass. From the state S before batch k (below), batch k is trained once while a
monitor samples every channel's ``stat_writes`` after every rising edge, counted from the
moment the host is about to submit batch k's LOOKUP. At each ack it finds the line that
changed by comparing the channel's device-written lines with a shadow copy (the media expose
the count, not the line; the host's backdoor-loaded argument arrays are excluded from the
scan) and classifies it by the layout (``classify``); an ack that changed no line is class
``unchanged``. Boundary n (its ordinal) is the n-th ack in (edge, channel) order.

Cuts. A cut "at edge X" lets edges 1..X run normally; edge X+1 is the first with power_fail
high, the edge that tears (measured: power_fail raised by the testbench right after edge X-1
is first seen at edge X+1, so the cutter raises it there; the ack counts read after the power
cycle check it for every cut). For boundary n acked at edge E, offsets d in TCXL_CRASH_EXH_OFFSETS
(default -1,0,1) give X = E+d: d=-1 the write is still in flight and is torn at E (before
durable), d=0 it has just become durable and nothing later has (at), d=+1 the device has had
one more edge to act on it (after: e.g. the next write accepted). Boundaries acked at the same
edge on different channels, and d=+1 of one next to d=-1 of the next, give the same X: each
distinct X is cut once (``cuts``). Before each cut the run is brought back to S: an idle power
cycle, the PMEM image of S restored through the backdoor, RECOVER (must report k batches),
the host's state reset (next batch, acknowledged writes, MLP slot, command tag); so every run
of batch k is cycle-for-cycle the recording's. The cut is placed by edge count, and the
boundary is checked by ordinal: every channel's ack count since the batch start must equal
the recording's at edge X-1 when the cut is raised and at edge X after the power cycle (the
counters survive it), so exactly the boundaries acked up to X are durable
(``unverified_cuts`` counts the cuts where this fails).
At the end the batch is recorded again; ``rerecord_matches`` says whether the second boundary
list equals the first (edge, channel, line, class).

Checks after each cut (``recover_and_check`` of sim/tb/crash_tb.py, exactly the campaign's):
RECOVER equals ``golden_recover`` on the PMEM image after the cut, the log is not corrupt,
every table equals the golden tables at the recovered batch, the MLP slot equals the GPU's
image, no acknowledged UPDATE / MLP_LOG lost. Plus, from the recording (independent of the
golden recovery): an APPLIED record of batch k durable at the cut (acked at or before X)
means recovery must report k+1 batches; an MLP_LOGGED record of batch k durable means the MLP
log recovered must be batch k's (``lost_durable_records``). A torn record may land whole (all
words new), so a record cut before its ack may count either way. The state S is reached by
training batches 0..k-1, an idle power cycle and RECOVER. Every cut continues from S, so an
inconsistent cut does not stop the run; the first few are kept in ``failures``.

The cocotb test ``crash_exhaustive`` (``trainingcxl crash --exhaustive``, tools/crash_cmd.py)
reads TCXL_CRASH_MODEL (default rm-tiny), TCXL_CRASH_SCHEDULE, TCXL_CRASH_ROWS_CAP /
TCXL_CRASH_BATCH_SIZE (trace knobs), TCXL_SEED, TCXL_CRASH_EXH_TARGET (batch k, default 2:
batch k's LOG frees the slot of batch k-2), TCXL_CRASH_EXH_OFFSETS, TCXL_CRASH_EXH_BOUNDARIES
(``A:B``, a slice of the ordinals, the way to shard a long run), TCXL_CRASH_EXH_STRIDE (every
s-th boundary of the slice), TCXL_CRASH_EXH_CLASSES (comma list: only boundaries of these
classes, before the slice), TCXL_CRASH_EXH_PROGRESS (log every N cuts) and writes to
TCXL_RESULT_JSON: ``boundaries``, ``boundaries_by_class``, ``batch_edges``, ``selected``
(boundaries in the slice), ``cuts``, ``consistent``, ``inconsistent``,
``lost_acknowledged_writes``, ``lost_durable_records``, ``recovered_batches`` (k / k+1 ->
cuts), ``unverified_cuts``, ``rerecord_matches``, ``record_cuts`` (per cut at a record boundary: its
class, offset, the batches and MLP log recovered), ``failures``, ``verified``,
``protocol_violations``, ``sim_cycles``, ``wall_seconds``, ``model``, ``seed``, ``schedule``,
``target_batch``, ``offsets``, ``slice``, ``stride``, ``classes``, ``error``.
"""
from __future__ import annotations

import collections
import os
import random
import time
from dataclasses import dataclass

import cocotb
from cocotb.triggers import ClockCycles, Event, RisingEdge

from hw.checkpoint.log_format import SLOT_HEADER_LINES, LogState
from hw.mem.port import split_line_address
from sim.env import DeviceEnv
from sim.model.checkpoint import record_crc_ok, unpack_record
from sim.model.dlrm import get_preset
from sim.model.trace import generate_trace
from sim.tb.ckpt_run import CheckpointedRun
from sim.tb.crash_tb import TRACE_BATCHES, recover_and_check, trace_knobs_from_env
from sim.tb.ndp_run_tb import write_result

DEFAULT_OFFSETS = (-1, 0, 1)
MAX_FAILURES = 5


@dataclass(frozen=True)
class Boundary:
    edge: int          # rising edges after the host is about to submit batch k's LOOKUP
    channel: int
    line: int | None   # device line whose content changed (None: no line changed)
    cls: str


def classify(layout, line: int | None, value: int) -> str:
    """The class of a write of ``value`` to device ``line``, by the layout's regions."""
    if line is None:
        return "unchanged"

    def inside(r):
        return r is not None and r.base <= line < r.end
    if inside(layout.cq):
        return "completion"
    if inside(layout.sq):
        return "submission"
    if inside(layout.outputs):
        return "lookup_output"
    if any(inside(r) for r in layout.table_regions):
        return "row_writeback"
    if inside(layout.emb_log):
        if (line - layout.emb_log.base) % layout.slot_lines >= SLOT_HEADER_LINES:
            return "log_entry"
        return _record_class(value)
    if inside(layout.mlp_log):
        if (line - layout.mlp_log.base) % (1 + layout.mlp_lines):
            return "mlp_image"
        return _record_class(value)
    return "other"


def _record_class(value: int) -> str:
    if not record_crc_ok(value):
        return "record_invalid"
    return f"record_{LogState(unpack_record(value)['state']).name}"


class ExhaustiveCrash:
    def __init__(self, run: CheckpointedRun, target: int, rng: random.Random, progress: int = 25):
        if target < 1:
            raise ValueError("the target batch must be at least 1 (state S is reached by training and a RECOVER)")
        self.run, self.env, self.k, self.rng, self.progress = run, run.env, target, rng, progress
        lay = run.layout
        self.used_end = lay.free.base
        host_loaded = [r for r in (lay.offsets, lay.indices, lay.weights, lay.grads) if r is not None]
        chans = self.env.config.channels
        self.scan: list[list[tuple[int, int]]] = [[] for _ in range(chans)]   # per channel: (line, local)
        for line in range(self.used_end):
            if not any(r.base <= line < r.end for r in host_loaded):
                ch, local = split_line_address(line, chans)
                self.scan[ch].append((line, local))
        self.image = None                  # (lines, 64) uint8: the PMEM image of S
        self.state = None
        self.result = {"cuts": 0, "consistent": 0, "inconsistent": 0, "lost_acknowledged_writes": 0,
                       "lost_durable_records": 0, "unverified_cuts": 0, "recovered_batches": {},
                       "record_cuts": [], "failures": []}

    # ---- the state S before batch k
    async def prepare(self) -> None:
        run = self.run
        await run.setup()
        await run.train(self.k)
        await run.power_cycle(0)
        problems, lost, res = await recover_and_check(run)
        if problems or lost or res.emb_batches != self.k:
            raise AssertionError(f"state S: recovery after batch {self.k} (idle cut): {res}, {problems}")
        run.resume(res)
        self.image = run.driver.backdoor.read_array(0, self.used_end)
        self.state = (run.acked_mlp, run.mlp_next_slot, run._tag)

    async def reset(self) -> None:
        """Back to S: idle power cycle, S's PMEM image, RECOVER, the host's state of S."""
        run = self.run
        await run.power_cycle(0)           # nothing in flight (the device is idle): nothing torn
        run.driver.backdoor.write_array(0, self.image)
        acked_mlp, slot, tag = self.state
        run._tag = tag
        _, res = await run.recover()
        if res.emb_batches != self.k or (res.mlp_batch if res.mlp_valid else None) != acked_mlp:
            raise AssertionError(f"RECOVER of state S reports {res}; expected {self.k} batches, MLP {acked_mlp}")
        run.resume(res)
        if run.mlp_next_slot != slot:
            raise AssertionError(f"state S: next MLP slot {run.mlp_next_slot}, expected {slot}")

    # ---- the recording pass
    def _stat_handles(self):
        return [m.handle.stat_writes._handle for m in self.env.media]

    async def record(self) -> list[Boundary]:
        await self.reset()
        media, handles = self.env.media, self._stat_handles()
        boundaries: list[Boundary] = []
        stop = [False]
        self.batch_edges = 0

        def counts():
            return [int(h.get_signal_val_binstr(), 2) for h in handles]

        async def monitor():
            shadow = [{line: media[ch].peek(local) for line, local in lines} for ch, lines in enumerate(self.scan)]
            prev, edge = counts(), 0
            while not stop[0]:
                await RisingEdge(self.env.clk)
                edge += 1
                now = counts()
                for ch, (a, b) in enumerate(zip(prev, now)):
                    if a == b:
                        continue
                    if (b - a) & 0xFFFF_FFFF != 1:       # one B handshake per channel per edge
                        raise AssertionError(f"channel {ch}: {b - a} acks at edge {edge}")
                    changed = []
                    for line, local in self.scan[ch]:
                        v = media[ch].peek(local)
                        if v != shadow[ch][line]:
                            shadow[ch][line] = v
                            changed.append((line, v))
                    if len(changed) > 1:
                        raise AssertionError(f"channel {ch} edge {edge}: {len(changed)} lines changed at one ack")
                    line, value = changed[0] if changed else (None, 0)
                    boundaries.append(Boundary(edge, ch, line, classify(self.run.layout, line, value)))
                prev = now
            self.batch_edges = edge

        async def hook(phase, k):
            if phase == "lookup" and k == self.k:
                cocotb.start_soon(monitor())
        await self.run.run_batch(self.k, hook)
        stop[0] = True
        await RisingEdge(self.env.clk)
        self.run.verify_all_tables(f"after recording batch {self.k}")
        return boundaries

    # ---- one cut
    async def cut_at(self, edge: int, boundaries: list[Boundary], covers: list[tuple[int, int]]) -> None:
        """Reset to S, train batch k, cut after ``edge`` edges, recover and check."""
        await self.reset()
        run, handles = self.run, self._stat_handles()
        done, state = Event(), {}

        async def cutter():
            base = [int(h.get_signal_val_binstr(), 2) for h in handles]
            # Measured (the ack counts after the power cycle): power_fail raised from here is
            # first seen one edge after the next, so firing after edge X-1 lets edge X run.
            if edge > 1:
                await ClockCycles(self.env.clk, edge - 1)
            now = [int(h.get_signal_val_binstr(), 2) for h in handles]
            state["base"] = base
            state["acks"] = [(b - a) & 0xFFFF_FFFF for a, b in zip(base, now)]
            state["cut"] = True
            done.set()

        async def hook(phase, k):
            if phase == "lookup" and k == self.k:
                cocotb.start_soon(cutter())

        async def worker():
            try:
                await run.run_batch(self.k, hook)
            except Exception as exc:      # noqa: BLE001  (reported below)
                state["error"] = exc
            finally:
                done.set()
        task = cocotb.start_soon(worker())
        await done.wait()
        if "cut" not in state:
            raise RuntimeError(f"batch {self.k} ended before edge {edge}: {state.get('error')}")
        task.cancel()
        await run.power_cycle(self.rng.randrange(1 << 32))
        # The counters survive the power cycle: any ack after the cut moment (before the
        # tearing edge) would show here. After power-up nothing writes the media until RECOVER.
        after = [(int(h.get_signal_val_binstr(), 2) - a) & 0xFFFF_FFFF for h, a in zip(handles, state["base"])]
        want, before = [0] * len(handles), [0] * len(handles)
        for b in boundaries:
            want[b.channel] += b.edge <= edge
            before[b.channel] += b.edge <= edge - 1
        verified = state["acks"] == before and after == want
        self.result["unverified_cuts"] += int(not verified)
        problems, lost, res = await recover_and_check(run)
        if not verified:
            problems.append(f"acks per channel: {state['acks']} when the cut was raised, {after} after the power "
                            f"cycle; the recording has {before} at edge {edge - 1}, {want} at edge {edge}")
        emb = res.emb_batches if res.emb_valid else 0
        durable = [b for b in boundaries if b.edge <= edge]
        if any(b.cls == "record_APPLIED" for b in durable) and emb != self.k + 1:
            problems.append(f"batch {self.k}'s APPLIED record was durable; recovery reports {emb} batches")
            self.result["lost_durable_records"] += 1
        if any(b.cls == "record_MLP_LOGGED" for b in durable) and not (res.mlp_valid and res.mlp_batch == self.k):
            problems.append(f"batch {self.k}'s MLP_LOGGED record was durable; recovery reports "
                            f"{'batch ' + str(res.mlp_batch) if res.mlp_valid else 'no MLP log'}")
            self.result["lost_durable_records"] += 1
        r = self.result
        r["cuts"] += 1
        r["lost_acknowledged_writes"] += lost
        r["recovered_batches"][str(emb)] = r["recovered_batches"].get(str(emb), 0) + 1
        for n, d in covers:          # the flags recovery decides on: where each cut recovered to
            if boundaries[n].cls.startswith("record_"):
                r["record_cuts"].append({"ordinal": n, "class": boundaries[n].cls, "offset": d, "edge": edge,
                                         "emb_batches": emb, "mlp_batch": res.mlp_batch if res.mlp_valid else None,
                                         "consistent": not problems})
        if problems:
            r["inconsistent"] += 1
            if len(r["failures"]) < MAX_FAILURES:
                r["failures"].append({"edge": edge, "boundaries": [
                    {"ordinal": n, "offset": d, "class": boundaries[n].cls, "channel": boundaries[n].channel,
                     "line": boundaries[n].line} for n, d in covers[:6]], "problems": problems[:10]})
        else:
            r["consistent"] += 1

    async def run_all(self, offsets, selection: slice, classes: tuple[str, ...] = ()) -> dict:
        await self.prepare()
        boundaries = await self.record()
        r = self.result
        r["boundaries"] = len(boundaries)
        r["boundaries_by_class"] = dict(sorted(collections.Counter(b.cls for b in boundaries).items()))
        r["batch_edges"] = self.batch_edges
        pool = [n for n, b in enumerate(boundaries) if not classes or b.cls in classes]
        chosen = pool[selection]
        r["selected"] = len(chosen)
        plan: dict[int, list[tuple[int, int]]] = {}
        for n in chosen:
            for d in offsets:
                if boundaries[n].edge + d >= 1:
                    plan.setdefault(boundaries[n].edge + d, []).append((n, d))
        log = self.env.dut._log
        log.info(f"batch {self.k}: {len(boundaries)} persist boundaries {r['boundaries_by_class']} in "
                 f"{self.batch_edges} edges; {len(chosen)} selected, {len(plan)} distinct cuts")
        t0 = time.perf_counter()
        for i, edge in enumerate(sorted(plan)):
            await self.cut_at(edge, boundaries, plan[edge])
            if (i + 1) % self.progress == 0 or i + 1 == len(plan):
                rate = (time.perf_counter() - t0) / (i + 1)
                log.info(f"cut {i + 1}/{len(plan)} (edge {edge}): {r['consistent']} consistent, "
                         f"{r['inconsistent']} inconsistent, {r['unverified_cuts']} unverified; "
                         f"{rate:.2f} s per cut, {rate * (len(plan) - i - 1) / 60:.1f} min left")
        again = await self.record()
        r["rerecord_matches"] = again == boundaries
        if not r["rerecord_matches"]:
            r["failures"].append({"rerecord": f"{len(again)} boundaries the second time, "
                                  f"{sum(a != b for a, b in zip(again, boundaries))} differ"})
        return r


def parse_slice(text: str | None, stride: int) -> slice:
    a, b = (text or ":").split(":")
    return slice(int(a) if a else None, int(b) if b else None, stride)


@cocotb.test()
async def crash_exhaustive(dut):
    """``trainingcxl crash --exhaustive``: a power cut at every persist boundary of one batch."""
    env = await DeviceEnv.create(dut)
    model = os.environ.get("TCXL_CRASH_MODEL", "rm-tiny")
    schedule = os.environ.get("TCXL_CRASH_SCHEDULE", "cxl-b")
    target = int(os.environ.get("TCXL_CRASH_EXH_TARGET", "2"))
    offsets = tuple(int(x) for x in os.environ.get("TCXL_CRASH_EXH_OFFSETS", "-1,0,1").split(",") if x)
    stride = int(os.environ.get("TCXL_CRASH_EXH_STRIDE", "1"))
    text = os.environ.get("TCXL_CRASH_EXH_BOUNDARIES") or ":"
    classes = tuple(c for c in os.environ.get("TCXL_CRASH_EXH_CLASSES", "").split(",") if c)
    preset = get_preset(model)
    trace = generate_trace(preset, TRACE_BATCHES, env.seed, trace_knobs_from_env())
    run = CheckpointedRun(env, trace, total_batches=target + 3, schedule=schedule, preset=preset)
    progress = int(os.environ.get("TCXL_CRASH_EXH_PROGRESS", "25"))
    exh = ExhaustiveCrash(run, target, random.Random(env.seed ^ 0xE4A5), progress)
    result = {"model": model, "seed": env.seed, "schedule": schedule, "target_batch": target,
              "offsets": list(offsets), "slice": text, "stride": stride, "classes": list(classes),
              "verified": False, **exh.result}
    t0, start = time.perf_counter(), env.host.cycle
    try:
        await exh.run_all(offsets, parse_slice(text, stride), classes)
        await exh.reset()
        await run.train(target + 2)
        run.verify_all_tables("after the cuts")
        summary = await run.finish_checked()
        result.update(exh.result)
        result["protocol_violations"] = summary["protocol_violations"]
        result["verified"] = (not result["inconsistent"] and not result["unverified_cuts"]
                              and result["rerecord_matches"] and result["boundaries"] > 0)
    except BaseException as exc:
        result.update(exh.result)
        result["error"] = f"{type(exc).__name__}: {exc}"[:4000]
        raise
    finally:
        result.update({"sim_cycles": env.host.cycle - start, "wall_seconds": round(time.perf_counter() - t0, 1)})
        write_result(result)
    assert result["verified"], f"seed {env.seed}: {result['inconsistent']} inconsistent cuts: {result['failures'][:2]}"
