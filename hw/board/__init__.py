"""Board integration tops: the device with flat, AMBA-named ports for FPGA tools.

- ``u200.U200Top`` (Verilog top ``trainingcxl_u200_top``): Alveo U200 (XCU200), Vivado IP
  integrator infers its AXI4, AXI4-Lite and AXI4-Stream interfaces from the port names.
"""
from .u200 import U200Top, TOP_NAME

__all__ = ["U200Top", "TOP_NAME"]
