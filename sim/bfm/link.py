"""Generic per-cycle driver for valid/ready stream channels (one step per rising clock edge).

``LinkDriver(dut, clk, tx={name: codec}, rx={name: codec}, rng=rng, backpressure=p)``:
- tx channels (we are the source): ``send(name, word_or_fields)`` queues a message (an int
  already packed, or a dict of the codec's fields); messages go out in queue order, one per
  cycle at most, as fast as the sink accepts them. We drive ``<name>__valid`` and
  ``<name>__payload`` and sample ``<name>__ready``.
- rx channels (we are the sink): we drive ``<name>__ready``, dropped at random with
  probability ``backpressure`` each cycle (one ``rng.random()`` draw per rx channel per cycle,
  in the order of ``rx``, so a run is reproducible from the rng's seed), and sample
  ``<name>__valid`` / ``<name>__payload``.
- every transfer is reported to each of ``listeners``: ``on_tx(cycle, name, fields)`` and
  ``on_rx(cycle, name, fields)`` (fields = ``codec.unpack(word)``), tx transfers first.
- ``on_cycle``: optional ``callable(cycle)`` run in each step after the transfers have been
  reported and before the next cycle is driven (a client's per-cycle work, e.g. releasing
  delayed messages, without a coroutine of its own).
- ``hold``: names of rx channels whose ready is held low (no transfer) until removed; draws
  for them are still made, so holding does not shift the rng sequence of a run.
- ``start()`` / ``stop()``; ``error`` holds the exception that stopped the step (the step
  runs in a simulator callback where an exception cannot reach the test); ``enabled =
  False`` keeps sampling but stops driving; ``pending`` counts queued tx messages.
- Sleeping (``period_ns`` given): after a step in which nothing was driven or queued, every
  rx valid was low, no ready is dropped (``backpressure`` 0, nothing held) and the client
  has no timed work (``on_cycle`` is None or ``can_sleep()`` is True), the driver stops
  its per-edge callback and waits on the rx valids instead; a valid rising, or ``send``,
  wakes it for the next edge. Nothing observable changes (same transfers at the same
  cycles; ``cycle`` counts the edges slept through, from the simulation time), but Python
  no longer runs at every edge while the device works alone (an NDP command).

Mechanism (as in cxl_mem_host.py): the step is registered directly as the simulator's
value-change callback on the clock (no cocotb task per cycle); values read at a rising edge
are the pre-edge ones, so valid & ready seen there is a transfer at that edge. Raw handles:
1-bit signals and payloads of at most 32 bits are read as integers, wider payloads as bit
strings; a signal is written only when its value changes.
"""
from __future__ import annotations

import collections
import functools
import os

from ..model.codec import StructCodec

# Payloads up to this width are written with set_signal_val_int (a C int: keep the sign bit
# clear) and read with get_signal_val_long.
_INT_WRITE_BITS = 31
_LONG_READ_BITS = 32


class TxChannel:
    """A source channel: queue of packed words and the state of what we drive."""
    __slots__ = ("name", "codec", "queue", "driven", "valid_out", "h_valid", "h_ready",
                 "h_payload", "fmt", "int_payload")

    def __init__(self, name: str, codec: StructCodec, h_valid=None, h_ready=None, h_payload=None):
        self.name = name
        self.codec = codec
        self.queue: collections.deque[int] = collections.deque()
        self.driven = False          # the head of the queue is on the wires (valid high)
        self.valid_out = 0           # last value written to valid
        self.h_valid, self.h_ready, self.h_payload = h_valid, h_ready, h_payload
        self.fmt = f"0{codec.width}b"
        self.int_payload = codec.width <= _INT_WRITE_BITS

    def push(self, word_or_fields) -> int:
        word = (self.codec.pack(**word_or_fields) if isinstance(word_or_fields, dict)
                else int(word_or_fields))
        if word >> self.codec.width:
            raise ValueError(f"{self.name}: word {word:#x} wider than {self.codec.width} bits")
        self.queue.append(word)
        return word


class RxChannel:
    """A sink channel: the ready we drive and how to read the payload."""
    __slots__ = ("name", "codec", "ready_out", "h_valid", "h_ready", "h_payload", "read")

    def __init__(self, name: str, codec: StructCodec, h_valid=None, h_ready=None, h_payload=None):
        self.name = name
        self.codec = codec
        self.ready_out = 0
        self.h_valid, self.h_ready, self.h_payload = h_valid, h_ready, h_payload
        self.read = None
        if h_payload is not None:
            if codec.width <= _LONG_READ_BITS:
                self.read = h_payload.get_signal_val_long
            else:
                get_bin = h_payload.get_signal_val_binstr
                self.read = lambda: int(get_bin(), 2)


