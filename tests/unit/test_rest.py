"""controller/adapters/rest.py: the REST API as a client sees it, in front of the real core
(controller/core/controller.py) on the study's fake switches (tests/unit/fakes.py)."""
import io
import json
from types import SimpleNamespace
from typing import Any

import pytest
from webob import Request

from controller.adapters.rest import MakeRequest, Ticket, make_app
from controller.adapters.statefile import StateFile, save
from controller.core import events as ev
from tests.unit.fakes import shipped, study_net, up


class CoreClient:
    """What the app's call() does: a request into the core, its answer, or its error raised."""

    def __init__(self, net):
        self.net = net

    def call(self, make: MakeRequest) -> Any:
        self.net.app.begin(make)
        self.net.app.settle()
        answer = self.net.app.answers[-1]
        if answer.error is not None:
            raise answer.error
        return answer.result

    def current_policy(self) -> dict:
        return self.call(ev.GetPolicy)

    @property
    def policy(self):
        return self.net.app.keeper.policy


def call(app, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    req = Request.blank(path, method=method, headers=headers or {})
    if body is not None:
        req.body = body
        req.content_type = "application/json"
    resp = req.get_response(app)
    return resp.status_code, resp.content_type, json.loads(resp.body)


def put_json(app, document: Any):
    return call(app, "PUT", "/qos/v1/policy", json.dumps(document).encode())


def bare(tmp_path) -> CoreClient:
    """The core with the study's switches connected and no policy yet."""
    net = study_net(tmp_path)
    net.app.connect(net.s1)
    net.app.connect(net.s2)
    return CoreClient(net)


@pytest.fixture
def holder(tmp_path):
    net = study_net(tmp_path)
    up(net, "none")
    return CoreClient(net)


@pytest.fixture
def app(holder):
    return make_app(holder)


def test_get_status(app):
    code, kind, body = call(app, "GET", "/qos/v1/status")
    assert (code, kind, body["policy"], body["role"]) == (200, "application/json", "none", "active")
    assert body["switches"]["0000000000000001"]["ports"]["1"] == {"iface": "s1-eth1", "mode": "fifo", "queues": "fifo", "steered": False,
                                                                  "congested": False}


def test_get_policy_returns_the_document_in_force(app):
    code, _, body = call(app, "GET", "/qos/v1/policy")
    assert code == 200
    assert body["name"] == "none"
    assert body["switches"]["s1"]["ports"]["1"]["queues"] == "fifo"


def test_get_policy_before_any_is_null(tmp_path):
    assert call(make_app(bare(tmp_path)), "GET", "/qos/v1/policy") == (200, "application/json", None)


def test_put_a_good_policy_applies_it(app, holder):
    assert put_json(app, shipped("reserve")) == (200, "application/json", {"applied": "reserve", "changed": True,
                                                                           "revision": 2, "in_sync": True})
    assert holder.policy.name == "reserve"
    assert call(app, "GET", "/qos/v1/status")[2]["policy"] == "reserve"
    assert call(app, "GET", "/qos/v1/policy")[2]["name"] == "reserve"


def test_put_a_bad_policy_is_400_with_the_error_and_keeps_the_old_one(app, holder):
    doc = shipped("reserve")
    doc["switches"]["s1"]["flows"][2]["match"]["ip_proto"] = "udpp"
    code, _, body = put_json(app, doc)
    assert code == 400
    assert body == {"error": "switches.s1.flows[2].match.ip_proto: 'udpp' is not a protocol; "
                             "use tcp, udp, icmp, icmpv6 or a number 0-255"}
    assert holder.policy.name == "none"
    assert call(app, "GET", "/qos/v1/policy")[2]["name"] == "none"


def test_put_a_policy_with_a_base_is_400_saying_to_send_it_resolved(app, holder):
    code, _, body = put_json(app, {"base": "bases/study.yaml", "name": "reserve"})
    assert code == 400
    assert body == {"error": "policy.base: bases are resolved only when a policy is loaded from its file; send the "
                             "resolved policy (python3 -m controller.check --json FILE prints it)"}
    assert holder.policy.name == "none"


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
    assert call(app, "DELETE", "/qos/v1/policy") == (200, "application/json", {"cleared": "none", "revision": 2,
                                                                              "in_sync": True})
    assert holder.policy is None
    assert call(app, "GET", "/qos/v1/policy")[2] is None


def test_put_a_policy_with_ip_proto_as_a_list_is_400(app, holder):
    doc = shipped("reserve")
    doc["switches"]["s1"]["flows"][2]["match"]["ip_proto"] = ["udp"]
    code, _, body = put_json(app, doc)
    assert code == 400
    assert body["error"].startswith("switches.s1.flows[2].match.ip_proto: ")
    assert holder.policy.name == "none"


def test_an_unexpected_error_is_a_500_without_a_traceback(holder, monkeypatch):
    def broken(_):
        raise KeyError("/work/main/controller/internal/path")
    monkeypatch.setattr(holder.net.app.core, "_status", broken)
    code, _, body = call(make_app(holder), "GET", "/qos/v1/status")
    assert (code, body) == (500, {"error": "internal error, see the controller's log"})


def test_a_state_file_that_cannot_be_written_is_a_500_that_says_so_and_changes_nothing(holder, tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")                           # even root cannot make a directory where a file is
    alone = StateFile(blocker / "state.json")          # as a controller without a standby keeps its policy
    holder.net.app.store = SimpleNamespace(save=lambda document, revision, expect: save(alone, document, revision))
    code, _, body = put_json(make_app(holder), shipped("reserve"))
    assert code == 500 and body["error"].startswith("cannot save the policy in force: ") and \
        body["error"].endswith("; make the state directory writable, or set [qos] state_file; nothing was changed")
    assert holder.policy.name == "none" and call(make_app(holder), "DELETE", "/qos/v1/policy")[0] == 500


def test_a_body_over_one_mib_is_413_and_changes_nothing(app, holder):
    code, _, body = call(app, "PUT", "/qos/v1/policy", b"{" + b" " * (1 << 20) + b"}")
    assert code == 413 and body["error"].startswith("request body: 1048578 bytes, more than the 1048576")
    assert holder.policy.name == "none"


def test_a_repeated_key_is_400(app, holder):
    code, _, body = call(app, "PUT", "/qos/v1/policy", b'{"name": "a", "name": "b"}')
    assert (code, body) == (400, {"error": "request body: key 'name' appears twice in one object; keep one"})


def test_deep_nesting_is_400_not_a_traceback(app, holder):
    code, _, body = call(app, "PUT", "/qos/v1/policy", b"[" * 100_000 + b"]" * 100_000)
    assert code == 400 and body["error"].startswith("request body: nested deeper than 32 levels")
    code, _, body = call(app, "PUT", "/qos/v1/policy", b"[" * 40 + b"]" * 40)   # parses, then refused
    assert (code, body) == (400, {"error": "request body: nested deeper than 32 levels; a policy is not that deep"})


def eventlet_request(body: bytes | io.BufferedReader, headers: dict[str, str]) -> Request:
    """A PUT as eventlet.wsgi hands it to the app: its wsgi.input de-chunks a chunked body, and it sets no
    wsgi.input_terminated."""
    req = Request.blank("/qos/v1/policy", method="PUT", headers=headers)
    req.environ["wsgi.input"] = io.BytesIO(body) if isinstance(body, bytes) else body
    req.environ.pop("CONTENT_LENGTH", None)
    if "Content-Length" in headers:
        req.environ["CONTENT_LENGTH"] = headers["Content-Length"]
    return req


def answer(app, req: Request) -> tuple[int, dict]:
    resp = req.get_response(app)
    return resp.status_code, json.loads(resp.body)


def test_a_chunked_body_is_read_whole_and_over_one_mib_is_413(app, holder):
    chunked = {"Transfer-Encoding": "chunked"}
    document = json.dumps(shipped("reserve")).encode()
    assert answer(app, eventlet_request(document, chunked)) == (200, {"applied": "reserve", "changed": True,
                                                                      "revision": 2, "in_sync": True})
    code, body = answer(app, eventlet_request(b" " * (1300 * 1024) + document, chunked))
    assert (code, body) == (413, {"error": "request body: more than the 1048576 bytes a policy may have"})
    assert holder.policy.name == "reserve"


class Stalled(io.RawIOBase):
    """A client that sent a few bytes of its body and then nothing: the server's read times out."""

    def __init__(self):
        self.sent = io.BytesIO(b'{"na')

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if n := self.sent.readinto(buffer):
            return n
        raise TimeoutError("timed out")


@pytest.mark.parametrize("headers, words", [
    ({"Content-Length": "100"}, "request body: ended before the 100 bytes its Content-Length says; send the whole "
                                "body"),
    ({"Transfer-Encoding": "chunked"}, "request body: its chunks ended or stalled before the last one; send the "
                                       "whole body")])
def test_a_body_cut_short_or_stalled_is_a_400_in_one_line(app, holder, headers, words):
    assert answer(app, eventlet_request(io.BufferedReader(Stalled()), headers)) == (400, {"error": words})
    assert holder.policy.name == "none"


TOKEN = "s3cret-token"


@pytest.mark.parametrize("method, path, body", [("PUT", "/qos/v1/policy", b"{}"), ("DELETE", "/qos/v1/policy", None)])
def test_with_a_token_every_change_needs_it(holder, method, path, body):
    app = make_app(holder, TOKEN)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}):
        code, _, answer = call(app, method, path, body, headers)
        assert code == 401 and "Authorization: Bearer" in answer["error"], headers
    assert holder.policy.name == "none"
    assert call(app, "DELETE", "/qos/v1/policy", None, {"Authorization": f"Bearer {TOKEN}"})[0] == 200


