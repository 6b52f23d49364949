"""Host-side CXL.mem rules: which M2S messages are HOST protocol errors (not device faults).

``host_errors(kind, fields)`` returns the categories (a tuple of names, empty when the message
is legal) that one M2S Req (``kind="req"``) or RwD (``"rwd"``) breaks by its encoding alone.
The CXL.mem monitor counts them apart from device violations; a device must answer such
messages without hanging and without changing any other line, but sending them is the host's
fault, so they are never device violations. Rules, from docs/cxl-reference.md §1 and §6 (this
device: HDM-D Type-2, 68B-flit message set plus byte enables, Meta0-State only, no TSP):
- ``req_opcode_unsupported``: TEE/TSP opcodes (3.1+, not advertised), MemClnEvct and
  MemClnEvctU (HDM-DB only).
- ``rwd_opcode_reserved``: RwD codes the specification leaves reserved.
- ``rwd_opcode_unsupported``: BIConflict (HDM-DB back-invalidate only; no BISnp is ever
  pending on an HDM-D device), MemRdFill / TEE writes (256B-flit and TSP only).
- ``snp_type_reserved``: SnpType 100-111.
- ``meta_field_reserved``: MetaField 10.
- ``meta_field_ems``: Extended-Meta-State (3.1+; §6 keeps Meta0-State only).
- ``meta0_explicit_no_op``: Meta0-State with MetaValue Explicit-No-Op (an EMS-only value).
Not classified here: state-dependent rules the device cannot see (MemWr SnpType versus the
host's cache state) and MemRdFwd/MemWrFwd without a live D2H request (the CXL.cache agent
knows its requests; a test without CXL.cache traffic counts those itself). A Tag repeated
while an earlier request with it is outstanding is legal ("the Tag need not be unique",
cxl-reference §1) and is not a host error; the monitor counts it separately.
"""
from __future__ import annotations

from hw.common.cxl_mem import M2SReqOpcode as Q, M2SRwDOpcode as W, SnpType, MetaField, MetaValue

REQ_SUPPORTED = frozenset(op.value for op in (
    Q.MEM_INV, Q.MEM_RD, Q.MEM_RD_DATA, Q.MEM_RD_FWD, Q.MEM_WR_FWD, Q.MEM_SPEC_RD, Q.MEM_INV_NT))
RWD_SUPPORTED = frozenset({W.MEM_WR.value, W.MEM_WR_PTL.value})
# Named in the specification but not for this device (W.RESERVED_0000 is a name for reset only).
RWD_DEFINED = frozenset(op.value for op in W if op is not W.RESERVED_0000)
_SNP_DEFINED = frozenset(s.value for s in SnpType)
_MS0, _EMS = MetaField.META0_STATE.value, MetaField.EXTENDED_META_STATE.value
_META_DEFINED = frozenset(f.value for f in MetaField)
_EXPLICIT_NO_OP = MetaValue.EXPLICIT_NO_OP.value

CATEGORIES = ("req_opcode_unsupported", "rwd_opcode_reserved", "rwd_opcode_unsupported",
              "snp_type_reserved", "meta_field_reserved", "meta_field_ems", "meta0_explicit_no_op")


def host_errors(kind: str, fields: dict) -> tuple[str, ...]:
    """The host-rule categories one M2S message breaks (see the module docstring)."""
    out = []
    op = fields["opcode"]
    if kind == "req":
        if op not in REQ_SUPPORTED:
            out.append("req_opcode_unsupported")
    elif op not in RWD_DEFINED:
        out.append("rwd_opcode_reserved")
    elif op not in RWD_SUPPORTED:
        out.append("rwd_opcode_unsupported")
    if fields["snp_type"] not in _SNP_DEFINED:
        out.append("snp_type_reserved")
    mf = fields["meta_field"]
    if mf not in _META_DEFINED:
        out.append("meta_field_reserved")
    elif mf == _EMS:
        out.append("meta_field_ems")
    elif mf == _MS0 and fields["meta_value"] == _EXPLICIT_NO_OP:
        out.append("meta0_explicit_no_op")
    return tuple(out)
