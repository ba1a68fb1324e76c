"""The controller's REST API: a small WSGI app.

  GET    /qos/v1/policy   the policy in force (its document) or null
  PUT    /qos/v1/policy   a policy document (JSON); 400 names the bad field and the old policy stays
  DELETE /qos/v1/policy   no policy: this controller's flows and queues come off every switch
  GET    /qos/v1/status   switches, ports, queues in force, what is not in sync, decisions

Every method but GET needs `Authorization: Bearer <api_token>` when a token is configured (and one
must be where the API listens beyond loopback). Bodies over 1 MiB get 413. No traceback ever
reaches a client: an unexpected error is a 500 that points to the controller's log.
"""
from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Callable
from typing import Any, Protocol

from webob import Request, Response

from controller.core.controller import Standby
from controller.core.document import MAX_BYTES, load_json
from controller.core.errors import PolicyError, StorageError

LOG = logging.getLogger(__name__)


class Busy(RuntimeError):
    """The controller did not answer in time."""


class Controller(Protocol):
    def call(self, op: str, arg: Any = None) -> Any: ...


def make_app(controller: Controller, token: str = "") -> Callable:
    routes = {
        ("GET", "/qos/v1/policy"): lambda req: (200, controller.call("policy")),
        ("PUT", "/qos/v1/policy"): lambda req: (200, controller.call("set_policy", _body(req))),
        ("DELETE", "/qos/v1/policy"): lambda req: (200, controller.call("clear_policy")),
        ("GET", "/qos/v1/status"): lambda req: (200, controller.call("status")),
    }

    def app(environ, start_response):
        req = Request(environ)
        handler = routes.get((req.method, req.path))
        allowed = sorted(method for method, path in routes if path == req.path)
        headers = {}
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
                code, body = handler(req)
            except PolicyError as err:
                code, body = 400, {"error": str(err)}
            except (Busy, Standby) as err:
                code, body = 503, {"error": str(err)}
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
        return resp(environ, start_response)
    return app


def _authorised(req: Request, token: str) -> bool:
    scheme, _, given = req.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


def _body(req: Request) -> Any:
    # Read at most one byte past the limit: a chunked body has no Content-Length to refuse it by.
    data = req.body_file.read(MAX_BYTES + 1)
    return load_json(data or b"null", "request body")
