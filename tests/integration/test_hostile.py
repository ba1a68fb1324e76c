"""Hostile and faulty peers against the real controller and real OVS: a connection that claims a live
switch's datapath id, two hundred hung ones closed at once, garbage on the OpenFlow port, idle HTTP clients
by the thousand, policies that nothing downstream can carry, and a state directory that cannot be written.
The switches keep being served, and every refusal is one line."""
import functools
import json
import signal
import socket
import struct
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from controller.core.connections import CLAIM_SECONDS
from tests.integration.conftest import controller_config, requires_ovs, start_controller, stop_controller
from tests.integration.test_reliability import (  # noqa: F401
    DPIDS,
    bridges,
    controller,
    in_sync,
    our_flows,
    policy,
    port_qos,
    rest,
    sh,
    wait,
    wait_polls,
)

pytestmark = requires_ovs
OFP13 = 4
HELLO, ECHO_REQUEST, ECHO_REPLY, FEATURES_REQUEST, FEATURES_REPLY = 0, 2, 3, 5, 6
MULTIPART_REQUEST, MULTIPART_REPLY, PORT_DESC = 18, 19, 13


class FakePeer:
    """A TCP peer on the OpenFlow port that speaks as much OpenFlow 1.3 as it is told to."""

    def __init__(self):
        self.sock = socket.create_connection(("127.0.0.1", 6653), timeout=5)
        self.buf = b""

    def send(self, msg_type: int, body: bytes = b"", xid: int = 0, version: int = OFP13, length: int | None = None):
        self.sock.sendall(struct.pack("!BBHI", version, msg_type, length or 8 + len(body), xid) + body)

    def receive(self) -> tuple[int, int]:
        while len(self.buf) < 8 or len(self.buf) < struct.unpack_from("!H", self.buf, 2)[0]:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed by the controller")
            self.buf += data
        _, msg_type, length, xid = struct.unpack_from("!BBHI", self.buf)
        self.buf = self.buf[length:]
        return msg_type, xid

    def claim(self, dp_id: int) -> None:
        """The handshake a switch makes, with `dp_id` for its datapath id and no ports."""
        self.ports(self.handshake(dp_id))

    def handshake(self, dp_id: int) -> int:
        """The handshake up to the controller's request for the switch's ports: that request's xid."""
        self.send(HELLO)
        while True:
            msg_type, xid = self.receive()
            if msg_type == FEATURES_REQUEST:
                self.send(FEATURES_REPLY, struct.pack("!QIBB2xII", dp_id, 0, 254, 0, 0, 0), xid)
            elif msg_type == MULTIPART_REQUEST:
                return xid
            elif msg_type == ECHO_REQUEST:
                self.send(ECHO_REPLY, b"", xid)

    def ports(self, xid: int) -> None:
        """No ports: the handshake's last answer."""
        self.send(MULTIPART_REPLY, struct.pack("!HH4x", PORT_DESC, 0), xid)

    def close(self) -> None:
        self.sock.close()


def tracebacks(log) -> int:
    return log.read_text().count("Traceback")


@pytest.mark.parametrize("leaves", ["at once", "when closed by the controller"])
def test_a_connection_claiming_a_live_bridges_datapath_id_does_not_take_the_bridge_out_of_management(
        controller, leaves):   # noqa: F811
    _, tmp_path, names = controller
    assert rest("PUT", "/policy", policy("reserve"))[0] == 200
    wait(lambda: in_sync("reserve"), 20, "the policy in force")
    peer = FakePeer()
    peer.claim(DPIDS[0])
    if leaves == "at once":
        peer.close()
    else:
        with pytest.raises(ConnectionError):     # the controller asks the bridge, which answers: the peer goes
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                msg_type, xid = peer.receive()
                if msg_type == ECHO_REQUEST:
                    peer.send(ECHO_REPLY, b"", xid)
        peer.close()
    wait_polls(3)                                 # the bridge itself still answers the controller's polls
    status = rest("GET", "/status")[1]
    assert f"{DPIDS[0]:016x}" in status["switches"] and in_sync("reserve"), status
    sh("ovs-ofctl", "-O", "OpenFlow13", "del-flows", names[0])
    wait(lambda: len(our_flows(names[0])) == 4, 2.5, "flows deleted by hand repaired")
    code, answer = rest("DELETE", "/policy")
    assert code == 200 and answer["in_sync"] is True, answer
    assert port_qos(f"{names[0]}p2") == "[]"
    log = (tmp_path / "controller.log").read_text()
    if leaves != "at once":
        assert "another connection claimed it while the switch answers on its own" in log
    assert "Traceback" not in log


