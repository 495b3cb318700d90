"""Telemetry.submit(): statistics computed on the metrics worker, in order, never lost, never stale, never fatal."""

from __future__ import annotations

import logging
import os
import select
import signal
import threading

import pytest
import torch

import rl_otel
from rl_otel import ConfigurationError
from rl_otel._internal.pipeline.worker import Worker, caller_streams, on_streams
from rl_otel.stats import ppo_stats
from tests._sinks import Recorder, tel_errors
from tests.test_telemetry import value


@pytest.fixture
def rec_tel():
    t = rl_otel.init(run="test", rank=0, prometheus={"host": "127.0.0.1", "port": 0}, trackers=["recorder"],
                     handle_sigterm=False)
    yield t, Recorder.instances[-1]
    t.close()


def test_submit_runs_off_the_caller_thread_and_a_scrape_right_after_sees_the_step(tel):
    threads = []

    def stats(x):
        threads.append(threading.current_thread().name)
        return {"critic/score/mean": float(x.mean()), "actor/approxkl": float(x.max())}

    future = tel.submit(stats, torch.tensor([0.25, 0.75]), step=7)
    # no flush: the scrape itself waits for the jobs submitted before it
    assert value(tel, "rl_critic_score", stat="mean") == 0.5
    assert value(tel, "rl_actor_approx_kl") == 0.75
    assert value(tel, "rl_step") == 7
    assert threads == ["rl_otel-metrics"]
    assert future.result(timeout=5) == {"critic/score/mean": 0.5, "actor/approxkl": 0.75}
    assert tel.step == 7


def test_ppo_stats_submitted_equals_ppo_stats_computed_inline(tel):
    g = torch.Generator().manual_seed(0)
    lp, old = torch.randn(8, 5, generator=g), torch.randn(8, 5, generator=g)
    mask = (torch.rand(8, 5, generator=g) > 0.2).float()
    adv = torch.randn(8, 5, generator=g)
    kwargs = {"log_probs": lp, "old_log_probs": old, "response_mask": mask, "advantages": adv, "catalog": tel.catalog}
    inline = ppo_stats(**kwargs)
    submitted = tel.submit(ppo_stats, step=2, **kwargs).result(timeout=10)
    assert submitted == inline and len(inline) > 5
    assert value(tel, "rl_actor_approx_kl") == pytest.approx(inline["actor/approxkl"])
    assert value(tel, "rl_actor_importance_ratio", stat="max") == pytest.approx(inline["actor/ratio_max"])
    assert value(tel, "rl_step") == 2


def test_a_log_behind_pending_jobs_keeps_call_order_and_its_values(rec_tel):
    tel, rec = rec_tel
    gate = threading.Event()

    def slow():
        gate.wait(10)
        return {"critic/score/mean": 1.0}

    tel.submit(slow, step=1)
    buffer = torch.tensor([1.0, 2.0, 3.0])
    tel.log({"critic/score/mean": 2.0, "actor/ratio_dist": buffer}, step=2)  # queued behind the slow job
    buffer.fill_(100.0)  # the caller reuses its buffer once log() returned
    gate.set()
    assert tel.flush(10)
    assert [step for step, _ in rec.steps] == [1, 2]
    assert rec.steps[1][1]["critic/score/mean"] == 2.0
    assert rec.steps[1][1]["actor/ratio_dist"].tolist() == [1.0, 2.0, 3.0]
    assert value(tel, "rl_critic_score", stat="mean") == 2.0 and value(tel, "rl_step") == 2


def test_phase_metrics_reach_the_trackers_at_the_step_they_were_submitted_with(rec_tel):
    tel, rec = rec_tel
    with tel.phase("actor_train", "train_step", step=0):
        pass
    gate = threading.Event()
    tel.submit(lambda: gate.wait(10) and {"critic/score/mean": 0.1}, step=0)
    with tel.phase("actor_train", "train_step", step=1):  # ends while step 0 is still computing
        pass
    gate.set()
    tel.submit(lambda: {"critic/score/mean": 0.2}, step=1)
    assert tel.flush(10)
    assert [step for step, _ in rec.steps] == [0, 1]
    assert all("time/actor_train/train_step/total" in metrics for _, metrics in rec.steps)


