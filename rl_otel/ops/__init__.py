"""Operations artifacts generated from the catalog and one set of thresholds.

``python3 -m rl_otel.ops`` writes ``prometheus/rules/*.yml`` (recording and alerting rules),
``prometheus/tests/rl_otel_alerts_test.yml`` (``promtool test rules`` cases), ``grafana/dashboards/*.json`` and
``deploy/kubernetes/prometheusrule.yaml``; ``--check`` exits 1 if a committed file differs from what it would write.
"""

from rl_otel.ops.thresholds import DEFAULT, Thresholds

__all__ = ["DEFAULT", "Thresholds"]
