"""cocotb tests of the NDP command path: rings, command processor, LOOKUP and UPDATE engines.

Every test drives the device only through its host interfaces (CSRs, CXL.mem ring writes,
the PMEM backdoor for bulk data; sim/bfm/ndp_host.py) and checks results bit for bit against
the golden models (sim/model/embedding.py) through ``EmbeddingRun`` (sim/tb/ndp_run_tb.py).
The CXL.mem protocol monitor and scoreboard run in every test (``env.finish()`` +
``env.assert_clean()``), the CXL.cache monitor and home agent checks when outputs are
pushed to the host. Every test logs its seed; replay with TCXL_SEED=<seed>.

- ``random_lookup_update_device_out`` / ``random_lookup_update_host_out``: random rm-tiny
  traces (SUM, MEAN and WEIGHTED_SUM tables; fixed, uniform and normal bag lengths; empty
  bags; duplicate rows in and across bags; signed weights; Zipf and uniform rows), LOOKUP
  then UPDATE per batch, outputs and whole tables compared after every batch.
  TCXL_NDP_BATCHES sets the number of batches (default 3).
- ``empty_bags_next_to_nonfinite_weights``: empty bags of SUM, MEAN and WEIGHTED_SUM tables
  whose offsets[b] points at a +-Inf / NaN weight of the next bag pool to +0.0 (issue 18).
- ``garbage_outside_bags_changes_nothing``: property test; random garbage in every array
  position outside a bag's range (array tails, unused weights, empty bags' gradients, the
  gradients' padding lines) changes no result (issue 18).
- ``bad_inputs_are_rejected``: every malformed-input case (issue 4; offsets[0] != 0 and
  offsets[T*B] != index_count, issue 18) completes with its NdpError (and error_info), leaves
  every table bit-identical, makes ``read_outputs`` refuse a failed LOOKUP's outputs, and the
  next good LOOKUP + UPDATE is correct.
- ``update_scratchpad_overflow``: an UPDATE whose distinct rows exceed the update engine's
  scratchpad (TCXL_SCRATCH_LINES overrides the size read from hw/ndp/update/engine.py).
"""
from __future__ import annotations

import dataclasses
import inspect
import os
from dataclasses import dataclass
from typing import Callable

import cocotb
import numpy as np

from hw.ndp.command import MAX_TABLES, AddressFault, NdpError, NdpOpcode
from sim.bfm.ndp_host import (TABLE, HostMemorySide, NdpCommand, NdpCommandError, garbage_words, plan_layout,
                               tables_from_manifest)
from sim.env import DeviceEnv
from sim.model.dlrm import RM_TINY, PoolingDistribution, TableSpec
from sim.model.trace import TraceKnobs, generate_trace
from sim.model import embedding
from sim.tb.ndp_run_tb import EmbeddingRun, host_output_base, initial_tables


def _layout(env, trace, out="device"):
    m = trace.manifest
    return plan_layout(tables_from_manifest(m), batch_size=m["batch_size"],
                       max_indices=max(int(b.indices.size) for b in trace.batches),
                       capacity_lines=env.config.capacity_lines, has_weights=m["has_weights"],
                       outputs_in_device=out == "device")


def _random_trace(rng, num_batches: int, seed: int):
    """An rm-tiny trace with knobs drawn from ``rng``; weights made signed."""
    knobs = TraceKnobs(batch_size=rng.choice([3, 5, 8, 11]), empty_prob=rng.choice([0.1, 0.25]),
                       alpha=rng.choice([None, 0.0, 1.5]), reuse=rng.choice([0.0, 0.3]), weights=True)
    trace = generate_trace(RM_TINY, num_batches, seed, knobs)
    wrng = np.random.default_rng([seed, 9])
    for b in trace.batches:
        b.weights[:] = (b.weights * wrng.choice([-2.0, 2.0], b.weights.size)).astype(np.float32)
    return trace, knobs


async def _random_lookup_update(dut, out: str):
    env = await DeviceEnv.create(dut)
    n = int(os.environ.get("TCXL_NDP_BATCHES", "3"))
    trace, knobs = _random_trace(env.rng, n, env.seed & 0x7FFF_FFFF)
    dut._log.info(f"rm-tiny trace: {knobs}, out to {out}")
    host = HostMemorySide(env, host_output_base(env), 1 << 16) if out == "host" else None
    run = EmbeddingRun(env, trace.manifest, _layout(env, trace, out), out=out, verify_tables="all",
                       host_memory=host)
    await run.setup()
    for k, batch in enumerate(trace.batches):
        f = await run.run_batch(k, batch)
        dut._log.info(f"batch {k}: {f['lookups']} lookups, {f['unique_rows']} unique rows, LOOKUP "
                      f"{f['cycles_lookup']} cycles, UPDATE {f['cycles_update']} cycles; "
                      f"stats {f['lookup_stats']} / {f['update_stats']}")
    await env.finish()
    env.assert_clean()
    if host is not None:
        host.finish()


