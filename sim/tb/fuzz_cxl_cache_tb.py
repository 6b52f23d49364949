"""CXL.cache fuzz: the coherence bench under timing that changes every few hundred operations.

The cocotb test ``fuzz_cxl_cache`` (``trainingcxl fuzz --target cxl-cache``, tools/fuzz_cmd.py)
runs the device against the host of sim/tb/coherence_bench.py (home agent + host CPU cache
on shared lines) until the host has sent TCXL_FUZZ_COUNT H2D messages. What it varies:

- Every ``EPOCH_OPS`` device operations a new timing regime is drawn (from the run's seed):
  the home agent's per-message delay (0..32 cycles, independent per message, so a read's GO
  and its data arrive in either order and snoops land at any point of a device request), the
  D2H backpressure (the host drops ``ready``, 0..60 %), the rate of CPU loads / stores /
  evictions (each conflicting CPU access snoops the device: SnpInv for a store, SnpData for
  a load, SnpCur with the regime's probability), GO-E vs GO-M for RdOwn (never GO-E for
  RdShared: not a legal grant, cxl-reference §2), and a small rate of host error answers to
  reads and CLFlush (GO-Err, with poisoned all-ones data for reads). Errors on write-backs
  are left to the directed tests: a refused DirtyEvict loses the line's dirty data, which
  the value checker cannot tell from a lost write.
- The device side: a random mix of the cache port's operations (read shared / own / current,
  write, push, push-invalidate, flush) on lines that share cache slots (fills evict each
  other), bursts and gaps between operations.

Everything the host sends is legal CXL: this fuzzes orderings and timing, not malformed host
messages (stray and reserved H2D messages are covered by sim/tb/cxl_cache_stray_tb.py).
Checks (the bench's): the CXL.cache protocol monitor on every message and the home agent's
protocol errors and obligations (``protocol_violations``); single writer / multiple readers
at every message (``coherence_violations``); every read value possible at its time, and every
line's final value read back through the device (``mismatches``, bit for bit). ``hangs``:
device requests without an answer after a drain of ``DRAIN_CYCLES`` with the CPU stopped.

Coverage, in the result: ``h2d`` / ``d2h`` (messages by channel and opcode), ``snoops``
(snoop type x the state the host had granted the device when the snoop went out, ``+pending``
when a device request to the line was in flight), ``go_data_order`` (for reads answered with
GO and data: which came first), ``regimes`` (timing regimes drawn).
Result keys: ``messages`` (H2D messages sent), ``device_ops``, ``hangs``, ``mismatches``,
``protocol_violations``, ``coherence_violations``, ``reads_checked``, ``sim_cycles``,
``sim_cycles_per_second``, the coverage dicts, ``seed``.
"""
from __future__ import annotations

import collections
import os
import time

import cocotb
from cocotb.triggers import Timer

from hw.common.cxl_cache import D2HReqOpcode, GOState, H2DReqOpcode, H2DRspOpcode
from hw.cxl_controller.cache_port import CacheOp
from sim.env import CLOCK_PERIOD_NS, DeviceEnv
from sim.tb.coherence_bench import HOST_BASE, CoherenceBench
from sim.tb.ndp_run_tb import write_result

ERRORS = os.environ.get("TCXL_FUZZ_ERRORS", "1") != "0"
EPOCH_OPS = 400                   # device operations per timing regime
DRAIN_CYCLES = 200_000
PROGRESS_EVERY = 10_000           # H2D messages between progress lines
DEVICE_OPS = [CacheOp.READ_SHARED] * 22 + [CacheOp.READ_OWN] * 18 + [CacheOp.READ_CURRENT] * 10 + \
    [CacheOp.WRITE] * 25 + [CacheOp.PUSH] * 8 + [CacheOp.PUSH_INV] * 7 + [CacheOp.FLUSH] * 10


def _name(enum, value: int) -> str:
    try:
        return enum(value).name
    except ValueError:
        return f"reserved_{value:#x}"


def draw_regime(rng) -> dict:
    """One timing regime: every knob of the host and the CPU (see the module docstring)."""
    return {"max_delay": rng.choice((0, 1, 2, 4, 8, 16, 32)),
            "backpressure": rng.choice((0.0, 0.05, 0.2, 0.4, 0.6)),
            "cpu_period": rng.choice((0, 1, 2, 4, 8, 16)),
            "store_rate": rng.choice((0.1, 0.5, 0.9)),
            "evict_rate": rng.choice((0.0, 0.05, 0.2)),
            "snp_cur_rate": rng.choice((0.0, 0.2, 0.6)),
            "grant_m": rng.random() < 0.5,
            "rdshared_grant_e": False,        # GO-E for RdShared is not a legal grant (cxl-reference §2)
            "error_rate": rng.choice((0.0, 0.0, 0.0, 0.02)) if ERRORS else 0.0,
            "gap": rng.choice((0, 1, 4, 16))}


