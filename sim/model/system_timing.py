"""Batch time and energy of the five system configurations, composed from the RTL's measured cycles.

Contract
--------
``compose(config, work, measured, mlp, params)`` -> ``BatchResult`` for ``config`` in
``CONFIGS`` (architecture.md section 7). Inputs:

- ``work`` (``Workload``): what one batch moves, from the trace: index occurrences, the
  lines the lookups read, the distinct rows (and their lines) the update writes, pooled-output
  and gradient bytes, the MLP image lines.
- ``measured`` (``Measured``): device cycles per command from the RTL (completion
  NDP_LAST_CYCLES, sim/system.py): LOOKUP (exact and relaxed), LOG, checkpointed UPDATE, and
  an MLP_LOG of ``mlp_probe_lines`` lines (the whole-image copy is that rate times the image;
  the image does not fit the simulated device).
- ``mlp`` (sim/bfm/gpu_agent.py ``MlpTiming``): the GPU's MLP phases at the batch size.
- ``params`` (sim/model/system_params.py): host CPU, links, software costs, energy, and the
  six modelling switches (``params.modelling``; all on by default: the fair composition).

The device executes one command at a time (the RTL's command queue), the GPU one batch's MLP
at a time. Per configuration, the critical path of one steady-state batch is:

Every configuration's GPU work per batch is the same: a launch (``Software.launch_us``), the
MLP's forward and backward (``mlp``), then the dense SGD step over the MLP parameters
(``dense_sgd_ms``), which runs on the GPU while the gradients travel and the embeddings are
updated; the batch ends when both are done (the next batch's forward needs the new weights).
The switches of ``params.modelling`` turn each of these fair choices back to the earlier one
(no launch for the CXL configurations, no dense step, staged copies one after the other, the
i5-9600K's 2 PMEM channels, PCIe 3.0, lookups that miss the LLC on every occurrence).

- **pmem**: host CPU gather-reduce over host PMEM (``cpu_lookup_ms``, the lines that miss the
  LLC: ``host_traffic``); copy the pooled outputs to the GPU over PCIe; MLP; gradients back;
  host sparse SGD (``cpu_update_ms``); checkpoint at batch end: the host copies the updated
  rows into a PMEM log and the MLP image GPU -> host -> PMEM (a sequential copy at the media's
  write bandwidth, streamed behind the PCIe copy: ``staged_ms``).
- **pcie**: device LOOKUP; software copies device -> host -> GPU (each stage: a setup, bytes
  over PCIe; a completion sync before; the two stages streamed); MLP; gradients GPU -> host ->
  device; checkpoint as CXL-D, except that software copies the MLP image GPU -> host, then
  DMAs it host -> device into the log slot (PCIe, PCIe and the device's measured MLP-log write
  rate streamed); device UPDATE.
- **cxl-d**: device LOOKUP, pooled outputs pushed over CXL.cache through the switch (streams
  behind the lookup: only what is longer than the lookup and one latency are exposed); MLP;
  the GPU flushes the gradients over CXL; LOG and the whole MLP_LOG on the critical path;
  UPDATE.
- **cxl-b**: as cxl-d, but LOG and MLP_LOG run during the MLP; only what exceeds the MLP
  time stalls.
- **cxl**: cxl-b plus both relaxations. During batch k's MLP the device runs LOG(k), then
  batch k+1's LOOKUP on the old tables (relaxed lookup; its pooled outputs stream to the GPU
  meanwhile), then an MLP_LOG chunk in what is left of the GPU's CXL.cache window
  (interaction + top MLP, ``MlpTiming.window``), so the MLP log of one image spreads over
  ``mlp_log_lag_batches`` batches (at least 1/``MAX_MLP_LAG`` of the image per batch, which
  stalls if it does not fit). After UPDATE(k) the GPU patches batch k+1's pooled vectors with
  batch k's row deltas (memory bound on the GPU, ``patch_ms``).

Breakdown keys: lookup, transfer (data movement and software orchestration), mlp, update,
checkpoint_stall; their sum is the batch time. Time that overlaps the MLP is not on the
critical path and is not in the breakdown; it is in ``timeline`` (lanes host, device, gpu,
link; ms from the batch start).

Energy per batch (``energy_mj`` and its breakdown): host CPU (active while it computes,
copies or orchestrates, idle otherwise), GPU (active during the MLP and patch, idle
otherwise), PMEM modules (static power x batch time per module, plus per-line read and write
energy), link bytes x energy per bit, and the device (active while a command runs, idle
otherwise; none in the PMEM configuration).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from sim.model.system_params import DEFAULT_PARAMS, DEVICE_CHANNELS, Link, SystemParams

CONFIGS = ("pmem", "pcie", "cxl-d", "cxl-b", "cxl")
BREAKDOWN = ("lookup", "transfer", "mlp", "update", "checkpoint_stall")
MAX_MLP_LAG = 1024                 # the paper: accuracy holds with an MLP log hundreds of batches old


@dataclass(frozen=True)
class Workload:
    batch_size: int
    lookups: int                   # index occurrences in the batch
    lookup_lines: int              # 64-byte lines the lookups read (occurrences x row lines)
    unique_rows: int               # distinct (table, row) the batch updates
    unique_lines: int              # their lines
    output_bytes: int              # pooled outputs (= gradient bytes)
    image_lines: int               # MLP parameter image
    table_lines: int = 0           # every embedding table (0: unknown, taken as not fitting any cache)
    mlp_params: int = 0            # dense (MLP) parameters the GPU's SGD step updates


@dataclass(frozen=True)
class Measured:
    clock_mhz: float
    lookup_cycles: float
    lookup_relaxed_cycles: float
    log_cycles: float
    update_cycles: float
    mlp_probe_cycles: float
    mlp_probe_lines: int

    def ms(self, cycles: float) -> float:
        return cycles / (self.clock_mhz * 1e3)


@dataclass
class BatchResult:
    config: str
    batch_time_ms: float
    breakdown_ms: dict
    timeline: list
    energy_mj: float
    energy_breakdown_mj: dict
    extra: dict = field(default_factory=dict)


def transfer_ms(link: Link, nbytes: float) -> float:
    return link.latency_ns * 1e-6 + nbytes / (link.bandwidth_gbps * 1e9) * 1e3


def staged_ms(params: SystemParams, stages: list[float]) -> float:
    """A copy through several stages (each a duration for the whole copy; the software setups
    are the caller's steps): streamed chunk by chunk, the slowest stage bounds it
    (``pipelined_staging``); otherwise one stage after the other."""
    return max(stages) if params.modelling.pipelined_staging else sum(stages)


def dense_sgd_ms(params: SystemParams, w: Workload) -> float:
    """The GPU's dense SGD step: every MLP parameter's weight and gradient read and the weight
    written (12 bytes per parameter) at the GPU's memory bandwidth."""
    return 12 * w.mlp_params / (params.gpu_memory_gbps * 1e9) * 1e3 if params.modelling.dense_sgd else 0.0


def host_traffic(params: SystemParams, w: Workload) -> dict:
    """PMEM lines the PMEM host's embedding loops read and write per batch (``host_cache``):
    - tables fit in the LLC: the reads hit; only the update's write-backs (flushed for
      durability) and the log's writes reach PMEM;
    - the batch's distinct rows fit: the lookup misses each distinct line once, the update
      finds them cached and writes them back, the log copies them;
    - neither: every lookup occurrence misses; the update reads and writes each distinct line.
    Switch off: the earlier model (every lookup occurrence misses, the update's repeats hit)."""
    llc_lines = params.host.llc_bytes // params.pmem.line_bytes
    u = w.unique_lines
    if not params.modelling.host_cache or (u > llc_lines and not 0 < w.table_lines <= llc_lines):
        return {"lookup_reads": w.lookup_lines, "update_reads": u, "update_writes": u, "log_reads": u, "log_writes": u,
                "fits": "none"}
    tables_fit = 0 < w.table_lines <= llc_lines
    return {"lookup_reads": 0 if tables_fit else u, "update_reads": 0, "update_writes": u, "log_reads": 0,
            "log_writes": u, "fits": "tables" if tables_fit else "batch"}


def cpu_memory_ms(params: SystemParams, lines_read: float, lines_written: float, *, bulk: bool = False) -> float:
    """Host time to read and write random 64-byte lines of host PMEM: the larger of the
    bandwidth bound (one occupancy budget per channel, as the media model) and the latency
    bound (cores x fill buffers in flight), divided by the software efficiency (not for a
    ``bulk`` sequential copy, which streams at the bounds)."""
    h, p = params.host, params.pmem
    line = p.line_bytes
    bw = (lines_read * line / (p.read_bw_gbps * 1e9) + lines_written * line / (p.write_bw_gbps * 1e9)) \
        / params.host_channels
    lat = (lines_read * p.read_latency_ns + lines_written * p.write_latency_ns) * 1e-9 \
        / (h.cores * h.misses_in_flight_per_core)
    return max(bw, lat) / (1.0 if bulk else h.software_efficiency) * 1e3


def cpu_flops_ms(params: SystemParams, flops: float) -> float:
    h = params.host
    return flops / (h.cores * h.clock_ghz * 1e9 * h.flops_per_cycle) / h.software_efficiency * 1e3


def cpu_lookup_ms(params: SystemParams, w: Workload) -> float:
    """Gather-reduce: the lines that miss the LLC (``host_traffic``), one FMA per element of
    every occurrence (16 per line)."""
    reads = host_traffic(params, w)["lookup_reads"]
    return cpu_memory_ms(params, reads, 0) + cpu_flops_ms(params, 2 * 16 * w.lookup_lines)


def cpu_update_ms(params: SystemParams, w: Workload) -> float:
    """Sparse SGD: every occurrence's FMAs; the distinct rows' lines read (unless cached) and
    written back (``host_traffic``)."""
    t = host_traffic(params, w)
    return cpu_memory_ms(params, t["update_reads"], t["update_writes"]) \
        + cpu_flops_ms(params, 2 * 16 * w.lookup_lines)


class _Timeline:
    def __init__(self):
        self.items: list[dict] = []

    def add(self, lane: str, phase: str, start: float, dur: float) -> float:
        if dur > 0:
            self.items.append({"lane": lane, "phase": phase, "start_ms": round(start, 6),
                               "end_ms": round(start + dur, 6)})
        return start + dur

    def busy(self, lane: str, phases: tuple[str, ...] | None = None) -> float:
        return sum(i["end_ms"] - i["start_ms"] for i in self.items
                   if i["lane"] == lane and (phases is None or i["phase"] in phases))


def compose(config: str, w: Workload, m: Measured, mlp, params: SystemParams = DEFAULT_PARAMS,
            mlp_interval: int | None = None) -> BatchResult:
    """``mlp_interval`` K: one whole MLP image is logged every K batches, the same recovery
    point for every configuration (None: each configuration's own policy, the paper's: every
    batch for pmem..cxl-b, cxl spreading one image over up to MAX_MLP_LAG batches)."""
    if config not in CONFIGS:
        raise ValueError(f"config must be one of {CONFIGS}, got {config!r}")
    if mlp_interval is not None and mlp_interval < 1:
        raise ValueError(f"mlp_interval must be >= 1, got {mlp_interval}")
    if mlp_interval is not None and config != "cxl":
        return _every_k_batches(config, w, m, mlp, params, mlp_interval)
    max_lag = MAX_MLP_LAG if mlp_interval is None else mlp_interval
    sw, (pcie, cxl) = params.software, params.links
    t_mlp = mlp.seconds * 1e3
    t_sgd = dense_sgd_ms(params, w)
    launch = sw.launch_us * 1e-3
    t_lk, t_lk_rel = m.ms(m.lookup_cycles), m.ms(m.lookup_relaxed_cycles)
    t_log, t_upd = m.ms(m.log_cycles), m.ms(m.update_cycles)
    mlp_ms_per_line = m.ms(m.mlp_probe_cycles) / m.mlp_probe_lines
    t_mlplog = mlp_ms_per_line * w.image_lines
    image_bytes = w.image_lines * 64
    setup, sync = sw.copy_setup_us * 1e-3, sw.sync_us * 1e-3
    tl = _Timeline()
    bd = dict.fromkeys(BREAKDOWN, 0.0)
    link_bytes = {"pcie": 0.0, "cxl": 0.0}
    extra: dict = {}

    def step(lane, phase, key, t, dur):
        bd[key] += dur
        return tl.add(lane, phase, t, dur)

    def wait(key, t, dur):
        """Critical-path time spent waiting for work already on the timeline."""
        bd[key] += dur
        return t + dur

    def sw_copy(t, nbytes, phase, key, lane="link"):
        """One software-orchestrated copy: setup on the host, then bytes over PCIe."""
        t = step("host", "sync", key, t, setup)
        link_bytes["pcie"] += nbytes
        return step(lane, phase, key, t, transfer_ms(pcie, nbytes))

    def sw_copy_2(t, nbytes, phase, key):
        """A software copy through the host: two PCIe DMAs (device or GPU -> host -> GPU or
        device), each with its setup, streamed or one after the other (``staged_ms``)."""
        if not params.modelling.pipelined_staging:
            return sw_copy(sw_copy(t, nbytes, phase, key), nbytes, phase, key)
        t = step("host", "sync", key, t, 2 * setup)
        link_bytes["pcie"] += 2 * nbytes
        return step("link", phase, key, t, staged_ms(params, [transfer_ms(pcie, nbytes)] * 2))

    def mlp_on_gpu(t):
        """Launch, forward and backward; the dense step is queued behind them on the GPU
        (returns the MLP's end and the dense step's end)."""
        if config in ("pmem", "pcie") or params.modelling.launch_everywhere:
            t = step("host", "sync", "transfer", t, launch)
        t = step("gpu", "mlp", "mlp", t, t_mlp)
        return t, tl.add("gpu", "dense_sgd", t, t_sgd)

    t = 0.0
    if config == "pmem":
        t = step("host", "lookup", "lookup", t, cpu_lookup_ms(params, w))
        t = sw_copy(t, w.output_bytes, "transfer", "transfer")
        t, sgd_end = mlp_on_gpu(t)
        t = step("host", "sync", "transfer", t, sync)
        t = sw_copy(t, w.output_bytes, "transfer", "transfer")
        t = step("host", "update", "update", t, cpu_update_ms(params, w))
        traffic = host_traffic(params, w)
        t = step("host", "log", "checkpoint_stall", t,
                 cpu_memory_ms(params, traffic["log_reads"], traffic["log_writes"]))
        # MLP image GPU -> host (PCIe) -> host PMEM (a bulk write), streamed or staged.
        t = step("host", "sync", "checkpoint_stall", t, setup)
        link_bytes["pcie"] += image_bytes
        copy = staged_ms(params, [transfer_ms(pcie, image_bytes), cpu_memory_ms(params, 0, w.image_lines, bulk=True)])
        tl.add("link", "mlp_log", t, transfer_ms(pcie, image_bytes))
        t = step("host", "mlp_log", "checkpoint_stall", t, copy)
    elif config == "pcie":
        t = step("device", "lookup", "lookup", t, t_lk)
        t = step("host", "sync", "transfer", t, sync)
        t = sw_copy_2(t, w.output_bytes, "transfer", "transfer")         # device -> host -> GPU
        t, sgd_end = mlp_on_gpu(t)
        t = step("host", "sync", "transfer", t, sync)
        t = sw_copy_2(t, w.output_bytes, "transfer", "transfer")         # GPU -> host -> device
        t = step("device", "log", "checkpoint_stall", t, t_log)
        # MLP image GPU -> host, then host -> device DMA straight into the MLP log slot (PCIe and
        # the media's writes overlap); the two DMAs streamed or one after the other.
        t = step("host", "sync", "checkpoint_stall", t, 2 * setup)
        link_bytes["pcie"] += 2 * image_bytes
        into_device = max(t_mlplog, transfer_ms(pcie, image_bytes))
        tl.add("link", "mlp_log", t, transfer_ms(pcie, image_bytes))
        t = step("device", "mlp_log", "checkpoint_stall", t,
                 staged_ms(params, [transfer_ms(pcie, image_bytes), into_device]))
        t = step("host", "sync", "transfer", t, sync)
        t = step("device", "update", "update", t, t_upd)
    else:
        grads = transfer_ms(cxl, w.output_bytes)
        link_bytes["cxl"] += 2 * w.output_bytes
        if config in ("cxl-d", "cxl-b"):
            lookup_start = t
            t = step("device", "lookup", "lookup", t, t_lk)
            # The pooled outputs stream to the GPU behind the lookup: only the part longer than
            # the lookup, and at least one latency, is exposed.
            exposed = max(cxl.latency_ns * 1e-6, lookup_start + transfer_ms(cxl, w.output_bytes) - t)
            tl.add("link", "transfer", lookup_start, t + exposed - lookup_start)
            bd["transfer"] += exposed
            t += exposed
            mlp_start = t
            t, sgd_end = mlp_on_gpu(t)
            if config == "cxl-d":
                t = step("device", "log", "checkpoint_stall", t, t_log)
                link_bytes["cxl"] += image_bytes
                t = step("device", "mlp_log", "checkpoint_stall", t, t_mlplog)
            else:
                d = tl.add("device", "log", mlp_start, t_log)
                link_bytes["cxl"] += image_bytes
                d = tl.add("device", "mlp_log", d, t_mlplog)
                t = wait("checkpoint_stall", t, max(0.0, d - t))
            t = step("link", "transfer", "transfer", t, grads)
        else:                                                            # cxl: both relaxations
            if params.modelling.launch_everywhere:
                t = step("host", "sync", "transfer", t, launch)
            mlp_start = t
            t = step("gpu", "mlp", "mlp", t, t_mlp)
            sgd_end = tl.add("gpu", "dense_sgd", t, t_sgd)
            d = tl.add("device", "log", mlp_start, t_log)
            d = tl.add("device", "lookup", d, t_lk_rel)                   # batch k+1, old tables
            tl.add("link", "transfer", d - t_lk_rel, max(t_lk_rel, transfer_ms(cxl, w.output_bytes)))
            w0, w1 = (mlp_start + m.ms(c) for c in mlp.window)
            free = max(0.0, w1 - max(w0, d))
            chunk = min(max(free / mlp_ms_per_line, w.image_lines / max_lag), w.image_lines)
            link_bytes["cxl"] += chunk * 64
            dm = tl.add("device", "mlp_log", max(w0, d), chunk * mlp_ms_per_line)
            extra.update(mlp_log_chunk_lines=int(chunk),
                         mlp_log_lag_batches=math.ceil(w.image_lines / chunk) if chunk else 0,
                         **({} if mlp_interval is None else {"mlp_log_interval": mlp_interval}))
            over = max(0.0, dm - t)                                      # device work the MLP did not hide
            over_chunk = min(over, chunk * mlp_ms_per_line)
            over_lookup = min(over - over_chunk, t_lk_rel)
            t = wait("checkpoint_stall", t, over_chunk)
            t = wait("lookup", t, over_lookup)
            t = wait("checkpoint_stall", t, over - over_chunk - over_lookup)
            t = step("link", "transfer", "transfer", t, grads)
        t = step("device", "update", "update", t, t_upd)
    t = wait("mlp", t, max(0.0, sgd_end - t))                           # the next forward needs the new weights
    if config == "cxl":
        patch = launch + 2 * w.output_bytes / (params.gpu_memory_gbps * 1e9) * 1e3
        t = step("gpu", "patch", "lookup", t, patch)
    batch = t
    images = 1.0 / extra["mlp_log_lag_batches"] if extra.get("mlp_log_lag_batches") else 1.0
    extra["dense_sgd_ms"] = t_sgd
    if config == "pmem":
        extra["host_cache_fits"] = host_traffic(params, w)["fits"]
    energy = _energy(config, batch, tl, w, link_bytes, images, params)
    return BatchResult(config, batch, {k: v for k, v in bd.items()}, tl.items, sum(energy.values()), energy, extra)


def _every_k_batches(config: str, w: Workload, m: Measured, mlp, params: SystemParams, k: int) -> BatchResult:
    """The mean batch of K: one copies the whole MLP image at its end (as the paper's policy
    does every batch), K - 1 log only the embedding rows. Its timeline is the copying batch's."""
    full = compose(config, w, m, mlp, params)
    if k == 1:
        return dataclasses.replace(full, extra={**full.extra, "mlp_log_interval": 1})
    bare = compose(config, dataclasses.replace(w, image_lines=0), m, mlp, params)

    def mean(a, b):
        return (a + (k - 1) * b) / k
    return BatchResult(config, mean(full.batch_time_ms, bare.batch_time_ms),
                       {key: mean(v, bare.breakdown_ms[key]) for key, v in full.breakdown_ms.items()},
                       full.timeline, mean(full.energy_mj, bare.energy_mj),
                       {key: mean(v, bare.energy_breakdown_mj[key]) for key, v in full.energy_breakdown_mj.items()},
                       {**full.extra, "mlp_log_interval": k})


def _energy(config: str, batch: float, tl: _Timeline, w: Workload, link_bytes: dict, images: float,
            p: SystemParams) -> dict:
    """mJ per batch (W x ms = mJ; nJ x 1e-6 = mJ); ``images``: MLP images logged per batch."""
    e = p.energy
    host_busy = min(batch, tl.busy("host"))
    gpu_busy = min(batch, tl.busy("gpu"))
    out = {"host_cpu": host_busy * e.cpu_active_w + (batch - host_busy) * e.cpu_idle_w,
           "gpu": gpu_busy * e.gpu_active_w + (batch - gpu_busy) * e.gpu_idle_w}
    modules = p.host_channels if config == "pmem" else DEVICE_CHANNELS
    if config == "pmem":                                       # what misses the host's LLC
        h = host_traffic(p, w)
        reads = h["lookup_reads"] + h["update_reads"] + h["log_reads"]
        writes = h["update_writes"] + h["log_writes"] + images * w.image_lines
    else:                                                      # the device has no cache in front of PMEM
        reads = w.lookup_lines + 2 * w.unique_lines            # lookup; update and log read the rows
        writes = 2 * w.unique_lines + images * w.image_lines   # update and log write them; MLP log
    out["pmem"] = modules * e.pmem_module_w * batch + (reads * e.pmem_read_nj_per_line
                                                       + writes * e.pmem_write_nj_per_line) * 1e-6
    out["link"] = sum(n * 8 * (p.pcie if k == "pcie" else p.cxl).energy_pj_per_bit * 1e-9
                      for k, n in link_bytes.items())
    if config != "pmem":
        dev_busy = min(batch, tl.busy("device"))
        out["device"] = dev_busy * e.device_active_w + (batch - dev_busy) * e.device_idle_w
    return out

