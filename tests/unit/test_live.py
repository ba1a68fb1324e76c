"""The live exporter follows the probe client's output as it is written, whole lines only."""
import threading
import time

from topo.harness.live import StudyGauges, follow, parse_delivered
from topo.net.probe import live_rtt


def test_lines_are_read_as_written_and_a_half_written_one_waits(tmp_path):
    path = tmp_path / "probe.txt"             # absent at first: the client has not started
    seen: list[float | None] = []
    done = threading.Event()
    reader = threading.Thread(target=follow, args=(path, done, lambda line: seen.append(live_rtt(line))))
    reader.start()
    try:
        time.sleep(0.1)
        with path.open("w", encoding="utf-8") as out:
            out.write("[Connected] connection established\nseq=0 rtt=1.5ms rd=1ms sd=0.5ms ipdv=n/a\nseq=1 rtt=2")
            out.flush()
            deadline = time.monotonic() + 5
            while len(seen) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert seen == [None, 0.0015]       # the half-written line is not read as 2 s
            out.write("50µs rd=1ms sd=1ms ipdv=750µs\n")
            out.flush()
            while len(seen) < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
    finally:
        done.set()
        reader.join()
    assert seen == [None, 0.0015, 0.00025]


def test_a_probe_that_never_started_is_given_up_when_done(tmp_path):
    done = threading.Event()
    reader = threading.Thread(target=follow, args=(tmp_path / "never.txt", done, print))
    reader.start()
    done.set()
    reader.join(timeout=2)
    assert not reader.is_alive()


def throughput(gauges: StudyGauges) -> dict[tuple[str, str], float]:
    """(protocol, udp_offered_bps) → bytes/s, as a scrape would find them now."""
    return {(s.labels["protocol"], s.labels["udp_offered_bps"]): s.value
            for metric in gauges.registry.collect() if metric.name == "ovsqos_study_flow_throughput_bytes_per_second"
            for s in metric.samples}


def test_a_new_step_keeps_the_last_rates_until_its_own_are_measured():
    gauges = StudyGauges()
    gauges.step("auto", 0)
    gauges.delivered({"tcp": 0}, 10.0)
    assert throughput(gauges) == {}                       # one count is no rate
    gauges.delivered({"tcp": 500_000}, 11.0)
    assert throughput(gauges) == {("tcp", "0"): 500_000}
    gauges.step("auto", 2)
    assert throughput(gauges) == {("tcp", "0"): 500_000}  # a scrape now still finds TCP
    gauges.delivered({"tcp": 1_000_000, "udp": 250_000}, 12.0)
    assert throughput(gauges) == {("tcp", "2000000"): 500_000}   # UDP's first count is no rate yet
    gauges.delivered(None, 13.0)                          # s2 gone: the network is down
    assert throughput(gauges) == {}


def test_the_accounting_flows_are_read_with_or_without_flags_between_counters_and_match():
    """ovs-ofctl prints a flow's flags after its counters: the controller's flows carry send_flow_rem."""
    dump = (" cookie=0x5153000100000003, duration=4.0s, table=0, n_packets=9, n_bytes=1500, send_flow_rem "
            "priority=40000,udp,in_port=1 actions=output:2\n"
            " cookie=0x5153000100000004, duration=4.0s, table=0, n_packets=9, n_bytes=3000, "
            "priority=40000,tcp,in_port=1 actions=output:2\n"
            " cookie=0x5153000100000005, duration=4.0s, table=0, n_packets=9, n_bytes=7, send_flow_rem "
            "priority=1000,in_port=1 actions=output:2\n")
    assert parse_delivered(dump) == {"udp": 1500, "tcp": 3000}
