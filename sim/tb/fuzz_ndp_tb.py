"""``trainingcxl fuzz --target ndp``: malformed NDP commands among valid ones, on the RTL.

Generates (sim/tb/fuzz_ndp_gen.py, a small four-table model): valid LOOKUP, UPDATE,
checkpointed UPDATE, LOG and NOP commands on fresh random batches, and malformed LOOKUP /
UPDATE / LOG commands with one injected fault (a field of the command descriptor, of a table
descriptor or of the argument arrays set to a bad value, see ``FAULTS``) or, one time in
four, two or three at once; and ring misuse. The first 2 x (number of fault kinds) steps
inject every kind once (each followed by a valid command), the rest is random.

Checks, per command (bounded wait: ``HANG_CYCLES`` = 400k cycles for a command, a LOOKUP or
UPDATE of this model takes ~1-5k; no completion by then is a hang and ends the run):
- the completion carries the tag and opcode submitted, and the error code the golden
  validator (sim/model/ndp_validate.py, from the documented check order) expects
  (``wrong_error_codes``; a right code with a wrong ``error_info`` counts in
  ``wrong_error_info``); NdpHost.wait cross-checks the NDP_STATUS / NDP_LAST_* CSRs;
- a rejected command changed no table byte: the table regions (one contiguous range, read
  through the media backdoor) against a snapshot taken before it
  (``table_bytes_changed_by_rejected``; the tables are then restored from the golden copy);
- every accepted command is bit-exact: LOOKUP's pooled outputs against
  ``embedding.tbe_forward`` on the golden tables, UPDATE's tables (all rows) after
  ``embedding.tbe_sgd_step`` (lr NaN / +-Inf / subnormal included: the device has no lr
  check and PyTorch's SGD accepts them; the tables are reloaded fresh afterwards), NOP and
  LOG leave the tables alone (``mismatches``, plus the CXL.mem scoreboard's); a LOG's
  outcome sets what its slot holds (``log_slot_freed``), which later checkpointed UPDATEs
  (accepted, or NOT_LOGGED) check;
- ring misuse, what the device must do (NDP_SQ_TAIL is a free-running count, csr_map.py):
  ``ring_doorbell_repeat`` (the doorbell rewritten with the same tail) runs nothing: after
  ``RING_IDLE_CYCLES`` NDP_SQ_HEAD, STAT_NDP_COMMANDS and the next completion slot are
  unchanged; ``ring_tail_beyond_ring`` (a tail ring_slots + k past the head: more commands
  than the ring holds) makes the device run the ring's slots as they are, wrapping: the bench
  first fills every slot with a NOP (its own tag), and the device must run exactly
  ring_slots + k NOPs (STAT_NDP_COMMANDS), leave the last completion of each slot in it, fail
  none (ERR_NDP_COMMAND) and touch no table. A tail written behind the head is the same
  rule with (tail - head) mod 2**16 commands (65535 stale slots: about 40M cycles), so it is
  not injected; the device cannot tell it from a burst, by this register's definition.
- at the end: ERR_NDP_COMMAND equals the rejections seen, the CXL.mem protocol monitor and
  scoreboard are clean (``protocol_violations``).
Addresses are line addresses (hw/ndp/command.py), so there is no unaligned address to inject.

Environment: TCXL_SEED (replay), TCXL_FUZZ_COUNT (fuzz steps, default 200),
TCXL_RESULT_JSON. Result keys: ``commands`` (steps), ``device_commands``
(STAT_NDP_COMMANDS), ``rejected``, ``accepted``, ``hangs``, ``mismatches``,
``wrong_error_codes``, ``wrong_error_info``, ``table_bytes_changed_by_rejected``,
``protocol_violations``, ``errors`` (NdpError name -> rejected commands), ``faults`` (kind ->
times injected), ``multi_fault_commands``, ``ops`` (base command -> count; ``_malformed`` when
faults were injected), ``sim_cycles``, ``seed``.
"""
from __future__ import annotations

import os
from collections import Counter

import cocotb
import numpy as np
from cocotb.triggers import Timer

from hw.common.cxl_mem import LINE_BYTES
from hw.ndp.command import NdpError, NdpOpcode
from sim.bfm.ndp_host import NdpCompletion, NdpHost, NdpCommand, array_to_lines, lines_to_array
from sim.env import CLOCK_PERIOD_NS, DeviceEnv
from sim.model import embedding
from sim.model.fp32_ref import same_fp32
from sim.model.ndp_validate import expected_error, log_slot_freed
from sim.tb.fuzz_ndp_gen import ALL_KINDS, FuzzGen, modes_of
from sim.tb.ndp_run_tb import recorded

