"""U200Top: the device with flat AMBA-named ports, for Vivado on an Alveo U200 (top trainingcxl_u200_top).

Contract (what faces what; one clock, ``aclk``):
- ``aclk`` In: the device clock (the MIG's ``ui_clk`` or a clocking wizard output, at
  ``DeviceConfig.clock_mhz``). Everything runs on it; there is no clock crossing inside.
- ``aresetn`` In: active-low reset from the board. It may assert asynchronously; its release
  goes through a 3-flip-flop synchronizer (``hw/board/reset_sync.py``, ``ASYNC_REG``) and
  becomes the device's active-high synchronous reset, released on the 3rd ``aclk`` edge
  after ``aresetn`` rises. Hold it low for at least one ``aclk`` cycle with the clock
  running (the device's own reset is synchronous).
- ``s_axil_csr_*`` (AXI4-Lite subordinate, 12-bit address, 32-bit data): the CSR BAR
  (hw/cxl_controller/csr_map.py), from the host through the CXL IP's CXL.io side or an
  AXI interconnect. ``awprot``/``arprot`` are accepted and ignored (CsrBlock has no
  protection checks).
- ``m_axi_pmem0_*`` ... ``m_axi_pmem{N-1}_*`` (AXI4 managers, 512-bit data, 8-bit IDs): the
  memory channels, to the DDR4 controllers (MIG) or persistent memory. The device issues
  single-beat INCR bursts of one 64-byte line; the signals it does not drive are constants
  (``AXI4_CONSTANTS``: lock 0, cache 0b0011, prot 0b000, qos 0). ``wuser``/``ruser``
  (1 bit) carry data poison; a subordinate without user signals leaves ``ruser`` at 0.
  A B response must mean the line is durable.
- ``s_axis_m2s_req``, ``s_axis_m2s_rwd`` (subordinates) and ``m_axis_s2m_ndr``,
  ``m_axis_s2m_drs`` (managers): CXL.mem, to the CXL IP's user interface. ``m_axis_d2h_req``,
  ``m_axis_d2h_rsp``, ``m_axis_d2h_data`` and ``s_axis_h2d_req``, ``s_axis_h2d_rsp``,
  ``s_axis_h2d_data``: CXL.cache. Each is ``tdata``/``tvalid``/``tready``; one beat is one
  message. ``tdata`` is the message's ``data.Struct`` (hw/common/cxl_mem.py,
  hw/common/cxl_cache.py) as its ``as_value()``: the first field at bit 0, each next field
  above it, zero-padded at the top to a multiple of 8 bits. The bit positions are those of
  the layouts, never restated here: ``trainingcxl verilog --board u200`` writes them out
  (tools/board_cmd.py, ``trainingcxl_u200_top_ports.md``).
- ``irq`` Out: level, high while STATUS & IRQ_ENABLE is non-zero.

The device is ``TrainingCxlDevice(config)`` with ``cache_test_port`` off (the FPGA build has
no test port). Every port name comes from the device's signature by the rules in
``board_members``; nothing else here knows the device's ports. ``U200Top.port_map`` lists
them: (board port name, board member, device port path or None for clock, reset and the
AXI4 constants).
"""
from amaranth import Module, ClockDomain, ClockSignal, ResetSignal, Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from ..common.axi import Axi4Signature, AxiLiteSignature
from ..config import DeviceConfig
from ..top import TrainingCxlDevice
from .reset_sync import AresetnSynchronizer

TOP_NAME = "trainingcxl_u200_top"
RESET_STAGES = 3

# AXI4 manager signals the device does not drive: name -> (width, value, meaning).
AXI4_CONSTANTS = {
    f"{ch}{sig}": spec
    for ch in ("aw", "ar")
    for sig, spec in {
        "lock": (1, 0b0, "normal access (no exclusive access)"),
        "cache": (4, 0b0011, "normal non-cacheable bufferable (Xilinx's default for masters)"),
        "prot": (3, 0b000, "unprivileged, secure, data access"),
        "qos": (4, 0b0000, "no QoS priority"),
    }.items()
}
STREAM_SIGNALS = {"payload": "tdata", "valid": "tvalid", "ready": "tready"}