def test_with_a_token_reading_needs_none(holder):
    app = make_app(holder, TOKEN)
    assert call(app, "GET", "/qos/v1/status")[0] == 200
    assert call(app, "GET", "/qos/v1/policy")[0] == 200


class Late:
    """The app's call() when no answer comes within its wait: the event loop takes the request up before the wait
    ends (`taken`) or only after it, when the client has its answer already."""

    def __init__(self, core: CoreClient, taken: bool):
        self.core, self.taken, self.queued = core, taken, []

    def call(self, make: MakeRequest) -> Any:
        ticket = Ticket()
        if self.taken:
            ticket.take()
        self.queued.append((ticket, make))
        raise ticket.expire(30)

    def run_late(self) -> None:
        for ticket, make in self.queued:
            if self.taken or ticket.take():
                self.core.call(make)


def test_a_change_not_taken_up_in_time_is_503_and_never_happens_later(holder):
    late = Late(holder, taken=False)
    code, _, body = put_json(make_app(late), shipped("reserve"))
    assert code == 503 and "nothing changed" in body["error"]
    late.run_late()
    assert holder.policy.name == "none"


def test_a_change_taken_up_but_not_answered_in_time_is_504_saying_it_may_be_in_force(holder):
    late = Late(holder, taken=True)
    code, _, body = put_json(make_app(late), shipped("reserve"))
    assert code == 504 and "may be in force or not" in body["error"] and "GET /qos/v1/policy" in body["error"]
    late.run_late()
    assert holder.policy.name == "reserve"


