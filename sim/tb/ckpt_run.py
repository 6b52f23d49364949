"""Checkpointed training on the RTL: the host's batch loop with the undo log, power cuts and recovery.

``CheckpointedRun(env, trace, *, total_batches, schedule="cxl-b", poll_cycles=16)`` owns one
model on the device with both logs reserved (``plan_checkpoint_layout``),
a GPU agent (sim/bfm/gpu_agent.py) whose MLP image lives in host/GPU memory behind a
``HostMemorySide`` (the device reads it with CXL.cache RdCurr), and the golden training
state ``CheckpointedTraining`` (sim/model/checkpoint.py). Batch k of the run is trace batch
``k % len(trace.batches)`` with the seeded gradients of k (``batch_gradients``), so a run can
be longer than its trace.

``grads`` (callable k -> per-table pooled-output gradients) and ``mlp_step`` (the GPU agent's
``step_fn``) replace the seeded gradients and the pseudo-SGD MLP step, and ``initial`` the
seeded initial tables (the training system, sim/system.py, passes the real MLP's and DLRM's
initialisation). ``mlp_lines`` (default: the whole image) limits the MLP
log to the image's first lines (the overhead bench measures the copy rate on a part of an image
too large for the simulated device); ``gpu_wait=False`` skips simulating the GPU's MLP time
(its cycles are still reported). Per batch k (``await run_batch(k)``, which returns the batch's host cycles and the
last completion's cycles per phase), in the order of the schedule:
- ``cxl-b`` (batch-aware): LOOKUP; LOG(k) and MLP_LOG(k) are submitted as soon as the
  indices are known and run while the GPU computes its MLPs (a wait of the GPU agent's
  ``mlp_time_cycles``); the gradients arrive; UPDATE(k) with flags.checkpoint.
- ``cxl-d``: LOOKUP; the GPU's MLP time; LOG(k) and MLP_LOG(k) on the critical path;
  UPDATE(k) with flags.checkpoint.
- ``none``: LOOKUP; the GPU's MLP time; plain UPDATE(k) (no log; the overhead baseline).
Every pooled vector is compared bit for bit with ``embedding.tbe_forward`` on the golden
tables after k batches. MLP_LOG(k) goes into the MLP slot that does not hold the newest
complete MLP log (``mlp_next_slot``): the device frees the slot it writes first, so writing
over the only complete log would lose it. ``acked_batches`` counts the UPDATE completions
the host collected and ``acked_mlp`` is the batch of the last collected MLP_LOG completion:
the writes the device acknowledged.

``hook(phase, k)`` (async, optional) is awaited just before each command is submitted, phase
in ``lookup``, ``logging``, ``mlp_log``, ``update``, ``recovery``; the crash campaign
(sim/tb/crash_tb.py) starts its power cuts from it. ``pending`` lists the submitted
commands whose completion was not collected, for classifying a cut.

After a power cut (``await power_cycle(tear_seed)``: the running batch task must already be
cancelled): the media tear in-flight writes, device and links lose all state, GPU memory is
lost (a new home agent); the host reprograms the HDM window, the rings and the CKPT_* CSRs.
It returns the phase the cut landed in: that of the first pending command whose completion
is not in PMEM (``cut_command``), or ``idle``.
``await recover()`` runs RECOVER and returns (completion, RecoveryResult from the CSRs);
``check_recovered(result)`` compares the device with the golden model: every table row
equals ``tables_after(emb_batches)`` bit for bit, the MLP slot reported equals the GPU's
image at ``mlp_batch``, and nothing acknowledged was lost; it returns the problems and the
number of acknowledged writes lost. ``resume(result)`` restarts the GPU and the loop at
``emb_batches``.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass

import numpy as np
from cocotb.triggers import Timer

from hw.checkpoint.undo_log import UndoLogEngine
from hw.ndp.command import NdpError, NdpOpcode
from sim.bfm.gpu_agent import GpuAgent, mlp_image_lines
from sim.bfm.ndp_host import (COMPLETION, HostMemorySide, NdpHost, log_command, lookup_command,
                              mlp_log_command, mlp_log_commands, plan_layout, recover_command,
                              tables_from_manifest, update_command)
from sim.env import CLOCK_PERIOD_NS
from sim.model import embedding
from sim.model.checkpoint import CheckpointedTraining, batch_rows
from sim.model.dlrm import get_preset
from sim.model.fp32_ref import same_fp32
from sim.tb.ndp_run_tb import _first_mismatches, batch_gradients, host_output_base, initial_tables

SCHEDULES = ("cxl-b", "cxl-d", "none")
PHASE_OF_OPCODE = {NdpOpcode.LOOKUP.value: "lookup", NdpOpcode.LOG.value: "logging",
                   NdpOpcode.MLP_LOG.value: "mlp_log", NdpOpcode.UPDATE.value: "update",
                   NdpOpcode.RECOVER.value: "recovery"}


def plan_checkpoint_layout(trace, capacity_lines: int, mlp_host_line: int = 0, mlp_lines: int | None = None):
    """The device layout of a checkpointed run of ``trace``: its arrays and tables, the undo log
    sized for the batch touching the most distinct rows, and the MLP log of the model's image
    (or of its first ``mlp_lines`` lines).
    Raises ``LayoutError`` (saying what does not fit) when the device is too small."""
    m = trace.manifest
    most_rows = max(len(batch_rows(b.offsets, b.indices, m["batch_size"], len(m["tables"])))
                    for b in trace.batches)
    return plan_layout(tables_from_manifest(m), batch_size=m["batch_size"],
                       max_indices=max(int(b.indices.size) for b in trace.batches),
                       capacity_lines=capacity_lines, has_weights=bool(m["has_weights"]),
                       emb_log=True, log_max_rows=most_rows,
                       mlp_log_lines=mlp_image_lines(m["preset"]) if mlp_lines is None else mlp_lines,
                       mlp_host_line=mlp_host_line)


class CyclicBatches:
    """Batch k = ``batches[k % len(batches)]``, for ``length`` batches."""

    def __init__(self, batches, length: int):
        self.batches, self.length = list(batches), length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, k: int):
        if not 0 <= k < self.length:
            raise IndexError(k)
        return self.batches[k % len(self.batches)]


@dataclass
class Submitted:
    seq: int
    tag: int
    opcode: int
    batch: int

    @property
    def phase(self) -> str:
        return PHASE_OF_OPCODE[self.opcode]


class CheckpointedRun:
    def __init__(self, env, trace, *, total_batches: int, schedule: str = "cxl-b", poll_cycles: int = 16,
                 mlp_chunks: int = 1, mlp_lines: int | None = None, gpu_wait: bool = True,
                 grads=None, mlp_step=None, initial=None, preset=None, mlp_spread: int = 1):
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
        if mlp_spread < 1 or (mlp_spread > 1 and mlp_chunks > 1):
            raise ValueError(f"mlp_spread must be >= 1, and mlp_chunks 1 when it is > 1 "
                             f"(got {mlp_spread}, {mlp_chunks})")
        m = trace.manifest
        self.env, self.manifest, self.schedule, self.mlp_chunks = env, m, schedule, mlp_chunks
        self.gpu_wait = gpu_wait
        self.B = m["batch_size"]
        self.modes = [t["mode"] for t in m["tables"]]
        self.has_weights = bool(m["has_weights"])
        self.lr = float(m["optimizer"]["lr"])
        self.batches = CyclicBatches(trace.batches, total_batches)
        preset = get_preset(m["preset"]) if preset is None else preset   # resolved once, by the caller if it can
        self.host_base = host_output_base(env)
        self.gpu = GpuAgent(preset, base_line=self.host_base, seed=env.seed, batch_size=self.B,
                            clock_mhz=env.config.clock_mhz, step_fn=mlp_step)
        self.mlp_lines = self.gpu.lines if mlp_lines is None else mlp_lines
        if not 1 <= self.mlp_lines <= self.gpu.lines:
            raise ValueError(f"mlp_lines must be in [1, {self.gpu.lines}], got {mlp_lines}")
        if mlp_spread > self.mlp_lines:
            raise ValueError(f"mlp_spread {mlp_spread} exceeds the {self.mlp_lines}-line image")
        self.mlp_spread = mlp_spread
        self.mlp_copy_start: int | None = None      # spread copy: the batch of its chunk 0
        self.layout = plan_checkpoint_layout(trace, env.config.capacity_lines, self.host_base, self.mlp_lines)
        self.region = self.layout.log_region
        self.gpu.resident_lines = self.mlp_lines
        initial = initial_tables(m, env.seed) if initial is None else initial
        self.golden = CheckpointedTraining(initial, self.modes, self.B, self.batches,
                                           grads or (lambda k: batch_gradients(m, env.seed, k)), self.lr,
                                           mlp=self.gpu)
        self.cache: HostMemorySide | None = None
        self.driver = NdpHost(env, self.layout, poll_cycles=poll_cycles)
        self.cache_problems: list[str] = []
        self.pending: list[Submitted] = []
        self.acked_batches = 0           # UPDATE completions collected
        self.acked_mlp: int | None = None
        self.mlp_next_slot = 0
        self.next_batch = 0
        self.cycles: dict[str, int] = {}  # the last completion's cycles per phase
        # The last 4 completions' engine cycles per phase (descriptor fetch to the completion
        # write), the first LOG after a reset without its dedup-set clear (``log_clear_pending``).
        self.recent_cycles: dict[str, collections.deque] = {}
        self.log_clear_pending = True    # the device's next LOG clears the set (after a reset)
        self.log_clear_cycles = env.config.log_set_entries // UndoLogEngine.WAYS
        self.cut_command: Submitted | None = None
        self.submit_cycles = 0           # the last submit: ring write and doorbell, in cycles
        self._tag = 0

    # ---- set-up and power
    def _attach_cache_side(self) -> None:
        self.cache = HostMemorySide(self.env, self.host_base, self.gpu.lines)
        self.gpu.ha = self.cache.ha
        self.driver.host_memory = self.cache

    def _detach_cache_side(self) -> None:
        """Power is gone: the old CXL.cache host stops; its protocol findings are kept."""
        side, self.cache = self.cache, None
        side.host.stop()
        side.host.link.reset_link()
        self.env.host.listeners.remove(side.monitor)
        self.cache_problems += [f"before a power cut: {p}" for p in side.monitor.violations[:10]]
        self.cache_problems += [f"home agent before a power cut: {e}" for e in side.ha.protocol_errors[:10]]

    async def setup(self) -> None:
        self.driver.load_tables(self.golden.tables_after(0))
        await self.driver.write_table_descriptors()
        self._attach_cache_side()
        self.gpu.advance(0)
        await self._program()

    async def _program(self) -> None:
        await self.driver.start()
        await self.driver.program_checkpoint()

    async def power_cycle(self, tear_seed: int) -> str:
        """Cut power now (the batch task must be cancelled) and bring the device back; returns
        the phase the cut landed in (from the completion ring in PMEM after the cut)."""
        self.env.csr.axi.abort()
        self._detach_cache_side()
        await self.env.power_cycle(tear_seed)
        self.cut_command = self.running_command()
        self.log_clear_pending = True
        phase = self.cut_command.phase if self.cut_command is not None else "idle"
        lay = self.layout
        # The host's own ring writes may have been torn: the scoreboard expects what is there.
        self.driver.backdoor.sync_reference(lay.sq.base, lay.sq.lines)
        await self.env.program_window(0, self.env.config.capacity_bytes)
        self._attach_cache_side()
        self.pending.clear()
        await self._program()
        return phase

    # ---- commands
    def _next_tag(self) -> int:
        self._tag = (self._tag + 1) & 0xFFFF
        return self._tag

    async def _submit(self, cmd, k: int, hook) -> Submitted:
        phase = PHASE_OF_OPCODE[cmd.opcode_value]
        if hook is not None:
            await hook(phase, k)
        start = self.env.host.cycle
        seq = await self.driver.submit(cmd)
        self.submit_cycles = self.env.host.cycle - start
        s = Submitted(seq, cmd.tag, cmd.opcode_value, k)
        self.pending.append(s)
        return s

    async def _collect(self, s: Submitted, expect: NdpError = NdpError.OK):
        c = await self.driver.wait(s.seq, timeout_cycles=self.timeout)
        self.pending.remove(s)
        if c.tag != s.tag or c.opcode != s.opcode or c.error != expect.value:
            raise AssertionError(f"seed {self.env.seed}: batch {s.batch} {s.phase}: {c} (expected "
                                 f"{expect.name}, tag {s.tag:#x})")
        if c.opcode == NdpOpcode.LOG.value and expect == NdpError.OK:
            # LOG's entry count is the device's exact distinct-row figure: the trace's count.
            b = self.batches[s.batch]
            distinct = len(batch_rows(b.offsets, b.indices, self.B, len(self.manifest["tables"])))
            if not c.stats["unique_rows"] == c.stats["rows_read"] == distinct:
                raise AssertionError(f"seed {self.env.seed}: batch {s.batch} LOG counted {c.stats['unique_rows']} "
                                     f"distinct rows ({c.stats['rows_read']} read), the trace has {distinct}")
        self.cycles[s.phase] = c.total_cycles or c.cycles
        engine = c.cycles
        if c.opcode == NdpOpcode.LOG.value and expect == NdpError.OK and self.log_clear_pending:
            engine, self.log_clear_pending = max(1, engine - self.log_clear_cycles), False
        self.recent_cycles.setdefault(s.phase, collections.deque(maxlen=4)).append(engine)
        return c

    @property
    def timeout(self) -> int:
        return 400_000 + 40 * (self.layout.max_indices * 4 + self.gpu.lines)

    def completed_in_memory(self, s: Submitted) -> bool:
        """Whether command ``s``'s completion line is in PMEM (valid, its tag and opcode)."""
        f = COMPLETION.unpack(self.driver.backdoor.read_line(self.layout.cq.base + s.seq % self.layout.ring_slots))
        return bool(f["valid"]) and f["tag"] == s.tag and f["opcode"] == s.opcode

    def running_command(self) -> Submitted | None:
        """The first submitted command whose completion is not in PMEM (None: none)."""
        return next((s for s in self.pending if not self.completed_in_memory(s)), None)

    # ---- one batch
    async def run_batch(self, k: int, hook=None) -> dict:
        b = self.batches[k]
        tables = self.golden.tables_after(k)
        self.driver.load_batch(b.offsets, b.indices, b.weights if self.has_weights else None)
        start = self.env.host.cycle
        s = await self._submit(lookup_command(self.layout, index_count=b.indices.size, has_weights=self.has_weights,
                                              tag=self._next_tag()),
                               k, hook)
        await self._collect(s)
        self._check_lookup(k, b, tables)
        gpu_cycles = self.gpu.mlp_time_cycles()
        if self.schedule == "cxl-b":
            logs = await self._submit_logs(k, hook)
            await self._gpu_time(gpu_cycles)
            await self._collect_logs(logs)
        else:
            await self._gpu_time(gpu_cycles)
            if self.schedule == "cxl-d":
                await self._collect_logs(await self._submit_logs(k, hook))
        self.driver.load_gradients(self.golden.grads_of(k))
        ckpt = None if self.schedule == "none" else k
        s = await self._submit(update_command(self.layout, index_count=b.indices.size, lr=self.lr,
                                              has_weights=self.has_weights, tag=self._next_tag(),
                                              checkpoint_batch=ckpt), k, hook)
        await self._collect(s)
        self.acked_batches = k + 1
        self.next_batch = k + 1
        self.gpu.advance(k + 1)
        return {"batch": k, "cycles": self.env.host.cycle - start, "gpu_cycles": gpu_cycles,
                **{f"cycles_{phase}": c for phase, c in self.cycles.items()}}

    async def _gpu_time(self, cycles: int) -> None:
        if self.gpu_wait and cycles:
            await Timer(cycles * CLOCK_PERIOD_NS, unit="ns")

    # ---- the MLP log spread over batches (mlp_spread K > 1)
    def _chunk_bounds(self, j: int) -> tuple[int, int]:
        K, n = self.mlp_spread, self.mlp_lines
        return n * j // K, n * (j + 1) // K

    def mlp_chunk(self, k: int) -> tuple[int, int, int]:
        """(j, first line, end line) of the image chunk batch k copies: chunk j = k - the copy's
        first batch (a copy starts at the first batch after the previous one completed)."""
        j = k - (k if self.mlp_copy_start is None else self.mlp_copy_start)
        return (j, *self._chunk_bounds(j))

    def mlp_image_of_copy(self, start: int) -> list[int]:
        """The lines a complete copy that started at batch ``start`` holds: chunk j is the GPU's
        image while batch start + j ran (one consistent image when K = 1)."""
        out = []
        for j in range(self.mlp_spread):
            a, b = self._chunk_bounds(j)
            out += self.gpu.image_lines(start + j, b)[a:]
        return out

    def mlp_watch(self, k: int, slot_kind: str, nth: int) -> tuple[int, int]:
        """(line, nth) of a write of batch k's MLP_LOG for a power cut to follow: ``own`` with
        nth 1 its first write (the FREE record at chunk 0, else the chunk's first image line);
        ``own`` with nth 2 the MLP_LOGGED record; ``other`` the release of the other slot. The
        records come only with the first or the last chunk; a middle chunk of a spread copy
        gives its first image line instead."""
        _, a, b = self.mlp_chunk(k)
        record = self.region.mlp_slot(self.mlp_next_slot)
        first = (record, 1) if a == 0 else (record + 1 + a, 1)
        if (slot_kind == "own" and nth == 1) or b != self.mlp_lines:
            return first
        if slot_kind == "own":
            return record, 2 if a == 0 else 1
        return self.region.mlp_slot(self.mlp_next_slot ^ 1), 1

    async def _submit_logs(self, k: int, hook) -> list[Submitted]:
        slot = self.mlp_next_slot
        if self.mlp_copy_start is None:
            self.mlp_copy_start = k
        subs = [await self._submit(log_command(self.layout, k, index_count=self.batches[k].indices.size,
                                                   has_weights=self.has_weights, tag=self._next_tag()),
                                   k, hook)]
        if self.mlp_spread == 1:
            cmds = mlp_log_commands(k, self.mlp_lines, slot, chunks=self.mlp_chunks, tag=self._next_tag())
        else:
            _, a, b = self.mlp_chunk(k)
            cmds = [mlp_log_command(k, a, b - a, slot, tag=self._next_tag())]
        for cmd in cmds:
            self._tag = cmd.tag
            subs.append(await self._submit(cmd, k, hook))
        return subs

    async def _collect_logs(self, subs: list[Submitted]) -> None:
        for s in subs:
            await self._collect(s)
        if self.mlp_chunk(subs[-1].batch)[2] == self.mlp_lines:     # the copy's last chunk: complete
            self.acked_mlp, self.mlp_copy_start = self.mlp_copy_start, None
            self.mlp_next_slot ^= 1

    def _check_lookup(self, k: int, b, tables) -> None:
        want = embedding.tbe_forward(tables, b.offsets, b.indices, self.modes, self.B, b.weights)
        got = self.driver.read_outputs()
        problems = []
        for t, (w, g) in enumerate(zip(want, got)):
            problems += _first_mismatches(w, g, lambda i, j, t=t: f"batch {k} LOOKUP table {t} sample {i}")
        assert not problems, f"seed {self.env.seed}: pooled outputs differ:\n" + "\n".join(problems)

    async def train(self, until: int, hook=None) -> None:
        while self.next_batch < until:
            await self.run_batch(self.next_batch, hook)

    # ---- recovery
    async def recover(self, hook=None, expect: NdpError = NdpError.OK):
        s = await self._submit(recover_command(tag=self._next_tag()), self.next_batch, hook)
        c = await self._collect(s, expect)
        return c, await self.driver.read_recovery()

    def check_recovered(self, res) -> tuple[list[str], int]:
        """(problems, acknowledged writes lost) of a recovery result against the golden model."""
        problems, lost = [], 0
        emb = res.emb_batches if res.emb_valid else 0
        if emb < self.acked_batches:
            lost += self.acked_batches - emb
            problems.append(f"recovered {emb} batches, but {self.acked_batches} UPDATEs were acknowledged")
        if emb > self.next_batch + 1:
            problems.append(f"recovered {emb} batches, only {self.next_batch + 1} were started")
        else:
            want = self.golden.tables_after(emb)
            for t, w in enumerate(want):
                got = self.driver.read_table(t)
                bad = np.argwhere(~same_fp32(w.view(np.uint32), got.view(np.uint32)))
                if bad.size:
                    problems.append(f"table {t}: {len(bad)} lanes differ from the golden tables after {emb} "
                                    f"batches, first row {int(bad[0][0])} lane {int(bad[0][1])}")
        if self.acked_mlp is not None and not (res.mlp_valid and res.mlp_batch >= self.acked_mlp):
            lost += 1
            problems.append(f"MLP log of batch {self.acked_mlp} was acknowledged; recovery reports "
                            f"{'batch ' + str(res.mlp_batch) if res.mlp_valid else 'none'}")
        if res.mlp_valid:
            base = self.region.mlp_slot(res.mlp_slot) + 1
            got = self.driver.backdoor.read_lines(base, self.mlp_lines)
            want = self.mlp_image_of_copy(res.mlp_batch)
            bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
            if bad:
                problems.append(f"MLP slot {res.mlp_slot}: {len(bad)} lines differ from the GPU's parameters "
                                f"after {res.mlp_batch} batches, first image line {bad[0]}")
        return problems, lost

    def resume(self, res) -> None:
        """Continue from the recovered state: batch ``emb_batches``; the GPU reloads its
        parameters (GPU memory was lost) and the next MLP log avoids the newest complete one."""
        emb = res.emb_batches if res.emb_valid else 0
        self.next_batch = self.acked_batches = emb
        self.mlp_next_slot = (res.mlp_slot ^ 1) if res.mlp_valid else 0
        self.acked_mlp = res.mlp_batch if res.mlp_valid else None
        self.mlp_copy_start = None          # a running copy died with the device's registers
        self.gpu.advance(emb)
        self.golden.forget_before(emb)

    def verify_all_tables(self, what: str) -> None:
        problems = []
        for t, want in enumerate(self.golden.tables_after(self.next_batch)):
            problems += _first_mismatches(want, self.driver.read_table(t),
                                          lambda i, j, t=t: f"{what}: table {t} row {i}")
        assert not problems, f"seed {self.env.seed}: tables differ:\n" + "\n".join(problems)

    def finish_cache_side(self) -> list[str]:
        side = self.cache
        side.monitor.finish(side.host.link.cycle)
        return self.cache_problems + side.check()

    async def finish_checked(self) -> dict:
        """End of a run: the CXL.mem monitor and scoreboard and the CXL.cache side (monitor,
        home agent) must be clean; returns ``env.finish()``'s summary."""
        summary = await self.env.finish()
        self.env.assert_clean()
        problems = self.finish_cache_side()
        assert not problems, f"seed {self.env.seed}: CXL.cache problems:\n" + "\n".join(problems)
        return summary
