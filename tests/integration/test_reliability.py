"""The controller as an operator relies on it, against real OVS: its config honoured, bad configs
refused in one line, one controller per owner and port, concurrent changes serialised, drift of every
kind repaired within two polls, a restart with a policy in force that a running TCP flow does not
notice, and meters a restart adopts as they are."""
import concurrent.futures
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid

import pytest
import yaml

from controller.core.policy import load_document
from tests.integration.conftest import (
    NOTHING_LEFT,
    REPO,
    controller_config,
    forget_datapaths,
    leftovers,
    requires_ovs,
    start_controller,
    stop_controller,
)

pytestmark = requires_ovs
API = "http://127.0.0.1:8080/qos/v1"
DPIDS = (0xA01, 0xA02)


def sh(*args) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def rest(method: str, path: str, body=None, token: str | None = None):
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    req = urllib.request.Request(API + path, data=None if body is None else json.dumps(body).encode(),
                                 method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


def wait(condition, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s"
        time.sleep(0.1)


def polls() -> dict[str, float]:
    """Statistics polls each switch answered in full, as the controller's metrics count them."""
    with urllib.request.urlopen("http://127.0.0.1:9101/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {dp: float(n) for dp, n in re.findall(r'^ovsqos_polls_total\{dp_id="([0-9a-f]+)"\} (\S+)$', text, re.M)}


def wait_polls(count: int, seconds: float = 20) -> None:
    """Until every connected switch has answered `count` more polls (a switch in sync may not have been
    polled yet): what a claim that nothing changed in that time rests on, rather than on a sleep."""
    switches = set(rest("GET", "/status")[1]["switches"])
    assert switches, "no switch is connected"
    before = polls()
    wait(lambda: all(polls().get(dp, 0) >= before.get(dp, 0) + count for dp in switches), seconds,
         f"{count} more polls of every switch")


@pytest.fixture
def bridges():
    """Two userspace bridges of four veth ports each (OpenFlow ports 1-4), secure fail mode, pointed
    at the controller; removed afterwards."""
    tag = uuid.uuid4().hex[:4]
    names, links = [], []
    forget_datapaths(*DPIDS)
    for k, dpid in enumerate(DPIDS):
        bridge = f"rl{tag}{k}"
        args = ["ovs-vsctl", "add-br", bridge, "--", "set", "bridge", bridge, "datapath_type=netdev",
                "protocols=OpenFlow13", "fail_mode=secure", f"other_config:datapath-id={dpid:016x}"]
        for port in range(1, 5):
            iface = f"rl{tag}{k}p{port}"
            sh("ip", "link", "add", iface, "type", "veth", "peer", "name", iface + "x")
            sh("ip", "link", "set", iface, "up")
            links.append(iface)
            args += ["--", "add-port", bridge, iface, "--", "set", "interface", iface, f"ofport_request={port}"]
        sh(*args)
        sh("ovs-vsctl", "set-controller", bridge, "tcp:127.0.0.1:6653")
        names.append(bridge)
    try:
        yield names
    finally:
        for bridge in names:
            subprocess.run(["ovs-vsctl", "--if-exists", "del-br", bridge], capture_output=True)
        for iface in links:
            subprocess.run(["ip", "link", "del", iface], capture_output=True)


def policy(name: str, queues: str = "reserve") -> dict:
    """Both bridges forward 1 <-> 2 and steer tcp/udp into the classes of port 2, which reserves."""
    doc = load_document(REPO / "policies" / "reserve.yaml")
    flows = [{"priority": 1000, "match": {"in_port": 1}, "actions": [{"output": 2}]},
             {"priority": 1000, "match": {"in_port": 2}, "actions": [{"output": 1}]},
             *({"priority": 40000, "match": {"in_port": 1, "ip_proto": proto}, "class": proto,
                "actions": [{"output": 2}]} for proto in ("udp", "tcp"))]
    doc["name"] = name
    doc["switches"] = {f"b{k}": {"dp_id": dpid, "flows": flows,
                                 "ports": {2: {"capacity": "10Mbit", "queues": queues, "queue_packets": 50}}}
                       for k, dpid in enumerate(DPIDS)}
    return doc


@pytest.fixture
def controller(tmp_path, bridges):
    proc = start_controller(controller_config(tmp_path / "qos.conf"), tmp_path / "controller.log")
    try:
        assert proc.poll() is None, (tmp_path / "controller.log").read_text()[-2000:]
        wait(lambda: len(rest("GET", "/status")[1]["switches"]) == 2, 20, "both bridges connected")
        yield proc, tmp_path, bridges
    finally:
        stop_controller(proc)
    assert (leftovers()["qos"], leftovers()["queues"]) == ("", ""), (tmp_path / "controller.log").read_text()[-3000:]


def in_sync(name: str) -> bool:
    status = rest("GET", "/status")[1]
    return status["policy"] == name and all(s["in_sync"] for s in status["switches"].values()) and \
        len(status["switches"]) == 2


def our_flows(bridge: str) -> list[str]:
    return [line for line in sh("ovs-ofctl", "-O", "OpenFlow13", "dump-flows", bridge).splitlines()
            if "cookie=0x5153" in line]


def port_qos(iface: str) -> str:
    return sh("ovs-vsctl", "get", "port", iface, "qos").strip()


# --- config -----------------------------------------------------------------------------------

@pytest.mark.parametrize("options, message", [
    ({"policy": "/nonexistent.yaml"}, "error: /nonexistent.yaml: cannot read policy file (No such file or directory)"),
    ({"owner": "no spaces"}, "error: [qos] owner: 'no spaces' is not 1-64 letters"),
    ({"api_host": "0.0.0.0"}, "error: [qos] api_token: required because api_host 0.0.0.0 is not loopback"),
    ({"api_port": "http"}, "error: [qos] Value for option api_port"),
    ({"metrics_port": "8080"}, "error: [qos] metrics_port: the same address as the REST API"),
])
def test_a_bad_config_exits_2_with_one_line_naming_the_option(tmp_path, options, message):
    proc = start_controller(controller_config(tmp_path / "qos.conf", **options), tmp_path / "log")
    assert proc.wait(20) == 2
    lines = (tmp_path / "log").read_text().splitlines()       # stdout and stderr: nothing but the one line
    assert len(lines) == 1 and lines[0].startswith(message), lines
    assert leftovers() == NOTHING_LEFT


def test_a_bad_config_is_one_line_under_ryu_manager_too(tmp_path):
    done = subprocess.run([str(REPO / ".venv-ryu" / "bin" / "ryu-manager"), "--config-file",
                           str(controller_config(tmp_path / "qos.conf", owner="no spaces")),
                           str(REPO / "controller" / "qos_app.py")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert (done.stdout + done.stderr).splitlines() == [
        "error: [qos] owner: 'no spaces' is not 1-64 letters, digits, '_', '.' or '-'"], done.stderr


def test_a_bad_policy_file_in_the_config_exits_2_naming_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**policy("bad"), "classes": {"tcp": {"queue": 1, "min": "180%"}}}))
    proc = start_controller(controller_config(tmp_path / "qos.conf", policy=bad), tmp_path / "log")
    assert proc.wait(20) == 2
    lines = (tmp_path / "log").read_text().splitlines()       # refused before OVSDB is reached: nothing else said
    assert len(lines) == 1 and lines[0].startswith("error: classes.tcp.min: '180%' is outside 0%..100%"), lines


def test_the_config_file_is_honoured(tmp_path, bridges):
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(policy("from-config")))
    config = controller_config(tmp_path / "qos.conf", policy=good, owner="honoured", api_token="t0ken-0123456789abcdef")
    proc = start_controller(config, tmp_path / "log")
    try:
        wait(lambda: in_sync("from-config"), 20, "the configured policy in force")
        status = rest("GET", "/status")[1]
        assert status["owner"] == "honoured" and status["mode"] == "in_force"
        assert 'ovs-qos-controller=honoured' in sh("ovs-vsctl", "--columns=external_ids", "list", "qos")
        assert rest("DELETE", "/policy")[0] == 401                       # the token is required
        assert rest("DELETE", "/policy", token="t0ken-0123456789abcdef")[0] == 200
    finally:
        stop_controller(proc, clear=False)


def test_sighup_puts_the_policy_file_in_force_again_and_keeps_the_old_one_when_the_new_is_bad(tmp_path, bridges):
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy("first")))
    proc = start_controller(controller_config(tmp_path / "qos.conf", policy=path), tmp_path / "log")
    try:
        wait(lambda: in_sync("first"), 20, "the configured policy in force")
        for signum in (signal.SIGUSR1, signal.SIGUSR2):     # logged and ignored, as a daemon should
            proc.send_signal(signum)
        path.write_text(yaml.safe_dump(policy("second")))
        assert not in_sync("second")
        proc.send_signal(signal.SIGHUP)
        wait(lambda: in_sync("second"), 20, "the policy file read again and in force")
        path.write_text(yaml.safe_dump({**policy("third"), "classes": {"tcp": {"queue": 1, "min": "180%"}}}))
        proc.send_signal(signal.SIGHUP)
        wait(lambda: "180%" in (tmp_path / "log").read_text(), 20, "the bad policy file refused in the log")
        assert proc.poll() is None and in_sync("second")
        log = (tmp_path / "log").read_text()
        assert "SIGUSR1 ignored" in log and "SIGUSR2 ignored" in log
        assert [line for line in log.splitlines() if "180%" in line][0].endswith("the policy in force stays")
    finally:
        stop_controller(proc, clear=False)


