"""``trainingcxl fuzz --target cxl-mem``: seeded adversarial M2S traffic, every answer checked.

The cocotb test ``fuzz_cxl_mem`` reads TCXL_SEED (replay), TCXL_FUZZ_COUNT (M2S messages,
default 2000) and writes its result to TCXL_RESULT_JSON. It programs an HDM window (one of three
kinds, sim/tb/cxl_mem_fuzz_gen.py ``choose_window``: lines outside at both ends, larger than the
device, or at a high base), sends the stream of sim/tb/cxl_mem_fuzz_gen.py (every Req and
RwD opcode value, random header fields, addresses in and out of the window, partial writes,
poison, Tags repeated while outstanding, same-line read/write races, random gaps) under
bursty random S2M backpressure (ready dropped with a probability from 0 to 1 that changes every
16-1023 cycles), and checks everything with the always-on monitor and scoreboard (sim/env.py).

What the device must answer (cxl-reference.md §1 "Expected responses"; the monitor holds it):
- MemRd / MemRdData inside the window: one NDR and one DRS MemData, same Tag and LD-ID; NDR
  Cmp-E for Meta0-State/Any, Cmp-S or Cmp-E for Meta0-State/Shared and for MemRdData, else Cmp.
  Outside the window (or past the device's capacity): one DRS MemData-NXM, all ones, no NDR.
- MemInv / MemInvNT: one NDR by the same rule inside, Cmp outside. MemSpecRd: nothing.
- MemWr / MemWrPtl: one NDR Cmp, in or out of the window; outside it the write has no effect.
- Reserved and unsupported opcodes (TEE, MemClnEvct*, MemRdFill, reserved RwD codes): one NDR
  Cmp and no effect on memory; BIConflict: one BI-ConflictAck (architecture.md §5: "a defined
  answer ... never a hang"). MemRdFwd / MemWrFwd with no D2H request behind them: no answer
  (they are completions, not requests), counted in ERR_UNEXPECTED_FWD.
- Invalid MetaField / MetaValue (EMS, the reserved 10, Meta0-State with Explicit-No-Op): as
  MetaField No-Op, i.e. Cmp: the device grants no state it was not asked for in a form it
  implements. SnpType (any value, reserved 100-111 included) changes nothing: this device
  caches none of its own memory, so every snoop of its caches misses.
- Poison: a poisoned MemWr/MemWrPtl stores the line poisoned; a later read returns it with
  Poison = 1; a full-line clean write clears it, a partial one does not (sim/model/memory.py).
  Poison on any other RwD opcode, or outside the window, changes nothing.
- A Tag repeated while an earlier request with it is outstanding is legal (cxl-reference §1:
  "the Tag need not be unique"); each request still gets its own answer. Encodings that break
  a host rule (sim/checkers/cxl_mem_host_rules.py) are host errors: counted under
  ``host_errors_injected`` / ``host_errors``, never as device violations, and answered as above.

Same-line races. CXL leaves Req and RwD unordered ("Req and RwD to different addresses are
unordered"; a well-behaved host keeps one Req or RwD per line, cxl-reference §4), so the device
defines the order: messages are serialized where the port accepts them. The scoreboard accepts
exactly: (a) writes to a line take effect whole, in acceptance order (final image = last
accepted write merged over the earlier ones); (b) a read returns one version of the line: the
one current when the read was accepted, or one written by a write accepted after the read and
before its data came back (a later write may overtake an earlier read: Req and RwD are
unordered); nothing else: no version older than the one at acceptance, no mix of two writes,
no value no write produced.

Other checks at the end: the CSR error and statistics counters against
sim/checkers/cxl_mem_counters.py; every line any message addressed inside the window, and 256
others, read back through the backdoor and compared with the reference image (an unsupported
or out-of-window write that changed memory shows here); no CXL.cache message was attempted.

Bounds. Drain: after the last message was sent, S2M backpressure is switched off and the
device has ``DRAIN_CYCLES`` = 20,000 cycles to answer everything (its queues hold at most ~128
lines per channel, < 2,000 cycles of media time); then ``QUIET_CYCLES`` = 1,000 more cycles
(over 3x the media's write latency) in which any late or spurious response is still a
violation. A device that accepts no M2S message for ``STALL_CYCLES`` = 20,000 cycles while
messages wait stops the stream.

Result keys: ``messages`` (M2S messages accepted), ``messages_requested``, ``hangs`` (requests
unanswered after the drain plus messages never accepted), ``mismatches`` (read data/poison
+ counters + final image), with ``read_mismatches``, ``counter_mismatches``,
``image_mismatches``; ``protocol_violations`` (device-side only; hangs are not counted twice),
``opcodes`` (every Req and RwD opcode value -> messages accepted), ``host_errors_injected``,
``host_errors`` (per category, ``fwd_without_d2h_request`` included),
``tags_reused_while_outstanding``, ``poisoned`` (poisoned RwD sent), ``poisoned_reads``,
``outside_window``, ``partial_writes``, ``same_line_races`` (messages accepted while a write
and another access to the same line were outstanding), ``reads_checked``,
``backpressure_cycles`` (S2M channel-cycles with ready low), ``drain_cycles``, ``sim_cycles``,
``sim_cycles_per_second``, ``seed``, ``problems`` (the first violations and mismatches).
"""
from __future__ import annotations

