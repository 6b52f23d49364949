"""The power-failure campaign: train through the device, cut power, recover, check, resume.

``CrashCampaign(run, points, rng, phases=PHASES)`` drives a ``CheckpointedRun``
(sim/tb/ckpt_run.py). Point i aims at phase ``order[i]``; the order cycles through
``phases`` (each round shuffled by ``rng``), so every phase is aimed at once per round:

- ``lookup``, ``logging``, ``update``: the cut comes a random number of cycles after the
  command's submission (ring write and doorbell, as long as the last one took) ended in the
  target batch: uniform below the shortest of the phase's last 4 engine durations (for the
  first LOG after a power-up, after its dedup-set clear). One batch is trained without a
  cut before the first point, so every duration is measured; ``mlp_log``: the same,
  counted from the MLP_LOG's first media write (the FREE record of its slot), since it
  waits in the ring behind the LOG.
- ``flag_write``: the cut lands 1..WR_LAT+9 cycles after the media accepted the write of
  a persistent flag (LOG's LOGGED record, UPDATE's APPLIED record or MLP_LOG's MLP_LOGGED
  record, picked at random): while that write is in flight (torn) or just durable. A delay
  of 0..WR_LAT+8 is drawn; a cut raised from a coroutine takes effect one edge later
  (measured by sim/tb/crash_exhaustive.py). The media's write watch (``PmemChannel.watch``)
  finds the cycle.
- ``release``: the same around a release: LOG's FREE record over its slot (the batch two
  back) or MLP_LOG's FREE record over the other MLP slot.
- ``recovery``: a first cut as above (a random command phase), then a second one during
  RECOVER, at a random cycle of its run: RECOVER is run once to time it (it writes only table
  rows, never the log, so putting back the rows it rewrote through the backdoor restores the
  media exactly), then again with the cut; after power-up RECOVER runs a third time.
The target batch is the next batch or the one after (with the MLP image spread over K
batches, ``TCXL_CRASH_MLP_SPREAD``: up to K batches on). Cuts tear in-flight writes with a
random ``tear_seed``.

After every power cycle the point runs RECOVER and checks: the result equals
``golden_recover`` on the PMEM image taken just before (the CSR-visible fields and the
error); every table row equals the golden tables after the reported embedding batches; the
MLP log reported equals the GPU's parameters at its batch (spread over K batches: chunk j
the GPU's image while the copy's batch j ran, ``CheckpointedRun.mlp_image_of_copy``;
``mlp_logs_checked`` counts the recoveries that found a complete MLP log); no acknowledged UPDATE or
MLP_LOG was lost (``lost_acknowledged_writes``). A consistent point resumes training from
the recovered batch; the campaign stops at the first inconsistent point (later points
would start from a corrupt state). At the end, two more batches are trained and every table
is compared with the golden model. A cut's phase is classified from PMEM after the cut:
the first pending command without its completion in the completion ring (``idle`` when
none); a watched flag / release cut counts as such only when its command was still running.
A watchdog fails the campaign, naming the point, the batch and the pending commands, when a
point runs far longer than its commands take (a hang in the device or the testbench);
TCXL_CRASH_DEBUG=1 logs every submission and every cut.

The cocotb test ``crash_campaign`` (driven by ``trainingcxl crash``, tools/crash_cmd.py)
reads TCXL_CRASH_MODEL (default rm-tiny), TCXL_CRASH_POINTS, TCXL_CRASH_PHASES (comma list,
default all), TCXL_CRASH_SCHEDULE (cxl-b | cxl-d), TCXL_CRASH_ROWS_CAP / TCXL_CRASH_BATCH_SIZE
(trace knobs) or TCXL_CRASH_TRACE (a trace file bound to the model), TCXL_SEED and
TCXL_RESULT_JSON. The generated trace has 4 batches; batch k of the run is trace batch k % n
(n = the trace's batches) with gradients seeded by k.
"""
from __future__ import annotations

import os
import random
import time

import cocotb
from cocotb.triggers import ClockCycles, Event, RisingEdge, Timer

