"""BufferPool: exact lengths, reuse of released blocks, a bound on idle bytes."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tensorwire.wire import BufferPool
from tensorwire.wire.pool import size_class


@pytest.mark.parametrize("n", [0, 1, 4095, 4096, 4097, 10_000, 1 << 20, (1 << 20) + 1])
def test_acquire_gives_exactly_the_length_asked(n: int) -> None:
    pool = BufferPool()
    buf = pool.acquire(n)
    assert buf.dtype == np.uint8 and buf.shape == (n,) and buf.flags.writeable
    assert buf.flags.c_contiguous
    buf[:] = 7  # really writable, all of it


def test_a_released_block_is_reused() -> None:
    pool = BufferPool()
    a = pool.acquire(10_000)
    block = a.base
    pool.release(a)
    assert pool.cached_bytes == size_class(10_000)
    b = pool.acquire(9_500)  # same size class
    assert b.base is block and b.shape == (9_500,)
    assert pool.cached_bytes == 0
    c = pool.acquire(9_500)  # pool empty: a fresh block
    assert c.base is not block


def test_other_size_classes_do_not_reuse() -> None:
    pool = BufferPool()
    a = pool.acquire(10_000)
    pool.release(a)
    b = pool.acquire(100_000)
    assert b.base is not a.base
    assert pool.cached_bytes == size_class(10_000)


def test_cached_bytes_are_bounded_and_oldest_go_first() -> None:
    pool = BufferPool(max_cached_bytes=3 * 8192)
    sizes = [8192, 4096, 8192, 4096, 8192]
    bufs = [pool.acquire(n) for n in sizes]
    for b in bufs:
        pool.release(b)
        assert pool.cached_bytes <= 3 * 8192
    # The 4 KiB class was released least recently: its blocks went, the 8 KiB ones stayed.
    assert pool.cached_bytes == 3 * 8192
    fresh = pool.acquire(4096).base
    assert fresh is not bufs[1].base and fresh is not bufs[3].base
    assert {id(pool.acquire(8192).base) for _ in range(3)} == {id(bufs[i].base) for i in (0, 2, 4)}
    assert pool.cached_bytes == 0


def test_a_block_bigger_than_the_bound_is_not_kept() -> None:
    pool = BufferPool(max_cached_bytes=4096)
    pool.release(pool.acquire(1 << 20))
    assert pool.cached_bytes == 0


def test_foreign_arrays_are_ignored() -> None:
    pool = BufferPool()
    pool.release(np.empty(5000, np.uint8))  # not a size class
    pool.release(np.frombuffer(b"x" * 5000, np.uint8))  # base is bytes
    assert pool.cached_bytes == 0


@given(st.integers(0, 1 << 40))
def test_size_classes_are_tight_and_stable(n: int) -> None:
    c = size_class(n)
    assert c >= n and c >= 4096
    assert c == 4096 or c - n < c / 8  # at most 12.5 % slack
    assert size_class(c) == c


def test_threads_never_get_the_same_block() -> None:
    pool = BufferPool()
    seen: list[int] = []
    lock = threading.Lock()

    def work() -> None:
        for _ in range(200):
            b = pool.acquire(5000)
            with lock:
                assert id(b.base) not in seen
                seen.append(id(b.base))
            with lock:
                seen.remove(id(b.base))
            pool.release(b)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert pool.cached_bytes <= 4 * size_class(5000)
