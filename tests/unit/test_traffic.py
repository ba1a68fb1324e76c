"""What the traffic runner reads of the kernel to restart a UDP test whose connect datagram was lost: a
listening socket in a process's namespace, and the wait a process blocked in a datagram recv sleeps in."""
import os
import socket
import subprocess
import sys
import time

from topo.net import traffic
from topo.net.traffic import Flow, Ran, _connect_lost, _listening, _Running, _serving


def test_the_connect_wait_covers_the_longest_queueing_and_is_at_least_a_second():
    assert traffic.connect_seconds(5_000_000, 25) == 1.0                      # 25 frames drain in 61 ms
    assert round(traffic.connect_seconds(5_000_000, 1000), 2) == 9.69         # 1000 frames: 2.4 s, four times


def test_a_listening_socket_is_seen_in_the_process_namespace_and_gone_when_closed():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        assert not _listening(os.getpid(), port)
        listener.listen()
        assert _listening(os.getpid(), port)
    assert not _listening(os.getpid(), port)


def test_a_test_is_served_once_its_server_holds_the_control_connection_and_every_data_stream():
    tcp, udp, two = Flow("t", "h1", "h4", 5), Flow("u", "h1", "h4", 5, udp_mbps=1), Flow("p", "h1", "h4", 5, parallel=2)
    with socket.socket() as listener, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as datagrams:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        clients, accepted = [], []
        try:
            for streams in range(3):
                assert _serving(os.getpid(), port, tcp) == (streams >= 2)
                assert _serving(os.getpid(), port, two) == (streams >= 3)
                clients.append(socket.create_connection(("127.0.0.1", port)))
                accepted.append(listener.accept()[0])
            assert _serving(os.getpid(), port, two)
            datagrams.bind(("127.0.0.1", port))
            assert not _serving(os.getpid(), port, udp)          # bound, not yet connected to its client
            datagrams.connect(("127.0.0.1", 9))
            assert _serving(os.getpid(), port, udp)
        finally:
            for s in clients + accepted:
                s.close()


def test_a_udp_client_asleep_in_a_datagram_recv_counts_as_lost_after_the_wait_and_a_sender_never():
    receiver = subprocess.Popen([sys.executable, "-c", "import socket; s = socket.socket(socket.AF_INET, "
                                 "socket.SOCK_DGRAM); s.bind(('127.0.0.1', 0)); s.recv(4)"])
    sender = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.5)
        udp = Flow("udp", "h1", "h4", 5, udp_mbps=1)
        asleep, busy = _Running(Ran(udp, 0.0, 0.0), receiver, 60.0, 5.0), _Running(Ran(udp, 0.0, 0.0), sender, 60.0, 5.0)
        assert not _connect_lost(asleep, 100.0, 1.0)          # first seen asleep: the wait starts
        assert not _connect_lost(asleep, 100.9, 1.0)
        assert _connect_lost(asleep, 101.2, 1.0)
        assert not any(_connect_lost(busy, t, 1.0) for t in (100.0, 105.0))
        tcp = _Running(Ran(Flow("tcp", "h1", "h4", 5), 0.0, 0.0), receiver, 60.0, 5.0)
        assert not any(_connect_lost(tcp, t, 1.0) for t in (100.0, 105.0))
    finally:
        for proc in (receiver, sender):
            proc.kill()
            proc.wait()