HANG_CYCLES = 400_000
RING_IDLE_CYCLES = 3_000
NOP_TAG_BASE = 0xB000


class FuzzBench:
    def __init__(self, env):
        self.env = env
        self.rng = np.random.default_rng(env.seed)
        self.gen = FuzzGen(env.config.capacity_lines, self.rng)
        self.lay = self.gen.layout
        self.driver = NdpHost(env, self.lay)
        self.bd = self.driver.backdoor
        regions = self.lay.table_regions
        self.tbl_base, self.tbl_lines = regions[0].base, regions[-1].end - regions[0].base
        self.golden: list[np.ndarray] = []
        self.c = Counter()
        self.errors: Counter = Counter()
        self.faults: Counter = Counter()
        self.ops: Counter = Counter()
        self.log = env.dut._log

    # ---- tables
    def fresh_tables(self) -> None:
        """New random tables on the device and in the golden copy."""
        self.golden = [self.rng.uniform(-1, 1, (t.rows, t.dim)).astype(np.float32) for t in self.lay.tables]
        self.driver.load_tables(self.golden)

    def restore_tables(self) -> None:
        self.driver.load_tables(self.golden)

    def table_image(self) -> bytes:
        return b"".join(v.to_bytes(LINE_BYTES, "little") for v in self.bd.read_lines(self.tbl_base, self.tbl_lines))

    def golden_image(self) -> bytes:
        return b"".join(g.tobytes() for g in self.golden)

    def problem(self, key: str, text: str) -> None:
        self.c[key] += 1
        if self.c[key] <= 20:
            self.log.error(f"seed {self.env.seed}: {key}: {text}")

    # ---- one command
    def load(self, case) -> None:
        lay, bd = self.lay, self.bd
        bd.write_lines(lay.offsets.base, array_to_lines(case.offsets.astype(np.uint32)))
        bd.write_lines(lay.indices.base, array_to_lines(case.indices.astype(np.uint32)))
        bd.write_lines(lay.weights.base, array_to_lines(case.weights, np.float32))
        self.driver.load_gradients(case.grads)
        bd.write_lines(lay.table_descs.base, case.desc_lines())

    async def submit_raw(self, line: int) -> int:
        d = self.driver
        seq = d.submitted
        await d.port.write_line(self.lay.sq.base + seq % self.lay.ring_slots, line)
        d.submitted += 1
        await d._ring_doorbell(d.submitted)
        return seq

    async def run_case(self, case) -> bool:
        """Run one command and check it; False when it hung (the run stops)."""
        self.ops[f"{case.op}{'_malformed' if case.faults else ''}"] += 1
        self.load(case)
        want, want_info = expected_error(case.line(), case.desc_lines(), case.offsets, case.indices,
                                         self.gen.cap, logged=self.gen.logged)
        before = self.table_image()
        seq = await self.submit_raw(case.line())
        try:
            comp: NdpCompletion = await self.driver.wait(seq, timeout_cycles=HANG_CYCLES)
        except TimeoutError as e:
            self.c["hangs"] += 1
            self.log.error(f"seed {self.env.seed}: hang: {case.op} {case.faults}: {e}")
            return False
        except RuntimeError as e:               # status CSRs disagree with the completion
            self.problem("mismatches", f"{case.op} {case.faults}: {e}")
            return True
        cmd = case.cmd
        where = f"{case.op} tag {cmd.tag:#x} faults {case.faults}"
        if cmd.opcode_value == NdpOpcode.LOG.value:     # what the LOG left in its slot (the device's answer)
            if comp.ok:
                self.gen.logged[cmd.batch & 1] = cmd.batch
            elif log_slot_freed(NdpError(comp.error), comp.error_info):
                self.gen.logged.pop(cmd.batch & 1, None)
        if comp.tag != cmd.tag & 0xFFFF or comp.opcode != cmd.opcode_value & 0xFF:
            self.problem("mismatches", f"{where}: completion {comp}")
        if comp.error != want.value:
            self.problem("wrong_error_codes", f"{where}: got {comp.error_name} ({comp.error_info:#x}), "
                                              f"expected {want.name} ({want_info:#x})")
        elif comp.error_info != int(want_info):
            self.problem("wrong_error_info", f"{where}: {want.name} error_info {comp.error_info:#x}, "
                                             f"expected {int(want_info):#x}")
        if not comp.ok:
            self.c["rejected"] += 1
            self.errors[comp.error_name] += 1
            after = self.table_image()
            changed = sum(a != b for a, b in zip(before, after))
            if changed:
                self.c["table_bytes_changed_by_rejected"] += changed
                self.log.error(f"seed {self.env.seed}: {where}: rejected with {comp.error_name} but "
                               f"{changed} table bytes changed")
                self.restore_tables()
            return True
        self.c["accepted"] += 1
        if want != NdpError.OK:                 # accepted what the golden rejects: resync
            if self.table_image() != before:
                self.restore_tables()
            return True
        await self.check_results(case, where)
        return True

    async def check_results(self, case, where: str) -> None:
        cmd: NdpCommand = case.cmd
        B, T = cmd.batch_size, cmd.num_tables
        n = cmd.index_count
        offs, idx, w = case.offsets[:T * B + 1], case.indices[:n], case.weights[:n]
        modes = modes_of(case.descs)
        if case.op == "lookup":
            want = embedding.tbe_forward(self.golden, offs, idx, modes, B, w)
            pitch = cmd.row_pitch_lines
            flat = lines_to_array(self.bd.read_lines(cmd.out_addr, B * pitch), np.float32).reshape(B, pitch * 16)
            bad = []
            for t, d in enumerate(case.descs):
                col = d["col_lines"] * 16
                got = flat[:, col:col + d["dim"]]
                if not same_fp32(want[t].view(np.uint32), got.view(np.uint32)).all():
                    bad.append(t)
            if bad:
                self.problem("mismatches", f"{where}: pooled outputs of tables {bad} differ")
        elif case.op in ("update", "ckpt_update"):
            embedding.tbe_sgd_step(self.golden, offs, idx, modes, B, case.grads, cmd.lr, w)
            self.compare_tables(where)
            if "lr_special" in case.faults:     # NaN / Inf rows would stay: start afresh
                self.fresh_tables()
        else:                                   # NOP, LOG: tables untouched
            self.compare_tables(where)

    def compare_tables(self, where: str) -> None:
        got = np.frombuffer(self.table_image(), np.uint32)
        want = np.frombuffer(self.golden_image(), np.uint32)
        bad = ~same_fp32(want, got)
        if bad.any():
            self.problem("mismatches", f"{where}: {int(bad.sum())} table words differ from the golden tables")
            self.restore_tables()

    # ---- ring misuse
    async def doorbell_repeat(self) -> None:
        d, csr = self.driver, self.env.csr
        slot_line = self.lay.cq.base + d.submitted % self.lay.ring_slots
        self.bd.write_lines(slot_line, [0])
        count = await csr.read("STAT_NDP_COMMANDS")
        await d._ring_doorbell(d.submitted)
        await Timer(RING_IDLE_CYCLES * CLOCK_PERIOD_NS, unit="ns")
        head = await d._read_field("NDP_SQ_HEAD", "HEAD")
        busy = await d._read_field("NDP_STATUS", "BUSY")
        if (head != d.submitted & 0xFFFF or busy or await csr.read("STAT_NDP_COMMANDS") != count
                or self.bd.read_line(slot_line) != 0):
            self.problem("mismatches", f"doorbell with nothing new: head {head} (tail {d.submitted & 0xFFFF}), "
                                       f"busy {busy}, or a command ran")

    async def tail_beyond_ring(self) -> bool:
        d, csr, slots = self.driver, self.env.csr, self.lay.ring_slots
        r = self.rng
        for s in range(slots):                  # what the host leaves in the ring: NOPs
            nop = NdpCommand(NdpOpcode.NOP, int(r.integers(0, 1 << 16)), int(r.integers(0, 1 << 32)),
                             0, 0, 0, 0, tag=NOP_TAG_BASE + s)
            await d.port.write_line(self.lay.sq.base + s, nop.pack())
        count, errs = await csr.read("STAT_NDP_COMMANDS"), await csr.read("ERR_NDP_COMMAND")
        before = self.table_image()
        extra = slots + int(r.integers(1, slots))
        start = d.submitted
        d.submitted += extra
        await d._ring_doorbell(d.submitted)
        t0 = self.env.host.cycle
        while await d._head() != d.submitted:
            if self.env.host.cycle - t0 > HANG_CYCLES:
                self.c["hangs"] += 1
                self.log.error(f"seed {self.env.seed}: hang: tail {extra} past the head, head {await d._head()}")
                return False
            await Timer(64 * CLOCK_PERIOD_NS, unit="ns")
        d.completed = d.submitted
        ran = (await csr.read("STAT_NDP_COMMANDS") - count) & 0xFFFF_FFFF
        failed = (await csr.read("ERR_NDP_COMMAND") - errs) & 0xFFFF_FFFF
        self.c["device_commands_ring"] += ran
        bad = [s for s in range(slots)
               if (lambda c: not c.valid or c.tag != NOP_TAG_BASE + s or c.opcode != NdpOpcode.NOP.value
                   or not c.ok)(NdpCompletion.unpack(self.bd.read_line(self.lay.cq.base + s)))]
        if ran != extra or failed or bad or self.table_image() != before:
            self.problem("mismatches", f"tail {extra} past head {start}: {ran} commands ran, {failed} failed, "
                                       f"completion slots {bad} wrong")
        await csr.write("STATUS", 1 << d._done_bit.lsb)     # NDP_DONE is write-1-to-clear
        return True

    # ---- schedule
    def valid_op(self) -> str:
        ops, p = ["lookup", "update", "nop", "log", "ckpt_update"], [0.35, 0.35, 0.1, 0.1, 0.1]
        op = str(self.rng.choice(ops, p=p))
        return "update" if op == "ckpt_update" and not self.gen.logged else op

    def schedule(self, count: int):
        """(kind, faults) steps: every fault kind once (each followed by a valid command), then random."""
        first = [str(k) for k in self.rng.permutation(ALL_KINDS)]
        steps = []
        for k in first:
            steps += [("fault", [k]), ("valid", None)]
        while len(steps) < count:
            r = self.rng.random()
            if r < 0.45:
                steps.append(("valid", None))
            elif r < 0.49:
                steps.append(("fault", [str(self.rng.choice(["ring_doorbell_repeat", "ring_tail_beyond_ring"]))]))
            else:
                steps.append(("fault", self.gen.pick_kinds(self.rng.random() < 0.25)))
        return steps[:count]

    async def step(self, kind, faults) -> bool:
        if kind == "valid":
            return await self.run_case(self.gen.valid(self.valid_op()))
        self.faults.update(faults)
        if faults == ["ring_doorbell_repeat"]:
            await self.doorbell_repeat()
            return True
        if faults == ["ring_tail_beyond_ring"]:
            return await self.tail_beyond_ring()
        if len(faults) > 1:
            self.c["multi_fault_commands"] += 1
        return await self.run_case(self.gen.malformed(faults))


