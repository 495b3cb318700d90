"""``rl-otel watch``'s parts: TFRecord tailing (truncated records wait, corrupt ones are skipped and counted),
Event scalars, JSONL lines, runs and ranks from paths, the state file, the framework."""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import sys
import threading

import pytest

from rl_otel._internal import tfrecord
from rl_otel._internal.tfrecord import encode as record
from rl_otel.watch import events, frameworks, jsonl, scan, state
from rl_otel.watch.records import RecordTail
from tests.test_watch_support import ThreadedWatcher, served, wait_for

pytest.importorskip("tensorboard")
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2


def _event(step: int, **values: float) -> bytes:
    e = event_pb2.Event(step=step, wall_time=1_700_000_000.0 + step)
    for tag, v in values.items():
        e.summary.value.add(tag=tag.replace("__", "/"), simple_value=v)
    return e.SerializeToString()


def _file(path, *events_: bytes) -> bytes:
    data = record(event_pb2.Event(file_version="brain.Event:2").SerializeToString()) + b"".join(
        record(e) for e in events_)
    path.write_bytes(data)
    return data


@pytest.mark.slow
def test_a_truncated_trailing_record_waits_for_the_rest_at_every_cut(tmp_path):
    """Every prefix of a real event file gives exactly its complete records, none counted corrupt; the rest
    follows once written, from the saved offset."""
    full = _file(tmp_path / "whole", *(_event(s, critic__score__mean=s / 10) for s in range(4)))
    ends = []  # where each record ends
    pos = 0
    while pos < len(full):
        (length,) = struct.unpack_from("<Q", full, pos)
        pos += 16 + length
        ends.append(pos)
    path = tmp_path / "events.out.tfevents.1.host"
    for cut in range(len(full) + 1):
        path.write_bytes(full[:cut])
        tail = RecordTail(str(path))
        batch = tail.read(cut)
        assert batch.corrupt == 0
        assert len(batch.records) == sum(e <= cut for e in ends)
        assert tail.offset == max([e for e in ends if e <= cut], default=0)
        path.write_bytes(full)  # the writer finishes: the resumed tail reads the rest
        rest = tail.read(len(full))
        assert len(batch.records) + len(rest.records) == len(ends) and rest.corrupt == 0


def test_a_corrupt_record_is_skipped_and_counted_and_the_next_ones_are_read(tmp_path):
    good = [_event(s, loss=float(s)) for s in range(5)]
    data = bytearray(_file(tmp_path / "a", *good))
    first = 16 + len(event_pb2.Event(file_version="brain.Event:2").SerializeToString())
    second = first + 16 + len(good[0])
    data[first + 12 + 3] ^= 0xFF  # the data of step 0: its CRC fails
    data[second + 2] ^= 0x01  # the length of step 1: its header CRC fails, the reader finds step 2's header
    path = tmp_path / "events.out.tfevents.2.host"
    path.write_bytes(bytes(data))
    batch = RecordTail(str(path)).read(len(data))
    steps = [events.scalars(r)[0] for r in batch.records if events.scalars(r)]
    assert steps == [2, 3, 4]
    assert batch.corrupt == 2


def test_tensor_scalars_of_every_numeric_dtype_are_read():
    """TF2's tf.summary.scalar writes a scalar tensor (float_val, double_val, int64_val or tensor_content)."""
    e = event_pb2.Event(step=7, wall_time=5.0)
    e.summary.value.add(tag="a", tensor=tensor_pb2.TensorProto(dtype=1, float_val=[0.25]))
    e.summary.value.add(tag="b", tensor=tensor_pb2.TensorProto(dtype=2, double_val=[0.125]))
    e.summary.value.add(tag="c", tensor=tensor_pb2.TensorProto(dtype=9, int64_val=[42]))
    e.summary.value.add(tag="d", tensor=tensor_pb2.TensorProto(dtype=2, tensor_content=struct.pack("<d", 1.5)))
    e.summary.value.add(tag="text", tensor=tensor_pb2.TensorProto(dtype=7, string_val=[b"hi"]))
    e.summary.value.add(tag="vec", tensor=tensor_pb2.TensorProto(dtype=1, float_val=[1.0, 2.0]))
    e.summary.value.add(tag="img", image=summary_pb2.Summary.Image(height=1))
    assert events.scalars(e.SerializeToString()) == (7, 5.0, {"a": 0.25, "b": 0.125, "c": 42.0, "d": 1.5})


