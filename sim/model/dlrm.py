"""DLRM model presets: the shapes the traces, the golden model and the system harness share.

Contract
--------
``PRESETS`` maps a preset name to a frozen ``DlrmPreset``; ``get_preset(name)`` looks one up
with a clear error. Names: ``rm1``..``rm4`` (TrainingCXL paper, Table 3), ``kaggle`` and
``terabyte`` (facebookresearch/dlrm), ``dcnv2`` (MLPerf DLRM-DCNv2), ``rm-tiny`` (tests).

A preset fixes, per embedding table: rows (already capped, see below), dim, pooling mode
(``sum`` | ``mean`` | ``weighted_sum``, the table descriptor's mode in architecture.md §4),
the bag-length distribution (``PoolingDistribution``: fixed / uniform / normal around the
nominal lookups per sample) and the Zipf alpha of its index distribution. Per model: bottom
and top MLP layer widths as written in the sources, dense feature count (= bottom MLP input),
batch size, optimizer and learning rate.

The top MLP widths are the ``--arch-mlp-top`` of DLRM: DLRM prepends the feature-interaction
width, ``DlrmPreset.interaction_width`` = F*(F-1)/2 + dim with F = tables + 1 (dot
interaction), which is therefore not listed.

Row counts (the papers are silent for RM1-RM3; real cardinalities elsewhere) are capped so a
full table set fits the golden model on a 2-core / 24 GiB machine:
- ``ROWS_CAP_LARGE`` = 2**18 rows per table for the real-cardinality presets (kaggle, rm4,
  terabyte, dcnv2): smaller real tables keep their real size. Largest footprints: dcnv2
  ~1.0 GiB of fp32 tables (dim 128), terabyte ~0.5 GiB, rm4 ~0.23 GiB, kaggle ~0.11 GiB.
- ``ROWS_RANDOM`` = 2**16 rows per table for RM1-RM3 (random datasets): RM1/RM3 160 MiB,
  RM2 640 MiB.
- ``rm-tiny`` is 151 KiB of tables, for quick runs. The 1 GiB simulated device holds RM1-RM4
  with their arguments (RM2 leaves no room for both checkpoint logs); a smaller ``rows_cap``
  (trace knob) shrinks a preset: e.g. rm1 at rows_cap 1024 is 2.5 MiB.
``DlrmPreset.table_bytes`` reports a preset's fp32 table footprint.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# Caps on rows per table (see the module docstring for the footprints they give).
ROWS_CAP_LARGE = 1 << 18
ROWS_RANDOM = 1 << 16

POOLING_MODES = ("sum", "mean", "weighted_sum")
LENGTH_KINDS = ("fixed", "uniform", "normal")

# Criteo Kaggle cardinalities (dlrm-workloads.md), 33.76 M rows in all.
KAGGLE_ROWS = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992,
               5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572)
# MLPerf DLRM / DCNv2 (Criteo 1TB, capped at 40 M by MLPerf) cardinalities.
MLPERF_ROWS = (40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10, 2209,
               11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36)
DCNV2_LOOKUPS = (3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1)

# FBGEMM's benchmark recommends Zipf alpha 1.15 for training traces.
ZIPF_ALPHA_TRAINING = 1.15


@dataclass(frozen=True)
class PoolingDistribution:
    """Bag length (pooling factor) distribution of one table.

    ``fixed``: every bag has ``mean`` indices. ``uniform``: integer uniform in [1, mean]
    (DLRM's own random generator). ``normal``: round(N(mean, std)) clipped to [1, max_len].
    ``empty_prob`` then empties a bag with that probability (L = 0).
    """
    kind: str = "fixed"
    mean: int = 1
    std: float = 0.0
    max_len: int = 0          # 0: 2 * mean (normal only)
    empty_prob: float = 0.0

    def __post_init__(self):
        if self.kind not in LENGTH_KINDS:
            raise ValueError(f"pooling kind {self.kind!r} not in {LENGTH_KINDS}")
        if self.mean < 0:
            raise ValueError(f"pooling mean must be >= 0, got {self.mean}")
        if not 0.0 <= self.empty_prob <= 1.0:
            raise ValueError(f"empty_prob must be in [0, 1], got {self.empty_prob}")

    @property
    def upper(self) -> int:
        """Largest bag length this distribution can produce."""
        if self.kind == "normal":
            return self.max_len or 2 * self.mean
        return self.mean


@dataclass(frozen=True)
class TableSpec:
    rows: int
    dim: int
    pooling: PoolingDistribution
    mode: str = "sum"
    alpha: float = ZIPF_ALPHA_TRAINING   # Zipf exponent of the row ranks; 0 = uniform

    def __post_init__(self):
        if self.rows < 1:
            raise ValueError(f"rows must be >= 1, got {self.rows}")
        # architecture.md §4: a row is a whole number of 64-byte lines (16 floats).
        if self.dim < 16 or self.dim % 16:
            raise ValueError(f"dim must be a positive multiple of 16, got {self.dim}")
        if self.mode not in POOLING_MODES:
            raise ValueError(f"pooling mode {self.mode!r} not in {POOLING_MODES}")
        if self.alpha < 0:
            raise ValueError(f"Zipf alpha must be >= 0, got {self.alpha}")

    @property
    def lookups(self) -> int:
        """Nominal lookups per sample (the bag length of a fixed distribution)."""
        return self.pooling.mean


@dataclass(frozen=True)
class Optimizer:
    name: str = "sgd"            # "sgd" (golden model) or "rowwise_adagrad" (named only)
    lr: float = 0.1
    eps: float = 0.0             # Adagrad only


@dataclass(frozen=True)
class DlrmPreset:
    name: str
    tables: tuple[TableSpec, ...]
    bottom_mlp: tuple[int, ...]
    top_mlp: tuple[int, ...]
    batch_size: int
    optimizer: Optimizer
    note: str = ""

    @property
    def num_tables(self) -> int:
        return len(self.tables)

    @property
    def num_dense(self) -> int:
        return self.bottom_mlp[0]

    @property
    def interaction_width(self) -> int:
        """Input width of the top MLP that DLRM prepends (dot interaction)."""
        f = self.num_tables + 1
        return f * (f - 1) // 2 + self.bottom_mlp[-1]

    @property
    def table_bytes(self) -> int:
        return sum(t.rows * t.dim * 4 for t in self.tables)

    @property
    def lookups_per_sample(self) -> int:
        return sum(t.lookups for t in self.tables)

    def replace(self, **changes) -> "DlrmPreset":
        return dataclasses.replace(self, **changes)

    def with_rows_cap(self, cap: int) -> "DlrmPreset":
        """The same model with every table capped at ``cap`` rows."""
        if cap < 1:
            raise ValueError(f"rows cap must be >= 1, got {cap}")
        return self.replace(tables=tuple(dataclasses.replace(t, rows=min(t.rows, cap)) for t in self.tables))


def _tables(rows: tuple[int, ...], dim: int, lookups, cap: int | None = None) -> tuple[TableSpec, ...]:
    """Fixed-length, SUM-pooled tables at the training Zipf alpha; ``lookups`` an int or per table."""
    per_table = lookups if isinstance(lookups, tuple) else (lookups,) * len(rows)
    return tuple(TableSpec(rows=min(r, cap) if cap else r, dim=dim, pooling=PoolingDistribution("fixed", n))
                 for r, n in zip(rows, per_table, strict=True))


def _repeat(value, n):
    return tuple([value] * n)


# Batch size for RM1-RM4: the paper is silent; 2048 is DLRM Terabyte's / MLPerf's per-GPU batch.
PAPER_BATCH = 2048
# Optimizer for RM1-RM4: the paper is silent; DLRM's SGD with its Kaggle lr 0.1.
PAPER_OPTIMIZER = Optimizer("sgd", 0.1)

PRESETS: dict[str, DlrmPreset] = {}


def _register(p: DlrmPreset) -> DlrmPreset:
    PRESETS[p.name] = p
    return p


RM1 = _register(DlrmPreset(
    "rm1", _tables(_repeat(ROWS_RANDOM, 20), 32, 80), (13, 8192, 2048, 32), (256, 64, 1), PAPER_BATCH,
    PAPER_OPTIMIZER, "TrainingCXL Table 3; random inputs with Kaggle-like Zipf skew; rows 2**16 chosen"))
RM2 = _register(DlrmPreset(
    "rm2", _tables(_repeat(ROWS_RANDOM, 80), 32, 80), (13, 8192, 2048, 32), (512, 128, 1), PAPER_BATCH,
    PAPER_OPTIMIZER, "TrainingCXL Table 3; rows 2**16 chosen"))
RM3 = _register(DlrmPreset(
    "rm3", _tables(_repeat(ROWS_RANDOM, 20), 32, 20), (13, 10240, 4096, 32), (512, 128, 1), PAPER_BATCH,
    PAPER_OPTIMIZER, "TrainingCXL Table 3; rows 2**16 chosen"))
# RM4 has 52 tables of Criteo Kaggle: the 26 Kaggle cardinalities twice (the paper does not
# say how 26 features became 52 tables).
RM4 = _register(DlrmPreset(
    "rm4", _tables(KAGGLE_ROWS * 2, 16, 1, cap=ROWS_CAP_LARGE), (13, 16384, 2048, 512, 16), (512, 128, 1),
    PAPER_BATCH, PAPER_OPTIMIZER, "TrainingCXL Table 3; Kaggle cardinalities twice, capped at 2**18"))
KAGGLE = _register(DlrmPreset(
    "kaggle", _tables(KAGGLE_ROWS, 16, 1, cap=ROWS_CAP_LARGE), (13, 512, 256, 64, 16), (512, 256, 1), 128,
    Optimizer("sgd", 0.1), "DLRM Criteo Kaggle (one-hot); rows capped at 2**18"))
# Terabyte: the MLPerf (40 M-capped) Criteo 1TB cardinalities, further capped; DLRM's
# Terabyte script uses SGD lr 0.1 (MLPerf v1 uses 1.0).
TERABYTE = _register(DlrmPreset(
    "terabyte", _tables(MLPERF_ROWS, 64, 1, cap=ROWS_CAP_LARGE), (13, 512, 256, 64), (512, 512, 256, 1), 2048,
    Optimizer("sgd", 0.1), "DLRM Criteo Terabyte; rows capped at 2**18"))
# DCNv2: multi-hot, duplicates allowed in a bag, row-wise Adagrad. The batch is MLPerf's
# global 65536 (14 M indices per batch); use the batch-size knob to shrink it.
DCNV2 = _register(DlrmPreset(
    "dcnv2", _tables(MLPERF_ROWS, 128, DCNV2_LOOKUPS, cap=ROWS_CAP_LARGE), (13, 512, 256, 128),
    (1024, 1024, 512, 256, 1), 65536, Optimizer("rowwise_adagrad", 0.005, 1e-8),
    "MLPerf DLRM-DCNv2 multi-hot; DCN (3 layers, rank 512) precedes the top MLP; rows capped at 2**18"))
# rm-tiny: for tests. Mixed dims, all three pooling modes, all three length distributions,
# a table smaller than a bag can be without duplicates, and small rows so a full golden
# run takes milliseconds. 151 KiB of tables.
RM_TINY = _register(DlrmPreset(
    "rm-tiny",
    (TableSpec(1000, 16, PoolingDistribution("fixed", 4), "sum", 1.15),
     TableSpec(512, 32, PoolingDistribution("uniform", 8, empty_prob=0.1), "mean", 1.05),
     TableSpec(257, 16, PoolingDistribution("normal", 3, std=2.0, max_len=8), "weighted_sum", 0.0),
     TableSpec(64, 32, PoolingDistribution("fixed", 2), "sum", 1.3)),
    (13, 64, 32), (64, 16, 1), 8, Optimizer("sgd", 0.05), "test preset"))


def get_preset(name: str) -> DlrmPreset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown DLRM preset {name!r}; known: {', '.join(PRESETS)}") from None
