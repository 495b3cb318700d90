"""TFRecord framing read from a byte offset of a file that may still be growing.

A record is ``<Q`` length, the masked CRC32C of those 8 bytes, the data, the masked CRC32C of the data
(:func:`rl_otel.sinks.tfevents.record` writes the same). :class:`RecordTail` returns the complete records after
its offset and moves the offset past them: a record whose bytes are not all written yet (the writer is mid-write,
or was killed mid-write) is left for the next read. A record whose data CRC fails is skipped and counted; a
header whose CRC fails cannot be trusted for its length, so the reader looks for the next valid header and counts
the bytes skipped as one corrupt record. Nothing here raises on a file's content.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from rl_otel.sinks.tfevents import masked_crc32c

_HEADER = struct.Struct("<QI")
_CRC = struct.Struct("<I")
CHUNK = 8 * 2**20  # bytes read per call: a backlog is read in bounded steps
MAX_RECORD = 64 * 2**20  # a longer record is skipped unread (no scalar event is that large)


@dataclass
class Batch:
    """What one read found: complete records' data, corrupt records skipped, whether more bytes are waiting."""

    records: list[bytes] = field(default_factory=list)
    corrupt: int = 0
    more: bool = False


class RecordTail:
    """The records of one TFRecord file, from ``offset`` (resumed from a state file) on."""

    def __init__(self, path: str, offset: int = 0) -> None:
        self.path = path
        self.offset = offset

    def read(self, size: int, chunk: int = CHUNK) -> Batch:
        """Complete records between the offset and ``size`` (the file's current size), at most about ``chunk``
        bytes of them; the offset moves past what was consumed (records and corrupt bytes)."""
        batch = Batch()
        if size <= self.offset:
            return batch
        want = min(size - self.offset, chunk)
        buf = _read(self.path, self.offset, want)
        pos = 0
        end = len(buf)
        while end - pos >= _HEADER.size:
            length, length_crc = _HEADER.unpack_from(buf, pos)
            if masked_crc32c(buf[pos:pos + 8]) != length_crc:
                batch.corrupt += 1
                pos = _resync(buf, pos + 1)
                continue
            stop = pos + _HEADER.size + length + _CRC.size
            if stop > end:
                if length > MAX_RECORD and self.offset + stop <= size:
                    pos = stop  # skipped unread
                    continue
                if pos == 0 and self.offset + stop <= size and stop > want:
                    buf = _read(self.path, self.offset, stop)  # one record larger than a chunk: read it whole
                    end = len(buf)
                    if stop > end:
                        break
                else:
                    break  # the rest of the record is not written yet: wait for it
            data = buf[pos + _HEADER.size:stop - _CRC.size]
            if masked_crc32c(data) == _CRC.unpack_from(buf, stop - _CRC.size)[0]:
                batch.records.append(data)
            else:
                batch.corrupt += 1
            pos = stop
        self.offset += pos
        batch.more = pos > 0 and want == chunk and self.offset < size  # a backlog: read on without waiting
        return batch


def _read(path: str, offset: int, n: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(n)


def _resync(buf: bytes, pos: int) -> int:
    """The position of the next header whose length CRC holds, else where one could still start (the last 11
    bytes may be the beginning of a header whose rest is not read yet)."""
    last = len(buf) - _HEADER.size
    while pos <= last:
        if masked_crc32c(buf[pos:pos + 8]) == _CRC.unpack_from(buf, pos + 8)[0]:
            return pos
        pos += 1
    return max(pos, 0)