def apply_regime(bench: CoherenceBench, r: dict) -> None:
    ha, cpu, host = bench.ha, bench.cpu, bench.host
    ha.max_delay, ha.grant_m, ha.rdshared_grant_e = r["max_delay"], r["grant_m"], r["rdshared_grant_e"]
    ha.snp_cur_rate, ha.error_rate = r["snp_cur_rate"], r["error_rate"]
    host.link.backpressure, host.cpu_period = r["backpressure"], r["cpu_period"]
    cpu.store_rate, cpu.evict_rate = r["store_rate"], r["evict_rate"]


class Coverage:
    """Counts what the fuzz reached (a host listener, before the home agent sees a message)."""

    def __init__(self, bench: CoherenceBench):
        self.bench = bench
        self.h2d, self.d2h = collections.Counter(), collections.Counter()
        self.snoops = collections.Counter()
        self.go_data_order = collections.Counter()
        self._first: dict[int, str] = {}      # CQID of a read -> "go" / "data", whichever came first

    def on_h2d(self, cycle, kind, f) -> None:
        if kind == "req":
            op = _name(H2DReqOpcode, f["opcode"])
            self.h2d[f"req.{op}"] += 1
            line = f["addr"]
            state = self.bench.monitor.coherence.granted_state(line)
            pending = "+pending" if self.bench.monitor.requests_in_flight(line) else ""
            self.snoops[f"{op}@{state}{pending}"] += 1
        elif kind == "rsp":
            op = _name(H2DRspOpcode, f["opcode"])
            if op == "GO":
                op += "-" + _name(GOState, f["rsp_data"] & 0xF)
            self.h2d[f"rsp.{op}"] += 1
            if op.startswith("GO-"):
                self._order(f["cqid"], "go")
        else:
            self.h2d["data"] += 1
            self._order(f["cqid"], "data")

    def _order(self, cqid: int, what: str) -> None:
        first = self._first.pop(cqid, None)
        if first is None:
            self._first[cqid] = what
        elif first != what:
            self.go_data_order[f"{first}_first"] += 1
        else:                                 # e.g. two data chunks; keep waiting for the other
            self._first[cqid] = first

    def on_d2h(self, cycle, kind, f) -> None:
        name = _name(D2HReqOpcode, f["opcode"]) if kind == "req" else ""
        self.d2h[f"{kind}.{name}" if name else kind] += 1

    @property
    def messages(self) -> int:
        return sum(self.h2d.values())


@cocotb.test()
async def fuzz_cxl_cache(dut):
    """``trainingcxl fuzz --target cxl-cache``: TCXL_FUZZ_COUNT H2D messages, every check on."""
    target = int(os.environ.get("TCXL_FUZZ_COUNT", "2000"))
    env = await DeviceEnv.create(dut)
    env.cache_traffic_expected = True
    rng, seed, slots = env.rng, env.seed, env.config.cache_lines
    # 16 lines on 4 cache slots: fills evict each other, snoops find lines in every state.
    lines = [HOST_BASE + s + k * slots for s in (5, 21, 38, 60) for k in range(4)]
    bench = CoherenceBench(env, lines, ha_kw={"error_writes": False}, cpu_kw={}, backpressure=0.0, cpu_period=0)
    cov = Coverage(bench)
    bench.host.listeners.insert(0, cov)
    result = {"seed": seed, "messages": 0, "device_ops": 0, "hangs": 0, "regimes": 0}
    t0, start = time.perf_counter(), bench.cycle
    next_progress = PROGRESS_EVERY
    try:
        bench.start()
        regime = None
        while cov.messages < target:
            if result["device_ops"] % EPOCH_OPS == 0:
                regime = draw_regime(rng)
                apply_regime(bench, regime)
                result["regimes"] += 1
            await bench.request(rng.choice(DEVICE_OPS), rng.choice(lines), rng.getrandbits(512))
            result["device_ops"] += 1
            if regime["gap"] and rng.random() < 0.5:
                await Timer(rng.randrange(1, regime["gap"] + 1) * CLOCK_PERIOD_NS, unit="ns")
            if cov.messages >= next_progress:
                dut._log.info(f"fuzz cxl-cache: {cov.messages} H2D messages, {result['device_ops']} device "
                              f"operations, {bench.cycle - start} cycles, "
                              f"{len(bench.problems())} problems so far")
                next_progress += PROGRESS_EVERY
        # Quiet host timing for the drain: errors off, the CPU stopped, no backpressure.
        apply_regime(bench, {**regime, "cpu_period": 0, "error_rate": 0.0, "backpressure": 0.0})
        result["hangs"] = await bench.drain(DRAIN_CYCLES)
        if not result["hangs"]:
            result["hangs"] = await bench.final_reads()
        bench.finish()
    finally:
        cycles = bench.cycle - start
        wall = time.perf_counter() - t0
        result.update(bench.counts())
        result.update({"messages": cov.messages, "sim_cycles": cycles,
                       "sim_cycles_per_second": round(cycles / wall) if wall else 0,
                       "h2d": dict(cov.h2d), "d2h": dict(cov.d2h), "snoops": dict(cov.snoops),
                       "go_data_order": dict(cov.go_data_order), "problems": bench.problems(3)})
        write_result(result)
    problems = bench.problems()
    assert not result["hangs"], f"seed {seed}: {result['hangs']} device requests never answered"
    assert not problems, f"seed {seed}:\n" + "\n".join(problems)
