"""Prometheus metrics of the controller: polled switch counters through a custom collector.

Counters come from the switches, so they are exposed as they were last read
(a collector), not incremented here. Base units, `_total` on counters.

The exposition is rendered at most once per MAX_AGE and served from a cache in between: eventlet runs
every scraper whose request is ready before the event loop's next turn, so 30 scrapers rendering in
turn held each step of a PUT back by a whole round of renders (docs/benchmarks.md, bench/scrape.py).
A render's families are collected in the event loop (they read the core) and formatted in an OS thread
(eventlet's tpool): formatting is nearly all of a render (prometheus_client's sample_line; 1.8-3.7 s
for 10,000 ports), which in the loop's thread held every poll and answer back that long. Each family is
formatted before the next is collected: 10,000 ports' families held at once (230,000 samples, each with a
labels dict of its own) were over 100 MiB of a scrape's peak memory, the largest alone about a third.
"""
from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from eventlet import tpool
from prometheus_client import make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import Collector

from controller.core.stats import ALL_ONES
from controller.core.telemetry import FabricFigures, Snapshot

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIEnvironment

PORT_COUNTERS = ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets",
                 "rx_dropped", "tx_dropped", "rx_errors", "tx_errors")
QUEUE_COUNTERS = ("tx_bytes", "tx_packets", "tx_errors")
MAX_AGE = 0.5   # seconds; Prometheus scrapes every 1 s (prometheus/prometheus.yml), the switches are polled as often
METER_COUNTERS = {"packets": "Packets that reached the meter", "bytes": "Bytes that reached the meter",
                  "dropped_packets": "Packets the meter's drop band dropped"}


def _dp(dp_id: int) -> str:
    return f"{dp_id:016x}"


class ControllerCollector(Collector):
    def __init__(self, snapshot: Callable[[], Snapshot],
                 bridge_reads: Callable[[], Mapping[str, Mapping[int, int]]] = dict):
        """`bridge_reads`: by OVSDB remote, how many times each datapath's bridge was read from its replica."""
        self._snapshot, self._bridge_reads = snapshot, bridge_reads

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        switches = sorted(snap.switches.items())
        for name in PORT_COUNTERS:
            family = CounterMetricFamily(f"ovsqos_port_{name}", f"Port {name.replace('_', ' ')} read from the switch",
                                         labels=["dp_id", "port"])
            for dp, sw in switches:
                for port, counters in sorted(sw.ports.items()):
                    value = getattr(counters, name)
                    if value != ALL_ONES:   # the switch does not count it
                        family.add_metric([_dp(dp), str(port)], value)
            yield family
        for name in QUEUE_COUNTERS:
            family = CounterMetricFamily(f"ovsqos_queue_{name}", f"Queue {name.replace('_', ' ')} read from the "
                                         "switch (linux-htb: tx errors are the class's drops)",
                                         labels=["dp_id", "port", "queue"])
            for dp, sw in switches:
                for (port, queue), queue_counters in sorted(sw.queues.items()):
                    value = getattr(queue_counters, name)
                    if value != ALL_ONES:
                        family.add_metric([_dp(dp), str(port), str(queue)], value)
            yield family
        for name, doc in METER_COUNTERS.items():
            family = CounterMetricFamily(f"ovsqos_meter_{name}", f"{doc}, read from the switch",
                                         labels=["dp_id", "meter", "class"])
            for dp, sw in switches:
                for (meter, cls), meter_counters in sorted(sw.meters.items()):
                    family.add_metric([_dp(dp), str(meter), cls], getattr(meter_counters, name))
            yield family
        yield _per_port("ovsqos_port_capacity_bytes_per_second", "Capacity of the port in the policy",
                        {(dp, p): v / 8 for dp, sw in switches for p, v in sw.capacity_bps.items()})
        yield _per_port("ovsqos_port_congested", "1 while the port is congested",
                        {(dp, p): v for dp, sw in switches for p, v in sw.congested.items()})
        yield _per_port("ovsqos_port_queues_programmed", "1 while reservation queues are in force on the port",
                        {(dp, p): v for dp, sw in switches for p, v in sw.programmed.items()})
        events = CounterMetricFamily("ovsqos_qos_events", "Reservation queues programmed or rolled back",
                                     labels=["dp_id", "port", "action"])
        for dp, sw in switches:
            for (port, action), count in sorted(sw.events.items()):
                events.add_metric([_dp(dp), str(port), action], count)
        yield events
        errors = CounterMetricFamily("ovsqos_openflow_errors", "OpenFlow error messages the switches sent back",
                                     labels=["dp_id", "error"])
        for dp, sw in switches:
            for error, count in sorted(sw.openflow_errors.items()):
                errors.add_metric([_dp(dp), error], count)
        yield errors
        repairs = CounterMetricFamily("ovsqos_drift_repairs", "Differences from the policy found on a switch, in "
                                      "OVSDB or on a device, and repaired", labels=["kind"])
        for kind, count in sorted(snap.drift_repairs().items()):
            repairs.add_metric([kind], count)
        yield repairs
        polls = CounterMetricFamily("ovsqos_polls", "Statistics polls the switch answered in full", labels=["dp_id"])
        for dp, sw in switches:
            if sw.polls:
                polls.add_metric([_dp(dp)], sw.polls)
        yield polls
        yield _per_switch("ovsqos_poll_duration_seconds", "How long the last statistics poll took, request to "
                          "last reply", {dp: sw.poll_duration for dp, sw in switches if sw.poll_duration is not None})
        yield _per_switch("ovsqos_poll_lag_seconds", "How late the last statistics poll was sent",
                          {dp: sw.poll_lag for dp, sw in switches if sw.poll_lag is not None})
        yield _per_switch("ovsqos_switch_in_sync", "1 while the switch holds exactly what the policy says",
                          {k: float(v) for k, v in snap.in_sync.items()})
        remotes = GaugeMetricFamily("ovsqos_ovsdb_connected", "1 while the controller is connected to the OVSDB "
                                    "remote", labels=["remote"])
        for remote, up in sorted(snap.ovsdb_connected.items()):
            remotes.add_metric([remote], float(up))
        yield remotes
        reads = CounterMetricFamily("ovsqos_ovsdb_bridge_reads", "Times a switch's bridge (its ports, their numbers "
                                    "and declared capacities) was read from the OVSDB replica: when it connects, "
                                    "and again when one of its own rows changes", labels=["remote", "dp_id"])
        for remote, by_dp in sorted(self._bridge_reads().items()):
            for dp, count in sorted(by_dp.items()):
                reads.add_metric([remote, _dp(dp)], count)
        yield reads
        role = GaugeMetricFamily("ovsqos_controller_role", "1 for this controller's role: active (holds the OVSDB "
                                 "lock, OpenFlow master) or standby (slave)", labels=["role"])
        role.add_metric([snap.role], 1)
        yield role
        info = GaugeMetricFamily("ovsqos_policy_info", "The policy in force", labels=["policy"])
        if snap.policy is not None:
            info.add_metric([snap.policy], 1)
        yield info
        yield GaugeMetricFamily("ovsqos_policy_load_error", "1 when the last policy load or apply failed",
                                value=int(snap.load_error))
        if snap.fabric is not None:
            yield from _fabric(snap.fabric)


