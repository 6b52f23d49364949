"""The training system around the device: host driver, CXL-GPU with a real numpy MLP, golden training.

Contract
--------
The system of architecture.md section 1 is split by what must be simulated per cycle:

- **On the RTL** (``SystemRun``, cocotb): the host driver programs the device through the
  CSRs (AXI4-Lite) and the command rings (CXL.mem), and runs DLRM training batch by batch
  through the device's LOOKUP, LOG, MLP_LOG and checkpointed UPDATE (``CheckpointedRun``,
  sim/tb/ckpt_run.py: rings, doorbells, completions, the CXL.cache home agent holding the
  GPU's MLP image). The GPU (``GpuTrainer``) reads the device's pooled outputs, runs the
  real MLP forward and backward (sim/model/dlrm_mlp.py: dot interaction, BCE loss) on them
  and hands its pooled-output gradients to the UPDATE. Every command's device cycles are
  recorded (``cycles``, from the completions' NDP_LAST_CYCLES).
- **Composed** (sim/model/system_timing.py): the CXL switch / host link model (latency and
  bandwidth per link, sim/model/system_params.py), the GPU's MLP time (gpu_agent.mlp_timing),
  the host CPU of the PMEM baseline and the PCIe software costs. The device is idle or
  serial in every schedule, so each configuration's batch time is composed from the
  measured command cycles without re-simulating idle time.

Two orders run on the RTL (``order``):
- ``exact`` (PMEM, PCIe, CXL-D, CXL-B): LOOKUP(k), LOG(k), MLP_LOG(k), UPDATE(k). The
  schedules differ only in when the host issues these, not in what the device computes.
- ``relaxed`` (CXL): batch k+1's LOOKUP is issued before UPDATE(k), so it reads the tables
  of k applied batches; the GPU then patches those pooled vectors with batch k's row deltas
  (``relaxed_patch``). The argument arrays are double-buffered in a real driver; here batch
  k's arrays are reloaded through the backdoor before UPDATE(k).

Checks, every batch (an ``AssertionError`` names the batch): every pooled vector the device
returns equals ``embedding.tbe_forward`` on the golden tables bit for bit (``_check_lookup``);
the GPU's loss and pooled-output gradients computed from the device's outputs equal the
golden training's (``DlrmTraining``, the same MLP on the golden embedding results) bit for
bit; at the end every table equals the golden tables after all batches. The MLP log's
lines are the probe (``mlp_lines``) of the GPU's image; ``check_recovered`` of the crash
campaign covers their content.

``DlrmTraining(preset, batches, batch_size, relaxed, mlp_lr)`` is the golden training: pooled
outputs from the golden tables (relaxed: from the tables one batch older, plus the patch),
the MLP step on them, SGD on the MLP image. Tables start from DLRM's initialisation
(``dlrm_initial_tables``); tables and MLP share one learning rate: ``SystemRun`` takes the
trace manifest's optimizer lr (the eval writes ``TRAINING_LR`` there).
``attach(golden, gpu)`` connects it to a ``CheckpointedTraining`` (tables) and a ``GpuAgent``
(the image); ``grads(k)`` and ``step_fn(params, k)`` are the callables those take; ``loss(k)``
is the loss of batch k.
"""
from __future__ import annotations

import numpy as np

from sim.bfm.ndp_host import log_command, lookup_command, mlp_log_commands, update_command
from sim.model import embedding
from sim.model.dlrm import get_preset
from sim.model.dlrm_mlp import DlrmMlp, sgd
from sim.tb.ckpt_run import CheckpointedRun

ORDERS = ("exact", "relaxed")
# One learning rate for the tables and the MLP, as DLRM has (``--learning-rate``). Measured on
# the golden training (seed 1, the eval's batch sizes): the presets' 0.1 (DLRM's Criteo Kaggle
# script) diverges on RM1 (loss 0.72, 1.13, 4.33, 23.4); DLRM's default 0.01 spikes on RM2
# (1.45, 11.4, 1.39); 0.001 falls on all four (RM1 0.72, 0.70, 0.64, 0.63).
TRAINING_LR = 0.001


def relaxed_patch(tables_shape, modes, batch_size: int, prev, prev_grads, lr: float, cur) -> list[np.ndarray]:
    """Batch ``cur``'s pooled-output correction for batch ``prev``'s update: the row deltas of
    ``prev`` (its SGD applied to zero tables, fp32) pooled over ``cur``'s bags."""
    delta = [np.zeros(s, dtype=np.float32) for s in tables_shape]
    embedding.tbe_sgd_step(delta, prev.offsets, prev.indices, modes, batch_size, prev_grads, lr,
                           getattr(prev, "weights", None))
    return embedding.tbe_forward(delta, cur.offsets, cur.indices, modes, batch_size, getattr(cur, "weights", None))


