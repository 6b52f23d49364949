"""NDP command set: descriptors, table descriptors, completions and error codes (one source).

Programming model (architecture.md §4). The host writes 64-byte command descriptors
(``CommandDescriptor``) into a submission ring in device memory with CXL.mem, then writes
the ring's new tail to the ``NDP_SQ_TAIL`` doorbell CSR. The command processor
(hw/ndp/processor.py) executes commands one at a time in ring order and, for each, writes a
``Completion`` line into the completion ring (same slot index), advances ``NDP_SQ_HEAD``,
copies the completion into status CSRs and sets ``STATUS.NDP_DONE`` (an irq source).

Addresses: every ``*_addr`` field is a 64-byte line address. Device-memory addresses are
device line addresses (0 .. capacity_lines-1, the device's own PMEM, i.e. the window the
engines may touch). ``out_addr`` is a host line address when ``flags.out_to_host`` is set
(pooled vectors are pushed over CXL.cache), else a device line address.

Arrays (TBE layout, docs/dlrm-workloads.md), each starting at element 0 of its line:
- offsets: u32[T*B+1] at ``offsets_addr``; bag (t, b) is indices[offsets[t*B+b] :
  offsets[t*B+b+1]] (offsets are element positions in the indices array; non-decreasing,
  offsets[0] = 0 and offsets[T*B] = ``index_count``, as PyTorch's EmbeddingBag requires).
- indices: u32[index_count] at ``indices_addr``, rows local to their table.
- weights: fp32[index_count] at ``weights_addr`` (one per index; used by WEIGHTED_SUM tables;
  requires ``flags.has_weights``).
Nothing outside these ranges is read: the rest of an array's last line, the lines after it,
and the gradient vectors of empty bags may hold anything (NaN and Inf included) and change no
result. A weight belongs to its index only: an empty bag reads none.
- pooled outputs (LOOKUP) and pooled-output gradients (UPDATE): fp32 [B][sum of dims], the
  layout of FBGEMM's TBE output: the vector of (t, b) starts at line
  ``out_addr + b * row_pitch_lines + table.col_lines`` (``grad_addr`` likewise) and takes
  dim/16 lines.
- table t's row r occupies dim/16 lines from ``table.base_addr + r * dim/16``.
"""
from amaranth.lib import data, enum, wiring
from amaranth.lib.wiring import In, Out

from ..common.cxl_mem import LINE_ADDR_BITS

MAX_TABLES = 128                 # table descriptors the processor holds per command
TABLE_ID_BITS = 7
MIN_DIM = 16                     # floats; one 64-byte line
MAX_DIM = 256                    # floats; 16 lines
FLOATS_PER_LINE = 16
DEV_ADDR_BITS = 32               # device line address fields (up to 256 GiB of device memory)


class NdpOpcode(enum.Enum, shape=8):
    NOP = 0                      # completes with OK; touches nothing
    LOOKUP = 1                   # pooled = reduce(rows) per bag -> out_addr
    UPDATE = 2                   # sparse SGD of every index occurrence, in input order
                                 # (with flags.checkpoint: only if batch's undo log is
                                 # LOGGED; then the APPLIED record is written)
    LOG = 3                      # undo-log the old value of every row batch will update, once
                                 # per row, then write the LOGGED record (hw/checkpoint/undo_log.py)
    MLP_LOG = 4                  # copy lines [mlp_offset, +mlp_count) of the GPU's MLP image into
                                 # MLP slot flags.mlp_slot over CXL.cache; the chunk that ends the
                                 # image checks the byte counter and writes the MLP_LOGGED record
    RECOVER = 5                  # scan the log, roll back an interrupted batch, report (CKPT_* CSRs)


class PoolMode(enum.Enum, shape=2):
    SUM = 0
    MEAN = 1
    WEIGHTED_SUM = 2


class NdpError(enum.Enum, shape=8):
    """Completion error codes. A command that fails ends before any table write."""
    OK = 0
    BAD_OPCODE = 1               # unknown opcode
    BAD_TABLES = 2               # num_tables is 0 or > MAX_TABLES, or batch_size is 0
    BAD_DIM = 3                  # a table's dim is not a multiple of 16 in [16, 256]
    BAD_DESCRIPTOR = 4           # rows = 0, reserved pooling mode, weights missing,
                                 # a table's vector outside row_pitch_lines
    ADDRESS = 5                  # an array or table outside device memory (AddressFault)
    OFFSETS = 6                  # offsets decrease, offsets[0] != 0 (error_info 0) or
                                 # offsets[T*B] != index_count (error_info T*B)
    INDEX_RANGE = 7              # an index >= its table's rows
    MEDIA = 8                    # a media read returned an error or poison
    CACHE = 9                    # a CXL.cache access was answered with an error
    LOG_FULL = 10                # LOG: the entries do not fit in a slot (CKPT_SLOT_LINES)
    NOT_LOGGED = 11              # UPDATE with flags.checkpoint: batch's slot has no valid LOGGED record
    MLP_SIZE = 12                # MLP_LOG: chunk outside the image, or the byte counter differs from
                                 # the image size at its end
    LOG_CORRUPT = 13             # RECOVER: an entry of a LOGGED slot fails its magic / CRC check


