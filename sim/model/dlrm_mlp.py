"""A real numpy DLRM MLP in fp32: bottom MLP, dot feature interaction, top MLP, BCE loss, backward, SGD.

Contract
--------
``DlrmMlp(preset)`` (a ``DlrmPreset`` or a preset name) works on the flat padded fp32 MLP image of
sim/bfm/gpu_agent.py: the layer layout (fan_in, fan_out, w_offset, b_offset) comes from
``gpu_agent.mlp_layers`` (bottom ``bottom0..`` then top ``top0..``; W is (out, in) row-major as
``nn.Linear.weight``), and the image has ``gpu_agent.mlp_image_lines * 16`` floats (``size``).

``forward_backward(params, dense, pooled, labels) -> MlpStep`` for one batch of B >= 1 samples:

- ``params``: the image, shape (size,); ``dense``: (B, num_dense); ``pooled``: one (B, dim_t)
  array per table (the pooled embedding-bag outputs, table order); ``labels``: (B,) in [0, 1].
  All are cast to float32 (no copy when they already are).
- ``MlpStep.loss``: mean binary cross-entropy over the batch (Python float of the fp32 value);
  ``grad_params``: d loss / d params, an fp32 image of the same shape, padding exactly zero;
  ``grad_pooled``: list of (B, dim_t) fp32, d loss / d pooled[t]; ``probs``: (B,) fp32 outputs.

``forward(params, dense, pooled) -> probs`` is the forward pass alone.
``sgd(params, grad_params, lr)`` returns ``fma(-fp32(lr), grad_params, params)`` in fp32, one
rounding per element as torch's ``p.add_(g, alpha=-lr)`` (ATen's add kernel fuses the
multiply-add), and as the device's UPDATE does for the tables (a new array; the zero padding
of a valid image stays zero since its gradient is zero).
``tril_pairs(F)``, ``dot_interaction(T)`` and ``dot_interaction_backward(T, g)`` are the
interaction on its own (T: (B, F, d)).

DLRM semantics (facebookresearch/dlrm ``dlrm_s_pytorch.py``, ``DLRM_Net``, run with
``--arch-interaction-op=dot``, ``--arch-interaction-itself`` False, ``--loss-function=bce``):

- ``create_mlp``: every layer is ``nn.Linear`` followed by ReLU, except layer ``sigmoid_layer``
  which is followed by Sigmoid; the script passes ``sigmoid_bot=-1`` (so the bottom MLP has a
  ReLU after every layer, the last included) and ``sigmoid_top=ln_top.size - 2`` (the last top
  layer is Linear + Sigmoid, all others Linear + ReLU).
- ``interact_features`` (dot): ``T = cat([x] + ly).view(B, -1, d)`` (F = tables + 1 rows, the
  bottom output first), ``Z = bmm(T, T^T)``, ``Zflat = Z[:, li, lj]`` with
  ``li = [i for i in range(F) for j in range(i)]``, ``lj = [j for i in range(F) for j in range(i)]``
  (the strictly lower triangle row by row: (1,0), (2,0), (2,1), (3,0), ...), ``R = cat([x, Zflat])``.
- Loss: ``torch.nn.BCELoss(reduction="mean")`` on the sigmoid output; ``--loss-threshold``
  defaults to 0.0, so DLRM does not clamp the probabilities. This module follows PyTorch's
  BCELoss and Sigmoid kernels, not the fused logit form: per sample
  ``-(y * max(log p, -100) + (1 - y) * max(log(1 - p), -100))``; backward
  ``dL/dp = (p - y) / max(p (1 - p), 1e-12) / B`` then ``dL/dz = dL/dp * (1 - p) * p``. So a
  saturated fp32 output (p == 0 or 1) gives a zero gradient, exactly as DLRM on PyTorch does.
  The sigmoid itself is evaluated in the overflow-free form (exp(-|z|)).
- ReLU backward passes the gradient where the ReLU output is > 0 (PyTorch ``threshold_backward``).

Mixed dims (project extension, not DLRM): DLRM requires every table dim == the bottom MLP's
output width d (it exits otherwise, unless ``--md-flag`` adds trainable projections that are not
part of this image). Presets such as ``rm-tiny`` mix dims 16 and 32 with d = 32; here a pooled
vector narrower than d is zero-padded to d (a fixed projection [I 0], no parameters), so its dot
products use its own entries only, and its ``grad_pooled`` is the first dim_t columns of the
padded gradient. A table wider than d is rejected (ValueError). With equal dims (every paper
preset) this is exactly DLRM.

Numerics: all arithmetic is float32 (np.matmul / einsum on fp32 arrays, fp32 reductions). Results
are deterministic for the same inputs on the same machine and BLAS thread count. Bit-exactness
against PyTorch is NOT claimed (summation orders differ); tests/test_dlrm_mlp.py checks closeness
to a PyTorch build of the same network. Performance: per layer one GEMM forward and two backward
(the input gradient of the first bottom layer is skipped), weight gradients are written straight
into the gradient image, and the interaction is one batched matmul each way.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.bfm.gpu_agent import FLOATS_PER_LINE, MlpLayer, mlp_image_lines, mlp_layers
from sim.model.dlrm import DlrmPreset, get_preset

F32 = np.float32
BCE_LOG_CLAMP = F32(-100.0)      # PyTorch BCELoss clamps log(p) and log(1-p) at -100
BCE_EPSILON = F32(1e-12)         # PyTorch BCELoss backward: (p - y) / max(p (1 - p), 1e-12)


@dataclass(frozen=True)
class MlpStep:
    loss: float                      # mean BCE over the batch
    grad_params: np.ndarray          # (size,) fp32, padding zero
    grad_pooled: list[np.ndarray]    # per table (B, dim_t) fp32
    probs: np.ndarray                # (B,) fp32


def tril_pairs(f: int) -> tuple[np.ndarray, np.ndarray]:
    """DLRM's (li, lj): the strictly lower triangle of an f x f matrix, row by row."""
    li = np.array([i for i in range(f) for _ in range(i)], dtype=np.intp)
    lj = np.array([j for i in range(f) for j in range(i)], dtype=np.intp)
    return li, lj


