"""TFRecord framing, written and read: the one definition for the event file writer and the watcher's reader.

A record is the data's length (``<Q``), the masked CRC32C of those 8 bytes, the data, and the masked CRC32C of the
data; TensorBoard writes and reads event files so. :func:`encode` frames one record (the writer,
:mod:`rl_otel.sinks.tfevents`); :func:`length_at`, :func:`data_at` and :func:`find_header` take them apart again
from a buffer read off a file that may be damaged (the reader, :mod:`rl_otel.watch.records`).

The CRC is google_crc32c's C build when installed (a few µs per event), else TensorBoard's pure-Python one
(correct, ~1000x slower). Looking for the next valid header in damaged bytes checks every byte position: that is
done with numpy, a block of positions at a time (a few ms per MB), not one Python call per position.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator

import numpy as np

LENGTH = struct.Struct("<Q")
CRC = struct.Struct("<I")
HEADER_SIZE = LENGTH.size + CRC.size  # 12: the length and its CRC
FOOTER_SIZE = CRC.size  # 4: the data's CRC
_MASK_DELTA = 0xA282EAD8
_BLOCK = 1 << 20  # positions checked per numpy pass of find_header (bounded memory: ~40 bytes per position)


def _crc32c() -> Callable[[bytes], int]:
    """google_crc32c's C build, else TensorBoard's pure-Python CRC (correct, ~1000x slower)."""
    try:
        import google_crc32c
    except ImportError:
        pass
    else:
        if google_crc32c.implementation == "c":
            return google_crc32c.value
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import crc32c

    return crc32c


crc32c = _crc32c()


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC32C: the CRC rotated right by 15 bits plus a constant, modulo 2**32."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def encode(data: bytes) -> bytes:
    """One TFRecord: length, its masked CRC, the data, the data's masked CRC."""
    length = LENGTH.pack(len(data))
    return b"".join((length, CRC.pack(masked_crc32c(length)), data, CRC.pack(masked_crc32c(data))))


def length_at(buf: bytes, pos: int) -> int | None:
    """The data length of the header at ``buf[pos:pos + 12]``, or ``None`` when its CRC does not hold."""
    if masked_crc32c(buf[pos:pos + LENGTH.size]) != CRC.unpack_from(buf, pos + LENGTH.size)[0]:
        return None
    return int(LENGTH.unpack_from(buf, pos)[0])


def data_at(buf: bytes, start: int, length: int) -> bytes | None:
    """The ``length`` bytes of data at ``start``, or ``None`` when they do not match the CRC that follows them."""
    data = buf[start:start + length]
    return data if masked_crc32c(data) == CRC.unpack_from(buf, start + length)[0] else None


def find_header(buf: bytes, start: int, max_length: int) -> int:
    """The first position from ``start`` on where a header holds (its CRC matches, its length at most
    ``max_length``); else the first position where one could still begin, its rest not read yet (at most 11 bytes
    before the buffer's end)."""
    last = len(buf) - HEADER_SIZE  # the last position a whole header fits at
    pos = start
    block = 4096  # growing: a header close by costs little, a long stretch of damage a few large passes
    while pos <= last:
        n = min(last - pos + 1, block)
        hit = _first_header(buf, pos, n, max_length)
        if hit is not None:
            return hit
        pos += n
        block = min(block * 4, _BLOCK)
    return max(start, last + 1)


def whole_records(buf: bytes, start: int, max_length: int) -> Iterator[int]:
    """The positions from ``start`` on where a header holds and its whole record (header, data, footer) lies in
    ``buf``, in order; the data's CRC is the caller's to check. A block of positions at a time: a buffer of valid
    headers whose records do not fit (a crafted file) costs a few numpy passes, not one per byte."""
    last = len(buf) - HEADER_SIZE
    pos = start
    while pos <= last:
        n = min(last - pos + 1, _BLOCK)
        hits = _headers(buf, pos, n, max_length)
        if hits.size:
            lengths = np.ndarray((n,), dtype="<u8", buffer=buf, offset=pos, strides=(1,))[hits - pos]
            fit = hits[hits + HEADER_SIZE + lengths.astype(np.int64) + FOOTER_SIZE <= len(buf)]
            yield from (int(h) for h in fit)
        pos += n


def _headers(buf: bytes, pos: int, n: int, max_length: int) -> np.ndarray:
    """Every one of the ``n`` positions from ``pos`` on where a header holds (absolute positions, int64)."""
    lengths = np.ndarray((n,), dtype="<u8", buffer=buf, offset=pos, strides=(1,))
    stored = np.ndarray((n,), dtype="<u4", buffer=buf, offset=pos + LENGTH.size, strides=(1,))
    candidates = np.flatnonzero((lengths <= max_length) & ((lengths != 0) | (stored == _EMPTY_CRC)))
    if candidates.size == 0:
        return candidates.astype(np.int64)
    stored = stored[candidates]
    windows = np.ndarray((n, LENGTH.size), dtype=np.uint8, buffer=buf, offset=pos, strides=(1, 1))[candidates]
    crc = np.full(candidates.size, 0xFFFFFFFF, dtype=np.uint32)
    for k in range(LENGTH.size):
        crc = _TABLE[(crc ^ windows[:, k]) & 0xFF] ^ (crc >> np.uint32(8))
    crc ^= np.uint32(0xFFFFFFFF)
    masked = ((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(_MASK_DELTA)
    return pos + candidates[masked == stored].astype(np.int64)


def _first_header(buf: bytes, pos: int, n: int, max_length: int) -> int | None:
    """The first of the ``n`` positions from ``pos`` on where a header holds, else ``None``."""
    lengths = np.ndarray((n,), dtype="<u8", buffer=buf, offset=pos, strides=(1,))  # unaligned views: no copies
    stored = np.ndarray((n,), dtype="<u4", buffer=buf, offset=pos + LENGTH.size, strides=(1,))
    # nearly every position of random bytes fails the length; a run of zero bytes fails the second test (a zero
    # length's CRC is not zero)
    candidates = np.flatnonzero((lengths <= max_length) & ((lengths != 0) | (stored == _EMPTY_CRC)))
    if candidates.size == 0:
        return None
    stored = stored[candidates]
    windows = np.ndarray((n, LENGTH.size), dtype=np.uint8, buffer=buf, offset=pos, strides=(1, 1))[candidates]
    crc = np.full(candidates.size, 0xFFFFFFFF, dtype=np.uint32)
    for k in range(LENGTH.size):  # CRC32C, one byte at a time, every candidate at once
        crc = _TABLE[(crc ^ windows[:, k]) & 0xFF] ^ (crc >> np.uint32(8))
    crc ^= np.uint32(0xFFFFFFFF)
    masked = ((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(_MASK_DELTA)  # uint32 wraps: mod 2**32
    hits = np.flatnonzero(masked == stored)
    return pos + int(candidates[hits[0]]) if hits.size else None


def _table() -> np.ndarray:
    """The byte table of CRC32C (Castagnoli, reflected polynomial 0x82F63B78)."""
    table = np.zeros(256, dtype=np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table[i] = c
    return table


_TABLE = _table()
_EMPTY_CRC = masked_crc32c(LENGTH.pack(0))