class AddressFault(enum.IntEnum):
    """``error_info`` of an ADDRESS error: which array reaches past device memory."""
    INDICES = 1
    WEIGHTS = 2
    TABLES = 3                   # the table-descriptor array
    OFFSETS = 4
    OUTPUTS = 5                  # pooled outputs in device memory
    GRADIENTS = 6
    LOG_REGION = 7               # the embedding log's two slots (CKPT_LOG_BASE, CKPT_SLOT_LINES)
    MLP_REGION = 8               # the MLP log's two slots (CKPT_MLP_BASE, CKPT_MLP_LINES)
    TABLE_ROWS = 0x100           # + t: the rows of table t


class CommandFlags(data.Struct):
    out_to_host: 1               # LOOKUP: push pooled vectors to host memory over CXL.cache
    has_weights: 1               # a weights array is present
    checkpoint: 1                # UPDATE: require and complete batch's undo log (see NdpOpcode)
    mlp_slot: 1                  # MLP_LOG: which MLP log slot (0/1) this copy fills
    reserved: 4


class CommandDescriptor(data.Struct):
    """One 64-byte submission-ring entry (fields from bit 0; the rest of the line is zero)."""
    opcode: NdpOpcode
    flags: CommandFlags
    tag: 16                      # echoed in the completion
    num_tables: 16               # T, 1..MAX_TABLES
    batch_size: 32               # B, bags per table
    tables_addr: DEV_ADDR_BITS   # T consecutive TableDescriptor lines
    offsets_addr: DEV_ADDR_BITS
    indices_addr: DEV_ADDR_BITS
    weights_addr: DEV_ADDR_BITS
    grad_addr: DEV_ADDR_BITS     # UPDATE: pooled-output gradients [B][sum of dims]
    out_addr: LINE_ADDR_BITS     # LOOKUP: pooled outputs [B][sum of dims]
    row_pitch_lines: 16          # lines per sample in the outputs / gradients (>= the sum of dim/16)
    lr: 32                       # UPDATE: learning rate, fp32 bits
    batch: 32                    # LOG, UPDATE (flags.checkpoint), MLP_LOG: training batch number
    mlp_offset: 32               # MLP_LOG: first image line of this chunk
    mlp_count: 32                # MLP_LOG: lines in this chunk
    index_count: 32              # LOOKUP, UPDATE, LOG: elements of indices (and weights); must
                                 # equal offsets[T*B]


class TableDescriptor(data.Struct):
    """One 64-byte line per table (fields from bit 0)."""
    base_addr: DEV_ADDR_BITS     # device line address of row 0
    rows: 32
    dim: 16                      # floats per row: a multiple of 16 in [16, 256]
    mode: PoolMode
    reserved: 14
    col_lines: 16                # this table's first line within an output / gradient row


class EngineStats(data.Struct):
    """Per-command counters an engine reports (valid when it signals ``done``)."""
    lookups: 32                  # index occurrences processed
    rows_read: 32                # table rows read (LOOKUP: every occurrence, media or row cache)
    rows_written: 32             # table rows written to media
    unique_rows: 32              # LOG: distinct (table, row) pairs in the batch (its entries,
                                 # exact); RECOVER: entries checked; LOOKUP, UPDATE: 0
    lines_read: 32               # all media lines read (rows, arrays, gradients)
    lines_written: 32            # all media lines written (rows, device-memory outputs)
    lines_pushed: 32             # lines pushed over CXL.cache
    cache_hits: 32               # LOOKUP: row lines served by the row cache (not in lines_read);
                                 # others 0


class Completion(data.Struct):
    """One 64-byte completion-ring entry (fields from bit 0).

    A command that ends with an error never writes a table row (UPDATE and LOG validate
    before their first write). A failed LOOKUP may already have written the pooled vectors
    of the bags before the failing one (it validates while it streams): after a LOOKUP
    error the pooled-output array is undefined and must not be used."""
    valid: 1                     # 1 in every completion the device writes
    reserved: 7
    error: NdpError
    tag: 16
    opcode: NdpOpcode
    reserved2: 24
    error_info: 32               # the failing element position / table, or 0
    cycles: 32                   # cycles from descriptor fetch to completion
    stats: EngineStats


def engine_control_signature() -> wiring.Signature:
    """The command processor -> engine control port (from the processor's side).

    ``start`` is a one-cycle pulse with ``cmd`` valid; ``cmd`` (and the table descriptors)
    stay stable until the engine pulses ``done``, with ``error`` / ``error_info`` / ``stats``
    valid in that cycle. ``table_index`` -> ``table`` is a read port on the processor's
    table-descriptor memory with one cycle of latency. The processor has already checked
    the descriptor and every table (BAD_TABLES, BAD_DIM, BAD_DESCRIPTOR, table ranges);
    engines check what only the arrays reveal (OFFSETS, INDEX_RANGE, ADDRESS of array
    lines, MEDIA, CACHE).
    """
    return wiring.Signature({
        "start": Out(1),
        "cmd": Out(CommandDescriptor),
        "table_index": In(TABLE_ID_BITS),
        "table": Out(TableDescriptor),
        "busy": In(1),
        "done": In(1),
        "error": In(NdpError),
        "error_info": In(32),
        "stats": In(EngineStats),
    })
