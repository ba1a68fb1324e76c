"""The controller's REST API: a small WSGI app.

  GET    /qos/v1/policy   the policy in force (its document) or null; its revision in the ETag header
  PUT    /qos/v1/policy   a policy document (JSON); 400 names the bad field and the old policy stays
  DELETE /qos/v1/policy   no policy: this controller's flows and queues come off every switch
  GET    /qos/v1/status   switches, ports, queues in force, what is not in sync, decisions
  GET    /qos/v1/openapi.json   this API as an OpenAPI 3.0 document (openapi.json beside this file)

A PUT or DELETE with `If-Match: "N"` changes the policy only if it is still at revision N (`*`: only if a
policy is in force), else 412 names the revision in force; a change whose outcome is unknown (the store's
answer was lost) is 504. In a cluster GET reads etcd, never this member's copy.

Every method but GET needs `Authorization: Bearer <api_token>` when a token is configured (and one
must be where the API listens beyond loopback). A body may come with Content-Length or chunked; over
1 MiB it gets 413, and one cut short (or stalled past the server's socket timeout) 400. A request
refused before its body is read has up to DRAIN_BYTES of it read and dropped first: closing a
connection with unread input makes the kernel reset it, and the client would never see why. No
traceback ever reaches a client: an unexpected error is a 500 that points to the controller's log.
"""
from __future__ import annotations

import functools
import hmac
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from webob import Request, Response

from controller.core import events as ev
from controller.core.controller import Standby
from controller.core.document import MAX_BYTES, load_json
from controller.core.errors import Conflict, Indeterminate, PolicyError, StorageError

LOG = logging.getLogger(__name__)
DRAIN_BYTES = 8 * MAX_BYTES
_READ = "ovs-qos-controller.body_read"   # environ key: the body has been read from (a 100 Continue went out)
# Read at import: a missing or broken document stops the controller at start, not a client's GET later.
OPENAPI_DOCUMENT = json.loads(Path(__file__).with_name("openapi.json").read_text(encoding="utf-8"))


