"""CXL.cache message layouts and encodings: the one source of truth.

Opcode values and field widths are the real ones (../shared/docs/cxl-reference.md §2;
CXL 3.2 Tables 3-13 to 3-27). As for CXL.mem (cxl_mem.py): the header's Valid bit is the
stream's ``valid``; addresses are 64-byte line addresses Addr[51:6]; a data message carries
its whole 64-byte line in one beat (68B-flit field set: ChunkValid present, no BEP, no
CacheID).

Each opcode enum names its reserved value 0 (``RESERVED_0``) so that signals of that
shape can reset to it; it is never sent.
"""
from amaranth.lib import data, enum

from .cxl_mem import LINE_ADDR_BITS, LINE_BITS

QID_BITS = 12            # CQID (device queue ID) and UQID (host queue ID)


class D2HReqOpcode(enum.Enum, shape=5):
    """D2H request opcodes (CXL 3.2 Table 3-22)."""
    RESERVED_0 = 0b00000
    RD_CURR = 0b00001
    RD_OWN = 0b00010
    RD_SHARED = 0b00011
    RD_ANY = 0b00100
    RD_OWN_NO_DATA = 0b00101
    ITOM_WR = 0b00110
    WR_CUR = 0b00111            # "MemWr" in CXL 1.1/2.0
    CL_FLUSH = 0b01000
    CLEAN_EVICT = 0b01001
    DIRTY_EVICT = 0b01010
    CLEAN_EVICT_NO_DATA = 0b01011
    WO_WR_INV = 0b01100
    WO_WR_INV_F = 0b01101
    WR_INV = 0b01110
    CACHE_FLUSHED = 0b10000


class D2HRspOpcode(enum.Enum, shape=5):
    """D2H (snoop) response opcodes (CXL 3.2 Table 3-25)."""
    RESERVED_0 = 0b00000
    RSP_S_HIT_SE = 0b00001
    RSP_I_HIT_I = 0b00100
    RSP_I_HIT_SE = 0b00101
    RSP_V_HIT_V = 0b00110
    RSP_S_FWD_M = 0b00111
    RSP_I_FWD_M = 0b01111
    RSP_V_FWD_V = 0b10110


class H2DReqOpcode(enum.Enum, shape=3):
    """H2D request (snoop) opcodes (CXL 3.2 Table 3-26)."""
    RESERVED_0 = 0b000
    SNP_DATA = 0b001
    SNP_INV = 0b010
    SNP_CUR = 0b011


class H2DRspOpcode(enum.Enum, shape=4):
    """H2D response opcodes (CXL 3.2 Table 3-27; Fast_GO is from CXL 1.1/2.0)."""
    RESERVED_0 = 0b0000
    WRITE_PULL = 0b0001
    GO = 0b0100
    GO_WRITE_PULL = 0b0101
    EXT_CMP = 0b0110
    GO_WRITE_PULL_DROP = 0b1000
    FAST_GO = 0b1100
    FAST_GO_WRITE_PULL = 0b1101
    GO_ERR_WRITE_PULL = 0b1111


class GOState(enum.Enum, shape=4):
    """Cache state granted by a GO, carried in RspData[3:0] (CXL 3.2 Table 3-20)."""
    RESERVED_0 = 0b0000
    S = 0b0001
    E = 0b0010
    I = 0b0011          # noqa: E741 (the spec's name)
    ERR = 0b0100
    M = 0b0110


class RspPre(enum.Enum, shape=2):
    LOCAL_MISS = 0b00
    HIT = 0b01
    REMOTE_MISS = 0b10


class D2HReq(data.Struct):
    opcode: D2HReqOpcode
    cqid: QID_BITS
    nt: 1
    addr: LINE_ADDR_BITS


class D2HRsp(data.Struct):
    opcode: D2HRspOpcode
    uqid: QID_BITS


class D2HData(data.Struct):
    """D2H data header plus its 64-byte line (one beat, one message)."""
    uqid: QID_BITS
    chunk_valid: 1
    bogus: 1
    poison: 1
    data: LINE_BITS


class H2DReq(data.Struct):
    opcode: H2DReqOpcode
    addr: LINE_ADDR_BITS
    uqid: QID_BITS


class H2DRsp(data.Struct):
    opcode: H2DRspOpcode
    rsp_data: QID_BITS          # GO: the state in bits 3:0; pulls: the host UQID
    rsp_pre: RspPre
    cqid: QID_BITS


class H2DData(data.Struct):
    """H2D data header plus its 64-byte line (one beat, one message)."""
    cqid: QID_BITS
    chunk_valid: 1
    poison: 1
    go_err: 1
    data: LINE_BITS


# Legal snoop responses (CXL 3.2 Table 3-26). *Fwd* responses also send the line on D2H
# data to the snoop's UQID; no other response carries data.
LEGAL_SNOOP_RESPONSES = {
    H2DReqOpcode.SNP_DATA: frozenset({D2HRspOpcode.RSP_I_HIT_I, D2HRspOpcode.RSP_S_HIT_SE,
                                      D2HRspOpcode.RSP_S_FWD_M, D2HRspOpcode.RSP_I_FWD_M}),
    H2DReqOpcode.SNP_INV: frozenset({D2HRspOpcode.RSP_I_HIT_I, D2HRspOpcode.RSP_I_HIT_SE,
                                     D2HRspOpcode.RSP_I_FWD_M}),
    H2DReqOpcode.SNP_CUR: frozenset(set(D2HRspOpcode) - {D2HRspOpcode.RESERVED_0}),
}
FORWARDING_RESPONSES = frozenset({D2HRspOpcode.RSP_S_FWD_M, D2HRspOpcode.RSP_I_FWD_M,
                                  D2HRspOpcode.RSP_V_FWD_V})

# Request semantics (CXL 3.2 Tables 3-22/3-23): which D2H requests receive data, a GO, or
# a write pull. Used by the agent and by the protocol monitor's checks 9-10.
READS_WITH_DATA = frozenset({D2HReqOpcode.RD_CURR, D2HReqOpcode.RD_OWN,
                             D2HReqOpcode.RD_SHARED, D2HReqOpcode.RD_ANY})
READ0 = frozenset({D2HReqOpcode.RD_OWN_NO_DATA, D2HReqOpcode.CL_FLUSH,
                   D2HReqOpcode.CACHE_FLUSHED})
WRITES = frozenset({D2HReqOpcode.ITOM_WR, D2HReqOpcode.WR_CUR, D2HReqOpcode.CLEAN_EVICT,
                    D2HReqOpcode.DIRTY_EVICT, D2HReqOpcode.CLEAN_EVICT_NO_DATA,
                    D2HReqOpcode.WO_WR_INV, D2HReqOpcode.WO_WR_INV_F, D2HReqOpcode.WR_INV})
