"""rl_otel's exceptions: raised at configuration time only, never on the per-step path."""

from __future__ import annotations


class ConfigurationError(ValueError):
    """A bad argument to ``rl_otel.init()``; the message names the value."""


class PortInUseError(ConfigurationError):
    """The Prometheus endpoint cannot bind its port."""
