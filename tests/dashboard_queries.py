"""Read the PromQL expressions out of the Grafana dashboards in dashboards/.

Used by tests/unit/test_dashboards.py (static checks with promtool) and meant
for an integration test that runs every dashboard query against a real
Prometheus after a study run::

    from tests.dashboard_queries import all_dashboard_expressions

    for dashboard, panel, expr in all_dashboard_expressions():
        result = query_prometheus(expr)          # /api/v1/query?query=expr
        ...

Grafana template variables are replaced by concrete values so the expressions
are plain PromQL: the built-in interval variables by durations (see
DEFAULT_VARIABLES) and the dashboards' own variables ($policy, $dp_id, $port,
all multi-value and used only inside =~ matchers) by ".*", i.e. "All".
Override any of them with the ``variables`` argument, e.g.
``{"__rate_interval": "4s", "policy": "reservation"}``.

Reading the dashboards is the product's (topo/harness/dashboard_report.py,
behind ``topo/run.py report``); this module adds what only the tests need.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from topo.harness import dashboard_report
from topo.harness.dashboard_report import (  # noqa: F401  (the tests import these from here)
    ALL_VALUE,
    DASHBOARD_DIR,
    dashboard_paths,
    iter_panels,
    load_dashboard,
)

# Every metric the controller (127.0.0.1:9101) and the study launcher
# (127.0.0.1:9102) export, with its Prometheus type. Dashboards may use only
# these names.
EXPORTED_METRICS: dict[str, str] = {
    # controller: port counters {dp_id, port}
    "ovsqos_port_rx_bytes_total": "counter",
    "ovsqos_port_tx_bytes_total": "counter",
    "ovsqos_port_rx_packets_total": "counter",
    "ovsqos_port_tx_packets_total": "counter",
    "ovsqos_port_rx_dropped_total": "counter",
    "ovsqos_port_tx_dropped_total": "counter",
    "ovsqos_port_rx_errors_total": "counter",
    "ovsqos_port_tx_errors_total": "counter",
    # controller: queue counters {dp_id, port, queue}
    "ovsqos_queue_tx_bytes_total": "counter",
    "ovsqos_queue_tx_packets_total": "counter",
    "ovsqos_queue_tx_errors_total": "counter",
    # controller: OpenFlow meter counters {dp_id, meter}
    "ovsqos_meter_packets_total": "counter",
    "ovsqos_meter_bytes_total": "counter",
    "ovsqos_meter_dropped_packets_total": "counter",
    # controller: port state {dp_id, port}
    "ovsqos_port_capacity_bytes_per_second": "gauge",
    "ovsqos_port_congested": "gauge",
    "ovsqos_port_queues_programmed": "gauge",
    # controller: QoS events {dp_id, port, action}
    "ovsqos_qos_events_total": "counter",
    # controller: policy
    "ovsqos_policy_info": "gauge",
    "ovsqos_policy_load_error": "gauge",
    # controller: its own health {dp_id}, {error}, {kind}, {remote}, {role}
    "ovsqos_openflow_errors_total": "counter",
    "ovsqos_drift_repairs_total": "counter",
    "ovsqos_polls_total": "counter",
    "ovsqos_poll_duration_seconds": "gauge",
    "ovsqos_poll_lag_seconds": "gauge",
    "ovsqos_switch_in_sync": "gauge",
    "ovsqos_ovsdb_connected": "gauge",
    "ovsqos_ovsdb_bridge_reads_total": "counter",
    "ovsqos_controller_role": "gauge",
    # controller: its own forwarding under a policy's network: section; {kind}, {reason}
    "ovsqos_fabric_links": "gauge",
    "ovsqos_fabric_hosts": "gauge",
    "ovsqos_fabric_moves_total": "counter",
    "ovsqos_fabric_packet_ins_total": "counter",
    "ovsqos_fabric_probes_refused_total": "counter",
    # launcher
    "ovsqos_study_flow_throughput_bytes_per_second": "gauge",
    "ovsqos_study_udp_offered_bytes_per_second": "gauge",
    "ovsqos_study_probe_rtt_seconds": "histogram",
}
HISTOGRAM_SERIES = ("_bucket", "_count", "_sum")   # what a query names of a histogram: counters all


def series_names() -> dict[str, str]:
    """Every series name a query may use, with its type: a histogram's as counters."""
    names = {}
    for name, kind in EXPORTED_METRICS.items():
        if kind == "histogram":
            names.update({name + suffix: "counter" for suffix in HISTOGRAM_SERIES})
        else:
            names[name] = kind
    return names


