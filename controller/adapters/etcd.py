"""etcd's JSON gateway (its v3 API over HTTP, /v3/ on etcd 3.4), as every part of a cluster's member reaches it:
a request and its answer, keys and values in base64, the conditions of a transaction, and what a failure
means, said in one line. Every call is a short HTTP request (green under os-ken's eventlet); a failure raises
CoordinationError.

The URL is the one OpenStack services give tooz for etcd: etcd3+http://HOST:PORT, or etcd3+https:// with
?ca_cert=...&cert_cert=...&cert_key=... (and timeout=SECONDS, each request's). The URL's CA is the only
trust for etcd: requests would let REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE in the environment override it.
"""
from __future__ import annotations

import base64
import contextlib
import json
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

CONNECTIONS = 256          # kept open to etcd: a hand-over releases each switch at once, on a greenthread of its own
LEASE_GONE = "Not Found"   # what etcd's gateway answers a write on a lease it no longer has (HTTP 404)
Post = Callable[[str, dict[str, Any]], dict[str, Any]]


class CoordinationError(RuntimeError):
    """etcd did not answer, or refused. `unknown`: the request may have reached etcd and been carried out (its
    answer was lost, or etcd said it timed out); False only when it cannot have left this host."""

    def __init__(self, message: str, unknown: bool = False):
        super().__init__(message)
        self.unknown = unknown


class Gateway:
    """One etcd, as a member's event loop asks it (`post`); `poster` gives an OS thread a session of its own
    (requests' sessions are not thread-safe). `highest`: etcd's highest revision in an answer the loop got;
    `went_back`: (that revision, a lower one etcd answered later) once etcd's revisions went back, which they
    never do but when etcd lost its data (emptied, or restored from an older snapshot); recovery.py clears it."""

    def __init__(self, url: str, timeout: float) -> None:
        import etcd3gw  # only a cluster's member needs it (and it is not in Ryu's venv)
        parsed = urllib.parse.urlsplit(url)
        query = dict(urllib.parse.parse_qsl(parsed.query))
        self._client = etcd3gw.client(host=parsed.hostname or "localhost", port=parsed.port or 2379,
                                      protocol="https" if parsed.scheme.endswith("https") else "http",
                                      ca_cert=query.get("ca_cert"), cert_key=query.get("cert_key"),
                                      cert_cert=query.get("cert_cert"), timeout=float(query.get("timeout", timeout)))
        self._trust_env = "ca_cert" not in query
        self._configure(self._client.session)
        self.highest = 0
        self.went_back: tuple[int, int] | None = None

    def _configure(self, session: Any) -> None:
        import requests.adapters  # type: ignore[import-untyped]  # etcd3gw's HTTP client
        session.trust_env = self._trust_env
        # requests keeps 10 connections a host by default, and says so in a warning for each one more.
        for scheme in ("http://", "https://"):
            session.mount(scheme, requests.adapters.HTTPAdapter(pool_maxsize=CONNECTIONS))

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        floor = self.highest    # answered before this was sent: etcd serves this at that revision or later
        try:
            answer: dict[str, Any] = self._client.post(self._client.get_url(path), json=body)
        except Exception as err:   # noqa: BLE001 - etcd3gw and requests raise many kinds; all mean "not reached"
            raise CoordinationError(why(err), unknown=not _unsent(err)) from None
        revision = int(answer.get("header", {}).get("revision", 0))
        if 0 < revision < floor and self.went_back is None:
            self.went_back, self.highest = (floor, revision), revision
        self.highest = max(self.highest, revision)
        return answer

    def poster(self) -> Post:
        """A POST to etcd for an OS thread, on a session of its own; its answers are no one else's to hear."""
        import requests
        session = requests.Session()
        session.verify, session.cert = self._client.session.verify, self._client.session.cert
        self._configure(session)
        timeout = self._client.timeout

        def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
            try:
                answer = session.post(self._client.get_url(path), json=body, timeout=timeout)
                if answer.status_code == 404:      # said as the loop's client says it (etcd3gw's text)
                    raise CoordinationError(LEASE_GONE)
                answer.raise_for_status()
                result: dict[str, Any] = answer.json()
            except CoordinationError:
                raise
            except Exception as err:   # noqa: BLE001
                raise CoordinationError(why(err)) from None
            return result
        return post

    @contextlib.contextmanager
    def watch(self, prefix: str) -> Iterator[Iterator[bytes]]:
        """etcd's watch of every key under `prefix`: the lines of its stream (the first says it is made, each
        other a batch of events), until the connection ends."""
        body = {"create_request": {"key": b64(prefix), "range_end": b64(range_end(prefix))}}
        with self._client.session.post(self._client.get_url("/watch"), json=body, stream=True,
                                       timeout=(self._client.timeout, None)) as answer:
            answer.raise_for_status()
            yield answer.iter_lines()


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def text(value: str) -> str:
    return base64.b64decode(value).decode()


def value(kv: dict[str, Any]) -> Any:
    """A key's JSON value."""
    return json.loads(text(kv.get("value", "")))


def as_read(key: str, kvs: list[dict[str, Any]]) -> dict[str, Any]:
    """A transaction's condition: `key` (base64) still as a range read found it (`kvs`), modified by nobody since,
    or still absent."""
    return {"key": key, "result": "EQUAL", "target": "MOD", "mod_revision": kvs[0]["mod_revision"]} if kvs \
        else absent(key)


def absent(key: str) -> dict[str, Any]:
    """A transaction's condition: the key (base64) does not exist."""
    return {"key": key, "result": "EQUAL", "target": "CREATE", "create_revision": 0}


def range_end(prefix: str) -> str:
    """The key after every key that starts with `prefix` (etcd's prefix range)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def under(prefix: str) -> dict[str, str]:
    """A range request's bounds for every key under `prefix`."""
    return {"key": b64(prefix), "range_end": b64(range_end(prefix))}


def kvs(answer: dict[str, Any], k: int | None = None) -> list[dict[str, Any]]:
    """The keys a range read found: of the answer itself, or of the k-th request of a transaction."""
    found: list[dict[str, Any]] = (answer if k is None else answer["responses"][k]["response_range"]).get("kvs", [])
    return found


def why(err: BaseException) -> str:
    """One line: the error's text, or (etcd3gw raises some without any) its cause's."""
    said = " ".join(str(err).split())[:300]
    cause = err.__cause__ or err.__context__
    if not said and cause is not None:
        return f"{type(err).__name__}: {why(cause)}"
    return said or type(err).__name__


def _unsent(err: BaseException) -> bool:
    """Whether a request that failed with `err` never reached etcd: the connection was refused or not made in time."""
    import requests
    from urllib3.exceptions import MaxRetryError, NewConnectionError
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, requests.exceptions.ConnectTimeout) or \
                isinstance(seen, MaxRetryError) and isinstance(seen.reason, NewConnectionError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