def add_pooled(a: list[np.ndarray], b: list[np.ndarray]) -> list[np.ndarray]:
    return [(x + y).astype(np.float32) for x, y in zip(a, b)]


def dlrm_initial_tables(manifest: dict, seed: int) -> list[np.ndarray]:
    """DLRM's embedding initialisation (dlrm_s_pytorch.py ``create_emb``): each table uniform
    in [-sqrt(1/n), sqrt(1/n)) with n the rows of the model's table before any rows cap
    (``rows_uncapped``; so pooled magnitudes, and the starting loss, do not depend on the cap),
    fp32, one seeded generator per table. (The hardware tests' tables, uniform in [-1, 1),
    saturate the MLP's sigmoid at RM1's pooling.)"""
    out = []
    for t, tab in enumerate(manifest["tables"]):
        bound = np.sqrt(1.0 / tab.get("rows_uncapped", tab["rows"]))
        rng = np.random.default_rng([seed, 0x454D42, t])
        out.append(rng.uniform(-bound, bound, (tab["rows"], tab["dim"])).astype(np.float32))
    return out


class DlrmTraining:
    """Golden DLRM training: embedding tables (CheckpointedTraining) plus the real MLP."""

    def __init__(self, preset, batches, batch_size: int, *, relaxed: bool = False, mlp_lr: float | None = None):
        self.preset = get_preset(preset) if isinstance(preset, str) else preset
        self.batches, self.B, self.relaxed = batches, batch_size, relaxed
        self.mlp = DlrmMlp(self.preset)
        self.mlp_lr = self.preset.optimizer.lr if mlp_lr is None else mlp_lr
        self.golden = self.gpu = None
        self._steps: dict = {}

    def attach(self, golden, gpu) -> None:
        self.golden, self.gpu = golden, gpu

    def pooled(self, k: int) -> list[np.ndarray]:
        """The pooled outputs the GPU trains batch k on."""
        b = self.batches[k]
        if not self.relaxed or k == 0:
            return embedding.tbe_forward(self.golden.tables_after(k), b.offsets, b.indices, self.golden.modes,
                                         self.B, b.weights)
        old = embedding.tbe_forward(self.golden.tables_after(k - 1), b.offsets, b.indices, self.golden.modes,
                                    self.B, b.weights)
        return add_pooled(old, self.patch(k))

    def patch(self, k: int) -> list[np.ndarray]:
        return relaxed_patch([t.shape for t in self.golden.initial], self.golden.modes, self.B,
                             self.batches[k - 1], self.grads(k - 1), self.golden.lr_of(k - 1), self.batches[k])

    def step(self, k: int, params: np.ndarray | None = None):
        if k not in self._steps:
            params = self.gpu.params_at(k) if params is None else params
            b = self.batches[k]
            self._steps[k] = self.mlp.forward_backward(params, b.dense, self.pooled(k), b.labels)
            for j in [j for j in self._steps if j < k - 4]:
                del self._steps[j]
        return self._steps[k]

    def grads(self, k: int) -> list[np.ndarray]:
        return self.step(k).grad_pooled

    def step_fn(self, params: np.ndarray, k: int) -> np.ndarray:
        return sgd(params, self.step(k, params).grad_params, self.mlp_lr)

    def loss(self, k: int) -> float:
        return float(self.step(k).loss)


class GpuTrainer:
    """The CXL-GPU's training step on the device's embedding results."""

    def __init__(self, training: DlrmTraining):
        self.training = training
        self.losses: list[float] = []

    def train_step(self, k: int, device_pooled: list[np.ndarray]) -> list[np.ndarray]:
        """MLP forward/backward of batch k on the device's pooled outputs (relaxed: patched);
        checks loss and gradients against the golden step; returns the pooled-output gradients."""
        tr = self.training
        pooled = add_pooled(device_pooled, tr.patch(k)) if tr.relaxed and k > 0 else device_pooled
        b = tr.batches[k]
        got = tr.mlp.forward_backward(tr.gpu.params_at(k), b.dense, pooled, b.labels)
        want = tr.step(k)
        if np.float32(got.loss).tobytes() != np.float32(want.loss).tobytes():
            raise AssertionError(f"batch {k}: loss {got.loss!r} from the device's outputs, golden {want.loss!r}")
        for t, (g, w) in enumerate(zip(got.grad_pooled, want.grad_pooled)):
            if g.tobytes() != w.tobytes():
                raise AssertionError(f"batch {k}: pooled-output gradients of table {t} differ from the golden step")
        self.losses.append(float(got.loss))
        return got.grad_pooled