@cocotb.test()
async def fuzz_ndp(dut):
    env = await DeviceEnv.create(dut)
    count = int(os.environ.get("TCXL_FUZZ_COUNT", "200"))
    result = {"seed": env.seed, "commands": count}
    with recorded(result):
        bench = FuzzBench(env)
        bench.fresh_tables()
        await bench.driver.write_table_descriptors()
        await bench.driver.program_checkpoint()
        await bench.driver.start()
        start_cycle = env.host.cycle
        errs0 = await env.csr.read("ERR_NDP_COMMAND")
        cmds0 = await env.csr.read("STAT_NDP_COMMANDS")
        for i, (kind, faults) in enumerate(bench.schedule(count)):
            if not await bench.step(kind, faults):
                break
            if (i + 1) % 100 == 0:
                dut._log.info(f"{i + 1}/{count} steps: {dict(bench.c)}")
        c = bench.c
        if not c["hangs"]:
            errs = (await env.csr.read("ERR_NDP_COMMAND") - errs0) & 0xFFFF_FFFF
            if errs != c["rejected"]:
                bench.problem("mismatches", f"ERR_NDP_COMMAND counted {errs}, {c['rejected']} rejections seen")
        device_commands = (await env.csr.read("STAT_NDP_COMMANDS") - cmds0) & 0xFFFF_FFFF
        summary = await env.finish()
        result.update({
            "device_commands": device_commands,
            "rejected": c["rejected"], "accepted": c["accepted"], "hangs": c["hangs"],
            "mismatches": c["mismatches"] + summary["mismatches"],
            "wrong_error_codes": c["wrong_error_codes"], "wrong_error_info": c["wrong_error_info"],
            "table_bytes_changed_by_rejected": c["table_bytes_changed_by_rejected"],
            "protocol_violations": summary["protocol_violations"],
            "errors": dict(sorted(bench.errors.items())),
            "faults": {k: bench.faults[k] for k in sorted(ALL_KINDS)},
            "multi_fault_commands": c["multi_fault_commands"],
            "ops": dict(sorted(bench.ops.items())),
            "sim_cycles": env.host.cycle - start_cycle,
        })
        dut._log.info(f"seed {env.seed}: {result}")
        env.assert_clean()
        dirty = [k for k in ("hangs", "mismatches", "wrong_error_codes", "wrong_error_info",
                             "table_bytes_changed_by_rejected", "protocol_violations") if result[k]]
        assert not dirty, f"seed {env.seed} (replay with TCXL_SEED={env.seed}): not clean: " + \
            ", ".join(f"{k} {result[k]}" for k in dirty)

