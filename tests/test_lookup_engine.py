"""LookupEngine (hw/ndp/lookup.py) alone in Amaranth's simulator, against the golden model.

A small memory stand-in answers every port out of order with random latency; table
descriptors come from a 1-cycle read port as the command processor's memory would give
them. Pooled vectors (device memory or pushes) must equal sim.model.embedding.tbe_forward
bit for bit (NaN equals any NaN). Small on purpose: the full device runs the big cases on
Verilator (tests/test_ndp.py)."""
import os
import random

import numpy as np
import pytest
from amaranth.sim import Simulator

from hw.ndp.command import AddressFault, CommandDescriptor, TableDescriptor, NdpError, PoolMode
from hw.ndp.lookup import LookupEngine
from hw.ndp.lookup_feeder import MAX_MEAN_LENGTH
from sim.model.codec import StructCodec
from sim.model.embedding import tbe_forward

CMD = StructCodec(CommandDescriptor)
TBL = StructCodec(TableDescriptor)
MODES = {"sum": PoolMode.SUM, "mean": PoolMode.MEAN, "weighted_sum": PoolMode.WEIGHTED_SUM}
CAP = 1 << 12
BIG_CAP = 1 << 14                           # the "mean_long" case: 65,537 indices and weights


def _lines_of_u32(values) -> list[int]:
    raw = np.asarray(values, dtype="<u4").tobytes()
    raw += bytes(-len(raw) % 64)
    return [int.from_bytes(raw[i:i + 64], "little") for i in range(0, len(raw), 64)]


