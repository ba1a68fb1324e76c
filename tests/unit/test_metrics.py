"""controller/adapters/metrics.py: the exposition Prometheus scrapes from the controller."""
import gzip
import re
import threading

import pytest
from eventlet import tpool
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.parser import text_string_to_metric_families

from controller.adapters.metrics import MAX_AGE, CachedExposition, ControllerCollector, Snapshot
from controller.core.stats import ALL_ONES, MeterCounters, PortCounters, QueueCounters
from controller.core.telemetry import FabricFigures, SwitchTelemetry

DP1 = "0000000000000001"
DP_BIG = "00000000000000ab"


def snapshot() -> Snapshot:
    return Snapshot(
        switches={
            1: SwitchTelemetry(
                ports={1: PortCounters(rx_bytes=1000, tx_bytes=2000, rx_packets=10, tx_packets=20,
                                       rx_dropped=1, tx_dropped=2, rx_errors=0, tx_errors=ALL_ONES)},
                queues={(1, 0): QueueCounters(tx_bytes=300, tx_packets=3, tx_errors=0),
                        (1, 2): QueueCounters(tx_bytes=ALL_ONES, tx_packets=40, tx_errors=7)},
                meters={(0x51530002, "udp"): MeterCounters(packets=900, bytes=1_300_000, dropped_packets=400)},
                capacity_bps={1: 5_000_000}, congested={1: True}, programmed={1: True},
                events={(1, "program"): 2, (1, "rollback"): 1}),
            0xab: SwitchTelemetry(ports={3: PortCounters(5, 6, 7, 8, 9, 10, 11, 12)}, congested={3: False})},
        policy="reserve",
        load_error=True,
        ovsdb_connected={"unix:/var/run/openvswitch/db.sock": True, "tcp:127.0.0.2:6640": False},
        fabric=FabricFigures(links=48, hosts=16, moves=3, packet_ins={"probe": 900, "arp": 16},
                             refused={"forged": 1}),
    )


@pytest.fixture
def registry():
    reg = CollectorRegistry()
    reg.register(ControllerCollector(snapshot))
    return reg


def port(dp: str, p: int) -> dict:
    return {"dp_id": dp, "port": str(p)}


def test_port_counters_are_exposed_as_totals_labelled_by_datapath_and_port(registry):
    value = registry.get_sample_value
    assert value("ovsqos_port_tx_bytes_total", port(DP1, 1)) == 2000
    assert value("ovsqos_port_rx_bytes_total", port(DP1, 1)) == 1000
    assert value("ovsqos_port_tx_packets_total", port(DP1, 1)) == 20
    assert value("ovsqos_port_tx_dropped_total", port(DP1, 1)) == 2
    assert value("ovsqos_port_rx_errors_total", port(DP1, 1)) == 0
    assert value("ovsqos_port_tx_errors_total", port(DP_BIG, 3)) == 12


def test_counters_the_switch_does_not_keep_are_absent(registry):
    assert registry.get_sample_value("ovsqos_port_tx_errors_total", port(DP1, 1)) is None
    assert registry.get_sample_value("ovsqos_queue_tx_bytes_total", {**port(DP1, 1), "queue": "2"}) is None
    assert registry.get_sample_value("ovsqos_queue_tx_packets_total", {**port(DP1, 1), "queue": "2"}) == 40
    assert str(ALL_ONES) not in generate_latest(registry).decode()
    assert "1.8446744073709552e+19" not in generate_latest(registry).decode()


def test_queue_counters_carry_the_queue_label(registry):
    assert registry.get_sample_value("ovsqos_queue_tx_bytes_total", {**port(DP1, 1), "queue": "0"}) == 300
    assert registry.get_sample_value("ovsqos_queue_tx_errors_total", {**port(DP1, 1), "queue": "2"}) == 7


def test_meter_counters_carry_the_meter_and_its_class(registry):
    labels = {"dp_id": DP1, "meter": str(0x51530002), "class": "udp"}
    assert registry.get_sample_value("ovsqos_meter_packets_total", labels) == 900
    assert registry.get_sample_value("ovsqos_meter_bytes_total", labels) == 1_300_000
    assert registry.get_sample_value("ovsqos_meter_dropped_packets_total", labels) == 400


def test_every_metric_the_controller_exports_is_listed_for_the_dashboards(registry):
    from tests.dashboard_queries import EXPORTED_METRICS
    families = {f.name + ("_total" if f.type == "counter" else ""): f.type for f in registry.collect()}
    assert families == {n: k for n, k in EXPORTED_METRICS.items() if not n.startswith("ovsqos_study_")}


