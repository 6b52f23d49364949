"""cocotb tests of the checkpoint path on the whole device: LOG, MLP_LOG, checkpointed UPDATE, RECOVER.

Every test trains rm-tiny through ``CheckpointedRun`` (sim/tb/ckpt_run.py: LOOKUP checked bit
for bit, LOG and MLP_LOG overlapping the GPU's MLP time, UPDATE with flags.checkpoint), with
the CXL.mem and CXL.cache protocol monitors on. The log contents are compared with the
golden model (sim/model/checkpoint.py, which computes CRCs with zlib, never with the RTL's
CRC unit); recovery results with ``golden_recover`` and the golden training state.
"""
from __future__ import annotations

import cocotb

from hw.checkpoint.log_format import SLOT_HEADER_LINES
from hw.ndp.command import NdpError
from sim.bfm.ndp_host import log_command, update_command
from sim.env import DeviceEnv
from sim.model.checkpoint import check_log_slot, entries_lines, golden_recover, torn_line
from sim.model.dlrm import RM_TINY
from sim.model.trace import generate_trace
from sim.tb.ckpt_run import CheckpointedRun


async def _run(dut, batches: int = 6) -> CheckpointedRun:
    env = await DeviceEnv.create(dut)
    run = CheckpointedRun(env, generate_trace(RM_TINY, 3, env.seed), total_batches=batches)
    await run.setup()
    return run


async def _finish(run: CheckpointedRun) -> None:
    await run.env.finish()
    run.env.assert_clean()
    problems = run.finish_cache_side()
    assert not problems, "\n".join(problems)


def _tables_now(run):
    return [run.driver.read_table(t) for t in range(len(run.layout.tables))]


def _same_tables(a, b) -> bool:
    return all((x.view("u4") == y.view("u4")).all() for x, y in zip(a, b))


@cocotb.test()
async def checkpointed_batches_log_and_recover(dut):
    """Three batches: each slot holds exactly the golden undo log (old rows, once per row, valid
    CRCs, LOGGED then APPLIED), the MLP log holds the GPU image; RECOVER without a failure
    reports 3 batches and the last MLP log, and writes nothing."""
    run = await _run(dut)
    await run.train(3)
    read = run.driver.backdoor.read_line
    for k in (1, 2):                      # slot 0 was reused by batch 2; slot 1 still holds batch 1
        problems = check_log_slot(read, run.region, k, run.golden.expected_log(k, run.layout), applied=True)
        assert not problems, f"seed {run.env.seed}: batch {k} log slot:\n" + "\n".join(problems)
    golden = golden_recover(read, run.region, apply=False)
    assert golden.emb_batches == 3 and golden.mlp_valid and golden.mlp_batch == 2, golden
    before = _tables_now(run)
    completion, res = await run.recover()
    assert not golden.mismatches(res), golden.mismatches(res)
    assert not res.rolled_back
    assert completion.stats["lines_written"] == 0, completion
    assert _same_tables(before, _tables_now(run))
    problems, lost = run.check_recovered(res)
    assert not problems and lost == 0, problems
    run.resume(res)
    await run.train(4)                    # training goes on after a recovery
    run.verify_all_tables("after batch 4")
    await _finish(run)


@cocotb.test()
async def update_without_its_log_is_refused(dut):
    """A checkpointed UPDATE whose batch has no valid LOGGED record ends NOT_LOGGED and writes no row:
    no log at all, and a log of another batch."""
    run = await _run(dut)
    b = run.batches[0]
    run.driver.load_batch(b.offsets, b.indices, b.weights)
    run.driver.load_gradients(run.golden.grads_of(0))
    before = _tables_now(run)
    upd = update_command(run.layout, index_count=b.indices.size, lr=run.lr, has_weights=run.has_weights,
                         checkpoint_batch=0, tag=0x51)
    await run.driver.execute(upd, expect=NdpError.NOT_LOGGED)
    await run.driver.execute(log_command(run.layout, 2, index_count=b.indices.size, has_weights=run.has_weights,
                                             tag=0x52))
    await run.driver.execute(upd.replace(tag=0x53), expect=NdpError.NOT_LOGGED)   # slot 0 holds batch 2
    assert _same_tables(before, _tables_now(run)), "a refused UPDATE wrote rows"
    await run.driver.execute(log_command(run.layout, 0, index_count=b.indices.size, has_weights=run.has_weights,
                                             tag=0x54))
    await run.driver.execute(upd.replace(tag=0x55))
    run.golden.step(before, 0)
    assert _same_tables(before, _tables_now(run)), "the logged UPDATE differs from the golden step"
    await _finish(run)


@cocotb.test()
async def torn_log_entry_is_detected(dut):
    """Batch 1 logged, its UPDATE interrupted (modelled by not running it). One log entry line is
    torn (some 8-byte words new, the rest old): RECOVER ends LOG_CORRUPT and writes no row, as
    golden_recover says; with the entry whole again it rolls back and reports 1 batch."""
    run = await _run(dut)
    await run.train(1)
    b = run.batches[1]
    run.driver.load_batch(b.offsets, b.indices, b.weights)
    await run.driver.execute(log_command(run.layout, 1, index_count=b.indices.size, has_weights=run.has_weights,
                                             tag=0x61))
    backdoor = run.driver.backdoor
    entry_lines = entries_lines(run.golden.expected_log(1, run.layout))
    line = run.region.slot_base(1) + SLOT_HEADER_LINES + run.env.rng.randrange(entry_lines)  # a header or payload
    whole = backdoor.read_line(line)
    mask = run.env.rng.randrange(1, 255)              # 8-byte words that got the new data
    backdoor.write_lines(line, [torn_line(whole ^ ((1 << 512) - 1), whole, mask)])
    golden = golden_recover(backdoor.read_line, run.region, apply=False)
    assert golden.error == NdpError.LOG_CORRUPT, golden
    before = _tables_now(run)
    dut._log.info(f"tore line {line:#x} (words {mask:#04x}): {golden.problem}")
    completion, res = await run.recover(expect=NdpError.LOG_CORRUPT)
    assert _same_tables(before, _tables_now(run)), "RECOVER wrote rows from a corrupt log"
    backdoor.write_lines(line, [whole])
    completion, res = await run.recover()
    assert res.rolled_back and res.emb_batches == 1, res
    problems, lost = run.check_recovered(res)
    assert not problems and lost == 0, problems
    await _finish(run)
