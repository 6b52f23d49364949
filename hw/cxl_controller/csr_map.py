"""TrainingCXL CSR map: the one definition of the device's MMIO registers.

The CXL.io BAR is 4 KiB (``ADDR_WIDTH`` = 12) of 32-bit registers behind an AXI4-Lite
subordinate (``hw/cxl_controller/csr.py``, ``CsrBlock``). Everything else is generated from
the tuple ``REGISTERS`` below: the register file RTL and its port names, the Markdown
register table, and the Python / C constants for host software (``tools/regmap.py``).
Do not type offsets or masks anywhere else; import them from here.

Data model
- ``Field(name, lsb, width, access, reset=0, doc="", sets=())`` and
  ``Register(name, offset, fields, doc="")``. Bits not covered by a field read as zero and
  ignore writes. A register whose only field has the register's own name is a
  *whole-register field* (e.g. ``SCRATCH``).
- Access kinds (``Access``): RO, RW, RW1C, COUNTER (see the enum), plus CONST, a read-only
  value fixed in the map (used for ``DEVICE_ID``, so software identifies the device
  without relying on the top tying a port correctly).
- ``sets=("STATUS.ERROR", ...)`` on a COUNTER field: every increment of the counter also
  sets those RW1C bits (in addition to their own ``<name>_set`` input).
- Interrupt: ``irq`` = OR over (``IRQ_STATUS_REG`` bits AND ``IRQ_ENABLE_REG`` bits), bit by
  bit; the enable register's fields must mirror the status register's fields.

Port naming (``ports()``; the device top connects by these names): base name = the
register name lowercased for a whole-register field, else ``<reg>_<field>`` lowercased.
RO -> ``In(width)`` named base; RW -> ``Out(width)`` named base; RW1C -> ``In(width)`` named
``<base>_set`` and ``Out(width)`` named base; COUNTER -> ``In(1)`` named ``<base>_inc``;
CONST -> no port.

Extending: append ``Register`` entries to ``_MAP`` (later issues: command queue, bias);
``check_map`` runs at import and rejects overlapping fields, duplicate or misaligned
offsets, offsets outside the BAR and port-name clashes.
"""
from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from types import MappingProxyType, SimpleNamespace

DATA_WIDTH = 32
ADDR_WIDTH = 12
BAR_SIZE = 1 << ADDR_WIDTH
DEVICE_ID_VALUE = 0x5443584C          # "TCXL" in ASCII, most significant byte first

IRQ_STATUS_REG = "STATUS"
IRQ_ENABLE_REG = "IRQ_ENABLE"

RESERVED_PORT_NAMES = frozenset({"bus", "irq", "clk", "rst"})
_NAME_RE = re.compile(r"^[A-Z][A-Z0-9_]*$")


class Access(enum.Enum):
    """How software and hardware see a field."""
    RO = "RO"            # hardware drives the value (CsrBlock input); writes ignored
    RW = "RW"            # software writes (per byte strobe), hardware reads (CsrBlock output)
    RW1C = "RW1C"        # status: hardware sets by a one-cycle `_set` pulse, software writes 1 to clear
    COUNTER = "COUNTER"  # 32-bit saturating event counter; `_inc` pulse adds 1; any write clears
    CONST = "CONST"      # read-only constant fixed in this map (value = reset); no port


@dataclass(frozen=True)
class Field:
    name: str
    lsb: int
    width: int
    access: Access
    reset: int = 0
    doc: str = ""
    sets: tuple[str, ...] = ()     # COUNTER only: "REG.FIELD" RW1C bits set by each increment

    def __post_init__(self):
        object.__setattr__(self, "sets", tuple(self.sets))
        if not _NAME_RE.match(self.name):
            raise ValueError(f"field name {self.name!r} must be UPPER_SNAKE_CASE")
        if not isinstance(self.access, Access):
            raise TypeError(f"field {self.name}: access must be an Access, not {self.access!r}")
        if self.width < 1 or self.lsb < 0 or self.lsb + self.width > DATA_WIDTH:
            raise ValueError(f"field {self.name}: bits [{self.msb}:{self.lsb}] outside 32 bits")
        if not 0 <= self.reset < (1 << self.width):
            raise ValueError(f"field {self.name}: reset {self.reset:#x} does not fit {self.width} bits")
        if self.access is Access.COUNTER and (self.lsb, self.width) != (0, DATA_WIDTH):
            raise ValueError(f"field {self.name}: a COUNTER is a whole 32-bit register")
        if self.access in (Access.COUNTER, Access.RO) and self.reset:
            raise ValueError(f"field {self.name}: {self.access.value} fields have no reset value")
        if self.sets and self.access is not Access.COUNTER:
            raise ValueError(f"field {self.name}: only COUNTER fields may set status bits")

    @property
    def msb(self) -> int:
        return self.lsb + self.width - 1

    @property
    def mask(self) -> int:
        """The field's bits in register position."""
        return ((1 << self.width) - 1) << self.lsb

    @property
    def bits(self) -> str:
        return f"[{self.msb}:{self.lsb}]" if self.width > 1 else f"[{self.lsb}]"


