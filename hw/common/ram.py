"""FPGA-mappable RAMs: one write port per physical memory, explicit bypass, live value table.

Every on-chip memory of the device must map to block RAM, UltraRAM or LUT RAM (issue 13):
one write port per physical memory, reads synchronous (block RAM / UltraRAM) or
asynchronous (LUT RAM), and no reliance on a read port that is "transparent" for a write
of another port in the same cycle. The two classes here give the engines what they used to
get from a multi-port ``amaranth.lib.memory.Memory`` with those rules kept:

``BypassRam(shape, depth, granularity=None)``
    One write port, any number of read ports. A synchronous read port created with
    ``bypass=True`` returns, in the cycle after the read, the data written to the same address
    in the read's cycle (per ``granularity`` chunk with a chunked write enable): exactly what
    ``Memory.read_port(transparent_for=(write_port,))`` returns. The memory itself is read
    non-transparently (the primitive's own read-during-write mode does not matter); a
    register holds the written chunks and a per-chunk hit flag, and a mux picks them. Without
    ``bypass`` a synchronous read returns the old data, like a non-transparent port.

``LvtRam(shape, depth, write_ports, read_ports)``
    ``W`` write ports and ``R`` read ports built from ``W`` banks of ``R`` replicas (each a
    one-write one-read RAM) and a live value table (LVT; LaForest and Steffan, FPGA 2010):
    ``depth`` x ceil(log2 W) bits in flip-flops naming the write port that wrote each address
    last. A read returns bank[LVT[addr]]. When several ports write one address in one cycle,
    the LVT records one of them (the multi-port memory's own rule) and that port's bank holds
    its data, so a read returns one of the written words, never a mix. Synchronous read
    ports are non-transparent by default and may be ``transparent_for`` a set of write ports
    through a bypass register (as ``BypassRam``). A synchronous read port with
    ``late_pick=True`` takes two candidate addresses (``addr_cand``) and ``pick``: the LVT is
    read and the bypass compared at both, and ``pick`` chooses last, so a late-decided pick
    reaches only the banks' address and two registers (tested in tests/test_ram.py; no engine
    uses it now: UPDATE's operand read tried it, issue 13's seventh round). The LVT is the
    only flip-flop storage, so keep ``depth * ceil(log2 W)`` small (4 kbit). Whole-word writes only (no
    ``granularity``).

Ports are plain signal bundles (``addr``, ``data``, ``en``), like ``lib.memory``'s: a write port
has ``addr``, ``data``, ``en`` (one bit per granularity chunk); a synchronous read port has
``addr``, ``data`` (valid the cycle after ``addr``, held while ``en`` is low; ``en`` defaults
to 1), an asynchronous one (``domain="comb"``) ``addr`` and ``data``. Create every port before
elaboration.
"""
from __future__ import annotations

from amaranth import Cat, Elaboratable, Module, Mux, Signal
from amaranth.hdl import ShapeCastable, Shape
from amaranth.lib.memory import Memory
from amaranth.utils import ceil_log2


class _WritePort:
    def __init__(self, name: str, addr_bits: int, width: int, chunks: int):
        self.addr = Signal(addr_bits, name=f"{name}_addr")
        self.data = Signal(width, name=f"{name}_data")
        self.en = Signal(chunks, name=f"{name}_en")


class _ReadPort:
    def __init__(self, name: str, addr_bits: int, width: int, domain: str, transparent_for, late_pick=False):
        self.domain = domain
        self.addr = Signal(addr_bits, name=f"{name}_addr")
        self.data = Signal(width, name=f"{name}_data")
        self.en = Signal(init=1, name=f"{name}_en") if domain != "comb" else None
        self.transparent_for = tuple(transparent_for)
        # late_pick: the address is one of two candidates, ``addr_cand[pick]`` (``addr``
        # follows it; drive the candidates and ``pick``, not ``addr``).
        self.late_pick = late_pick
        if late_pick:
            self.addr_cand = [Signal(addr_bits, name=f"{name}_addr_cand{i}") for i in range(2)]
            self.pick = Signal(name=f"{name}_pick")

    def addr_match(self, addr):
        """1 when ``addr`` equals this port's address; with ``late_pick`` the compare is made
        with both candidates and picked last (``pick`` stays off the compare)."""
        if self.late_pick:
            return Mux(self.pick, addr == self.addr_cand[1], addr == self.addr_cand[0])
        return addr == self.addr


