"""A TensorBoard event file writer on the calling thread, with a C CRC32C.

TensorBoard's own ``EventFileWriter`` hands every event to a thread of its own, which frames it with a pure-Python
``masked_crc32c`` (~3.4 ms for a 20 KB event, holding the GIL: the training loop waits for it). The sink already
runs on the tracker bridge's worker thread, so a second thread buys nothing; this writer frames records itself
with ``google_crc32c`` (C; :mod:`rl_otel._internal.tfrecord`) and hands each one to the OS at once, one ``write``
per event (a few microseconds): a process killed by SIGKILL, the OOM killer or a segfault loses no event that
``add_event`` returned from, stall or not (a buffer flushed by the next event after ``flush_secs`` lost every step
of a stall).

The file is what TensorBoard writes and reads: ``events.out.tfevents.<time>.<host>.<pid>.<uid><suffix>``, TFRecord
framing (:mod:`rl_otel._internal.tfrecord`, which the watcher reads back with), and an Event with
``file_version="brain.Event:2"`` first.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import time

from rl_otel._internal.tfrecord import encode

_uid = itertools.count()  # TensorBoard's writer numbers its files per process likewise; "xb" settles a clash


class EventFileWriter:
    """Appends serialized ``Event`` protos to a new event file in ``log_dir``, each written out by ``add_event``.

    One unbuffered ``write`` per event: the record is in the OS's page cache when ``add_event`` returns (no fsync,
    as TensorBoard's writer), so it survives the process being killed. ``flush_secs`` is accepted for
    TensorBoard's signature and unused: nothing waits in memory. After a failed write (a full disk) the writer is
    broken: the file may end in a partial record, so every later call raises that error again and the owner opens
    a new file instead of appending after the fragment.
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
        self._broken: BaseException | None = None
        try:
            self.add_event(Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString())
        except BaseException:  # boundary: the OS (the header write): the file closed, re-raised
            # the header did not reach the disk (disk full): no handle and no empty file per reopen attempt
            self._file.close()
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            raise

    def add_event(self, event: bytes) -> None:
        """Write one serialized ``Event`` to the file (to the OS: one ``write``, no fsync)."""
        if self._broken is not None:
            raise self._broken
        try:
            view = memoryview(encode(event))
            while view:  # an unbuffered write may write less than asked (a nearly full disk)
                view = view[self._write(view):]
        except BaseException as exc:  # boundary: the OS (the write, even interrupted): the writer broken, re-raised
            self._broken = exc
            raise

    def flush(self) -> None:
        """Nothing is pending (each event was written by ``add_event``); raises the error of a broken writer."""
        if self._broken is not None:
            raise self._broken

    def _write(self, data: memoryview) -> int:
        """The one place bytes reach the file (tests inject a full disk here when they cannot mount one)."""
        return self._file.write(data)

    def close(self) -> None:
        """Close the file (every event added is already written)."""
        self._file.close()
