"""TrainingCXL device RTL (Amaranth). Synthesizable only: nothing here imports sim/ or tools/."""