from hw.checkpoint.log_format import RECORD_LINE_APPLIED, RECORD_LINE_LOGGED
from hw.mem.port import split_line_address
from hw.ndp.command import NdpError
from sim.env import CLOCK_PERIOD_NS, DeviceEnv
from sim.model.checkpoint import golden_recover
from sim.model.dlrm import get_preset
from sim.model.pmem_params import media_verilog_parameters
from sim.model.trace import TraceKnobs, generate_trace, read_trace
from sim.tb.ckpt_run import CheckpointedRun
from sim.tb.ndp_run_tb import write_result

TRACE_BATCHES = 4               # batch k of the run is trace batch k % 4 (its own gradients)
PHASES = ("lookup", "logging", "flag_write", "update", "mlp_log", "release", "recovery")
COMMAND_PHASES = ("lookup", "logging", "update", "mlp_log")
DEFAULT_ESTIMATE = 3000          # cycles, before a command's duration was measured
DEBUG = bool(os.environ.get("TCXL_CRASH_DEBUG"))    # log every command submission
POINT_BUDGET_CYCLES = 2_000_000  # the watchdog's budget per point, plus 50x its commands' durations
WATCH_SLACK = 20_000             # a watched write comes within its command's duration plus this


async def recover_and_check(run: CheckpointedRun):
    """After a power cycle: RECOVER and the campaign's checks. The result must equal
    ``golden_recover`` on the PMEM image as it is now (CSR fields and error), the log must not
    be corrupt, and ``run.check_recovered`` (tables, MLP log, acknowledged writes) must pass.
    Returns (problems, acknowledged writes lost, RecoveryResult)."""
    golden = golden_recover(run.driver.backdoor.read_line, run.region, apply=False)
    completion, res = await run.recover(expect=golden.error or NdpError.OK)
    problems = [f"recovery differs from the golden model: {m}" for m in golden.mismatches(res)]
    if golden.error != NdpError.OK:
        problems.append(f"the log is corrupt: {golden.problem}")
    more, lost = run.check_recovered(res)
    return problems + more, lost, res


class CutPlan:
    """Where point i cuts: ``hook_phase`` of batch ``batch``, then a delay or a watched write."""

    def __init__(self, aim: str, batch: int, hook_phase: str, delay: int = 0,
                 watch_line: int | None = None, nth: int = 1, extra: int = 0):
        self.aim, self.batch, self.hook_phase = aim, batch, hook_phase
        self.delay, self.watch_line, self.nth, self.extra = delay, watch_line, nth, extra
        self.fired_cycle: int | None = None
        self.seq: int | None = None       # the hooked command's sequence number
        self.watch_expired = False

    def __str__(self) -> str:
        line = f"{self.watch_line:#x}" if isinstance(self.watch_line, int) else f"({self.watch_line} MLP slot)"
        how = (f"{self.extra} cycles after write {self.nth} to line {line}"
               if self.watch_line is not None else f"{self.delay} cycles after submitting")
        return f"{self.aim}: batch {self.batch} {self.hook_phase}, {how}"


