"""Simulation side: BFMs, golden models, protocol checkers and the Verilator runner."""