def dot_interaction(t: np.ndarray) -> np.ndarray:
    """Zflat (B, F(F-1)/2) of T (B, F, d): Z = T @ T^T at DLRM's (li, lj)."""
    li, lj = tril_pairs(t.shape[1])
    z = np.matmul(t, t.transpose(0, 2, 1))
    return z[:, li, lj]


def dot_interaction_backward(t: np.ndarray, g_zflat: np.ndarray) -> np.ndarray:
    """d loss / d T from d loss / d Zflat: (G + G^T) @ T with G the scattered lower triangle."""
    b, f, _ = t.shape
    li, lj = tril_pairs(f)
    g = np.zeros((b, f, f), dtype=F32)
    g[:, li, lj] = g_zflat
    g += g.transpose(0, 2, 1)        # li > lj: the two triangles do not overlap
    return np.matmul(g, t)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(z))
    one = F32(1.0)
    return np.where(z >= 0, one / (one + e), e / (one + e)).astype(F32, copy=False)


SGD_CHUNK = 1 << 20              # elements per fma call: bounds the float64 temporaries


def sgd(params: np.ndarray, grad_params: np.ndarray, lr: float) -> np.ndarray:
    """fma(-fp32(lr), grad_params, params): params - lr * grad rounded once, in fp32 (a new array)."""
    from sim.model.embedding import fma_f32
    params = np.asarray(params, dtype=F32)
    grad_params = np.asarray(grad_params, dtype=F32)
    if params.shape != grad_params.shape:
        raise ValueError(f"params {params.shape} and grad {grad_params.shape} differ in shape")
    out = np.empty_like(params)
    flat_p, flat_g, flat_o = params.reshape(-1), grad_params.reshape(-1), out.reshape(-1)
    neg_lr = -F32(lr)
    for i in range(0, flat_p.size, SGD_CHUNK):
        flat_o[i:i + SGD_CHUNK] = fma_f32(neg_lr, flat_g[i:i + SGD_CHUNK], flat_p[i:i + SGD_CHUNK])
    return out