import collections
import os
import random
import time

import cocotb
from cocotb.triggers import Timer

from hw.common.cxl_mem import M2SReqOpcode as Q, M2SRwDOpcode as W, DRSOpcode as D
from sim.checkers.cxl_mem_counters import COUNTERS, CxlMemCounterModel
from sim.env import CLOCK_PERIOD_NS, DeviceEnv
from sim.tb.cxl_mem_fuzz_gen import ALL_OPCODE_NAMES, choose_window, generate, opcode_name
from sim.tb.ndp_run_tb import recorded

DRAIN_CYCLES = 20_000
QUIET_CYCLES = 1_000
STALL_CYCLES = 20_000
IMAGE_SAMPLE = 256
# Backpressure bursts: the probability that S2M ready is low in a cycle, drawn per burst.
BURST_LEVELS = (0.0, 0.0, 0.0, 0.05, 0.2, 0.5, 0.8, 0.95, 1.0)
FULL_STALL_MAX = 256                  # a burst with ready always low lasts at most this long

_WRITES = frozenset({W.MEM_WR.value, W.MEM_WR_PTL.value})
_READS = frozenset({Q.MEM_RD.value, Q.MEM_RD_DATA.value})
_FWDS = frozenset({Q.MEM_RD_FWD.value, Q.MEM_WR_FWD.value})


class Feeder:
    """Offers the generated messages in program order from the link's per-cycle hook.

    A message waits for its own channel to be empty (so Req and RwD go out together, and the
    port's arbiter decides their order) and for its gap; it also changes the S2M backpressure
    in bursts and counts the channel-cycles whose ready was low.
    """

    def __init__(self, host, messages, rng: random.Random):
        self.host = host
        self.link = host.link
        self.messages = messages
        self.rng = rng
        self.next = next(messages, None)
        self.wait = self.next.gap if self.next else 0
        self.pushed = 0
        self.stopped = False
        self.bursts = True
        self.burst_left = 0
        self.backpressure_cycles = 0
        self._rx = list(self.link.rx.values())
        self._tx = {"req": self.link.tx["m2s_req"], "rwd": self.link.tx["m2s_rwd"]}

    @property
    def done(self) -> bool:
        return self.next is None or self.stopped

    def on_cycle(self, cycle: int) -> None:
        for ch in self._rx:
            if not ch.ready_out:
                self.backpressure_cycles += 1
        if self.bursts:
            self.burst_left -= 1
            if self.burst_left <= 0:
                level = self.rng.choice(BURST_LEVELS)
                length = self.rng.randrange(16, 1024)
                self.link.backpressure = level
                self.burst_left = min(length, FULL_STALL_MAX) if level >= 1.0 else length
        if self.wait:
            self.wait -= 1
            return
        while self.next is not None and not self.stopped:
            msg = self.next
            if self._tx[msg.kind].queue:
                return                           # its channel is busy: keep program order
            (self.host.send_req if msg.kind == "req" else self.host.send_rwd)(**msg.fields)
            self.pushed += 1
            self.next = next(self.messages, None)
            if self.next is not None and self.next.gap:
                self.wait = self.next.gap
                return

    def end_bursts(self) -> None:
        self.bursts = False
        self.link.backpressure = 0.0


