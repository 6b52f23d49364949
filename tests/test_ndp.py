"""NDP command path: the host driver's pure parts, and the RTL through cocotb (sim/tb/ndp_tb.py).

Pure Python (no simulator): the device-memory layout planner, descriptor / completion / array
packing through the Amaranth layouts, the checkpoint commands (LOG, UPDATE with
flags.checkpoint, MLP_LOG, RECOVER), the log regions of the layout and the CKPT_* CSR helpers
(on a fake env), the bound arithmetic and the ``trainingcxl run`` argument handling.
RTL (marked ``sim``): random rm-tiny LOOKUP + UPDATE for both output destinations, every
bad-input case, the update scratchpad overflow, and ``trainingcxl run``
end to end on rm-tiny. Replay a random test with TCXL_SEED=<seed> pytest tests/test_ndp.py -k <name>.
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from conftest import run_cocotb
from hw.ndp.command import MAX_TABLES, NdpError, NdpOpcode, PoolMode
from sim.bfm.ndp_host import (COMMAND, COMPLETION, FLAGS, STATS, TABLE, LayoutError, NdpCommand, NdpCompletion,
                              NdpTable, array_to_lines, f32_bits, lines_for, lines_to_array, log_command,
                              lookup_command, mlp_log_command, mlp_log_commands, plan_layout, recover_command,
                              tables_from_manifest, update_command)
from sim.model.checkpoint import REGION, CheckpointRegion
from sim.model.dlrm import get_preset
from sim.model.trace import TraceKnobs, generate_trace

MODULE = "sim.tb.ndp_tb"
TINY = [NdpTable(1000, 16, "sum"), NdpTable(512, 32, "mean"), NdpTable(257, 16, "weighted_sum"),
        NdpTable(64, 32, "sum")]


# --------------------------------------------------------------------------------------------
# layout planner
# --------------------------------------------------------------------------------------------
def test_layout_regions_are_disjoint_ordered_and_inside_memory():
    lay = plan_layout(TINY, batch_size=8, max_indices=300, capacity_lines=1 << 14)
    regions = lay.regions()
    for a, b in zip(regions, regions[1:]):
        assert a.end <= b.base, (a, b)
    assert regions[0].base >= 0 and regions[-1].end == 1 << 14
    assert [r.name for r in regions[:8]] == ["sq", "cq", "table_descs", "offsets", "indices", "weights", "grads",
                                            "outputs"]
    assert lay.sq.lines == lay.cq.lines == 16 and lay.table_descs.lines == 4
    assert lay.offsets.lines == lines_for(4 * 8 + 1) == 3
    assert lay.indices.lines == lay.weights.lines == lines_for(300) == 19
    assert lay.vector_lines == 1 + 2 + 1 + 2
    assert lay.row_pitch_lines == 7            # made odd: coprime with the power-of-two channel count
    assert lay.grads.lines == lay.outputs.lines == 8 * 7
    assert [r.lines for r in lay.table_regions] == [1000, 1024, 257, 128]
    assert lay.col_lines == (0, 1, 3, 4)
    assert lay.row_line(1, 5) == lay.table_regions[1].base + 10
    assert lay.vector_line(lay.outputs.base, 3, 2) == lay.outputs.base + 2 * 7 + 4


def test_layout_without_device_outputs_or_weights():
    lay = plan_layout(TINY[:2], batch_size=4, max_indices=0, capacity_lines=1 << 12, outputs_in_device=False)
    assert lay.outputs is None and lay.weights is None and lay.indices.lines == 1
    with pytest.raises(ValueError, match="out_line is required"):
        lookup_command(lay, index_count=0, has_weights=False)
    with pytest.raises(ValueError, match="no weights array"):
        update_command(lay, index_count=0, lr=0.1, has_weights=True)
    lay = plan_layout(TINY[:2], batch_size=4, max_indices=10, capacity_lines=1 << 12, has_weights=True)
    assert lay.weights is not None


def test_layout_too_big_names_the_sizes_and_a_rows_cap_that_fits():
    rm1 = get_preset("rm1")
    tables = [NdpTable(t.rows, t.dim, t.mode) for t in rm1.tables]
    with pytest.raises(LayoutError) as e:
        plan_layout(tables, batch_size=32, max_indices=32 * 80 * 20, capacity_lines=1 << 18)
    text = str(e.value)
    assert "needs 2627357 lines" in text and "the device has 262144 lines" in text
    cap = int(text.split("--rows-cap ")[1].split(")")[0])
    capped = [NdpTable(min(t.rows, cap), t.dim, t.mode) for t in tables]
    plan_layout(capped, batch_size=32, max_indices=32 * 80 * 20, capacity_lines=1 << 18)
    with pytest.raises(LayoutError):
        plan_layout([NdpTable(min(t.rows, cap + 1), t.dim, t.mode) for t in tables], batch_size=32,
                    max_indices=32 * 80 * 20, capacity_lines=1 << 18)


def test_layout_too_big_arguments_suggest_a_smaller_batch():
    with pytest.raises(LayoutError, match="smaller batch"):
        plan_layout(TINY, batch_size=4096, max_indices=4096 * 20, capacity_lines=1 << 14)


@pytest.mark.parametrize("kw, match", [
    ({"tables": [NdpTable(10, 16)] * (MAX_TABLES + 1)}, "1 to 128"),
    ({"tables": []}, "0 tables"),
    ({"batch_size": 0}, "batch_size"),
    ({"ring_slots": 12}, "power of two"),
    ({"ring_slots": 1 << 16}, "power of two"),
])
def test_layout_rejects_bad_requests(kw, match):
    args = {"tables": TINY, "batch_size": 4, "max_indices": 10, "capacity_lines": 1 << 14, **kw}
    tables = args.pop("tables")
    with pytest.raises(LayoutError, match=match):
        plan_layout(tables, **args)


@pytest.mark.parametrize("rows, dim, mode", [(0, 16, "sum"), (10, 24, "sum"), (10, 0, "sum"), (10, 272, "sum"),
                                             (10, 16, "max")])
def test_table_spec_rejects_what_the_device_cannot_describe(rows, dim, mode):
    with pytest.raises(LayoutError):
        NdpTable(rows, dim, mode)


def test_tables_from_a_trace_manifest():
    trace = generate_trace("rm-tiny", 1, 3, TraceKnobs(batch_size=2))
    assert tables_from_manifest(trace.manifest) == TINY


# --------------------------------------------------------------------------------------------
# packing
# --------------------------------------------------------------------------------------------
def test_table_descriptors_pack_the_layout():
    lay = plan_layout(TINY, batch_size=4, max_indices=64, capacity_lines=1 << 14)
    got = [TABLE.unpack(v) for v in lay.table_descriptors()]
    assert [d["base_addr"] for d in got] == [r.base for r in lay.table_regions]
    assert [d["rows"] for d in got] == [1000, 512, 257, 64]
    assert [d["dim"] for d in got] == [16, 32, 16, 32]
    assert [d["mode"] for d in got] == [PoolMode.SUM.value, PoolMode.MEAN.value, PoolMode.WEIGHTED_SUM.value,
                                        PoolMode.SUM.value]
    assert [d["col_lines"] for d in got] == [0, 1, 3, 4]
    assert all(v < 1 << 512 for v in lay.table_descriptors())


def test_commands_pack_every_field():
    lay = plan_layout(TINY, batch_size=4, max_indices=64, capacity_lines=1 << 14)
    up = update_command(lay, index_count=61, lr=0.05, has_weights=True, tag=0x1234)
    f = COMMAND.unpack(up.pack())
    assert f["index_count"] == 61
    assert f["opcode"] == NdpOpcode.UPDATE.value and f["tag"] == 0x1234
    assert f["num_tables"] == 4 and f["batch_size"] == 4 and f["row_pitch_lines"] == 7
    assert (f["tables_addr"], f["offsets_addr"], f["indices_addr"], f["weights_addr"], f["grad_addr"]) == \
        (lay.table_descs.base, lay.offsets.base, lay.indices.base, lay.weights.base, lay.grads.base)
    assert f["lr"] == f32_bits(0.05) == int(np.float32(0.05).view(np.uint32))
    assert FLAGS.unpack(f["flags"]) == {"out_to_host": 0, "has_weights": 1, "checkpoint": 0, "mlp_slot": 0,
                                        "reserved": 0}
    lk = lookup_command(lay, index_count=64, has_weights=False, out_line=1 << 30, out_to_host=True, tag=7)
    f = COMMAND.unpack(lk.pack())
    assert f["opcode"] == NdpOpcode.LOOKUP.value and f["out_addr"] == 1 << 30 and f["weights_addr"] == 0
    assert FLAGS.unpack(f["flags"])["out_to_host"] == 1 and FLAGS.unpack(f["flags"])["has_weights"] == 0
    assert COMMAND.unpack(lk.replace(opcode=0xFF).pack())["opcode"] == 0xFF
    assert lk.replace(opcode=6).name == "opcode 0x6" and lk.name == "LOOKUP"
    with pytest.raises(ValueError):
        NdpCommand(NdpOpcode.LOOKUP, 1, 1, 1 << 32, 0, 0, 1).pack()


def test_index_count_must_fit_the_layout():
    lay = plan_layout(TINY, batch_size=4, max_indices=64, capacity_lines=1 << 14)
    assert lookup_command(lay, index_count=64, has_weights=False).index_count == 64
    for bad in (-1, 65):
        with pytest.raises(ValueError, match="index_count"):
            lookup_command(lay, index_count=bad, has_weights=False)


def test_checkpoint_commands_pack_through_the_codec():
    lay = plan_layout(TINY, batch_size=4, max_indices=64, capacity_lines=1 << 14, emb_log=True)
    log = log_command(lay, 0xFFFF_0005, index_count=5, has_weights=True, tag=0x77)
    f = COMMAND.unpack(log.pack())
    assert f["index_count"] == 5
    assert f["opcode"] == NdpOpcode.LOG.value and f["batch"] == 0xFFFF_0005 and f["tag"] == 0x77
    assert (f["num_tables"], f["batch_size"], f["tables_addr"], f["offsets_addr"], f["indices_addr"],
            f["weights_addr"]) == (4, 4, lay.table_descs.base, lay.offsets.base, lay.indices.base, lay.weights.base)
    assert FLAGS.unpack(f["flags"])["checkpoint"] == 0
    up = update_command(lay, index_count=7, lr=0.5, has_weights=False, checkpoint_batch=9, tag=3)
    f = COMMAND.unpack(up.pack())
    assert f["opcode"] == NdpOpcode.UPDATE.value and f["batch"] == 9 and f["grad_addr"] == lay.grads.base
    assert FLAGS.unpack(f["flags"]) == {"out_to_host": 0, "has_weights": 0, "checkpoint": 1, "mlp_slot": 0,
                                        "reserved": 0}
    plain = COMMAND.unpack(update_command(lay, index_count=0, lr=0.5, has_weights=False).pack())
    assert plain["batch"] == 0 and FLAGS.unpack(plain["flags"])["checkpoint"] == 0
    mlp = mlp_log_command(12, 100, 25, 1, tag=0xABCD)
    f = COMMAND.unpack(mlp.pack())
    assert (f["opcode"], f["batch"], f["mlp_offset"], f["mlp_count"], f["tag"]) == \
        (NdpOpcode.MLP_LOG.value, 12, 100, 25, 0xABCD)
    assert FLAGS.unpack(f["flags"])["mlp_slot"] == 1 and f["num_tables"] == 0 and f["tables_addr"] == 0
    rec = COMMAND.unpack(recover_command(tag=5).pack())
    assert rec["opcode"] == NdpOpcode.RECOVER.value and rec["tag"] == 5 and rec["flags"] == 0
    for cmd in (log, up, mlp, recover_command(tag=5), lookup_command(lay, index_count=3, has_weights=False, tag=1)):
        assert NdpCommand.unpack(cmd.pack()) == cmd
        assert NdpCommand.unpack(cmd.pack()).pack() == cmd.pack()
    assert NdpCommand.unpack(log.replace(opcode=0xEE).pack()).opcode == 0xEE
    with pytest.raises(ValueError):
        mlp_log_command(1 << 32, 0, 1, 0).pack()
    with pytest.raises(ValueError):
        mlp_log_command(0, 0, 1, 2).pack()


def test_mlp_log_commands_cover_the_image_in_chunks():
    cmds = mlp_log_commands(7, 425, 0, chunks=4, tag=10)
    assert [(c.mlp_offset, c.mlp_count) for c in cmds] == [(0, 106), (106, 106), (212, 106), (318, 107)]
    assert {c.batch for c in cmds} == {7} and [c.tag for c in cmds] == [10, 11, 12, 13]
    assert [(c.mlp_offset, c.mlp_count) for c in mlp_log_commands(1, 3, 1)] == [(0, 3)]
    with pytest.raises(ValueError):
        mlp_log_commands(1, 3, 0, chunks=4)


def test_layout_reserves_checkpoint_logs():
    plain = plan_layout(TINY, batch_size=4, max_indices=50, capacity_lines=1 << 14)
    assert plain.emb_log is None and plain.mlp_log is None and plain.log_region is None
    lay = plan_layout(TINY, batch_size=4, max_indices=50, capacity_lines=1 << 14, emb_log=True, mlp_log_lines=425,
                      mlp_host_line=1 << 40)
    regions = lay.regions()
    for a, b in zip(regions, regions[1:]):
        assert a.end <= b.base, (a, b)
    assert [r.name for r in regions[-3:]] == ["emb_log", "mlp_log", "free"] and regions[-1].end == 1 << 14
    assert lay.emb_log.base == lay.table_regions[-1].end
    assert lay.slot_lines == 2 + 50 * 2 + 13 and lay.emb_log.lines == 2 * lay.slot_lines   # every index distinct
    assert lay.mlp_lines == 425 and lay.mlp_log.lines == 2 * 426
    assert lay.free.lines == plain.free.lines - lay.emb_log.lines - lay.mlp_log.lines
    r = lay.log_region
    assert r == CheckpointRegion(lay.emb_log.base, lay.slot_lines, lay.mlp_log.base, 425, 1 << 40)
    assert REGION.unpack(r.pack()) == {"log_base": r.log_base, "slot_lines": r.slot_lines, "mlp_base": r.mlp_base,
                                       "mlp_lines": 425, "mlp_host_addr": 1 << 40}
    assert r.emb_slot(3) == lay.emb_log.base + lay.slot_lines and r.mlp_slot(1) == lay.mlp_log.base + 426
    from sim.model.checkpoint import entries_lines, expected_log_entries
    tables = [np.full((spec.rows, spec.dim), i, np.float32) for i, spec in enumerate(TINY)]
    indices = np.array([3, 3, 9, 1, 1, 0, 7, 7, 7, 2, 3, 5] + [0] * 38, np.uint32)   # 50 indices, worst case fits
    offsets = np.array([0, 2, 3, 3, 5, 6, 6, 9, 9, 10, 10, 11, 12, 20, 30, 40, 50], np.uint32)
    exp = expected_log_entries(tables, offsets, indices, 4, lay)
    assert set(exp) == {(0, 3), (0, 9), (0, 1), (1, 0), (1, 7), (2, 2), (2, 3), (2, 5), (3, 0)}
    assert exp[(1, 7)].row_addr == lay.row_line(1, 7) and exp[(1, 7)].dim_lines == 2
    assert 2 + entries_lines(exp) <= lay.slot_lines
    capped = plan_layout(TINY, batch_size=4, max_indices=50, capacity_lines=1 << 14, emb_log=True, log_max_rows=7)
    assert capped.slot_lines == 2 + 7 * 2 + 2 and capped.mlp_log is None and capped.log_region.mlp_lines == 0
    only_mlp = plan_layout(TINY, batch_size=4, max_indices=50, capacity_lines=1 << 14, mlp_log_lines=3)
    assert only_mlp.emb_log is None and only_mlp.log_region.slot_lines == 0
    with pytest.raises(LayoutError, match="needs"):
        plan_layout(TINY, batch_size=4, max_indices=50, capacity_lines=1 << 14, mlp_log_lines=1 << 13)
    with pytest.raises(LayoutError, match="log_max_rows"):
        plan_layout(TINY, batch_size=4, max_indices=50, capacity_lines=1 << 14, emb_log=True, log_max_rows=-1)


class _FakeCsr:
    def __init__(self, values=None):
        self.writes, self.values = [], dict(values or {})

    async def write(self, name, value):
        self.writes.append((name, value))

    async def read(self, name):
        return self.values.get(name, 0)


def _fake_host(layout, csr_values=None):
    from types import SimpleNamespace
    from sim.bfm.ndp_host import NdpHost
    env = SimpleNamespace(config=SimpleNamespace(capacity_lines=layout.capacity_lines, channels=2),
                          host=SimpleNamespace(listeners=[]), dut=SimpleNamespace(), csr=_FakeCsr(csr_values))
    return NdpHost(env, layout), env.csr


def test_program_checkpoint_and_read_recovery_use_the_ckpt_csrs():
    import asyncio
    from hw.cxl_controller.csr_map import field
    lay = plan_layout(TINY, batch_size=4, max_indices=50, capacity_lines=1 << 14, emb_log=True, mlp_log_lines=9,
                      mlp_host_line=(0x2A5 << 32) | 0x1234_5678)
    host, csr = _fake_host(lay)
    asyncio.run(host.program_checkpoint())
    r = lay.log_region
    hi = field("CKPT_MLP_ADDR_HI", "ADDR")
    assert csr.writes == [("CKPT_LOG_BASE", r.log_base), ("CKPT_SLOT_LINES", r.slot_lines),
                          ("CKPT_MLP_BASE", r.mlp_base), ("CKPT_MLP_LINES", 9), ("CKPT_MLP_ADDR_LO", 0x1234_5678),
                          ("CKPT_MLP_ADDR_HI", 0x2A5 << hi.lsb)]
    csr.writes.clear()
    asyncio.run(host.program_checkpoint(CheckpointRegion(1, 2, 3, 4, 5), mlp_host_line=6))
    assert [v for _, v in csr.writes] == [1, 2, 3, 4, 6, 0]
    with pytest.raises(ValueError, match="does not fit"):
        asyncio.run(host.program_checkpoint(mlp_host_line=1 << 46))
    bits = {n: field("CKPT_RECOVER_STATUS", n).lsb for n in ("EMB_VALID", "MLP_VALID", "ROLLED_BACK", "MLP_SLOT")}
    status = (1 << bits["EMB_VALID"]) | (1 << bits["ROLLED_BACK"]) | (1 << bits["MLP_VALID"]) | (1 << bits["MLP_SLOT"])
    host, _ = _fake_host(lay, {"CKPT_RECOVERED_EMB": 17, "CKPT_RECOVERED_MLP": 12, "CKPT_RECOVER_STATUS": status})
    res = asyncio.run(host.read_recovery())
    assert res.csr_view() == {"emb_valid": 1, "emb_batches": 17, "rolled_back": 1, "mlp_valid": 1, "mlp_batch": 12,
                              "mlp_slot": 1} and res.error is None
    plain, _ = _fake_host(plan_layout(TINY, batch_size=4, max_indices=50, capacity_lines=1 << 14))
    with pytest.raises(ValueError, match="no checkpoint log"):
        asyncio.run(plain.program_checkpoint())


def test_completion_unpacks_error_and_stats():
    stats = {"lookups": 10, "rows_read": 9, "rows_written": 8, "unique_rows": 7, "lines_read": 6, "lines_written": 5,
             "lines_pushed": 4, "cache_hits": 3}
    line = COMPLETION.pack(valid=1, error=NdpError.INDEX_RANGE, tag=0xBEEF, opcode=NdpOpcode.UPDATE, error_info=33,
                           cycles=12345, stats=STATS.pack(**stats))
    c = NdpCompletion.unpack(line)
    assert (c.valid, c.tag, c.opcode, c.error_info, c.cycles) == (1, 0xBEEF, 2, 33, 12345)
    assert not c.ok and c.error_name == "INDEX_RANGE" and c.stats == stats
    assert "INDEX_RANGE" in str(c) and "UPDATE" in str(c)
    assert NdpCompletion.unpack(COMPLETION.pack(valid=1, error=42)).error_name == "reserved(0x2a)"


def test_arrays_pack_sixteen_elements_per_line_little_endian():
    lines = array_to_lines(np.arange(1, 18, dtype=np.uint32))
    assert len(lines) == 2
    assert lines[0] & 0xFFFF_FFFF == 1 and (lines[0] >> 32 * 15) == 16 and lines[1] == 17
    assert np.array_equal(lines_to_array(lines, np.uint32, 17), np.arange(1, 18))
    assert array_to_lines(np.zeros(0, np.uint32)) == []
    bits = np.array([0x7FC00001, 0x80000000, 0x00000001, 0x3F800000, 0xFF800000], dtype=np.uint32)
    back = lines_to_array(array_to_lines(bits.view(np.float32), np.float32), np.float32, 5)
    assert np.array_equal(back.view(np.uint32), bits)
    table = np.arange(64, dtype=np.float32).reshape(2, 32)          # row r at base + r * dim/16
    lines = array_to_lines(table, np.float32)
    assert len(lines) == 4 and lines_to_array(lines[2:3], np.float32)[0] == 32.0


# --------------------------------------------------------------------------------------------
# figures and the run command
# --------------------------------------------------------------------------------------------
def test_media_bound_is_the_busiest_channel():
    from sim.tb.ndp_run_tb import even_spread, media_bound_cycles, media_costs
    rd, wr = media_costs(500)
    assert (rd, wr) == (533, 3200)
    assert media_bound_cycles([(256, 0), (0, 0), (512, 1), (0, 0)], rd, wr) == (512 * 533 + 3200) / 256
    assert media_bound_cycles([], rd, wr) == 0.0
    assert even_spread(10, 3, 4) == [(3, 1), (2, 0), (2, 0), (2, 0)]


def _run_args(**kw):
    from tools.run_cmd import add_run_parser
    p = argparse.ArgumentParser()
    add_run_parser(p.add_subparsers())
    argv = ["run", "--model", kw.pop("model", "rm-tiny"), "--batches", str(kw.pop("batches", 1))]
    for k, v in kw.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    return p.parse_args(argv)


def test_run_picks_the_default_device_when_the_model_fits_and_explains_when_not(monkeypatch):
    from hw.config import DeviceConfig
    from tools.run_cmd import RunError, choose_device
    trace = generate_trace("rm-tiny", 1, 1, TraceKnobs())
    cfg, layout = choose_device(trace, "device")
    assert cfg == DeviceConfig.for_simulation() and layout.outputs is not None
    trace = generate_trace("rm2", 1, 1, TraceKnobs(batch_size=1))      # 80 x 65536 rows x 2 lines
    assert choose_device(trace, "host")[0] == DeviceConfig.for_simulation()   # 640 MiB: the 1 GiB default
    import tools.run_cmd
    monkeypatch.setattr(tools.run_cmd, "DEVICE_CAPACITIES", (16 << 20, 64 << 20))
    with pytest.raises(RunError, match=r"--rows-cap \d+.*tried devices up to 64 MiB"):
        choose_device(trace, "host")


def test_run_result_table():
    from tools.run_cmd import format_result
    text = format_result({"verified": True, "model": "rm1", "config": "cxl-d", "phase": "embedding",
                          "lookup_efficiency": 0.51234, "lookup_stats": {"lookups": 5},
                          "batches": [{"batch": 0, "lookups": 5, "cycles_lookup": 100}]})
    assert "rm1 cxl-d embedding" in text and "0.5123" in text and "lookup.lookups" in text
    assert text.splitlines()[-1].split()[:3] == ["0", "5", "None"]


# --------------------------------------------------------------------------------------------
# RTL
# --------------------------------------------------------------------------------------------
@pytest.mark.sim
@pytest.mark.parametrize("testcase", ["random_lookup_update_device_out", "random_lookup_update_host_out",
                                      "bad_inputs_are_rejected", "update_scratchpad_overflow",
                                      "empty_bags_next_to_nonfinite_weights", "garbage_outside_bags_changes_nothing"])
def test_ndp_rtl(harness, testcase):
    run_cocotb(harness, MODULE, testcase)


@pytest.mark.sim
def test_run_command_end_to_end(harness, tmp_path, capsys):
    from tools.run_cmd import cmd_run
    out = tmp_path / "run.json"
    args = _run_args(model="rm-tiny", batches=2, batch_size=6, seed=5, json=out, media_timeline=100)
    assert cmd_run(args) == 0, capsys.readouterr().out[-3000:]
    result = json.loads(out.read_text())
    assert result["verified"] and result["model"] == "rm-tiny" and len(result["batches"]) == 2
    assert result["lookups"] == sum(b["lookups"] for b in result["batches"])
    for key in ("lines_read", "cycles_lookup", "cycles_update", "bound_cycles_lookup", "lookup_efficiency",
                "update_efficiency", "sim_cycles_per_second"):
        assert result[key] is not None and result[key] > 0, key
    assert 0 < result["lookup_efficiency"] <= 1.0 and 0 < result["update_efficiency"] <= 1.0
    # The least traffic (sim/tb/min_traffic.py) is part of what the media counters saw: per
    # batch the physical bound is positive and at most the media-utilisation bound (LOOKUP's
    # physical bound counts every occurrence's row lines, the media only the row cache's
    # misses: there the row lines are split between the two).
    for b in result["batches"]:
        assert 0 < b["physical_bound_cycles_update"] <= b["bound_cycles_update"], b
        assert 0 < b["physical_bound_cycles_lookup"], b
        assert b["lookup_cache_hits"] + b["lookup_stats"]["lines_read"] >= b["lookup_row_lines"] > 0, b
        assert b["lookup_cache_hits"] == b["lookup_stats"]["cache_hits"] <= b["lookup_row_lines"], b
    assert 0 <= result["lookup_cache_hit_rate"] <= 1
    assert 0 < result["update_physical_efficiency"] <= result["update_efficiency"]
    assert set(result["efficiency_bounds"]) == {"lookup_efficiency, update_efficiency",
                                                "lookup_physical_efficiency, update_physical_efficiency",
                                                "lookup_cache_hit_rate", "lookup_feeder_efficiency"}
    assert 0 < result["lookup_feeder_efficiency"] <= 1.0
    # --media-timeline: the windows tile each command and their lines add up, per channel, to
    # the media counters' delta over the command (sim/bfm/media_timeline.py).
    for b in result["batches"]:
        for phase in ("lookup", "update"):
            rows, media = b[f"media_timeline_{phase}"], b[f"media_{phase}"]
            assert rows and [r["cycle"] for r in rows] == [100 * i for i in range(len(rows))], rows
            assert all(r["cycles"] == 100 for r in rows[:-1]) and 0 < rows[-1]["cycles"] <= 100
            for c, (reads, writes) in enumerate(media):
                assert sum(r["reads"][c] for r in rows) == reads, (phase, c)
                assert sum(r["writes"][c] for r in rows) == writes, (phase, c)
            assert all(0 <= occ <= 1 for r in rows[:-1] for occ in r["occupancy"]), rows