@cocotb.test()
async def random_lookup_update_device_out(dut):
    await _random_lookup_update(dut, "device")


@cocotb.test()
async def random_lookup_update_host_out(dut):
    await _random_lookup_update(dut, "host")


# --------------------------------------------------------------------------------------------
# positions that belong to no bag
# --------------------------------------------------------------------------------------------
NONFINITE = np.float32([np.inf, -np.inf, np.nan])


def _empty_bags(batch, n_bags: int) -> np.ndarray:
    return np.flatnonzero(np.diff(batch.offsets[:n_bags + 1].astype(np.int64)) == 0)


def _nonfinite_after_empty_bags(batch, n_bags: int) -> int:
    """The weight at offsets[b] of every empty bag b (the next bag's first weight) becomes
    +Inf, -Inf or NaN in turn; returns how many were set."""
    n = 0
    for b in _empty_bags(batch, n_bags):
        pos = int(batch.offsets[b])
        if pos < batch.indices.size:
            batch.weights[pos] = NONFINITE[n % 3]
            n += 1
    return n


async def _run_batches(dut, run, trace, n_bags, *, garbage=None):
    """Every batch of ``trace``, LOOKUP + UPDATE checked bit for bit (multi-step: each batch
    runs on the tables the previous UPDATE left). ``garbage``: a Generator for random stale
    words outside every bag (argument-array tails, unused weights, empty bags' gradients)."""
    B = trace.manifest["batch_size"]
    for k, batch in enumerate(trace.batches):
        grads = None
        if garbage is not None:
            from sim.tb.ndp_run_tb import batch_gradients
            grads = batch_gradients(trace.manifest, run.env.seed, k)
            for b in _empty_bags(batch, n_bags):     # gradients of empty bags are never read
                t, s = divmod(int(b), B)
                grads[t][s] = garbage_words(garbage, grads[t].shape[1]).view(np.float32)
        f = await run.run_batch(k, batch, grads=grads, garbage=garbage)
        dut._log.info(f"batch {k}: {f['lookups']} lookups, {len(_empty_bags(batch, n_bags))} empty bags, "
                      f"LOOKUP {f['cycles_lookup']} cycles, UPDATE {f['cycles_update']} cycles")


