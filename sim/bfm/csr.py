"""CSR driver: the host's CXL.io MMIO accesses over AXI4-Lite, by register name.

Drives the harness port ``csr`` with ``AxiLiteManager`` (sim/bfm/axil.py) and resolves
names through the register map in hw/cxl_controller/csr_map.py (never a retyped offset).
"""
from __future__ import annotations

from .axil import AxiLiteManager

from hw.cxl_controller.csr_map import register, REG
from hw.common.cxl_mem import LINE_BYTES


class CsrDriver:
    def __init__(self, dut, clk):
        self.axi = AxiLiteManager(dut, "csr", clk)

    async def read(self, name: str) -> int:
        register(name)                      # a KeyError names an unknown register
        return await self.axi.read(getattr(REG, name))

    async def write(self, name: str, value: int) -> None:
        register(name)                      # a KeyError names an unknown register
        await self.axi.write(getattr(REG, name), value & 0xFFFF_FFFF)

    async def read64(self, lo: str, hi: str) -> int:
        return await self.read(lo) | (await self.read(hi)) << 32

    async def program_hdm(self, base_bytes: int, size_bytes: int, enable: bool = True) -> None:
        """Program and enable the HDM decoder window (line aligned)."""
        if base_bytes % LINE_BYTES or size_bytes % LINE_BYTES:
            raise ValueError("HDM base and size must be multiples of 64 bytes")
        await self.write("HDM_CTRL", 0)
        await self.write("HDM_BASE_LO", base_bytes & 0xFFFF_FFFF)
        await self.write("HDM_BASE_HI", base_bytes >> 32)
        await self.write("HDM_SIZE_LO", size_bytes & 0xFFFF_FFFF)
        await self.write("HDM_SIZE_HI", size_bytes >> 32)
        await self.write("HDM_CTRL", 1 if enable else 0)

    async def counters(self) -> dict[str, int]:
        from hw.cxl_controller.csr_map import REGISTERS, Access
        out = {}
        for r in REGISTERS:
            if any(f.access == Access.COUNTER for f in r.fields):
                out[r.name] = await self.read(r.name)
        return out
