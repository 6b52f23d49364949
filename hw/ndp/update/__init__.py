"""The UPDATE engine (opcode UPDATE): PyTorch's sparse SGD next to memory.

- engine.py: ``UpdateEngine``, the command (validation, bag stage, lookahead and scratchpad,
  write-back) and its contract.
- datapath.py: ``UpdateDatapath``, the MUL front, the FMA window and the FP32 lanes.
"""
from .datapath import UpdateDatapath, occurrence_layout
from .engine import KIND_BITS, Kind, UpdateEngine

__all__ = ["KIND_BITS", "Kind", "UpdateDatapath", "UpdateEngine", "occurrence_layout"]
