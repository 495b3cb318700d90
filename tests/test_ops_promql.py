"""The PromQL helpers: metric-name extraction, Grafana variable substitution, promtool parse check."""

from __future__ import annotations

import pytest

from rl_otel.ops.promql import check_expressions, metric_names, substitute
from tests.promtools import require_binary


@pytest.mark.parametrize("expr, names", [
    ("rl_step", {"rl_step"}),
    ('max by (job, run) (rl_step{run=~"$run"})', {"rl_step"}),
    ("sum without (rank) (rate(rl_x_bucket[5m])) / on (job) group_left (le) rl_y offset 1h", {"rl_x_bucket", "rl_y"}),
    ('histogram_quantile(0.95, sum by (le) (rate(a_bucket{x="sum(b)", y=\'{c}\'}[$__rate_interval])))', {"a_bucket"}),
    ("time() - run:rl_last_step_timestamp_seconds:max > 900", {"run:rl_last_step_timestamp_seconds:max"}),
    ("a unless (a > -Inf < +Inf) or b and bool c", {"a", "b", "c"}),
    ("sum(x) by (job) + count (y) - 1.5e-3 * topk(3, z)", {"x", "y", "z"}),
    ("absent(up{job=~\"rl_otel.*\"})", {"up"}),
    ("avg_over_time(r:m:o[1h:5m]) * 2 > 0x1F", {"r:m:o"}),
])
def test_metric_names(expr, names):
    assert metric_names(expr) == names


def test_substitute_replaces_variables_and_grafana_intervals():
    expr = 'rate(x{run=~"$run", r="${runner}", c=~"$cluster"}[$__rate_interval]) offset $__range'
    assert substitute(expr, {"run": "a", "runner": "b", "cluster": "c|d"}) == \
        'rate(x{run=~"a", r="b", c=~"c|d"}[1m]) offset 5m'
    assert substitute("x[$__rate_interval]", {"__rate_interval": "30s"}) == "x[30s]"


def test_check_expressions_accepts_good_and_names_bad_ones():
    require_binary("promtool")
    assert check_expressions(["sum by (run) (rate(x[1m]))", "a unless (a > -Inf < +Inf)"]) == ""
    out = check_expressions(["sum by (run) (rate(x[1m]))", "max by (run) (x{a=\"b\"}})"])
    assert "check:expr_1" in out and "check:expr_0" not in out