# --- one controller per owner and port -------------------------------------------------------------

def test_a_second_controller_is_refused_and_the_first_one_keeps_its_queues(controller):
    _, tmp_path, bridges = controller
    assert rest("PUT", "/policy", policy("first"))[0] == 200
    wait(lambda: in_sync("first"), 20, "the policy in force")
    before = port_qos(f"{bridges[0]}p2")
    # Same owner (and so the same OVSDB lock), other ports: refused by the lock.
    second = start_controller(controller_config(tmp_path / "second.conf", ofp_port=6654, api_port=8081,
                                                metrics_port=9111), tmp_path / "second.log")
    assert second.wait(30) == 1
    assert "another controller with owner 'test' is running" in (tmp_path / "second.log").read_text()
    # Another owner on the same ports: refused by the ports.
    third = start_controller(controller_config(tmp_path / "third.conf", owner="other"), tmp_path / "third.log")
    assert third.wait(30) == 1
    assert "is in use by another process" in (tmp_path / "third.log").read_text()
    assert port_qos(f"{bridges[0]}p2") == before and in_sync("first")


def test_a_second_controller_on_a_state_file_in_use_exits_1_with_one_line_and_the_first_still_saves(tmp_path):
    state = tmp_path / "state.json"
    first = start_controller(controller_config(tmp_path / "qos.conf", state_file=state), tmp_path / "first.log")
    try:
        assert first.poll() is None, (tmp_path / "first.log").read_text()[-2000:]
        # Another owner, or the OVSDB lock would refuse it first (as it would not with another OVSDB), and
        # other ports; the first one's state file.
        second = start_controller(controller_config(tmp_path / "second.conf", state_file=state, owner="other",
                                                    ofp_port=6654, api_port=8081, metrics_port=9111),
                                  tmp_path / "second.log")
        try:
            assert second.wait(30) == 1
        finally:
            stop_controller(second, clear=False)
        log = (tmp_path / "second.log").read_text()
        assert "Traceback" not in log and [line for line in log.splitlines() if line.startswith("error: ")] == [
            f"error: {state} is in use by another controller, which holds {tmp_path}/.state.json.lock; give this "
            "one its own [qos] state_file, or stop the other (an active/standby pair sets [qos] standby = true on "
            "both)"], log[-2000:]
        assert rest("DELETE", "/policy")[0] == 200 and json.loads(state.read_text())["policy"] is None
    finally:
        stop_controller(first, clear=False)