def test_a_failing_function_is_counted_never_raised(tel, caplog):
    def broken(x):
        raise ValueError(f"bad batch {x}")

    with caplog.at_level(logging.WARNING, logger="rl_otel"):
        first = tel.submit(broken, 1, step=1)
        second = tel.submit(broken, 2, step=2)
        ok = tel.submit(lambda: {"critic/score/mean": 0.3}, step=3)
        assert ok.result(timeout=10) == {"critic/score/mean": 0.3}
    assert isinstance(first.exception(timeout=5), ValueError) and isinstance(second.exception(), ValueError)
    assert tel_errors(tel)[("submit", "exception")] == 2
    assert sum("broken raised ValueError" in r.getMessage() for r in caplog.records) == 1  # once per function
    assert value(tel, "rl_critic_score", stat="mean") == 0.3


@pytest.mark.parametrize("fn, reason", [(lambda: [1.0, 2.0], "returned list"), (42, "takes a function")])
def test_a_non_dict_result_or_a_non_function_is_a_bad_value(tel, caplog, fn, reason):
    with caplog.at_level(logging.WARNING, logger="rl_otel"):
        future = tel.submit(fn, step=1)
        assert isinstance(future.exception(timeout=5), TypeError)
    assert tel_errors(tel)[("input", "bad_value")] == 1
    assert any(reason in r.getMessage() for r in caplog.records)


def test_close_runs_every_queued_job_first_and_later_submits_are_refused(tmp_path):
    tel = rl_otel.init(run="test", prometheus=False, trackers=["recorder"], handle_sigterm=False)
    rec = Recorder.instances[-1]
    gate = threading.Event()
    tel.submit(lambda: gate.wait(10) and {"critic/score/mean": 0.0}, step=0)
    for step in range(1, 4):
        tel.submit(lambda s=step: {"critic/score/mean": float(s)}, step=step)
    threading.Timer(0.2, gate.set).start()
    tel.close()
    assert [step for step, _ in rec.steps] == [0, 1, 2, 3]
    late = tel.submit(lambda: {"critic/score/mean": 9.0}, step=4)  # never raises
    assert isinstance(late.exception(timeout=1), RuntimeError)
    assert not any(t.name == "rl_otel-metrics" and t.is_alive() for t in threading.enumerate())


@pytest.mark.slow
def test_a_stuck_job_makes_the_producer_drop_the_oldest_after_the_timeout(tmp_path):
    tel = rl_otel.init(run="test", prometheus={"host": "127.0.0.1", "port": 0}, submit_queue_size=1,
                       close_timeout_s=0.3, handle_sigterm=False)
    gate = threading.Event()
    try:
        running = tel.submit(lambda: gate.wait(30) and {"critic/score/mean": 0.0}, step=0)  # the worker holds it
        tel.flush(0.1)
        queued = tel.submit(lambda: {"critic/score/mean": 1.0}, step=1)  # fills the queue
        latest = tel.submit(lambda: {"critic/score/mean": 2.0}, step=2)  # waits 0.3 s, then drops step 1
        assert isinstance(queued.exception(timeout=5), RuntimeError)
        assert tel_errors(tel)[("submit", "queue_full")] == 1
        gate.set()
        assert latest.result(timeout=10) and running.result(timeout=10) is not None
        assert value(tel, "rl_critic_score", stat="mean") == 2.0
    finally:
        gate.set()
        tel.close()


@pytest.mark.slow
def test_a_scrape_during_a_stuck_job_serves_what_is_stored(tel):
    tel.log({"critic/score/mean": 0.5}, step=0)
    gate = threading.Event()
    tel.submit(lambda: gate.wait(30) and {"critic/score/mean": 0.9}, step=1)
    try:
        assert value(tel, "rl_critic_score", stat="mean") == 0.5  # after the bounded wait, not a hang
    finally:
        gate.set()
    assert tel.flush(10) and value(tel, "rl_critic_score", stat="mean") == 0.9


