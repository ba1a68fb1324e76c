"""Classes a user of the policy language expects, on real OVS, Mininet hosts and iperf3: IPv6 traffic
steered into its class as IPv4 is, and a port queued by linux-hfsc where the kernel has it (and, where it
has not, a port the controller says is not in sync rather than one that silently does nothing)."""
import json
import subprocess
import time

from controller.adapters.tc import Tc
from controller.core.policy import parse_policy
from tests.integration.conftest import NOTHING_LEFT, leftovers, requires_ovs
from topo.harness import capabilities
from topo.harness.controller import controller
from topo.net.network import network
from topo.studies.base import policy_document, queues_in_force
from topo.topos import StudyTopo

pytestmark = requires_ovs
UDP_CLASS, DEFAULT_CLASS = "1:3", "1:1"    # the udp class has queue 2; queue 0 takes the unclassified


def datapath() -> str:
    """The datapath the studies pick on this host (topo/harness/launch.py): the kernel's where it works
    (the VM), else userspace."""
    return "kernel" if "system" in capabilities.environment(capabilities.probe_all())["datapath_types"] else "user"


def hfsc_available() -> bool:
    done = subprocess.run(["tc", "qdisc", "add", "dev", "lo", "root", "handle", "77:", "hfsc"], capture_output=True)
    subprocess.run(["tc", "qdisc", "del", "dev", "lo", "root"], capture_output=True)
    return done.returncode == 0


def listening(net, host: str, port: int) -> bool:
    return f":{port} " in net.host(host).cmd(f"ss -Hltn sport = :{port}")


def until(condition, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s"
        time.sleep(0.1)


def udp_bytes_by_class(net, tmp_path, dst: str, family: str) -> dict[str, int]:
    """Bytes each class of the bottleneck sent while h1 sent UDP at 2 Mbit/s for 3 s to `dst`."""
    tc = Tc()
    try:
        before = {c: k.bytes for c, k in tc.classes("s1-eth1").items()}
        assert not listening(net, "h4", 5301)
        net.popen("h4", ["iperf3", "-s", "-1", "-p", "5301"], tmp_path / f"server-{family}.txt")
        until(lambda: listening(net, "h4", 5301), 10, "the iperf3 server listening")
        client = net.popen("h1", ["iperf3", f"-{family[-1]}", "-c", dst, "-p", "5301", "-u", "-b", "2M", "-t", "3",
                                  "-J"], tmp_path / f"client-{family}.json")
        assert client.wait(30) == 0, (tmp_path / f"client-{family}.json.stderr").read_text()
        assert json.loads((tmp_path / f"client-{family}.json").read_text())["end"]["sum"]["packets"] > 0
        # The last datagrams may still be queued at the bottleneck: read once its classes stop counting.
        last: list[dict] = [{}]

        def still() -> bool:
            now = {c: k.bytes for c, k in tc.classes("s1-eth1").items()}
            same, last[0] = now == last[0], now
            return same
        until(still, 10, "the bottleneck's classes idle")
        return {c: b - before.get(c, 0) for c, b in last[0].items()}
    finally:
        tc.close()


def test_ipv6_udp_is_steered_into_its_class_as_ipv4_is(tmp_path, recorded):
    doc = policy_document("reserve", 5_000_000, 25)
    for flow in doc["switches"]["s1"]["flows"]:
        if "class" in flow:   # each classified match also for IPv6
            flow["match"] = [flow["match"], {**flow["match"], "eth_type": "ipv6"}]
    with controller(tmp_path / "controller.log", recorded) as client:
        client.clear_policy()
        with network(StudyTopo(), datapath(), recorded) as net:
            client.wait(lambda s: {"0000000000000001", "0000000000000002"} <= set(s["switches"]), 30, "switches")
            client.put_policy(doc)
            client.wait(lambda s: queues_in_force(s, parse_policy(doc)), 20, "the reserve queues")
            net.host("h1").cmd("ip -6 addr add fd00::1/64 dev h1-eth0 nodad")
            net.host("h4").cmd("ip -6 addr add fd00::4/64 dev h4-eth0 nodad")
            v6 = udp_bytes_by_class(net, tmp_path, "fd00::4", "ipv6")
            v4 = udp_bytes_by_class(net, tmp_path, net.host("h4").IP(), "ipv4")
            client.clear_policy()   # while the ports are there: our rows go with the policy
    sent = 2e6 / 8 * 3
    for family, moved in (("ipv6", v6), ("ipv4", v4)):
        assert moved[UDP_CLASS] > 0.7 * sent, (family, moved)
        assert moved[DEFAULT_CLASS] < 0.05 * sent, (family, moved)   # neighbour discovery, ARP, iperf3's control
    assert leftovers() == NOTHING_LEFT


def test_a_linux_hfsc_port_queues_by_class_where_the_kernel_has_hfsc_and_says_so_where_not(tmp_path, recorded):
    doc = policy_document("reserve", 5_000_000, 25)
    doc["switches"]["s1"]["ports"][1]["qos_type"] = "linux-hfsc"
    with controller(tmp_path / "controller.log", recorded) as client:
        client.clear_policy()
        with network(StudyTopo(), datapath(), recorded) as net:
            client.wait(lambda s: {"0000000000000001", "0000000000000002"} <= set(s["switches"]), 30, "switches")
            answer = client.put_policy(doc)
            qos_type = subprocess.run(["ovs-vsctl", "get", "qos", subprocess.run(
                ["ovs-vsctl", "get", "port", "s1-eth1", "qos"], capture_output=True, text=True).stdout.strip(),
                "type"], capture_output=True, text=True).stdout.strip()
            assert qos_type == "linux-hfsc"
            if hfsc_available():
                assert answer["in_sync"], answer
                assert "qdisc hfsc 1: root" in subprocess.run(["tc", "qdisc", "show", "dev", "s1-eth1"],
                                                             capture_output=True, text=True).stdout
                moved = udp_bytes_by_class(net, tmp_path, net.host("h4").IP(), "ipv4")
                assert moved[UDP_CLASS] > 0.7 * 2e6 / 8 * 3, moved
            else:
                # OVS cannot build the classes; the answer and the status say which port, and why.
                assert not answer["in_sync"]
                assert "did not build" in json.dumps(answer["not_in_sync"]), answer
            cleared = client.clear_policy()
            # Answered once the refused queues are off (not while the port waited for its next retry).
            assert cleared["in_sync"], cleared
            assert subprocess.run(["ovs-vsctl", "get", "port", "s1-eth1", "qos"], capture_output=True,
                                  text=True).stdout.strip() == "[]"
    assert leftovers() == NOTHING_LEFT
