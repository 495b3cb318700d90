"""The telemetry core: configuration, key routing, the series store and the Telemetry object."""