def _fabric(figures: FabricFigures) -> Iterator[Metric]:
    """The controller's own forwarding under a policy's network: section."""
    yield GaugeMetricFamily("ovsqos_fabric_links", "Links found between the switches", value=figures.links)
    yield GaugeMetricFamily("ovsqos_fabric_hosts", "Hosts learned on edge ports", value=figures.hosts)
    yield CounterMetricFamily("ovsqos_fabric_moves", "Traffic to a host moved off a full link by adaptive paths, "
                              "or moved back", value=figures.moves)
    packet_ins = CounterMetricFamily("ovsqos_fabric_packet_ins", "Packets the switches sent the controller, by "
                                     "kind: probe, arp, source (a new one), destination (an unknown one)",
                                     labels=["kind"])
    for kind, count in sorted(figures.packet_ins.items()):
        packet_ins.add_metric([kind], count)
    yield packet_ins
    refused = CounterMetricFamily("ovsqos_fabric_probes_refused", "Discovery frames refused (forged, replayed, "
                                  "stale, from or onto a host's port)", labels=["reason"])
    for reason, count in sorted(figures.refused.items()):
        refused.add_metric([reason], count)
    yield refused


def _per_switch(name: str, doc: str, values: Mapping[int, float]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=["dp_id"])
    for dp, value in sorted(values.items()):
        family.add_metric([_dp(dp)], float(value))
    return family


def _per_port(name: str, doc: str, values: Mapping[tuple[int, int], float]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=["dp_id", "port"])
    for (dp, port), value in sorted(values.items()):
        family.add_metric([_dp(dp), str(port)], float(value))
    return family


class CachedExposition:
    """The WSGI app of the metrics port: prometheus_client's, with each format's answer (text or
    OpenMetrics, gzipped or not) rendered at most once per `max_age` seconds and served again until then,
    its formatting done by `offload` (an OS thread). Only a plain GET is cached, so the cache holds a few
    entries whatever clients send; scrapers that come while one renders wait for its answer."""

    def __init__(self, registry: Collector, max_age: float = MAX_AGE, clock: Callable[[], float] = time.monotonic,
                 offload: Callable[..., bytes] = tpool.execute):
        self._registry, self._app = registry, make_wsgi_app(registry)
        self._max_age, self._clock, self._offload = max_age, clock, offload
        self._cache: dict[tuple[str, bool], tuple[float, list[tuple[str, str]], bytes]] = {}
        self._rendering = threading.Lock()      # green under os-ken: a scraper waits, the loop does not

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if (environ["REQUEST_METHOD"] != "GET" or environ.get("QUERY_STRING")
                or environ.get("PATH_INFO") == "/favicon.ico"):
            uncached: Iterable[bytes] = self._app(environ, start_response)
            return uncached
        encoder, content_type = choose_encoder(environ.get("HTTP_ACCEPT") or "")
        key = (content_type, gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING") or ""))
        with self._rendering:
            now = self._clock()
            hit = self._cache.get(key)
            if hit is None or now - hit[0] >= self._max_age:
                end = encoder(_Families([]))        # what an exposition ends with (OpenMetrics: "# EOF")
                parts = [self._offload(_format, encoder, _Families([family]), end)
                         for family in self._registry.collect()]         # here: it reads the core
                body = self._offload(_join, parts, end, key[1])
                headers = [("Content-Type", content_type), *([("Content-Encoding", "gzip")] if key[1] else [])]
                hit = self._cache[key] = (now, headers, body)
        start_response("200 OK", list(hit[1]))
        return [hit[2]]


class _Families:
    """Metric families already collected, as the exposition's encoders take them (a registry's collect())."""

    def __init__(self, families: list[Metric]):
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families


def _format(encoder: Callable[[Any], bytes], families: _Families, end: bytes) -> bytes:
    text = encoder(families)
    return text[:len(text) - len(end)] if end and text.endswith(end) else text


def _join(parts: list[bytes], end: bytes, gzipped: bool) -> bytes:
    body = b"".join(parts) + end
    return gzip.compress(body) if gzipped else body
