"""A small host CPU cache (MESI) that competes with the device for lines through the home agent.

``HostCpuCache(home_agent, lines, *, rng, capacity=None, store_rate=0.5, evict_rate=0.05)``
attaches itself to the home agent (``home_agent.attach_cpu``) and works on the given line
addresses (host or GPU memory lines):
- ``tick()`` issues one random operation and returns the HA's messages: a load or a store
  (probability ``store_rate``) of a random line, or an eviction (probability ``evict_rate``).
  A hit completes at once; a miss (or a store to S) calls ``home_agent.cpu_request`` and the
  operation completes when the HA calls ``fill``, possibly after snooping the device. At most
  one miss per line is outstanding; a line with a miss pending is skipped.
- ``load(line)`` / ``store(line, value)``: directed operations (same rules; returns messages).
- callbacks from the HA: ``fill(line, state, value)`` (state I = a copy to use once),
  ``recall(line, invalidate) -> dirty value or None`` (invalidate, or downgrade to S).
- ``capacity``: at most that many valid lines; a fill evicts a random other idle line
  (write-back through ``home_agent.cpu_evict`` when dirty).
- ``on_access``: optional ``callable(kind, line, value)`` for each completed "load" (the value
  read) and "store" (the value written); the coherence test checks loads against its oracle.
Store values are unique per cache (a counter in the low 32 bits, ``value_tag`` above it).
"""
from __future__ import annotations

from .home_agent import I, S, E, M


class HostCpuCache:
    def __init__(self, home_agent, lines, *, rng, capacity: int | None = None,
                 store_rate: float = 0.5, evict_rate: float = 0.05, value_tag: int = 0xC0):
        self.ha = home_agent
        self.lines = list(lines)
        self.rng = rng
        self.capacity = capacity
        self.store_rate = store_rate
        self.evict_rate = evict_rate
        self.state: dict[int, int] = {}
        self.value: dict[int, int] = {}
        self.pending: dict[int, tuple[str, int]] = {}   # line -> ("load"/"store", value)
        self.on_access = None
        self._value_base = value_tag << 32
        self._counter = 0
        self.counts = {"loads": 0, "stores": 0, "hits": 0, "misses": 0, "evictions": 0,
                       "use_once": 0}
        home_agent.attach_cpu(self)

    # ---- operations
    def tick(self) -> list:
        rng = self.rng
        line = self.lines[rng.randrange(len(self.lines))]
        if line in self.pending:
            return []
        r = rng.random()
        if r < self.evict_rate:
            self.evict(line)
            return []
        if r < self.evict_rate + self.store_rate:
            return self.store(line, self.next_value())
        return self.load(line)

    def next_value(self) -> int:
        self._counter += 1
        return self._value_base | self._counter

    def load(self, line: int) -> list:
        if line in self.pending:
            raise RuntimeError(f"CPU line {line:#x} already has a miss pending")
        if self.state.get(line, I) != I:
            self.counts["hits"] += 1
            self._done("load", line, self.value[line])
            return []
        self.counts["misses"] += 1
        self.pending[line] = ("load", 0)
        return self.ha.cpu_request(line, False)

    def store(self, line: int, value: int) -> list:
        if line in self.pending:
            raise RuntimeError(f"CPU line {line:#x} already has a miss pending")
        if self.state.get(line, I) in (E, M):
            self.counts["hits"] += 1
            self._write(line, value)
            return []
        self.counts["misses"] += 1
        self.pending[line] = ("store", value)
        return self.ha.cpu_request(line, True)

    def evict(self, line: int) -> None:
        state = self.state.get(line, I)
        if state == I or line in self.pending:
            return
        self.counts["evictions"] += 1
        self.state[line] = I
        self.ha.cpu_evict(line, self.value[line] if state == M else None)

    # ---- callbacks from the home agent
    def fill(self, line: int, state: int, value: int) -> None:
        kind, store_value = self.pending.pop(line)
        if state == I:
            self.counts["use_once"] += 1
        else:
            self._make_room(line)
            self.state[line] = state
            self.value[line] = value
        if kind == "load":
            self._done("load", line, value)
        else:
            self._write(line, store_value)

    def recall(self, line: int, invalidate: bool):
        state = self.state.get(line, I)
        self.state[line] = I if invalidate else (S if state != I else I)
        return self.value[line] if state == M else None

    # ---- internals
    def _write(self, line: int, value: int) -> None:
        self.state[line] = M
        self.value[line] = value
        self.ha.cpu_store(line, value)
        self._done("store", line, value)

    def _done(self, kind: str, line: int, value: int) -> None:
        self.counts["loads" if kind == "load" else "stores"] += 1
        if self.on_access is not None:
            self.on_access(kind, line, value)

    def _make_room(self, line: int) -> None:
        if self.capacity is None or self.state.get(line, I) != I:
            return
        valid = [ln for ln, st in self.state.items() if st != I and ln not in self.pending]
        if len(valid) >= self.capacity:
            self.evict(valid[self.rng.randrange(len(valid))])