def _case(rng: np.random.Generator, bad: str | None = None):
    specs = [(37, 16, "sum"), (20, 32, "mean"), (11, 16, "weighted_sum")]
    B = 3
    if bad == "one_line":                   # one bag, one dim-16 row: a single pooled line
        specs, B = [(37, 16, "sum")], 1
    hot = bad == "hot"                      # rows repeat (the row cache's hits), more bags
    if hot:
        B = 8
    tables = [rng.standard_normal((rows, dim)).astype(np.float32) for rows, dim, _ in specs]
    lengths = rng.integers(1 if bad == "one_line" else 0, 7 if hot else 5, size=len(specs) * B)
    if bad == "mean_long":                  # the MEAN table's first bag, loaded as table 0 ends
        lengths[B] = MAX_MEAN_LENGTH + 1
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.uint32)
    indices = np.concatenate([rng.integers(0, 3 if hot else specs[i // B][0], size=n) for i, n in enumerate(lengths)]
                             ).astype(np.uint32)
    weights = rng.standard_normal(indices.size).astype(np.float32)
    index_count = indices.size
    if bad == "last_empty":                 # the command ends with an EMPTY item
        lengths[-3:] = [1, 0, 0]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.uint32)
        indices = np.concatenate([rng.integers(0, specs[i // B][0], size=n) for i, n in enumerate(lengths)]
                                 ).astype(np.uint32)
        weights = rng.standard_normal(indices.size).astype(np.float32)
        index_count = indices.size
    if bad == "nonfinite":
        # Every empty bag's offsets[b] points at the next bag's first weight (or past the end):
        # make those weights non-finite; the empty bag must still pool to +0.0.
        lengths[rng.random(lengths.size) < 0.4] = 0
        lengths[-1] = max(int(lengths[-1]), 1)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.uint32)
        indices = np.concatenate([rng.integers(0, specs[i // B][0], size=n) for i, n in enumerate(lengths)]
                                 ).astype(np.uint32)
        weights = rng.standard_normal(indices.size).astype(np.float32)
        index_count = indices.size
        special = np.array([np.inf, -np.inf, np.nan], np.float32)
        for b in np.flatnonzero(lengths == 0):
            if offsets[b] < indices.size:
                weights[offsets[b]] = special[b % 3]
        # and garbage after the last index (never read)
        indices = np.concatenate([indices, np.full(20, 0xFFFF_FFFF, np.uint32)])
        weights = np.concatenate([weights, np.full(20, np.nan, np.float32)])
    if bad == "first":
        offsets = offsets + np.uint32(1)
        indices = np.concatenate([[0], indices]).astype(np.uint32)
        weights = np.concatenate([[1.0], weights]).astype(np.float32)
    if bad in ("count", "count_outside"):
        index_count += 1
    if bad == "index":
        indices[indices.size // 2] = specs[(np.searchsorted(offsets, indices.size // 2, "right") - 1) // B][0]
    if bad == "offsets":
        offsets[4] = offsets[3] - 1 if offsets[3] else offsets[3] + 100
    mem: dict[int, int] = {}
    layout = {"tables": 16, "offsets": 32, "indices": 48, "weights": 64, "out": 128}
    # An array of index_count elements one line past device memory: no line of it may be read.
    reaching_past = CAP - (index_count + 15) // 16 + 1
    if bad in ("indices_outside", "count_outside"):
        layout["indices"] = reaching_past
    if bad == "weights_outside":
        layout["weights"] = reaching_past
    if bad == "mean_long":
        layout["indices"], layout["weights"] = 4096, 4096 + (index_count + 15) // 16
    line = 256
    pitch = sum(dim // 16 for _, dim, _ in specs)
    col = 0
    for t, (rows, dim, mode) in enumerate(specs):
        dl = dim // 16
        mem[layout["tables"] + t] = TBL.pack(**{"base_addr": line, "rows": rows, "dim": dim, "mode": MODES[mode],
                                              "col_lines": col})
        for r in range(rows):
            for k, v in enumerate(_lines_of_u32(tables[t][r].view(np.uint32))):
                mem[line + r * dl + k] = v
        line += rows * dl
        col += dl
    for name, arr in (("offsets", offsets), ("indices", indices), ("weights", weights.view(np.uint32))):
        for i, v in enumerate(_lines_of_u32(arr)):
            mem[layout[name] + i] = v
    cmd = CMD.pack(**{"opcode": 1, "flags": 2, "tag": 7, "num_tables": len(specs), "batch_size": B,
                    "tables_addr": layout["tables"], "offsets_addr": layout["offsets"],
                    "indices_addr": layout["indices"], "weights_addr": layout["weights"],
                    "out_addr": layout["out"], "row_pitch_lines": pitch, "lr": 0, "index_count": index_count})
    golden = None
    if bad in (None, "nonfinite", "last_empty", "one_line", "hot"):
        golden = tbe_forward(tables, offsets, indices[:index_count], [m for _, _, m in specs], B,
                             weights[:index_count])
    return mem, cmd, [TBL.unpack(mem[layout["tables"] + t]) for t in range(len(specs))], golden, layout, specs


def _run(seed: int, bad: str | None = None, to_host: bool = False, fp32_pipeline: str = "compact",
         cache_lines: int = 0, contexts: int = 2):
    rng = np.random.default_rng(seed)
    prng = random.Random(seed)
    mem, cmd, descs, golden, layout, specs = _case(rng, bad)
    if to_host:
        cmd |= 1 << CMD._offsets["flags"][0]
    cap = BIG_CAP if bad == "mean_long" else CAP
    dut = LookupEngine(addr_bits=cap.bit_length() - 1, capacity_lines=cap, units=2, item_depth=16, rob_depth=16,
                       id_base=0x40, fp32_pipeline=fp32_pipeline, cache_lines=cache_lines, contexts=contexts)
    result = {}
    pushed = {}

    async def bench(ctx):
        ports = [dut.feed_mem] + list(dut.unit_mem)
        pending = [[] for _ in ports]        # (due, kind, ctx)
        push_pending = []
        ctx.set(dut.ctl.cmd.as_value(), cmd)
        ctx.set(dut.ctl.start, 1)
        await ctx.tick()
        ctx.set(dut.ctl.start, 0)
        last_index = 0
        for cycle in range(20000):
            ctx.set(dut.ctl.table.as_value(), TBL.pack(**descs[last_index]) if last_index < len(descs) else 0)
            last_index = ctx.get(dut.ctl.table_index)
            for p, port in enumerate(ports):
                ctx.set(port.req.ready, int(prng.random() < 0.8))
                # offer one due response of each kind, oldest-first among a random pick
                for kind in ("rd_rsp", "wr_rsp"):
                    ch = getattr(port, kind)
                    due = [e for e in pending[p] if e[1] == kind and e[0] <= cycle]
                    if due:
                        e = prng.choice(due)
                        ctx.set(ch.valid, 1)
                        ctx.set(ch.payload.ctx, e[2])
                        if kind == "rd_rsp":
                            ctx.set(ch.payload.data, mem.get(e[3], 0))
                        if ctx.get(ch.ready):
                            pending[p].remove(e)
                    else:
                        ctx.set(ch.valid, 0)
            preq = dut.push.req
            ctx.set(preq.ready, int(prng.random() < 0.8))
            due = [e for e in push_pending if e[0] <= cycle]
            ctx.set(dut.push.rsp.valid, int(bool(due)))
            if due:
                ctx.set(dut.push.rsp.payload.id, due[0][1])
                push_pending.remove(due[0])
            for p, port in enumerate(ports):
                if ctx.get(port.req.valid) and ctx.get(port.req.ready):
                    addr = ctx.get(port.req.payload.addr)
                    assert addr < cap
                    if ctx.get(port.req.payload.write):
                        result["writes"] = result.get("writes", 0) + 1
                        mem[addr] = ctx.get(port.req.payload.data)
                        pending[p].append((cycle + prng.randint(3, 20), "wr_rsp", ctx.get(port.req.payload.ctx), addr))
                    else:
                        result["reads"] = result.get("reads", 0) + 1
                        result.setdefault("read_lines", set()).add(addr)
                        pending[p].append((cycle + prng.randint(3, 20), "rd_rsp", ctx.get(port.req.payload.ctx), addr))
            if ctx.get(preq.valid) and ctx.get(preq.ready):
                pushed[ctx.get(preq.payload.addr)] = ctx.get(preq.payload.data)
                result["pushes"] = result.get("pushes", 0) + 1
                push_pending.append((cycle + prng.randint(3, 20), ctx.get(preq.payload.id)))
            if ctx.get(dut.ctl.done):
                result["error"] = NdpError(ctx.get(dut.ctl.error))
                result["info"] = ctx.get(dut.ctl.error_info)
                result["lookups"] = ctx.get(dut.ctl.stats.lookups)
                result["lines_pushed"] = ctx.get(dut.ctl.stats.lines_pushed)
                result["lines_written"] = ctx.get(dut.ctl.stats.lines_written)
                result["lines_read"] = ctx.get(dut.ctl.stats.lines_read)
                result["cache_hits"] = ctx.get(dut.ctl.stats.cache_hits)
                result["port_reads"] = result.get("reads", 0)
                result["writes_acked"] = result.get("writes", 0) - sum(
                    1 for q in pending for e in q if e[1] == "wr_rsp")
                result["pushes_acked"] = result.get("pushes", 0) - len(push_pending)
                result["cycles"] = cycle
                return
            await ctx.tick()
        raise AssertionError("no done")

    sim = Simulator(dut)
    sim.add_clock(1e-9)
    sim.add_testbench(bench)
    sim.run()
    out = pushed if to_host else mem
    return result, out, golden, layout, specs


def _as_bits(a):
    a = np.asarray(a, np.float32)
    bits = a.view(np.uint32).copy()
    bits[np.isnan(a)] = 0x7FC00000
    return bits


@pytest.mark.parametrize("case", [None, "nonfinite", "last_empty", "one_line"])
@pytest.mark.parametrize("to_host", [False, True])
def test_lookup_matches_golden(to_host, case):
    """Bit-exact with tbe_forward. ``nonfinite``: empty bags (SUM, MEAN, WEIGHTED_SUM tables)
    whose offsets[b] points at a +-Inf / NaN weight of the next bag, and garbage after the
    last index: every empty bag must still be +0.0 (PyTorch's result)."""
    seed = int(os.environ.get("TCXL_SEED", "0")) or random.randrange(1 << 30)
    print(f"seed {seed} (replay with TCXL_SEED={seed})")
    result, out, golden, layout, specs = _run(seed, bad=case, to_host=to_host)
    print(result)
    _check_pooled(seed, to_host, result, out, golden, layout, specs)


def _check_pooled(seed, to_host, result, out, golden, layout, specs):
    """OK, every pooled line out and acknowledged before done, each equal to the golden bits."""
    assert result["error"] == NdpError.OK, result
    pitch = sum(dim // 16 for _, dim, _ in specs)
    # done only after every pooled line went out and was acknowledged (durable / pushed)
    lines = golden[0].shape[0] * pitch
    if to_host:
        assert result["lines_pushed"] == result["pushes_acked"] == lines, result
    else:
        assert result["lines_written"] == result["writes_acked"] == lines, result
    col = 0
    for t, (_, dim, _) in enumerate(specs):
        dl = dim // 16
        for b in range(golden[t].shape[0]):
            line = layout["out"] + b * pitch + col
            raw = b"".join(out.get(line + k, 0).to_bytes(64, "little") for k in range(dl))
            got = np.frombuffer(raw, dtype="<f4")
            assert (_as_bits(got) == _as_bits(golden[t][b])).all(), f"seed {seed} table {t} bag {b}"
        col += dl


@pytest.mark.parametrize("to_host", [False, True])
@pytest.mark.parametrize("case", [None, "hot"])
def test_lookup_row_cache(case, to_host):
    """With a row cache per unit (8 lines: conflicts, and the unit's own output writes in
    device-output mode): the same pooled vectors bit for bit; hot rows are served on chip,
    and lines_read counts only what reached the ports."""
    seed = int(os.environ.get("TCXL_SEED", "0")) or random.randrange(1 << 30)
    print(f"seed {seed} (replay with TCXL_SEED={seed})")
    result, out, golden, layout, specs = _run(seed, bad=case, to_host=to_host, cache_lines=8)
    print(result)
    _check_pooled(seed, to_host, result, out, golden, layout, specs)
    assert result["lines_read"] == result["port_reads"], result
    if case == "hot":
        assert result["cache_hits"] > 0, result


@pytest.mark.parametrize("contexts", [2, 8])
def test_lookup_deep_fp32_pipeline(contexts):
    """The 12-cycle FMA / 18-cycle divider ("deep"): same pooled vectors, bit for bit (the
    longer chain hazard window, forwarding and output credit), with the two bag contexts per
    unit of the default device and with eight (rows of eight bags interleaved, a 7-bit
    accumulator line, the round-robin context choice over all of them)."""
    seed = int(os.environ.get("TCXL_SEED", "0")) or random.randrange(1 << 30)
    print(f"seed {seed} (replay with TCXL_SEED={seed})")
    result, out, golden, layout, specs = _run(seed, fp32_pipeline="deep", contexts=contexts)
    _check_pooled(seed, False, result, out, golden, layout, specs)


@pytest.mark.parametrize("bad,code,info", [
    ("index", NdpError.INDEX_RANGE, None), ("offsets", NdpError.OFFSETS, None), ("first", NdpError.OFFSETS, 0),
    ("count", NdpError.OFFSETS, 9),
    # the index and weight streams start before offsets[T*B] is back: never on an array that
    # reaches past device memory (no line of it is read), and OFFSETS still comes before ADDRESS
    ("indices_outside", NdpError.ADDRESS, AddressFault.INDICES),
    ("weights_outside", NdpError.ADDRESS, AddressFault.WEIGHTS),
    ("count_outside", NdpError.OFFSETS, 9),
    ("mean_long", NdpError.BAD_DESCRIPTOR, 3)])
def test_lookup_bad_input(bad, code, info):
    result, _, _, layout, _ = _run(3, bad=bad)
    if bad.endswith("_outside"):
        # Port addresses are 12 bits: a read past the end would wrap to the bottom lines.
        array = layout["weights" if bad == "weights_outside" else "indices"]
        span = {(array + i) % CAP for i in range(CAP - array + 1)}
        read = result.get("read_lines", set())
        assert not span & read, sorted(span & read)
    assert result["error"] == code, result
    if info is not None:
        assert result["info"] == info, result