class CrashCampaign:
    def __init__(self, run: CheckpointedRun, points: int, rng: random.Random, phases=PHASES):
        unknown = set(phases) - set(PHASES)
        if unknown or not phases:
            raise ValueError(f"phases must be among {PHASES}, got {phases}")
        self.run, self.env, self.points, self.rng = run, run.env, points, rng
        # The order has its own generator, so the first N points of a longer campaign with the
        # same seed are the same N points (a failing point replays with --points N).
        order_rng = random.Random(rng.getrandbits(64))
        self.order = []
        while len(self.order) < points:
            block = list(phases)
            order_rng.shuffle(block)
            self.order += block
        self.order = self.order[:points]
        self.wr_lat = media_verilog_parameters(self.env.config.clock_mhz, depth_lines=1, id_width=1,
                                               addr_width=7)["WR_LAT"]
        self.result = {"points": 0, "consistent": 0, "inconsistent": 0, "lost_acknowledged_writes": 0,
                       "phases_hit": {p: 0 for p in PHASES + ("idle",)}, "phases_aimed": {p: 0 for p in PHASES},
                       "cuts": 0, "rolled_back": 0, "mlp_logs_checked": 0, "failures": []}

    # ---- planning
    def estimate(self, phase: str) -> int:
        """The shortest of the phase's last 4 commands, in engine cycles (descriptor fetch to
        the completion write; a LOG's dedup-set clear not counted): a cut drawn below it,
        counted from the end of the submission, lands inside the command."""
        recent = self.run.recent_cycles.get(phase)
        return max(1, min(recent) if recent else DEFAULT_ESTIMATE)

    def plan(self, aim: str) -> CutPlan:
        rng, run = self.rng, self.run
        # The next batch or the one after; with an MLP image spread over K batches up to K
        # batches on, so that cuts land in the first, a middle and the last chunk and after a
        # complete spread copy.
        batch = run.next_batch + rng.randrange(2 if run.mlp_spread == 1 else run.mlp_spread + 1)
        if aim == "recovery":
            aim_first = rng.choice(COMMAND_PHASES)
            return CutPlan("recovery", batch, aim_first, delay=self._command_delay(aim_first, batch))
        if aim == "mlp_log":           # from its start: the FREE record of its own slot
            return CutPlan(aim, batch, aim, watch_line="own", nth=1, extra=self._delay(aim))
        if aim in COMMAND_PHASES:
            return CutPlan(aim, batch, aim, delay=self._command_delay(aim, batch))
        slot_base = run.region.slot_base(batch & 1)
        # The MLP slot is chosen when the batch's logs are submitted; resolved in the hook.
        choices = {"flag_write": [("logging", slot_base + RECORD_LINE_LOGGED, 2),
                                  ("update", slot_base + RECORD_LINE_APPLIED, 1),
                                  ("mlp_log", "own", 2)],
                   "release": [("logging", slot_base + RECORD_LINE_LOGGED, 1),
                               ("mlp_log", "other", 1)]}[aim]
        hook_phase, line, nth = rng.choice(choices)
        return CutPlan(aim, batch, hook_phase, watch_line=line, nth=nth, extra=rng.randrange(self.wr_lat + 9))

    def _delay(self, phase: str) -> int:
        return self.rng.randrange(self.estimate(phase))

    def _command_delay(self, phase: str, batch: int) -> int:
        """Cycles from the hook to a cut inside command ``phase`` of ``batch``. The hook runs
        before the submission (a cut inside it lands in idle); the first LOG after a power-up
        first clears its dedup set, which writes nothing, so the cut comes after the clear."""
        run = self.run
        delay = run.submit_cycles + self._delay(phase)
        if phase == "logging" and batch == run.next_batch and run.log_clear_pending:
            delay += run.log_clear_cycles
        return delay

    # ---- cutting
    def hook_for(self, plan: CutPlan, fire):
        armed = [True]

        async def hook(phase: str, k: int) -> None:
            if DEBUG:
                self.env.dut._log.info(f"cycle {self.env.host.cycle}: batch {k} {phase} (plan: {plan})")
            if armed[0] and k > plan.batch:
                raise RuntimeError(f"the cut planned for batch {plan.batch} {plan.hook_phase} never came ({plan})")
            if armed[0] and phase == plan.hook_phase and k == plan.batch:
                armed[0] = False
                if plan.watch_line in ("own", "other"):
                    plan.watch_line, plan.nth = self.run.mlp_watch(k, plan.watch_line, plan.nth)
                plan.seq = self.run.driver.submitted     # the command about to be submitted
                cocotb.start_soon(self._cutter(plan, fire))
        return hook

    async def _cutter(self, plan: CutPlan, fire) -> None:
        if plan.watch_line is None:
            await ClockCycles(self.env.clk, max(1, plan.delay))
        else:
            ch, local = split_line_address(plan.watch_line, self.env.config.channels)
            media = self.env.media[ch]
            media.watch(local)
            base = media.watch_count()
            # The first LOG after a power-up also clears the dedup set (one set per cycle), which
            # the recent durations of a steady run do not show.
            clear = self.run.log_clear_cycles
            limit = 4 * (self.estimate("logging") + self.estimate("mlp_log") + self.estimate(plan.hook_phase)) \
                + WATCH_SLACK + clear
            for _ in range(limit):
                await RisingEdge(self.env.clk)
                if (media.watch_count() - base) & 0xFFFF_FFFF >= plan.nth:
                    break
            else:
                self.env.dut._log.warning(f"{plan}: the watched write did not come in {limit} cycles; cutting now")
                plan.watch_expired = True
            media.watch(None)
            if plan.extra:
                await ClockCycles(self.env.clk, plan.extra)
        plan.fired_cycle = self.env.host.cycle
        if DEBUG:
            self.env.dut._log.info(f"cycle {plan.fired_cycle}: cut ({plan})")
        fire()

    async def cut_during(self, work, plan: CutPlan) -> str | None:
        """Run ``work(hook)`` until the plan's cut fires; then cut power and power up again.
        Returns the phase the cut landed in, or None when ``work`` finished first."""
        done, state = Event(), {}

        def fire():
            state["cut"] = True
            done.set()

        async def worker():
            try:
                await work(self.hook_for(plan, fire))
            except Exception as exc:      # noqa: BLE001  (re-raised below)
                state["error"] = exc
            finally:
                done.set()
        task = cocotb.start_soon(worker())
        await done.wait()
        if "cut" not in state:
            if "error" in state:
                raise state["error"]
            return None
        task.cancel()
        landed = await self.run.power_cycle(self.rng.randrange(1 << 32))
        cut = self.run.cut_command
        if plan.watch_line is not None and not plan.watch_expired and cut is not None and cut.seq == plan.seq:
            landed = plan.aim
        self.result["cuts"] += 1
        self.result["phases_hit"][landed] += 1
        return landed

    async def measure_recovery(self) -> int:
        """How long this RECOVER runs, so that a cut lands inside it: run it once (RECOVER
        writes only table rows, never the log), then put back the rows it rewrote, which
        restores the media to the state before it. Returns the completion's cycles."""
        run = self.run
        backdoor = run.driver.backdoor
        golden = golden_recover(backdoor.read_line, run.region, apply=False)
        before = {line: backdoor.read_line(line) for line in golden.writes}
        completion, _ = await run.recover(expect=golden.error or NdpError.OK)
        for line, value in before.items():
            backdoor.write_lines(line, [value])
        return completion.cycles

    # ---- one point
    async def run_point(self, i: int) -> bool:
        aim = self.order[i]
        run = self.run
        plan = self.plan(aim)
        self.result["phases_aimed"][aim] += 1
        total = len(run.batches)
        landed = await self.cut_during(lambda hook: run.train(total, hook), plan)
        if landed is None:
            raise RuntimeError(f"point {i}: training ended before the cut ({plan})")
        landings = [landed]
        if aim == "recovery":
            duration = await self.measure_recovery()
            rplan = CutPlan("recovery", run.next_batch, "recovery",
                            delay=run.submit_cycles + self.rng.randrange(max(1, duration)))
            second = await self.cut_during(lambda hook: run.recover(hook), rplan)
            if second is not None:
                landings.append(second)
        problems, lost, res = await recover_and_check(run)
        self.result["points"] += 1
        self.result["lost_acknowledged_writes"] += lost
        self.result["rolled_back"] += int(res.rolled_back)
        self.result["mlp_logs_checked"] += int(res.mlp_valid)
        self.env.dut._log.info(
            f"point {i + 1}/{self.points}: aimed {plan}; landed in {', '.join(landings)}; recovered "
            f"{res.emb_batches if res.emb_valid else 0} batches{' (rolled back)' if res.rolled_back else ''}, MLP log "
            f"{'batch ' + str(res.mlp_batch) if res.mlp_valid else 'none'}; "
            f"{'CONSISTENT' if not problems else 'INCONSISTENT'}")
        if problems:
            self.result["inconsistent"] += 1
            self.result["failures"].append({"point": i, "aimed": str(plan), "landed": landings,
                                             "problems": problems[:10]})
            return False
        self.result["consistent"] += 1
        run.resume(res)
        return True

    async def run_all(self) -> dict:
        if not self.run.recent_cycles:
            # One batch without a cut measures every command's duration and the submission's,
            # so that the first point aimed at a phase lands in it.
            await self.run.train(self.run.next_batch + 1)
        for i in range(self.points):
            watchdog = cocotb.start_soon(self._watchdog(i))
            try:
                if not await self.run_point(i):
                    break
            finally:
                watchdog.cancel()
        return self.result

    async def _watchdog(self, i: int) -> None:
        """Fail the campaign, saying where it stands, when point i runs far longer than its
        commands take (a hang in the device or in the testbench)."""
        budget = POINT_BUDGET_CYCLES + 50 * sum(self.estimate(p) for p in COMMAND_PHASES + ("recovery",))
        await Timer(budget * CLOCK_PERIOD_NS, unit="ns")
        run = self.run
        raise RuntimeError(f"point {i + 1} ({self.order[i]}) still running after {budget} cycles: batch "
                           f"{run.next_batch}, pending {[(s.phase, s.batch, s.seq) for s in run.pending]}, "
                           f"submitted {run.driver.submitted}, collected {run.driver.completed}")


