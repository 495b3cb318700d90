"""TFRecord files read from a byte offset of a file that may still be growing.

The framing is :mod:`rl_otel._internal.tfrecord`'s (the event file writer writes with it). :class:`RecordTail`
returns the complete records after its offset and moves the offset past them: a record whose bytes are not all
written yet (the writer is mid-write, or was killed mid-write) is left for the next read. Nothing here raises on a
file's content, and no file stalls on it:

- a header whose CRC fails cannot be trusted for its length: the bytes from there to the next valid header are
  skipped and counted as one corrupt record;
- a header whose CRC holds but whose length is over :data:`MAX_RECORD` (a crafted or damaged length such as
  2**63, never written whole) is treated the same: counted, and the next valid header looked for, instead of
  waiting forever for bytes that will not come;
- a length that holds but is not yet all in the file is waited for, unless a complete valid record already lies
  inside its span (then the length is false: counted, and the reader goes on at that record);
- a record whose data CRC fails is counted and skipped: to where its length says when a valid header follows
  there, else to the next valid header (a false length must not swallow the good records it spans).

Memory: a read holds at most one chunk (8 MB), or one record up to :data:`MAX_RECORD`; skipped bytes are read a
chunk at a time and not kept. Work: a read goes through at most :data:`MAX_CORRUPT_PER_READ` corrupt records, and a
record waiting for its rest is searched for a whole record inside its span once per growth of the file (in numpy
passes), so a crafted file costs each poll little. Each read starts at the offset: damaged bytes already passed
are not read again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rl_otel._internal.tfrecord import FOOTER_SIZE, HEADER_SIZE, data_at, find_header, length_at, whole_records

CHUNK = 8 * 2**20  # bytes read per call: a backlog is read in bounded steps
MAX_RECORD = 64 * 2**20  # a longer length is no event rl_otel reads (a scalar event is ~100 bytes): not trusted
# corrupt records one read goes through at most: a file of valid headers over damaged data (crafted) costs a numpy
# pass per record; past this many the read stops, and the rest is read at the next polls, the other files between
MAX_CORRUPT_PER_READ = 64


@dataclass
class Batch:
    """What one read of a growing file found: complete records' data (a TFRecord file's records here, a JSONL
    file's lines in :class:`rl_otel.watch.jsonl.LineTail`), corrupt records skipped, whether more bytes are
    waiting."""

    records: list[bytes] = field(default_factory=list)
    corrupt: int = 0
    more: bool = False


class RecordTail:
    """The records of one TFRecord file, from ``offset`` (resumed from a state file) on. Setting ``offset`` (a
    file replaced or truncated is read again from 0) forgets what the tail knew about the bytes there."""

    def __init__(self, path: str, offset: int = 0) -> None:
        self.path = path
        self._offset = offset
        self._lost = False  # the bytes at the offset follow damage already counted: look for a valid header
        # (the position of a record whose rest is not in the file yet, the file's end when its span was searched
        # for a whole record): a poll with no new bytes does not search it again
        self._scanned: tuple[int, int] | None = None

    @property
    def offset(self) -> int:
        return self._offset

    @offset.setter
    def offset(self, value: int) -> None:
        self._offset = value
        self._lost = False
        self._scanned = None

    def read(self, size: int, chunk: int = CHUNK) -> Batch:
        """Complete records between the offset and ``size`` (the file's current size), at most about ``chunk``
        bytes of them; the offset moves past what was consumed (records and corrupt bytes)."""
        batch = Batch()
        if size <= self._offset:
            return batch
        want = min(size - self._offset, chunk)
        buf = _read(self.path, self._offset, want)
        end = len(buf)
        pos = 0
        lost = self._lost
        while True:
            if batch.corrupt >= MAX_CORRUPT_PER_READ:
                self._lost, self._offset = lost, self._offset + pos
                batch.more = True  # bounded work per file per poll: the rest at the next one
                return batch
            if lost:
                pos = find_header(buf, pos, MAX_RECORD)
                if end - pos < HEADER_SIZE:
                    break  # none in what was read: go on from here next time, still lost
                lost = False
            if end - pos < HEADER_SIZE:
                break
            length = length_at(buf, pos)
            if length is None or length > MAX_RECORD:
                batch.corrupt += 1
                pos, lost = pos + 1, True
                continue
            stop = pos + HEADER_SIZE + length + FOOTER_SIZE
            if stop > end:
                if self._offset + stop <= size:  # in the file, beyond this read
                    if pos > 0:
                        break  # the next read starts at it
                    buf = _read(self.path, self._offset, stop)  # one record larger than a chunk: read it whole
                    end = len(buf)
                    if stop > end:
                        break
                else:
                    # searched before for this same pending record, with no byte come since: nothing new to find
                    seen = (self._offset + pos, self._offset + end)
                    found = None if self._scanned == seen else _next_record(buf, pos + HEADER_SIZE)
                    if found is None:
                        self._scanned = seen
                        break  # the rest of the record is not written yet: wait for it
                    batch.corrupt += 1  # a whole record inside its span: the length is false
                    pos = found
                    continue
            data = data_at(buf, pos + HEADER_SIZE, length)
            if data is not None:
                batch.records.append(data)
                pos = stop
                continue
            batch.corrupt += 1
            if end - stop < HEADER_SIZE or _header_ok(buf, stop):
                pos = stop  # the length held (damaged data): the next record follows it
            else:
                found = find_header(buf, pos + 1, MAX_RECORD)
                if found >= stop:
                    batch.corrupt += 1  # nothing inside its span: the length held, and what follows is damaged too
                pos, lost = found, end - found < HEADER_SIZE
        self._lost = lost
        self._offset += pos
        batch.more = pos > 0 and want == chunk and self._offset < size  # a backlog: read on without waiting
        return batch


def _read(path: str, offset: int, n: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(n)


def _header_ok(buf: bytes, pos: int) -> bool:
    length = length_at(buf, pos)
    return length is not None and length <= MAX_RECORD


def _next_record(buf: bytes, start: int) -> int | None:
    """The position of the first complete record with valid CRCs at or after ``start``, else ``None`` (numpy
    passes over blocks of positions: a file of valid headers whose lengths run past its end - crafted, 1.92 MB -
    took 34 s a poll at one numpy call per byte)."""
    for pos in whole_records(buf, start, MAX_RECORD):
        length = length_at(buf, pos)
        if length is not None and data_at(buf, pos + HEADER_SIZE, length) is not None:
            return pos
    return None
