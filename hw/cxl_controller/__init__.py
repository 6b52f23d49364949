"""CXL controller: CXL.mem target with HDM decode, CXL.io register file (CSRs)."""