# --- concurrent changes ----------------------------------------------------------------------------

def test_200_concurrent_requests_all_answer_and_leave_ovsdb_flows_and_tc_as_the_last_policy_says(controller):
    _, _, bridges = controller
    docs = [policy("none", queues="fifo"), policy("reserve")]
    with concurrent.futures.ThreadPoolExecutor(max_workers=200) as pool:     # all 200 in flight at once
        calls = [pool.submit(rest, "GET", "/status") if k % 2 else pool.submit(rest, "PUT", "/policy", docs[k // 2 % 2])
                 for k in range(200)]
        codes = [call.result()[0] for call in calls]
    assert codes.count(200) == 200, sorted(set(codes))
    last = rest("GET", "/policy")[1]["name"]
    wait(lambda: in_sync(last), 30, "the last policy in force")
    mode = "reserve" if last == "reserve" else "fifo"
    for bridge in bridges:
        qos = sh("ovs-vsctl", "get", "qos", port_qos(f"{bridge}p2"), "external_ids:mode").strip().strip('"')
        assert qos == mode
        assert len(our_flows(bridge)) == 4
        steering = [f for f in our_flows(bridge) if "set_queue" in f]
        assert len(steering) == (2 if mode == "reserve" else 0)
        iface = f"{bridge}p2"
        classes = set(re.findall(r"class htb (1:[0-9a-f]+) ", sh("tc", "class", "show", "dev", iface)))
        filters = set(re.findall(r"flowid (1:[0-9a-f]+)", sh("tc", "filter", "show", "dev", iface, "parent", "1:")))
        # reserve's: the default class and tcp's, udp's and voice's (queues 1, 2, 3), each of these marked
        assert (classes - {"1:fffe"}, filters) == (({"1:1", "1:2", "1:3", "1:4"}, {"1:2", "1:3", "1:4"})
                                                   if mode == "reserve" else ({"1:1"}, set()))


# --- drift -------------------------------------------------------------------------------------------

def test_flows_deleted_by_hand_are_back_long_before_a_poll_could_find_them(controller):
    """Our flows ask the switch to say when one is deleted: with polls a minute apart, they are back in seconds."""
    _, _, bridges = controller
    doc = policy("reserve")
    doc["congestion"] = {**doc.get("congestion", {}), "poll_interval": 60}
    assert rest("PUT", "/policy", doc)[0] == 200
    wait(lambda: in_sync("reserve"), 20, "the policy in force")
    time.sleep(2)                                  # the poll the last interval had set is behind us
    bridge = bridges[0]

    def written_since(started: float) -> bool:     # four flows of ours, each added after `started`
        flows = our_flows(bridge)
        ages = [float(re.search(r"duration=([0-9.]+)s", line).group(1)) for line in flows]
        return len(flows) == 4 and max(ages) <= time.monotonic() - started

    started = time.monotonic()
    assert not written_since(started)              # they are two seconds old
    sh("ovs-ofctl", "-O", "OpenFlow13", "del-flows", bridge)
    wait(lambda: written_since(started), 10, "flows restored")


@pytest.mark.parametrize("change", ["mod-flows", "add-flow", "del-meter"])
def test_a_change_by_hand_that_the_flow_monitor_says_is_put_back_long_before_a_poll_could_find_it(controller, change):
    """The switch's flow monitor says what another connection changes (OpenFlow 1.3 itself says nothing of a flow
    changed in place, nor of one that goes with its meter): with polls a minute apart, it is put back in seconds."""
    _, _, bridges = controller
    doc = policy("policed", queues="fifo")
    doc["classes"]["udp"]["police"] = {"rate": "2Mbit", "burst": "200kbit"}
    doc["congestion"] = {**doc.get("congestion", {}), "poll_interval": 60}
    assert rest("PUT", "/policy", doc)[0] == 200
    wait(lambda: in_sync("policed"), 20, "the policy in force")
    time.sleep(2)                                  # the poll the last interval had set is behind us
    bridge = bridges[0]
    before = (meters(bridge), flow_specs(bridge))
    (metered,) = [line for line in our_flows(bridge) if "meter:1364393986" in line]
    cookie = re.search(r"cookie=(0x[0-9a-f]+)", metered).group(1)
    if change == "mod-flows":                      # ours, its meter and output gone
        sh("ovs-ofctl", "-O", "OpenFlow13", "mod-flows", bridge, f"cookie={cookie}/-1,actions=drop")
    elif change == "add-flow":                     # a flow of our cookie that the policy does not hold
        sh("ovs-ofctl", "-O", "OpenFlow13", "add-flow", bridge, f"cookie={cookie},priority=7,in_port=2,actions=drop")
    else:                                          # the meter, and with it its flow
        sh("ovs-ofctl", "-O", "OpenFlow13", "del-meter", bridge, "meter=1364393986")
    assert (meters(bridge), flow_specs(bridge)) != before
    wait(lambda: (meters(bridge), flow_specs(bridge)) == before, 10, "the policy's flows and meters back")


def test_flows_queues_and_filters_removed_by_hand_come_back_within_two_polls(controller):
    proc, _, bridges = controller
    rest("PUT", "/policy", policy("reserve"))
    wait(lambda: in_sync("reserve"), 20, "the policy in force")
    bridge, iface = bridges[0], f"{bridges[0]}p2"
    two_polls = 2.5

    sh("ovs-ofctl", "-O", "OpenFlow13", "del-flows", bridge)
    wait(lambda: len(our_flows(bridge)) == 4, two_polls, "flows restored")

    sh("ovs-vsctl", "clear", "port", iface, "qos")
    wait(lambda: port_qos(iface) != "[]", two_polls, "QoS restored")
    wait(lambda: in_sync("reserve"), 10, "in sync again")

    ipv4 = ("tc", "filter", "show", "dev", iface, "parent", "1:", "prio", "7")   # our IPv4 DSCP filters' prio
    assert "flowid 1:2" in sh(*ipv4) and "flowid 1:3" in sh(*ipv4)
    # Paused meanwhile: the controller hears the deletion over netlink and repairs it within milliseconds,
    # which would race this check that it happened (it did once in CI).
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        sh("tc", "filter", "del", "dev", iface, "parent", "1:", "prio", "7")
        assert "flowid" not in sh(*ipv4)              # gone, while the IPv6 ones (prio 8) still name 1:2 and 1:3
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    wait(lambda: "flowid 1:2" in sh(*ipv4) and "flowid 1:3" in sh(*ipv4), two_polls, "IPv4 filters restored")

    sh("tc", "qdisc", "replace", "dev", iface, "parent", "1:2", "handle", "99:", "pfifo", "limit", "7")
    wait(lambda: "pfifo_head_drop" in sh("tc", "qdisc", "show", "dev", iface, "parent", "1:2"), two_polls,
         "class queue restored")

    repairs = {line.split("{")[1].split("}")[0]: float(line.split()[-1])
               for line in urllib.request.urlopen("http://127.0.0.1:9101/metrics").read().decode().splitlines()
               if line.startswith("ovsqos_drift_repairs_total{")}
    assert repairs['kind="flows"'] >= 1 and repairs['kind="qos"'] >= 1 and repairs['kind="tc"'] >= 2


def test_a_port_qdisc_deleted_by_hand_is_rebuilt(controller):
    _, _, bridges = controller
    rest("PUT", "/policy", policy("reserve"))
    wait(lambda: in_sync("reserve"), 20, "the policy in force")
    iface = f"{bridges[0]}p2"
    sh("tc", "qdisc", "del", "dev", iface, "root")
    wait(lambda: "htb 1:" in sh("tc", "qdisc", "show", "dev", iface), 6, "HTB rebuilt")
    wait(lambda: "flowid 1:3" in sh("tc", "filter", "show", "dev", iface, "parent", "1:"), 6, "filters back")


def test_a_change_of_queue_packets_alone_reaches_every_leaf_on_the_device(controller):
    _, _, bridges = controller
    iface = f"{bridges[0]}p2"

    def limits() -> set[str]:   # the leaves' limits: "limit 50p" in `tc qdisc show` of a pfifo_head_drop
        return {line.split("limit ")[1].split()[0] for line in sh("tc", "qdisc", "show", "dev", iface).splitlines()
                if "pfifo_head_drop" in line}

    rest("PUT", "/policy", policy("leaves"))
    wait(lambda: in_sync("leaves") and limits() == {"50p"}, 20, "the leaves at 50 packets")
    changed = policy("leaves")
    for switch in changed["switches"].values():
        switch["ports"][2]["queue_packets"] = 20
    code, answer = rest("PUT", "/policy", changed)
    assert code == 200 and answer["in_sync"], answer
    assert limits() == {"20p"}                    # in force when the change is answered in sync, not at a sweep


# --- restart -----------------------------------------------------------------------------------------

def test_a_restart_with_a_policy_in_force_changes_nothing_and_drops_no_packet_of_a_tcp_flow(tmp_path):
    config = controller_config(tmp_path / "qos.conf")
    assert_a_restart_is_hitless(tmp_path, lambda log: start_controller(config, log))


def assert_a_restart_is_hitless(tmp_path, start) -> None:
    """Mininet's study network under reserve; a TCP flow runs while the controller (`start(log)` starts it
    and returns its process) is stopped and started."""
    proc = start(tmp_path / "first.log")
    # -c: the working directory, the checkout, is first on the script's path
    flow = subprocess.Popen([sys.executable, "-c", RESTART_FLOW, str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait(lambda: (tmp_path / "flowing").exists() or flow.poll() is not None, 60, "the TCP flow")
        assert flow.poll() is None, flow.communicate()[1][-2000:]
        time.sleep(3)
        stopped = time.time()
        stop_controller(proc, clear=False)            # SIGTERM: flows and queues stay
        proc = start(tmp_path / "second.log")
        wait(lambda: in_sync_study(), 20, "the restarted controller in sync")
        synced = time.time()
        out, err = flow.communicate(timeout=60)
        assert flow.returncode == 0, err[-2000:]
    finally:
        if flow.poll() is None:
            flow.kill()
        stop_controller(proc)
    result = json.loads(out)
    done = (tmp_path / "done").stat().st_mtime
    second = "\n".join(line for line in (tmp_path / "second.log").read_text().splitlines()
                       if _logged_at(line) is None or _logged_at(line) < done)   # until the flow ended
    assert "connected" in second and "drift" not in second
    assert not re.search(r"flows -\d|queues 0:|queues removed", second), second[-2000:]   # adopted as it was
    # The receiver's intervals before the restart, and those from the stop until a second after the new
    # controller was in sync: not one of the latter dipped, and the sender retransmitted nothing then.
    window = (stopped - 0.5, synced + 1.0)
    before = [r for t, r, _ in result["intervals"] if t + 0.5 < window[0] and t > 1.0]
    during = [(t, r, retx) for t, r, retx in result["intervals"] if window[0] < t + 0.5 and t < window[1]]
    assert len(during) >= 3 and before, result
    assert all(r >= 0.9 * statistics.median(before) for _, r, _ in during), (before, during)
    assert sum(retx for *_, retx in during) == 0, during
    assert leftovers() == NOTHING_LEFT


def test_meters_survive_a_restart_unchanged_without_an_error_come_back_and_go_with_the_policy(controller):
    proc, tmp_path, bridges = controller
    doc = policy("policed", queues="fifo")
    doc["classes"]["udp"]["police"] = {"rate": "2Mbit", "burst": "200kbit"}
    assert rest("PUT", "/policy", doc)[0] == 200
    wait(lambda: in_sync("policed"), 20, "the policed policy in force")
    before = {b: (meters(b), flow_specs(b)) for b in bridges}
    for bridge in bridges:
        assert meters(bridge) == ["meter=1364393986 kbps burst stats bands=", "type=drop rate=2000 burst_size=200"]
        assert sum("meter:1364393986" in f for f in flow_specs(bridge)) == 1        # the udp flow
    stop_controller(proc, clear=False)
    restarted = start_controller(tmp_path / "qos.conf", tmp_path / "second.log")
    try:
        wait(lambda: in_sync("policed"), 20, "the restarted controller in sync")
        wait_polls(3)   # meter statistics among them
        assert {b: (meters(b), flow_specs(b)) for b in bridges} == before
        log = (tmp_path / "second.log").read_text()
        assert not re.search(r"flows -\d|drift|refused", log), log[-2000:]
        with urllib.request.urlopen("http://127.0.0.1:9101/metrics", timeout=10) as resp:
            metrics = resp.read().decode()
        assert "ovsqos_openflow_errors_total{" not in metrics
        for dpid in DPIDS:
            assert f'ovsqos_meter_packets_total{{class="udp",dp_id="{dpid:016x}",meter="1364393986"}}' in metrics
        # Deleted by hand, with the flow that names it (OpenFlow deletes both, and OpenFlow 1.3 says neither; the
        # flow monitor says the flow went): on this idle bridge, both are back within a poll or two.
        dp = f"{DPIDS[0]:016x}"
        deleted_at = polls()[dp]
        sh("ovs-ofctl", "-O", "OpenFlow13", "del-meter", bridges[0], "meter=1364393986")
        assert len(flow_specs(bridges[0])) == len(before[bridges[0]][1]) - 1
        back_at: list[float] = []

        def back() -> bool:
            """The meter and its flow as before; the switch's poll count noted the moment they are."""
            if (meters(bridges[0]), flow_specs(bridges[0])) != before[bridges[0]]:
                return False
            back_at.append(polls()[dp])
            return True

        wait(back, 10, "the meter and its flow back")
        assert back_at[0] - deleted_at <= 2, f"back after {back_at[0] - deleted_at:g} polls"
        assert rest("DELETE", "/policy")[0] == 200
        assert all(meters(b) == [] and flow_specs(b) == [] for b in bridges)
    finally:
        stop_controller(restarted)


def meters(bridge: str) -> list[str]:
    return [line.strip() for line in sh("ovs-ofctl", "-O", "OpenFlow13", "dump-meters", bridge).splitlines()[1:]
            if line.strip()]


def flow_specs(bridge: str) -> list[str]:
    """Our flows without their counters: what they match and do."""
    return sorted(re.sub(r"duration=[^,]*, |n_packets=\d+, |n_bytes=\d+, |idle_age=\d+, ", "", f).strip()
                  for f in our_flows(bridge))


def _logged_at(line: str) -> float | None:
    try:
        return time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")) + float(line[19:23])
    except ValueError:
        return None


def in_sync_study() -> bool:
    status = rest("GET", "/status")[1]
    return status["policy"] == "reserve" and len(status["switches"]) == 2 and \
        all(s["in_sync"] for s in status["switches"].values())


RESTART_FLOW = '''
import json, sys, time
from pathlib import Path
from topo.harness.controller import ControllerClient
from topo.net.network import network
from topo.studies.base import policy_document, queues_in_force, check_path
from topo.topos import StudyTopo
from controller.core.policy import parse_policy
out = Path(sys.argv[1])
client = ControllerClient()
doc = policy_document("reserve", 5_000_000, 25)
with network(StudyTopo(), "user") as net:
    client.wait(lambda s: len(s["switches"]) == 2, 30, "switches")
    client.put_policy(doc)
    client.wait(lambda s: queues_in_force(s, parse_policy(doc)), 20, "queues")
    check_path(net, "h1", "h4")
    net.popen("h4", ["iperf3", "-s", "-1", "-J", "-i", "0.5", "-p", "5201"], out / "server.json")   # as the client
    time.sleep(0.5)
    started = time.time()
    client_proc = net.popen("h1", ["iperf3", "-c", net.host("h4").IP(), "-t", "14", "-i", "0.5", "-J",
                                   "--get-server-output"], out / "client.json")
    time.sleep(2)
    (out / "flowing").touch()
    client_proc.wait(60)
    (out / "done").touch()   # before the network, and its ports, go away
doc = json.loads((out / "client.json").read_text())
sent = {round(i["sum"]["start"], 1): i["sum"]["retransmits"] for i in doc["intervals"]}
print(json.dumps({"intervals": [(started + i["sum"]["start"], round(i["sum"]["bits_per_second"] / 1e6, 3),
                                 sent.get(round(i["sum"]["start"], 1), 0))
                                for i in doc["server_output_json"]["intervals"]]}))
'''
