"""The Prometheus that records a study (the user's on 127.0.0.1:9090, or Debian's started here), and
one serving a copy of a past run's data (serving()), with the HTTP API calls both are asked.

One started here keeps its TSDB under the results folder and stops with the run, so the
series can be reopened later: prometheus --storage.tsdb.path=<results>/prometheus ... Under several
controllers (--controllers N) it scrapes every member (its configuration written beside the TSDB).
"""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypedDict

import yaml

from topo.harness.host import RunRecord
from topo.harness.launch import note
from topo.net.processes import end

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "prometheus" / "prometheus.yml"
LISTEN = ("127.0.0.1", 9090)
RESERVED_PORTS = {6653, 8080, 9090, 9101, 9102}   # the controller's, the study's and a user's Prometheus
FIRST_SCRAPE_SECONDS = 15     # how long a Prometheus started here is given to begin scraping


class PrometheusError(RuntimeError):
    """Prometheus did not start or did not answer."""


def tcp_throughput_query(policy: str) -> str:
    """The PromQL of one policy's TCP throughput series, in Mbit/s."""
    return f'8 * ovsqos_study_flow_throughput_bytes_per_second{{protocol="tcp",policy="{policy}"}} / 1e6'


def config_for(controllers: Sequence[str]) -> str:
    """prometheus/prometheus.yml with its controller job scraping `controllers` (host:port each), its rule
    files named by absolute path (a relative one is read beside the configuration)."""
    doc = yaml.safe_load(CONFIG.read_text())
    doc["rule_files"] = [str(CONFIG.parent / name) for name in doc.get("rule_files", [])]
    (job,) = (job for job in doc["scrape_configs"] if job["job_name"] == "controller")
    job["static_configs"] = [{"targets": list(controllers)}]
    return yaml.safe_dump(doc, sort_keys=False)


@contextmanager
def prometheus(data_dir: Path, mode: str = "auto", record: RunRecord | None = None,
               controllers: Sequence[str] = ()) -> Iterator[str | None]:
    """Yields the base URL, or None when recording is off (`mode` "none") or impossible. `controllers`: the
    metrics endpoints (host:port) to scrape, when not only the one controller's."""
    url = f"http://{LISTEN[0]}:{LISTEN[1]}"
    if mode == "none":
        yield None
        return
    if _listening():
        if controllers:
            note(f"the Prometheus on {LISTEN[0]}:{LISTEN[1]} is not this run's: it records every member only if its "
                 f"controller job scrapes {', '.join(controllers)}")
        yield url
        return
    data_dir.mkdir(parents=True, exist_ok=True)
    config = CONFIG
    if controllers:
        config = data_dir / "prometheus.yml"
        config.write_text(config_for(controllers))
    with _running(config, data_dir, LISTEN, data_dir / "prometheus.log", 30,
                  lambda: f"prometheus did not start; see {data_dir / 'prometheus.log'}", record=record,
                  missing_hint="or pass --prometheus none", options=("--storage.tsdb.retention.time=3650d",)) as url:
        # Ready is not scraping: its service discovery hands the scrapers their first targets only at its first
        # update, about 5 s after the start, and a run's first seconds would be missing from its series.
        deadline = time.monotonic() + FIRST_SCRAPE_SECONDS
        while not scraping(url) and time.monotonic() < deadline:
            time.sleep(0.2)
        yield url


@contextmanager
def serving(tsdb: Path) -> Iterator[str]:
    """Debian's prometheus on a copy of `tsdb` (it writes to its data folder), on a spare loopback port and
    scraping nothing; yields its URL. The process and the copy are gone when the block is left, however."""
    tmp = Path(tempfile.mkdtemp(prefix="ovsqos-report-"))
    try:
        shutil.copytree(tsdb, tmp / "data",
                        ignore=shutil.ignore_patterns("lock", "prometheus.log", "queries.active"))
        (tmp / "prometheus.yml").write_text("scrape_configs: []\n")   # a live exporter must not add to the run
        log = tmp / "prometheus.log"

        def failed() -> str:
            last = log.read_text().strip().splitlines()[-1:] or ["(no output)"]
            return f"prometheus did not start on a copy of {tsdb}: {last[0]}"

        with _running(tmp / "prometheus.yml", tmp / "data", ("127.0.0.1", _spare_port()), log, 60, failed) as url:
            yield url
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def _running(config: Path, data: Path, listen: tuple[str, int], log_path: Path, start_seconds: float,
             failed: Callable[[], str], record: RunRecord | None = None, missing_hint: str = "",
             options: tuple[str, ...] = ()) -> Iterator[str]:
    """Debian's prometheus on `data`, listening on `listen`, until the block is left (however)."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise PrometheusError("prometheus is not installed (scripts/setup.sh installs it)"
                              + (f"; {missing_hint}" if missing_hint else ""))
    url = f"http://{listen[0]}:{listen[1]}"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={data}",
                                 f"--web.listen-address={listen[0]}:{listen[1]}", *options],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    if record:
        record.process(proc.pid, "prometheus")
    try:
        deadline = time.monotonic() + start_seconds
        while not ready(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise PrometheusError(failed())
            time.sleep(0.2)
        yield url
    finally:
        end(proc, 20)


def api(url: str, path: str, timeout: float = 60, **params) -> Any:
    """One Prometheus HTTP API call's data."""
    with urllib.request.urlopen(f"{url}{path}?{urllib.parse.urlencode(params)}", timeout=timeout) as resp:
        body = json.load(resp)
    if body.get("status") != "success":
        raise PrometheusError(f"{path} {params} failed: {body.get('error')}")
    return body["data"]


def query_range(url: str, expr: str, start: float, end: float, step: float = 1.0) -> list[tuple[float, float]]:
    data = api(url, "/api/v1/query_range", timeout=10, query=expr, start=start, end=end, step=step)
    return [(float(t), float(v)) for series in data["result"] for t, v in series["values"]]


class RecordedQuery(TypedDict):
    expr: str
    start: float
    end: float
    points: int
    mean_mbps: float | None


def recorded(url: str, expr: str, start: float, end: float) -> RecordedQuery:
    """What Prometheus holds of `expr` (in Mbit/s) over [start, end]: the query, its points and their mean,
    for a results file."""
    points = query_range(url, expr, start, end)
    return {"expr": expr, "start": start, "end": end, "points": len(points),
            "mean_mbps": round(sum(v for _, v in points) / len(points), 3) if points else None}


def _spare_port() -> int:
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in RESERVED_PORTS:
            return port


def _listening() -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(LISTEN) == 0


def scraping(url: str) -> bool:
    """Whether every target has been scraped once (up or not: the controller may start only after)."""
    try:
        targets = api(url, "/api/v1/targets", timeout=1)["activeTargets"]
    except (OSError, PrometheusError, ValueError):
        return False
    return bool(targets) and all(not t.get("lastScrape", "").startswith("0001-") for t in targets)


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=1) as resp:
            return resp.status == 200
    except OSError:
        return False