def test_no_worker_thread_until_the_first_submit(tel):
    assert not any(t.name == "rl_otel-metrics" for t in threading.enumerate())
    tel.log({"critic/score/mean": 0.5}, step=0)
    assert not any(t.name == "rl_otel-metrics" for t in threading.enumerate())
    tel.submit(lambda: {}, step=1).result(timeout=5)
    assert any(t.name == "rl_otel-metrics" for t in threading.enumerate())


@pytest.mark.parametrize("bad", [0, -1, True, 2.5])
def test_bad_submit_queue_size_fails_at_init(bad):
    with pytest.raises(ConfigurationError, match="submit_queue_size must be a positive int"):
        rl_otel.init(run="t", prometheus=False, submit_queue_size=bad)


def test_a_job_that_reads_the_store_does_not_wait_for_itself(tel):
    def reads():
        return {"critic/score/mean": float(tel.value("rl_step") or 0.0) + 1.0}

    assert tel.submit(reads, step=1).result(timeout=5) == {"critic/score/mean": 1.0}


def test_worker_flush_counts_dropped_jobs_as_finished():
    errors = []
    worker = Worker(name="t", queue_size=1, timeout_s=0.05, on_error=errors.append)
    gate = threading.Event()
    dropped = []
    worker.submit(lambda: gate.wait(10))
    assert not worker.flush(0.05)  # the job in progress is now older than timeout_s: hung
    worker.submit(lambda: None, on_drop=lambda: dropped.append(1))  # counted once as a hung call
    worker.submit(lambda: None)  # full, and the call in progress is hung: the queued one is dropped at once
    assert errors == ["timeout", "queue_full"] and dropped == [1]
    gate.set()
    assert worker.flush(5) and not worker.pending
    assert worker.close(5)
    assert not worker.submit(lambda: None)


def test_a_full_queue_makes_the_producer_wait_for_room_not_drop():
    """Backpressure: with room coming before timeout_s, a producer of a full queue waits and nothing is lost."""
    errors, ran = [], []
    worker = Worker(name="t", queue_size=1, timeout_s=30, on_error=errors.append)
    gate = threading.Event()
    worker.submit(lambda: gate.wait(30))
    worker.submit(lambda: ran.append(1))  # fills the queue
    timer = threading.Timer(0.2, gate.set)  # room comes later (or at once, on a loaded machine: the same result)
    timer.start()
    assert worker.submit(lambda: ran.append(2))  # waits for room instead of dropping job 1
    assert worker.flush(30) and ran == [1, 2] and errors == []
    assert worker.close(30)
    timer.join()


def test_close_abandons_a_stuck_worker_at_its_deadline_and_drops_what_is_queued():
    errors, dropped = [], []
    worker = Worker(name="t", queue_size=4, timeout_s=30, on_error=errors.append)
    gate = threading.Event()
    try:
        worker.submit(lambda: gate.wait(30))
        worker.submit(lambda: None, on_drop=lambda: dropped.append(1))
        assert worker.close(0.05) is False and dropped == [1] and errors == ["close_timeout"]
        assert worker.close(0.0) is False and errors == ["close_timeout"]  # counted once
        assert worker.submit(lambda: None) is False
    finally:
        gate.set()


def test_flush_runs_the_hook_after_the_items_before_it_and_close_runs_on_close():
    calls = []
    worker = Worker(name="t", queue_size=8, timeout_s=30, on_error=calls.append, handle=calls.append,
                    when_full="drop_oldest", on_flush=lambda: calls.append("flush"),
                    on_close=lambda: calls.append("close"))
    assert worker.flush(1) and calls == []  # nothing submitted: no thread, no hook
    for i in range(3):
        worker.submit(i)
    assert worker.flush(30) and calls == [0, 1, 2, "flush"]
    assert worker.close(30) and calls == [0, 1, 2, "flush", "close"]
    assert worker.flush(1)  # after close: nothing left to wait for