@dataclass(frozen=True)
class Register:
    name: str
    offset: int
    fields: tuple[Field, ...]
    doc: str = ""

    def __post_init__(self):
        object.__setattr__(self, "fields", tuple(self.fields))
        if not _NAME_RE.match(self.name):
            raise ValueError(f"register name {self.name!r} must be UPPER_SNAKE_CASE")
        if self.offset < 0 or self.offset % (DATA_WIDTH // 8):
            raise ValueError(f"register {self.name}: offset {self.offset:#x} not word aligned")
        if not self.fields:
            raise ValueError(f"register {self.name}: no fields")
        used = 0
        names = set()
        for f in self.fields:
            if f.mask & used:
                raise ValueError(f"register {self.name}: field {f.name} overlaps another field")
            if f.name in names:
                raise ValueError(f"register {self.name}: duplicate field {f.name}")
            used |= f.mask
            names.add(f.name)
        if len(self.fields) > 1 and self.name in names:
            raise ValueError(f"register {self.name}: a field named like the register must be its only field")

    @property
    def whole(self) -> bool:
        """True when the register is one field named like the register."""
        return len(self.fields) == 1 and self.fields[0].name == self.name

    @property
    def mask(self) -> int:
        """Bits implemented by some field."""
        m = 0
        for f in self.fields:
            m |= f.mask
        return m

    @property
    def accesses(self) -> tuple[Access, ...]:
        out = []
        for f in self.fields:
            if f.access not in out:
                out.append(f.access)
        return tuple(out)

    @property
    def reset(self) -> int | None:
        """Value read after reset, or None when a field is hardware-driven (RO)."""
        if any(f.access is Access.RO for f in self.fields):
            return None
        v = 0
        for f in self.fields:
            v |= f.reset << f.lsb
        return v

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"register {self.name} has no field {name!r} "
                       f"(fields: {', '.join(f.name for f in self.fields)})")

    def port_base(self, fld: Field) -> str:
        """CsrBlock port base name of field ``fld`` (see module docstring)."""
        return (self.name if fld.name == self.name else f"{self.name}_{fld.name}").lower()


@dataclass(frozen=True)
class Port:
    """One CsrBlock port derived from the map. ``direction`` is "in" or "out" (as seen by
    CsrBlock); ``role`` is "value" (RO input / RW or RW1C output), "set" or "inc"."""
    name: str
    direction: str
    width: int
    register: Register
    field: Field
    role: str


def field_ports(reg: Register, fld: Field) -> tuple[Port, ...]:
    base = reg.port_base(fld)
    a = fld.access
    if a is Access.RO:
        return (Port(base, "in", fld.width, reg, fld, "value"),)
    if a is Access.RW:
        return (Port(base, "out", fld.width, reg, fld, "value"),)
    if a is Access.RW1C:
        return (Port(base + "_set", "in", fld.width, reg, fld, "set"),
                Port(base, "out", fld.width, reg, fld, "value"))
    if a is Access.COUNTER:
        return (Port(base + "_inc", "in", 1, reg, fld, "inc"),)
    return ()


def ports(registers=None) -> tuple[Port, ...]:
    """All CsrBlock ports of ``registers`` (default ``REGISTERS``), in map order."""
    regs = REGISTERS if registers is None else registers
    return tuple(p for r in regs for f in r.fields for p in field_ports(r, f))


