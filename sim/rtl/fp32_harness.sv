// fp32_harness -- sim-only bulk driver for fp32_fma and fp32_div_int (hw/common/fp32*.py).
//
// Contract:
// - The units are either pipeline of Fp32Fma / Fp32DivInt ("compact" or "deep", same module
//   names, generated into separate folders by sim/tb/fp32_campaign.py); FMA_LAT / DIV_LAT
//   must be the generated units' latencies (they also key the build folder).
// - Plusargs: +fp32_n=<N> (1..DEPTH), +fp32_in=<file> ($readmemh, N lines of 128-bit words
//   {30'b0, op[1:0], a[31:0], b[31:0], c[31:0]}), +fp32_fma_out=<file>, +fp32_div_out=<file>
//   ($writememh of N 32-bit results each), optional +fp32_gap=1 (an LFSR drops i_valid in
//   about one cycle of four, to exercise valid bubbles).
// - Both units see every vector: fp32_fma gets (a, b, c, op), fp32_div_int gets x = a,
//   L = b[15:0]; the tag is the vector index. The caller picks the meaningful result.
// - From the first cycle after rst falls, one vector is issued per cycle (except bubbles).
//   Each result is stored at index o_tag. errors counts results whose arrival cycle is not
//   issue cycle + FMA_LAT / DIV_LAT, results for a tag not yet issued, and results beyond N
//   (tags are unique indices, so a duplicate shows up as one too many). When both units
//   have returned N results, the output files are written and done rises (and stays high until rst).
// - Only the top-level ports are public; the testbench awaits `done` and reads `errors`.
`default_nettype none
module fp32_harness #(
    parameter int DEPTH = 1048576,
    parameter int TAGW = 20,
    parameter int FMA_LAT = 5,
    parameter int DIV_LAT = 10
) (
    input wire clk,
    input wire rst,
    output reg done,
    output reg [31:0] errors,
    output reg [31:0] fma_count,
    output reg [31:0] div_count
);
    reg [127:0] vin [0:DEPTH-1];
    reg [31:0] vfma [0:DEPTH-1];
    reg [31:0] vdiv [0:DEPTH-1];
    reg [63:0] issued_at [0:DEPTH-1];
    string fin, ffma, fdiv;
    int n;
    int gap;

    initial begin
        n = 0;
        gap = 0;
        fin = "";
        ffma = "";
        fdiv = "";
        if (!$value$plusargs("fp32_n=%d", n)) n = 0;
        if (!$value$plusargs("fp32_gap=%d", gap)) gap = 0;
        if (!$value$plusargs("fp32_in=%s", fin)) fin = "";
        if (!$value$plusargs("fp32_fma_out=%s", ffma)) ffma = "fp32_fma_out.hex";
        if (!$value$plusargs("fp32_div_out=%s", fdiv)) fdiv = "fp32_div_out.hex";
        if (n > DEPTH) begin
            $display("fp32_harness: fp32_n=%0d > DEPTH=%0d", n, DEPTH);
            $finish;
        end
        if (n > 0) $readmemh(fin, vin, 0, n - 1);
    end

    reg [63:0] cyc;
    reg [31:0] idx;
    reg [15:0] lfsr;
    wire bubble = (gap != 0) && (lfsr[1:0] == 2'b00);
    wire fire = !rst && !done && (idx < n) && !bubble;
    wire [127:0] cur = vin[idx[TAGW-1:0]];

    wire [31:0] fma_res, div_res;
    wire fma_v, div_v;
    wire [TAGW-1:0] fma_tag, div_tag;

    fp32_fma u_fma (
        .clk(clk), .rst(rst), .a(cur[95:64]), .b(cur[63:32]), .c(cur[31:0]), .op(cur[97:96]),
        .i_valid(fire), .i_tag(idx[TAGW-1:0]),
        .o_result(fma_res), .o_valid(fma_v), .o_tag(fma_tag)
    );
    fp32_div_int u_div (
        .clk(clk), .rst(rst), .x(cur[95:64]), .l(cur[47:32]),
        .i_valid(fire), .i_tag(idx[TAGW-1:0]),
        .o_result(div_res), .o_valid(div_v), .o_tag(div_tag)
    );

    always @(posedge clk) begin
        if (rst) begin
            cyc <= 64'd0;
            idx <= 32'd0;
            lfsr <= 16'hACE1;
            done <= 1'b0;
            errors <= 32'd0;
            fma_count <= 32'd0;
            div_count <= 32'd0;
        end else begin
            cyc <= cyc + 64'd1;
            lfsr <= {lfsr[14:0], lfsr[15] ^ lfsr[13] ^ lfsr[12] ^ lfsr[10]};
            if (fire) begin
                issued_at[idx[TAGW-1:0]] <= cyc;
                idx <= idx + 32'd1;
            end
            if (fma_v) begin
                vfma[fma_tag] <= fma_res;
                fma_count <= fma_count + 32'd1;
                if (32'(fma_tag) >= idx || cyc != issued_at[fma_tag] + 64'(FMA_LAT)
                        || fma_count >= 32'(n))
                    errors <= errors + 32'd1;
            end
            if (div_v) begin
                vdiv[div_tag] <= div_res;
                div_count <= div_count + 32'd1;
                if (32'(div_tag) >= idx || cyc != issued_at[div_tag] + 64'(DIV_LAT)
                        || div_count >= 32'(n))
                    errors <= errors + 32'd1;
            end
            if (!done && idx == 32'(n) && fma_count == 32'(n) && div_count == 32'(n)) begin
                if (n > 0) begin
                    $writememh(ffma, vfma, 0, n - 1);
                    $writememh(fdiv, vdiv, 0, n - 1);
                end
                done <= 1'b1;
            end
        end
    end
endmodule
`default_nettype wire
