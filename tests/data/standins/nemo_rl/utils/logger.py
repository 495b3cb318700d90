"""Stand-in for ``nemo_rl.utils.logger`` (NeMo-RL @7ea279ab): ``LoggerInterface``'s abstract methods and their
signatures, and ``Logger``'s contract - a ``loggers`` list whose entries get every ``log_metrics`` call
positionally as ``(metrics, step, prefix, step_metric, step_finished)``, and ``finish()`` calling each backend's
``finish`` where it has one. Not NeMo-RL's code."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any


class LoggerInterface(ABC):
    @abstractmethod
    def log_metrics(self, metrics: dict[str, Any], step: int, prefix: str | None = "",
                    step_metric: str | None = None, step_finished: bool = False) -> None: ...

    @abstractmethod
    def log_hyperparams(self, params: Mapping[str, Any]) -> None: ...

    @abstractmethod
    def log_histogram(self, histogram: list[Any], step: int, name: str) -> None: ...

    @abstractmethod
    def log_plot(self, figure: Any, step: int, name: str) -> None: ...


class Logger(LoggerInterface):
    """The fan-out: no backend enabled (``cfg`` is read for nothing here)."""

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        self.loggers: list[LoggerInterface] = []
        self.cfg = cfg

    def log_metrics(self, metrics: dict[str, Any], step: int, prefix: str | None = "",
                    step_metric: str | None = None, step_finished: bool = False) -> None:
        for backend in self.loggers:
            backend.log_metrics(metrics, step, prefix, step_metric, step_finished)

    def log_hyperparams(self, params: Mapping[str, Any]) -> None:
        for backend in self.loggers:
            backend.log_hyperparams(params)

    def log_histogram(self, histogram: list[Any], step: int, name: str) -> None:
        for backend in self.loggers:
            backend.log_histogram(histogram, step, name)

    def log_plot(self, figure: Any, step: int, name: str) -> None:
        for backend in self.loggers:
            backend.log_plot(figure, step, name)

    def finish(self) -> None:
        for backend in self.loggers:
            finish = getattr(backend, "finish", None)
            if callable(finish):
                finish()