def test_close_without_any_item_still_runs_on_close_within_the_deadline():
    closed = []
    worker = Worker(name="t", queue_size=1, timeout_s=30, on_error=closed.append, when_full="drop_oldest",
                    on_close=lambda: closed.append("close"))
    assert worker.close(30) and closed == ["close"]


class _CudaLooking(torch.Tensor):
    """A CPU tensor that says it is on a GPU: the torch.cuda boundary is faked around it."""

    @property
    def is_cuda(self):
        return True


def test_cuda_jobs_run_on_the_callers_stream(monkeypatch):
    calls = []

    class Ctx:
        def __init__(self, what):
            self.what = what

        def __enter__(self):
            calls.append((threading.current_thread().name, "enter", self.what))

        def __exit__(self, *exc):
            calls.append((threading.current_thread().name, "exit", self.what))

    class Stream:
        device = "cuda:3"

    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: calls.append(("stream_of", device)) or Stream())
    monkeypatch.setattr(torch.cuda, "device", lambda d: Ctx(("device", d)))
    monkeypatch.setattr(torch.cuda, "stream", lambda s: Ctx(("stream", s.device)))
    tensor = torch.zeros(3).as_subclass(_CudaLooking)
    streams = caller_streams([tensor, 1.0, "x"])
    assert len(streams) == 1 and calls == [("stream_of", tensor.device)]
    calls.clear()
    with on_streams(streams):
        calls.append("body")
    assert [c if c == "body" else c[1:] for c in calls] == [
        ("enter", ("device", "cuda:3")), ("enter", ("stream", "cuda:3")), "body", ("exit", ("stream", "cuda:3")),
        ("exit", ("device", "cuda:3"))]


def test_cpu_tensors_never_touch_torch_cuda(monkeypatch):
    def boom(*a):
        raise AssertionError("torch.cuda was called for CPU tensors")

    monkeypatch.setattr(torch.cuda, "current_stream", boom)
    monkeypatch.setattr(torch.cuda, "stream", boom)
    assert caller_streams([torch.zeros(2), {"a": 1}]) == ()
    with on_streams(()):
        pass


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX-only")
def test_a_forked_child_gets_a_fresh_worker(tel):
    gate = threading.Event()
    tel.submit(lambda: gate.wait(10) and {"critic/score/mean": 0.1}, step=0)  # the parent's job, pending
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own jobs run on its own thread, the parent's pending one is not waited for
        try:
            ok = tel.submit(lambda: {"critic/score/mean": 0.7}, step=1).result(timeout=10) == {"critic/score/mean": 0.7}
            ok = ok and tel.flush(10) and tel.value("critic/score/mean") == 0.7
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    try:
        answered, _, _ = select.select([read], [], [], 30)  # a child stuck on the parent's dead thread: fail
        assert answered and os.read(read, 1) == b"1"
    finally:
        os.close(read)
        if not answered:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        gate.set()
    assert tel.flush(10) and value(tel, "rl_critic_score", stat="mean") == 0.1


def test_a_bug_inside_log_is_counted_inline_and_when_queued(tel, monkeypatch, caplog):
    """log() itself failing drops the step - counted once per call, never raised - whether it ran inline or
    queued behind a submitted job on the metrics worker."""
    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the write path")

    from rl_otel._internal.pipeline.ingest import Ingest

    monkeypatch.setattr(Ingest, "route", broken)  # the one path of a step, inline or queued
    with caplog.at_level(logging.WARNING, logger="rl_otel"):
        tel.log({"critic/score/mean": 0.5}, step=0)  # inline
        gate = threading.Event()
        tel.submit(lambda: gate.wait(10) and {}, step=1)
        tel.log({"critic/score/mean": 0.6}, step=2)  # queued behind the job
        gate.set()
        assert tel.flush(10)
    assert tel_errors(tel)[("input", "internal")] == 2
    assert sum("log() failed internally" in r.getMessage() for r in caplog.records) == 1
