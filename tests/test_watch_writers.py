"""``rl-otel watch``: two event files of one directory (two writers, or a run restarted into its log directory)
are two runs, not one whose series alternate between their values (issue 42, item 6)."""

from __future__ import annotations

import pytest

from rl_otel._internal.tfrecord import encode as record
from rl_otel.watch import scan
from tests.test_watch_support import ThreadedWatcher, served, wait_for

pytest.importorskip("tensorboard")
from tensorboard.compat.proto import event_pb2


def _write(path, values: dict[int, float]) -> None:
    events = [event_pb2.Event(file_version="brain.Event:2")]
    for step, value in values.items():
        e = event_pb2.Event(step=step, wall_time=1_700_000_000.0 + step)
        e.summary.value.add(tag="critic/score/mean", simple_value=value)
        events.append(e)
    path.write_bytes(b"".join(record(e.SerializeToString()) for e in events))


def test_the_later_of_two_event_files_of_one_directory_is_a_run_of_its_own(tmp_path):
    """The earliest file (by the time in its name) keeps the directory's run, a later one is ``<run>@<time>``,
    whichever order they are found in; files of different ranks, and a lone file, are left as they were (before:
    both files were run ``exp``, rank 0)."""
    exp = tmp_path / "root" / "exp"
    exp.mkdir(parents=True)
    later = exp / "events.out.tfevents.1700000500.host.222.0"
    later.write_bytes(b"")
    (exp / "events.out.tfevents.1700000000.host.111.0").write_bytes(b"")
    (exp / "events.out.tfevents.1700000900.host.rank_1").write_bytes(b"")  # rank 1's own file
    runs = sorted((f.run, f.rank, f.path.rsplit("/", 1)[1]) for f in scan.scan([str(tmp_path / "root")]))
    assert runs == [("exp", 0, "events.out.tfevents.1700000000.host.111.0"),
                    ("exp", 1, "events.out.tfevents.1700000900.host.rank_1"),
                    ("exp@1700000500", 0, "events.out.tfevents.1700000500.host.222.0")]
    assert scan.classify(str(later), str(tmp_path / "root")).run == "exp@1700000500"  # found alone, the same


@pytest.mark.slow
def test_two_writers_of_one_directory_are_served_as_two_runs_each_with_its_own_values(tmp_path):
    exp = tmp_path / "runs" / "exp"
    exp.mkdir(parents=True)
    _write(exp / "events.out.tfevents.1700000000.host.111.0", {0: 0.1, 1: 0.2, 2: 0.3})
    _write(exp / "events.out.tfevents.1700000500.host.222.0", {0: 0.9, 1: 0.8})
    w = ThreadedWatcher([str(tmp_path / "runs")], framework="verl")
    try:
        first, second = w.url("exp"), w.url("exp@1700000500")
        wait_for(lambda: served(first, "rl_critic_score", stat="mean", run="exp") == pytest.approx(0.3),
                 what="the first writer's last value")
        wait_for(lambda: served(second, "rl_critic_score", stat="mean", run="exp@1700000500") == pytest.approx(0.8),
                 what="the second writer's last value, under its own run")
        assert served(first, "rl_step", run="exp") == 2 and served(second, "rl_step", run="exp@1700000500") == 1
    finally:
        w.close()