# Values for Grafana's built-in variables. The rate window spans several 1 s
# scrapes; Grafana itself uses max(4 * scrape interval, step + scrape interval).
DEFAULT_VARIABLES: dict[str, str] = {
    "__rate_interval": "10s",
    "__interval": "1s",
    "__range": "5m",
    "__range_s": "300",
    "__range_ms": "300000",
    "__interval_ms": "1000",
}

class DashboardQuery(NamedTuple):
    dashboard: str  # file name without .json, e.g. "qos-controller"
    panel: str  # panel title
    expr: str  # PromQL with template variables substituted


def substitute_variables(expr: str, variables: Mapping[str, str] | None = None) -> str:
    """Replace Grafana template variables in ``expr`` with concrete values.

    Built-in ``$__*`` variables take DEFAULT_VARIABLES (an unknown one raises
    KeyError, so a typo cannot slip through); other variables take ALL_VALUE
    unless ``variables`` names them.
    """
    return dashboard_report.substitute_variables(expr, {**DEFAULT_VARIABLES, **(variables or {})})


def dashboard_expressions(
    path: Path | str, variables: Mapping[str, str] | None = None
) -> list[DashboardQuery]:
    """(dashboard, panel title, expr) for every Prometheus target in ``path``.

    Hidden targets are skipped (Grafana does not show them either).
    """
    _, panels = dashboard_report.read_dashboard(path, {**DEFAULT_VARIABLES, **(variables or {})})
    return [DashboardQuery(p.dashboard, p.title, expr) for p in panels for expr, _ in p.targets]


def all_dashboard_expressions(
    variables: Mapping[str, str] | None = None, directory: Path = DASHBOARD_DIR
) -> list[DashboardQuery]:
    """dashboard_expressions() over every dashboard in ``directory``."""
    return [q for path in dashboard_paths(directory) for q in dashboard_expressions(path, variables)]


_LABEL_VALUES_RE = re.compile(r"^\s*label_values\(\s*(?P<selector>.*?)\s*,\s*\w+\s*\)\s*$", re.S)


def variable_queries(
    path: Path | str, variables: Mapping[str, str] | None = None
) -> list[DashboardQuery]:
    """(dashboard, variable name, selector) for each query-type template variable.

    ``label_values(selector, label)`` is reduced to its selector (plain PromQL);
    other query forms are returned as they are.
    """
    path = Path(path)
    out = []
    for var in load_dashboard(path).get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        query = var.get("query")
        if isinstance(query, dict):
            query = query.get("query", "")
        query = query or var.get("definition", "")
        match = _LABEL_VALUES_RE.match(query)
        if match:
            query = match.group("selector")
        out.append(DashboardQuery(path.stem, var["name"], substitute_variables(query, variables)))
    return out


_STRING_RE = re.compile(r'"(?:[^"\\]|\\.)*"' r"|'(?:[^'\\]|\\.)*'" r"|`[^`]*`")
_GROUPING_RE = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT_RE = re.compile(r"(?<![\w:.])([A-Za-z_:][\w:]*)(?![\w:])(?!\s*\()")
_PROMQL_KEYWORDS = {
    "and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
    "group_left", "group_right", "inf", "nan", "atan2",
}


def metric_names(expr: str) -> set[str]:
    """Metric names that a PromQL expression selects.

    A small lexer, not a parser: it drops strings, label matchers, range and
    subquery brackets and grouping label lists, then keeps the identifiers
    that are neither function calls nor keywords.
    """
    text = _STRING_RE.sub('""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = _GROUPING_RE.sub(" ", text)
    return {
        name for name in _IDENT_RE.findall(text) if name.lower() not in _PROMQL_KEYWORDS
    }
