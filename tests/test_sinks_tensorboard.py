"""The TensorBoard sink, read back with TensorBoard's own EventAccumulator and event-file loader."""

from __future__ import annotations

import glob

import numpy as np
import pytest

pytest.importorskip("tensorboard")

from rl_otel.sinks.base import SinkError
from rl_otel.sinks.tensorboard import TensorBoardSink
from tests._readers import tensorboard_scalars


def test_every_key_step_and_value_read_back(tmp_path):
    sink = TensorBoardSink(run="r", log_dir=tmp_path)
    logged = {}
    for step in (0, 1, 5):
        metrics = {f"actor/k{i}": float(step * 100 + i) + 0.25 for i in range(20)}
        metrics["memory/actor_train/train_step/end/onload/allocated/0"] = 1.5 + step
        metrics["critic/loss"] = float("nan") if step == 5 else 0.5
        sink.log(metrics, step)
        logged[step] = metrics
    sink.close()
    scalars = tensorboard_scalars(str(tmp_path))
    assert set(scalars) == set(logged[0])
    for key, points in scalars.items():
        assert [s for s, _ in points] == [0, 1, 5]
        for step, value in points:
            want = logged[step][key]
            assert (np.isnan(value) and np.isnan(want)) or value == pytest.approx(want, rel=1e-6)


def test_one_event_per_step_not_one_per_scalar(tmp_path):
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    sink = TensorBoardSink(run="r", log_dir=tmp_path)
    for step in range(4):
        sink.log({f"k{i}": float(i) for i in range(50)}, step)
    sink.close()
    (path,) = glob.glob(str(tmp_path / "events.out.tfevents.*"))
    events = [e for e in EventFileLoader(path).Load() if e.HasField("summary")]
    assert [e.step for e in events] == [0, 1, 2, 3]
    assert all(len(e.summary.value) == 50 for e in events)


def test_distribution_is_a_tensorboard_histogram(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink = TensorBoardSink(run="r", log_dir=tmp_path, histogram_bins=10)
    values = np.array([0.0, 1.0, 2.0, 2.0, 3.0, np.nan])
    sink.log({"env/reward_dist": values, "x": 1.0}, 7)
    sink.close()
    acc = EventAccumulator(str(tmp_path), size_guidance={"histograms": 0})
    acc.Reload()
    (event,) = acc.Histograms("env/reward_dist")
    h = event.histogram_value
    assert event.step == 7
    assert (h.num, h.sum, h.min, h.max, h.sum_squares) == (5, 8.0, 0.0, 3.0, 18.0)
    assert sum(h.bucket) == 5 and len(h.bucket_limit) == 10


def test_default_log_dir_is_runs_slash_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sink = TensorBoardSink(run="exp1")
    sink.close()
    assert glob.glob(str(tmp_path / "runs" / "exp1" / "events.out.tfevents.*"))


def test_bad_kwargs_fail_with_the_name():
    with pytest.raises(ValueError, match="histogram_bins"):
        TensorBoardSink(run="r", log_dir="x", histogram_bins=0)
    with pytest.raises(TypeError):
        TensorBoardSink(run="r", log_dir="x", nonsense=1)


def test_histogram_buckets_are_np_histograms(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    values = np.random.default_rng(1).standard_normal(693)
    sink = TensorBoardSink(run="r", log_dir=tmp_path, histogram_bins=64)
    sink.log({"actor/ratio_dist": values}, 3)
    sink.close()
    acc = EventAccumulator(str(tmp_path), size_guidance={"histograms": 0})
    acc.Reload()
    (event,) = acc.Histograms("actor/ratio_dist")
    counts, edges = np.histogram(values, bins=64)
    assert list(event.histogram_value.bucket) == counts.tolist()
    assert list(event.histogram_value.bucket_limit) == edges[1:].tolist()


def test_a_failed_write_then_a_failed_reopen_then_recovery(tmp_path, monkeypatch):
    import errno
    import shutil

    from rl_otel._internal.trackers.bridge import error_reason
    from rl_otel.sinks.tfevents import EventFileWriter

    log_dir = tmp_path / "tb"
    sink = TensorBoardSink(run="r", log_dir=log_dir, flush_secs=0, reopen_secs=0)
    sink.log({"x": 0.0}, 0)
    real_write = EventFileWriter._write

    def full(writer, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(EventFileWriter, "_write", full)
    with pytest.raises(SinkError) as failed:
        sink.log({"x": 1.0}, 1)
    assert error_reason(failed.value) == "disk_full" and failed.value.steps == 1
    monkeypatch.setattr(EventFileWriter, "_write", real_write)
    shutil.move(str(log_dir), str(tmp_path / "kept"))
    log_dir.write_text("not a directory")  # the new event file cannot be opened
    with pytest.raises(OSError):
        sink.log({"x": 2.0}, 2)
    log_dir.unlink()
    sink.log({"x": 3.0}, 3)  # reopened: a new file in a new directory
    sink.close()
    assert [s for s, _ in tensorboard_scalars(str(tmp_path / "kept"))["x"]] == [0]
    assert [s for s, _ in tensorboard_scalars(str(log_dir))["x"]] == [3]


def test_a_full_disk_loses_only_the_steps_it_refused_each_counted_once(tmp_path, monkeypatch):
    """Each step is written as it is logged, so a full disk costs the steps logged while it is full, no earlier
    one: each raises once (counted once by the bridge), and the steps before are in the file."""
    import errno

    from rl_otel.sinks.tfevents import EventFileWriter

    sink = TensorBoardSink(run="r", log_dir=tmp_path / "tb", reopen_secs=0)
    for step in range(5):
        sink.log({"x": float(step)}, step)  # on disk, with no flush()

    def full(writer, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(EventFileWriter, "_write", full)
    failures = []
    for step in range(5, 25):
        with pytest.raises(Exception) as failed:
            sink.log({"x": float(step)}, step)
        failures.append(failed.value)
    assert all(getattr(f, "steps", 1) == 1 for f in failures) and len(failures) == 20
    assert failures[0].reason == "disk_full"
    sink.close()
    assert [s for s, _ in tensorboard_scalars(str(tmp_path / "tb"))["x"]] == list(range(5))


def test_a_missing_tracker_package_is_one_line_naming_the_extra_and_the_command_from_a_checkout(monkeypatch,
                                                                                                 tmp_path):
    """rl_otel is installed from its checkout (not published): the error names the extra and the command that
    works from the checkout, in one line, raised from init() without the frames that found the package missing
    (before: ``pip install 'rl-otel[tensorboard]'``, which looks for a published package, under a 30-line
    traceback)."""
    import sys

    import rl_otel
    from rl_otel.errors import MissingExtraError

    for name in ("tensorboard.compat.proto.event_pb2", "tensorboard.compat.proto.summary_pb2"):
        monkeypatch.setitem(sys.modules, name, None)  # what an environment without tensorboard imports
    with pytest.raises(MissingExtraError) as caught:
        rl_otel.init(run="x", prometheus=False, trackers={"tensorboard": {"log_dir": str(tmp_path)}})
    message = str(caught.value)
    assert "\n" not in message and "extra [tensorboard]" in message, message
    assert "pip install -e '.[tensorboard]' in the rl_otel checkout" in message and "rl-otel[" not in message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    assert [entry.name for entry in caught.traceback] == [caught.traceback[0].name, "init"]  # the caller, init()
