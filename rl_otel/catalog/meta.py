"""rl_otel's own series: liveness and self-monitoring. Keys under ``rl_otel/`` are written by rl_otel itself."""

from __future__ import annotations

from rl_otel.catalog.define import counter, gauge

_S = "rl_otel"

STEP = gauge("rl_otel/step", "rl_step", "Training step of the last log() call.", _S, unit="{step}")
LAST_STEP_TIMESTAMP = gauge("rl_otel/last_step_timestamp", "rl_last_step_timestamp_seconds",
                            "Unix time of the last log() call: tells a hung trainer from a slow one.", _S, unit="s")
ERRORS = counter("rl_otel/errors/{sink}/{reason}", "rl_telemetry_errors",
                 "Errors rl_otel absorbed instead of stopping training, by sink and reason.", _S, unit="{error}")
DROPPED_SERIES = counter("rl_otel/dropped_series/{metric}", "rl_telemetry_dropped_series",
                         "Values dropped because a metric reached its series cap or its name collided.", _S,
                         unit="{series}")

BUILD_INFO = gauge("rl_otel/build_info/{version}", "rl_otel_build_info",
                   "Always 1; the version label says which rl_otel serves the endpoint.", _S)

SPECS = (STEP, LAST_STEP_TIMESTAMP, ERRORS, DROPPED_SERIES, BUILD_INFO)
