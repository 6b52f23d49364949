"""The NDP command fuzz: its golden validator by hand (pure Python) and a short RTL run.

- Golden validator (sim/model/ndp_validate.py): hand-built commands on the fuzz model's layout,
  a few per NdpError code, each stating the expected code and error_info from the documented
  rules; precedence cases (two faults: the first in the documented order wins); LOOKUP and
  UPDATE's different stream orders.
- Generator (sim/tb/fuzz_ndp_gen.py): every fault kind applies, and the validator rejects
  every non-``accepted`` kind alone.
- ``test_fuzz_ndp_short`` (sim): ``fuzz_ndp`` for 90 steps: clean, and every fault kind was
  injected at least once (the schedule starts with each kind once).
"""
import json

import numpy as np
import pytest

from conftest import run_cocotb
from hw.ndp.command import MAX_TABLES, AddressFault, NdpError, NdpOpcode
from sim.model.ndp_validate import MAX_BAG, expected_error, log_slot_freed
from sim.tb.fuzz_ndp_gen import ALL_KINDS, FAULTS, MEAN_TABLE, WEIGHTED_TABLE, FuzzGen

CAP = 1 << 18


@pytest.fixture
def gen():
    g = FuzzGen(CAP, np.random.default_rng(5))
    g.logged = {0: 6}
    return g


def check(g, case, code, info=None):
    got, got_info = expected_error(case.line(), case.desc_lines(), case.offsets, case.indices, CAP,
                                   logged=g.logged)
    assert got == code, (got, got_info)
    if info is not None:
        assert got_info == info, (got, got_info)


def both(g):
    return [g.valid("lookup"), g.valid("update")]


def cmd(case, **kw):
    case.cmd = case.cmd.replace(**kw)
    return case


def test_valid_commands_are_ok(gen):
    for op in ("lookup", "update", "ckpt_update", "log", "nop"):
        for _ in range(20):
            check(gen, gen.valid(op), NdpError.OK, 0)


def test_bad_opcode(gen):
    for c in both(gen):
        check(gen, cmd(c, opcode=6), NdpError.BAD_OPCODE, 0)
        check(gen, cmd(c, opcode=0xFF, num_tables=0), NdpError.BAD_OPCODE, 0)   # before BAD_TABLES
    check(gen, cmd(gen.valid("nop"), num_tables=0, batch_size=0), NdpError.OK, 0)


def test_bad_tables(gen):
    for c in both(gen):
        check(gen, cmd(c, num_tables=0), NdpError.BAD_TABLES, 0)
    for c in both(gen):
        check(gen, cmd(c, num_tables=MAX_TABLES + 1, tables_addr=CAP), NdpError.BAD_TABLES, 0)
    for c in both(gen):
        check(gen, cmd(c, batch_size=0), NdpError.BAD_TABLES, 0)
    c = gen.valid("lookup")                                        # T*B = 2**32 - 1 (the finding)
    check(gen, cmd(c, num_tables=1, batch_size=(1 << 32) - 1), NdpError.BAD_TABLES, 0)


def test_address_of_descriptor_arrays(gen):
    lay = gen.layout
    c = gen.valid("lookup")
    check(gen, cmd(c, tables_addr=CAP - 3), NdpError.ADDRESS, AddressFault.TABLES)      # 4 tables
    check(gen, cmd(gen.valid("lookup"), tables_addr=CAP - 4), NdpError.OK)               # just fits
    c = gen.valid("update")
    check(gen, cmd(c, offsets_addr=CAP - 1), NdpError.ADDRESS, AddressFault.OFFSETS)      # 17 offsets, 2 lines
    span = lay.batch_size * lay.row_pitch_lines
    check(gen, cmd(gen.valid("lookup"), out_addr=CAP - span + 1), NdpError.ADDRESS, AddressFault.OUTPUTS)
    check(gen, cmd(gen.valid("update"), out_addr=CAP), NdpError.OK)                       # UPDATE: no outputs
    check(gen, cmd(gen.valid("update"), grad_addr=CAP - span + 1), NdpError.ADDRESS, AddressFault.GRADIENTS)
    check(gen, cmd(gen.valid("lookup"), grad_addr=CAP), NdpError.OK)                       # LOOKUP: no gradients
    # tables before offsets before outputs
    check(gen, cmd(gen.valid("lookup"), tables_addr=CAP, offsets_addr=CAP, out_addr=CAP),
          NdpError.ADDRESS, AddressFault.TABLES)