class FuzzStats:
    """Counts what was actually accepted and answered (host BFM and monitor listener)."""

    def __init__(self, monitor):
        self.monitor = monitor
        self.opcodes = collections.Counter({name: 0 for name in ALL_OPCODE_NAMES})
        self.accepted = 0
        self.last_accept_cycle = 0
        self.poisoned = self.poisoned_reads = self.outside = self.partial = self.fwds = 0
        self.races = 0
        self.touched: set[int] = set()            # host lines inside the window any message addressed
        # Per host line: accepted requests to it not yet fully answered (seq -> is write).
        self.open: dict[int, dict[int, bool]] = {}

    # ---- host BFM listener
    def on_m2s(self, seq, cycle, kind, f):
        self.accepted += 1
        self.last_accept_cycle = cycle
        op = f["opcode"]
        self.opcodes[opcode_name(kind, op)] += 1
        inside = self.monitor.decodes(f["addr"])
        self.outside += not inside
        if inside:
            self.touched.add(f["addr"])
        if kind == "rwd":
            self.poisoned += f["poison"]
            self.partial += op == W.MEM_WR_PTL.value
            access, write = op in _WRITES, op in _WRITES
        else:
            self.fwds += op in _FWDS
            access, write = op in _READS, False
        if access and inside:
            line = self.open.setdefault(f["addr"], {})
            if line and (write or any(line.values())):
                self.races += 1
            line[seq] = write

    def on_s2m(self, cycle, kind, f):
        if kind == "drs" and f["opcode"] == D.MEM_DATA.value and f["poison"]:
            self.poisoned_reads += 1

    # ---- monitor listener
    def accepts(self, pending, fields) -> bool:
        return True                               # the scoreboard judges data

    def on_complete(self, pending, kind, fields, cycle):
        if pending.done:
            line = self.open.get(pending.fields["addr"])
            if line is not None:
                line.pop(pending.seq, None)
                if not line:
                    del self.open[pending.fields["addr"]]


async def _read_counters(env) -> dict[str, int]:
    return {name: await env.csr.read(name) for name in COUNTERS}


def _image_mismatches(env, lines: set[int], rng: random.Random) -> list[str]:
    """Backdoor read of ``lines`` (device lines) and a sample of others vs the reference."""
    cap = env.config.capacity_lines
    sample = set(lines) | {rng.randrange(cap) for _ in range(IMAGE_SAMPLE)}
    out = []
    for line in sorted(sample):
        got, want = env.peek(line), env.model.read(line)
        if got != want:
            out.append(f"final image: line {line:#x} holds {got[0]:#x} poison {got[1]}, "
                       f"expected {want[0]:#x} poison {want[1]}")
    return out


@cocotb.test()
async def fuzz_cxl_mem(dut):
    n = int(os.environ.get("TCXL_FUZZ_COUNT", "2000"))
    env = await DeviceEnv.create(dut)
    result = {"seed": env.seed, "messages_requested": n, "drain_bound_cycles": DRAIN_CYCLES,
              "quiet_cycles": QUIET_CYCLES}
    with recorded(result):                        # written however the run ends
        await _run(env, n, result)
    assert result["clean"], f"seed {env.seed}: not clean:\n" + "\n".join(result["problems"])