def test_the_fabric_says_what_it_found_and_what_its_switches_sent_it(registry):
    value = registry.get_sample_value
    assert (value("ovsqos_fabric_links"), value("ovsqos_fabric_hosts"), value("ovsqos_fabric_moves_total")) == (48, 16, 3)
    assert value("ovsqos_fabric_packet_ins_total", {"kind": "probe"}) == 900
    assert value("ovsqos_fabric_probes_refused_total", {"reason": "forged"}) == 1


def test_without_a_network_section_there_are_no_fabric_metrics():
    reg = CollectorRegistry()
    reg.register(ControllerCollector(Snapshot))
    assert not [f for f in reg.collect() if f.name.startswith("ovsqos_fabric")]


def test_each_ovsdb_remote_is_connected_or_not(registry):
    assert registry.get_sample_value("ovsqos_ovsdb_connected", {"remote": "unix:/var/run/openvswitch/db.sock"}) == 1
    assert registry.get_sample_value("ovsqos_ovsdb_connected", {"remote": "tcp:127.0.0.2:6640"}) == 0


def test_capacity_is_in_bytes_per_second(registry):
    assert registry.get_sample_value("ovsqos_port_capacity_bytes_per_second", port(DP1, 1)) == 625_000


def test_congestion_and_programmed_queues_are_zero_or_one(registry):
    assert registry.get_sample_value("ovsqos_port_congested", port(DP1, 1)) == 1
    assert registry.get_sample_value("ovsqos_port_congested", port(DP_BIG, 3)) == 0
    assert registry.get_sample_value("ovsqos_port_queues_programmed", port(DP1, 1)) == 1


def test_qos_events_count_per_action(registry):
    assert registry.get_sample_value("ovsqos_qos_events_total", {**port(DP1, 1), "action": "program"}) == 2
    assert registry.get_sample_value("ovsqos_qos_events_total", {**port(DP1, 1), "action": "rollback"}) == 1


def test_policy_info_and_load_error(registry):
    assert registry.get_sample_value("ovsqos_policy_info", {"policy": "reserve"}) == 1
    assert registry.get_sample_value("ovsqos_policy_load_error") == 1


def test_an_empty_snapshot_has_no_policy_and_no_load_error():
    reg = CollectorRegistry()
    reg.register(ControllerCollector(Snapshot))
    text = generate_latest(reg).decode()
    assert reg.get_sample_value("ovsqos_policy_load_error") == 0
    assert "ovsqos_policy_info{" not in text
    assert "# TYPE ovsqos_port_tx_bytes_total counter" in text


