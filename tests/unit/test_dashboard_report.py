"""topo/harness/dashboard_report.py without Prometheus: panels read from the dashboards, names, units, figures,
and the page (self-contained, every panel titled, an empty panel saying so)."""
import re

import numpy as np
import pytest
import yaml

from topo.harness import dashboard_report as dr

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
VARIABLES = dr.builtin_variables(span=256.4, step=1)


def panel(kind="timeseries", unit="Mbits", title="Port rx/tx rate", **raw):
    raw = {"gridPos": {"w": 12}, "fieldConfig": {"defaults": {"unit": unit, **raw.pop("defaults", {})}}, **raw}
    return dr.Panel("qos-test", 3, "Controller", title, kind, unit, (("up", "{{port}}"),), raw)


def series(name, values, start=0.0):
    values = np.array(values, dtype=float)
    return dr.Series(name, start + np.arange(len(values), dtype=float), values)


def test_builtin_variables_follow_grafana_for_a_1s_scrape():
    assert VARIABLES == {"__interval": "1s", "__interval_ms": "1000", "__rate_interval": "4s",
                         "__range": "257s", "__range_s": "257", "__range_ms": "257000"}
    assert dr.builtin_variables(span=7200, step=8)["__rate_interval"] == "9s"   # step + one scrape
    assert dr.query_step(256) == 1 and dr.query_step(7200) == 8


def test_the_scrape_interval_is_the_prometheus_configs():
    config = yaml.safe_load((dr.REPO / "prometheus" / "prometheus.yml").read_text())
    assert config["global"]["scrape_interval"] == f"{dr.SCRAPE_SECONDS}s"


def test_variables_are_filled_in():
    expr = 'increase(m{a=~"$dp_id",b=~"${port}",c=~"[[policy]]"}[$__range]) / rate(m[$__rate_interval])'
    assert dr.substitute_variables(expr, VARIABLES) == \
        'increase(m{a=~".*",b=~".*",c=~".*"}[257s]) / rate(m[4s])'
    assert dr.substitute_variables('m{policy=~"$policy"}', {"policy": "auto"}) == 'm{policy=~"auto"}'
    with pytest.raises(KeyError):
        dr.substitute_variables("rate(m[$__no_such_builtin])", VARIABLES)


def test_every_dashboard_panel_is_read_with_its_row_and_no_variable_left():
    _, study = dr.read_dashboard(dr.DASHBOARD_DIR / "qos-study.json", VARIABLES)
    assert [p.number for p in study] == list(range(1, len(study) + 1))
    assert {p.kind for p in study} == {"timeseries", "stat", "state-timeline"}     # rows are not panels
    by_title = {p.title: p for p in study}
    assert by_title["TCP throughput by policy"].row == "Study throughput (launcher)"
    meter = by_title["Meter rate and drops"]
    assert meter.row == "Controller" and meter.unit == "pps"
    assert meter.targets == (('rate(ovsqos_meter_packets_total{dp_id=~".*"}[4s])', "{{dp_id}} {{class}} meter {{meter}} in"),
                             ('rate(ovsqos_meter_dropped_packets_total{dp_id=~".*"}[4s])',
                              "{{dp_id}} {{class}} meter {{meter}} dropped"))
    assert by_title["QoS events in time range"].targets[0][0].endswith("[257s]))")
    assert meter.filename == f"qos-study-{meter.number:02d}-meter-rate-and-drops.png"
    for path in dr.dashboard_paths():
        for p in dr.read_dashboard(path, VARIABLES)[1]:
            assert p.targets and not any("$" in expr for expr, _ in p.targets), p.title


def test_legend_fills_labels_or_shows_the_label_set():
    labels = {"__name__": "ovsqos_port_tx_bytes_total", "dp_id": "0000000000000001", "port": "3"}
    assert dr.legend("{{dp_id}} port {{ port }} tx", labels) == "0000000000000001 port 3 tx"
    assert dr.legend("{{policy}} {{flow}}", {"policy": "auto"}) == "auto"     # an absent label is empty
    assert dr.legend("", labels) == 'ovsqos_port_tx_bytes_total{dp_id="0000000000000001", port="3"}'
    assert dr.legend("__auto", {"action": "program"}) == '{action="program"}'


