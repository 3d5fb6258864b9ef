"""RecordLog keeps records as untracked tuples and gives them back as TransferRecords."""

from __future__ import annotations

import gc

import pytest

from tensorwire.transports.base import RECENT_RECORDS, RecordLog, TransferRecord


def _rec(i: int) -> TransferRecord:
    return TransferRecord(
        "send", f"p{i}", "x", "data", 1, i, i + 1, "raw", 0.1, 0.2, 0.0, 0.3, None, float(i)
    )


def test_records_read_back_equal_newest_identical_and_bounded():
    log = RecordLog(maxlen=200)
    recs = [_rec(i) for i in range(300)]
    mark = 0
    for r in recs:
        log.append(r)
    assert len(log) == 200 and log.total == 300
    assert list(log) == recs[100:]  # equal values, oldest first
    assert log[-1] is recs[-1] and log[-RECENT_RECORDS] is recs[-RECENT_RECORDS]
    assert log[0] == recs[100] and log[0] is not recs[100]  # older ones are made again
    assert log[-200] == log[0] and log[199] is recs[-1]
    assert log.since(mark) == recs[100:] and log.since(log.mark()) == []
    assert log.since(290) == recs[290:] and all(
        a is b for a, b in zip(log.since(290), recs[290:], strict=True)
    )
    with pytest.raises(IndexError):
        log[200]
    with pytest.raises(IndexError):
        log[-201]


def test_kept_records_are_not_tracked_by_the_garbage_collector():
    log = RecordLog(maxlen=1000)
    for i in range(1000):
        log.append(_rec(i))
    gc.collect()
    tracked = sum(gc.is_tracked(v) for v in log._items)
    assert tracked == 0


def test_subscribers_get_the_record_objects():
    log = RecordLog()
    seen = []
    log.subscribe(seen.append)
    r = _rec(1)
    log.append(r)
    assert seen == [r] and seen[0] is r