def test_table_descriptor_checks(gen):
    c = gen.valid("lookup")
    c.descs[2]["dim"] = 24
    check(gen, c, NdpError.BAD_DIM, 2)
    c = gen.valid("update")
    c.descs[0]["dim"] = 272
    check(gen, c, NdpError.BAD_DIM, 0)
    c = gen.valid("lookup")
    c.descs[1]["rows"] = 0
    check(gen, c, NdpError.BAD_DESCRIPTOR, 1)
    c = gen.valid("update")
    c.descs[3]["mode"] = 3
    check(gen, c, NdpError.BAD_DESCRIPTOR, 3)
    check(gen, cmd(gen.valid("lookup"), has_weights=False), NdpError.BAD_DESCRIPTOR, WEIGHTED_TABLE)
    c = gen.valid("lookup")
    check(gen, cmd(c, row_pitch_lines=c.cmd.row_pitch_lines - 1), NdpError.BAD_DESCRIPTOR, 3)
    c = gen.valid("update")
    c.descs[1]["base_addr"] = CAP - 2 * c.descs[1]["rows"] + 1
    check(gen, c, NdpError.ADDRESS, AddressFault.TABLE_ROWS + 1)
    c = gen.valid("update")
    c.descs[3]["rows"] = 1 << 31
    check(gen, c, NdpError.ADDRESS, AddressFault.TABLE_ROWS + 3)
    # table by table: table 1's BAD_DESCRIPTOR before table 2's BAD_DIM; in one table BAD_DIM first
    c = gen.valid("lookup")
    c.descs[1]["rows"], c.descs[2]["dim"] = 0, 8
    check(gen, c, NdpError.BAD_DESCRIPTOR, 1)
    c = gen.valid("lookup")
    c.descs[2]["rows"], c.descs[2]["dim"] = 0, 8
    check(gen, c, NdpError.BAD_DIM, 2)
    c = gen.valid("lookup")                   # descriptors after outputs' ADDRESS
    c.descs[0]["dim"] = 8
    check(gen, cmd(c, out_addr=CAP), NdpError.ADDRESS, AddressFault.OUTPUTS)


def test_not_logged(gen):
    c = gen.valid("update")
    check(gen, cmd(c, checkpoint=True, batch=7), NdpError.NOT_LOGGED, 0)        # slot 1: nothing
    check(gen, cmd(gen.valid("update"), checkpoint=True, batch=8), NdpError.NOT_LOGGED, 0)   # slot 0 holds 6
    check(gen, cmd(gen.valid("update"), checkpoint=True, batch=6), NdpError.OK, 0)
    check(gen, cmd(gen.valid("lookup"), checkpoint=True, batch=7), NdpError.OK, 0)      # LOOKUP ignores it
    c = gen.valid("update")                   # after the table checks, before the arrays
    c.offsets[0] = 1
    check(gen, cmd(c, checkpoint=True, batch=7), NdpError.NOT_LOGGED, 0)
    c = gen.valid("update")
    c.descs[0]["rows"] = 0
    check(gen, cmd(c, checkpoint=True, batch=7), NdpError.BAD_DESCRIPTOR, 0)


def test_offsets(gen):
    nb = len(gen.layout.tables) * gen.layout.batch_size
    for c in both(gen):
        c.offsets[0] = 1                                                # UPDATE: a step down to offsets[1] first
        check(gen, c, NdpError.OFFSETS, 1 if c.op == "update" and c.offsets[1] < 1 else 0)
    for c in both(gen):
        check(gen, cmd(c, index_count=c.cmd.index_count + 1), NdpError.OFFSETS, nb)
    for c in both(gen):
        c.offsets[5] = c.offsets[4] + 1
        c.offsets[6] = c.offsets[4]                                     # 6 steps down from 5
        c.offsets[7:nb] = np.maximum(c.offsets[7:nb], c.offsets[5])
        check(gen, c, NdpError.OFFSETS, 6)
    # an offset above the last one: LOOKUP names it, UPDATE the step down after it
    for c in both(gen):
        c.offsets[3] = c.offsets[nb] + 5
        check(gen, c, NdpError.OFFSETS, 3 if c.op == "lookup" else 4)
    # LOOKUP: index_count before a step down; UPDATE: the step down first
    for c in both(gen):
        c.offsets[2] = c.offsets[1] + 100
        check(gen, cmd(c, index_count=c.cmd.index_count + 1), NdpError.OFFSETS, nb if c.op == "lookup" else 3)


def test_index_range(gen):
    B = gen.layout.batch_size
    for c in both(gen):
        lo, hi = int(c.offsets[B]), int(c.offsets[2 * B])               # table 1
        assert hi > lo
        c.indices[hi - 1] = gen.layout.tables[1].rows
        check(gen, c, NdpError.INDEX_RANGE, hi - 1)
    for c in both(gen):                                                # the first position wins
        n = int(c.offsets[len(gen.layout.tables) * B])
        c.indices[n - 1] = 0xFFFF_FFFF
        c.indices[0] = 0xFFFF_FFFF
        check(gen, c, NdpError.INDEX_RANGE, 0)
    c = gen.valid("lookup")                                            # fewer rows than the indices use
    c.descs[0]["rows"] = 1
    c.indices[0] = 1
    check(gen, c, NdpError.INDEX_RANGE, 0)
    for c in both(gen):                                                # ADDRESS INDICES before INDEX_RANGE
        c.indices[0] = 0xFFFF_FFFF
        check(gen, cmd(c, indices_addr=CAP - 1), NdpError.ADDRESS, AddressFault.INDICES)
    for c in both(gen):
        c.indices[0] = 0xFFFF_FFFF
        check(gen, cmd(c, weights_addr=CAP), NdpError.ADDRESS, AddressFault.WEIGHTS)
    # LOOKUP streams bag by bag: a bad index in bag 0 before a step down in bag 5's offset
    c = gen.valid("lookup")
    while c.offsets[1] == 0:
        c = gen.valid("lookup")
    c.indices[0] = 0xFFFF_FFFF
    c.offsets[6] = c.offsets[5] - 1 if c.offsets[5] else 0
    c.offsets[5] = max(c.offsets[5], 1)
    check(gen, c, NdpError.INDEX_RANGE, 0)
    check(gen, cmd(gen.valid("update"), opcode=NdpOpcode.UPDATE), NdpError.OK)


