"""cocotb test modules (run on Verilator through sim/runner.py by tests/ and tools/)."""
