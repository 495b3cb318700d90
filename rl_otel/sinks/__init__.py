"""Tracker sinks: the bridge that mirrors each logged step to TensorBoard, WandB, SwanLab and stdout."""

from rl_otel.sinks.base import Sink, SinkError, register_sink, registered_sinks, sink_factory

__all__ = ["Sink", "SinkError", "register_sink", "registered_sinks", "sink_factory"]
