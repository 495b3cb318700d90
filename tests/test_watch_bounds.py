"""Issue 41 item 11: a crafted event file bounds the watcher's work per file per poll. Before, 1.92 MB of valid
headers whose lengths run past the file's end cost one numpy pass per byte at every poll (34 s a poll, forever), and
a file of valid headers over damaged data was gone through whole in one poll."""

from __future__ import annotations

import struct

from rl_otel._internal.tfrecord import masked_crc32c
from rl_otel.watch import records
from rl_otel.watch.records import RecordTail


def _headers(length: int, count: int) -> bytes:
    header = struct.pack("<Q", length)
    return (header + struct.pack("<I", masked_crc32c(header))) * count


def test_headers_whose_records_never_come_cost_a_few_numpy_passes_once(tmp_path, monkeypatch):
    path = tmp_path / "crafted.tfevents"
    path.write_bytes(_headers(records.MAX_RECORD, 160_000))  # 1.92 MB, every header valid, no record whole
    calls: list[int] = []
    real = records.find_header
    monkeypatch.setattr(records, "find_header", lambda *a: calls.append(1) or real(*a))
    tail = RecordTail(str(path))
    size = path.stat().st_size
    for _ in range(3):
        batch = tail.read(size)
        assert batch.records == [] and tail.offset == 0  # waiting for the first record's rest
    assert len(calls) <= 3, len(calls)  # before: ~160,000 calls in the first read, and again at every read


def test_a_read_goes_through_a_bounded_number_of_corrupt_records(tmp_path):
    path = tmp_path / "damaged.tfevents"
    path.write_bytes(_headers(1 << 10, 20_000))  # each header's 1 KiB of data is other headers: CRCs fail
    tail = RecordTail(str(path))
    size = path.stat().st_size
    batch = tail.read(size)
    assert batch.corrupt <= records.MAX_CORRUPT_PER_READ + 1 and batch.more
    assert 0 < tail.offset < size
    reads = 1
    while batch.more and reads < 10_000:
        batch = tail.read(size)
        reads += 1
    assert reads > 1 and tail.offset >= size - 2 * (12 + (1 << 10) + 4)  # the rest read over later polls
