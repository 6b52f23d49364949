"""The Alveo U200 board top (hw/board/u200.py) and ``trainingcxl verilog --board`` (tools/board_cmd.py).

Contract checked:
- every AMBA-named port exists with the direction and width the device's signatures give
  (AXI4 managers ``m_axi_pmem<c>_*`` with every standard signal, AXI4-Lite ``s_axil_csr_*``,
  AXI4-Stream ``s_axis_*``/``m_axis_*`` with tdata = the layout padded to whole bytes,
  ``aclk``, ``aresetn``, ``irq``), and no other port; the AXI4 constants hold their values;
- the generated Verilog declares exactly those ports and passes ``verilator --lint-only
  -Wall`` with hw/trainingcxl.vlt. A reduced configuration (1 MiB, small tables) keeps this
  under a minute; ``trainingcxl lint`` (make lint) lints the default configuration's top;
- the XDC's create_clock period is 1000 / DeviceConfig.clock_mhz; the port map's tdata bit
  map is the layouts';
- the reset synchronizer asserts without a clock and releases on the 3rd edge;
- in Amaranth's simulator, the default-configuration board top answers AXI4-Lite reads of
  DEVICE_ID, VERSION and CLOCK_MHZ through ``s_axil_csr_*`` after ``aresetn`` is released,
  and a pulse on ``aresetn`` resets a written CSR (~20 s).
"""
from __future__ import annotations

import re
import subprocess

import pytest
from amaranth.lib import data
from amaranth.sim import Simulator

from hw.board.reset_sync import AresetnSynchronizer
from hw.board.u200 import AXI4_CONSTANTS, TOP_NAME, U200Top
from hw.common.axi import Axi4Signature
from hw.config import DeviceConfig
from hw.cxl_controller import csr_map
from hw.top import VERSION, TrainingCxlDevice
from tools.board_cmd import clock_period_ns, lint_command, write_board, xdc_text

# Devices built here only for their signatures are never elaborated; that is intended.
pytestmark = pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")

REDUCED = dict(capacity_bytes=1 << 20, bias_pages=256, log_set_entries=256, update_scratch_lines=64,
               lookup_units=2, lookup_rob_depth=8, cache_lines=4, cache_trackers=4,
               read_ids_per_channel=4, writes_per_channel=4)

# AXI4 manager signals (AMBA names), "out" = driven by the manager.
AXI4_DIRECTIONS = {
    **{s: "out" for s in ("awid", "awaddr", "awlen", "awsize", "awburst", "awlock", "awcache", "awprot",
                          "awqos", "awvalid", "wdata", "wstrb", "wlast", "wuser", "wvalid", "bready",
                          "arid", "araddr", "arlen", "arsize", "arburst", "arlock", "arcache", "arprot",
                          "arqos", "arvalid", "rready")},
    **{s: "in" for s in ("awready", "wready", "bid", "bresp", "bvalid", "arready", "rid", "rdata", "rresp",
                         "rlast", "ruser", "rvalid")},
}
AXIL_DIRECTIONS = {   # AXI4-Lite subordinate, "in" = driven by the manager
    **{s: "in" for s in ("awaddr", "awprot", "awvalid", "wdata", "wstrb", "wvalid", "bready", "araddr",
                         "arprot", "arvalid", "rready")},
    **{s: "out" for s in ("awready", "wready", "bresp", "bvalid", "arready", "rdata", "rresp", "rvalid")},
}
CXL_STREAMS_IN = ("m2s_req", "m2s_rwd", "h2d_req", "h2d_rsp", "h2d_data")
CXL_STREAMS_OUT = ("s2m_ndr", "s2m_drs", "d2h_req", "d2h_rsp", "d2h_data")