def _width(shape) -> int:
    if isinstance(shape, ShapeCastable):
        return Shape.cast(shape.as_shape()).width
    return Shape.cast(shape).width


class _RamBase(Elaboratable):
    max_write_ports = None

    def __init__(self, *, shape, depth: int, granularity: int | None = None, name: str = "ram"):
        self.width = _width(shape)
        self.depth = depth
        self.granularity = granularity or self.width
        if self.width % self.granularity:
            raise ValueError(f"granularity {self.granularity} does not divide width {self.width}")
        self.chunks = self.width // self.granularity
        self.addr_bits = max(1, ceil_log2(depth))
        self.name = name
        self._write_ports: list[_WritePort] = []
        self._read_ports: list[_ReadPort] = []

    def write_port(self) -> _WritePort:
        if self.max_write_ports is not None and len(self._write_ports) >= self.max_write_ports:
            raise ValueError(f"{type(self).__name__} has {self.max_write_ports} write port(s)")
        port = _WritePort(f"{self.name}_w{len(self._write_ports)}", self.addr_bits, self.width, self.chunks)
        self._write_ports.append(port)
        return port

    def _new_read_port(self, domain, transparent_for, late_pick=False) -> _ReadPort:
        for wp in transparent_for:
            if wp not in self._write_ports:
                raise ValueError("transparent_for names a write port of another memory")
        if domain == "comb" and transparent_for:
            raise ValueError("an asynchronous read port sees every write after its cycle already")
        if domain == "comb" and late_pick:
            raise ValueError("late_pick is for synchronous read ports")
        port = _ReadPort(f"{self.name}_r{len(self._read_ports)}", self.addr_bits, self.width, domain,
                         transparent_for, late_pick)
        self._read_ports.append(port)
        return port

    def _bypass(self, m: Module, rp: _ReadPort, mem_data, write_ports):
        """rp.data = mem_data with the chunks written this cycle by ``write_ports`` (at rp.addr)."""
        if not write_ports:
            m.d.comb += rp.data.eq(mem_data)
            return
        G = self.granularity
        chunks = []
        for c in range(self.chunks):
            hit = Signal(name=f"{rp.addr.name}_byp{c}")
            held = Signal(G, name=f"{rp.addr.name}_bypd{c}")
            # The highest-numbered port that writes the chunk wins, as in the memory.
            with m.If(rp.en):
                m.d.sync += hit.eq(0)
                for wp in write_ports:
                    with m.If(wp.en[c] & rp.addr_match(wp.addr)):
                        m.d.sync += [hit.eq(1), held.eq(wp.data[c * G:(c + 1) * G])]
            chunks.append(Mux(hit, held, mem_data[c * G:(c + 1) * G]))
        m.d.comb += rp.data.eq(Cat(*chunks))


