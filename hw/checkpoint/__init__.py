"""Failure tolerance: the persistent log format (log_format.py), its CRC (crc.py) and record
check (record_check.py), the LOG engine (undo_log.py), the MLP_LOG engine (mlp_log.py) and
RECOVER (recovery.py). The processor (hw/ndp/processor.py) gates checkpointed UPDATEs on
the LOGGED record and writes APPLIED."""