def _lookup(registers, name: str) -> Register:
    for r in registers:
        if r.name == name:
            return r
    raise KeyError(f"no register {name!r}")


def resolve_field_ref(registers, ref: str) -> tuple[Register, Field]:
    """``"REG.FIELD"`` -> (Register, Field)."""
    reg_name, _, field_name = ref.partition(".")
    reg = _lookup(registers, reg_name)
    return reg, reg.field(field_name or reg_name)


def check_map(registers, *, addr_width: int = ADDR_WIDTH) -> None:
    """Raise ValueError when the map is inconsistent (the per-register checks run when a
    Register is built)."""
    names, offsets = {}, {}
    for r in registers:
        if r.name in names:
            raise ValueError(f"duplicate register name {r.name}")
        if r.offset in offsets:
            raise ValueError(f"registers {offsets[r.offset]} and {r.name} share offset {r.offset:#x}")
        if r.offset + DATA_WIDTH // 8 > (1 << addr_width):
            raise ValueError(f"register {r.name}: offset {r.offset:#x} outside the {1 << addr_width}-byte BAR")
        names[r.name] = r
        offsets[r.offset] = r.name
    seen = {}
    for p in ports(registers):
        if p.name in RESERVED_PORT_NAMES:
            raise ValueError(f"port name {p.name} of {p.register.name}.{p.field.name} is reserved")
        if p.name in seen:
            raise ValueError(f"port name {p.name} used by {seen[p.name]} and "
                             f"{p.register.name}.{p.field.name}")
        seen[p.name] = f"{p.register.name}.{p.field.name}"
    for r in registers:
        for f in r.fields:
            for ref in f.sets:
                try:
                    _, target = resolve_field_ref(registers, ref)
                except KeyError as e:
                    raise ValueError(f"{r.name}.{f.name} sets unknown {ref}: {e}") from None
                if target.access is not Access.RW1C or target.width != 1:
                    raise ValueError(f"{r.name}.{f.name} sets {ref}, which is not a 1-bit RW1C field")
    if IRQ_STATUS_REG in names or IRQ_ENABLE_REG in names:
        status, enable = names.get(IRQ_STATUS_REG), names.get(IRQ_ENABLE_REG)
        if status is None or enable is None:
            raise ValueError(f"{IRQ_STATUS_REG} and {IRQ_ENABLE_REG} come together")
        if any(f.access is not Access.RW1C for f in status.fields):
            raise ValueError(f"{IRQ_STATUS_REG} fields must be RW1C")
        a = sorted((f.name, f.lsb, f.width) for f in status.fields)
        b = sorted((f.name, f.lsb, f.width) for f in enable.fields)
        if a != b or any(f.access is not Access.RW for f in enable.fields):
            raise ValueError(f"{IRQ_ENABLE_REG} must have RW fields mirroring {IRQ_STATUS_REG}")


# --------------------------------------------------------------------------------------
# The map. Keep offsets ascending; leave gaps for growth within a group.

def _whole(name, offset, access, doc, *, reset=0, sets=()):
    return Register(name, offset, (Field(name, 0, DATA_WIDTH, access, reset, doc, sets),), doc)


_ERR = ("STATUS.ERROR",)