def draw_ready(rng, backpressure: float, count: int) -> list[int]:
    """The ready values of ``count`` rx channels for one cycle (the draws the step makes)."""
    if not backpressure:
        return [1] * count
    return [0 if rng.random() < backpressure else 1 for _ in range(count)]


class _WakingSet(set):
    """A set that calls ``on_change`` whenever it is changed (``LinkDriver.hold``)."""

    def __init__(self, on_change):
        super().__init__()
        self._on_change = on_change

    def add(self, item) -> None:
        super().add(item)
        self._on_change()

    def discard(self, item) -> None:
        super().discard(item)
        self._on_change()

    def remove(self, item) -> None:
        super().remove(item)
        self._on_change()

    def clear(self) -> None:
        super().clear()
        self._on_change()


class LinkDriver:
    def __init__(self, dut, clk, *, tx: dict[str, StructCodec], rx: dict[str, StructCodec],
                 rng, backpressure: float = 0.0, period_ns: float | None = None):
        self.clk = clk
        self.rng = rng
        self._backpressure = backpressure
        self._cycle = 0
        self.listeners: list = []
        self._on_cycle = None
        self.can_sleep = None            # callable -> bool: the on_cycle client may sleep
        self._period_steps = None
        if period_ns is not None:
            from cocotb.utils import get_sim_steps
            self._period_steps = get_sim_steps(period_ns, "ns")
        self._asleep = False
        self._sleep_cbs: dict = {}       # rx index -> pending value-change callback
        self._last_step_time = None      # simulation time (steps) of the step before a sleep
        self._rx_valid_seen = False      # an rx valid was high in the last step
        self.enabled = True
        self.hold: set[str] = _WakingSet(self._wake)
        self.error: Exception | None = None

        def h(name):
            return getattr(dut, name)._handle
        self.tx = {n: TxChannel(n, c, h(f"{n}__valid"), h(f"{n}__ready"), h(f"{n}__payload"))
                   for n, c in tx.items()}
        self.rx = {n: RxChannel(n, c, h(f"{n}__valid"), h(f"{n}__ready"), h(f"{n}__payload"))
                   for n, c in rx.items()}
        self._tx_list = list(self.tx.values())
        self._rx_list = list(self.rx.values())
        self._task = None
        self._cbhdl = None
        self._clk_handle = None
        self._running = False

    # ---- API
    def send(self, name: str, word_or_fields) -> int:
        """Queue a message on tx channel ``name``; returns the packed word."""
        word = self.tx[name].push(word_or_fields)
        if self._asleep:
            self._wake()
        return word

    # Changing what the step does wakes a sleeping driver, so the change acts from the next edge.
    @property
    def on_cycle(self):
        return self._on_cycle

    @on_cycle.setter
    def on_cycle(self, fn) -> None:
        self._on_cycle = fn
        self._wake()

    @property
    def backpressure(self) -> float:
        return self._backpressure

    @backpressure.setter
    def backpressure(self, value: float) -> None:
        self._backpressure = value
        self._wake()

    @property
    def cycle(self) -> int:
        """Rising edges stepped (or slept through) since ``start``."""
        if self._asleep:
            return self._cycle + (self._now() - self._last_step_time) // self._period_steps
        return self._cycle

    @cycle.setter
    def cycle(self, value: int) -> None:
        self._cycle = value

    @property
    def pending(self) -> int:
        return sum(len(ch.queue) for ch in self._tx_list)

    def reset_link(self) -> None:
        """Forget queued messages and drive every tx channel idle."""
        for ch in self._tx_list:
            ch.queue.clear()
            ch.driven = False
            ch.valid_out = 0
            ch.h_valid.set_signal_val_int(0, 0)

    # ---- the per-cycle work
    def start(self) -> None:
        """Run ``step`` at every rising clock edge (raw callback; see the module docstring).

        ``COCOTB_HOST_COROUTINE=1`` uses an ordinary coroutine instead (for debugging).
        """
        self._running = True
        self._last_step_time = None
        # Start from known levels (the simulator's initial values need not be 0).
        for ch in self._tx_list:
            if not ch.driven:
                ch.h_valid.set_signal_val_int(0, 0)
                ch.valid_out = 0
        for ch in self._rx_list:
            ch.h_ready.set_signal_val_int(0, ch.ready_out)
        if os.environ.get("COCOTB_HOST_COROUTINE") == "1":
            import cocotb
            self._task = cocotb.start_soon(self._run_coroutine())
        else:
            from cocotb import simulator
            from cocotb.triggers import RisingEdge
            self._register_cb = simulator.register_value_change_callback
            self._rising = RisingEdge._edge_type
            self._clk_handle = self.clk._handle
            self._register()

    def stop(self) -> None:
        self._running = False
        self._cancel_sleep()
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self._cbhdl is not None:
            self._cbhdl.deregister()
            self._cbhdl = None

    def _register(self) -> None:
        # Runs every cycle: the callback registrar and edge type are looked up once, in start().
        self._cbhdl = self._register_cb(self._clk_handle, self._on_edge, self._rising)

    def _on_edge(self) -> None:
        self._cbhdl = None
        if not self._running:
            return
        try:
            self.step()
        except Exception as exc:      # a client or checker bug: stop, and let the test see it
            self.error = exc
            self._running = False
            return
        if self._may_sleep():
            self._sleep()
        else:
            self._register()

    # ---- sleeping (see the module docstring)
    def _now(self) -> int:
        from cocotb import simulator
        hi, lo = simulator.get_sim_time()
        return (hi << 32) | lo

    def _may_sleep(self) -> bool:
        if self._period_steps is None or not self.enabled or self._rx_valid_seen \
                or self._backpressure or self.hold:
            return False
        if self._on_cycle is not None and (self.can_sleep is None or not self.can_sleep()):
            return False
        return not any(ch.driven or ch.queue for ch in self._tx_list)

    def _sleep(self) -> None:
        # Registered now, with every rx valid seen low in this step: a rise after this edge's
        # evaluation calls _wake, in time for the step at the next edge to see the transfer.
        self._asleep = True
        self._last_step_time = self._now()
        self._sleep_cbs = {i: self._register_cb(ch.h_valid, functools.partial(self._on_valid_rise, i),
                                                self._rising)
                           for i, ch in enumerate(self._rx_list)}

    def _on_valid_rise(self, i: int) -> None:
        # A value-change callback fires once: this one is gone and must not be deregistered.
        self._sleep_cbs.pop(i, None)
        self._wake()

    def _cancel_sleep(self) -> None:
        for cb in self._sleep_cbs.values():
            cb.deregister()
        self._sleep_cbs = {}
        self._asleep = False

    def _wake(self) -> None:
        if not self._asleep:
            return
        self._cancel_sleep()
        if self._running and self._cbhdl is None:
            self._register()

    async def _run_coroutine(self):
        from cocotb.triggers import RisingEdge
        edge = RisingEdge(self.clk)
        while True:
            await edge
            self.step()

    def step(self) -> None:
        """One clock edge: report the transfers seen at it, then drive the next cycle."""
        if self._last_step_time is None:
            self._cycle += 1
        else:                              # the first step after sleeping: count the slept edges
            self._cycle += (self._now() - self._last_step_time) // self._period_steps
            self._last_step_time = None
        cycle = self._cycle
        listeners = self.listeners
        rx_valid_seen = False
        for ch in self._tx_list:
            if ch.driven and ch.h_ready.get_signal_val_long():
                ch.driven = False
                fields = ch.codec.unpack(ch.queue.popleft())
                for lst in listeners:
                    lst.on_tx(cycle, ch.name, fields)
        for ch in self._rx_list:
            if ch.h_valid.get_signal_val_long():
                rx_valid_seen = True
                if ch.ready_out:
                    fields = ch.codec.unpack(ch.read())
                    for lst in listeners:
                        lst.on_rx(cycle, ch.name, fields)
        self._rx_valid_seen = rx_valid_seen
        if self._on_cycle is not None:
            self._on_cycle(cycle)
        if not self.enabled:
            return
        for ch in self._tx_list:
            if not ch.driven:
                if ch.queue:
                    word = ch.queue[0]
                    if ch.int_payload:
                        ch.h_payload.set_signal_val_int(0, word)
                    else:
                        ch.h_payload.set_signal_val_binstr(0, format(word, ch.fmt))
                    ch.driven = True
                    if not ch.valid_out:
                        ch.h_valid.set_signal_val_int(0, 1)
                        ch.valid_out = 1
                elif ch.valid_out:
                    ch.h_valid.set_signal_val_int(0, 0)
                    ch.valid_out = 0
        bp = self._backpressure
        rng = self.rng
        hold = self.hold
        for ch in self._rx_list:
            ready = (0 if rng.random() < bp else 1) if bp else 1
            if hold and ch.name in hold:
                ready = 0
            if ready != ch.ready_out:
                ch.h_ready.set_signal_val_int(0, ready)
                ch.ready_out = ready
