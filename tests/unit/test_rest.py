"""controller/rest.py: the REST API as a client sees it, over a small real controller."""
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from webob import Request

from controller.policy import parse_policy
from controller.rest import make_app

POLICIES = Path(__file__).resolve().parents[2] / "policies"


def shipped(name: str) -> dict:
    return yaml.safe_load((POLICIES / f"{name}.yaml").read_text())


class PolicyHolder:
    """Keeps the policy in force the way the app does: validate first, change nothing on error."""

    def __init__(self, document: Any = None):
        self.document = None
        self.policy = None
        if document is not None:
            self.set_policy(document)

    def policy_document(self) -> Any:
        return self.document

    def set_policy(self, document: Any) -> str:
        policy = parse_policy(document)
        self.policy, self.document = policy, document
        return policy.name

    def clear_policy(self) -> str | None:
        name = self.policy.name if self.policy else None
        self.policy = self.document = None
        return name

    def status(self) -> dict:
        return {"policy": self.policy.name if self.policy else None, "switches": {}}


def call(app, method: str, path: str, body: bytes | None = None):
    req = Request.blank(path, method=method)
    if body is not None:
        req.body = body
        req.content_type = "application/json"
    resp = req.get_response(app)
    return resp.status_code, resp.content_type, json.loads(resp.body)


def put_json(app, document: Any):
    return call(app, "PUT", "/qos/v1/policy", json.dumps(document).encode())


@pytest.fixture
def holder():
    return PolicyHolder(shipped("none"))


@pytest.fixture
def app(holder):
    return make_app(holder)


def test_get_status(app):
    assert call(app, "GET", "/qos/v1/status") == (200, "application/json", {"policy": "none", "switches": {}})


def test_get_policy_returns_the_document_in_force(app):
    code, _, body = call(app, "GET", "/qos/v1/policy")
    assert code == 200
    assert body["name"] == "none"
    assert body["switches"]["s1"]["ports"]["1"]["queues"] == "fifo"


def test_get_policy_before_any_is_null():
    assert call(make_app(PolicyHolder()), "GET", "/qos/v1/policy") == (200, "application/json", None)


def test_put_a_good_policy_applies_it(app, holder):
    assert put_json(app, shipped("reserve")) == (200, "application/json", {"applied": "reserve"})
    assert holder.policy.name == "reserve"
    assert call(app, "GET", "/qos/v1/status")[2]["policy"] == "reserve"
    assert call(app, "GET", "/qos/v1/policy")[2]["name"] == "reserve"


def test_put_a_bad_policy_is_400_with_the_error_and_keeps_the_old_one(app, holder):
    doc = shipped("reserve")
    doc["switches"]["s1"]["flows"][2]["match"]["ip_proto"] = "udpp"
    code, _, body = put_json(app, doc)
    assert code == 400
    assert body == {"error": "switches.s1.flows[2].match.ip_proto: 'udpp' is not a protocol; "
                             "use tcp, udp, icmp or a number 0-255"}
    assert holder.policy.name == "none"
    assert call(app, "GET", "/qos/v1/policy")[2]["name"] == "none"


def test_put_not_json_is_400_naming_the_request_body(app, holder):
    code, _, body = call(app, "PUT", "/qos/v1/policy", b"name: reserve\n")
    assert code == 400
    assert body["error"].startswith("request body: not JSON (")
    assert body["error"].endswith("send the policy as a JSON object")
    assert holder.policy.name == "none"


def test_put_an_empty_body_is_400_asking_for_a_name(app, holder):
    code, _, body = call(app, "PUT", "/qos/v1/policy", b"")
    assert code == 400
    assert body["error"].startswith("name: missing or empty")
    assert holder.policy.name == "none"


@pytest.mark.parametrize("path", ["/", "/qos/v1/policies", "/qos/v2/status", "/qos/v1/status/extra"])
def test_unknown_path_is_404(app, path):
    assert call(app, "GET", path) == (404, "application/json", {"error": "not found"})


@pytest.mark.parametrize("method, path", [("POST", "/qos/v1/policy"), ("DELETE", "/qos/v1/status"),
                                          ("PUT", "/qos/v1/status")])
def test_wrong_method_is_405(app, holder, method, path):
    assert call(app, method, path, b"{}") == (405, "application/json", {"error": f"{method} not allowed"})
    assert holder.policy.name == "none"


def test_a_405_says_which_methods_are_allowed(app):
    resp = Request.blank("/qos/v1/policy", method="POST").get_response(app)
    assert resp.status_code == 405
    assert set(resp.headers.get("Allow", "").replace(" ", "").split(",")) == {"DELETE", "GET", "PUT"}


def test_delete_clears_the_policy_and_says_which(app, holder):
    assert call(app, "DELETE", "/qos/v1/policy") == (200, "application/json", {"cleared": "none"})
    assert holder.policy is None
    assert call(app, "GET", "/qos/v1/policy")[2] is None


def test_put_a_policy_with_ip_proto_as_a_list_is_400(app, holder):
    doc = shipped("reserve")
    doc["switches"]["s1"]["flows"][2]["match"]["ip_proto"] = ["udp"]
    code, _, body = put_json(app, doc)
    assert code == 400
    assert body["error"].startswith("switches.s1.flows[2].match.ip_proto: ")
    assert holder.policy.name == "none"
