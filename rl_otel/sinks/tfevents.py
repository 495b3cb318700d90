"""A TensorBoard event file writer on the calling thread, with a C CRC32C.

TensorBoard's own ``EventFileWriter`` hands every event to a thread of its own, which frames it with a pure-Python
``masked_crc32c`` (~3.4 ms for a 20 KB event, holding the GIL: the training loop waits for it). The sink already
runs on the tracker bridge's worker thread, so a second thread buys nothing; this writer frames records itself
with ``google_crc32c`` (C) and writes them in batches.

The file is what TensorBoard writes and reads: ``events.out.tfevents.<time>.<host>.<pid>.<uid><suffix>``, TFRecord
framing (``<Q`` data length, masked CRC32C of those 8 bytes, the data, masked CRC32C of the data), and an Event with
``file_version="brain.Event:2"`` first.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import struct
import time
from collections.abc import Callable

_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_MASK_DELTA = 0xA282EAD8
_BUFFER_BYTES = 1 << 20  # pending records are written out once they reach this size, whatever flush_secs says
_uid = itertools.count()  # TensorBoard's writer numbers its files per process likewise; "xb" settles a clash


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


def record(data: bytes) -> bytes:
    """One TFRecord: length, its masked CRC, the data, the data's masked CRC."""
    length = _LENGTH.pack(len(data))
    return b"".join((length, _CRC.pack(masked_crc32c(length)), data, _CRC.pack(masked_crc32c(data))))


class EventFileWriter:
    """Appends serialized ``Event`` protos to a new event file in ``log_dir``.

    Records are kept in memory and written (one ``write`` to the OS) by :meth:`flush`, which :meth:`add_event`
    calls itself once ``flush_secs`` have passed since the last flush or 1 MiB is pending. After a failed write
    (a full disk) the writer is broken: the file may end in a partial record, so every later call raises that
    error again and the owner opens a new file instead of appending after the fragment.
    """

    def __init__(self, log_dir: str, *, flush_secs: float = 10.0, filename_suffix: str = "") -> None:
        from tensorboard.compat.proto.event_pb2 import Event

        os.makedirs(log_dir, exist_ok=True)
        stamp = f"{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}"
        while True:
            self.path = os.path.join(log_dir, f"events.out.tfevents.{stamp}.{next(_uid)}{filename_suffix}")
            try:
                self._file = open(self.path, "xb", buffering=0)  # noqa: SIM115 (the writer's, until close())
                break
            except FileExistsError:  # another writer of this process or host took the name: next uid
                continue
        self._flush_secs = float(flush_secs)
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._broken: BaseException | None = None
        self.lost = 0  # after a failed write: how many of the events added (not the header) did not reach the file
        self._header_pending = True
        self._last_flush = time.monotonic()
        try:
            self.add_event(Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
            self.flush()
        except BaseException:
            # the header did not reach the disk (disk full): no handle and no empty file per reopen attempt
            self._file.close()
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            raise

    def add_event(self, event: bytes) -> None:
        """Queue one serialized ``Event``; write out what is pending if a flush is due."""
        if self._broken is not None:
            raise self._broken
        rec = record(event)
        self._pending.append(rec)
        self._pending_bytes += len(rec)
        if self._pending_bytes >= _BUFFER_BYTES or time.monotonic() - self._last_flush >= self._flush_secs:
            self.flush()

    def flush(self) -> None:
        """Write every pending record to the file (to the OS; no fsync, as TensorBoard's writer)."""
        if self._broken is not None:
            raise self._broken
        self._last_flush = time.monotonic()
        if not self._pending:
            return
        records = self._pending
        data = b"".join(records) if len(records) > 1 else records[0]
        self._pending = []
        self._pending_bytes = 0
        written = 0
        try:
            view = memoryview(data)
            while view:  # an unbuffered write may write less than asked (a nearly full disk)
                n = self._write(view)
                written += n
                view = view[n:]
        except BaseException as exc:
            self._broken = exc
            self.lost = _incomplete(records, written) - (1 if self._header_pending else 0)
            raise
        self._header_pending = False

    def _write(self, data: memoryview) -> int:
        """The one place bytes reach the file (tests inject a full disk here when they cannot mount one)."""
        return self._file.write(data)

    def close(self) -> None:
        """Flush and close; a broken writer just releases its file (what it held is lost with the failed write)."""
        try:
            if self._broken is None:
                self.flush()
        finally:
            self._file.close()


def _incomplete(records: list[bytes], written: int) -> int:
    """How many of ``records`` (written back to back) did not fully reach the file when ``written`` bytes did:
    the complete ones before the cut are read back by TensorBoard, the rest are lost."""
    end = 0
    for i, rec in enumerate(records):
        end += len(rec)
        if end > written:
            return len(records) - i
    return 0
