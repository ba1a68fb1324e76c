"""Static checks of the monitoring setup: Prometheus config, Grafana
provisioning and dashboards, docker-compose.yml.

Needs no root and no running services. promtool (Debian package
"prometheus") and docker-compose are used when installed; the tests that need
them are skipped, with the reason, otherwise. Running each dashboard query
against a real Prometheus is left to an integration test (see
tests/dashboard_queries.py).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.ci import ON_CI
from tests.dashboard_queries import (
    ALL_VALUE,
    EXPORTED_METRICS,
    all_dashboard_expressions,
    dashboard_expressions,
    dashboard_paths,
    iter_panels,
    load_dashboard,
    metric_names,
    series_names,
    substitute_variables,
    variable_queries,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS_CONFIG = REPO_ROOT / "prometheus" / "prometheus.yml"
DATASOURCES = REPO_ROOT / "dashboards" / "provisioning" / "datasources" / "prometheus.yml"
DASHBOARD_PROVIDERS = REPO_ROOT / "dashboards" / "provisioning" / "dashboards" / "dashboards.yml"
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"

EXPECTED_DASHBOARDS = {"qos-study", "qos-controller"}
EXPECTED_TARGETS = {"controller": ["127.0.0.1:9101"], "study": ["127.0.0.1:9102"]}

PROMTOOL = shutil.which("promtool")
DOCKER_COMPOSE = shutil.which("docker-compose")
# Off CI a missing tool skips these tests; on CI (which runs scripts/setup.sh first) it fails them.
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None and not ON_CI,
    reason="promtool not installed (apt-get install prometheus provides it)",
)
needs_docker_compose = pytest.mark.skipif(
    DOCKER_COMPOSE is None and not ON_CI,
    reason="docker-compose not installed (apt-get install docker-compose provides it)",
)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, check=False
    )


def provisioned_datasource_uids() -> set[str]:
    config = yaml.safe_load(DATASOURCES.read_text())
    return {ds["uid"] for ds in config["datasources"] if ds.get("type") == "prometheus"}


# ------------------------------------------------------------------ Prometheus


def test_prometheus_config_jobs_and_intervals():
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    assert config["global"]["scrape_interval"] == "1s"
    assert config["global"]["evaluation_interval"] == "1s"
    targets = {
        job["job_name"]: [t for sc in job["static_configs"] for t in sc["targets"]]
        for job in config["scrape_configs"]
    }
    assert targets == EXPECTED_TARGETS


@needs_promtool
def test_promtool_check_config():
    result = run(PROMTOOL, "check", "config", str(PROMETHEUS_CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_dashboard_expressions_pass_promtool(tmp_path):
    """Every panel expr and variable selector parses as PromQL."""
    queries = all_dashboard_expressions() + [
        q for path in dashboard_paths() for q in variable_queries(path)
    ]
    assert queries
    records = {f"dashboard_expr_{i}": q for i, q in enumerate(queries)}
    rules = {
        "groups": [
            {
                "name": "dashboards",
                "rules": [{"record": name, "expr": q.expr} for name, q in records.items()],
            }
        ]
    }
    rules_file = tmp_path / "dashboard-rules.yml"
    rules_file.write_text(json.dumps(rules, indent=1))  # JSON is YAML
    result = run(PROMTOOL, "check", "rules", str(rules_file))
    failed = {name for name in records if re.search(rf'"{name}"', result.stdout + result.stderr)}
    detail = "\n".join(
        f"  {name}: {q.dashboard} / {q.panel}: {q.expr}"
        for name, q in records.items()
        if name in failed
    )
    assert result.returncode == 0, f"{result.stdout}{result.stderr}\n{detail}"


# ------------------------------------------------------------------ metric names


def test_exported_metric_names_follow_conventions():
    for name, kind in EXPORTED_METRICS.items():
        assert re.fullmatch(r"ovsqos_[a-z0-9]+(?:_[a-z0-9]+)*", name), name
        assert kind in {"counter", "gauge", "histogram"}, name
        if kind == "histogram":
            assert name.endswith("_seconds") or name.endswith("_bytes"), f"histogram {name} needs its base unit"
        elif kind == "counter":
            assert name.endswith("_total"), f"counter {name} must end in _total"
        else:
            assert not name.endswith("_total"), f"gauge {name} must not end in _total"
        words = name.split("_")
        # base units only: bytes and seconds, never bits or scaled units
        forbidden = {"bits", "bit", "bps", "kbps", "mbps", "gbps", "kbits", "mbits",
                     "kilobytes", "megabytes", "kb", "mb", "gb", "milliseconds",
                     "ms", "microseconds", "us", "minutes", "hours", "percent"}
        assert not forbidden & set(words), f"{name} must use base units (bytes, seconds)"
        assert "_bits" not in name, name


def test_metric_name_extraction():
    expr = (
        '100 * rate(a_total{dp_id=~".*",port=~"x"}[10s]) / on (dp_id, port) '
        "(b_bytes_per_second > 0) + 8 * sum by (policy) (c) / 1e6 "
        'and label_replace(d, "x", "$1", "y", "(.*)") offset 5m'
    )
    assert metric_names(expr) == {"a_total", "b_bytes_per_second", "c", "d"}


def test_substitute_variables():
    expr = 'rate(m{a=~"$dp_id",b=~"${port}",c=~"[[policy]]"}[$__rate_interval])'
    assert substitute_variables(expr) == f'rate(m{{a=~"{ALL_VALUE}",b=~"{ALL_VALUE}",c=~"{ALL_VALUE}"}}[10s])'
    assert substitute_variables("rate(m[$__rate_interval])", {"__rate_interval": "4s"}) == "rate(m[4s])"
    with pytest.raises(KeyError):
        substitute_variables("rate(m[$__no_such_builtin])")


def test_dashboards_use_only_exported_metrics():
    queries = all_dashboard_expressions() + [
        q for path in dashboard_paths() for q in variable_queries(path)
    ]
    for q in queries:
        names = metric_names(q.expr)
        assert names, f"{q.dashboard} / {q.panel}: no metric name found in {q.expr!r}"
        unknown = names - series_names().keys()
        assert not unknown, f"{q.dashboard} / {q.panel}: unknown metrics {unknown} in {q.expr!r}"


def test_counters_are_only_used_through_rate_or_increase_or_raw():
    """A counter inside a *_over_time or aggregation without rate() is a bug,
    except when plotted raw (cumulative event counts)."""
    counters = {n for n, kind in series_names().items() if kind == "counter"}
    for q in all_dashboard_expressions():
        for name in metric_names(q.expr) & counters:
            for match in re.finditer(rf"\b{name}\b", q.expr):
                before = q.expr[: match.start()]
                wrapped = re.search(r"\b(rate|irate|increase)\(\s*$", before)
                raw = before.strip() == ""
                assert wrapped or raw, f"{q.dashboard} / {q.panel}: counter {name} in {q.expr!r}"


# ------------------------------------------------------------------ dashboards


def test_expected_dashboards_exist():
    assert EXPECTED_DASHBOARDS <= {p.stem for p in dashboard_paths()}


@pytest.mark.parametrize("path", dashboard_paths(), ids=lambda p: p.stem)
def test_dashboard_structure(path):
    dashboard = load_dashboard(path)  # raises on invalid JSON
    assert dashboard.get("title")
    assert dashboard.get("uid")
    assert 36 <= dashboard.get("schemaVersion", 0) <= 41
    panels = list(iter_panels(dashboard["panels"]))
    assert panels
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        assert panel.get("title", "").strip(), f"panel {panel.get('id')} has no title"
        assert panel["type"] in {"row", "timeseries", "stat", "state-timeline"}, panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel.get("targets"), f"{panel['title']} has no queries"
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target.get("expr", "").strip(), panel["title"]


@pytest.mark.parametrize("path", dashboard_paths(), ids=lambda p: p.stem)
def test_dashboard_panels_do_not_overlap(path):
    cells = {}
    for panel in load_dashboard(path)["panels"]:   # a collapsed row's own panels are laid out when it opens
        grid = panel["gridPos"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[x, y]}"
                cells[x, y] = panel["title"]


@pytest.mark.parametrize("path", dashboard_paths(), ids=lambda p: p.stem)
def test_dashboard_datasources_match_provisioning(path):
    uids = provisioned_datasource_uids()
    assert uids == {"prometheus"}
    dashboard = load_dashboard(path)
    refs = []
    for panel in iter_panels(dashboard["panels"]):
        if panel["type"] == "row":
            continue
        refs.append((panel["title"], panel.get("datasource")))
        refs += [(panel["title"], t.get("datasource")) for t in panel["targets"]]
    refs += [(f"variable {v['name']}", v.get("datasource"))
             for v in dashboard["templating"]["list"] if v["type"] == "query"]
    for where, ds in refs:
        assert isinstance(ds, dict), f"{where}: datasource must be {{type, uid}}, got {ds!r}"
        assert ds.get("type") == "prometheus", where
        assert ds.get("uid") in uids, f"{where}: datasource uid {ds.get('uid')!r} not provisioned"


@pytest.mark.parametrize("path", dashboard_paths(), ids=lambda p: p.stem)
def test_dashboard_uses_template_variables_it_defines(path):
    dashboard = load_dashboard(path)
    defined = {v["name"] for v in dashboard["templating"]["list"]}
    raw = [
        t["expr"]
        for p in iter_panels(dashboard["panels"])
        for t in p.get("targets", [])
    ]
    used = set()
    for expr in raw:
        used |= {m for m in re.findall(r"\$\{?(\w+)", expr) if not m.startswith("__")}
    assert used <= defined, f"undefined template variables {used - defined}"


def test_study_dashboard_panels():
    exprs: dict[str, list[str]] = {}
    for q in dashboard_expressions(REPO_ROOT / "dashboards" / "qos-study.json"):
        exprs.setdefault(q.panel, []).append(q.expr)
    for protocol in ("tcp", "udp"):
        flows = [
            e for e in exprs[f"{protocol.upper()} throughput by policy"]
            if "ovsqos_study_flow_throughput_bytes_per_second" in e
        ]
        assert flows, protocol
        for expr in flows:
            assert f'protocol="{protocol}"' in expr and "policy" in expr, expr


def test_controller_dashboard_covers_controller_metrics():
    wanted = {
        "Port utilisation (tx rate / capacity)",
        "Port rx/tx rate",
        "Queue tx rate per queue",
        "Queue drops per second",
        "Congestion state per port",
        "QoS program/rollback events",
        "Policy in force",
        "Policy-load error",
        "Meter rate and drops",
    }
    for stem in EXPECTED_DASHBOARDS:
        panels = {q.panel for q in dashboard_expressions(REPO_ROOT / "dashboards" / f"{stem}.json")}
        assert wanted <= panels, f"{stem}: missing {wanted - panels}"


def test_throughput_units_are_consistent():
    """All bit-rate panels compute Mbit/s (* 8 / 1e6) and use Grafana's "Mbits"."""
    for path in dashboard_paths():
        for panel in iter_panels(load_dashboard(path)["panels"]):
            if panel["type"] == "row":
                continue
            unit = panel["fieldConfig"]["defaults"].get("unit")
            exprs = [t["expr"] for t in panel["targets"]]
            byte_rates = [e for e in exprs if "bytes" in e]
            if unit == "Mbits":
                assert byte_rates and all(re.match(r"\s*8 \*", e) and e.rstrip().endswith("/ 1e6")
                                          for e in byte_rates), panel["title"]
            assert unit not in {"bps", "Bps", "decbytes", "bytes"}, panel["title"]


