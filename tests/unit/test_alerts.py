"""prometheus/alerts.yml: promtool accepts it and passes its unit tests (prometheus/alerts_test.yml), every
alert has a case where it fires and one where it does not, the shipped configurations load it, and its
expressions and test series name only what the controller exports.

On CI (CI=true: tests/ci.py; scripts/setup.sh has installed promtool) a missing promtool fails; elsewhere it skips."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from controller.adapters.metrics import ControllerCollector, Snapshot
from tests.ci import ON_CI
from tests.dashboard_queries import metric_names

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "prometheus" / "alerts.yml"
RULE_TESTS = REPO / "prometheus" / "alerts_test.yml"
CONFIG = REPO / "prometheus" / "prometheus.yml"
COMPOSE = REPO / "docker-compose.yml"
PROMETHEUS_OWN = {"up"}   # what Prometheus records of every target


@pytest.fixture
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if ON_CI:
            pytest.fail("promtool is not installed (scripts/setup.sh installs it): on CI a missing component fails")
        pytest.skip("promtool is not installed (scripts/setup.sh installs Debian's prometheus package)")
    return path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)


def rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def alerts() -> dict[str, dict]:
    return {rule["alert"]: rule for rule in rules() if "alert" in rule}


def exported_names() -> set[str]:
    """The series names the controller's collector exposes, scraped from a fresh registry."""
    registry = CollectorRegistry()
    registry.register(ControllerCollector(Snapshot))
    return set(re.findall(r"^# TYPE (\S+) ", generate_latest(registry).decode(), re.MULTILINE))


def test_promtool_checks_the_rules(promtool):
    result = run(promtool, "check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_the_rules_pass_their_unit_tests(promtool):
    result = run(promtool, "test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_shipped_configurations_load_the_rules(promtool):
    config = yaml.safe_load(CONFIG.read_text())
    assert [(CONFIG.parent / path).resolve() for path in config["rule_files"]] == [RULES]
    result = run(promtool, "check", "config", str(CONFIG))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Checking {RULES}" in result.stdout
    # docker-compose mounts the configuration as /etc/prometheus/prometheus.yml: the rules must sit beside it.
    volumes = yaml.safe_load(COMPOSE.read_text())["services"]["prometheus"]["volumes"]
    assert f"./prometheus/{RULES.name}:/etc/prometheus/{config['rule_files'][0]}:ro" in volumes


def test_every_alert_has_a_case_that_fires_and_one_that_does_not():
    cases = [case for test in yaml.safe_load(RULE_TESTS.read_text())["tests"] for case in test["alert_rule_test"]]
    # A case naming no alert of the file would pass as "not firing" whatever the rules say.
    assert {case["alertname"] for case in cases} <= alerts().keys()
    fires = {case["alertname"] for case in cases if case.get("exp_alerts")}
    silent = {case["alertname"] for case in cases if not case.get("exp_alerts")}
    assert alerts().keys() - fires == set(), "no case where these fire"
    assert alerts().keys() - silent == set(), "no case where these do not fire"


def test_every_alert_says_how_bad_it_is_and_its_threshold():
    for name, alert in alerts().items():
        assert alert["labels"]["severity"] in ("critical", "warning"), name
        assert {"summary", "description", "threshold"} <= alert["annotations"].keys(), name


def test_expressions_name_only_what_the_controller_exports():
    recorded = {rule["record"] for rule in rules() if "record" in rule}
    used = {name for rule in rules() for name in metric_names(rule["expr"])}
    assert used - exported_names() - recorded - PROMETHEUS_OWN == set()
    assert recorded <= used, "a recording rule no alert uses"


def test_the_unit_tests_feed_series_the_controller_exports():
    tests = yaml.safe_load(RULE_TESTS.read_text())
    assert [(RULE_TESTS.parent / path).resolve() for path in tests["rule_files"]] == [RULES]
    fed = {series["series"].split("{")[0] for test in tests["tests"] for series in test["input_series"]}
    assert fed - exported_names() - PROMETHEUS_OWN == set()
