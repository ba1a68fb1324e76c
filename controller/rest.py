"""The controller's REST API: a small WSGI app served by os-ken's hub WSGI server.

  GET  /qos/v1/policy   the policy in force (its document) or null
  PUT  /qos/v1/policy   a policy document (JSON); 400 with the error, old policy kept
  DELETE /qos/v1/policy no policy: this controller's flows and queues come off every switch
  GET  /qos/v1/status   connected switches, ports, queues in force, congestion, events
"""
from __future__ import annotations

import json
from typing import Any, Callable, Protocol

from webob import Request, Response

from controller.policy import PolicyError


class Controller(Protocol):
    def policy_document(self) -> Any: ...
    def set_policy(self, document: Any) -> str: ...
    def clear_policy(self) -> str | None: ...
    def status(self) -> dict: ...


def make_app(controller: Controller) -> Callable:
    routes = {
        ("GET", "/qos/v1/policy"): lambda req: (200, controller.policy_document()),
        ("PUT", "/qos/v1/policy"): lambda req: (200, {"applied": controller.set_policy(_json(req))}),
        ("DELETE", "/qos/v1/policy"): lambda req: (200, {"cleared": controller.clear_policy()}),
        ("GET", "/qos/v1/status"): lambda req: (200, controller.status()),
    }

    def app(environ, start_response):
        req = Request(environ)
        handler = routes.get((req.method, req.path))
        allowed = sorted(method for method, path in routes if path == req.path)
        if handler is None:
            code, body = (405, {"error": f"{req.method} not allowed"}) if allowed else (404, {"error": "not found"})
        else:
            try:
                code, body = handler(req)
            except PolicyError as err:
                code, body = 400, {"error": str(err)}
        resp = Response(status=code, content_type="application/json", charset="utf-8",
                        body=json.dumps(body, indent=1).encode() + b"\n")
        if code == 405:
            resp.allow = allowed
        return resp(environ, start_response)
    return app


def _json(req: Request) -> Any:
    try:
        return json.loads(req.body or b"null")
    except ValueError as err:
        raise PolicyError(f"request body: not JSON ({err}); send the policy as a JSON object") from None
