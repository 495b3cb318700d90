"""rl_otel's implementation: nothing here is public API (import from ``rl_otel``, ``rl_otel.catalog``,
``rl_otel.stats``, ``rl_otel.sinks``, ``rl_otel.phases`` and ``rl_otel.integrations``).

The layers, bottom up (``docs/architecture.md``; the rule is checked by ``tests/test_architecture.py``):

- ``checks``: the configuration checks every option shares;
- ``tfrecord``, ``atomic``: TFRecord framing (written and read) and atomic file replacement, for every layer;
- ``pipeline``: values → router → store (and the bounded worker), importing only the catalog;
- ``exporters``, ``tracing``, ``probes``, ``trackers``: where data leaves or comes from (the Prometheus endpoint,
  OTLP, phase spans, memory probes, the tracker bridge), importing the pipeline, never the facade;
- ``runtime``: options, ranks, signals and the assembly of one Telemetry's parts with their lifecycle.
"""
