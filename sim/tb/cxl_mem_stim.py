"""Stimulus helpers shared by the CXL.mem test benches (cxl_mem_tb.py, fuzz_cxl_mem_tb.py).

- ``rd(env, tag, addr, ...)`` / ``wr(env, tag, addr, data, strb=None, ...)`` queue one Req /
  one MemWr (``strb`` None) or MemWrPtl on the host BFM; ``pattern(rng)`` is a random line.
- ``program_split_window(env, margin_lines)`` programs an HDM window that leaves
  ``margin_lines`` device lines outside it at both ends, so out-of-window traffic hits both
  sides; it returns the window as the monitor sees it (base line, size in lines, enabled).
- ``pick_line(rng, window, capacity_lines, hot, outside=p, hot_share=q)``: a host line
  address the window does not decode with probability ``p`` (below it, or above its decoded
  part, which ends at the window's end or the device's capacity; at either edge or far above),
  else one of the ``hot`` window offsets with probability ``q`` (so reads and writes race on
  the same lines), else anywhere in the decoded part of the window.
"""
from __future__ import annotations

from hw.common.cxl_mem import LINE_ADDR_BITS, M2SReqOpcode as Q, M2SRwDOpcode as W, SnpType, MetaField, MetaValue

MS0, NOOP = MetaField.META0_STATE, MetaField.NO_OP


def rd(env, tag, addr, opcode=Q.MEM_RD, meta_field=MS0, meta_value=MetaValue.ANY,
       snp=SnpType.SNP_INV, ld_id=0):
    env.host.send_req(opcode=opcode, snp_type=snp, meta_field=meta_field,
                      meta_value=meta_value, tag=tag, addr=addr, ld_id=ld_id)


def wr(env, tag, addr, data, strb=None, poison=0, ld_id=0):
    env.host.send_rwd(opcode=W.MEM_WR if strb is None else W.MEM_WR_PTL,
                      snp_type=SnpType.NO_OP, meta_field=NOOP, meta_value=0, tag=tag,
                      addr=addr, data=data, byte_enable=strb or 0, poison=poison, ld_id=ld_id)


def pattern(rng) -> int:
    return rng.getrandbits(512)


async def program_split_window(env, margin_lines: int = 64) -> tuple[int, int, bool]:
    margin = 64 * margin_lines
    await env.program_window(margin, env.config.capacity_bytes - 2 * margin)
    return env.monitor.window


def pick_line(rng, window, capacity_lines: int, hot: list[int], *, outside: float = 0.10,
              hot_share: float = 0.5) -> int:
    base, size, _ = window
    end = base + min(size, capacity_lines)                   # first line not decoded above
    r = rng.random()
    if r < outside:
        k = rng.randrange(6)
        if k == 0 and base:
            return rng.randrange(base)                       # below
        if k == 1 and base:
            return base - 1                                  # just below
        if k == 2:
            return end                                       # just above
        if k == 3:
            return rng.randrange(end, 1 << LINE_ADDR_BITS)   # anywhere above
        return end + rng.randrange(1 << 12)                  # a little above
    if r < outside + (1 - outside) * hot_share:
        return base + rng.choice(hot)
    return base + rng.randrange(end - base)
