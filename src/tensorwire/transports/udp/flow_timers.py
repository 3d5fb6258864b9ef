"""Which of a hub's flows its I/O thread ticks in a turn: those that datagrams or control
messages touched since the last turn, and those whose timer is due; never every flow (a
turn per control message that looked at every flow made a broadcast cost O(flows^2))."""

from __future__ import annotations

from tensorwire.transports.timer_heap import TimerHeap
from tensorwire.transports.udp.flow import Flow


class FlowTimers:
    """The flows to tick, for one I/O thread (not thread-safe)."""

    def __init__(self) -> None:
        self._timers: TimerHeap[Flow] = TimerHeap()
        self._touched: dict[Flow, None] = {}  # in order

    def touch(self, flow: Flow) -> None:
        """``flow`` took a datagram or a control message: tick it this turn."""
        self._touched[flow] = None

    def discard(self, flow: Flow) -> None:
        """``flow`` ended: never tick it again."""
        self._timers.discard(flow)
        self._touched.pop(flow, None)

    def tick(self, now: float) -> float | None:
        """Tick the flows touched or due at ``now`` (``time.perf_counter()`` seconds); return
        when the next is due (None: none is)."""
        touched, self._touched = self._touched, {}
        for flow in [*touched, *self._timers.due(now)]:
            if not flow.closed:
                due = flow.tick(now)
                self._timers.arm(flow, None if due is None else now + due)
        return self._timers.soonest()
