"""Message layouts: widths and encodings are the specification's (cxl-reference §1-2).

The expected numbers here are typed from the reference tables on purpose: this test is
the one place where a second copy checks the first.
"""
from hw.common import cxl_cache as cc, cxl_mem as cm


def width(layout):
    return layout.as_shape().size


def test_cxl_mem_header_widths():
    assert width(cm.M2SReq) == 4 + 3 + 2 + 2 + 16 + 46 + 4 + 2
    assert width(cm.S2MNDR) == 3 + 2 + 2 + 16 + 4 + 2
    assert width(cm.M2SRwD) == 4 + 3 + 2 + 2 + 16 + 46 + 4 + 2 + 1 + 1 + 64 + 512
    assert width(cm.S2MDRS) == 3 + 2 + 2 + 16 + 4 + 2 + 1 + 1 + 512


def test_cxl_mem_encodings():
    assert cm.M2SReqOpcode.MEM_RD.value == 0b0001 and cm.M2SReqOpcode.MEM_SPEC_RD.value == 0b1000
    assert cm.M2SRwDOpcode.MEM_WR_PTL.value == 0b0010
    assert cm.NDROpcode.CMP_E.value == 0b010 and cm.DRSOpcode.MEM_DATA_NXM.value == 0b001
    assert cm.MetaValue.SHARED.value == 0b11 and cm.SnpType.SNP_INV.value == 0b011


def test_cxl_cache_widths():
    assert width(cc.D2HReq) == 5 + 12 + 1 + 46
    assert width(cc.D2HRsp) == 5 + 12
    assert width(cc.D2HData) == 12 + 1 + 1 + 1 + 512
    assert width(cc.H2DReq) == 3 + 46 + 12
    assert width(cc.H2DRsp) == 4 + 12 + 2 + 12
    assert width(cc.H2DData) == 12 + 1 + 1 + 1 + 512


def test_cxl_cache_encodings():
    R = cc.D2HReqOpcode
    assert (R.RD_CURR.value, R.RD_OWN.value, R.RD_SHARED.value, R.RD_OWN_NO_DATA.value,
            R.ITOM_WR.value, R.CL_FLUSH.value, R.CLEAN_EVICT.value, R.DIRTY_EVICT.value,
            R.WR_INV.value) == (0b00001, 0b00010, 0b00011, 0b00101, 0b00110, 0b01000,
                                0b01001, 0b01010, 0b01110)
    S = cc.D2HRspOpcode
    assert (S.RSP_I_HIT_I.value, S.RSP_V_HIT_V.value, S.RSP_I_HIT_SE.value,
            S.RSP_S_HIT_SE.value, S.RSP_S_FWD_M.value, S.RSP_I_FWD_M.value,
            S.RSP_V_FWD_V.value) == (0b00100, 0b00110, 0b00101, 0b00001, 0b00111, 0b01111,
                                     0b10110)
    H = cc.H2DRspOpcode
    assert (H.WRITE_PULL.value, H.GO.value, H.GO_WRITE_PULL.value, H.GO_WRITE_PULL_DROP.value,
            H.GO_ERR_WRITE_PULL.value) == (0b0001, 0b0100, 0b0101, 0b1000, 0b1111)
    G = cc.GOState
    assert (G.I.value, G.S.value, G.E.value, G.M.value, G.ERR.value) == (3, 1, 2, 6, 4)
    assert cc.H2DReqOpcode.SNP_INV.value == 0b010 and cc.H2DReqOpcode.SNP_CUR.value == 0b011


def test_legal_snoop_responses():
    S = cc.D2HRspOpcode
    legal = cc.LEGAL_SNOOP_RESPONSES
    assert legal[cc.H2DReqOpcode.SNP_INV] == {S.RSP_I_HIT_I, S.RSP_I_HIT_SE, S.RSP_I_FWD_M}
    assert S.RSP_S_HIT_SE not in legal[cc.H2DReqOpcode.SNP_INV]
    assert len(legal[cc.H2DReqOpcode.SNP_CUR]) == 7
