"""Exporters: where rl_otel's data leaves the process (the Prometheus scrape endpoint, ...)."""
