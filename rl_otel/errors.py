"""rl_otel's exceptions: raised at configuration time only, never on the per-step path."""

from __future__ import annotations


class ConfigurationError(ValueError):
    """A bad argument to ``rl_otel.init()``; the message names the value."""


class PortInUseError(ConfigurationError):
    """The Prometheus endpoint cannot bind its port."""


class MissingExtraError(ImportError):
    """An optional package rl_otel needs for what was asked is not installed; the message is one line naming the
    package, rl_otel's extra that brings it and the command that installs it (``init()`` raises it without the
    chain of frames that found it)."""


def install_hint(extra: str) -> str:
    """The command that installs rl_otel's ``extra``. rl_otel is installed from its checkout (it is not on a
    package index, docs/install.md), so the command names the checkout, never a published ``rl-otel``."""
    return (f"pip install -e '.[{extra}]' in the rl_otel checkout (from elsewhere: "
            f"pip install '/path/to/rl_otel[{extra}]'; docs/install.md)")
