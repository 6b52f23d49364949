"""CXL.mem scoreboard: every read's data and poison against the numpy reference memory.

It listens to the host BFM (``on_m2s``) and the protocol monitor (``on_complete``):
- An RwD MemWr/MemWrPtl accepted inside the HDM window becomes a new version of its line
  (sim/model/memory.py ``VersionedMemory``), in acceptance order.
- A DRS MemData for a read must equal (data and poison, bit for bit) one of the versions the
  read may legally see: the one current when the read was accepted, or one written after it
  and before the data came back. Anything else is a mismatch, reported with the line, the
  expected versions and the value seen.
- A write's Cmp marks it acknowledged: ``acked_seq[line]`` is the newest version the host
  knows to be durable (used by the power-failure check).
- A read the HDM window does not decode (outside it, below its base, or the window
  disabled) may only be answered MemData-NXM with all-ones data and no poison; it is judged
  so before any line is looked up (the reference memory is never indexed outside
  0 .. lines-1; ``VersionedMemory`` raises rather than wrap a negative index).
"""
from __future__ import annotations

from hw.common.cxl_mem import LINE_BITS, M2SReqOpcode as Q, M2SRwDOpcode as W, DRSOpcode as D
from ..model.memory import MemoryModel, VersionedMemory, FULL_STRB

NXM_ANSWER = ((1 << LINE_BITS) - 1, False)     # (data, poison) of MemData-NXM

WRITE_OPS = (W.MEM_WR.value, W.MEM_WR_PTL.value)


class CxlMemScoreboard:
    def __init__(self, monitor, model: MemoryModel):
        self.monitor = monitor
        self.model = model
        self.mem = VersionedMemory(model)
        self.accepted = 0                  # messages accepted so far (the next seq)
        self.mismatches: list[str] = []
        self.reads_checked = 0
        self.acked_seq: dict[int, int] = {}

    def device_line(self, host_line: int) -> int:
        return host_line - self.monitor.window[0]

    PRUNE_EVERY = 4096        # messages between forgetting versions no read can see

    def on_m2s(self, seq, cycle, kind, f):
        self.accepted = seq + 1
        if seq % self.PRUNE_EVERY == self.PRUNE_EVERY - 1:
            waiting = [p.seq for q in self.monitor.waiting.values() for p in q]
            self.mem.prune(min(waiting, default=seq))
        if kind == "rwd" and f["opcode"] in WRITE_OPS and self.monitor.decodes(f["addr"]):
            strb = FULL_STRB if f["opcode"] == W.MEM_WR.value else f["byte_enable"]
            self.mem.write(seq, self.device_line(f["addr"]), f["data"], strb, bool(f["poison"]))

    def on_s2m(self, cycle, kind, fields):
        pass

    def _legal(self, pending):
        """(device line or None, the (data, poison) pairs the read may return)."""
        addr = pending.fields["addr"]
        if not self.monitor.decodes(addr):
            return None, [NXM_ANSWER]
        line = self.device_line(addr)
        return line, self.mem.legal_reads(line, pending.seq, self.accepted)

    def accepts(self, pending, f) -> bool:
        """Could this DRS be the answer to ``pending``? (reads sharing a Tag)"""
        return (f["data"], bool(f["poison"])) in self._legal(pending)[1]

    def on_complete(self, pending, kind, f, cycle):
        if (kind == "drs" and f["opcode"] == D.MEM_DATA.value and pending.kind == "req"
                and pending.fields["opcode"] in (Q.MEM_RD.value, Q.MEM_RD_DATA.value)
                and self.monitor.decodes(pending.fields["addr"])):      # (else the monitor's check 4)
            line, legal = self._legal(pending)
            got = (f["data"], bool(f["poison"]))
            self.reads_checked += 1
            if got not in legal:
                self.mismatches.append(
                    f"cycle {cycle}: read of line {line:#x} (tag {f['tag']:#x}, seq "
                    f"{pending.seq}) returned data {got[0]:#0130x} poison {got[1]}; "
                    f"legal: " + ", ".join(f"{v:#0130x}/poison {p}" for v, p in legal))
        elif kind == "ndr" and pending.kind == "rwd" and pending.fields["opcode"] in WRITE_OPS \
                and self.monitor.decodes(pending.fields["addr"]):
            line = self.device_line(pending.fields["addr"])
            self.acked_seq[line] = max(self.acked_seq.get(line, -1), pending.seq)
