"""topo/net/iperf.py: iperf3 command lines and the reading of its JSON output."""
import pytest

from topo.net.iperf import (
    BASE_PORT,
    RECEIVER_SECONDS,
    REPORT_SECONDS,
    Interval,
    client_args,
    error,
    longest_gap,
    received,
    received_streams,
    sent,
    server_args,
    window_mean_bps,
    window_retransmits,
)

TCP_PORT, UDP_PORT = BASE_PORT, BASE_PORT + 1


def option(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_server_args_serve_one_test_with_json_on_the_port_and_report_every_tenth_of_a_second():
    assert server_args(UDP_PORT) == ["iperf3", "-s", "-1", "-J", "-i", "0.1", "-p", "5202"]
    assert RECEIVER_SECONDS == 0.1


def test_tcp_client_args_with_a_congestion_control():
    args = client_args("10.0.0.4", TCP_PORT, 78, congestion_control="bbr")
    assert args[:3] == ["iperf3", "-c", "10.0.0.4"]
    assert option(args, "-p") == "5201"
    assert option(args, "-t") == "78"
    assert option(args, "-i") == str(REPORT_SECONDS) == "0.5"
    assert option(args, "-C") == "bbr"
    assert "-J" in args and "--get-server-output" in args
    assert "-u" not in args and "-b" not in args


def test_tcp_client_args_leave_the_kernel_default_congestion_control():
    assert "-C" not in client_args("10.0.0.4", TCP_PORT, 10)


def test_parallel_tcp_flows_are_one_test_with_streams():
    assert option(client_args("10.0.0.4", TCP_PORT, 10, parallel=3), "-P") == "3"
    assert "-P" not in client_args("10.0.0.4", TCP_PORT, 10)


@pytest.mark.parametrize("mbps, bandwidth", [(8, "8M"), (2.5, "2.5M"), (12.0, "12M")])
def test_udp_client_args_offer_the_rate_in_mbit_per_second(mbps, bandwidth):
    args = client_args("10.0.0.4", UDP_PORT + 3, 10.0, udp_mbps=mbps)
    assert option(args, "-p") == "5205"
    assert "-u" in args
    assert option(args, "-b") == bandwidth
    assert option(args, "-t") == "10"
    assert "-C" not in args


def test_a_fractional_duration_is_refused_not_silently_shortened():
    # iperf3 reads -t with atoi(): 2.5 would run 2 s.
    with pytest.raises(ValueError, match="whole seconds"):
        client_args("10.0.0.4", UDP_PORT, 2.5, udp_mbps=4)
    assert option(client_args("10.0.0.4", UDP_PORT, 3.0, udp_mbps=4), "-t") == "3"


def iperf_interval(start: float, end: float, bps: float, **extra) -> dict:
    """One entry of iperf3 3.12's "intervals": per-stream figures and their sum."""
    figures = {"socket": 5, "start": start, "end": end, "seconds": end - start,
               "bytes": int(bps * (end - start) / 8), "bits_per_second": bps, **extra}
    return {"streams": [figures], "sum": {k: v for k, v in figures.items() if k != "socket"}}


# A TCP client's document, shaped like iperf3 3.12 -J --get-server-output (trimmed).
TCP_DOC = {
    "start": {"connected": [{"socket": 5, "local_host": "10.0.0.1", "local_port": 40000,
                             "remote_host": "10.0.0.4", "remote_port": 5201}],
              "version": "iperf 3.12", "timestamp": {"time": "Mon, 01 Jan 2024 00:00:00 GMT", "timesecs": 1704067200},
              "test_start": {"protocol": "TCP", "num_streams": 1, "duration": 2}},
    "intervals": [
        iperf_interval(0.0, 0.5, 4.8e6, retransmits=0, snd_cwnd=64000, rtt=12000, omitted=False, sender=True),
        iperf_interval(0.5, 1.0, 4.6e6, retransmits=4, snd_cwnd=32000, rtt=15000, omitted=False, sender=True),
        iperf_interval(1.0, 1.5, 2.0e6, retransmits=10, snd_cwnd=16000, rtt=20000, omitted=False, sender=True),
        iperf_interval(1.5, 2.0, 3.0e6, retransmits=2, snd_cwnd=20000, rtt=18000, omitted=False, sender=True),
    ],
    "end": {"sum_sent": {"start": 0, "end": 2.0, "seconds": 2.0, "bits_per_second": 3.6e6, "retransmits": 16},
            "sum_received": {"start": 0, "end": 2.0, "seconds": 2.0, "bits_per_second": 3.5e6}},
    "server_output_json": {
        "start": {"version": "iperf 3.12", "test_start": {"protocol": "TCP", "num_streams": 1}},
        "intervals": [
            iperf_interval(0.0, 0.5, 4.0e6, omitted=False, sender=False),
            iperf_interval(0.5, 1.0, 4.4e6, omitted=False, sender=False),
            iperf_interval(1.0, 1.5, 2.2e6, omitted=False, sender=False),
            iperf_interval(1.5, 2.0, 3.4e6, omitted=False, sender=False),
        ],
        "end": {"sum_received": {"start": 0, "end": 2.0, "seconds": 2.0, "bits_per_second": 3.5e6}},
    },
}


def test_received_reads_the_server_intervals():
    assert received(TCP_DOC) == [Interval(0.0, 0.5, 4.0e6), Interval(0.5, 1.0, 4.4e6),
                                 Interval(1.0, 1.5, 2.2e6), Interval(1.5, 2.0, 3.4e6)]


def test_sent_reads_the_client_intervals_with_retransmits():
    assert sent(TCP_DOC) == [Interval(0.0, 0.5, 4.8e6, 0), Interval(0.5, 1.0, 4.6e6, 4),
                             Interval(1.0, 1.5, 2.0e6, 10), Interval(1.5, 2.0, 3.0e6, 2)]


def test_a_udp_client_has_no_retransmits_and_a_document_without_server_output_no_intervals():
    udp_doc = {"intervals": [iperf_interval(0.0, 1.0, 2e6, packets=170, omitted=False, sender=True)]}
    assert sent(udp_doc) == [Interval(0.0, 1.0, 2e6, 0)]
    assert received(udp_doc) == []
    assert received({**udp_doc, "server_output_json": None}) == []


def test_error_reports_iperf3s_message():
    assert error({"error": "unable to connect to server: Connection refused"}) == \
        "unable to connect to server: Connection refused"
    assert error(TCP_DOC) is None


INTERVALS = [Interval(0.0, 1.0, 1e6, 2), Interval(1.0, 2.0, 3e6, 4), Interval(2.0, 3.0, 5e6, 10)]


def test_window_mean_weights_intervals_by_their_overlap_after_the_offset():
    # the test started at launcher time 100: [100.5, 102.0] covers half of the first and all of the second
    assert window_mean_bps(INTERVALS, 100.0, 100.5, 102.0) == pytest.approx((0.5 * 1e6 + 1.0 * 3e6) / 1.5)
    assert window_mean_bps(INTERVALS, 100.0, 100.0, 103.0) == pytest.approx(3e6)
    assert window_mean_bps(INTERVALS, 100.0, 101.25, 101.75) == pytest.approx(3e6)


def test_window_mean_is_none_when_no_interval_overlaps():
    assert window_mean_bps(INTERVALS, 100.0, 103.0, 110.0) is None     # after the test
    assert window_mean_bps(INTERVALS, 100.0, 50.0, 100.0) is None      # before it: touching is no overlap
    assert window_mean_bps([], 0.0, 0.0, 10.0) is None


def test_window_mean_of_a_stalled_flow_is_zero_not_none():
    stalled = [Interval(0.0, 1.0, 0.0), Interval(1.0, 2.0, 0.0)]
    assert window_mean_bps(stalled, 0.0, 0.0, 2.0) == 0.0


def test_window_retransmits_prorates_partly_covered_intervals():
    assert window_retransmits(INTERVALS, 100.0, 100.5, 102.0) == 5            # 1 of the first + 4
    assert window_retransmits(INTERVALS, 100.0, 101.0, 102.5) == 9            # 4 + 5 of the third
    assert window_retransmits(INTERVALS, 100.0, 100.0, 103.0) == 16
    assert window_retransmits(INTERVALS, 100.0, 103.0, 110.0) == 0


def test_window_retransmits_skips_empty_intervals():
    assert window_retransmits([Interval(1.0, 1.0, 0.0, 7), Interval(1.0, 2.0, 1e6, 3)], 0.0, 0.0, 2.0) == 3


def test_the_synthetic_document_measured_over_a_step_window():
    # TCP started at launcher time 50; a step window [50.5, 2.0 + 50]
    assert window_mean_bps(received(TCP_DOC), 50.0, 50.5, 52.0) == pytest.approx((4.4e6 + 2.2e6 + 3.4e6) / 3)
    assert window_retransmits(sent(TCP_DOC), 50.0, 50.5, 52.0) == 16


def test_received_streams_reads_each_stream_of_a_parallel_test():
    two = {"server_output_json": {"intervals": [
        {"streams": [{"start": 0.0, "end": 0.25, "bits_per_second": 1e6}, {"start": 0.0, "end": 0.25, "bits_per_second": 3e6}],
         "sum": {"start": 0.0, "end": 0.25, "bits_per_second": 4e6}},
        {"streams": [{"start": 0.25, "end": 0.5, "bits_per_second": 2e6}, {"start": 0.25, "end": 0.5, "bits_per_second": 2e6}],
         "sum": {"start": 0.25, "end": 0.5, "bits_per_second": 4e6}}]}}
    assert received_streams(two) == [[Interval(0.0, 0.25, 1e6), Interval(0.25, 0.5, 2e6)],
                                     [Interval(0.0, 0.25, 3e6), Interval(0.25, 0.5, 2e6)]]
    assert received(two) == [Interval(0.0, 0.25, 4e6), Interval(0.25, 0.5, 4e6)]


def test_longest_gap_finds_the_receivers_silence_inside_a_window():
    # test started at launcher time 10; a report is missing between 11.0 and 12.5
    intervals = [Interval(0.0, 0.5, 1e6), Interval(0.5, 1.0, 1e6), Interval(2.5, 3.0, 1e6)]
    assert longest_gap(intervals, 10.0, 10.0, 13.0) == pytest.approx(1.5)
    assert longest_gap(intervals, 10.0, 10.0, 11.0) == 0.0
    assert longest_gap(intervals, 10.0, 12.8, 14.0) == pytest.approx(1.0)   # after the last report
    assert longest_gap([], 0.0, 0.0, 2.0) == 2.0
