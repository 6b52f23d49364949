"""The GPU side of TrainingCXL: the MLP parameter image in host/GPU memory and the MLP timing model.

Contract
--------
``GpuAgent(model, home_agent=None, base_line=0, *, seed=0, lr=None, grad_scale=1e-3, step_fn=None)``
holds the MLP parameters of a DLRM preset (sim/model/dlrm.py) as one flat fp32 image:

- Layers, in order: the bottom MLP ``bottom_mlp[i] -> bottom_mlp[i+1]``, then the top MLP
  ``interaction_width -> top_mlp[0] -> ...`` (DLRM prepends the feature-interaction width to
  ``--arch-mlp-top``; sim/model/dlrm.py). Each layer contributes its weight (out x in,
  row-major, PyTorch ``nn.Linear.weight``) then its bias (out); ``layers`` gives the offsets
  and ``unflatten(vec)`` the (W, b) views, so a real numpy MLP can use the same image.
- The image is zero-padded to whole 64-byte lines (16 floats): ``lines`` lines; image line i
  lives at host line ``base_line + i`` of ``home_agent``'s memory (written with
  ``HomeAgent.write_memory``, so the device's CXL.cache RdCurr of those lines returns it;
  the range must be host or GPU memory of that home agent).
- ``params_at(k)``: the parameters after k applied batches. Initial parameters (k = 0):
  DLRM's init, W ~ N(0, sqrt(2/(in+out))), b ~ N(0, sqrt(1/out)), from ``seed``. Then
  ``params_at(k+1) = step_fn(params_at(k), k)``; the default step is SGD on seeded
  pseudo-gradients: p - fp32(lr) * g_k, g_k = grad_scale * N(0, 1) from (seed, k), all in
  fp32 (deterministic; replace ``step_fn`` with a real forward/backward later). ``lr``
  defaults to the preset's optimizer lr. Results are cached.
- ``image_lines(k, count=None)``: params_at(k) as line ints (the first ``count``);
  ``advance(k)`` writes the first ``resident_lines`` of them (default: all) into the home
  agent's memory (what the GPU holds while it trains batch k) and sets ``batch``. A run whose
  device reads only part of a large image sets ``resident_lines`` to that part (converting
  and storing a 142 MB image per batch would dominate the simulation).

Timing (``mlp_timing(model, batch_size, clock_mhz, efficiency)`` -> ``MlpTiming``;
``mlp_time_cycles(...)`` its total in device cycles):

- FLOPs per sample: a linear layer in -> out costs 2*in*out forward (one multiply-add per
  weight; bias adds and activations are ignored, < 0.1 % here); the dot feature interaction
  costs 2*F*F*dim forward (the batched T @ T^T of F = tables + 1 vectors of ``dim`` =
  bottom_mlp[-1] floats, as DLRM computes it). Backward = 2x forward (gradients with respect
  to the inputs and to the weights), per phase.
- Throughput: ``RTX3090_PEAK_FLOPS`` = 35.58e12 FP32 FLOP/s, NVIDIA's figure for the
  GeForce RTX 3090 (NVIDIA Ampere GA102 GPU Architecture whitepaper, v2.0, 2021: 10496 CUDA
  cores x 2 FLOP x 1.695 GHz boost), the GPU whose MLP cycles the paper's prototype
  replays (docs/paper.md, Evaluation). Achieved throughput = peak x ``efficiency``, default
  ``DEFAULT_EFFICIENCY`` = 0.5: a project assumption, not a measurement. Half of GA102's
  FP32 lanes are shared with INT32, so dense SGEMM sustains well below the dual-issue peak,
  and DLRM's layers include skinny GEMMs (13 inputs, 1 output) that reach far less; 0.5 is a
  round middle value, a parameter to sweep, and is not tuned to any paper figure.
- Phases, in execution order: bottom forward, interaction forward, top forward, top
  backward, interaction backward, bottom backward (``MlpTiming.phases``, cycles each).
- ``cache_window(timing, cycle_in_batch)`` / ``GpuAgent.cache_window(cycle)``: True only
  while the GPU answers CXL.cache requests for relaxed MLP logging. The paper (Relaxations,
  p.71) says the GPU answers them "only during feature interaction and top-MLP"; here that is
  the contiguous interval from the end of the bottom forward to the end of the interaction
  backward (interaction fwd + top fwd + top bwd + interaction bwd). ``cycle_in_batch``
  counts from the start of the batch's MLP work; cycles past the MLP total are outside.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from hw.common.cxl_mem import LINE_BYTES
from hw.config import DeviceConfig
from hw.ndp.command import FLOATS_PER_LINE
from sim.model.checkpoint import values_to_lines
from sim.model.dlrm import DlrmPreset, get_preset

RTX3090_PEAK_FLOPS = 35.58e12
DEFAULT_EFFICIENCY = 0.5
DEFAULT_CLOCK_MHZ = DeviceConfig.clock_mhz
PHASES = ("bottom_fwd", "interaction_fwd", "top_fwd", "top_bwd", "interaction_bwd", "bottom_bwd")


def _preset(model: DlrmPreset | str) -> DlrmPreset:
    return get_preset(model) if isinstance(model, str) else model


@dataclass(frozen=True)
class MlpLayer:
    name: str
    fan_in: int
    fan_out: int
    w_offset: int                # float offset of the weight (fan_out x fan_in, row-major)
    b_offset: int                # float offset of the bias (fan_out)

    @property
    def params(self) -> int:
        return self.fan_in * self.fan_out + self.fan_out


def mlp_layers(model: DlrmPreset | str) -> list[MlpLayer]:
    """Bottom then top MLP layers (top input = the interaction width) with image offsets."""
    p = _preset(model)
    widths = [("bottom", p.bottom_mlp), ("top", (p.interaction_width, *p.top_mlp))]
    out, offset = [], 0
    for part, w in widths:
        for i, (a, b) in enumerate(zip(w, w[1:])):
            out.append(MlpLayer(f"{part}{i}", a, b, offset, offset + a * b))
            offset += a * b + b
    return out


def mlp_param_count(model: DlrmPreset | str) -> int:
    return sum(layer.params for layer in mlp_layers(model))


def mlp_image_lines(model: DlrmPreset | str) -> int:
    return -(-mlp_param_count(model) // FLOATS_PER_LINE)


# --------------------------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MlpTiming:
    model: str
    batch_size: int
    clock_mhz: float
    efficiency: float
    flops: dict[str, float]          # per phase, whole batch
    phases: dict[str, int]           # cycles per phase (ceil)

    @property
    def total_flops(self) -> float:
        return sum(self.flops.values())

    @property
    def total_cycles(self) -> int:
        return sum(self.phases.values())

    @property
    def seconds(self) -> float:
        return self.total_cycles / (self.clock_mhz * 1e6)

    @property
    def window(self) -> tuple[int, int]:
        """[start, end) cycles in which the GPU answers CXL.cache (interaction + top MLP)."""
        start = self.phases["bottom_fwd"]
        end = start + sum(self.phases[p] for p in ("interaction_fwd", "top_fwd", "top_bwd", "interaction_bwd"))
        return start, end


def _forward_flops_per_sample(p: DlrmPreset) -> dict[str, float]:
    def mlp(widths):
        return float(sum(2 * a * b for a, b in zip(widths, widths[1:])))
    f = p.num_tables + 1
    return {"bottom": mlp(p.bottom_mlp), "interaction": float(2 * f * f * p.bottom_mlp[-1]),
            "top": mlp((p.interaction_width, *p.top_mlp))}


def mlp_timing(model: DlrmPreset | str, batch_size: int | None = None, clock_mhz: float = DEFAULT_CLOCK_MHZ,
               efficiency: float = DEFAULT_EFFICIENCY, peak_flops: float = RTX3090_PEAK_FLOPS) -> MlpTiming:
    """Per-phase FLOPs and device cycles of one batch's MLP work (see the module docstring)."""
    p = _preset(model)
    batch_size = p.batch_size if batch_size is None else batch_size
    if batch_size < 1 or clock_mhz <= 0 or not 0 < efficiency <= 1:
        raise ValueError("batch_size >= 1, clock_mhz > 0 and efficiency in (0, 1] required")
    fwd = _forward_flops_per_sample(p)
    flops = {"bottom_fwd": fwd["bottom"], "interaction_fwd": fwd["interaction"], "top_fwd": fwd["top"],
             "top_bwd": 2 * fwd["top"], "interaction_bwd": 2 * fwd["interaction"], "bottom_bwd": 2 * fwd["bottom"]}
    flops = {k: v * batch_size for k, v in flops.items()}
    rate = peak_flops * efficiency / (clock_mhz * 1e6)       # FLOP per device cycle
    phases = {k: int(-(-flops[k] // rate)) for k in PHASES}
    return MlpTiming(p.name, batch_size, clock_mhz, efficiency, flops, phases)


def mlp_time_cycles(model: DlrmPreset | str, batch_size: int | None = None, clock_mhz: float = DEFAULT_CLOCK_MHZ,
                    efficiency: float = DEFAULT_EFFICIENCY) -> int:
    """Device cycles of one batch's bottom + interaction + top MLP forward and backward."""
    return mlp_timing(model, batch_size, clock_mhz, efficiency).total_cycles


def cache_window(timing: MlpTiming, cycle_in_batch: int) -> bool:
    start, end = timing.window
    return start <= cycle_in_batch < end


# --------------------------------------------------------------------------------------------
# the agent
# --------------------------------------------------------------------------------------------
class GpuAgent:
    """MLP parameters of a preset in a home agent's memory (see the module docstring)."""

    def __init__(self, model: DlrmPreset | str, home_agent=None, base_line: int = 0, *, seed: int = 0,
                 lr: float | None = None, grad_scale: float = 1e-3,
                 step_fn: Callable[[np.ndarray, int], np.ndarray] | None = None,
                 batch_size: int | None = None, clock_mhz: float = DEFAULT_CLOCK_MHZ,
                 efficiency: float = DEFAULT_EFFICIENCY, cache_size: int = 8):
        self.model = _preset(model)
        self.layers = mlp_layers(self.model)
        self.params = sum(layer.params for layer in self.layers)
        self.lines = -(-self.params // FLOATS_PER_LINE)
        self.ha = home_agent
        self.base_line = base_line
        self.seed = seed
        self.lr = self.model.optimizer.lr if lr is None else lr
        self.grad_scale = grad_scale
        self.step_fn = step_fn or self.pseudo_sgd_step
        self.timing = mlp_timing(self.model, batch_size, clock_mhz, efficiency)
        self.batch: int | None = None
        self.resident_lines = self.lines
        self._cache_size = max(1, cache_size)
        self._cache: dict[int, np.ndarray] = {0: self._initial()}
        if home_agent is not None:
            last = base_line + self.lines - 1
            if not (home_agent.is_host_line(base_line) and home_agent.is_host_line(last)):
                raise ValueError(f"MLP image lines {base_line:#x}..{last:#x} are not host/GPU memory of the home agent")

    @property
    def image_bytes(self) -> int:
        return self.lines * LINE_BYTES

    def _initial(self) -> np.ndarray:
        rng = np.random.default_rng([self.seed, 0x4D4C50])
        vec = np.zeros(self.lines * FLOATS_PER_LINE, dtype=np.float32)
        for layer in self.layers:
            a, b = layer.fan_in, layer.fan_out
            vec[layer.w_offset:layer.w_offset + a * b] = rng.normal(0.0, np.sqrt(2.0 / (a + b)), a * b)
            vec[layer.b_offset:layer.b_offset + b] = rng.normal(0.0, np.sqrt(1.0 / b), b)
        return vec

    def pseudo_sgd_step(self, params: np.ndarray, k: int) -> np.ndarray:
        """p - fp32(lr) * g_k with seeded pseudo-gradients (padding stays zero)."""
        g = np.random.default_rng([self.seed, 0x475244, k]).standard_normal(self.params).astype(np.float32)
        g *= np.float32(self.grad_scale)
        out = params.copy()
        out[:self.params] = params[:self.params] - np.float32(self.lr) * g
        return out

    def unflatten(self, vec: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        """(W (out, in), b (out)) views per layer of a flat image."""
        return [(vec[ly.w_offset:ly.w_offset + ly.fan_in * ly.fan_out].reshape(ly.fan_out, ly.fan_in),
                 vec[ly.b_offset:ly.b_offset + ly.fan_out]) for ly in self.layers]

    def params_at(self, k: int) -> np.ndarray:
        """The padded fp32 image after k applied batches (a copy)."""
        if k < 0:
            raise ValueError(f"batch {k} < 0")
        start = max(j for j in self._cache if j <= k)
        vec = self._cache[start]
        for j in range(start, k):
            vec = np.asarray(self.step_fn(vec, j), dtype=np.float32)
            if vec.shape != (self.lines * FLOATS_PER_LINE,):
                raise ValueError(f"step_fn returned shape {vec.shape}")
        if k not in self._cache:
            self._cache[k] = vec
            extra = sorted(j for j in self._cache if j)[:-self._cache_size]
            for j in extra:
                del self._cache[j]
        return vec.copy()

    def image_lines(self, k: int, count: int | None = None) -> list[int]:
        count = self.lines if count is None else count
        return values_to_lines(self.params_at(k)[:count * FLOATS_PER_LINE])

    def advance(self, k: int) -> None:
        """Write params_at(k) into the home agent's memory (the GPU now trains batch k)."""
        if self.ha is None:
            raise ValueError("no home agent attached")
        for i, v in enumerate(self.image_lines(k, self.resident_lines)):
            self.ha.write_memory(self.base_line + i, v)
        self.batch = k

    def read_image(self) -> list[int]:
        """The image lines as the home agent's memory holds them now."""
        return [self.ha.read_memory(self.base_line + i) for i in range(self.lines)]

    def mlp_time_cycles(self) -> int:
        return self.timing.total_cycles

    def cache_window(self, cycle_in_batch: int) -> bool:
        return cache_window(self.timing, cycle_in_batch)