_MAP = (
    # --- identification and capabilities (0x000-0x01C) ---
    _whole("DEVICE_ID", 0x000, Access.CONST,
           'Device identifier, the constant 0x5443584C ("TCXL"), fixed in the CSR map.',
           reset=DEVICE_ID_VALUE),
    Register("VERSION", 0x004, (
        Field("MAJOR", 16, 16, Access.RO, doc="Major version (incompatible register map changes)."),
        Field("MINOR", 8, 8, Access.RO, doc="Minor version (backward-compatible additions)."),
        Field("PATCH", 0, 8, Access.RO, doc="Patch level."),
    ), "Device version, driven by the device top."),
    Register("CHANNELS", 0x008, (
        Field("COUNT", 0, 8, Access.RO, doc="Number of memory (media) channels."),
    ), "Memory channel count."),
    Register("OUTSTANDING", 0x00C, (
        Field("READS", 0, 16, Access.RO, doc="Maximum outstanding media reads."),
        Field("WRITES", 16, 16, Access.RO, doc="Maximum outstanding media writes."),
    ), "Outstanding media transaction limits."),
    _whole("CAPACITY_LO", 0x010, Access.RO, "Device memory capacity in bytes, bits 31:0."),
    _whole("CAPACITY_HI", 0x014, Access.RO, "Device memory capacity in bytes, bits 63:32."),
    _whole("CLOCK_MHZ", 0x018, Access.RO,
           "Device clock frequency in MHz (converts cycle counters to time)."),
    # --- HDM decoder (0x020-0x03C) ---
    Register("HDM_BASE_LO", 0x020, (
        Field("ADDR", 6, 26, Access.RW,
              doc="HDM window base address bits 31:6 (64-byte line aligned; bits 5:0 read 0)."),
    ), "HDM window base address, low word."),
    Register("HDM_BASE_HI", 0x024, (
        Field("ADDR", 0, 20, Access.RW, doc="HDM window base address bits 51:32."),
    ), "HDM window base address, high word."),
    Register("HDM_SIZE_LO", 0x028, (
        Field("SIZE", 6, 26, Access.RW, doc="HDM window size bits 31:6 (bits 5:0 read 0)."),
    ), "HDM window size in bytes, low word."),
    Register("HDM_SIZE_HI", 0x02C, (
        Field("SIZE", 0, 20, Access.RW, doc="HDM window size bits 51:32."),
    ), "HDM window size in bytes, high word."),
    Register("HDM_CTRL", 0x030, (
        Field("ENABLE", 0, 1, Access.RW,
              doc="Decode CXL.mem in the HDM window. Reset 0: nothing decodes until software "
                  "commits a window."),
    ), "HDM decoder control."),
    # --- status and interrupts (0x040-0x04C) ---
    Register("STATUS", 0x040, (
        Field("ERROR", 0, 1, Access.RW1C,
              doc="Set by any ERR_* counter increment (or status_error_set); write 1 to clear."),
        Field("POISON", 1, 1, Access.RW1C,
              doc="Set when poisoned data is received (RwD) or returned (DRS), i.e. by "
                  "ERR_POISON_WR/ERR_POISON_RD increments (or status_poison_set); write 1 to clear."),
        Field("NDP_DONE", 2, 1, Access.RW1C,
              doc="Set when the NDP command processor completes a command (every STAT_NDP_COMMANDS "
                  "increment); write 1 to clear."),
    ), "Sticky status bits; irq = OR(STATUS & IRQ_ENABLE)."),
    Register("IRQ_ENABLE", 0x044, (
        Field("ERROR", 0, 1, Access.RW, doc="Raise irq while STATUS.ERROR is set."),
        Field("POISON", 1, 1, Access.RW, doc="Raise irq while STATUS.POISON is set."),
        Field("NDP_DONE", 2, 1, Access.RW, doc="Raise irq while STATUS.NDP_DONE is set."),
    ), "Interrupt enables, one per STATUS bit."),
    _whole("SCRATCH", 0x048, Access.RW, "Scratch register for software; no hardware effect."),
    # --- error counters (0x050-0x07C); each increment sets STATUS.ERROR ---
    _whole("ERR_OUT_OF_WINDOW_RD", 0x050, Access.COUNTER,
           "MemRd, MemRdData, MemInv and MemInvNT outside the HDM window (or with it disabled): "
           "reads answered MemData-NXM, invalidates Cmp. Other Req opcodes outside the window count "
           "where they would inside (STAT_SPEC_RD_DROPPED, ERR_UNSUPPORTED_REQ, ERR_UNEXPECTED_FWD).",
           sets=_ERR),
    _whole("ERR_OUT_OF_WINDOW_WR", 0x054, Access.COUNTER,
           "MemWr and MemWrPtl outside the HDM window (or with it disabled): Cmp, no effect; poisoned "
           "ones are counted here only, not in ERR_POISON_WR.", sets=_ERR),
    _whole("ERR_UNSUPPORTED_REQ", 0x058, Access.COUNTER,
           "M2S Req with a reserved or unsupported opcode (TEE, MemClnEvct, MemRdFill, reserved codes), "
           "inside or outside the window; answered NDR Cmp.", sets=_ERR),
    _whole("ERR_UNSUPPORTED_RWD", 0x05C, Access.COUNTER,
           "M2S RwD with a reserved or unsupported opcode, BIConflict included (answered BI-ConflictAck; "
           "the others Cmp, nothing written), inside or outside the window.", sets=_ERR),
    _whole("ERR_UNEXPECTED_FWD", 0x060, Access.COUNTER,
           "MemRdFwd/MemWrFwd with no device request outstanding.", sets=_ERR),
    _whole("ERR_POISON_WR", 0x064, Access.COUNTER,
           "Poisoned MemWr/MemWrPtl inside the HDM window (the line is written poisoned). Poisoned "
           "writes outside the window count in ERR_OUT_OF_WINDOW_WR, other opcodes in ERR_UNSUPPORTED_RWD.",
           sets=_ERR + ("STATUS.POISON",)),
    _whole("ERR_POISON_RD", 0x068, Access.COUNTER,
           "MemData returned with Poison = 1 for a CXL.mem read (the line is poisoned, or the media "
           "read failed).", sets=_ERR + ("STATUS.POISON",)),
    _whole("ERR_MEDIA", 0x06C, Access.COUNTER,
           "Media AXI error responses (SLVERR/DECERR) to CXL.mem reads and writes; NDP engines report "
           "theirs in their completion (NdpError.MEDIA).", sets=_ERR),
    _whole("ERR_CACHE_GO", 0x070, Access.COUNTER,
           "CXL.cache GO-Err, GO_ERR_WritePull or poisoned H2D data taken by an outstanding request "
           "(dropped strays count in ERR_CACHE_STRAY only).", sets=_ERR),
    # CXL.cache illegal host messages (issue 20; hw/cxl_controller/cxl_cache.py)
    _whole("ERR_CACHE_STRAY", 0x074, Access.COUNTER,
           "CXL.cache H2D responses and data dropped (CQID out of range, not outstanding, or in "
           "the wrong phase); they change nothing.", sets=_ERR),
    _whole("ERR_CACHE_SNOOP_RSVD", 0x078, Access.COUNTER,
           "CXL.cache snoops with a reserved opcode (0, 4-7), answered RspIHitI with no state change.",
           sets=_ERR),
    Register("CACHE_STRAY_INFO", 0x07C, (
        Field("QID", 0, 12, Access.RO,
              doc="CQID of the H2D response or data as received (all 12 bits), or the snoop's UQID."),
        Field("OPCODE", 12, 4, Access.RO, doc="H2D response opcode or snoop opcode; 0 for H2D data."),
        Field("GO_STATE", 16, 4, Access.RO, doc="RspData[3:0] of an H2D response (the GO state); else 0."),
        Field("KIND", 20, 2, Access.RO, doc="Channel: 0 = H2D Rsp, 1 = H2D Data, 2 = H2D Req (snoop)."),
        Field("REASON", 22, 2, Access.RO,
              doc="0 = CQID above the tracker count, 1 = no request outstanding on the CQID, "
                  "2 = outstanding but not in a phase that takes the message, 3 = reserved snoop opcode."),
        Field("VALID", 31, 1, Access.RW1C,
              doc="Set when a message is captured; the other fields hold while it is 1. Write 1 to "
                  "clear it and capture the next one."),
    ), "First illegal CXL.cache host message counted in ERR_CACHE_STRAY or ERR_CACHE_SNOOP_RSVD."),
    # --- statistics counters (0x080-0x0FC) ---
    _whole("STAT_RD_LINES", 0x080, Access.COUNTER,
           "Lines read from media for CXL.mem: MemRd and MemRdData inside the HDM window (counted as "
           "decoded; NDP engine traffic is not counted)."),
    _whole("STAT_WR_LINES", 0x084, Access.COUNTER,
           "Lines written to media for CXL.mem: MemWr and MemWrPtl inside the HDM window (counted as "
           "decoded; NDP engine traffic is not counted)."),
    _whole("STAT_SPEC_RD_DROPPED", 0x088, Access.COUNTER, "MemSpecRd requests dropped, inside or outside the window."),
    _whole("STAT_INV", 0x08C, Access.COUNTER,
           "MemInv and MemInvNT inside the HDM window; outside ones count in ERR_OUT_OF_WINDOW_RD."),
    # --- CXL.cache agent statistics (0x0A0-0x0BC) ---
    _whole("STAT_D2H_REQ", 0x0A0, Access.COUNTER, "D2H requests sent (including evictions)."),
    _whole("STAT_SNOOP", 0x0A4, Access.COUNTER, "H2D snoops answered."),
    _whole("STAT_SNOOP_HIT", 0x0A8, Access.COUNTER,
           "Snoops that found the line held (in the cache or being evicted)."),
    _whole("STAT_EVICT_DIRTY", 0x0AC, Access.COUNTER, "DirtyEvict requests sent."),
    _whole("STAT_EVICT_CLEAN", 0x0B0, Access.COUNTER, "CleanEvict requests sent."),
    _whole("STAT_BOGUS", 0x0B4, Access.COUNTER,
           "Evict data sent with Bogus set (a snoop took the line in between)."),
    _whole("STAT_CACHE_HIT", 0x0B8, Access.COUNTER, "Internal requests served by the device cache."),
    _whole("STAT_CACHE_MISS", 0x0BC, Access.COUNTER, "Internal requests that went to CXL.cache."),
    # --- bias table of the device's own memory, HDM-D (0x0C0-0x0DC) ---
    Register("BIAS_FLIP", 0x0C0, (
        Field("PAGE", 0, 24, Access.RW, doc="Page to flip (device memory page index)."),
        Field("TO_DEVICE", 31, 1, Access.RW,
              doc="1: flip to device bias (the device takes every line from the host); "
                  "0: flip to host bias."),
    ), "Bias flip request; takes effect when BIAS_DOORBELL.SEQ changes."),
    Register("BIAS_DOORBELL", 0x0C4, (
        Field("SEQ", 0, 8, Access.RW, doc="Write a new value to start the flip in BIAS_FLIP."),
    ), "Bias flip doorbell (a sequence number)."),
    Register("BIAS_STATUS", 0x0C8, (
        Field("BUSY", 0, 1, Access.RO, doc="A flip is in progress."),
        Field("ERROR", 1, 1, Access.RO, doc="The last flip failed (the host answered an error); "
                                             "the page stayed in host bias."),
        Field("DONE_SEQ", 8, 8, Access.RO, doc="BIAS_DOORBELL.SEQ of the last flip done."),
        Field("QUERY_DEVICE", 16, 1, Access.RO, doc="Bias of BIAS_QUERY.PAGE: 1 = device."),
    ), "Bias engine status and page query result: one snapshot of all fields, a cycle old "
       "(a read issued after a BIAS_DOORBELL or BIAS_QUERY write's response sees that write)."),
    Register("BIAS_QUERY", 0x0CC, (
        Field("PAGE", 0, 24, Access.RW, doc="Page whose bias BIAS_STATUS.QUERY_DEVICE shows."),
    ), "Bias page query."),
    Register("BIAS_GEOMETRY", 0x0D0, (
        Field("PAGE_LINE_BITS", 0, 8, Access.RO, doc="log2 of the 64-byte lines in a bias page."),
        Field("PAGES_LOG2", 8, 8, Access.RO, doc="log2 of the number of bias pages."),
    ), "Bias table geometry."),
    _whole("STAT_BIAS_TO_DEVICE", 0x0D8, Access.COUNTER, "Pages flipped to device bias."),
    _whole("STAT_BIAS_TO_HOST", 0x0DC, Access.COUNTER,
           "Pages flipped to host bias (by CSR or by a host access to a device-bias page)."),
    # --- NDP command rings (0x100-0x13C); descriptors in hw/ndp/command.py ---
    _whole("NDP_SQ_BASE", 0x100, Access.RW,
           "Submission ring: device line address of slot 0 (one 64-byte CommandDescriptor per slot)."),
    _whole("NDP_CQ_BASE", 0x104, Access.RW,
           "Completion ring: device line address of slot 0 (one 64-byte Completion per slot)."),
    Register("NDP_RING", 0x108, (
        Field("SIZE_LOG2", 0, 4, Access.RW, doc="log2 of the slots in each ring (1 to 32768 slots)."),
    ), "Ring geometry; change only while NDP_STATUS.BUSY is 0 and the rings are empty."),
    Register("NDP_SQ_TAIL", 0x10C, (
        Field("TAIL", 0, 16, Access.RW,
              doc="Doorbell: the host writes the count of commands it has submitted (mod 2**16); "
                  "the device runs commands while NDP_SQ_HEAD.HEAD differs."),
    ), "Submission doorbell."),
    Register("NDP_SQ_HEAD", 0x110, (
        Field("HEAD", 0, 16, Access.RO, doc="Commands completed (mod 2**16); slot = HEAD mod size."),
    ), "Submission head."),
    Register("NDP_STATUS", 0x114, (
        Field("BUSY", 0, 1, Access.RO, doc="A command is executing."),
        Field("LAST_ERROR", 8, 8, Access.RO, doc="NdpError of the last completed command (0 = OK)."),
        Field("LAST_TAG", 16, 16, Access.RO, doc="Tag of the last completed command."),
    ), "Command processor status."),
    _whole("NDP_LAST_CYCLES", 0x118, Access.RO, "Cycles the last completed command took."),
    _whole("NDP_LAST_ERROR_INFO", 0x11C, Access.RO,
           "Where the last failed command failed (element position or table), else 0."),
    _whole("STAT_NDP_COMMANDS", 0x120, Access.COUNTER, "NDP commands completed (with or without error).",
           sets=("STATUS.NDP_DONE",)),
    _whole("ERR_NDP_COMMAND", 0x124, Access.COUNTER, "NDP commands completed with an error.", sets=_ERR),
    # --- Checkpoint (0x140-0x17C); log layout in hw/checkpoint/log_format.py ---
    _whole("CKPT_LOG_BASE", 0x140, Access.RW,
           "Embedding undo log: device line address of slot 0 (batch k uses slot k mod 2)."),
    _whole("CKPT_SLOT_LINES", 0x144, Access.RW,
           "Lines per embedding log slot (2 record lines + entries); LOG fails with LOG_FULL beyond it."),
    _whole("CKPT_MLP_BASE", 0x148, Access.RW,
           "MLP log: device line address of slot 0 (two slots of 1 + CKPT_MLP_LINES lines)."),
    _whole("CKPT_MLP_LINES", 0x14C, Access.RW, "Size of the GPU's MLP parameter image, in 64-byte lines."),
    _whole("CKPT_MLP_ADDR_LO", 0x150, Access.RW, "Host line address of the MLP parameter image, bits 31:0."),
    Register("CKPT_MLP_ADDR_HI", 0x154, (
        Field("ADDR", 0, 14, Access.RW, doc="Host line address of the MLP parameter image, bits 45:32."),
    ), "MLP parameter image address (high)."),
    _whole("CKPT_RECOVERED_EMB", 0x158, Access.RO,
           "After RECOVER: embedding batches applied in the tables (the host resumes at this batch)."),
    _whole("CKPT_RECOVERED_MLP", 0x15C, Access.RO,
           "After RECOVER: batch of the newest complete MLP log (parameters after that many batches)."),
    Register("CKPT_RECOVER_STATUS", 0x160, (
        Field("EMB_VALID", 0, 1, Access.RO, doc="A valid LOGGED record was found."),
        Field("MLP_VALID", 1, 1, Access.RO, doc="A valid MLP_LOGGED record was found."),
        Field("ROLLED_BACK", 2, 1, Access.RO, doc="The newest logged batch was rolled back."),
        Field("MLP_SLOT", 3, 1, Access.RO, doc="The MLP slot holding the newest complete MLP log."),
    ), "Result of the last RECOVER command."),
)

check_map(_MAP)

REGISTERS: tuple[Register, ...] = tuple(_MAP)
"""All registers, in map order (ascending offsets)."""

REG = SimpleNamespace(**{r.name: r.offset for r in REGISTERS})
"""Register name -> offset, e.g. ``REG.HDM_BASE_LO == 0x20``."""

BY_NAME = MappingProxyType({r.name: r for r in REGISTERS})
BY_OFFSET = MappingProxyType({r.offset: r for r in REGISTERS})


def register(name: str) -> Register:
    """The register called ``name``."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"no register {name!r}") from None


def field(reg: Register | str, name: str) -> Field:
    """Field ``name`` of register ``reg`` (a Register or its name)."""
    r = register(reg) if isinstance(reg, str) else reg
    return r.field(name)
