"""Talking to the controller over its REST API, and starting one when none is running."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from controller.core.policy import LOCAL_OVSDB
from topo.harness.host import RunRecord
from topo.net.processes import end

REPO = Path(__file__).resolve().parents[2]
OPENFLOW = ("127.0.0.1", 6653)
START_SECONDS = 90   # imports alone take ~10 s in a TCG-emulated VM (vm/), more on a loaded host
API = "http://127.0.0.1:8080/qos/v1"
STUDY_OWNER = "study"   # the owner of the controller a study starts: its rows are the run's


class ControllerError(RuntimeError):
    """The controller is unreachable or refused a request."""


class ControllerClient:
    openflow_ports: tuple[int, ...] = (OPENFLOW[1],)   # where the study points its switches

    def __init__(self, api: str = API, token: str | None = None):
        self.api = api
        self.token = token if token is not None else os.environ.get("OVSQOS_API_TOKEN", "")

    def status(self) -> dict:
        return self._call("GET", "/status")

    def put_policy(self, document: Any) -> dict:
        """The controller's answer, once every switch holds the policy: applied, in_sync, not_in_sync."""
        return self._call("PUT", "/policy", document)

    def clear_policy(self) -> dict:
        return self._call("DELETE", "/policy")

    def wait(self, ready: Callable[[dict], bool], timeout: float, what: str) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            status = self.status()
            if ready(status):
                return status
            if time.monotonic() > deadline:
                raise ControllerError(f"controller: {what} not reached within {timeout:g} s")
            time.sleep(0.2)

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.api + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return json.load(resp)
        except urllib.error.HTTPError as err:
            raise ControllerError(json.load(err).get("error", str(err))) from None
        except (urllib.error.URLError, OSError) as err:
            raise ControllerError(f"controller REST API at {self.api} unreachable ({err})") from None


def listening(addr: tuple[str, int]) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(addr) == 0


@contextmanager
def controller(log_path: Path, record: RunRecord | None = None, config: Path = REPO / "controller" / "qos.conf",
               ovsdb: tuple[str, ...] = (), openflow_host: str | None = None) -> Iterator[ControllerClient]:
    """The controller already on 127.0.0.1:6653, or one started here (managing switches through the
    OVSDB remotes `ovsdb`, by default the config's; listening for them on `openflow_host`, by default
    the config's 127.0.0.1) and stopped at the end."""
    client = ControllerClient()
    openflow = (openflow_host or OPENFLOW[0], OPENFLOW[1])
    if listening(OPENFLOW):
        if ovsdb or openflow_host:
            raise ControllerError("a controller already listens on 127.0.0.1:6653; this run needs one of its own that "
                                  f"reaches {', '.join(ovsdb)}: stop it")
        try:
            client.status()
        except ControllerError:
            raise ControllerError("something listens on 127.0.0.1:6653 but the QoS controller's REST API "
                                  "does not answer; stop it, or start controller/qos_app.py there") from None
        yield client
        return
    # This run's controller keeps its saved policy beside its log, not in the host's state directory.
    run_config = log_path.with_name("controller.conf")
    run_config.write_text((f"[DEFAULT]\nofp_listen_host = {openflow_host}\n" if openflow_host else "")
                          + f"[qos]\nowner = {STUDY_OWNER}\n"
                          + f"state_file = {log_path.with_name('controller-state.json')}\n"
                          + (f"ovsdb = {','.join(ovsdb)}\n" if ovsdb else ""))
    proc = start(run_config, log_path, config)
    if record:
        record.process(proc.pid, "controller")
        record.rows(STUDY_OWNER, tuple(ovsdb) or (LOCAL_OVSDB,))
    try:
        wait_started(proc, client, openflow, log_path)
        yield client
    finally:
        try:
            client.clear_policy()          # a controller leaves its flows and queues on exit; take them off
        except ControllerError:
            pass                           # it died: the run record's sweep removes what is left
        end(proc, 20)


def start(run_config: Path, log_path: Path, config: Path = REPO / "controller" / "qos.conf",
          append: bool = False) -> subprocess.Popen:
    """The QoS app under osken-manager, `run_config` over the shipped `config`, its output to `log_path` (after
    what is there, with `append`: a restarted member's)."""
    manager = Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin" / "osken-manager"
    with open(log_path, "a" if append else "w") as log:
        return subprocess.Popen([str(manager), "--config-file", str(config), "--config-file", str(run_config),
                                 str(REPO / "controller" / "qos_app.py")],
                                stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)


def wait_started(proc: subprocess.Popen, client: ControllerClient, openflow: tuple[str, int], log_path: Path) -> None:
    """Until it listens for switches and answers its API; ControllerError if it exits first or takes too long."""
    deadline = time.monotonic() + START_SECONDS
    while not (listening(openflow) and _answers(client)):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise ControllerError(f"controller did not start; see {log_path}")
        time.sleep(0.2)


def _answers(client: ControllerClient) -> bool:
    try:
        client.status()
        return True
    except ControllerError:
        return False