def response(app, method: str, body: Any = None, headers: dict | None = None):
    req = Request.blank("/qos/v1/policy", method=method, headers=headers or {})
    if body is not None:
        req.body, req.content_type = json.dumps(body).encode(), "application/json"
    return req.get_response(app)


def test_each_answer_carries_the_revision_and_if_match_changes_only_the_revision_it_names(app, holder):
    got = response(app, "GET")
    assert got.status_code == 200 and got.headers["ETag"] == '"1"' and got.json["name"] == "none"
    stale = response(app, "PUT", shipped("reserve"), {"If-Match": '"0"'})
    assert (stale.status_code, stale.json["revision"]) == (412, 1) and holder.policy.name == "none"
    assert stale.json["error"].startswith("If-Match: the policy in force is at revision 1, not 0; GET it")
    put = response(app, "PUT", shipped("reserve"), {"If-Match": got.headers["ETag"]})
    assert (put.status_code, put.headers["ETag"], put.json["revision"]) == (200, '"2"', 2)
    assert holder.policy.name == "reserve" and response(app, "GET").headers["ETag"] == '"2"'
    again = response(app, "PUT", shipped("reserve"), {"If-Match": '"2"'})           # unchanged: the same revision
    assert (again.status_code, again.json["changed"], again.headers["ETag"]) == (200, False, '"2"')
    assert response(app, "DELETE", headers={"If-Match": '"1"'}).status_code == 412 and holder.policy.name == "reserve"
    assert response(app, "DELETE", headers={"If-Match": "*"}).json == {"cleared": "reserve", "revision": 3,
                                                                        "in_sync": True}
    # `*` asks for a policy in force (RFC 9110): with none, nothing changes and the answer is 412.
    for method, body in (("PUT", shipped("reserve")), ("DELETE", None)):
        none = response(app, method, body, {"If-Match": "*"})
        assert (none.status_code, none.json["revision"]) == (412, 3) and holder.policy is None, none.json
        assert none.json["error"] == "If-Match: *: no policy is in force (revision 3); send the change without " \
                                     "If-Match to make one"


@pytest.mark.parametrize("tag", ["1", 'W/"1"', '"one"', '""', '"1", "2"'])
def test_an_if_match_that_names_no_revision_is_a_400_that_says_how(app, holder, tag):
    bad = response(app, "PUT", shipped("reserve"), {"If-Match": tag})
    assert bad.status_code == 400 and bad.json["error"] == (f"If-Match: {tag!r} is not a revision; send the ETag a "
                                                            'GET gave, e.g. If-Match: "12", or no If-Match')
    assert holder.policy.name == "none"
