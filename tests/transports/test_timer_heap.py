"""TimerHeap: the keys due come out in time order, a re-armed or discarded timer never
fires at its old time, and re-arming often keeps the heap O(timers), not O(re-arms)."""

from __future__ import annotations

from tensorwire.transports.timer_heap import COMPACT_FACTOR, TimerHeap


def test_due_keys_come_out_in_time_order_and_only_once():
    heap: TimerHeap[str] = TimerHeap()
    heap.arm("b", 2.0)
    heap.arm("a", 1.0)
    heap.arm("c", 3.0)
    assert heap.soonest() == 1.0
    assert heap.due(2.5) == ["a", "b"]
    assert heap.due(2.5) == []
    assert heap.soonest() == 3.0 and len(heap) == 1


def test_a_rearmed_or_discarded_timer_never_fires_at_its_old_time():
    heap: TimerHeap[str] = TimerHeap()
    heap.arm("moved", 1.0)
    heap.arm("moved", 5.0)
    heap.arm("gone", 1.5)
    heap.discard("gone")
    heap.arm("cleared", 1.2)
    heap.arm("cleared", None)
    assert heap.due(4.0) == []
    assert heap.soonest() == 5.0
    assert heap.due(5.0) == ["moved"]
    assert heap.soonest() is None


def test_rearming_many_times_keeps_the_heap_bounded_by_the_timers():
    heap: TimerHeap[int] = TimerHeap()
    for rearm in range(20_000):  # 10 keys, each re-armed 2,000 times, later each time
        heap.arm(rearm % 10, 100.0 + rearm)
    assert len(heap) == 10
    assert len(heap._heap) <= COMPACT_FACTOR * 10 + 64 + 1
    assert heap.due(100.0 + 19_990) == [0]
    assert sorted(heap.due(1e9)) == list(range(1, 10))
