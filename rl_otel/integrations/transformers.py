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
own (``loss``, ``learning_rate``, ``train_runtime``) too. The run is ``TrainingArguments.run_name`` unless
``run`` is given.

- **Several processes** (``torchrun``, ``accelerate launch``): every rank serves its own endpoint on the port +
  ``LOCAL_RANK`` (9464, 9465, ... on a host), with its series labelled ``rank``; rank 0 alone mirrors to the
  trackers (``tracker_ranks=`` changes it), the others have no tracker sink. Give the run a name
  (``run_name=`` in the trainer's config, ``run=`` or ``$RL_OTEL_RUN``): the default, a start timestamp, may
  differ between ranks that start in different seconds.
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
import threading
import weakref
from typing import TYPE_CHECKING, Any

from rl_otel.sinks.base import missing_dependency

try:
    from transformers import TrainerCallback
except ImportError as e:
    raise missing_dependency("transformers", "transformers") from e

from rl_otel.integrations import telemetry_from_options

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
    ``options`` are :func:`rl_otel.init` options for one the callback creates and owns. Only ``on_train_begin``
    raises (a bad option, a taken port: as :func:`rl_otel.init` does); the other hooks never do.
    """

    def __init__(self, telemetry: Telemetry | None = None, **options: Any) -> None:
        self.telemetry = telemetry
        self._owned = telemetry is None
        self._options = options
        self._stopped = False  # closed (or failed to start from on_log): only on_train_begin starts it again
        self._finalizer: weakref.finalize | None = None
        self._lock = threading.Lock()

    def _start(self, args: Any) -> None:
        with self._lock:
            if self.telemetry is None:
                tel = telemetry_from_options("RLOtelCallback", getattr(args, "run_name", None), self._options)
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
        self._start(args)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if self.telemetry is None and self._owned and not self._stopped:
            try:  # an evaluate() before train()
                self._start(args)
            except Exception as exc:  # the trainer goes on; on_train_begin tries again (and raises)
                self._stopped = True
                _log.warning("rl_otel: RLOtelCallback could not start (%s: %s); nothing is logged until train()",
                             type(exc).__name__, exc)
        tel = self.telemetry
        if logs and tel is not None:
            tel.log(logs, step=state.global_step)

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
