"""CXL.mem message layouts and encodings: the one source of truth.

Every opcode value and field width below is the real one from the CXL specification
(see ../shared/docs/cxl-reference.md §1, Tables 3-34/40/49/52 of CXL 3.2). The testbench
packs and unpacks messages from these layouts (sim/model/codec.py); the docs quote them.

Transaction-level simplifications (documented in README "Design"):
- The Valid bit of each header is the stream's ``valid``; it is not part of the payload.
- Addresses are 64-byte line addresses, Addr[51:6] (46 bits), for Req and RwD alike (the
  256B-flit form; the 68B-flit Req also carries Addr[5], which a 64B-line device ignores).
- One message carries one whole 64-byte line: M2S RwD and S2M DRS include their data (and
  RwD its 64 byte enables, the 256B-flit trailer), so one stream beat is one message.
"""
from amaranth.lib import data, enum

LINE_BYTES = 64
LINE_BITS = LINE_BYTES * 8
LINE_ADDR_BITS = 46          # Addr[51:6]
TAG_BITS = 16
LD_ID_BITS = 4


class M2SReqOpcode(enum.Enum, shape=4):
    """M2S Req MemOpcode (CXL 3.2 Table 3-35)."""
    MEM_INV = 0b0000
    MEM_RD = 0b0001
    MEM_RD_DATA = 0b0010
    MEM_RD_FWD = 0b0011
    MEM_WR_FWD = 0b0100
    MEM_RD_TEE = 0b0101
    MEM_RD_DATA_TEE = 0b0110
    MEM_INV_TEE = 0b0111
    MEM_SPEC_RD = 0b1000
    MEM_INV_NT = 0b1001
    MEM_CLN_EVCT = 0b1010
    MEM_INV_P_TEE = 0b1011
    MEM_SPEC_RD_TEE = 0b1100
    TE_UPDATE = 0b1101
    MEM_CLN_EVCT_TEE = 0b1110
    MEM_CLN_EVCT_U = 0b1111


class M2SRwDOpcode(enum.Enum, shape=4):
    """M2S RwD MemOpcode (CXL 3.2 Table 3-41). Values not listed are reserved.

    0b0000 is reserved too; it is named so that signals of this shape can reset to it.
    """
    RESERVED_0000 = 0b0000
    MEM_WR = 0b0001
    MEM_WR_PTL = 0b0010
    BI_CONFLICT = 0b0100
    MEM_RD_FILL = 0b0101
    MEM_WR_TEE = 0b1001
    MEM_WR_PTL_TEE = 0b1010
    MEM_RD_FILL_TEE = 0b1101


class SnpType(enum.Enum, shape=3):
    NO_OP = 0b000
    SNP_DATA = 0b001
    SNP_CUR = 0b010
    SNP_INV = 0b011


class MetaField(enum.Enum, shape=2):
    META0_STATE = 0b00
    EXTENDED_META_STATE = 0b01
    NO_OP = 0b11


class MetaValue(enum.Enum, shape=2):
    INVALID = 0b00
    EXPLICIT_NO_OP = 0b01
    ANY = 0b10
    SHARED = 0b11


class NDROpcode(enum.Enum, shape=3):
    """S2M NDR opcode (CXL 3.2 Table 3-50)."""
    CMP = 0b000
    CMP_S = 0b001
    CMP_E = 0b010
    CMP_M = 0b011
    BI_CONFLICT_ACK = 0b100
    CMP_TEE = 0b101
    CMP_TEE_S = 0b110
    CMP_TEE_E = 0b111


class DRSOpcode(enum.Enum, shape=3):
    """S2M DRS opcode (CXL 3.2 Table 3-53)."""
    MEM_DATA = 0b000
    MEM_DATA_NXM = 0b001
    MEM_DATA_TEE = 0b010


class DevLoad(enum.Enum, shape=2):
    LIGHT = 0b00
    OPTIMAL = 0b01
    MODERATE = 0b10
    SEVERE = 0b11


class M2SReq(data.Struct):
    """M2S Req header: 79 bits (the 68B-flit form is 87 with Valid, Addr[5] and spare bits)."""
    opcode: M2SReqOpcode
    snp_type: SnpType
    meta_field: MetaField
    meta_value: MetaValue
    tag: TAG_BITS
    addr: LINE_ADDR_BITS
    ld_id: LD_ID_BITS
    tc: 2


class M2SRwD(data.Struct):
    """M2S RwD header plus its 64-byte line and 64 byte enables (one beat, one message)."""
    opcode: M2SRwDOpcode
    snp_type: SnpType
    meta_field: MetaField
    meta_value: MetaValue
    tag: TAG_BITS
    addr: LINE_ADDR_BITS
    ld_id: LD_ID_BITS
    tc: 2
    poison: 1
    trp: 1
    byte_enable: LINE_BYTES
    data: LINE_BITS


class S2MNDR(data.Struct):
    """S2M NDR (no data response), 29 bits without Valid."""
    opcode: NDROpcode
    meta_field: MetaField
    meta_value: MetaValue
    tag: TAG_BITS
    ld_id: LD_ID_BITS
    dev_load: DevLoad


class S2MDRS(data.Struct):
    """S2M DRS header plus its 64-byte line (one beat, one message)."""
    opcode: DRSOpcode
    meta_field: MetaField
    meta_value: MetaValue
    tag: TAG_BITS
    ld_id: LD_ID_BITS
    dev_load: DevLoad
    poison: 1
    trp: 1
    data: LINE_BITS