def test_jsonl_lines_nested_keys_step_and_time_fields():
    step, ts, values = jsonl.parse(json.dumps({"step": 3, "timestamp": 12.5, "reward": {"mean": 0.5},
                                               "loss": 1, "name": "x", "dist": [1, 2], "gone": None}).encode())
    assert (step, ts) == (3, 12.5)
    assert values == {"reward/mean": 0.5, "loss": 1, "dist": [1, 2], "gone": None}
    assert jsonl.parse(b'{"_step": 4, "x": 1}')[0] == 4
    assert jsonl.parse(b"  \n") is None
    with pytest.raises(ValueError):
        jsonl.parse(b"[1, 2]")
    with pytest.raises(ValueError):
        jsonl.parse(b'{"step": 1, "x": ')
    with pytest.raises(RecursionError):  # nested deeper than the interpreter recurses (the watcher: corrupt)
        jsonl.parse(b"[" * 100_000)


def test_a_jsonl_line_without_its_newline_waits(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"step": 0, "x": 1}\n{"step": 1, "x"')
    tail = jsonl.LineTail(str(path))
    assert tail.read(path.stat().st_size).records == [b'{"step": 0, "x": 1}']
    assert tail.read(path.stat().st_size).records == []
    with open(path, "ab") as f:
        f.write(b': 2}\n')
    assert tail.read(path.stat().st_size).records == [b'{"step": 1, "x": 2}']


def _drain(tail, path):
    """Read ``path`` with ``tail`` as the watcher does (again at once while ``more``); its lines or records and
    the corrupt count."""
    got, corrupt = [], 0
    while True:
        found = tail.read(os.path.getsize(path))
        got += found.records
        corrupt += found.corrupt
        if not found.more:
            return got, corrupt


def test_a_partial_jsonl_line_rewritten_shorter_is_read_again(tmp_path):
    """The tail remembers that a partial last line holds no newline (so it is not read again at each poll); a
    writer that rewrites that line shorter (the file shrinks below what was looked at) is read from the line's
    start again, not from where the old line's bytes ended."""
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"step": 0, "x": 1}\n{"step": 1, "x": 2, "y"')
    tail = jsonl.LineTail(str(path))
    assert tail.read(path.stat().st_size).records == [b'{"step": 0, "x": 1}']
    path.write_bytes(b'{"step": 0, "x": 1}\n{"step": 1}\n')
    assert tail.read(path.stat().st_size).records == [b'{"step": 1}']


@pytest.mark.slow
@pytest.mark.parametrize("megabytes", [9, 17])
def test_a_long_jsonl_line_never_stalls_its_file(tmp_path, megabytes):
    """A line longer than a read (8 MB) is read whole up to MAX_LINE (16 MB), a longer one skipped and counted
    once; the 2,000 lines after it are read either way. Before: a line over 8 MB stalled the file for good, nothing
    after it read, nothing counted."""
    path = tmp_path / "m.jsonl"
    long_line = json.dumps({"step": 1, "dist": [0.5] * (megabytes * 2**20 // 5)}).encode()
    assert len(long_line) > jsonl.CHUNK and (len(long_line) > jsonl.MAX_LINE) == (megabytes > 16)
    after = [json.dumps({"step": s, "loss": s / 10}).encode() for s in range(2, 2002)]
    path.write_bytes(b'{"step": 0, "loss": 1}\n' + long_line + b"\n" + b"\n".join(after) + b"\n")
    lines, corrupt = _drain(jsonl.LineTail(str(path)), path)
    kept = megabytes <= 16
    assert lines == [b'{"step": 0, "loss": 1}', *([long_line] if kept else []), *after]
    assert corrupt == (0 if kept else 1)


def test_an_overlong_jsonl_line_is_skipped_as_it_grows_without_reading_it_again_or_holding_it(tmp_path, monkeypatch):
    """A 40 MB line written 1 MB at a time, read after each write (a poll): every byte is read once, the line is
    counted once, as soon as it is over MAX_LINE, and never held whole; a restarted tail (a new watcher, the offset
    from the state file) goes on at the line's start, not in its middle."""
    import tracemalloc

    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"step": 0, "loss": 1}\n{"dist": [')
    tail = jsonl.LineTail(str(path))
    read = []
    real_read = jsonl._read
    monkeypatch.setattr(jsonl, "_read", lambda p, offset, n: read.append(n) or real_read(p, offset, n))
    lines, corrupt, counted_at = [], 0, None
    tracemalloc.start()
    try:
        with open(path, "ab") as f:
            for mb in range(40):
                f.write(b"0.5, " * (2**20 // 5))
                f.flush()
                got, bad = _drain(tail, path)
                lines += got
                corrupt += bad
                if bad and counted_at is None:
                    counted_at = mb + 1
            f.write(b'0.5]}\n{"step": 2, "loss": 0.5}\n')
        got, bad = _drain(tail, path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    lines += got
    corrupt += bad
    assert lines == [b'{"step": 0, "loss": 1}', b'{"step": 2, "loss": 0.5}'] and corrupt == 1
    assert counted_at == jsonl.MAX_LINE // 2**20 + 1  # counted as soon as it is known to be over the limit
    assert sum(read) <= path.stat().st_size + 2**20  # before: 8 MB read again at every poll
    assert peak < 3 * 2**20  # a 1 MB read at a time (before: up to 8 MB per poll); the 40 MB line never held

    restarted = jsonl.LineTail(str(path), offset=len(b'{"step": 0, "loss": 1}\n'))
    monkeypatch.setattr(jsonl, "_read", real_read)
    assert _drain(restarted, path) == ([b'{"step": 2, "loss": 0.5}'], 1)


def _header(length: int) -> bytes:
    head = struct.pack("<Q", length)
    return head + struct.pack("<I", tfrecord.masked_crc32c(head))


@pytest.mark.parametrize("length", [2**63, 2**40, 64 * 2**20 + 1])
def test_a_tfrecord_length_no_event_has_is_counted_and_the_records_after_it_read(tmp_path, length):
    """A header whose CRC holds but whose length no event has (over 64 MB; 2**63 never comes) is counted and the
    reader looks for the next valid header: the 2,000 events after it are read. Before: the file stalled for good,
    waiting for bytes that never come, nothing counted."""
    events_ = [_event(s, loss=s / 10) for s in range(2000)]
    path = tmp_path / "events.out.tfevents.4.host"
    path.write_bytes(record(events_[0]) + _header(length) + b"".join(record(e) for e in events_[1:]))
    records, corrupt = _drain(RecordTail(str(path)), path)
    assert records == events_ and corrupt == 1


def test_a_plausible_false_tfrecord_length_does_not_swallow_the_records_it_spans(tmp_path):
    """A header whose CRC holds, its length (1 MB) plausible but false: the complete records inside its span are
    read and the false header counted, at once (before: the reader waited for 1 MB more, at the file's end for
    good); and a record whose data CRC fails with a false length likewise does not hide the records after it."""
    events_ = [_event(s, loss=s / 10) for s in range(200)]
    path = tmp_path / "events.out.tfevents.5.host"
    path.write_bytes(_header(2**20) + b"".join(record(e) for e in events_))
    assert _drain(RecordTail(str(path)), path) == (events_, 1)

    rest = b"".join(record(e) for e in events_)
    path.write_bytes(_header(len(rest) // 2) + b"\0" * 4 + rest)  # the false record is complete, its data CRC bad
    assert _drain(RecordTail(str(path)), path) == (events_, 1)


def test_damage_longer_than_a_read_is_counted_once_and_skipped_once(tmp_path):
    """Garbage over many reads is one corrupt record, its bytes looked through once (before: counted again at
    every read it spanned)."""
    path = tmp_path / "events.out.tfevents.6.host"
    events_ = [_event(s, loss=s / 10) for s in range(5)]
    garbage = bytes(random.Random(0).getrandbits(8) for _ in range(50_000))
    path.write_bytes(record(events_[0]) + garbage + b"".join(record(e) for e in events_[1:]))
    tail = RecordTail(str(path))
    records, corrupt = [], 0
    while True:
        batch = tail.read(path.stat().st_size, chunk=4096)
        records += batch.records
        corrupt += batch.corrupt
        if not batch.more:
            break
    assert records == events_ and corrupt == 1


@pytest.mark.slow
def test_oversized_records_and_lines_are_counted_on_the_endpoint_and_what_follows_served(tmp_path):
    """``rl-otel watch`` end to end: a 17 MB JSONL line and an event with length 2**63 are each counted in
    ``rl_telemetry_errors_total{reason="corrupt_record"}``, and the 2,000 steps written after them served."""
    root = tmp_path / "runs"
    (root / "lines").mkdir(parents=True)
    (root / "events").mkdir()
    huge = json.dumps({"step": 0, "dist": [0.5] * (17 * 2**20 // 5)})
    (root / "lines" / "metrics.jsonl").write_text(
        huge + "\n" + "".join(json.dumps({"step": s, "loss": s / 10}) + "\n" for s in range(1, 2001)))
    (root / "events" / "events.out.tfevents.7.host").write_bytes(
        record(event_pb2.Event(file_version="brain.Event:2").SerializeToString()) + _header(2**63)
        + b"".join(record(_event(s, loss=s / 10)) for s in range(1, 2001)))
    w = ThreadedWatcher([str(root)])
    try:
        for run in ("lines", "events"):
            url = w.url(run)
            wait_for(lambda u=url: served(u, "rl_step") == 2000.0, what=f"{run}: the steps after the oversized one")
            assert served(url, "rl_telemetry_errors_total", sink="watch", reason="corrupt_record") == 1.0
    finally:
        w.close()


def _steps_in(directory) -> list[int]:
    """The steps of the scalar events in the one event file under ``directory``, as the watcher reads it now."""
    (path,) = directory.glob("events.out.tfevents.*")
    records, _ = _drain(RecordTail(str(path)), path)
    return [found[0] for found in map(events.scalars, records) if found]


@pytest.mark.slow
def test_tensorboardx_flush_writes_only_what_its_thread_took_and_flush_secs_or_close_write_the_rest(tmp_path):
    """What docs/watch.md says of tensorboardX (AReaL's writer), held against the installed version:
    ``add_scalar`` queues the event (``max_queue``, 10) for the writer's thread, which writes it into the file's
    buffer; ``flush()`` flushes that buffer only, so events the thread has not taken yet stay out of the file; the
    thread flushes its buffer every ``flush_secs`` (120 s by default); a later ``flush()``, ``close()``, or a short
    ``flush_secs`` bring the rest. (torch's SummaryWriter.flush() waits for its queue.)"""
    tbx = pytest.importorskip("tensorboardX")
    taken = threading.Event()
    writer = tbx.SummaryWriter(str(tmp_path / "a"), flush_secs=3600)
    # private: the EventsWriter the writer's thread writes with, held back as a busy process holds its thread back
    events_writer = writer._get_file_writer().event_writer._ev_writer
    real, written = events_writer.write_event, []
    events_writer.write_event = lambda e: (taken.wait(), real(e), written.append(e.step))
    try:
        for step in range(5):
            writer.add_scalar("loss", step / 10, step)
        writer.flush()
        assert _steps_in(tmp_path / "a") == []  # flush() returned; the thread had taken none of them
        taken.set()
        wait_for(lambda: len(written) == 5, what="the writer's thread wrote the five events")
        assert _steps_in(tmp_path / "a") == []  # written into its buffer, which it flushes flush_secs after the last
        writer.flush()
        assert _steps_in(tmp_path / "a") == [0, 1, 2, 3, 4]
    finally:
        taken.set()
        writer.close()

    short = tbx.SummaryWriter(str(tmp_path / "b"), flush_secs=1)  # no flush() called: the thread flushes each second
    closed = tbx.SummaryWriter(str(tmp_path / "c"), flush_secs=3600)
    for step in range(5):
        short.add_scalar("loss", step / 10, step)
        closed.add_scalar("loss", step / 10, step)
    wait_for(lambda: _steps_in(tmp_path / "b") == [0, 1, 2, 3, 4], what="flush_secs=1 wrote every event")
    closed.close()
    assert _steps_in(tmp_path / "c") == [0, 1, 2, 3, 4]
    short.close()


@pytest.mark.parametrize(("rel", "run", "rank"), [
    ("events.out.tfevents.1.h", "root", 0),                 # files in the root: the root's own name
    ("exp1/events.out.tfevents.1.h", "exp1", 0),             # TensorBoard's run: the directory, relative
    ("exp1/train/events.out.tfevents.1.h", "exp1/train", 0),
    ("exp1/rank_3/events.out.tfevents.1.h", "exp1", 3),      # a rank directory is the rank, not the run
    ("exp1/rank-2/metrics.jsonl", "exp1", 2),
    ("exp1/rank12/metrics.jsonl", "exp1", 12),
    ("exp1/metrics_rank5.jsonl", "exp1", 5),                 # a rank part of the file name
    ("exp1/events.out.tfevents.1.h.rank_4", "exp1", 4),
    ("exp1/franky/metrics.jsonl", "exp1/franky", 0),         # "rank" inside a word is no rank
])
def test_runs_and_ranks_from_paths(tmp_path, rel, run, rank):
    root = tmp_path / "root"
    path = root / rel
    path.parent.mkdir(parents=True)
    path.write_bytes(b"")
    (found,) = scan.scan([str(root)])
    assert (found.run, found.rank) == (run, rank)
    assert found.kind == ("jsonl" if rel.endswith(".jsonl") else "tfevents")


def test_the_state_file_is_replaced_atomically_and_a_bad_one_starts_afresh(tmp_path):
    path = tmp_path / "d" / "state.json"
    s = state.State()
    s.files["/x"] = state.FileState(10, 1, 2)
    s.runs[("r", 1)] = state.RunState("r", 1, "verl", 5, {"loss": [5, float("nan")]})
    assert state.save(s, path)
    assert os.listdir(path.parent) == ["state.json"]  # no temporary file left
    back = state.load(path)
    assert back.files["/x"].offset == 10 and back.runs[("r", 1)].step == 5
    path.write_text("{not json")
    assert state.load(path).files == {}
    assert state.default_path(["/a"]).name.startswith("watch-")


def test_framework_names_and_inference():
    from rl_otel.catalog import default_catalog

    assert frameworks.normalize("prime-rl") == "prime_rl"
    with pytest.raises(ValueError, match="unknown framework"):
        frameworks.normalize("nope")
    assert frameworks.infer(["actor/pg_loss", "critic/score/mean", "timing_s/gen", "actor/entropy"]) == "verl"
    assert frameworks.infer(["objective/kl", "objective/entropy", "ppo/loss/policy"]) == "trl"
    assert frameworks.infer(["my/own"]) == "unknown"
    # keys veRL and ROLL share say nothing of which it is: no guess (before: "roll", the first in the list, named a
    # veRL loop's run); one key of its own decides
    shared = ["actor/pg_loss", "critic/score/mean", "actor/kl_loss"]
    assert frameworks.infer(shared) == "unknown"
    assert frameworks.infer([*shared, "actor/ppo_kl"]) == "verl"
    assert frameworks.infer([*shared, "actor/approxkl"]) == "roll"
    # a key string two frameworks log resolves in the run's framework's catalog
    assert frameworks.catalog_for("unknown") is default_catalog()
    assert frameworks.catalog_for("slime") is default_catalog("slime")


def test_corrupt_records_are_counted_on_the_endpoint_and_the_good_ones_served(tmp_path):
    run = tmp_path / "runs" / "exp"
    run.mkdir(parents=True)
    good = [_event(s, critic__score__mean=s / 4) for s in range(4)]
    data = bytearray(_file(run / "x", *good))
    data[-5] ^= 0xFF  # the last record's data
    (run / "events.out.tfevents.3.host").write_bytes(bytes(data))
    (run / "metrics.jsonl").write_text('{"step": 0, "loss": 1}\nnot json\n' + "[" * 100_000 + "\n")
    w = ThreadedWatcher([str(tmp_path / "runs")], framework="verl")
    try:
        url = w.url("exp")
        wait_for(lambda: served(url, "rl_telemetry_errors_total", sink="watch", reason="corrupt_record") == 3,
                 what="three corrupt records counted (one event, a line no JSON, a line nested too deep)")
        assert served(url, "rl_critic_score", stat="mean") == 0.5  # step 2's value: step 3 was corrupt
        assert served(url, "target_info", rl_framework="verl") == 1.0
    finally:
        w.close()


@pytest.mark.slow
def test_a_run_whose_files_stop_growing_is_closed_with_expire_after_and_comes_back_when_they_grow(tmp_path):
    """``--expire-after``: a finished run leaves the scrape (its series go; the watcher's own target stays), as a
    finished training process does; a file that grows again starts the run anew."""
    run = tmp_path / "runs" / "exp"
    run.mkdir(parents=True)
    lines = run / "metrics.jsonl"
    lines.write_text('{"step": 0, "loss": 1.5}\n')
    sd = tmp_path / "sd"
    w = ThreadedWatcher([str(tmp_path / "runs")], expire_s=1.0, file_sd=str(sd))
    try:
        url = w.url("exp")
        assert served(url, "rl_step", run="exp") == 0.0 and len(list(sd.glob("*.json"))) == 1
        wait_for(lambda: ("exp", 0) not in w.watcher.targets(), what="the idle run closed")
        assert served(url, "rl_step", run="exp") is None
        assert len(list(sd.glob("*.json"))) == 1  # the watcher's target: every run is served there
        with lines.open("a") as f:
            f.write('{"step": 1, "loss": 1.25}\n')
        url = w.url("exp")
        wait_for(lambda: served(url, "rl_step") == 1.0, what="the run served again")
    finally:
        w.close()


def test_the_cli_parses_watch_and_backfill_and_refuses_a_bad_framework(tmp_path):
    from rl_otel.cli import _parser, main

    args = _parser().parse_args(["watch", "a", "b", "--port", "0", "--framework", "verl"])
    assert args.paths == ["a", "b"] and args.port == 0
    assert _parser().parse_args(["backfill", "a", "-o", "x.om"]).output == "x.om"
    assert main(["watch", str(tmp_path), "--framework", "nope", "--no-state"]) == 2
    assert main(["watch", str(tmp_path), "--expire-after", "0", "--no-state"]) == 2
    out = subprocess.run([sys.executable, "-m", "rl_otel.cli", "watch", "--help"], capture_output=True, text=True,
                         timeout=60)
    assert "--state" in out.stdout and out.returncode == 0
