"""Host CXL.mem BFM: drives M2S Req/RwD and receives S2M NDR/DRS at transaction level.

``CxlMemHost(dut, clk, rng, backpressure=p)``:
- ``send_req(**fields)`` / ``send_rwd(**fields)`` queue a message (fields of M2SReq/M2SRwD;
  any number outstanding, tags need not be unique). Messages go out in queue order per
  channel, as fast as the device accepts them.
- S2M ``ready`` is dropped at random with probability ``backpressure`` each cycle
  (reproducible from ``rng``).
- ``period_ns`` (the clock period): lets the link driver sleep while the link is idle
  (sim/bfm/link.py).
- Every transfer is reported to the listeners (the protocol monitor, the scoreboard):
  ``on_m2s(seq, cycle, kind, fields)`` with ``seq`` the acceptance order, and
  ``on_s2m(cycle, kind, fields)``; ``kind`` is "req", "rwd", "ndr" or "drs".

The per-cycle work is the generic ``LinkDriver`` (sim/bfm/link.py): one step per clock
edge, straight from the simulator's clock callback, raw handles, no cocotb task per cycle.
"""
from __future__ import annotations

import random

from hw.common.cxl_mem import M2SReq, M2SRwD, S2MNDR, S2MDRS
from ..model.codec import StructCodec
from .link import LinkDriver

REQ = StructCodec(M2SReq)
RWD = StructCodec(M2SRwD)
NDR = StructCodec(S2MNDR)
DRS = StructCodec(S2MDRS)
_KIND = {"m2s_req": "req", "m2s_rwd": "rwd", "s2m_ndr": "ndr", "s2m_drs": "drs"}


class CxlMemHost:
    def __init__(self, dut, clk, *, rng: random.Random, backpressure: float = 0.0,
                 period_ns: float | None = None):
        self.link = LinkDriver(dut, clk, tx={"m2s_req": REQ, "m2s_rwd": RWD},
                               rx={"s2m_ndr": NDR, "s2m_drs": DRS}, rng=rng,
                               backpressure=backpressure, period_ns=period_ns)
        self.link.listeners.append(self)
        self.listeners = []
        self.seq = 0                      # acceptance order of M2S messages

    # ---- API
    def send_req(self, **fields) -> int:
        return self.link.send("m2s_req", REQ.pack(**fields))

    def send_rwd(self, **fields) -> int:
        return self.link.send("m2s_rwd", RWD.pack(**fields))

    @property
    def pending(self) -> int:
        return self.link.pending

    @property
    def cycle(self) -> int:
        return self.link.cycle

    @property
    def error(self) -> Exception | None:
        return self.link.error

    @property
    def enabled(self) -> bool:
        return self.link.enabled

    @enabled.setter
    def enabled(self, value: bool) -> None:
        self.link.enabled = value

    def start(self):
        self.link.start()

    def stop(self):
        self.link.stop()

    def reset_link(self):
        """Forget queued messages and drive every input idle (a power failure)."""
        self.link.reset_link()

    # ---- LinkDriver listener
    def on_tx(self, cycle, name, fields):
        kind = _KIND[name]
        for lst in self.listeners:
            lst.on_m2s(self.seq, cycle, kind, fields)
        self.seq += 1

    def on_rx(self, cycle, name, fields):
        kind = _KIND[name]
        for lst in self.listeners:
            lst.on_s2m(cycle, kind, fields)
