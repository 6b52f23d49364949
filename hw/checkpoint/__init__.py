"""Undo-log checkpoint engine, MLP-log DMA and recovery. Not built yet: issue 5."""
