// pmem_media -- sim-only PMEM media model: one AXI4 subordinate, one 64-byte line per beat.
//
// Contract (timing figures come from sim/model/pmem_params.py; docs/paper.md Table 2):
// - Ports: clk; power_fail (level), tear_seed[32]; AXI4 subordinate with lowercase AMBA names
//   (aw*, w*, b*, ar*, r*), 512-bit data, wuser/ruser = data poison; stat_reads/stat_writes
//   (completed OKAY transactions), err_count (bad requests answered SLVERR).
// - Storage: a sparse store in C++ behind DPI-C (sim/rtl/pmem_store.cpp, compiled into the
//   simulator): 512-bit lines (byte 0 = bits 7:0) and a poison bit each, zero until written,
//   memory allocated per touched page, so DEPTH_LINES may describe gigabytes. The backdoor
//   (sim/bfm/pmem.py) moves whole arrays through the same store by ctypes. No reset port:
//   the store survives the device's reset; queues start empty at time zero and are emptied
//   by a power failure.
// - Supported requests: AxLEN=0, AxSIZE=6 (64 bytes), AxBURST!=3, line = addr[ADDR_W-1:6]
//   < DEPTH_LINES, and for writes WLAST=1. Anything else is answered SLVERR (data zero, no
//   storage effect, err_count+1, one $display for the first one); a bad burst still gets
//   AxLEN+1 R beats, and its AWLEN extra W beats are consumed and dropped.
// - Acceptance: AR when fewer than RD_QUEUE reads are outstanding (accepted, last R beat not
//   yet handshaked). AW and W are accepted together (awready=wready, which waits for both
//   AWVALID and WVALID, as AXI allows) when fewer than WR_QUEUE writes are outstanding.
// - Service: in order per direction; one shared occupancy accumulator `busy_q8` (1/256
//   cycle units) drains 256 per cycle; an operation may start service in a cycle where
//   busy_q8 < 256 and then adds RD_COST_Q8 / WR_COST_Q8 (SLVERR entries cost 0). At most
//   one start per cycle; when a read and a write both wait, they alternate.
// - Latency, counted in rising edges: an operation that starts service at edge s can
//   complete its response handshake at edge s+RD_LAT (read) / s+WR_LAT (write) at the
//   earliest (RVALID/BVALID rise right after edge s+LAT-1). A request arriving at an idle
//   media starts service at its own acceptance edge t, so with RREADY/BREADY high its
//   response handshake happens exactly at edge t+RD_LAT / t+WR_LAT.
// - Responses in order (legal AXI; rid/bid echo arid/awid). RDATA/RUSER are the line as
//   it is after the edge before the R handshake edge (so a write committing at the handshake
//   edge itself is not seen; one that committed at an earlier edge is), held in flip-flops
//   refreshed at every edge: a backdoor poke is seen by R beats handshaked from the second
//   edge after it.
// - Persistence: a write is applied to the store (strobed bytes) and poison (set if wuser; cleared
//   only by a 64-strobe write with wuser=0; otherwise kept) at its B handshake edge. Until
//   then it is in flight.
// - Power failure: at the first rising edge with power_fail high, every in-flight write
//   (accepted, B not handshaked) is torn: in acceptance order, for each non-SLVERR write and
//   each of its 8 words w=0..7, x = xorshift32(x) (x<<13, x>>17, x<<5; x starts at
//   tear_seed sampled at that edge, or 32'h9E3779B9 when it is 0); the word's strobed bytes
//   take the new data when x[31]=1, else stay old. Poison bits keep their old value. Then all
//   queues, the occupancy and the arbitration state are cleared; handshakes the device
//   sees at that edge are void (the device is reset with the power failure). From that edge
//   until the edge after power_fail is seen low again, all READY/VALID outputs are 0.
//   The store persists across it.
// - No output depends combinationally on power_fail or on the store: Verilator re-evaluates
//   every logic cone fed by a top-level input (or a VPI- or DPI-written signal) after every
//   input change, and here that cone would be the whole device. The store is called only
//   from the clocked block: one read per edge (RDATA's refresh), one write per B handshake.
// - Per-cycle cost is O(1); loops run only in the power-fail edge and on accepting a write.
// - Testbench hooks (VPI, sim/rtl/harness.vlt): watch_line / watch_count count the writes
//   accepted to one local line (the crash campaign's cuts); watch_line = 32'hFFFF_FFFE
//   $displays every accepted write instead (local line, data word 0, cycle; a debugging aid,
//   sim/bfm/pmem.py ``PmemChannel.log_writes``).
`default_nettype none

module pmem_media #(
    parameter int ID_W        = 8,
    parameter int ADDR_W      = 32,     // byte address width, 7..64
    parameter int DEPTH_LINES = 65536,
    parameter int RD_LAT      = 120,    // cycles from service start to R handshake (min)
    parameter int WR_LAT      = 280,    // cycles from service start to B handshake (min)
    parameter int RD_COST_Q8  = 533,    // media occupancy per read line, 1/256 cycle
    parameter int WR_COST_Q8  = 3200,   // media occupancy per written line, 1/256 cycle
    parameter int RD_QUEUE    = 64,     // max outstanding reads (>= 2)
    parameter int WR_QUEUE    = 64      // max outstanding writes (>= 2)
) (
    input  wire logic              clk,
    input  wire logic              power_fail,
    input  wire logic [31:0]       tear_seed,
    // AW + W
    input  wire logic [ID_W-1:0]   awid,
    input  wire logic [ADDR_W-1:0] awaddr,
    input  wire logic [7:0]        awlen,
    input  wire logic [2:0]        awsize,
    input  wire logic [1:0]        awburst,
    input  wire logic              awvalid,
    output logic                   awready,
    input  wire logic [511:0]      wdata,
    input  wire logic [63:0]       wstrb,
    input  wire logic              wlast,
    input  wire logic              wuser,
    input  wire logic              wvalid,
    output logic                   wready,
    // B
    output logic [ID_W-1:0]        bid,
    output logic [1:0]             bresp,
    output logic                   bvalid,
    input  wire logic              bready,
    // AR
    input  wire logic [ID_W-1:0]   arid,
    input  wire logic [ADDR_W-1:0] araddr,
    input  wire logic [7:0]        arlen,
    input  wire logic [2:0]        arsize,
    input  wire logic [1:0]        arburst,
    input  wire logic              arvalid,
    output logic                   arready,
    // R
    output logic [ID_W-1:0]        rid,
    output logic [511:0]           rdata,
    output logic [1:0]             rresp,
    output logic                   rlast,
    output logic                   ruser,
    output logic                   rvalid,
    input  wire logic              rready,
    // statistics
    output logic [31:0]            stat_reads,
    output logic [31:0]            stat_writes,
    output logic [31:0]            err_count
);
    localparam int LINE_W = (DEPTH_LINES > 1) ? $clog2(DEPTH_LINES) : 1;
    localparam int RQ_W = $clog2(RD_QUEUE);       // read queue slot index
    localparam int WQ_W = $clog2(WR_QUEUE);
    localparam int RC_W = $clog2(RD_QUEUE + 1);   // read queue occupancy 0..RD_QUEUE
    localparam int WC_W = $clog2(WR_QUEUE + 1);
    localparam logic [31:0] TEAR_SEED_ZERO = 32'h9E3779B9;  // replaces a zero seed
    localparam logic [1:0] RESP_OKAY = 2'b00;
    localparam logic [1:0] RESP_SLVERR = 2'b10;

    // ---------------------------------------------------------------- persistent media
    // The store (sim/rtl/pmem_store.cpp), named by this instance's path.
    import "DPI-C" function chandle pmem_store_open(input string name, input longint depth_lines);
    import "DPI-C" function bit pmem_store_read(input chandle store, input longint line,
                                                output bit [511:0] data);
    import "DPI-C" function void pmem_store_write(input chandle store, input longint line,
                                                  input bit [511:0] data, input bit [63:0] strb,
                                                  input bit set_poison, input bit clear_poison);
    chandle store;

    // ---------------------------------------------------------------- read queue
    // Slots between rq_head and rq_tail are outstanding; the first rd_count - rd_pend of
    // them have started service (rq_due valid), the remaining rd_pend wait for the media.
    logic [ID_W-1:0]   rq_id   [RD_QUEUE];
    logic [LINE_W-1:0] rq_line [RD_QUEUE];
    logic              rq_err  [RD_QUEUE];
    logic [7:0]        rq_len  [RD_QUEUE];  // beats - 1 (non-zero only for SLVERR bursts)
    logic [63:0]       rq_due  [RD_QUEUE];  // first cycle count (`now`) with RVALID
    logic [RQ_W-1:0]   rq_head, rq_svc, rq_tail;
    logic [RC_W-1:0]   rd_count, rd_pend;
    logic [7:0]        r_beat;              // beats of the head entry already returned
    // The head entry's line as it is after the last edge (that edge's write included),
    // refreshed at every edge: RDATA/RUSER come from flip-flops, never combinationally from
    // the array, which the backdoor writes (see the contract).
    logic [511:0]      rdata_q;
    logic              ruser_q;

    // ---------------------------------------------------------------- write queue
    logic [ID_W-1:0]   wq_id   [WR_QUEUE];
    logic [LINE_W-1:0] wq_line [WR_QUEUE];
    logic              wq_err  [WR_QUEUE];
    logic [63:0]       wq_strb [WR_QUEUE];  // wstrb
    logic [511:0]      wq_data [WR_QUEUE];  // wdata (only bytes under wq_strb are used)
    logic              wq_full [WR_QUEUE];  // all 64 strobes set
    logic              wq_user [WR_QUEUE];  // poison
    logic [63:0]       wq_due  [WR_QUEUE];
    logic [WQ_W-1:0]   wq_head, wq_svc, wq_tail;
    logic [WC_W-1:0]   wr_count, wr_pend;
    logic [7:0]        w_drain;             // W beats of a bad burst still to swallow

    // ---------------------------------------------------------------- media state
    logic [63:0] now;                       // cycle counter (rising edges seen)
    logic [31:0] busy_q8;                   // shared occupancy, 1/256 cycle
    logic        last_was_wr;               // arbitration: last service start was a write
    logic        pf_q;                      // power_fail at the previous edge
    logic        warned;

    // ---------------------------------------------------------------- write watch (testbench)
    // The crash campaign (sim/tb/crash_tb.py) sets watch_line by VPI and polls watch_count, to
    // cut power just after the device issued a write to a chosen line (e.g. a log record).
    logic [31:0] watch_line;                // local line index; all ones = none; all ones but
                                            // bit 0 = log every write accepted ($display)
    logic [31:0] watch_count;               // writes accepted to watch_line

    initial begin
        store = pmem_store_open($sformatf("%m"), 64'(DEPTH_LINES));
        rq_head = '0; rq_svc = '0; rq_tail = '0; rd_count = '0; rd_pend = '0; r_beat = '0;
        wq_head = '0; wq_svc = '0; wq_tail = '0; wr_count = '0; wr_pend = '0; w_drain = '0;
        now = '0; busy_q8 = '0; last_was_wr = 1'b0; pf_q = 1'b0; warned = 1'b0;
        stat_reads = '0; stat_writes = '0; err_count = '0;
        watch_line = '1; watch_count = '0;
        rdata_q = '0; ruser_q = 1'b0;
    end

    // ---------------------------------------------------------------- helpers
    function automatic logic line_ok(input logic [ADDR_W-7:0] line_field);
        return 64'(line_field) < 64'(DEPTH_LINES);
    endfunction

    function automatic logic [RQ_W-1:0] rq_next(input logic [RQ_W-1:0] i);
        return (i == RQ_W'(RD_QUEUE - 1)) ? '0 : i + RQ_W'(1);
    endfunction

    function automatic logic [WQ_W-1:0] wq_next(input logic [WQ_W-1:0] i);
        return (i == WQ_W'(WR_QUEUE - 1)) ? '0 : i + WQ_W'(1);
    endfunction

    function automatic logic [31:0] xorshift32(input logic [31:0] s);
        logic [31:0] x;
        x = s ^ (s << 13);
        x = x ^ (x >> 17);
        return x ^ (x << 5);
    endfunction

    // Write-queue slot of the k-th in-flight write (k = 0 is the oldest).
    function automatic logic [WQ_W-1:0] wq_slot(input int k);
        int s;
        s = int'(wq_head) + k;
        if (s >= WR_QUEUE) s = s - WR_QUEUE;
        return WQ_W'(s);
    endfunction

    // The tear: in acceptance order, each in-flight write's words land or not by the PRNG
    // (see the contract); written straight to the store, so later writes to the same line
    // apply on top of earlier ones. Poison bits are kept.
    task automatic tear_in_flight(input logic [31:0] seed);
        logic [31:0] x;
        logic [63:0] strb;
        logic [WQ_W-1:0] s;
        x = seed;
        for (int k = 0; k < int'(wr_count); k++) begin   // variable bound: kept a loop
            s = wq_slot(k);
            if (!wq_err[s]) begin
                for (int w = 0; w < 8; w++) begin
                    x = xorshift32(x);
                    strb[w*8 +: 8] = x[31] ? wq_strb[s][w*8 +: 8] : 8'h00;
                end
                pmem_store_write(store, 64'(wq_line[s]), wq_data[s], strb, 1'b0, 1'b0);
            end
        end
    endtask

    // ---------------------------------------------------------------- AXI acceptance
    logic ar_bad, aw_bad, ar_fire, aw_fire, w_drain_fire;
    assign ar_bad = (arlen != 8'd0) || (arsize != 3'd6) || (arburst == 2'b11) || !line_ok(araddr[ADDR_W-1:6]);
    assign aw_bad = (awlen != 8'd0) || (awsize != 3'd6) || (awburst == 2'b11)
                    || !line_ok(awaddr[ADDR_W-1:6]) || (awlen == 8'd0 && !wlast);
    assign arready = !pf_q && (rd_count != RC_W'(RD_QUEUE));
    assign awready = !pf_q && (w_drain == 8'd0) && awvalid && wvalid
                     && (wr_count != WC_W'(WR_QUEUE));
    assign wready = (w_drain != 8'd0) ? !pf_q : awready;
    assign ar_fire = arvalid && arready;
    assign aw_fire = awvalid && awready;    // carries the first W beat
    assign w_drain_fire = (w_drain != 8'd0) && wvalid && wready;

    // Low address bits select a byte in the line; the strobes already say which bytes.
    logic unused_addr_low;
    assign unused_addr_low = ^{araddr[5:0], awaddr[5:0]};

    // ---------------------------------------------------------------- service start
    // A direction waits when it has unserviced entries or one arriving now (the arriving
    // entry lands in slot *_svc when nothing else waits, so it can start at once).
    logic rd_waiting, wr_waiting, rd_cand_err, wr_cand_err, start_rd, start_wr, media_free;
    logic [31:0] busy_add, busy_sum;
    assign rd_waiting = (rd_pend != '0) || ar_fire;
    assign wr_waiting = (wr_pend != '0) || aw_fire;
    assign rd_cand_err = (rd_pend != '0) ? rq_err[rq_svc] : ar_bad;
    assign wr_cand_err = (wr_pend != '0) ? wq_err[wq_svc] : aw_bad;
    assign media_free = busy_q8 < 32'd256;
    assign start_rd = media_free && rd_waiting && (!wr_waiting || last_was_wr);
    assign start_wr = media_free && wr_waiting && (!rd_waiting || !last_was_wr);
    assign busy_add = (start_rd && !rd_cand_err) ? 32'(RD_COST_Q8)
                    : (start_wr && !wr_cand_err) ? 32'(WR_COST_Q8) : 32'd0;
    assign busy_sum = busy_q8 + busy_add;

    // ---------------------------------------------------------------- responses
    logic r_fire, r_done, b_fire, head_rd_err, head_wr_err;
    assign head_rd_err = rq_err[rq_head];
    assign head_wr_err = wq_err[wq_head];
    assign rvalid = !pf_q && (rd_count != rd_pend) && (now >= rq_due[rq_head]);
    assign rid = rq_id[rq_head];
    assign rresp = head_rd_err ? RESP_SLVERR : RESP_OKAY;
    assign rlast = r_beat == rq_len[rq_head];
    assign rdata = (rvalid && !head_rd_err) ? rdata_q : '0;
    assign ruser = rvalid && !head_rd_err && ruser_q;
    assign r_fire = rvalid && rready;
    assign r_done = r_fire && rlast;

    assign bvalid = !pf_q && (wr_count != wr_pend) && (now >= wq_due[wq_head]);
    assign bid = wq_id[wq_head];
    assign bresp = head_wr_err ? RESP_SLVERR : RESP_OKAY;
    assign b_fire = bvalid && bready;

    // ---------------------------------------------------------------- state update
    always_ff @(posedge clk) begin
        now <= now + 64'd1;
        pf_q <= power_fail;
        if (power_fail) begin
            if (!pf_q) tear_in_flight((tear_seed == 32'd0) ? TEAR_SEED_ZERO : tear_seed);
            rq_head <= '0; rq_svc <= '0; rq_tail <= '0; rd_count <= '0; rd_pend <= '0;
            r_beat <= '0;
            wq_head <= '0; wq_svc <= '0; wq_tail <= '0; wr_count <= '0; wr_pend <= '0;
            w_drain <= '0;
            busy_q8 <= '0;
            last_was_wr <= 1'b0;
        end else begin
            // accept
            if (ar_fire) begin
                rq_id[rq_tail] <= arid;
                rq_line[rq_tail] <= LINE_W'(araddr[ADDR_W-1:6]);
                rq_err[rq_tail] <= ar_bad;
                rq_len[rq_tail] <= arlen;
                rq_tail <= rq_next(rq_tail);
            end
            if (aw_fire) begin
                wq_id[wq_tail] <= awid;
                wq_line[wq_tail] <= LINE_W'(awaddr[ADDR_W-1:6]);
                wq_err[wq_tail] <= aw_bad;
                wq_strb[wq_tail] <= wstrb;
                wq_data[wq_tail] <= wdata;
                wq_full[wq_tail] <= &wstrb;
                wq_user[wq_tail] <= wuser;
                wq_tail <= wq_next(wq_tail);
                w_drain <= awlen;
                if (32'(awaddr[ADDR_W-1:6]) == watch_line) watch_count <= watch_count + 32'd1;
                if (watch_line == 32'hFFFF_FFFE)      // PmemChannel.log_writes(): a debugging aid
                    $display("pmem_media write %m line %0d word0 %08h cycle %0d",
                             awaddr[ADDR_W-1:6], wdata[31:0], now);
            end else if (w_drain_fire) begin
                w_drain <= w_drain - 8'd1;
            end
            if ((ar_fire && ar_bad) || (aw_fire && aw_bad)) begin
                err_count <= err_count + ((ar_fire && ar_bad && aw_fire && aw_bad) ? 32'd2 : 32'd1);
                if (!warned) begin
                    $display("pmem_media %m: unsupported or out-of-range request answered SLVERR"
                             , " (AxLEN!=0, AxSIZE!=6, AxBURST=3, WLAST=0 or line >= %0d);"
                             , " further ones are only counted in err_count", DEPTH_LINES);
                    warned <= 1'b1;
                end
            end

            // service start
            if (start_rd) begin
                rq_due[rq_svc] <= now + 64'(RD_LAT);
                rq_svc <= rq_next(rq_svc);
            end
            if (start_wr) begin
                wq_due[wq_svc] <= now + 64'(WR_LAT);
                wq_svc <= wq_next(wq_svc);
            end
            if (start_rd || start_wr) last_was_wr <= start_wr;
            busy_q8 <= (busy_sum > 32'd256) ? busy_sum - 32'd256 : 32'd0;

            // read response
            if (r_fire) begin
                if (rlast) begin
                    r_beat <= '0;
                    rq_head <= rq_next(rq_head);
                    if (!head_rd_err) stat_reads <= stat_reads + 32'd1;
                end else begin
                    r_beat <= r_beat + 8'd1;
                end
            end
            rd_count <= rd_count + RC_W'(ar_fire) - RC_W'(r_done);
            rd_pend <= rd_pend + RC_W'(ar_fire) - RC_W'(start_rd);

            // write response = persistence point
            if (b_fire) begin
                if (!head_wr_err) begin
                    // written at once: the refresh below reads the line after this write
                    pmem_store_write(store, 64'(wq_line[wq_head]), wq_data[wq_head],
                                     wq_strb[wq_head], wq_user[wq_head], wq_full[wq_head]);
                    stat_writes <= stat_writes + 32'd1;
                end
                wq_head <= wq_next(wq_head);
            end
            wr_count <= wr_count + WC_W'(aw_fire) - WC_W'(b_fire);
            wr_pend <= wr_pend + WC_W'(aw_fire) - WC_W'(start_wr);

            // next head entry's line, with this edge's write applied (it is in the store)
            begin
                logic [RQ_W-1:0] nh;
                logic [LINE_W-1:0] nl;
                logic [511:0] v;
                logic u;
                nh = r_done ? rq_next(rq_head) : rq_head;
                nl = (ar_fire && rq_tail == nh && rd_count == RC_W'(r_done))
                     ? LINE_W'(araddr[ADDR_W-1:6]) : rq_line[nh];
                u = pmem_store_read(store, 64'(nl), v);
                rdata_q <= v;
                ruser_q <= u;
            end
        end
    end
endmodule

`default_nettype wire