def trace_knobs_from_env() -> TraceKnobs:
    def opt(name):
        value = os.environ.get(name)
        return int(value) if value else None
    return TraceKnobs(rows_cap=opt("TCXL_CRASH_ROWS_CAP"), batch_size=opt("TCXL_CRASH_BATCH_SIZE"))


@cocotb.test()
async def crash_campaign(dut):
    """``trainingcxl crash``: TCXL_CRASH_POINTS power cuts, each recovered and checked."""
    env = await DeviceEnv.create(dut)
    model = os.environ.get("TCXL_CRASH_MODEL", "rm-tiny")
    points = int(os.environ.get("TCXL_CRASH_POINTS", "7"))
    phases = tuple(p for p in os.environ.get("TCXL_CRASH_PHASES", ",".join(PHASES)).split(",") if p)
    schedule = os.environ.get("TCXL_CRASH_SCHEDULE", "cxl-b")
    preset = get_preset(model)                  # resolved once here and passed down
    if os.environ.get("TCXL_CRASH_TRACE"):      # a file already bound to the model (tools/trace_source.py)
        trace = read_trace(os.environ["TCXL_CRASH_TRACE"])
    else:
        trace = generate_trace(preset, TRACE_BATCHES, env.seed, trace_knobs_from_env())
    spread = int(os.environ.get("TCXL_CRASH_MLP_SPREAD", "1"))
    # A point trains up to 2 batches (K + 1 with the MLP image spread over K) before its cut.
    per_point = 2 if spread == 1 else spread + 1
    run = CheckpointedRun(env, trace, total_batches=per_point * points + 8, schedule=schedule, preset=preset,
                          mlp_spread=spread)
    campaign = CrashCampaign(run, points, random.Random(env.seed ^ 0xC0A57), phases)
    result = {"model": model, "seed": env.seed, "schedule": schedule, "mlp_spread": spread, "verified": False,
              **campaign.result}
    t0, start = time.perf_counter(), env.host.cycle
    try:
        await run.setup()
        await campaign.run_all()
        if not campaign.result["inconsistent"]:
            await run.train(run.next_batch + 2)
            run.verify_all_tables("after the campaign")
            summary = await run.finish_checked()
            result["verified"] = True
            result["protocol_violations"] = summary["protocol_violations"]
        result.update(campaign.result)
    except BaseException as exc:
        result.update(campaign.result)
        result["error"] = f"{type(exc).__name__}: {exc}"[:4000]
        raise
    finally:
        result.update({"batches_trained": run.next_batch, "sim_cycles": env.host.cycle - start,
                       "wall_seconds": round(time.perf_counter() - t0, 1)})
        write_result(result)
    assert not result["inconsistent"] and not result["lost_acknowledged_writes"], \
        f"seed {env.seed}: {result['inconsistent']} inconsistent points: {result['failures'][:2]}"