class SystemRun(CheckpointedRun):
    """DLRM training on the RTL in the ``exact`` or ``relaxed`` order (module docstring)."""

    def __init__(self, env, trace, *, total_batches: int, order: str = "exact", mlp_lines: int | None = None,
                 poll_cycles: int = 16, lr: float | None = None, preset=None):
        if order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
        m = trace.manifest
        lr = float(m["optimizer"]["lr"]) if lr is None else lr      # the manifest's rate unless told
        self.order = order
        preset = get_preset(m["preset"]) if preset is None else preset     # resolved once, passed down
        self.training = DlrmTraining(preset, None, m["batch_size"], relaxed=order == "relaxed", mlp_lr=lr)
        super().__init__(env, trace, total_batches=total_batches, schedule="cxl-d", poll_cycles=poll_cycles,
                         mlp_lines=mlp_lines, gpu_wait=False, grads=self.training.grads,
                         mlp_step=self.training.step_fn, initial=dlrm_initial_tables(m, env.seed), preset=preset)
        self.lr = self.golden.lr = lr                 # the tables' SGD rate (UPDATE's lr field)
        self.training.batches = self.batches
        self.training.attach(self.golden, self.gpu)
        self.trainer = GpuTrainer(self.training)
        self.command_cycles: list[dict] = []        # per batch: device cycles per command
        self._prefetched: tuple[list[np.ndarray], int] | None = None   # relaxed: (outputs, cycles) of k+1

    async def _lookup(self, k: int, applied: int, cyc: dict, key: str) -> list[np.ndarray]:
        """LOOKUP of batch k on the device tables after ``applied`` batches; checked; returns outputs."""
        b = self.batches[k]
        self.driver.load_batch(b.offsets, b.indices, b.weights if self.has_weights else None)
        s = await self._submit(lookup_command(self.layout, index_count=b.indices.size, has_weights=self.has_weights,
                                              tag=self._next_tag()),
                               k, None)
        await self._collect(s)
        cyc[key] = self.cycles["lookup"]
        self._check_lookup(k, b, self.golden.tables_after(applied))
        return self.driver.read_outputs()

    async def _command(self, cmd, k: int, cyc: dict, key: str) -> None:
        s = await self._submit(cmd, k, None)
        await self._collect(s)
        cyc[key] = cyc.get(key, 0) + self.cycles[s.phase]

    async def run_batch(self, k: int, hook=None) -> dict:
        cyc: dict = {}
        if self.order == "exact" or k == 0:
            pooled = await self._lookup(k, k, cyc, "lookup")
        else:
            pooled, cyc["lookup_relaxed"] = self._prefetched
        b = self.batches[k]
        self.driver.load_batch(b.offsets, b.indices, b.weights if self.has_weights else None)
        await self._command(log_command(self.layout, k, index_count=b.indices.size, has_weights=self.has_weights,
                                        tag=self._next_tag()),
                            k, cyc, "log")
        slot = self.mlp_next_slot
        for cmd in mlp_log_commands(k, self.mlp_lines, slot, tag=self._next_tag()):
            self._tag = cmd.tag
            await self._command(cmd, k, cyc, "mlp_log")
        self.acked_mlp, self.mlp_next_slot = k, slot ^ 1
        if self.order == "relaxed" and k + 1 < len(self.batches):
            c: dict = {}
            nxt = await self._lookup(k + 1, k, c, "lookup")          # tables before UPDATE(k)
            self._prefetched = (nxt, c["lookup"])
            self.driver.load_batch(b.offsets, b.indices, b.weights if self.has_weights else None)
        grads = self.trainer.train_step(k, pooled)
        self.driver.load_gradients(grads)
        await self._command(update_command(self.layout, index_count=b.indices.size, lr=self.lr,
                                           has_weights=self.has_weights, tag=self._next_tag(), checkpoint_batch=k),
                            k, cyc, "update")
        self.acked_batches = self.next_batch = k + 1
        self.gpu.advance(k + 1)
        cyc["batch"] = k
        cyc["loss"] = self.trainer.losses[-1]
        self.command_cycles.append(cyc)
        return cyc