async def _run(env, n: int, result: dict) -> None:
    rng = random.Random(env.seed ^ 0xF0227)
    kind, base, size = choose_window(rng, env.config.capacity_lines)
    await env.program_window(64 * base, 64 * size)
    window = env.monitor.window
    result["window"] = {"kind": kind, "base_line": base, "size_lines": size}
    stats = FuzzStats(env.monitor)
    counters = CxlMemCounterModel(env.monitor)
    env.host.listeners += [stats, counters]
    env.monitor.listeners.append(stats)
    # The bursts draw from their own rng: the message stream then does not depend on timing.
    feeder = Feeder(env.host, generate(rng, n, window, env.config.capacity_lines),
                    random.Random(env.seed ^ 0xB0257))
    env.host.link.on_cycle = feeder.on_cycle
    start_cycle, t_sim = env.host.cycle, time.perf_counter()
    poll, report = 256, 10_000
    while not feeder.done:
        await Timer(poll * CLOCK_PERIOD_NS, unit="ns")
        if stats.accepted >= report:                 # progress of long runs
            env.dut._log.info(f"{stats.accepted} messages, {env.host.cycle - start_cycle} cycles, "
                              f"{time.perf_counter() - t_sim:.0f} s")
            report += 10_000
        if env.host.error is not None:
            raise env.host.error
        if env.host.pending and env.host.cycle - max(stats.last_accept_cycle, start_cycle) > STALL_CYCLES:
            env.dut._log.warning(f"no M2S message accepted for {STALL_CYCLES} cycles: stopping the stream")
            feeder.stopped = True
    feeder.end_bursts()
    drain_start = env.host.cycle
    summary = await env.finish(drain_cycles=DRAIN_CYCLES, quiet_cycles=QUIET_CYCLES, raise_on_hang=False)
    wall = time.perf_counter() - t_sim
    sim_cycles = env.host.cycle - start_cycle
    env.host.link.on_cycle = None
    read = await _read_counters(env)
    counter_problems = counters.mismatches(read)
    touched = {line - window[0] for line in stats.touched}
    image_problems = _image_mismatches(env, touched, rng)
    mon, sb = env.monitor, env.scoreboard
    unsent = n - stats.accepted
    host_errors = dict(mon.host_errors)
    host_errors["fwd_without_d2h_request"] = stats.fwds
    device_violations = len(mon.violations) - mon.unanswered
    result.update({
        "messages": stats.accepted,
        "hangs": mon.unanswered + unsent,
        "unanswered": mon.unanswered, "unsent": unsent,
        "mismatches": len(sb.mismatches) + len(counter_problems) + len(image_problems),
        "read_mismatches": len(sb.mismatches), "counter_mismatches": len(counter_problems),
        "image_mismatches": len(image_problems), "image_lines_checked": len(touched) + IMAGE_SAMPLE,
        "protocol_violations": device_violations,
        "opcodes": dict(stats.opcodes),
        "host_errors_injected": mon.host_error_messages + stats.fwds,
        "host_errors": host_errors,
        "tags_reused_while_outstanding": mon.tags_reused,
        "poisoned": stats.poisoned, "poisoned_reads": stats.poisoned_reads,
        "outside_window": stats.outside, "partial_writes": stats.partial,
        "same_line_races": stats.races, "reads_checked": sb.reads_checked,
        "backpressure_cycles": feeder.backpressure_cycles,
        "drain_cycles": env.host.cycle - drain_start - QUIET_CYCLES,
        "sim_cycles": sim_cycles,
        "sim_cycles_per_second": round(sim_cycles / wall) if wall else None,
        "s2m_messages": summary["messages"] - stats.accepted,
        "counters": read,
    })
    problems = mon.violations[:10] + sb.mismatches[:5] + counter_problems[:5] + image_problems[:5]
    result["problems"] = problems
    result["clean"] = not (result["hangs"] or result["mismatches"] or result["protocol_violations"])
    env.dut._log.info(f"fuzz cxl-mem seed {env.seed}: {stats.accepted} messages, {sim_cycles} cycles, "
                      f"hangs {result['hangs']}, mismatches {result['mismatches']}, "
                      f"violations {device_violations}, host errors {result['host_errors_injected']}")