class DlrmMlp:
    """The MLP part of DLRM on a flat fp32 parameter image (see the module docstring)."""

    def __init__(self, preset: DlrmPreset | str):
        self.preset = get_preset(preset) if isinstance(preset, str) else preset
        p = self.preset
        self.layers: list[MlpLayer] = mlp_layers(p)
        self.bottom = [ly for ly in self.layers if ly.name.startswith("bottom")]
        self.top = [ly for ly in self.layers if ly.name.startswith("top")]
        self.size = mlp_image_lines(p) * FLOATS_PER_LINE
        self.dim = p.bottom_mlp[-1]
        self.num_features = p.num_tables + 1
        self.table_dims = tuple(t.dim for t in p.tables)
        wide = [i for i, d in enumerate(self.table_dims) if d > self.dim]
        if wide:
            raise ValueError(f"tables {wide} are wider than the bottom MLP output ({self.dim}); "
                             "the dot interaction needs dim <= bottom_mlp[-1]")
        if p.top_mlp[-1] != 1:
            raise ValueError(f"the top MLP must end in 1 output, got {p.top_mlp}")

    # ------------------------------------------------------------------------------------
    def _views(self, vec: np.ndarray, ly: MlpLayer) -> tuple[np.ndarray, np.ndarray]:
        w = vec[ly.w_offset:ly.w_offset + ly.fan_in * ly.fan_out].reshape(ly.fan_out, ly.fan_in)
        return w, vec[ly.b_offset:ly.b_offset + ly.fan_out]

    def _check(self, params, dense, pooled, labels=None):
        params = np.asarray(params, dtype=F32)
        if params.shape != (self.size,):
            raise ValueError(f"params shape {params.shape}, expected ({self.size},) for {self.preset.name}")
        dense = np.ascontiguousarray(dense, dtype=F32)
        if dense.ndim != 2 or dense.shape[1] != self.preset.num_dense or dense.shape[0] < 1:
            raise ValueError(f"dense shape {dense.shape}, expected (B >= 1, {self.preset.num_dense})")
        b = dense.shape[0]
        if len(pooled) != self.preset.num_tables:
            raise ValueError(f"{len(pooled)} pooled arrays, expected {self.preset.num_tables}")
        pooled = [np.asarray(x, dtype=F32) for x in pooled]
        for i, (x, d) in enumerate(zip(pooled, self.table_dims)):
            if x.shape != (b, d):
                raise ValueError(f"pooled[{i}] shape {x.shape}, expected ({b}, {d})")
        if labels is not None:
            labels = np.asarray(labels, dtype=F32).reshape(-1)
            if labels.shape != (b,):
                raise ValueError(f"labels shape {labels.shape}, expected ({b},)")
        return params, dense, pooled, labels

    def _forward(self, params, dense, pooled):
        """Activations for the backward pass and the probabilities."""
        acts = [dense]                                  # input of every layer, then the bottom output
        x = dense
        for ly in self.bottom:
            w, bias = self._views(params, ly)
            x = np.matmul(x, w.T)
            x += bias
            np.maximum(x, F32(0.0), out=x)
            acts.append(x)
        b = dense.shape[0]
        t = np.zeros((b, self.num_features, self.dim), dtype=F32)
        t[:, 0, :] = x
        for i, e in enumerate(pooled):
            t[:, i + 1, :e.shape[1]] = e
        r = np.concatenate([x, dot_interaction(t)], axis=1)
        top_in = [r]
        h = r
        for n, ly in enumerate(self.top):
            w, bias = self._views(params, ly)
            h = np.matmul(h, w.T)
            h += bias
            if n < len(self.top) - 1:
                np.maximum(h, F32(0.0), out=h)
                top_in.append(h)
        probs = _sigmoid(h[:, 0])
        return acts, t, top_in, probs

    def forward(self, params: np.ndarray, dense: np.ndarray, pooled: list[np.ndarray]) -> np.ndarray:
        """The output probabilities (B,) fp32."""
        params, dense, pooled, _ = self._check(params, dense, pooled)
        return self._forward(params, dense, pooled)[3]

    def forward_backward(self, params: np.ndarray, dense: np.ndarray, pooled: list[np.ndarray],
                         labels: np.ndarray) -> MlpStep:
        """Loss, parameter and pooled-embedding gradients of one batch (see the module docstring)."""
        params, dense, pooled, y = self._check(params, dense, pooled, labels)
        acts, t, top_in, p = self._forward(params, dense, pooled)
        b = dense.shape[0]
        one = F32(1.0)

        # BCELoss (mean) as PyTorch computes it, then Sigmoid backward.
        with np.errstate(divide="ignore"):                # log(0) = -inf, then clamped as PyTorch does
            logp = np.maximum(np.log(p), BCE_LOG_CLAMP)
            log1mp = np.maximum(np.log(one - p), BCE_LOG_CLAMP)
        loss = -np.mean(y * logp + (one - y) * log1mp, dtype=F32)
        g_p = (p - y) / np.maximum((one - p) * p, BCE_EPSILON) * (one / F32(b))
        g = (g_p * ((one - p) * p)).astype(F32, copy=False)[:, None]       # (B, 1) d loss / d logit

        grad = np.zeros(self.size, dtype=F32)
        # top MLP, last layer first; g is d loss / d (pre-activation output) of the layer
        for n in range(len(self.top) - 1, -1, -1):
            ly = self.top[n]
            w, _ = self._views(params, ly)
            gw, gb = self._views(grad, ly)
            x = top_in[n]
            np.matmul(g.T, x, out=gw)
            gb[:] = g.sum(axis=0, dtype=F32)
            g = np.matmul(g, w)                          # d loss / d x
            if n > 0:
                g *= x > 0                               # ReLU of the previous layer's output
        # interaction: R = [x_bottom, Zflat]
        g_t = dot_interaction_backward(t, g[:, self.dim:])
        g_t[:, 0, :] += g[:, :self.dim]
        grad_pooled = [np.ascontiguousarray(g_t[:, i + 1, :d]) for i, d in enumerate(self.table_dims)]
        # bottom MLP (ReLU after every layer, the last included)
        g = g_t[:, 0, :]
        for n in range(len(self.bottom) - 1, -1, -1):
            ly = self.bottom[n]
            g = g * (acts[n + 1] > 0)
            w, _ = self._views(params, ly)
            gw, gb = self._views(grad, ly)
            np.matmul(g.T, acts[n], out=gw)
            gb[:] = g.sum(axis=0, dtype=F32)
            if n > 0:
                g = np.matmul(g, w)
        return MlpStep(loss=float(loss), grad_params=grad, grad_pooled=grad_pooled, probs=p)