@cocotb.test()
async def empty_bags_next_to_nonfinite_weights(dut):
    """Empty bags in SUM, MEAN and WEIGHTED_SUM tables whose offsets[b] points at a +-Inf / NaN
    weight (it belongs to the next bag): pooled +0.0 like PyTorch, over several batches."""
    env = await DeviceEnv.create(dut)
    trace = generate_trace(RM_TINY, 3, env.seed & 0x7FFF_FFFF,
                           TraceKnobs(batch_size=8, empty_prob=0.4, weights=True))
    n_bags = len(trace.manifest["tables"]) * 8
    set_ = sum(_nonfinite_after_empty_bags(b, n_bags) for b in trace.batches)
    modes_with_empty = {trace.manifest["tables"][int(e) // 8]["mode"] for b in trace.batches
                        for e in _empty_bags(b, n_bags)}
    dut._log.info(f"{set_} non-finite weights after empty bags; empty bags in {sorted(modes_with_empty)} tables")
    assert set_ > 0 and modes_with_empty == {"sum", "mean", "weighted_sum"}, (set_, modes_with_empty)
    run = EmbeddingRun(env, trace.manifest, _layout(env, trace), verify_tables="all")
    await run.setup()
    await _run_batches(dut, run, trace, n_bags)
    await env.finish()
    env.assert_clean()


@cocotb.test()
async def garbage_outside_bags_changes_nothing(dut):
    """Property: random garbage (NaN, Inf, subnormals, huge indices) in every array position
    outside a bag's range changes no result. Garbage goes after the offsets, indices and
    weights (up to the end of their regions), into the weights of SUM and MEAN tables (which
    pool without weights), into the gradient vectors of empty bags and each sample's padding
    line of the gradients (``row_pitch_for``), and +-Inf / NaN into the
    weight at every empty bag's offset. The results must equal the golden model on the clean
    batch, bit for bit."""
    env = await DeviceEnv.create(dut)
    n = int(os.environ.get("TCXL_NDP_BATCHES", "3"))
    seed = env.seed & 0x7FFF_FFFF
    trace, knobs = _random_trace(env.rng, n, seed)
    garbage = np.random.default_rng([seed, 77])
    B = trace.manifest["batch_size"]
    n_bags = len(trace.manifest["tables"]) * B
    modes = [t["mode"] for t in trace.manifest["tables"]]
    for batch in trace.batches:
        clean = embedding.tbe_forward(initial_tables(trace.manifest, env.seed), batch.offsets, batch.indices,
                                      modes, B, batch.weights.copy())
        for t, mode in enumerate(modes):
            if mode != "weighted_sum":
                lo, hi = int(batch.offsets[t * B]), int(batch.offsets[(t + 1) * B])
                batch.weights[lo:hi] = garbage_words(garbage, hi - lo).view(np.float32)
        _nonfinite_after_empty_bags(batch, n_bags)
        dirty = embedding.tbe_forward(initial_tables(trace.manifest, env.seed), batch.offsets, batch.indices,
                                      modes, B, batch.weights)
        for t, mode in enumerate(modes):         # the golden model itself ignores them (where they are unused)
            if mode != "weighted_sum":
                assert np.array_equal(clean[t].view(np.uint32), dirty[t].view(np.uint32)), f"golden table {t}"
    dut._log.info(f"rm-tiny trace: {knobs}")
    run = EmbeddingRun(env, trace.manifest, _layout(env, trace), verify_tables="all")
    await run.setup()
    await _run_batches(dut, run, trace, n_bags, garbage=garbage)
    await env.finish()
    env.assert_clean()


# --------------------------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------------------------
@dataclass
class BadCase:
    """One malformed command. ``opcodes``: the commands it is tried with. ``cmd``: changes to
    the good command; ``args``: changes to copies of the good (offsets, indices, weights);
    ``descs``: changes to the table descriptors (a list of field dicts). ``info``: the
    expected error_info (None: not checked)."""
    name: str
    expect: NdpError
    opcodes: tuple[NdpOpcode, ...]
    cmd: Callable[[NdpCommand, "BadBench"], NdpCommand] | None = None
    args: Callable[[dict, "BadBench"], None] | None = None
    descs: Callable[[list[dict], "BadBench"], None] | None = None
    info: Callable[["BadBench"], int] | int | None = None


class BadBench:
    """Shared state of the bad-input cases: the layout and the good batch."""

    def __init__(self, run: EmbeddingRun, batch):
        self.run = run
        self.batch = batch
        self.layout = run.layout
        self.cap = run.env.config.capacity_lines
        self.B = run.manifest["batch_size"]
        self.offsets = batch.offsets.astype(np.int64)
        self.n_bags = len(run.layout.tables) * self.B

    def table_span(self, t: int) -> tuple[int, int]:
        return int(self.offsets[t * self.B]), int(self.offsets[(t + 1) * self.B])

    def last_position_of(self, t: int) -> int:
        """The last index position of table t (the engine has used the rows before it)."""
        lo, hi = self.table_span(t)
        assert hi > lo, f"table {t} has no index in the good batch"
        return hi - 1

    def decreasing_position(self) -> int:
        """A position j >= 2 in the last table's offsets with offsets[j-1] > 0."""
        for j in range(len(self.offsets) - 2, 1, -1):
            if self.offsets[j - 1] > 0:
                return j
        raise AssertionError("good batch too small for the offsets case")


def _set_index(t_pick: Callable[[BadBench], int], value: Callable[[BadBench, int], int]):
    def change(a, bench):
        t = t_pick(bench)
        a["indices"][bench.last_position_of(t)] = value(bench, t)
    return change


def _rows(bench, t):
    return bench.layout.tables[t].rows


def _shift_offsets(a, bench):
    """offsets[0] = 1: position 0 (a junk index and weight) belongs to no bag; the last bag
    (non-empty in the good batch) is one shorter, so only offsets[0] is wrong."""
    assert a["offsets"][-1] > a["offsets"][-2]
    a["offsets"][:-1] += 1
    a["indices"][0] = 0xFFFF_FFFF
    a["weights"][0] = np.nan


def _bad_cases(capacity: int, n_tables: int) -> list[BadCase]:
    L, U = NdpOpcode.LOOKUP, NdpOpcode.UPDATE
    both = (L, U)
    last_t = n_tables - 1
    return [
        # engine checks: what only the arrays reveal
        BadCase("index == rows", NdpError.INDEX_RANGE, both, args=_set_index(lambda b: 0, _rows),
                info=lambda b: b.last_position_of(0)),
        BadCase("index 0xFFFFFFFF in the last table", NdpError.INDEX_RANGE, both,
                args=_set_index(lambda b: last_t, lambda b, t: 0xFFFF_FFFF), info=lambda b: b.last_position_of(last_t)),
        BadCase("index == rows of the weighted table", NdpError.INDEX_RANGE, (U,),
                args=_set_index(lambda b: 2, lambda b, t: _rows(b, t) + 7), info=lambda b: b.last_position_of(2)),
        BadCase("offsets decrease", NdpError.OFFSETS, both,
                args=lambda a, b: a["offsets"].__setitem__(b.decreasing_position(),
                                                           a["offsets"][b.decreasing_position() - 1] - 1),
                info=lambda b: b.decreasing_position()),
        BadCase("an offset above the last one", NdpError.OFFSETS, (L,),
                args=lambda a, b: a["offsets"].__setitem__(1, a["offsets"][-1] + 1), info=1),
        # PyTorch's contract: offsets run from 0 to the index count (the descriptor's index_count)
        BadCase("offsets[0] = 1 (one junk index before)", NdpError.OFFSETS, both, args=_shift_offsets, info=0),
        BadCase("offsets[T*B] past the index count (into the zeros after the indices)", NdpError.OFFSETS, both,
                args=lambda a, b: a["offsets"].__setitem__(-1, a["offsets"][-1] + 3), info=lambda b: b.n_bags),
        BadCase("index_count above offsets[T*B]", NdpError.OFFSETS, both,
                cmd=lambda c, b: c.replace(index_count=c.index_count + 1), info=lambda b: b.n_bags),
        BadCase("index_count below offsets[T*B]", NdpError.OFFSETS, both,
                cmd=lambda c, b: c.replace(index_count=c.index_count - 1), info=lambda b: b.n_bags),
        BadCase("indices array past device memory", NdpError.ADDRESS, both,
                cmd=lambda c, b: c.replace(indices_addr=capacity - 1), info=AddressFault.INDICES),
        BadCase("indices array aliasing (capacity + base)", NdpError.ADDRESS, both,
                cmd=lambda c, b: c.replace(indices_addr=capacity + c.indices_addr), info=AddressFault.INDICES),
        BadCase("weights array past device memory", NdpError.ADDRESS, (L,),
                cmd=lambda c, b: c.replace(weights_addr=capacity - 1), info=AddressFault.WEIGHTS),
        # processor checks: the descriptor and the tables
        BadCase("offsets array past device memory", NdpError.ADDRESS, (U,),
                cmd=lambda c, b: c.replace(offsets_addr=capacity), info=AddressFault.OFFSETS),
        BadCase("device outputs past device memory", NdpError.ADDRESS, (L,),
                cmd=lambda c, b: c.replace(out_addr=capacity - 1), info=AddressFault.OUTPUTS),
        BadCase("gradients past device memory", NdpError.ADDRESS, (U,),
                cmd=lambda c, b: c.replace(grad_addr=capacity - 1), info=AddressFault.GRADIENTS),
        BadCase("table descriptors past device memory", NdpError.ADDRESS, (L,),
                cmd=lambda c, b: c.replace(tables_addr=capacity - 1), info=AddressFault.TABLES),
        BadCase("table rows one line past device memory", NdpError.ADDRESS, both,
                descs=lambda d, b: d[1].update(base_addr=capacity - b.layout.tables[1].lines + 1),
                info=AddressFault.TABLE_ROWS + 1),
        BadCase("table base aliasing (capacity + base)", NdpError.ADDRESS, (U,),
                descs=lambda d, b: d[0].update(base_addr=capacity + d[0]["base_addr"]),
                info=AddressFault.TABLE_ROWS + 0),
        BadCase("dim 24", NdpError.BAD_DIM, both, descs=lambda d, b: d[2].update(dim=24), info=2),
        BadCase("dim 0", NdpError.BAD_DIM, (L,), descs=lambda d, b: d[0].update(dim=0), info=0),
        BadCase("dim 272", NdpError.BAD_DIM, (U,), descs=lambda d, b: d[last_t].update(dim=272), info=last_t),
        BadCase("rows 0", NdpError.BAD_DESCRIPTOR, (L,), descs=lambda d, b: d[1].update(rows=0), info=1),
        BadCase("reserved pooling mode", NdpError.BAD_DESCRIPTOR, (U,), descs=lambda d, b: d[0].update(mode=3),
                info=0),
        BadCase("weighted table without weights", NdpError.BAD_DESCRIPTOR, both,
                cmd=lambda c, b: c.replace(has_weights=False, weights_addr=0), info=2),
        BadCase("row pitch too small", NdpError.BAD_DESCRIPTOR, (L,),
                cmd=lambda c, b: c.replace(row_pitch_lines=b.layout.vector_lines - 1), info=last_t),
        BadCase("reserved opcode 6", NdpError.BAD_OPCODE, (L,), cmd=lambda c, b: c.replace(opcode=6), info=0),
        BadCase("reserved opcode 0xFF", NdpError.BAD_OPCODE, (L,), cmd=lambda c, b: c.replace(opcode=0xFF)),
        BadCase("zero tables", NdpError.BAD_TABLES, both, cmd=lambda c, b: c.replace(num_tables=0), info=0),
        BadCase(f"{MAX_TABLES + 1} tables", NdpError.BAD_TABLES, (L,),
                cmd=lambda c, b: c.replace(num_tables=MAX_TABLES + 1)),
        BadCase("batch size 0", NdpError.BAD_TABLES, (U,), cmd=lambda c, b: c.replace(batch_size=0)),
        BadCase("NOP", NdpError.OK, (L,), cmd=lambda c, b: c.replace(opcode=NdpOpcode.NOP)),
    ]


async def _try_bad_case(bench: BadBench, case: BadCase, opcode: NdpOpcode) -> list[str]:
    """Run one malformed command; return the problems found (empty: as expected)."""
    run, driver, batch = bench.run, bench.run.driver, bench.batch
    where = f"{case.name} ({opcode.name})"
    args = {"offsets": batch.offsets.astype(np.int64), "indices": batch.indices.astype(np.int64),
            "weights": batch.weights}
    if case.args:
        case.args(args, bench)
    driver.load_batch(args["offsets"].astype(np.uint32), args["indices"].astype(np.uint32), args["weights"])
    if case.descs:
        descs = [TABLE.unpack(v) for v in bench.layout.table_descriptors()]
        case.descs(descs, bench)
        await driver.write_table_descriptors([TABLE.pack(**d) for d in descs])
    n = int(args["indices"].size)
    cmd = run.lookup_cmd(n) if opcode == NdpOpcode.LOOKUP else run.update_cmd(n)
    if case.cmd:
        cmd = case.cmd(cmd, bench)
    try:
        completion = await driver.execute(cmd, expect=case.expect, timeout_cycles=400_000)
    except NdpCommandError as e:
        return [f"{where}: {e}"]
    problems = []
    if (cmd.opcode_value == NdpOpcode.LOOKUP.value and cmd.out_addr == bench.layout.outputs.base
            and case.expect != NdpError.OK):
        try:                                            # a failed LOOKUP's outputs are undefined
            driver.read_outputs()
            problems.append(f"{where}: read_outputs returned the outputs of a failed LOOKUP")
        except RuntimeError:
            pass
    info = case.info(bench) if callable(case.info) else case.info
    if info is not None and completion.error_info != int(info):
        problems.append(f"{where}: error_info {completion.error_info:#x}, expected {int(info):#x}")
    try:
        run.verify_all_tables(f"after {where}")
    except AssertionError as e:
        problems.append(f"{where}: tables changed by a failed command: {e}")
        for t in range(len(run.golden)):           # go on from what the device holds
            run.golden[t] = driver.read_table(t)
    if case.descs:
        await driver.write_table_descriptors()
    return problems


@cocotb.test()
async def bad_inputs_are_rejected(dut):
    env = await DeviceEnv.create(dut)
    seed = env.seed & 0x7FFF_FFFF
    trace = generate_trace(RM_TINY, 1, seed, TraceKnobs(batch_size=4, empty_prob=0.0, weights=True))
    run = EmbeddingRun(env, trace.manifest, _layout(env, trace), verify_tables="all")
    await run.setup()
    batch = trace.batches[0]
    bench = BadBench(run, batch)
    assert batch.indices.size > 16, "the indices must span lines for the address cases"
    await run.run_batch(0, batch)                        # the device works before
    problems, good_runs = [], 0
    cases = _bad_cases(env.config.capacity_lines, len(run.golden))
    for case in cases:
        for opcode in case.opcodes:
            found = await _try_bad_case(bench, case, opcode)
            dut._log.info(f"{case.name} ({opcode.name}): {'; '.join(found) if found else 'as expected'}")
            problems += found
            try:                                            # the next good command works
                await run.run_batch(good_runs + 1, batch)
                good_runs += 1
            except (AssertionError, NdpCommandError) as e:
                problems.append(f"good batch after {case.name} ({opcode.name}) failed: {e}")
                for t in range(len(run.golden)):
                    run.golden[t] = run.driver.read_table(t)
    commands = await env.csr.read("STAT_NDP_COMMANDS")
    errors = await env.csr.read("ERR_NDP_COMMAND")
    bad_commands = sum(len(c.opcodes) for c in cases if c.expect != NdpError.OK)
    if errors != bad_commands:
        problems.append(f"ERR_NDP_COMMAND = {errors}, expected {bad_commands}")
    dut._log.info(f"{commands} commands, {errors} failed as intended, {good_runs} good batches in between")
    await env.finish()
    env.assert_clean()
    assert not problems, f"seed {env.seed}: {len(problems)} problems:\n" + "\n".join(problems)


# --------------------------------------------------------------------------------------------
# scratchpad overflow
# --------------------------------------------------------------------------------------------
def update_scratch_lines(config) -> int:
    """The update engine's scratchpad size in lines: TCXL_SCRATCH_LINES, else the device
    configuration's ``update_scratch_lines``, else UpdateEngine's default."""
    if os.environ.get("TCXL_SCRATCH_LINES"):
        return int(os.environ["TCXL_SCRATCH_LINES"])
    if hasattr(config, "update_scratch_lines"):
        return int(config.update_scratch_lines)
    from hw.ndp.update import UpdateEngine
    param = inspect.signature(UpdateEngine.__init__).parameters.get("scratch_lines")
    if param is not None and param.default is not inspect.Parameter.empty:
        return int(param.default)
    raise RuntimeError("cannot find the update engine's scratchpad size; set TCXL_SCRATCH_LINES")


def overflow_preset(scratch_lines: int):
    """rm-tiny's modes and lengths with tables large enough to overflow the scratchpad."""
    scale = max(1, -(-4 * scratch_lines // 2409))
    tables = tuple(dataclasses.replace(t, rows=t.rows * scale) for t in RM_TINY.tables)
    tables += (TableSpec(64, 16, PoolingDistribution("fixed", 6), "sum", 2.0),)   # very hot: many duplicates
    return RM_TINY.replace(name="rm-tiny-overflow", tables=tables)


@cocotb.test()
async def update_scratchpad_overflow(dut):
    env = await DeviceEnv.create(dut)
    scratch = update_scratch_lines(env.config)
    seed = env.seed & 0x7FFF_FFFF
    preset = overflow_preset(scratch)
    for batch_size in (8, 16, 32, 64, 128, 256, 512):
        trace = generate_trace(preset, 1, seed, TraceKnobs(batch_size=batch_size, alpha=0.3))
        batch, B = trace.batches[0], batch_size
        offs = batch.offsets.astype(np.int64)
        distinct_lines = sum(np.unique(batch.indices[offs[t * B]:offs[(t + 1) * B]]).size * (tab["dim"] // 16)
                             for t, tab in enumerate(trace.manifest["tables"]))
        if distinct_lines > 2 * scratch:
            break
    else:
        raise AssertionError(f"no batch up to 512 overflows a {scratch}-line scratchpad")
    dut._log.info(f"scratchpad {scratch} lines; batch {B}: {batch.indices.size} lookups, "
                  f"{distinct_lines} distinct row lines")
    run = EmbeddingRun(env, trace.manifest, _layout(env, trace), verify_tables="all")
    await run.setup()
    f = await run.run_batch(0, batch)
    s = f["update_stats"]
    dut._log.info(f"UPDATE {f['cycles_update']} cycles, stats {s}")
    dut._log.info(f"{f['unique_rows']} distinct rows, {s['rows_read']} row fills "
                  f"({s['rows_read'] - f['unique_rows']} re-reads after eviction)")
    await env.finish()
    env.assert_clean()
