"""topo/net/probe.py: the latency probe's command lines, irtt's JSON read into round trips (a real irtt
0.9 output, trimmed, one packet marked lost as irtt marks it), and the summary of a window."""
import json
from pathlib import Path

from topo.net.probe import RoundTrip, client_args, live_rtt, percentile, round_trips, server_args, summary

DOC = json.loads((Path(__file__).parent / "data" / "irtt.json").read_text())


def test_a_voice_call_every_20_ms_marked_ef():
    assert client_args("10.0.0.3", 12, "/r/probe.json") == [
        "irtt", "client", "-i", "20ms", "-d", "12s", "-l", "172", "--dscp=184", "-o", "/r/probe.json",
        "10.0.0.3:2112"]
    assert server_args("10.0.0.3") == ["irtt", "server", "-b", "10.0.0.3:2112"]


def test_round_trips_read_send_time_rtt_ipdv_and_loss_in_seconds():
    trips = round_trips(DOC)
    ns = [None if t.rtt is None else round(t.rtt * 1e9) for t in trips]
    assert ns == [429586, 102853, 109876, 124904, None, 156754]
    assert round(trips[0].sent, 3) == 1795481382.942
    assert [None if t.ipdv is None else round(t.ipdv * 1e9) for t in trips] == [None, 326733, 7023, 15028, None, None]


def test_a_window_summary_in_milliseconds_with_the_share_lost():
    trips = round_trips(DOC)
    whole = summary(trips, trips[0].sent, trips[-1].sent)
    assert whole == {"probe_rtt_ms": {"median": 0.12, "p95": 0.43, "max": 0.43, "p5": 0.1, "p25": 0.11, "p75": 0.16},
                     "probe_ipdv_p95_ms": 0.33, "probe_loss_percent": 16.67, "probe_packets": 6,
                     "probe_lost_back": 1}   # irtt's "true_down": the server echoed it
    empty = summary(trips, 0.0, 1.0)
    assert set(empty["probe_rtt_ms"].values()) == {None} and empty["probe_packets"] == 0
    assert empty["probe_ipdv_p95_ms"] is None and empty["probe_loss_percent"] is None


def test_percentiles_take_the_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 95), percentile(values, 50), percentile(values, 100)) == (95.0, 50.0, 100.0)
    assert percentile([7.0], 95) == 7.0 and percentile([], 95) is None


def test_only_lost_packets_in_a_window_is_a_full_loss():
    trips = [RoundTrip(10.0, None), RoundTrip(10.02, None)]
    assert summary(trips, 9.0, 11.0)["probe_loss_percent"] == 100.0


def test_the_clients_per_packet_lines_give_the_rtt_live():
    assert live_rtt("seq=12 rtt=1.52ms rd=1.2ms sd=320µs ipdv=40µs") == 0.00152
    assert live_rtt("seq=3 rtt=429.6µs rd=327.7µs sd=101.9µs ipdv=n/a") == 429.6e-6
    assert live_rtt("seq=4 lost") is None and live_rtt("                         Min     Mean   Median") is None
