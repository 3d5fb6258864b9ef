"""A send tells ``auto`` the link's rate from the time its thread was blocked (issue 29).

A send slowed down because its thread ran on a CPU or waited for one (shared cores, a fast
link) says nothing of the link: were it read as a slow link, ``auto`` would compress, which
costs more CPU and slows the next sends further.
"""

from __future__ import annotations

import select
import socket
import time

import numpy as np
import pytest

from tensorwire.codecs import AutoCodec
from tensorwire.transports.base.endpoint import CPU_BOUND_FLOOR, _Endpoint
from tensorwire.transports.base.send_time import SendTime, busy_seconds, timed_send
from tensorwire.wire import Limits, encode_message

BIG = encode_message({"w": np.zeros(1 << 18)})  # 2 MiB: big enough to measure the link


def _auto_endpoint() -> tuple[_Endpoint, AutoCodec]:
    endpoint = _Endpoint("auto", checksum=False, limits=Limits())
    assert isinstance(endpoint.selector, AutoCodec)
    return endpoint, endpoint.selector


def test_a_send_blocked_throughout_gives_the_link_rate() -> None:
    endpoint, auto = _auto_endpoint()
    endpoint._note_send("p", BIG, SendTime(wall_s=0.5, link_s=0.5), time.perf_counter())
    assert auto.bandwidth == pytest.approx(BIG.nbytes / 0.5)


def test_a_cpu_bound_send_does_not_read_as_a_slow_link() -> None:
    endpoint, auto = _auto_endpoint()
    endpoint._note_send("p", BIG, SendTime(wall_s=0.5, link_s=0.0), time.perf_counter())
    assert auto.bandwidth == pytest.approx(BIG.nbytes / (CPU_BOUND_FLOOR * 0.5))
    # half blocked: the link carried the bytes in that half
    endpoint, auto = _auto_endpoint()
    endpoint._note_send("p", BIG, SendTime(wall_s=0.5, link_s=0.25), time.perf_counter())
    assert auto.bandwidth == pytest.approx(BIG.nbytes / 0.25)


def test_wall_seconds_alone_count_whole_and_small_sends_not_at_all() -> None:
    endpoint, auto = _auto_endpoint()
    endpoint._note_send("p", BIG, 0.5, time.perf_counter())  # a transport that does not split
    assert auto.bandwidth == pytest.approx(BIG.nbytes / 0.5)
    small = encode_message({"w": np.zeros(1024)})
    endpoint._note_send("p", small, SendTime(1.0, 0.5), time.perf_counter())
    assert auto.bandwidth == pytest.approx(BIG.nbytes / 0.5)
    assert endpoint.records[-1].wire_s == 1.0  # a record keeps the wall seconds


def test_blocked_time_is_the_links_and_cpu_time_is_not() -> None:
    a, b = socket.socketpair()
    with a, b:  # nothing ever comes: the thread is blocked for the whole wait
        blocked = timed_send(lambda: select.select([a], [], [], 0.2), measure=True)
    assert blocked.wall_s >= 0.2
    assert blocked.link_s is not None and blocked.link_s >= 0.5 * blocked.wall_s

    def spin() -> None:
        until = time.thread_time() + 0.05
        while time.thread_time() < until:
            pass

    busy = timed_send(spin, measure=True)
    assert busy.link_s is not None and busy.link_s <= busy.wall_s
    try:  # with the kernel's schedstat, waiting for a CPU counts as busy too
        open("/proc/thread-self/schedstat").close()
    except OSError:
        return
    assert busy.link_s < 0.5 * busy.wall_s


def test_unmeasured_sends_skip_the_clock() -> None:
    sent = timed_send(lambda: None, measure=False)
    assert sent.link_s is None and sent.wall_s >= 0.0
    assert busy_seconds() > 0.0