# ------------------------------------------------------------------ provisioning


def test_datasource_provisioning():
    config = yaml.safe_load(DATASOURCES.read_text())
    (ds,) = config["datasources"]
    assert ds["type"] == "prometheus"
    assert ds["url"] == "http://127.0.0.1:9090"
    scrape_interval = yaml.safe_load(PROMETHEUS_CONFIG.read_text())["global"]["scrape_interval"]
    assert ds["jsonData"]["timeInterval"] == scrape_interval


def test_dashboard_provider_path_is_mounted_by_compose():
    providers = yaml.safe_load(DASHBOARD_PROVIDERS.read_text())["providers"]
    compose = yaml.safe_load(COMPOSE_FILE.read_text())
    mounts = {}
    for volume in compose["services"]["grafana"]["volumes"]:
        source, target = volume.split(":")[:2]
        mounts[target] = source
    assert mounts.get("/etc/grafana/provisioning") == "./dashboards/provisioning"
    for provider in providers:
        assert provider["type"] == "file"
        assert mounts.get(provider["options"]["path"]) == "./dashboards"


# ------------------------------------------------------------------ compose


def test_compose_services_use_host_networking():
    compose = yaml.safe_load(COMPOSE_FILE.read_text())
    services = compose["services"]
    assert services["prometheus"]["image"].startswith("prom/prometheus")
    assert services["grafana"]["image"].startswith("grafana/grafana-oss")
    for name in ("prometheus", "grafana"):
        assert services[name]["network_mode"] == "host", name
        assert "ports" not in services[name], f"{name}: ports do not apply with host networking"
    prometheus_mounts = {v.split(":")[1]: v.split(":")[0] for v in services["prometheus"]["volumes"]}
    assert prometheus_mounts["/etc/prometheus/prometheus.yml"] == "./prometheus/prometheus.yml"


@needs_docker_compose
def test_docker_compose_config():
    result = run(DOCKER_COMPOSE, "-f", str(COMPOSE_FILE), "config", "-q")
    assert result.returncode == 0, result.stdout + result.stderr
