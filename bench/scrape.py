"""The control path while /metrics is scraped hard: does a scrape starve a PUT?

    sudo .venv/bin/python -m bench.scrape --bridges 2 --ports 20 --scrapers 30 --puts 30

Creates the bridges (as bench/scale.py does), starts the real controller (or uses the one on
127.0.0.1:8080 with --running), puts a policy in which every port is an `auto` port, then times
--puts PUTs of it (its name alternating, so each is a change the metrics show) and as many
GET /status, first on a quiet controller, then while --scrapers threads each GET /metrics in a loop
(keep-alive, as Prometheus scrapes). Deletes the policy and removes everything, Ctrl-C included.
One line per figure:

  put_quiet_seconds       PUT latency without scrapers: median, p95, max
  status_quiet_seconds    GET /status latency without scrapers
  put_scraped_seconds     PUT latency while the scrapers run
  status_scraped_seconds  GET /status latency while the scrapers run
  scrapes_per_second      scrapes answered (200) per second, all scrapers together
  scrape_seconds          one scrape's latency, as a scraper sees it
  scrape_errors           scrapes that failed or got another status than 200
"""
from __future__ import annotations

import argparse
import http.client
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

from bench.process import bench_main, measured
from topo.harness.controller import ControllerClient
from topo.net.bridges import idle_bridges, policy_switches

METRICS = ("127.0.0.1", 9101)
MAX_SCRAPES = 1_000_000   # per scraper: the loop is bounded even if the stop is never seen


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bridges", type=int, default=2)
    p.add_argument("--ports", type=int, default=20, help="ports per bridge")
    p.add_argument("--scrapers", type=int, default=30, help="threads scraping /metrics at once")
    p.add_argument("--puts", type=int, default=30, help="PUTs (and GET /status) timed per phase")
    p.add_argument("--pause", type=float, default=0.1, help="seconds between two timed requests")
    p.add_argument("--seconds", type=float, default=120, help="the scraped phase ends by then, PUTs done or not")
    p.add_argument("--running", action="store_true", help="use the controller already on 127.0.0.1:8080")
    p.add_argument("--log", type=Path, help="keep the controller's log here (default: a temporary file)")
    args = p.parse_args(argv)
    # Started in the background, a process inherits SIGINT ignored; SIGTERM cleans up as Ctrl-C does.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    return bench_main("scrape", args, run, "scrapers stopped, bridges, controller and queues removed")


def run(args, tmp: Path, record) -> int:
    print(f"bridges {args.bridges} x ports {args.ports}, {args.scrapers} scrapers", flush=True)
    context = measured(args, tmp, record)
    with context as client, idle_bridges(args.bridges * args.ports, args.ports, prefix="scrape",
                                         record=record) as bridges:
        client.wait(lambda s: len(s["switches"]) == len(bridges), 120, "every bridge connected")
        switches = policy_switches(bridges, "100Mbit")
        documents = [{"name": name, "classes": {"tcp": {"queue": 1, "min": "80%", "max": "100%"},
                                                "udp": {"queue": 2, "min": "10%", "max": "100%", "priority": 1}},
                      "switches": switches} for name in ("scrape-a", "scrape-b")]
        client.put_policy(documents[1])   # the first apply programs the queues; the timed ones change the name
        quiet = _timed(client, documents, args.puts, args.pause, time.monotonic() + args.seconds)
        scrapers = Scrapers(args.scrapers)
        try:
            time.sleep(1.0)   # every scraper connected and busy
            scrapers.mark()
            scraped = _timed(client, documents, args.puts, args.pause, time.monotonic() + args.seconds)
            scrapes, window, latencies, errors = scrapers.since_mark()
        finally:
            scrapers.stop()
    print(f"put_quiet_seconds       {_figures(quiet['put'])}")
    print(f"status_quiet_seconds    {_figures(quiet['status'])}")
    print(f"put_scraped_seconds     {_figures(scraped['put'])}")
    print(f"status_scraped_seconds  {_figures(scraped['status'])}")
    print(f"scrapes_per_second      {scrapes / window:.0f}  ({scrapes} in {window:.1f} s)")
    print(f"scrape_seconds          {_figures(latencies)}")
    print(f"scrape_errors           {errors}")
    return 0


def _timed(client: ControllerClient, documents: list[dict], count: int, pause: float,
           deadline: float) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"put": [], "status": []}
    for k in range(count):
        if time.monotonic() > deadline:
            print(f"  {k} of {count} PUTs within the time allowed", flush=True)
            break
        started = time.monotonic()
        client.put_policy(documents[k % 2])
        times["put"].append(time.monotonic() - started)
        started = time.monotonic()
        client.status()
        times["status"].append(time.monotonic() - started)
        time.sleep(pause)
    return times


def _figures(values: list[float]) -> str:
    if not values:
        return "none"
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"median {statistics.median(ordered):.3f}  p95 {p95:.3f}  max {ordered[-1]:.3f}  (n={len(ordered)})"


class Scrapers:
    """Threads that each GET /metrics over one keep-alive connection as fast as it is answered."""

    def __init__(self, count: int):
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._marked, self._at = False, 0.0
        self.scrapes, self.errors = 0, 0
        self.latencies: list[float] = []
        self._threads = [threading.Thread(target=self._scrape, daemon=True) for _ in range(count)]
        for thread in self._threads:
            thread.start()

    def mark(self) -> None:
        """Count from now on."""
        with self._lock:
            self.scrapes, self.errors, self.latencies, self._marked = 0, 0, [], True
            self._at = time.monotonic()

    def since_mark(self) -> tuple[int, float, list[float], int]:
        with self._lock:
            return self.scrapes, time.monotonic() - self._at, list(self.latencies), self.errors

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(15)

    def _scrape(self) -> None:
        conn = http.client.HTTPConnection(*METRICS, timeout=10)
        try:
            for _ in range(MAX_SCRAPES):
                if self._stop.is_set():
                    return
                started = time.monotonic()
                try:
                    conn.request("GET", "/metrics")
                    resp = conn.getresponse()
                    resp.read()
                    ok = resp.status == 200
                except (OSError, http.client.HTTPException):
                    conn.close()   # reconnects at the next request
                    ok = False
                elapsed = time.monotonic() - started
                with self._lock:
                    if self._marked:
                        self.scrapes += ok
                        self.errors += not ok
                        self.latencies.append(elapsed)
        finally:
            conn.close()


if __name__ == "__main__":
    sys.exit(main())