STALLED = 200            # old connections closed at once: more than the 128 events os-ken's event queue holds
STALLED_DPID = 0xC105E000


def ended(peer: FakePeer) -> bool:
    """Whether the controller has closed its end of `peer`: what waits is read, then an end of file."""
    peer.sock.setblocking(False)
    try:
        while peer.sock.recv(65536):
            pass
        return True
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def test_two_hundred_hung_connections_closed_at_once_after_a_stall_leave_the_controller_answering(
        controller):   # noqa: F811
    """200 switches reconnect while their old connections hang (no echo answered): each old one is closed
    CLAIM_SECONDS later, by the close a switch silent to its polls gets too. The controller stalled past that
    (SIGSTOP, as a loaded host stalls it), the 200 claims fall due at once into its event queue of 128 (unstalled,
    each close has a timer's event to itself and the queue never fills). Each close posts that connection's end
    to the same queue: made by the event loop itself rather than a greenthread of its own, it waits for room
    only the loop can make, and nothing is answered again."""
    proc, tmp_path, names = controller
    assert rest("PUT", "/policy", policy("reserve"))[0] == 200
    wait(lambda: in_sync("reserve"), 20, "the policy in force")
    old, new = [], []
    try:
        for k in range(STALLED):
            old.append(FakePeer())
            old[-1].claim(STALLED_DPID + k)
        asked = []
        for k in range(STALLED):
            new.append(FakePeer())
            asked.append(new[-1].handshake(STALLED_DPID + k))
        first = time.monotonic()              # before any claim's timer runs: the new connections claim at once
        for peer, xid in zip(new, asked):
            peer.ports(xid)
        for peer in old:
            while peer.receive()[0] != ECHO_REQUEST:   # the old connection asked: its claim's timer runs
                pass
        proc.send_signal(signal.SIGSTOP)
        try:
            stalled = time.monotonic()
            assert stalled - first < CLAIM_SECONDS, "claims fell due one by one before the stall"
            assert not any(ended(peer) for peer in old)
            time.sleep(CLAIM_SECONDS + 0.5)   # every claim due
        finally:
            proc.send_signal(signal.SIGCONT)
        wait(lambda: all(ended(peer) for peer in old), 10, "every old connection closed by the controller")
        assert in_sync("reserve")
        sh("ovs-ofctl", "-O", "OpenFlow13", "del-flows", names[0])
        wait(lambda: len(our_flows(names[0])) == 4, 2.5, "flows deleted by hand repaired")
        log = (tmp_path / "controller.log").read_text()
        assert log.count("the new one is the switch now") == STALLED and "Traceback" not in log, log[-3000:]
    finally:
        for peer in old + new:
            peer.close()


# What each peer sends, and the lines it may cost: os-ken waits for the rest of what a header announces
# (an HTTP request's "GET " reads as a 21536-byte message), so a peer that leaves first costs none.
GARBAGE = {
    "http": (lambda peer: peer.sock.sendall(b"GET / HTTP/1.0\r\n\r\n"), 0),
    "unknown version": (lambda peer: peer.send(HELLO, version=0x09), 1),
    "truncated features": (lambda peer: (peer.send(HELLO), time.sleep(0.3), peer.send(FEATURES_REPLY, b"\x00\x01")),
                           1),
    "junk": (lambda peer: peer.sock.sendall(b"\xff\xff\x00\x08" + b"\xff" * 252), 1),
}


def closed_by_the_controller(peer_port: int) -> bool:
    return not sh("ss", "-tnH", "state", "established", "state", "close-wait",
                  f"( sport = :6653 and dport = :{peer_port} )").strip()


def test_garbage_on_the_openflow_port_is_one_line_per_peer_and_the_switches_are_served_on(controller):  # noqa: F811
    _, tmp_path, names = controller
    assert rest("PUT", "/policy", policy("reserve"))[0] == 200
    wait(lambda: in_sync("reserve"), 20, "the policy in force")
    log = tmp_path / "controller.log"
    lines = len(log.read_text().splitlines())
    for name, (send, expected) in GARBAGE.items():
        peer = FakePeer()
        port = peer.sock.getsockname()[1]
        send(peer)
        peer.close()
        # Its line, if any, is written before the controller closes its end (listeners.guard_openflow).
        wait(functools.partial(closed_by_the_controller, port), 10, f"{name}: the controller's end closed")
        new = log.read_text().splitlines()[lines:]
        lines += len(new)
        assert len(new) == expected and "Traceback" not in "\n".join(new), (name, new)
    sh("ovs-ofctl", "-O", "OpenFlow13", "del-flows", names[1])
    wait(lambda: len(our_flows(names[1])) == 4, 2.5, "a switch still served")