def tdata_width(shape) -> int:
    """A message layout's width rounded up to whole bytes (AXI4-Stream TDATA)."""
    return -(-data.Layout.cast(shape).size // 8) * 8


def _prefix(name: str, member: wiring.Member) -> str:
    """The AMBA interface prefix of one of the device's interface ports."""
    sig = member.signature
    if isinstance(sig, stream.Signature):
        return f"{'s' if member.flow == In else 'm'}_axis_{name}_"
    if isinstance(sig, AxiLiteSignature) and member.flow == In:
        return f"s_axil_{name}_"
    if isinstance(sig, Axi4Signature) and member.flow == Out:
        return f"m_axi_{name}_"
    raise ValueError(f"device port {name!r} ({sig!r}) has no board mapping")


def board_members(device: TrainingCxlDevice):
    """(board port name, board member, device path or None) for every port of the board top.

    A device path is the tuple ``Signature.flatten`` yields (e.g. ``("pmem0", "awaddr")``); None
    marks an AXI4 constant. Directions are the device's; stream payloads widen to ``tdata``.
    """
    rows = [("aclk", In(1), None), ("aresetn", In(1), None)]
    members = device.signature.members
    for path, member, _ in device.signature.flatten(device):
        top = members[path[0]]
        if top.is_port:                                   # irq
            rows.append((path[0], member, path))
            continue
        prefix = _prefix(path[0], top)
        if isinstance(top.signature, stream.Signature):
            name = prefix + STREAM_SIGNALS[path[1]]
            shape = tdata_width(member.shape) if path[1] == "payload" else 1
            rows.append((name, member.flow(shape), path))
            continue
        rows.append((prefix + path[1], member.flow(member.shape), path))
        if isinstance(top.signature, Axi4Signature) and path[1] in ("awburst", "arburst"):
            # the address channel's constants follow its burst type
            rows += [(prefix + sig, Out(width), None) for sig, (width, _, _) in AXI4_CONSTANTS.items()
                     if sig.startswith(path[1][:2])]
    return rows


class U200Top(wiring.Component):
    """The board integration top; ``config`` defaults to ``DeviceConfig()`` (4 channels)."""

    def __init__(self, config: DeviceConfig | None = None):
        config = config if config is not None else DeviceConfig()
        if config.cache_test_port:
            raise ValueError("the board top needs cache_test_port=False (no test port on the FPGA)")
        self.config = config
        self._device = TrainingCxlDevice(config)
        self.port_map = board_members(self._device)
        super().__init__({name: member for name, member, _ in self.port_map})
        # Vivado IP integrator: aclk clocks every interface, aresetn is its active-low reset,
        # irq is a level interrupt (X_INTERFACE_* attributes on the ports).
        busifs = sorted({name.rsplit("_", 1)[0] for name, _, _ in self.port_map if name.startswith(("s_", "m_"))})
        self.aclk.attrs.update({
            "X_INTERFACE_INFO": "xilinx.com:signal:clock:1.0 aclk CLK",
            "X_INTERFACE_PARAMETER": f"ASSOCIATED_BUSIF {':'.join(busifs)}, ASSOCIATED_RESET aresetn"})
        self.aresetn.attrs.update({
            "X_INTERFACE_INFO": "xilinx.com:signal:reset:1.0 aresetn RST",
            "X_INTERFACE_PARAMETER": "POLARITY ACTIVE_LOW"})
        self.irq.attrs.update({
            "X_INTERFACE_INFO": "xilinx.com:signal:interrupt:1.0 irq INTERRUPT",
            "X_INTERFACE_PARAMETER": "SENSITIVITY LEVEL_HIGH"})

    @property
    def device(self) -> TrainingCxlDevice:
        return self._device

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = ClockDomain("sync")
        m.submodules.reset_sync = reset_sync = AresetnSynchronizer(domain="sync", stages=RESET_STAGES)
        m.d.comb += [
            ClockSignal("sync").eq(self.aclk),
            reset_sync.aresetn.eq(self.aresetn),
            ResetSignal("sync").eq(reset_sync.rst),
        ]
        m.submodules.device = device = self._device
        for name, member, path in self.port_map:
            port = getattr(self, name)
            if path is None:
                if name not in ("aclk", "aresetn"):          # an AXI4 constant
                    m.d.comb += port.eq(AXI4_CONSTANTS[name.rsplit("_", 1)[1]][1])
                continue
            inner = device
            for part in path:
                inner = getattr(inner, part)
            inner = Value.cast(inner)
            if member.flow == In:
                m.d.comb += inner.eq(port[:len(inner)])
            else:
                m.d.comb += port.eq(inner)                   # zero-extends a padded tdata
        return m
