"""A ``TrainerCallback`` for transformers' ``Trainer`` and TRL's trainers (PPO, GRPO, DPO...): what the trainer
logs is served to Prometheus from every rank::

    from rl_otel.integrations.transformers import RLOtelCallback

    trainer = GRPOTrainer(..., callbacks=[RLOtelCallback(prometheus={"port": 9464})])

The run is named ``TrainingArguments.run_name`` unless ``run`` is given. TRL's keys (``objective/kl``,
``ppo/...``) resolve through the catalog; transformers' own (``loss``, ``learning_rate``, ``grad_norm``) are
exported as they are (``rl_loss``, ...).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rl_otel.sinks.base import missing_dependency

try:
    from transformers import TrainerCallback
except ImportError as e:
    raise missing_dependency("transformers", "transformers") from e

from rl_otel.integrations import telemetry_from_options

if TYPE_CHECKING:
    from rl_otel.core.telemetry import Telemetry


class RLOtelCallback(TrainerCallback):
    """Logs every ``on_log`` at ``state.global_step``; starts at ``on_train_begin``, closes at ``on_train_end``.

    Pass ``telemetry=`` to log into a Telemetry you own (it is not closed); otherwise ``options`` are
    :func:`rl_otel.init` options for one the callback creates and closes.
    """

    def __init__(self, telemetry: Telemetry | None = None, **options: Any) -> None:
        self.telemetry = telemetry
        self._owned = telemetry is None
        self._options = options

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.telemetry is None:
            self.telemetry = telemetry_from_options("RLOtelCallback", getattr(args, "run_name", None),
                                                    self._options)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if logs and self.telemetry is not None:
            self.telemetry.log(logs, step=state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._owned and self.telemetry is not None:
            self.telemetry.close()
            self.telemetry = None