def test_a_thousand_idle_http_clients_do_not_hold_the_api(controller):  # noqa: F811
    idle = []
    try:
        for _ in range(1030):
            idle.append(socket.create_connection(("127.0.0.1", 8080), timeout=5))
        started = time.monotonic()
        with urllib.request.urlopen("http://127.0.0.1:8080/qos/v1/status", timeout=10) as resp:
            assert resp.status == 200
        assert time.monotonic() - started < 5
    finally:
        for sock in idle:
            sock.close()


@pytest.mark.parametrize("change, field", [
    (lambda d: d["switches"]["b0"]["ports"][2].update(capacity=10**400), "switches.b0.ports.2.capacity"),
    (lambda d: d["classes"]["udp"].update(police={"rate": "1" * 401}), "classes.udp.police.rate"),
    (lambda d: d["switches"]["b0"]["flows"][2].update({"class": []}), "switches.b0.flows[2].class"),
    (lambda d: d["switches"]["b0"]["flows"][2].update({"class": {}}), "switches.b0.flows[2].class"),
    (lambda d: d["classes"].update({"tc\x00p": d["classes"].pop("tcp")}), "classes.'tc\\x00p'"),
    (lambda d: d.update(name="\ud800"), "name"),
])
def test_what_ovsdb_prometheus_or_a_log_cannot_carry_is_a_400_and_the_old_policy_stays(controller, change,  # noqa: F811
                                                                                        field):
    _, tmp_path, _ = controller
    assert rest("PUT", "/policy", policy("good"))[0] == 200
    doc = policy("bad")
    change(doc)
    body = json.dumps(doc).encode()               # JSON escapes the NUL and the lone surrogate as \u....
    req = urllib.request.Request("http://127.0.0.1:8080/qos/v1/policy", data=body, method="PUT")
    try:
        urllib.request.urlopen(req, timeout=30)
        raise AssertionError("accepted")
    except urllib.error.HTTPError as err:
        assert err.code == 400 and json.load(err)["error"].startswith(field + ": ")
    assert rest("GET", "/policy")[1]["name"] == "good" and in_sync("good")
    with urllib.request.urlopen("http://127.0.0.1:9101/metrics", timeout=10) as resp:
        assert resp.status == 200 and 'ovsqos_policy_info{policy="good"} 1.0' in resp.read().decode()
    assert "Traceback" not in (tmp_path / "controller.log").read_text()


