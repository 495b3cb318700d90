"""rl_otel's event file writer and its TFRecord framing (rl_otel/_internal/tfrecord.py, which the watcher reads
with): byte-compatible with TensorBoard's framing, file naming and reader."""

from __future__ import annotations

import os
import socket
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("tensorboard")

from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.compat.tensorflow_stub import pywrap_tensorflow
from tensorboard.summary.writer.record_writer import RecordWriter

from rl_otel._internal import tfrecord
from rl_otel.sinks.tfevents import EventFileWriter


class _Bytes:
    def __init__(self):
        self.data = b""

    def write(self, data):
        self.data += data


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=5000))
def test_masked_crc_and_record_equal_tensorboards(data):
    assert tfrecord.masked_crc32c(data) == pywrap_tensorflow.masked_crc32c(data)
    theirs = _Bytes()
    RecordWriter(theirs).write(data)
    assert tfrecord.encode(data) == theirs.data


def test_the_c_crc32c_is_used_when_installed():
    google_crc32c = pytest.importorskip("google_crc32c")
    if google_crc32c.implementation != "c":
        pytest.skip("google_crc32c's pure-python build: the writer uses TensorBoard's CRC")
    assert tfrecord.crc32c is google_crc32c.value


def test_pure_python_fallback_frames_the_same(monkeypatch):
    import google_crc32c

    monkeypatch.setattr(google_crc32c, "implementation", "python")
    fallback = tfrecord._crc32c()
    assert fallback is pywrap_tensorflow.crc32c
    assert fallback(b"rl_otel") == tfrecord.crc32c(b"rl_otel")


def events(path):
    """TensorBoard's own record reader (it checks both CRCs of every record), as stored (no migration)."""
    return [Event.FromString(raw) for raw in RawEventFileLoader(path).Load()]


def test_tensorboards_loader_reads_every_event_and_the_name_is_tensorboards(tmp_path):
    before = int(time.time())
    writer = EventFileWriter(str(tmp_path / "run"), filename_suffix=".v2")
    for step in range(3):
        summary = Summary(value=[Summary.Value(tag="loss", simple_value=step / 2)])
        writer.add_event(Event(wall_time=time.time(), step=step, summary=summary).SerializeToString())
    writer.close()
    name = os.path.basename(writer.path)
    prefix, stamp, rest = name[:len("events.out.tfevents.")], name[len("events.out.tfevents."):][:10], \
        name[len("events.out.tfevents.") + 11:]
    assert prefix == "events.out.tfevents." and before <= int(stamp) <= time.time()
    assert rest.startswith(f"{socket.gethostname()}.{os.getpid()}.") and rest.endswith(".v2")
    first, *rest_events = events(writer.path)
    assert first.file_version == "brain.Event:2"
    assert [(e.step, e.summary.value[0].simple_value) for e in rest_events] == [(0, 0.0), (1, 0.5), (2, 1.0)]


def test_each_event_is_in_the_file_when_add_event_returns(tmp_path):
    """One write per event, whatever flush_secs says: a process killed right after (SIGKILL, OOM) keeps it. Before,
    records waited in memory for the next add_event() after flush_secs (a stalled run lost them all)."""
    writer = EventFileWriter(str(tmp_path), flush_secs=3600)
    for step in (1, 2, 3):
        writer.add_event(Event(step=step).SerializeToString())
        assert [e.step for e in events(writer.path)] == [0, *range(1, step + 1)]  # no flush(), no close()
    writer.flush()  # nothing left to write: the file is unchanged
    assert [e.step for e in events(writer.path)] == [0, 1, 2, 3]
    writer.close()


def test_two_writers_in_one_second_get_two_files(tmp_path):
    a, b = EventFileWriter(str(tmp_path)), EventFileWriter(str(tmp_path))
    a.close(), b.close()
    assert a.path != b.path and len(os.listdir(tmp_path)) == 2


def test_a_failed_write_breaks_the_writer_for_good(tmp_path, monkeypatch):
    writer = EventFileWriter(str(tmp_path), flush_secs=3600)
    writer.add_event(Event(step=1).SerializeToString())
    full = OSError(28, "No space left on device")

    def write(self, data):
        raise full

    monkeypatch.setattr(EventFileWriter, "_write", write)
    with pytest.raises(OSError):
        writer.add_event(Event(step=2).SerializeToString())
    monkeypatch.undo()  # the disk has room again, yet...
    with pytest.raises(OSError):  # ...no append after what may be a partial record
        writer.add_event(Event(step=3).SerializeToString())
    with pytest.raises(OSError):
        writer.flush()
    assert [e.step for e in events(writer.path)] == [0, 1]
    writer.close()  # releases the file without writing
    assert writer._file.closed


def test_a_failed_header_write_leaves_no_file_and_no_open_handle(tmp_path, monkeypatch):
    def write(self, data):
        raise OSError(28, "No space left on device")

    def open_here() -> list[str]:
        fds = "/proc/self/fd"
        found = []
        for fd in os.listdir(fds):
            try:
                target = os.readlink(os.path.join(fds, fd))
            except OSError:  # the listing's own descriptor, already closed
                continue
            if target.startswith(str(tmp_path)):
                found.append(target)
        return found

    monkeypatch.setattr(EventFileWriter, "_write", write)
    for _ in range(3):  # each reopen attempt of the sink
        with pytest.raises(OSError, match="No space left"):
            EventFileWriter(str(tmp_path))
    assert os.listdir(tmp_path) == [] and open_here() == []
