"""A ``TrainerCallback`` for TRL's trainers (GRPO, RLOO, DPO, SFT, ...) and transformers' ``Trainer``: what the
trainer logs - every step, the final summary, ``evaluate()`` - is served to Prometheus from every rank::

    from rl_otel.integrations.transformers import RLOtelCallback

    rl_otel_cb = RLOtelCallback(prometheus={"port": 9464})
    trainer = GRPOTrainer(model=..., args=..., reward_funcs=..., train_dataset=..., callbacks=[rl_otel_cb])
    trainer.train()
    trainer.evaluate()     # eval_* keys, still served
    rl_otel_cb.close()     # optional: the endpoint also closes at exit or when the callback is garbage-collected

Pass it in ``callbacks=[...]``: ``trainer.add_callback()`` puts it after transformers' ``PrinterCallback``, which
pops ``total_flos`` from the shared logs dict first. Each ``on_log`` is logged at ``state.global_step``; TRL's
keys (``rewards/{func}/mean``, ``kl``, ``clip_ratio/...``, ``eval_*``) resolve through the catalog, transformers'
own (``loss``, ``learning_rate``, ``train_runtime``) too. The run is ``run`` if given, else
``TrainingArguments.run_name``, else ``$RL_OTEL_RUN``; with none of them (transformers 5 leaves ``run_name``
``None``) the ranks of a launch share ``<output_dir name>-<hash of the launch>``, a label no other launch gets
(:func:`rl_otel.integrations.launch_run_name`), and a single process gets :func:`rl_otel.init`'s timestamp.

- **Several processes** (``torchrun``, ``accelerate launch``): every rank serves its own endpoint on the port +
  ``LOCAL_RANK`` (9464, 9465, ... on a host), with its series labelled ``rank``; rank 0 alone mirrors to the
  trackers (``tracker_ranks=`` changes it), the others have no tracker sink.
- **Mistakes and taken ports**: the options are checked when the callback is built (a misspelled option raises
  there, before the model is loaded). A taken port is served on a free one further on (in steps of
  ``LOCAL_WORLD_SIZE``: the other ranks keep theirs), named in a warning; no hook raises.
- **Lifetime**: the endpoint starts at ``on_train_begin`` (or the first ``on_log``, for an ``evaluate()`` before
  training) and outlives ``train()``: the summary and a later ``evaluate()`` are served. ``on_train_end`` flushes
  the trackers. The Telemetry closes at :meth:`RLOtelCallback.close`, when the callback is garbage-collected (the
  trainer deleted), at process exit, or when another ``RLOtelCallback`` of this process starts training after
  this one's ended (the newest training gets the port). A ``train()`` that starts below the step already served
  (training again from scratch) starts a fresh Telemetry, since rl_otel keeps steps from going back.
- **None values**: TRL logs ``None`` for a window whose values were all NaN (a reward function returning None
  for every sample): the series is removed from the endpoint until a value comes back, not left at its last
  value (see :meth:`rl_otel.Telemetry.log`).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import TYPE_CHECKING, Any

from rl_otel.sinks.base import missing_dependency

try:
    from transformers import TrainerCallback
except ImportError as e:
    raise missing_dependency("transformers", "transformers") from e

from rl_otel.integrations import check_options, telemetry_from_options

if TYPE_CHECKING:
    from rl_otel.telemetry import Telemetry

_log = logging.getLogger("rl_otel")

# callbacks whose training ended while their owned Telemetry still serves (for an evaluate() or the summary): a
# callback of this process that starts training closes them first, so a new trainer gets the port
_ended: weakref.WeakSet[RLOtelCallback] = weakref.WeakSet()
_ended_lock = threading.Lock()


class RLOtelCallback(TrainerCallback):
    """Logs every ``on_log`` at ``state.global_step`` into a :class:`rl_otel.Telemetry` (see the module doc).

    Pass ``telemetry=`` to log into a Telemetry you own: the callback never closes nor replaces it. Otherwise
    ``options`` are :func:`rl_otel.init` options for one the callback creates and owns, checked here: a mistake
    raises ConfigurationError when the callback is built, before a model is loaded. No hook raises: a taken port
    is served on the next free one (a warning names it), a Telemetry that cannot start is a warning and training
    goes on.
    """

    def __init__(self, telemetry: Telemetry | None = None, **options: Any) -> None:
        self.telemetry = telemetry
        self._owned = telemetry is None
        self._options = check_options("RLOtelCallback", options) if self._owned else options
        self._stopped = False  # closed (or failed to start from on_log): only on_train_begin starts it again
        self._finalizer: weakref.finalize | None = None
        self._lock = threading.Lock()

    def _start(self, args: Any) -> None:
        with self._lock:
            if self.telemetry is None:
                output_dir = getattr(args, "output_dir", None)
                stem = os.path.basename(os.path.normpath(output_dir)) if isinstance(output_dir, str) else None
                tel = telemetry_from_options("RLOtelCallback", getattr(args, "run_name", None), self._options,
                                             stem=stem)
                self.telemetry, self._stopped = tel, False
                # closes it when this callback is collected (its trainer deleted), or at exit: whichever is first
                self._finalizer = weakref.finalize(self, tel.close)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        with _ended_lock:
            _ended.discard(self)
            lingering = [cb for cb in _ended if cb._owned]
        for cb in lingering:
            cb.close()
        if not self._owned:
            return
        tel = self.telemetry
        if tel is not None and tel.step is not None and state.global_step < tel.step:
            self.close()  # training again from below the steps served: they would be history, kept off the endpoint
        self._try_start(args, "this training")

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if self.telemetry is None and self._owned and not self._stopped:
            self._try_start(args, "the next train()")  # an evaluate() before train()
        tel = self.telemetry
        if logs and tel is not None:
            tel.log(logs, step=state.global_step)

    def _try_start(self, args: Any, until: str) -> None:
        try:
            self._start(args)
        except Exception as exc:  # the trainer goes on without rl_otel; on_train_begin tries again
            self._stopped = True
            _log.warning("rl_otel: RLOtelCallback could not start (%s: %s); nothing is logged until %s",
                         type(exc).__name__, exc, until)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        tel = self.telemetry
        if tel is not None:
            tel.flush(tel.config.close_timeout_s)  # the trackers hold every step; the endpoint keeps serving
        if self._owned:
            with _ended_lock:
                _ended.add(self)

    def close(self) -> None:
        """Close the Telemetry the callback owns: flush the trackers, stop serving. Idempotent; a Telemetry
        passed as ``telemetry=`` is left open. A later ``train()`` with this callback starts a new one."""
        with _ended_lock:
            _ended.discard(self)
        if not self._owned:
            return
        with self._lock:
            finalizer, self._finalizer = self._finalizer, None
            self.telemetry, self._stopped = None, True
        if finalizer is not None:
            finalizer()  # Telemetry.close, once
