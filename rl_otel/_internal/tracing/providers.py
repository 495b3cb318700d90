"""The TracerProvider of one Telemetry: the user's (``init(tracer_provider=...)``), or rl_otel's own, built at the
first need (a phase that records, an OTLP span push, a read of ``Telemetry.tracer_provider``): a process that never
records a span never loads the SDK's trace package (~15 ms of ``init()``).

What the phases, the step spans and the facade share, each handed it when built (none of them reaches the
Telemetry's components for it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rl_otel._internal.forks import reset_in_forked_child

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource

    from rl_otel._internal.tracing.config import TracingConfig


class TracerProviders:
    """``user``: the user's provider (``None``: rl_otel's own, built by :meth:`get` from ``config`` and
    ``resource()``, its failed exports counted by ``on_error``, each phase's root span in its final trace handed to
    ``on_root``: the endpoint's exemplars)."""

    def __init__(self, user: Any, config: TracingConfig | None, resource: Callable[[], Resource],
                 on_error: Callable[[str], None], on_root: Callable[[Any], None] | None) -> None:
        self.provider = user  # the provider if it exists: the user's, or rl_otel's own once built (else None)
        self.user = user is not None
        self._config = config
        self._resource = resource
        self._on_error = on_error
        self._on_root = on_root
        self._lock = threading.Lock()
        reset_in_forked_child(self)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # the parent's may have been held by another thread at the fork

    def peek(self) -> Any:
        """The provider if it exists (the user's, or rl_otel's once built), else ``None``: then no span processor
        can have been added to it, and a phase records no span (see ``tracing/contexts.py``)."""
        return self.provider

    def get(self) -> Any:
        """The provider, rl_otel's own built now if needed."""
        if self.provider is None:
            with self._lock:
                if self.provider is None:
                    from rl_otel._internal.tracing.tracing import build_tracer_provider

                    self.provider = build_tracer_provider(self._config, self._resource(), on_error=self._on_error,
                                                           on_root=self._on_root)
        return self.provider

    def own(self) -> Any:
        """rl_otel's own provider if it was built (what rl_otel flushes and shuts down), else ``None``."""
        return None if self.user else self.provider
