"""controller/adapters/openapi.json: a valid OpenAPI 3.0 document of exactly the routes rest.py serves,
served at GET /qos/v1/openapi.json, whose schemas take every shipped policy and every answer the real
core gives (tests/integration/test_api.py fuzzes the live controller with it)."""
import json
from pathlib import Path
from typing import Any

import pytest
from openapi_schema_validator import OAS30Validator
from openapi_spec_validator import validate
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT4
from webob import Request

from controller.adapters import rest
from controller.adapters.rest import ROUTES, make_app
from tests.unit.fakes import shipped
from tests.unit.test_rest import bare, call, put_json

DOCUMENT = json.loads((Path(rest.__file__).with_name("openapi.json")).read_text())
METHODS = ("GET", "PUT", "POST", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE")
POLICIES = sorted(p.stem for p in Path("policies").glob("*.yaml"))


class Unreachable:
    """A controller that must not be asked."""

    def call(self, make: Any) -> Any:
        raise AssertionError(f"asked {make('unreachable')}")


def operations() -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, item in DOCUMENT["paths"].items() for method in item
            if method.upper() in METHODS}


def schema_errors(instance: Any, name: str) -> list[str]:
    """What the document's schema `name` (under components/schemas) finds wrong with `instance`."""
    registry: Registry = Registry().with_resource("urn:api", Resource(DOCUMENT, DRAFT4))
    validator = OAS30Validator({"$ref": f"urn:api#/components/schemas/{name}"}, registry=registry)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(instance)]


def response_schema(method: str, path: str, code: int) -> dict:
    response = DOCUMENT["paths"][path][method.lower()]["responses"][str(code)]
    if "$ref" in response:
        response = DOCUMENT["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]
    return response["content"]["application/json"]["schema"]


def answer_errors(method: str, path: str, code: int, body: Any) -> list[str]:
    registry: Registry = Registry().with_resource("urn:api", Resource(DOCUMENT, DRAFT4))
    schema = json.loads(json.dumps(response_schema(method, path, code)).replace('"#/', '"urn:api#/'))
    return [e.message for e in OAS30Validator(schema, registry=registry).iter_errors(body)]


def test_the_document_is_valid_openapi_3():
    assert DOCUMENT["openapi"].startswith("3.0.")
    validate(DOCUMENT)   # raises, naming what is wrong


def test_the_document_has_every_route_rest_serves_and_no_other():
    assert operations() == set(ROUTES)


def test_every_documented_route_is_served_and_every_other_method_is_405_with_allow(tmp_path):
    app = make_app(bare(tmp_path))
    for path in DOCUMENT["paths"]:
        listed = sorted(method for method, p in operations() if p == path)
        for method in METHODS:
            req = Request.blank(path, method=method, body=b"null" if method == "PUT" else b"")
            resp = req.get_response(app)
            if method in listed:
                assert resp.status_code not in (404, 405), (method, path, resp.status_code)
            else:
                assert (resp.status_code, resp.headers["Allow"]) == (405, ", ".join(listed)), (method, path)
    assert call(app, "GET", "/qos/v1/nothing") == (404, "application/json", {"error": "not found"})


def test_get_openapi_json_is_the_document_without_a_token_or_the_controller():
    code, kind, body = call(make_app(Unreachable(), token="secret"), "GET", "/qos/v1/openapi.json")
    assert (code, kind, body) == (200, "application/json", DOCUMENT)


@pytest.mark.parametrize("name", POLICIES)
def test_every_shipped_policy_fits_the_policy_schema(name):
    document = json.loads(json.dumps(shipped(name)))   # as a client sends it: port numbers become keys
    assert schema_errors(document, "Policy") == []


@pytest.mark.parametrize("document, where", [
    ({"name": "x", "switches": {"s": {"dp_id": 1}}, "colour": "red"}, ""),
    ({"name": "", "switches": {"s": {"dp_id": 1}}}, "name"),
    ({"name": "x", "switches": {}}, ""),          # neither a switch nor a network: section
    ({"name": "x", "switches": {"s": {"dp_id": 1, "ports": {"1": {"capacity": "5Mbit", "queues": "lifo"}}}}},
     "switches/s/ports/1/queues"),
    ({"name": "x", "switches": {"s": {"dp_id": 1, "flows": [{"match": {"tcp_dst": 0}}]}}},
     "switches/s/flows/0/match"),
])
def test_the_policy_schema_refuses_what_the_controller_refuses_by_shape(document, where, tmp_path):
    errors = schema_errors(document, "Policy")
    assert errors and all(e.startswith(where) for e in errors), errors
    assert put_json(make_app(bare(tmp_path)), document)[0] == 400


def test_the_cores_answers_fit_their_response_schemas(tmp_path):
    app = make_app(bare(tmp_path))
    answers = [("GET", "/qos/v1/policy", None), ("PUT", "/qos/v1/policy", json.dumps(shipped("reserve")).encode()),
               ("PUT", "/qos/v1/policy", json.dumps(shipped("reserve")).encode()), ("GET", "/qos/v1/policy", None),
               ("GET", "/qos/v1/status", None), ("PUT", "/qos/v1/policy", b'{"name": 1}'),
               ("PUT", "/qos/v1/policy", b"{"), ("DELETE", "/qos/v1/policy", None),
               ("DELETE", "/qos/v1/policy", None), ("GET", "/qos/v1/policy", None)]
    seen = set()
    for method, path, body in answers:
        code, _, answer = call(app, method, path, body)
        seen.add((method, code))
        assert answer_errors(method, path, code, answer) == [], (method, path, code, answer)
    assert seen == {("GET", 200), ("PUT", 200), ("PUT", 400), ("DELETE", 200)}
    refused = call(make_app(bare(tmp_path), token="t"), "DELETE", "/qos/v1/policy")
    assert refused[0] == 401 and answer_errors("DELETE", "/qos/v1/policy", 401, refused[2]) == []