class BodyError(ValueError):
    """A request body that cannot be taken; `code` is the HTTP status that says so."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


class Busy(RuntimeError):
    """The controller did not take the request up in time: nothing changed."""


class Unavailable(RuntimeError):
    """What the policy is read from (a cluster's etcd) does not answer now."""


class Ticket:
    """A request's fate, between the REST greenthread that waits for its answer and the event loop that takes it
    up (greenthreads: each side's check and mark run without a switch between them). A request not taken up in
    time is cancelled, so that what the client is told did not happen never happens later."""

    def __init__(self) -> None:
        self.taken = self.cancelled = False

    def take(self) -> bool:
        """The event loop's: whether to handle the request (False: its client has been answered already)."""
        self.taken = not self.cancelled
        return self.taken

    def expire(self, seconds: float) -> Exception:
        """The waiter's, once `seconds` passed without an answer: what to tell the client."""
        if self.taken:
            return Indeterminate(f"the controller took the request up but did not answer within {seconds:g} s: a "
                                 "change may be in force or not; GET /qos/v1/policy and /qos/v1/status say which")
        self.cancelled = True
        return Busy(f"the controller did not take the request up within {seconds:g} s; nothing changed; try again")


# A request for the core (controller/core/events.py), made once the app has the token its answer goes to.
MakeRequest = Callable[[Any], ev.Request]


class Controller(Protocol):
    def call(self, make: MakeRequest) -> Any: ...

    def current_policy(self) -> dict[str, Any]:
        """{"policy": the document in force or None, "revision": its revision}, from the store where other
        controllers change it too (a cluster's; Unavailable when it does not answer), else the core's."""
        ...


Answer = tuple[int, Any, dict[str, str]]     # status, body, headers


def _tagged(answer: dict[str, Any], body: Any) -> Answer:
    return 200, body, {"ETag": f'"{answer["revision"]}"'}


def _get_policy(controller: Controller, req: Request) -> Answer:
    answer = controller.current_policy()
    return _tagged(answer, answer["policy"])


def _change(make: Callable[[Request], MakeRequest]) -> Callable[[Controller, Request], Answer]:
    def route(controller: Controller, req: Request) -> Answer:
        answer = controller.call(make(req))
        return _tagged(answer, answer)
    return route


# Every route the API serves, and what answers it; openapi.json describes each of them and no other.
ROUTES: dict[tuple[str, str], Callable[[Controller, Request], Answer]] = {
    ("GET", "/qos/v1/policy"): _get_policy,
    ("PUT", "/qos/v1/policy"): _change(lambda req: _set_policy(_if_match(req), _body(req))),
    ("DELETE", "/qos/v1/policy"): _change(lambda req: functools.partial(ev.ClearPolicy, expect=_if_match(req))),
    ("GET", "/qos/v1/status"): lambda controller, req: (200, controller.call(ev.GetStatus), {}),
    # Not through the event loop: the document is there even while the controller is busy.
    ("GET", "/qos/v1/openapi.json"): lambda controller, req: (200, OPENAPI_DOCUMENT, {}),
}


def make_app(controller: Controller, token: str = "") -> Callable[..., Any]:
    routes = {route: functools.partial(answer, controller) for route, answer in ROUTES.items()}

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        req = Request(environ)
        handler = routes.get((req.method, req.path))
        allowed = sorted(method for method, path in routes if path == req.path)
        headers: dict[str, str] = {}
        body: Any
        if handler is None:
            code, body = (405, {"error": f"{req.method} not allowed"}) if allowed else (404, {"error": "not found"})
        elif token and req.method != "GET" and not _authorised(req, token):
            code, body = 401, {"error": "this method needs 'Authorization: Bearer <api_token>' (see [qos] "
                                        "api_token in the controller's config)"}
            headers["WWW-Authenticate"] = 'Bearer realm="ovs-qos-controller"'
        elif (req.content_length or 0) > MAX_BYTES:
            code, body = 413, {"error": f"request body: {req.content_length} bytes, more than the {MAX_BYTES} "
                                        "a policy may have"}
        else:
            try:
                code, body, headers = handler(req)
            except BodyError as err:
                code, body = err.code, {"error": str(err)}
            except PolicyError as err:
                code, body = 400, {"error": str(err)}
            except Conflict as err:
                code, body = 412, {"error": str(err), "revision": err.current}
            except (Busy, Standby, Unavailable) as err:
                code, body = 503, {"error": str(err)}
            except Indeterminate as err:
                code, body = 504, {"error": str(err)}
            except StorageError as err:
                LOG.error("%s %s: %s", req.method, req.path, err)
                code, body = 500, {"error": str(err)}
            except Exception:   # noqa: BLE001 - the client gets no traceback; the log does
                LOG.exception("%s %s failed", req.method, req.path)
                code, body = 500, {"error": "internal error, see the controller's log"}
        resp = Response(status=code, content_type="application/json", charset="utf-8",
                        body=json.dumps(body, indent=1).encode() + b"\n")
        if code == 405:
            resp.allow = allowed
        resp.headers.update(headers)
        if code >= 400:
            _drain(req)
        return resp(environ, start_response)
    return app


def _authorised(req: Request, token: str) -> bool:
    scheme, _, given = req.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


def _body(req: Request) -> Any:
    # WebOb reads a body without Content-Length only where the server sets wsgi.input_terminated, which
    # eventlet.wsgi does not; its wsgi.input de-chunks a chunked body and ends where the body ends.
    source = req.body_file_raw if _chunked(req) else req.body_file
    req.environ[_READ] = True
    try:
        data = source.read(MAX_BYTES + 1)   # one byte past the limit: a chunked body has no length to refuse by
    except OSError:   # the peer closed, or sent nothing for the server's socket timeout
        raise BodyError(400, f"request body: ended before the {req.content_length} bytes its Content-Length "
                             "says; send the whole body" if req.content_length is not None else
                             "request body: its chunks ended or stalled before the last one; send the whole "
                             "body") from None
    except ValueError:   # eventlet's ChunkReadError
        raise BodyError(400, "request body: not valid chunked encoding; send the body with Content-Length, "
                             "or in well-formed chunks") from None
    if len(data) > MAX_BYTES:
        raise BodyError(413, f"request body: more than the {MAX_BYTES} bytes a policy may have")
    return load_json(data or b"null", "request body")


def _chunked(req: Request) -> bool:
    return req.content_length is None and "chunked" in req.headers.get("Transfer-Encoding", "").lower()


def _drain(req: Request) -> None:
    """Read and drop what is left of a refused request's body, up to DRAIN_BYTES. Not when the client
    waits for '100 Continue' before sending it and none was sent (nothing read): reading would invite
    the body being refused."""
    waiting = req.headers.get("Expect", "").lower() == "100-continue" and not req.environ.get(_READ)
    if waiting or not (req.content_length or _chunked(req)) or (req.content_length or 0) > DRAIN_BYTES:
        return
    left = DRAIN_BYTES
    try:
        while left > 0 and (data := req.body_file_raw.read(min(left, 1 << 16))):
            left -= len(data)
    except (OSError, ValueError):   # cut short, stalled or badly chunked: nothing more to drop
        pass


def _set_policy(expect: int | None, document: Any) -> MakeRequest:
    """The body is read and parsed here, before the event loop is asked: a bad one costs it nothing."""
    return lambda token: ev.SetPolicy(token, document, expect)


def _if_match(req: Request) -> int | None:
    """The revision an If-Match header names (None: no condition); `*` asks only that a policy be in force
    (RFC 9110: a resource with no current representation fails it)."""
    given = req.headers.get("If-Match")
    if given is None:
        return None
    if given.strip() == "*":
        return ev.ANY_POLICY
    tag = given.strip()
    if len(tag) < 3 or tag[0] != '"' or tag[-1] != '"' or not tag[1:-1].isdigit():
        raise BodyError(400, f"If-Match: {given!r} is not a revision; send the ETag a GET gave, e.g. If-Match: "
                             '"12", or no If-Match')
    return int(tag[1:-1])