def test_the_exposition_parses_and_counters_end_in_total(registry):
    text = generate_latest(registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert {"ovsqos_port_tx_bytes", "ovsqos_queue_tx_errors", "ovsqos_port_capacity_bytes_per_second",
            "ovsqos_qos_events", "ovsqos_policy_info", "ovsqos_policy_load_error"} <= set(families)
    assert families["ovsqos_port_tx_bytes"].type == "counter"
    assert families["ovsqos_port_congested"].type == "gauge"
    counters = re.findall(r"^# TYPE (\S+) counter$", text, re.MULTILINE)
    # port, queue, meter, then qos events, openflow errors, drift repairs, polls, OVSDB bridge reads, then the
    # fabric's moves, packet-ins and probes refused
    assert len(counters) == 8 + 3 + 3 + 5 + 3
    assert all(name.endswith("_total") for name in counters)
    samples = [line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")]
    counter_families = {name[:-len("_total")] for name in counters}
    for name in samples:
        if name.removesuffix("_total") in counter_families:
            assert name.endswith("_total"), name


def scrape(app, accept: str = "", encoding: str = "") -> tuple[str, dict, bytes]:
    answer: dict = {}
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": "", "HTTP_ACCEPT": accept,
               "HTTP_ACCEPT_ENCODING": encoding}
    body = b"".join(app(environ, lambda status, headers, exc_info=None: answer.update(status=status,
                                                                                     headers=dict(headers))))
    return answer["status"], answer["headers"], body


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_scrape_is_served_from_the_cache_and_shows_a_change_once_the_cache_time_is_over():
    snap, renders, clock = snapshot(), [], Clock()
    reg = CollectorRegistry()
    reg.register(ControllerCollector(lambda: renders.append(clock.now) or snap))
    app = CachedExposition(reg, clock=clock)
    assert 'ovsqos_policy_info{policy="reserve"} 1.0' in scrape(app)[2].decode()
    snap.policy = "auto"
    for _ in range(50):                     # a crowd of scrapers within the cache time: one render
        clock.now += (MAX_AGE - 0.01) / 50
        status, headers, body = scrape(app)
        assert status == "200 OK" and 'policy="reserve"' in body.decode() and 'policy="auto"' not in body.decode()
    assert renders == [100.0]
    clock.now = 100.0 + MAX_AGE
    assert 'ovsqos_policy_info{policy="auto"} 1.0' in scrape(app)[2].decode()
    assert len(renders) == 2


def test_each_format_and_encoding_is_cached_apart():
    reg = CollectorRegistry()
    reg.register(ControllerCollector(snapshot))
    app = CachedExposition(reg, clock=Clock())
    _, headers, text = scrape(app)
    assert headers["Content-Type"].startswith("text/plain") and not text.endswith(b"# EOF\n")
    _, headers, body = scrape(app, encoding="gzip")
    assert headers["Content-Encoding"] == "gzip" and gzip.decompress(body) == text
    _, headers, body = scrape(app, accept="application/openmetrics-text; version=1.0.0")
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    assert body == openmetrics.generate_latest(reg) and body.count(b"# EOF") == 1
    assert scrape(app)[2] == text == generate_latest(reg)


def test_a_render_reads_the_core_here_and_leaves_its_formatting_to_another_thread_a_family_at_a_time():
    """The families are collected by the caller (the event loop: they read the core); the formatting, nearly
    all of a render's time, runs where `offload` puts it: by default eventlet's pool of OS threads. Each family
    is formatted before the next is collected, so that a scrape holds one family's samples at a time."""
    collected, made = [], []
    collector = ControllerCollector(lambda: collected.append(threading.get_ident()) or snapshot())

    class Counted:
        def collect(self):
            for family in collector.collect():
                made.append(family.name)
                yield family
    reg = CollectorRegistry()
    reg.register(Counted())
    offloaded = []

    def offload(fn, *args):
        offloaded.append((fn.__name__, len(made)))
        return fn(*args)
    body = scrape(CachedExposition(reg, clock=Clock(), offload=offload))[2]
    families = len(made)
    assert body == generate_latest(reg) and families > 20 and collected[0] == threading.get_ident()
    assert offloaded == [("_format", k) for k in range(1, families + 1)] + [("_join", families)]
    formatted = []
    real = CachedExposition(reg, clock=Clock())                   # tpool: a thread of its own
    real._offload = lambda fn, *args: tpool.execute(lambda: formatted.append(threading.get_ident()) or fn(*args))
    assert scrape(real)[2] == generate_latest(reg) and formatted and formatted[0] != threading.get_ident()


def test_a_render_shows_one_moment_though_the_switches_are_polled_between_its_families(net):
    """The event loop runs while a family is formatted in the OS thread: what it changes meanwhile is not in
    the families collected after (a scrape's counters are of one moment, as a rate over scrapes assumes)."""
    from tests.unit.fakes import up
    up(net, "auto")
    reg = CollectorRegistry()
    reg.register(ControllerCollector(lambda: net.app.core.snapshot(net.app.clock)))
    before, polled = generate_latest(reg), []

    def offload(fn, *args):
        if not polled:
            polled.append(net.app.poll())                     # a poll's replies, while the first family formats
        return fn(*args)
    assert scrape(CachedExposition(reg, clock=Clock(), offload=offload))[2] == before
    assert polled and generate_latest(reg) != before           # the poll moved the counters


def test_a_policy_with_a_network_section_counts_the_fabric_from_0_whether_it_covers_a_switch_or_not(net):
    """The study's `auto` lists both of its switches: nothing is forwarded by the fabric, and its dashboard
    panel shows 0 rather than no data."""
    from tests.unit.fakes import shipped, up
    up(net, "auto")
    assert shipped("auto").get("network") is not None
    reg = CollectorRegistry()
    reg.register(ControllerCollector(lambda: net.app.core.snapshot(net.app.clock)))
    assert reg.get_sample_value("ovsqos_fabric_links") == 0
    assert reg.get_sample_value("ovsqos_fabric_packet_ins_total", {"kind": "source"}) == 0


def test_each_switchs_bridge_reads_are_counted_by_remote_and_datapath():
    reg = CollectorRegistry()
    reg.register(ControllerCollector(Snapshot, lambda: {"unix:/run/db.sock": {1: 3, 0xab: 1}}))
    assert reg.get_sample_value("ovsqos_ovsdb_bridge_reads_total", {"remote": "unix:/run/db.sock", "dp_id": DP1}) == 3
    assert reg.get_sample_value("ovsqos_ovsdb_bridge_reads_total",
                                {"remote": "unix:/run/db.sock", "dp_id": DP_BIG}) == 1
