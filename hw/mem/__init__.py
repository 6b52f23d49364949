"""Device memory subsystem: line interleaving over N AXI4 channels to the PMEM media."""