class BypassRam(_RamBase):
    """One write port; synchronous reads may bypass that port's same-cycle write (see module)."""
    max_write_ports = 1

    def read_port(self, *, domain: str = "sync", bypass: bool = False) -> _ReadPort:
        if bypass and not self._write_ports:
            raise ValueError("create the write port before a bypassed read port")
        return self._new_read_port(domain, self._write_ports[:1] if bypass else ())

    def elaborate(self, platform):
        m = Module()
        if len(self._write_ports) != 1:
            raise ValueError(f"{self.name}: a BypassRam needs exactly one write port")
        wp = self._write_ports[0]
        m.submodules.mem = mem = Memory(shape=self.width, depth=self.depth, init=[])
        w = mem.write_port(granularity=self.granularity if self.chunks > 1 else None)
        m.d.comb += [w.addr.eq(wp.addr), w.data.eq(wp.data), w.en.eq(wp.en)]
        for rp in self._read_ports:
            r = mem.read_port(domain=rp.domain)
            m.d.comb += r.addr.eq(rp.addr)
            if rp.domain == "comb":
                m.d.comb += rp.data.eq(r.data)
            else:
                m.d.comb += r.en.eq(rp.en)
                self._bypass(m, rp, r.data, rp.transparent_for)
        return m


class LvtRam(_RamBase):
    """Several write ports from one-write banks and a live value table (see module)."""

    def __init__(self, *, shape, depth: int, name: str = "ram"):
        super().__init__(shape=shape, depth=depth, name=name)

    def read_port(self, *, domain: str = "sync", transparent_for=(), late_pick: bool = False) -> _ReadPort:
        return self._new_read_port(domain, transparent_for, late_pick)

    def elaborate(self, platform):
        m = Module()
        W = len(self._write_ports)
        if W < 2:
            raise ValueError(f"{self.name}: an LvtRam needs at least two write ports (use BypassRam)")
        # The live value table: which write port wrote each address last. Flip-flops (W write
        # ports); the only multi-write storage left.
        m.submodules.lvt = lvt = Memory(shape=ceil_log2(W), depth=self.depth, init=[])
        for i, wp in enumerate(self._write_ports):
            lw = lvt.write_port()
            m.d.comb += [lw.addr.eq(wp.addr), lw.data.eq(i), lw.en.eq(wp.en)]
        for j, rp in enumerate(self._read_ports):
            if rp.late_pick:
                # The table is read at both candidates and the pick is registered with the
                # result, so ``pick`` does not stand in front of the table's read mux.
                m.d.comb += rp.addr.eq(Mux(rp.pick, rp.addr_cand[1], rp.addr_cand[0]))
                lr_cand = [lvt.read_port(domain="comb") for _ in range(2)]
                for lc, a in zip(lr_cand, rp.addr_cand, strict=True):
                    m.d.comb += lc.addr.eq(a)
                lr = Signal.like(lr_cand[0].data, name=f"{self.name}_r{j}_lvt")
                with m.If(rp.en):
                    m.d.sync += lr.eq(Mux(rp.pick, lr_cand[1].data, lr_cand[0].data))
            else:
                lr_port = lvt.read_port(domain=rp.domain)
                m.d.comb += lr_port.addr.eq(rp.addr)
                if rp.domain != "comb":
                    m.d.comb += lr_port.en.eq(rp.en)
                lr = lr_port.data
            # One replica per (write port, read port): each a one-write one-read RAM.
            bank_data = []
            for i, wp in enumerate(self._write_ports):
                bank = Memory(shape=self.width, depth=self.depth, init=[])
                m.submodules[f"bank{i}_r{j}"] = bank
                bw = bank.write_port()
                m.d.comb += [bw.addr.eq(wp.addr), bw.data.eq(wp.data), bw.en.eq(wp.en)]
                br = bank.read_port(domain=rp.domain)
                m.d.comb += br.addr.eq(rp.addr)
                if rp.domain != "comb":
                    m.d.comb += br.en.eq(rp.en)
                bank_data.append(br.data)
            selected = Signal(self.width, name=f"{self.name}_r{j}_bank")
            with m.Switch(lr):
                for i, d in enumerate(bank_data):
                    with m.Case(i):
                        m.d.comb += selected.eq(d)
            if rp.domain == "comb":
                m.d.comb += rp.data.eq(selected)
            else:
                self._bypass(m, rp, selected, rp.transparent_for)
        return m
