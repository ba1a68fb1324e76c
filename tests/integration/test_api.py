"""The live REST API against its OpenAPI document (controller/adapters/openapi.json): schemathesis, a
property-based HTTP client, sends the real controller on two test bridges seeded, bounded requests
made from the document, valid and not, with a policy in force. No answer is a 5xx, every answer is one
the document lists with a body of its schema, the bearer token is enforced, and a refused change leaves
the policy, the QoS rows and the flows as they were (tests/integration/api_checks.py)."""
import collections
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.integration.conftest import (
    REPO,
    controller_config,
    leftovers,
    requires_ovs,
    start_controller,
    stop_controller,
)
from tests.integration.test_reliability import bridges, in_sync, policy, rest, wait  # noqa: F401

pytestmark = requires_ovs
TOKEN = "fuzz-t0ken-0123456789abcdef"
SEED = 20261126   # the same seed sends the same requests: a failure repeats (its report says `st replay`, too)
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
DOCUMENT = REPO / "controller" / "adapters" / "openapi.json"
# positive_data_acceptance is left out: a body the document allows may still be refused, as the
# controller's own check is the authority (two switches with one dp_id, min shares past 100 %, ...).
# The stateful checks need links between operations, which this API has none of.
SKIPPED_CHECKS = "positive_data_acceptance,use_after_free,ensure_resource_availability,object_level_authorization"


def test_the_live_api_answers_as_its_document_says_and_a_refused_change_changes_nothing(tmp_path, bridges):  # noqa: F811
    log = tmp_path / "controller.log"
    proc = start_controller(controller_config(tmp_path / "qos.conf", api_token=TOKEN), log)
    try:
        assert proc.poll() is None, log.read_text()[-2000:]
        wait(lambda: len(rest("GET", "/status")[1]["switches"]) == 2, 20, "both bridges connected")
        assert rest("PUT", "/policy", policy("reserve"), token=TOKEN)[0] == 200
        wait(lambda: in_sync("reserve"), 20, "the policy in force")
        changes = tmp_path / "changes.jsonl"
        env = {**os.environ, "PYTHONPATH": str(REPO), "SCHEMATHESIS_HOOKS": "tests.integration.api_checks",
               "API_CHECK_BRIDGES": " ".join(bridges), "API_CHECK_LOG": str(changes)}
        run = subprocess.run(
            # The repository's file, not the served copy: schemathesis leaves out the operation its
            # document came from (tests/unit/test_openapi.py shows the two are the same).
            [str(SCHEMATHESIS), "run", str(DOCUMENT), "--url", "http://127.0.0.1:8080", "--checks", "all",
             "--exclude-checks", SKIPPED_CHECKS, "--phases", "examples,coverage,fuzzing", "--workers", "1",
             "--seed", str(SEED), "--generation-database", "none", "--max-examples", "100",
             "--request-timeout", "35", "--header", f"Authorization: Bearer {TOKEN}", "--no-color",
             "--report", "json", "--report-json-path", str(tmp_path / "report.json")],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)   # ~25 s on a quiet host
        (tmp_path / "schemathesis.txt").write_text(run.stdout + run.stderr)   # its report, kept for a reader
        assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
        report = json.loads((tmp_path / "report.json").read_text())
        # Every phase ran whole. Bounded by examples, not by --max-time: a time budget cuts phases short at
        # a point that depends on the machine's speed, and the run would no longer repeat with its seed.
        assert {phase: report["phases"][phase]["status"] for phase in ("examples", "coverage", "fuzzing")} == \
            dict.fromkeys(("examples", "coverage", "fuzzing"), "success"), run.stdout[-3000:]
        seen = collections.Counter((c["method"], c["status"]) for c in map(json.loads, changes.read_text().splitlines()))
        # The run meant something: policies accepted and refused, the token asked for, methods refused.
        assert seen[("PUT", 200)] and seen[("PUT", 400)] and seen[("DELETE", 200)], (seen, run.stdout[-3000:])
        assert seen[("PUT", 401)] or seen[("DELETE", 401)], (seen, run.stdout[-3000:])
        assert seen[("POST", 405)], (seen, run.stdout[-3000:])   # a method no path lists
        assert not [status for _, status in seen if status >= 500], seen
        assert "Traceback" not in log.read_text()
    finally:
        rest("DELETE", "/policy", token=TOKEN)
        stop_controller(proc, clear=False)
    assert (leftovers()["qos"], leftovers()["queues"]) == ("", ""), log.read_text()[-3000:]