def test_long_bag(gen):
    B = gen.layout.batch_size
    nb = len(gen.layout.tables) * B
    for op, t, code in (("lookup", MEAN_TABLE, NdpError.BAD_DESCRIPTOR), ("update", 0, NdpError.OFFSETS),
                        ("update", 3, NdpError.OFFSETS)):
        c = gen.valid(op)
        k = t * B
        extra = MAX_BAG + 1 - int(c.offsets[k + 1] - c.offsets[k])
        c.offsets[k + 1:nb + 1] += extra
        c.cmd = c.cmd.replace(index_count=int(c.offsets[nb]))
        check(gen, c, code, k if code == NdpError.BAD_DESCRIPTOR else k + 1)


def test_log(gen):
    nb = len(gen.layout.tables) * gen.layout.batch_size
    check(gen, cmd(gen.valid("log"), weights_addr=CAP), NdpError.OK, 0)             # LOG reads no weights
    check(gen, cmd(gen.valid("log"), out_addr=CAP, grad_addr=CAP), NdpError.OK, 0)  # nor outputs / gradients
    check(gen, cmd(gen.valid("log"), indices_addr=CAP), NdpError.ADDRESS, AddressFault.INDICES)
    check(gen, cmd(gen.valid("log"), index_count=0xFFFF_FFFF), NdpError.OFFSETS, nb)
    c = gen.valid("log")
    c.indices[0] = 0xFFFF_FFFF
    check(gen, c, NdpError.INDEX_RANGE, 0)
    for c in (gen.valid("log"), gen.valid("update")):                  # offsets[0] = 5 > offsets[1]
        c.offsets[0] = int(c.offsets[1]) + 5
        check(gen, c, NdpError.OFFSETS, 0 if c.op == "log" else 1)
    assert expected_error(gen.valid("log").line(), gen.valid("log").desc_lines(), c.offsets, c.indices, CAP,
                          log_region_ok=False) == (NdpError.ADDRESS, AddressFault.LOG_REGION)
    # the slot is freed once the engine ran (array errors), not by the processor's checks
    assert log_slot_freed(NdpError.OK, 0) and log_slot_freed(NdpError.INDEX_RANGE, 3)
    assert log_slot_freed(NdpError.ADDRESS, AddressFault.INDICES) and log_slot_freed(NdpError.OFFSETS, 0)
    for code, info in ((NdpError.BAD_TABLES, 0), (NdpError.BAD_DIM, 1), (NdpError.ADDRESS, AddressFault.TABLES),
                       (NdpError.ADDRESS, AddressFault.OFFSETS), (NdpError.ADDRESS, AddressFault.LOG_REGION),
                       (NdpError.ADDRESS, AddressFault.TABLE_ROWS + 2), (NdpError.BAD_OPCODE, 0)):
        assert not log_slot_freed(code, info), (code, info)


def test_every_fault_kind_applies(gen):
    rng = np.random.default_rng(1)
    for kind, fault in FAULTS.items():
        for _ in range(30):
            gen.rng = rng
            c = gen.malformed([kind])
            code, _ = expected_error(c.line(), c.desc_lines(), c.offsets, c.indices, CAP, logged=gen.logged)
            if fault.accepted:
                assert code == NdpError.OK, (kind, code)
            elif kind != "rows_fewer":          # fewer rows may still cover every index of the batch
                assert code != NdpError.OK, (kind, c.cmd)
    for _ in range(5000):                       # combinations pack and validate (no field overflows)
        c = gen.malformed(gen.pick_kinds(True))
        expected_error(c.line(), c.desc_lines(), c.offsets, c.indices, CAP, logged=gen.logged)


def test_nop_and_reserved_opcode_values_from_hw():
    assert NdpOpcode.NOP.value == 0 and max(o.value for o in NdpOpcode) < 6


@pytest.mark.sim
def test_fuzz_ndp_short(harness, tmp_path):
    out = tmp_path / "fuzz.json"
    run_cocotb(harness, "sim.tb.fuzz_ndp_tb", "fuzz_ndp", TCXL_SEED=3, TCXL_FUZZ_COUNT=2 * len(ALL_KINDS) + 4,
               TCXL_RESULT_JSON=out)
    r = json.loads(out.read_text())
    for key in ("hangs", "mismatches", "protocol_violations", "wrong_error_codes", "table_bytes_changed_by_rejected",
                "wrong_error_info"):
        assert r[key] == 0, (key, r)
    assert all(r["faults"][k] >= 1 for k in ALL_KINDS), r["faults"]
    assert r["rejected"] > 0 and r["accepted"] > 0