def expected_ports(config: DeviceConfig) -> dict[str, tuple[str, int]]:
    """name -> (direction, width) by the AMBA naming rules, widths from the device's signatures."""
    device = TrainingCxlDevice(config)
    members = device.signature.members
    ports = {"aclk": ("in", 1), "aresetn": ("in", 1), "irq": ("out", 1)}
    for c in range(config.channels):
        sig = members[f"pmem{c}"].signature
        assert isinstance(sig, Axi4Signature)
        width = {"awid": sig.id_width, "arid": sig.id_width, "bid": sig.id_width, "rid": sig.id_width,
                 "awaddr": sig.addr_width, "araddr": sig.addr_width, "wdata": sig.data_width,
                 "rdata": sig.data_width, "wstrb": sig.data_width // 8, "awlen": 8, "arlen": 8,
                 "awsize": 3, "arsize": 3, "awburst": 2, "arburst": 2, "awlock": 1, "arlock": 1,
                 "awcache": 4, "arcache": 4, "awprot": 3, "arprot": 3, "awqos": 4, "arqos": 4,
                 "bresp": 2, "rresp": 2, "wuser": 1, "ruser": 1}
        for s, d in AXI4_DIRECTIONS.items():
            ports[f"m_axi_pmem{c}_{s}"] = (d, width.get(s, 1))
    csr = members["csr"].signature
    for s, d in AXIL_DIRECTIONS.items():
        width = {"awaddr": csr.addr_width, "araddr": csr.addr_width, "wdata": 32, "rdata": 32, "wstrb": 4,
                 "awprot": 3, "arprot": 3, "bresp": 2, "rresp": 2}.get(s, 1)
        ports[f"s_axil_csr_{s}"] = (d, width)
    for names, prefix, data_dir, ready_dir in ((CXL_STREAMS_IN, "s_axis", "in", "out"),
                                               (CXL_STREAMS_OUT, "m_axis", "out", "in")):
        for name in names:
            size = data.Layout.cast(members[name].signature.members["payload"].shape).size
            ports[f"{prefix}_{name}_tdata"] = (data_dir, (size + 7) // 8 * 8)
            ports[f"{prefix}_{name}_tvalid"] = (data_dir, 1)
            ports[f"{prefix}_{name}_tready"] = (ready_dir, 1)
    return ports


def port_map_ports(top: U200Top) -> dict[str, tuple[str, int]]:
    return {name: ("in" if member.flow.name == "In" else "out", member.shape)
            for name, member, _ in top.port_map}


def test_default_top_has_every_amba_port():
    config = DeviceConfig()
    expected = expected_ports(config)
    assert port_map_ports(U200Top()) == expected
    assert expected["m_axi_pmem0_wdata"] == ("out", 512)
    assert expected["m_axi_pmem3_wstrb"] == ("out", 64)
    assert expected["s_axis_m2s_req_tdata"] == ("in", 80)
    assert sum(name.endswith("_awvalid") for name in expected) == config.channels + 1   # + CSR


def test_test_port_config_refused():
    with pytest.raises(ValueError, match="cache_test_port"):
        U200Top(DeviceConfig.for_simulation())


@pytest.fixture(scope="module")
def reduced_board(tmp_path_factory):
    config = DeviceConfig(**REDUCED)
    return config, write_board("u200", tmp_path_factory.mktemp("board"), config)


def verilog_ports(text: str) -> dict[str, tuple[str, int]]:
    top = re.search(rf"^module {TOP_NAME}\(.*?^endmodule", text, re.S | re.M).group(0)
    return {name: (d[:-3] if d == "output" else d[:2], int(msb) + 1 if msb else 1)
            for d, msb, name in re.findall(r"^\s*(input|output)\s+(?:\[(\d+):0\]\s+)?(\w+);", top, re.M)}


def test_generated_verilog_ports_and_lint(reduced_board):
    config, paths = reduced_board
    assert verilog_ports(paths["verilog"].read_text()) == expected_ports(config)
    result = subprocess.run(lint_command(paths["verilog"]), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]


def xdc_period(text: str) -> float:
    return float(re.search(r"^create_clock\s.*-period\s+([\d.]+)\s+\[get_ports aclk\]", text, re.M).group(1))


def test_xdc_clock_period_from_config(reduced_board):
    config, paths = reduced_board
    assert xdc_period(paths["xdc"].read_text()) == pytest.approx(1000 / config.clock_mhz)
    assert xdc_period(xdc_text(DeviceConfig())) == pytest.approx(1000 / DeviceConfig().clock_mhz)
    assert xdc_period(xdc_text(DeviceConfig(clock_mhz=250))) == pytest.approx(4.0) == clock_period_ns(
        DeviceConfig(clock_mhz=250))
    assert "set_false_path" in paths["xdc"].read_text()


def test_port_map_bit_map_is_the_layouts(reduced_board):
    _, paths = reduced_board
    text = paths["ports"].read_text()
    device = TrainingCxlDevice(DeviceConfig(**REDUCED))
    for name in CXL_STREAMS_IN + CXL_STREAMS_OUT:
        layout = data.Layout.cast(device.signature.members[name].signature.members["payload"].shape)
        for field_name, fld in layout:
            msb = fld.offset + fld.width - 1
            bits = f"[{msb}:{fld.offset}]" if fld.width > 1 else f"[{fld.offset}]"
            assert f"| `{field_name}` | {bits} | {fld.width} |" in text, (name, field_name)


def test_reset_synchronizer():
    dut = AresetnSynchronizer(stages=3)
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    seen = []

    async def bench(ctx):
        ctx.set(dut.aresetn, 0)
        await ctx.tick()
        ctx.set(dut.aresetn, 1)
        for _ in range(5):
            seen.append(ctx.get(dut.rst))
            await ctx.tick()
        # Assertion is asynchronous: between two edges, with no edge in between.
        await ctx.delay(2e-9)
        ctx.set(dut.aresetn, 0)
        await ctx.delay(1e-9)
        seen.append(ctx.get(dut.rst))
    sim.add_testbench(bench)
    sim.run()
    assert seen == [1, 1, 1, 0, 0, 1]


def _version_word() -> int:
    word = 0
    for name, value in zip(("MAJOR", "MINOR", "PATCH"), VERSION):
        word |= value << csr_map.field("VERSION", name).lsb
    return word


def test_csr_through_board_top_in_pysim():
    top = U200Top()
    sim = Simulator(top)
    period = 1e-9 * 1000 / top.config.clock_mhz

    async def clock(ctx):
        while True:
            ctx.set(top.aclk, 0)
            await ctx.delay(period / 2)
            ctx.set(top.aclk, 1)
            await ctx.delay(period / 2)

    async def edge(ctx, n=1):
        for _ in range(n):
            await ctx.posedge(top.aclk)

    async def handshake(ctx, valid, ready):
        """Hold ``valid`` until an edge with ``ready`` high (sampled before the edge)."""
        ctx.set(valid, 1)
        for _ in range(20):
            accepted = ctx.get(ready)
            await edge(ctx)
            if accepted:
                ctx.set(valid, 0)
                return
        raise AssertionError(f"no handshake on {valid.name}")

    async def read(ctx, addr):
        ctx.set(top.s_axil_csr_araddr, addr)
        await handshake(ctx, top.s_axil_csr_arvalid, top.s_axil_csr_arready)
        ctx.set(top.s_axil_csr_rready, 1)
        for _ in range(20):
            if ctx.get(top.s_axil_csr_rvalid):
                value, resp = ctx.get(top.s_axil_csr_rdata), ctx.get(top.s_axil_csr_rresp)
                await edge(ctx)
                ctx.set(top.s_axil_csr_rready, 0)
                assert resp == 0
                return value
            await edge(ctx)
        raise AssertionError(f"no read response from {addr:#x}")

    async def write(ctx, addr, value):
        ctx.set(top.s_axil_csr_awaddr, addr)
        ctx.set(top.s_axil_csr_wdata, value)
        ctx.set(top.s_axil_csr_wstrb, 0xF)
        await handshake(ctx, top.s_axil_csr_awvalid, top.s_axil_csr_awready)
        await handshake(ctx, top.s_axil_csr_wvalid, top.s_axil_csr_wready)
        ctx.set(top.s_axil_csr_bready, 1)
        for _ in range(20):
            if ctx.get(top.s_axil_csr_bvalid):
                await edge(ctx)
                ctx.set(top.s_axil_csr_bready, 0)
                return
            await edge(ctx)
        raise AssertionError(f"no write response from {addr:#x}")

    results = {}

    async def bench(ctx):
        ctx.set(top.aresetn, 0)
        await ctx.delay(5 * period)
        ctx.set(top.aresetn, 1)
        await edge(ctx, 4)
        results["id"] = await read(ctx, csr_map.REG.DEVICE_ID)
        results["version"] = await read(ctx, csr_map.REG.VERSION)
        results["clock"] = await read(ctx, csr_map.REG.CLOCK_MHZ)
        await write(ctx, csr_map.REG.SCRATCH, 0x1234_5678)
        results["scratch"] = await read(ctx, csr_map.REG.SCRATCH)
        results["constants"] = {name: ctx.get(getattr(top, f"m_axi_pmem0_{name}")) for name in AXI4_CONSTANTS}
        await ctx.delay(period / 4)                      # between edges: asynchronous assertion
        ctx.set(top.aresetn, 0)
        await edge(ctx, 2)
        ctx.set(top.aresetn, 1)
        await edge(ctx, 4)
        results["scratch_after_reset"] = await read(ctx, csr_map.REG.SCRATCH)

    sim.add_process(clock)
    sim.add_testbench(bench)
    sim.run_until(400 * period)
    assert results["id"] == csr_map.DEVICE_ID_VALUE
    assert results["version"] == _version_word()
    assert results["clock"] == DeviceConfig().clock_mhz
    assert results["scratch"] == 0x1234_5678
    assert results["constants"] == {name: value for name, (_, value, _) in AXI4_CONSTANTS.items()}
    assert results["scratch_after_reset"] == csr_map.register("SCRATCH").fields[0].reset


def test_cli_board_options(monkeypatch, tmp_path):
    import tools.board_cmd as board_cmd
    from tools.cli import main
    assert main(["verilog", "--board", "u200", "--sim-config"]) == 2
    seen = {}

    def fake_write_board(board, out, config):
        seen.update(board=board, out=out, config=config)
        paths = {"verilog": out / "top.v", "xdc": out / "top.xdc", "ports": out / "ports.md"}
        paths["verilog"].write_text("")
        return paths
    monkeypatch.setattr(board_cmd, "write_board", fake_write_board)
    assert main(["verilog", "--board", "u200", "--clock-mhz", "250", "-o", str(tmp_path)]) == 0
    assert seen["board"] == "u200" and seen["out"] == tmp_path
    assert seen["config"] == DeviceConfig(clock_mhz=250)