def http(head: str, *body: bytes) -> tuple[int, dict]:
    """A PUT of the policy as written here, byte for byte, and the controller's answer, read once all of
    it is sent (as most clients do). A small send buffer: a body the server leaves unread cannot hide in
    the host's buffers."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 16)
        sock.settimeout(30)
        sock.connect(("127.0.0.1", 8080))
        sock.sendall(f"PUT /qos/v1/policy HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{head}\r\n".encode())
        for part in body:
            sock.sendall(part)
        response = b""
        while data := sock.recv(65536):
            response += data
    status, _, content = response.partition(b"\r\n\r\n")
    return int(status.split()[1]), json.loads(content)


def chunks(data: bytes, size: int = 4096) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(data[k:k + size]), data[k:k + size])
                    for k in range(0, len(data), size)) + b"0\r\n\r\n"


def test_a_chunked_body_is_applied_over_one_mib_is_413_and_one_cut_short_is_a_400_without_a_traceback(
        controller):  # noqa: F811
    _, tmp_path, _ = controller
    document = json.dumps(policy("chunked")).encode()
    code, answer = http("Transfer-Encoding: chunked\r\n", chunks(document))
    assert (code, answer["applied"]) == (200, "chunked") and in_sync("chunked")
    assert http("Transfer-Encoding: chunked\r\n", chunks(b" " * (1300 * 1024) + document)) == \
        (413, {"error": "request body: more than the 1048576 bytes a policy may have"})
    assert http("Content-Length: 100\r\n", b'{"na') == \
        (400, {"error": "request body: ended before the 100 bytes its Content-Length says; send the whole body"})
    assert rest("GET", "/policy")[1]["name"] == "chunked"
    assert "Traceback" not in (tmp_path / "controller.log").read_text()


def test_with_a_token_an_unauthenticated_2_mib_put_reads_a_401(tmp_path):
    token = "0123456789abcdef-token"
    proc = start_controller(controller_config(tmp_path / "qos.conf", api_token=token), tmp_path / "controller.log")
    try:
        code, answer = http(f"Content-Length: {2 << 20}\r\n", b" " * (2 << 20))
        assert code == 401 and "Authorization: Bearer" in answer["error"]
    finally:
        stop_controller(proc, clear=False)


def test_a_read_only_state_directory_is_a_500_that_says_so_and_keeps_the_policy(tmp_path, bridges):  # noqa: F811
    state = tmp_path / "state"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(state)], check=True)
    proc = start_controller(controller_config(tmp_path / "qos.conf", state_file=str(state / "test.json")),
                            tmp_path / "controller.log")
    try:
        for method, body in (("PUT", policy("reserve")), ("DELETE", None)):
            code, answer = rest(method, "/policy", body)
            assert code == 500 and answer["error"].startswith("cannot save the policy in force: ") and \
                "Read-only file system" in answer["error"], answer
        assert rest("GET", "/policy")[1] is None
        log = (tmp_path / "controller.log").read_text()
        assert "Traceback" not in log and log.count("cannot save the policy in force") == 2, log[-2000:]
    finally:
        stop_controller(proc, clear=False)
        subprocess.run(["umount", str(state)], check=True)


def test_sigterm_in_the_middle_of_a_400_port_apply_stops_within_seconds_and_leaves_ovsdb_consistent(tmp_path):
    import threading

    from topo.net.bridges import idle_bridges, policy_switches
    with idle_bridges(400, 20, prefix="st", first_dp_id=0x5000) as idle:
        doc = {"name": "many", "classes": policy("x")["classes"],
               "switches": policy_switches(idle, "100Mbit", "reserve")}
        config = controller_config(tmp_path / "qos.conf")
        proc = start_controller(config, tmp_path / "controller.log")
        try:
            wait(lambda: len(rest("GET", "/status")[1]["switches"]) == 20, 30, "the 20 bridges connected")
            assert not any(rows("QoS").values())
            put = threading.Thread(target=answered, args=("PUT", "/policy", doc), daemon=True)
            put.start()
            # The apply is under way (OVSDB holds some of its QoS) and not answered yet: stopped now, the
            # controller is in the middle of it.
            wait(lambda: any(rows("QoS").values()), 30, "the first QoS of the apply")
            assert put.is_alive(), "the 400-port apply was answered before it could be interrupted"
            proc.send_signal(15)
            stopped = time.monotonic()
            proc.wait(10)
            took = time.monotonic() - stopped
            assert took < 5, took
            # Consistent: each QoS row of ours is on a port, each Queue row of ours in a QoS of ours.
            qos = rows("QoS")
            queues = rows("Queue")
            assert any(qos.values()) and any(queues.values())   # else the checks below hold of nothing
            used = set(sh("ovs-vsctl", "--bare", "--columns=qos", "list", "port").split())
            assert {u for u, owner in qos.items() if owner} <= used
            in_qos = set(sh("ovs-vsctl", "--bare", "--columns=queues", "list", "qos").replace("=", " ").split())
            assert {u for u, owner in queues.items() if owner} <= in_qos
            log = (tmp_path / "controller.log").read_text()
            assert "Traceback" not in log and "exit: flows and queues left in place" in log, log[-3000:]
            # A restart carries the saved policy on, and a DELETE leaves nothing of ours.
            proc = start_controller(config, tmp_path / "second.log")
            wait(lambda: len(rest("GET", "/status")[1]["switches"]) == 20, 30, "the bridges again")
            code, answer = rest("DELETE", "/policy")
            assert code == 200 and answer["in_sync"], answer
            assert not any(rows("QoS").values()) and not any(rows("Queue").values())
        finally:
            stop_controller(proc, clear=False)


def answered(*args) -> None:
    """A request whose answer the controller's stop may cut off."""
    try:
        rest(*args)
    except OSError:          # http.client.RemoteDisconnected is one
        pass


def rows(table: str) -> dict[str, bool]:
    """uuid → whether the row is the test controller's (owner test)."""
    out = json.loads(sh("ovs-vsctl", "--format=json", "--columns=_uuid,external_ids", "list", table))
    found = {}
    for (_, uuid), (_, ids) in out["data"]:   # ["uuid", U], ["map", [[key, value], ...]] (empty: no ids)
        found[uuid] = ["ovs-qos-controller", "test"] in ids
    return found
