"""``rl-otel watch``'s parts: TFRecord tailing (truncated records wait, corrupt ones are skipped and counted),
Event scalars, JSONL lines, runs and ranks from paths, the state file, the framework."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import pytest

from rl_otel.sinks.tfevents import record
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


def test_a_jsonl_line_without_its_newline_waits(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"step": 0, "x": 1}\n{"step": 1, "x"')
    tail = jsonl.LineTail(str(path))
    assert tail.read(path.stat().st_size).lines == [b'{"step": 0, "x": 1}']
    assert tail.read(path.stat().st_size).lines == []
    with open(path, "ab") as f:
        f.write(b': 2}\n')
    assert tail.read(path.stat().st_size).lines == [b'{"step": 1, "x": 2}']


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
    (run / "metrics.jsonl").write_text('{"step": 0, "loss": 1}\nnot json\n')
    w = ThreadedWatcher([str(tmp_path / "runs")], framework="verl")
    try:
        url = w.url("exp")
        wait_for(lambda: served(url, "rl_telemetry_errors_total", sink="watch", reason="corrupt_record") == 2,
                 what="two corrupt records counted")
        assert served(url, "rl_critic_score", stat="mean") == 0.5  # step 2's value: step 3 was corrupt
        assert served(url, "target_info", rl_framework="verl") == 1.0
    finally:
        w.close()


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