def test_units_and_values():
    assert [dr.unit_name(u) for u in ("Mbits", "pps", "percent", "none", None)] == \
        ["Mbit/s", "packets/s", "%", "", ""]
    assert [dr.format_value(panel(unit="Mbits"), v) for v in (4.3012, 0.4904, 0, 1234.4)] == \
        ["4.30 Mbit/s", "0.490 Mbit/s", "0 Mbit/s", "1234 Mbit/s"]        # three significant digits
    assert dr.format_value(panel(unit="percent"), 95.61) == "95.6 %"
    assert dr.format_value(panel(unit="none", defaults={"decimals": 0}), 2.0) == "2"
    mapping = {"mappings": [{"type": "value", "options": {"0": {"text": "OK", "color": "green"}}}]}
    assert dr.format_value(panel(unit="none", defaults=mapping), 0.0) == "OK"
    assert dr.format_value(panel(unit="none", defaults=mapping), 1.0) == "1"


def test_prometheus_results_become_named_series_without_non_numbers():
    result = [{"metric": {"port": "2"}, "values": [[1000, "1"], [1001, "NaN"], [1002, "3"]]},
              {"metric": {"port": "1"}, "values": [[1001, "NaN"]]}]
    (s,) = dr.to_series(result, "port {{port}}", start=1000)
    assert s.name == "port 2" and list(s.times) == [0, 2] and list(s.values) == [1, 3]


def test_only_the_highest_peaks_are_drawn_and_the_rest_counted():
    many = [series(f"s{i}", [i, 0]) for i in range(11)]
    shown, hidden = dr.top_series(many)
    assert [s.name for s in shown] == [f"s{i}" for i in range(10, 2, -1)] and hidden == 3


@pytest.mark.parametrize("kind", ["timeseries", "stat", "state-timeline"])
def test_every_kind_of_panel_renders_with_data_and_without(kind):
    data = [series("0000000000000001 port 1", [0, 0, 1, 1, 0]), series("0000000000000001 port 2", [1, 1, 1])]
    assert dr.render(panel(kind), data, step=1, span=5).startswith(PNG_MAGIC)
    assert dr.render(panel(kind), [], step=1, span=5).startswith(PNG_MAGIC)


def page(figures):
    return dr.html_page("QoS study report: run", ["Data from a run."], [("OVS QoS study", figures)])


def test_the_page_is_self_contained_and_titles_every_panel():
    figures = [dr.Figure(panel(title="TCP throughput <now>"), PNG_MAGIC + b"a", True),
               dr.Figure(panel(title="Meter rate and drops"), PNG_MAGIC + b"b", False)]
    html = page(figures)
    assert not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", html, re.I)
    assert "http://" not in html and "https://" not in html and "<script" not in html and "@import" not in html
    srcs = re.findall(r'src="([^"]*)"', html)
    assert len(srcs) == 2 and all(src.startswith("data:image/png;base64,") for src in srcs)
    assert "TCP throughput &lt;now&gt;" in html and "Meter rate and drops" in html
    assert "<h3>Controller</h3>" in html


def test_a_panel_without_data_says_so():
    figures = [dr.Figure(panel(title="With data"), PNG_MAGIC, True),
               dr.Figure(panel(title="Meter rate and drops"), PNG_MAGIC, False)]
    html = page(figures)
    with_data, without = re.findall(r"<figure.*?</figure>", html)
    assert dr.NO_DATA not in with_data
    assert "Meter rate and drops" in without and dr.NO_DATA in without


def test_missing_results_or_prometheus_folder_is_a_one_line_error(tmp_path, capsys):
    assert dr.main([str(tmp_path / "absent")]) == 2
    assert dr.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[0].startswith("error: ") and "prometheus/" in err[1]


def test_no_prometheus_binary_is_a_one_line_error(tmp_path, capsys, monkeypatch):
    (tmp_path / "prometheus").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(dr.signal, "signal", lambda *args: None)     # pytest's own handlers stay
    assert dr.main([str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: prometheus is not installed (scripts/setup.sh installs it)"]
    assert not (tmp_path / "report.html").exists()
