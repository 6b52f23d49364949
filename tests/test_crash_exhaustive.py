"""Exhaustive persist-point crash consistency (sim/tb/crash_exhaustive.py, ``trainingcxl crash --exhaustive``).

RTL (marked ``sim``): rm-tiny, batch size 4, rows cap 64, target batch 2. The recording finds
every media write acknowledgement of the batch and classifies it; the short case cuts at
every record boundary (FREE, LOGGED, APPLIED, MLP_LOGGED: the flags recovery decides on),
one edge before its ack (torn) and at it (just durable), and requires
every recovery consistent (golden recovery, tables, MLP log, nothing acknowledged or durable
lost), every cut verified by its per-channel ack counts and the second recording equal to the
first. The full run is ``trainingcxl crash --exhaustive`` (a CLI command, not in make test).
Pure Python: the classifier and the argument handling.
"""
from __future__ import annotations

import argparse
import json

import pytest

from tools.crash_cmd import cmd_crash

RECORD_CLASSES = ("record_FREE", "record_LOGGED", "record_APPLIED", "record_MLP_LOGGED")


def _args(**kw):
    base = dict(model="rm-tiny", points=None, seed=5, json=None, phases="", schedule="cxl-b", rows_cap=None,
                batch_size=None, trace=None, exhaustive=True, target_batch=2, boundaries=":", stride=1,
                offsets="-1,0,1", progress=25, classes="")
    base.update(kw)
    return argparse.Namespace(**base)


@pytest.mark.parametrize("kw, message", [
    (dict(offsets="a,b"), "--offsets takes a comma list"),
    (dict(boundaries="3"), "--boundaries A:B"),
    (dict(stride=0), "at least 1"),
    (dict(target_batch=0), "at least 1"),
    (dict(trace="x.npz"), "--trace is not supported"),
    (dict(mlp_spread=2), "--mlp-spread is for the random campaign"),
])
def test_exhaustive_rejects_bad_requests(kw, message, capsys):
    assert cmd_crash(_args(**kw)) == 2
    assert message in capsys.readouterr().err


def test_classify_by_layout():
    from hw.config import DeviceConfig
    from sim.model.checkpoint import pack_record
    from hw.checkpoint.log_format import LogState
    from sim.model.dlrm import get_preset
    from sim.model.trace import TraceKnobs, generate_trace
    from sim.tb.ckpt_run import plan_checkpoint_layout
    from sim.tb.crash_exhaustive import classify
    trace = generate_trace(get_preset("rm-tiny"), 4, 1, TraceKnobs(rows_cap=64, batch_size=4))
    lay = plan_checkpoint_layout(trace, DeviceConfig.for_simulation().capacity_lines, 1 << 30)
    slot1 = lay.emb_log.base + lay.slot_lines
    assert classify(lay, slot1, pack_record(LogState.APPLIED, 1, 3)) == "record_APPLIED"
    assert classify(lay, slot1, pack_record(LogState.APPLIED, 1, 3) ^ 1) == "record_invalid"
    assert classify(lay, slot1 + 2, 0) == "log_entry"
    mlp1 = lay.mlp_log.base + 1 + lay.mlp_lines
    assert classify(lay, mlp1, pack_record(LogState.MLP_LOGGED, 1, 3)) == "record_MLP_LOGGED"
    assert classify(lay, mlp1 + 1, 0) == "mlp_image"
    assert classify(lay, lay.table_regions[2].base, 0) == "row_writeback"
    assert classify(lay, lay.cq.base, 0) == "completion"
    assert classify(lay, None, 0) == "unchanged"


def _exhaustive(tmp_path, capsys, **kw) -> dict:
    out = tmp_path / "exh.json"
    code = cmd_crash(_args(json=out, **kw))
    text = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert code == 0, text[-4000:]
    return result


@pytest.mark.sim
def test_crash_exhaustive_records(harness, tmp_path, capsys):
    """Every record boundary of batch 2 cut torn (-1) and just durable (0): 0 inconsistent, all classes recorded."""
    r = _exhaustive(tmp_path, capsys, classes=",".join(RECORD_CLASSES), offsets="-1,0")
    assert r["verified"] and r["inconsistent"] == 0 and r["lost_acknowledged_writes"] == 0
    assert r["lost_durable_records"] == 0 and r["unverified_cuts"] == 0 and r["rerecord_matches"]
    assert r["boundaries"] > 0 and r["cuts"] == r["consistent"] > 0
    by = r["boundaries_by_class"]
    for cls in RECORD_CLASSES + ("log_entry", "mlp_image", "row_writeback", "completion"):
        assert by.get(cls, 0) > 0, by
    assert "unchanged" not in by and "record_invalid" not in by, by
    assert by["record_LOGGED"] == by["record_APPLIED"] == by["record_MLP_LOGGED"] == 1, by
    assert by["record_FREE"] == 3, by          # LOG frees batch 0's slot; MLP_LOG frees its own and the other
    # a record just durable (offset 0) is honoured: 3 batches after APPLIED, batch 2's MLP log after
    # MLP_LOGGED (one edge before, the torn record may land whole or not: either is consistent)
    at = {c["class"]: c for c in r["record_cuts"] if c["offset"] == 0}
    assert at["record_APPLIED"]["emb_batches"] == 3 and at["record_MLP_LOGGED"]["mlp_batch"] == 2, at
    assert at["record_LOGGED"]["emb_batches"] == 2, at
