"""The Prometheus that records a study: the user's on 127.0.0.1:9090, or Debian's started here.

One started here keeps its TSDB under the results folder and stops with the run, so the
series can be reopened later: prometheus --storage.tsdb.path=<results>/prometheus ...
"""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from topo.harness.host import RunRecord

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "prometheus" / "prometheus.yml"
LISTEN = ("127.0.0.1", 9090)


class PrometheusError(RuntimeError):
    """Prometheus did not start or did not answer."""


def tcp_throughput_query(policy: str) -> str:
    """The PromQL of one policy's TCP throughput series, in Mbit/s."""
    return f'8 * ovsqos_study_flow_throughput_bytes_per_second{{protocol="tcp",policy="{policy}"}} / 1e6'


@contextmanager
def prometheus(data_dir: Path, mode: str = "auto", record: RunRecord | None = None) -> Iterator[str | None]:
    """Yields the base URL, or None when recording is off (`mode` "none") or impossible."""
    url = f"http://{LISTEN[0]}:{LISTEN[1]}"
    if mode == "none":
        yield None
        return
    if _listening():
        yield url
        return
    binary = shutil.which("prometheus")
    if binary is None:
        raise PrometheusError("prometheus is not installed (scripts/setup.sh installs it); "
                              "or pass --prometheus none")
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(data_dir / "prometheus.log", "w") as log:
        proc = subprocess.Popen([binary, f"--config.file={CONFIG}", f"--storage.tsdb.path={data_dir}",
                                 f"--web.listen-address={LISTEN[0]}:{LISTEN[1]}", "--storage.tsdb.retention.time=3650d"],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    if record:
        record.process(proc.pid, "prometheus")
    try:
        deadline = time.monotonic() + 30
        while not ready(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise PrometheusError(f"prometheus did not start; see {data_dir / 'prometheus.log'}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def query_range(url: str, expr: str, start: float, end: float, step: float = 1.0) -> list[tuple[float, float]]:
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{url}/api/v1/query_range?{params}", timeout=10) as resp:
        body = json.load(resp)
    if body.get("status") != "success":
        raise PrometheusError(f"query {expr!r} failed: {body.get('error')}")
    return [(float(t), float(v)) for series in body["data"]["result"] for t, v in series["values"]]


def _listening() -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(LISTEN) == 0


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False
