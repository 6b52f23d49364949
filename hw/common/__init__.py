"""Pieces shared by every block: CXL message layouts, AXI signatures, stream helpers."""
