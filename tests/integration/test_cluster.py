"""Three active controllers of one owner sharing four bridges through a real etcd (started here, on
loopback, with its own data): every bridge has exactly one master in OVSDB's Controller table and at
least two members master some; a PUT to one member puts the queues on every bridge and every member
returns the policy; a member killed with SIGKILL has its bridges mastered by another before its lease
could run out (its OVSDB session's close is heard), the queues left as they were; a PUT through a survivor reaches them; a member stopped with
SIGTERM hands its bridges over at once."""
from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
import uuid

import pytest

from controller.adapters.membership import WEDGED_SECONDS
from controller.core.cluster import Ring
from tests.integration.conftest import (
    controller_config,
    forget_datapaths,
    remove_rows,
    requires_ovs,
    start_controller,
    stop_controller,
)
from tests.integration.proxy import Proxy
from tests.integration.test_reliability import policy, sh, wait
from topo.harness.etcd import etcd, make_pki

pytestmark = requires_ovs
LEASE = 4                                  # [coordination] membership_timeout of the members, seconds
MEMBERS = {"m1": (6653, 8080, 9101), "m2": (6654, 8081, 9111), "m3": (6655, 8082, 9121)}   # OpenFlow, REST, metrics
DPIDS = (0xC1, 0xC2, 0xC3, 0xC4)


def api(port: int, method: str = "GET", path: str = "/status", body=None):
    request = urllib.request.Request(f"http://127.0.0.1:{port}/qos/v1{path}", method=method,
                                     data=json.dumps(body).encode() if body is not None else None)
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.load(answer)


def masters(bridges: list[str]) -> dict[str, list[str]]:
    """Bridge → the targets OVS says are its connected masters (OVSDB's Controller table)."""
    rows = json.loads(sh("ovs-vsctl", "--format=json", "--columns=_uuid,target,role,is_connected", "list",
                         "controller"))
    by_uuid = {row[0][1]: dict(zip(("target", "role", "connected"), row[1:])) for row in rows["data"]}
    found = {}
    for bridge in bridges:
        listed = sh("ovs-vsctl", "get", "bridge", bridge, "controller").strip("[] \n")
        ids = [u.strip() for u in listed.split(",") if u.strip()]
        found[bridge] = [by_uuid[i]["target"] for i in ids
                         if by_uuid[i]["role"] == "master" and by_uuid[i]["connected"] is True]
    return found


def mastered_by_survivor(bridge: str, victim: str) -> bool:
    """Whether a member other than `victim` says the switch confirmed it as master."""
    dpid = f"{int(sh('ovs-vsctl', 'get', 'bridge', bridge, 'datapath_id').strip().strip(chr(34)), 16):016x}"
    for name, (_, rest, _) in MEMBERS.items():
        if name == victim:
            continue
        try:
            switch = api(rest)["switches"].get(dpid)
        except OSError:
            continue
        if switch and switch["role"] == "master" and switch.get("owner") == name:
            return True
    return False


def max_rate(qos: str) -> str:
    """A QoS row's max-rate; "" for a row the controller replaced since it was read (not yet the new one)."""
    done = subprocess.run(["ovs-vsctl", "get", "qos", qos, "other_config:max-rate"], capture_output=True, text=True)
    return done.stdout.strip().strip('"') if done.returncode == 0 else ""


def qos_rows(bridges: list[str]) -> dict[str, str]:
    return {bridge: sh("ovs-vsctl", "get", "port", f"{bridge}p2", "qos").strip() for bridge in bridges}


@pytest.fixture
def bridges():
    tag = uuid.uuid4().hex[:4]
    names, links = [], []
    targets = [f"tcp:127.0.0.1:{ofp}" for ofp, _, _ in MEMBERS.values()]
    forget_datapaths(*DPIDS)
    try:
        for k, dpid in enumerate(DPIDS):
            bridge = f"cl{tag}{k}"
            args = ["ovs-vsctl", "add-br", bridge, "--", "set", "bridge", bridge, "datapath_type=netdev",
                    "protocols=OpenFlow13", "fail_mode=secure", f"other_config:datapath-id={dpid:016x}"]
            for port in (1, 2):
                iface = f"{bridge}p{port}"
                sh("ip", "link", "add", iface, "type", "veth", "peer", "name", iface + "x")
                sh("ip", "link", "set", iface, "up")
                links.append(iface)
                args += ["--", "add-port", bridge, iface, "--", "set", "interface", iface, f"ofport_request={port}"]
            sh(*args)
            names.append(bridge)
            sh("ovs-vsctl", "set-controller", bridge, *targets)
        yield names
    finally:
        for bridge in names:
            subprocess.run(["ovs-vsctl", "--if-exists", "del-br", bridge], capture_output=True)
        for iface in links:
            subprocess.run(["ip", "link", "del", iface], capture_output=True)
        remove_rows("cluster")   # what a failed test's members left: no later test's to own


def cluster_policy(name: str, rate: str) -> dict:
    doc = policy(name)
    switches = next(iter(doc["switches"].values()))
    doc["switches"] = {f"c{k}": {**switches, "dp_id": dpid,
                                 "ports": {2: {"capacity": rate, "queues": "reserve", "queue_packets": 50}}}
                       for k, dpid in enumerate(DPIDS)}
    return doc


def start_member(tmp_path, url: str, name: str, **qos):
    ofp, rest, metrics = MEMBERS[name]
    config = controller_config(tmp_path / f"{name}.conf", ofp_port=ofp, owner="cluster", api_port=rest,
                               metrics_port=metrics, state_file=tmp_path / f"{name}.json", **qos)
    config.write_text(config.read_text() + f"[coordination]\nbackend_url = {url}\nmembership_timeout = {LEASE}\n"
                                           f"member = {name}\n")
    proc = start_controller(config, tmp_path / f"{name}.log")
    wait(lambda: proc.poll() is not None or _answers(rest), 30, f"{name}'s API")
    assert proc.poll() is None, (tmp_path / f"{name}.log").read_text()[-3000:]
    return proc


def two_members(tmp_path, url: str, procs: dict, **m1) -> dict[str, str]:
    """m1 (with `m1`'s [qos] options) and m2 started into `procs`; their OpenFlow targets → names. The tests wait
    for both to master bridges: a member paused or cut before it owns any would prove nothing."""
    procs["m1"] = start_member(tmp_path, url, "m1", **m1)
    procs["m2"] = start_member(tmp_path, url, "m2")
    return {f"tcp:127.0.0.1:{MEMBERS[name][0]}": name for name in procs}


def holders(bridges: list[str], targets: dict[str, str]) -> set[str]:
    """The members that master a bridge (alone), as OVSDB's Controller table says."""
    return {targets[t[0]] for t in masters(bridges).values() if len(t) == 1}


def _answers(port: int) -> bool:
    try:
        api(port)
        return True
    except OSError:
        return False


def etcd_key(port: int, key: str) -> str | None:
    """A key's value as etcd itself holds it (its JSON gateway)."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v3/kv/range",
                                     data=json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode())
    with urllib.request.urlopen(request, timeout=5) as answer:
        kvs = json.load(answer).get("kvs", [])
    return base64.b64decode(kvs[0]["value"]).decode() if kvs else None


def test_three_members_share_the_bridges_and_survive_a_kill_and_a_stop(tmp_path, bridges):
    procs = {}
    with etcd(23791, tmp_path / "etcd.log") as url:
        try:
            started = time.monotonic()
            for name in MEMBERS:
                procs[name] = start_member(tmp_path, url, name)
            targets = {f"tcp:127.0.0.1:{ofp}": name for name, (ofp, _, _) in MEMBERS.items()}
            # One master per bridge, the one the ring of all three names (once the later members are past the
            # hold-down everywhere: before that bridges move), and not all the same one.
            ring = Ring(list(MEMBERS))
            owners = {bridge: ring.owner(dp) for dp, bridge in zip(DPIDS, bridges)}
            assert len(set(owners.values())) >= 2, owners
            wait(lambda: (m := masters(bridges)) and all(len(t) == 1 for t in m.values())
                 and {bridge: targets[t[0]] for bridge, t in m.items()} == owners, 30,
                 "the bridges shared, each mastered by the member the ring names")
            lease = etcd_key(23791, "/ovs-qos/cluster/lease/m1")
            assert lease is not None

            assert all(api(rest, path="/policy") is None for _, rest, _ in MEMBERS.values())
            answer = api(8080, "PUT", "/policy", cluster_policy("first", "10Mbit"))
            put = time.monotonic()
            # Answered for every bridge, each by its owner, once each owner said (in etcd) that it holds it.
            assert answer["applied"] == "first" and answer["in_sync"] is True, answer
            assert answer["switches"] == {f"{dp:016x}": {"owner": owners[bridge], "in_sync": True}
                                          for dp, bridge in zip(DPIDS, bridges)}, (answer, owners)
            # The others learn it from etcd (its watch wakes them): the same document on every member.
            wait(lambda: all((api(rest, path="/policy") or {}).get("name") == "first" for _, rest, _ in MEMBERS.values()),
                 10, "every member returning the policy")
            print(f"every member returned the policy {time.monotonic() - put:.2f} s after m1's answer")
            wait(lambda: all(q != "[]" for q in qos_rows(bridges).values()), 20, "queues on every bridge")
            rows = qos_rows(bridges)

            victim = next(name for name in owners.values() if name != "m1")   # m1 stays to be asked
            orphans = [bridge for bridge, name in owners.items() if name == victim]
            os.kill(procs[victim].pid, signal.SIGKILL)
            killed = time.monotonic()
            # Mastered again as the new owners see it (the switch answered their role request) ...
            wait(lambda: all(mastered_by_survivor(b, victim) for b in orphans), LEASE + 10,
                 "the killed member's bridges mastered by a survivor")
            confirmed = time.monotonic() - killed
            # ... and as OVSDB's Controller table says it (vswitchd writes a controller's role there a moment later).
            wait(lambda: all(masters([b])[b] and targets[masters([b])[b][0]] != victim for b in orphans),
                 LEASE + 15, "the killed member's bridges mastered in OVSDB")
            recorded = time.monotonic() - killed
            print(f"kill -9: re-mastered {confirmed:.2f} s (OVSDB: {recorded:.2f} s), lease {LEASE} s")
            assert qos_rows(bridges) == rows                                    # nothing rebuilt meanwhile
            # Heard when its OVSDB session closed (its lease revoked by the first member in line), not when its lease
            # ran out; and known dead at once, on this host, by its file beside the OVSDB socket (liveness.py).
            assert confirmed < LEASE, confirmed
            logs = "".join((tmp_path / f"{name}.log").read_text() for name in MEMBERS if name != victim)
            assert f"member {victim} is dead (its OVSDB session closed, its process gone)" in logs, logs[-3000:]

            api(8080, "PUT", "/policy", cluster_policy("second", "20Mbit"))
            wait(lambda: all(max_rate(q) == "20000000" for q in qos_rows(bridges).values()), 20,
                 "the survivors' PUT on every bridge")

            survivor = next(name for name in MEMBERS if name not in (victim, "m1"))
            moved = [b for b, t in masters(bridges).items() if targets[t[0]] == survivor]
            leaver = procs.pop(survivor)
            stopped = time.monotonic()
            leaver.send_signal(signal.SIGTERM)
            wait(lambda: all(mastered_by_survivor(b, survivor) for b in moved), 10, "a stopped member's bridges handed over")
            handed = time.monotonic() - stopped
            # vswitchd writes a controller's role into OVSDB only at its next status update, seconds later.
            wait(lambda: all(masters([b])[b] and targets[masters([b])[b][0]] == "m1" for b in moved), 10,
                 "a stopped member's bridges mastered by m1 in OVSDB")
            print(f"SIGTERM: handed over {handed:.2f} s after the signal (OVSDB: {time.monotonic() - stopped:.2f} s)")
            assert handed < LEASE, handed                                       # its lease revoked as it left
            stop_controller(leaver, clear=False)
            # m1's lease outlived the keepalive's WEDGED_SECONDS: its core handles events, and the app tells the
            # keepalive so after each (`turned`); without that word it lets the lease run out, and m1 takes another.
            time.sleep(max(0.0, started + WEDGED_SECONDS + LEASE + 1 - time.monotonic()))
            assert etcd_key(23791, "/ovs-qos/cluster/lease/m1") == lease
            api(8080, "DELETE", "/policy")                                      # m1 owns them all now
            wait(lambda: all(q == "[]" for q in qos_rows(bridges).values()), 20, "every bridge's queues removed")
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    stop_controller(proc, clear=False)


def test_a_paused_member_writes_nothing_when_it_resumes_and_etcd_down_changes_nothing(tmp_path, bridges):
    procs = {}
    with etcd(23791, tmp_path / "etcd.log") as url:
        etcd_pid = int(subprocess.run(["pgrep", "-f", "--newest", "etcd --name ovsqos"], capture_output=True,
                                      text=True).stdout.split()[0])
        try:
            targets = two_members(tmp_path, url, procs)
            wait(lambda: holders(bridges, targets) == {"m1", "m2"}, 30, "the bridges shared by m1 and m2")
            api(8080, "PUT", "/policy", cluster_policy("first", "10Mbit"))
            wait(lambda: all(q != "[]" for q in qos_rows(bridges).values()), 20, "queues on every bridge")
            state = {b: (qos_rows([b])[b], flows(b)) for b in bridges}

            os.kill(procs["m2"].pid, signal.SIGSTOP)                          # past its lease: m1 takes all
            try:
                wait(lambda: all(mastered_by_survivor(b, "m2") for b in bridges), LEASE + 10, "m1 masters every bridge")
            finally:
                os.kill(procs["m2"].pid, signal.SIGCONT)
            assert api(8081)["role"] != "member" or all(s.get("owner") != "m2" for s in api(8081)["switches"].values())
            samples = []
            resumed = time.monotonic()
            while time.monotonic() - resumed < 4:                            # m2 wakes: nothing of it lands
                samples.append({b: (qos_rows([b])[b], flows(b)) for b in bridges})
                time.sleep(0.25)
            assert all(sample == state for sample in samples), [s for s in samples if s != state][:1]

            os.kill(etcd_pid, signal.SIGSTOP)                                # etcd unreachable for everyone
            try:
                wait(lambda: api(8080)["role"] == "coordination lost", LEASE + 5, "m1 says coordination is lost")
                with pytest.raises(urllib.error.HTTPError) as refused:
                    api(8080, "PUT", "/policy", cluster_policy("second", "20Mbit"))
                assert refused.value.code == 503
                assert {b: (qos_rows([b])[b], flows(b)) for b in bridges} == state   # flows and queues stay
            finally:
                os.kill(etcd_pid, signal.SIGCONT)
            wait(lambda: api(8080)["role"] == "member" and all(len(t) == 1 for t in masters(bridges).values()),
                 LEASE + 15, "the members carry on once etcd is back")
            # m2's membership ran out while it was stopped; it joins again and masters its share once more.
            wait(lambda: {targets[t[0]] for t in masters(bridges).values() if t} == {"m1", "m2"}, LEASE + 15,
                 "m2 back in the group, mastering its share")
            for proc in procs.values():
                assert proc.poll() is None
            logs = "".join((tmp_path / f"{name}.log").read_text() for name in procs)
            assert "Traceback" not in logs
            api(8080, "DELETE", "/policy")
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    stop_controller(proc, clear=False)


def test_a_member_that_cannot_reach_the_switches_ovsdb_hands_them_to_one_that_can(tmp_path, bridges):
    # m1 reaches OVSDB through a TCP remote of its own, m2 through the unix socket; that remote removed,
    # ovsdb-server closes m1's session and refuses it: m1 reaches the switches by OpenFlow only.
    remote = "ptcp:6649:127.0.0.1"
    sh("ovs-appctl", "-t", "ovsdb-server", "ovsdb-server/add-remote", remote)
    procs = {}
    try:
        with etcd(23791, tmp_path / "etcd.log") as url:
            try:
                procs["m1"] = start_member(tmp_path, url, "m1", ovsdb="tcp:127.0.0.1:6649")
                procs["m2"] = start_member(tmp_path, url, "m2")
                targets = {f"tcp:127.0.0.1:{MEMBERS[name][0]}": name for name in procs}
                def shared() -> bool:
                    held = masters(bridges).values()
                    return all(len(t) == 1 for t in held) and {targets[t[0]] for t in held} == {"m1", "m2"}
                wait(shared, 30, "the bridges shared by m1 and m2")
                api(8080, "PUT", "/policy", cluster_policy("first", "10Mbit"))
                wait(lambda: all(q != "[]" for q in qos_rows(bridges).values()), 20, "queues on every bridge")
                rows = qos_rows(bridges)
                assert api(8080)["ovsdb"]["tcp:127.0.0.1:6649"]["connected"] is True
                sh("ovs-appctl", "-t", "ovsdb-server", "ovsdb-server/remove-remote", remote)
                cut = time.monotonic()
                wait(lambda: api(8080)["ovsdb"]["tcp:127.0.0.1:6649"]["connected"] is False, 10, "m1 cut off")
                # m1 lives (liveness.py): after a lease time of it, m1 says it cannot reach them; m2 claims and
                # masters them (as m2 sees it, then as OVSDB's table says, at vswitchd's next status update).
                wait(lambda: all(mastered_by_survivor(b, "m1") for b in bridges), LEASE + 15, "m2 mastering every bridge")
                seen = time.monotonic() - cut
                # Waited for as asserted: between vswitchd's status updates a bridge's Controller rows can show m1
                # a slave already and m2 not yet master (no master at all, for a moment).
                wait(lambda: all(len(t) == 1 and targets[t[0]] == "m2" for t in masters(bridges).values()), LEASE + 15,
                     "every bridge mastered by m2 alone")
                print(f"OVSDB cut: m1's bridges mastered by m2 {seen:.2f} s later (OVSDB: {time.monotonic() - cut:.2f} "
                      f"s), lease {LEASE} s")
                assert qos_rows(bridges) == rows                                  # nothing rebuilt meanwhile
                api(8081, "PUT", "/policy", cluster_policy("second", "20Mbit"))   # m2 puts it everywhere
                wait(lambda: all(max_rate(q) == "20000000" for q in qos_rows(bridges).values()), 20,
                     "m2's PUT on every bridge")
                wait(lambda: "cannot reach, left to members that can: " in (tmp_path / "m1.log").read_text(),
                     LEASE + 5, "m1 saying it cannot reach them")
                assert all(targets[t[0]] == "m2" for t in masters(bridges).values() if t)   # m1 took none back
                sh("ovs-appctl", "-t", "ovsdb-server", "ovsdb-server/add-remote", remote)   # back: m1 takes its share
                wait(lambda: {targets[t[0]] for t in masters(bridges).values() if t} == {"m1", "m2"}, LEASE + 15,
                     "m1 masters its share again")
                api(8081, "DELETE", "/policy")
                wait(lambda: all(q == "[]" for q in qos_rows(bridges).values()), 20, "every bridge's queues removed")
            finally:
                for proc in procs.values():
                    stop_controller(proc, clear=False)
    finally:
        subprocess.run(["ovs-appctl", "-t", "ovsdb-server", "ovsdb-server/remove-remote", remote], capture_output=True)


def test_members_reach_etcd_over_tls_only_with_a_certificate_its_ca_signed(tmp_path, bridges):
    pki = make_pki(tmp_path)
    procs = {}
    with etcd(23791, tmp_path / "etcd.log", pki=pki) as url:
        try:
            procs["m1"] = start_member(tmp_path, url, "m1")
            # m2 trusts etcd's CA but brings no certificate of its own: etcd refuses it.
            procs["m2"] = start_member(tmp_path, f"etcd3+https://127.0.0.1:23791?ca_cert={pki.ca}", "m2")
            targets = {f"tcp:127.0.0.1:{MEMBERS[name][0]}": name for name in procs}
            wait(lambda: all(t and targets[t[0]] == "m1" for t in masters(bridges).values()), 30,
                 "every bridge mastered by m1, over TLS to etcd")
            assert api(8080)["role"] == "member" and api(8081)["role"] == "coordination lost"
            api(8080, "PUT", "/policy", cluster_policy("first", "10Mbit"))
            wait(lambda: all(q != "[]" for q in qos_rows(bridges).values()), 20, "queues on every bridge")
            with pytest.raises(urllib.error.HTTPError) as refused:
                api(8081, "PUT", "/policy", cluster_policy("second", "20Mbit"))
            assert refused.value.code == 503
            log = (tmp_path / "m2.log").read_text()
            assert "etcd: " in log and "Traceback" not in log, log[-2000:]
            api(8080, "DELETE", "/policy")
            wait(lambda: all(q == "[]" for q in qos_rows(bridges).values()), 20, "every bridge's queues removed")
        finally:
            for proc in procs.values():
                stop_controller(proc, clear=False)


def flows(bridge: str) -> list[str]:
    out = sh("ovs-ofctl", "-O", "OpenFlow13", "dump-flows", bridge, "--no-stats")
    return sorted(line.strip() for line in out.splitlines() if "cookie=" in line)


def etcd_policy(port: int) -> dict | None:
    """The cluster's policy as etcd itself holds it, not as a member remembers it."""
    value = etcd_key(port, "/ovs-qos/cluster/policy")
    return json.loads(value)["policy"] if value else None


def test_etcd_restarted_empty_is_recovered_from_by_the_members_without_touching_a_switch(tmp_path, bridges):
    procs = {}
    with contextlib.ExitStack() as first:
        url = first.enter_context(etcd(23791, tmp_path / "etcd.log"))
        try:
            targets = two_members(tmp_path, url, procs)
            wait(lambda: holders(bridges, targets) == {"m1", "m2"}, 30, "the bridges shared by m1 and m2")
            api(8080, "PUT", "/policy", cluster_policy("first", "10Mbit"))
            wait(lambda: all(max_rate(q) == "10000000" for q in qos_rows(bridges).values()), 20, "queues on every bridge")
            state = {b: (qos_rows([b])[b], flows(b)) for b in bridges}
            first.close()                                                     # etcd stopped and its data gone
            with etcd(23791, tmp_path / "etcd-empty.log"):                    # the same etcd, empty
                samples = []
                started = time.monotonic()
                # A lease at least: a member whose leases etcd lost may not write (a PUT gets 503, try again) from
                # half a lease after its last refresh until etcd has granted it new ones.
                while time.monotonic() - started < LEASE + 15 and not (
                        time.monotonic() - started >= LEASE and etcd_policy(23791)
                        and all(api(port)["role"] == "member" for port in (8080, 8081))):
                    samples.append({b: (qos_rows([b])[b], flows(b)) for b in bridges})
                    time.sleep(0.25)
                # The policy in force put back from the members (never nothing), and both members writing again.
                assert (etcd_policy(23791) or {}).get("name") == "first"
                assert all(api(port)["role"] == "member" for port in (8080, 8081))
                assert all(sample == state for sample in samples), [s for s in samples if s != state][:1]
                # Claims above the generation ids and epochs the switches have seen: a PUT through m2 reaches all.
                api(8081, "PUT", "/policy", cluster_policy("second", "20Mbit"))
                wait(lambda: all(max_rate(q) == "20000000" for q in qos_rows(bridges).values()), 20,
                     "m2's PUT on every bridge after the loss")
                for name in procs:
                    log = (tmp_path / f"{name}.log").read_text()
                    assert log.count("etcd lost its data (its revision went back") == 1, log[-3000:]
                    assert "Traceback" not in log
                assert "its revision went back" in api(8080)["cluster"]["etcd_restored"]
                # The group works as before: a member killed has its bridges mastered by the other.
                os.kill(procs["m1"].pid, signal.SIGKILL)
                wait(lambda: all(mastered_by_survivor(b, "m1") for b in bridges), LEASE + 10,
                     "m1's bridges mastered by m2")
                api(8081, "DELETE", "/policy")
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    stop_controller(proc, clear=False)


def mastery(bridges: list[str]) -> dict[str, tuple[str, float]]:
    """Bridge → the member whose status says the switch confirmed it as master, and when (a move and a move back
    change the time)."""
    dpids = {f"{int(sh('ovs-vsctl', 'get', 'bridge', b, 'datapath_id').strip().strip(chr(34)), 16):016x}": b
             for b in bridges}
    found = {}
    for name, (_, rest, _) in MEMBERS.items():
        with contextlib.suppress(OSError):
            for dpid, switch in api(rest)["switches"].items():
                if dpid in dpids and switch["role"] == "master" and switch.get("owner") == name:
                    found[dpids[dpid]] = (name, switch["role_since"])
    return found


def unmoved(bridges: list[str], before: dict, seconds: float) -> None:
    """Every bridge mastered as `before` says, and since the same moment (the status gives it to the millisecond,
    through the member's clocks), sampled for `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        now = mastery(bridges)
        assert now.keys() == before.keys() and all(now[b][0] == name and abs(now[b][1] - since) < 0.05
                                                   for b, (name, since) in before.items()), (now, before)
        time.sleep(0.2)


def test_a_flap_of_a_members_ovsdb_moves_nothing_a_silent_partition_is_a_cut_and_a_kill_moves_at_once(tmp_path,
                                                                                                     bridges):
    """m1 reaches OVSDB through a TCP proxy: its sessions reset for 1 s, or blackholed for 3 s (both shorter than
    its lease), move no switch; a partition longer than a lease hands its switches to m2 and back after the heal;
    kill -9 hands them over at once."""
    remote, proxied = "ptcp:6649:127.0.0.1", "tcp:127.0.0.1:6648"
    sh("ovs-appctl", "-t", "ovsdb-server", "ovsdb-server/add-remote", remote)
    proxy = Proxy(6648, ("127.0.0.1", 6649))
    procs = {}
    try:
        with etcd(23791, tmp_path / "etcd.log") as url:
            try:
                targets = two_members(tmp_path, url, procs, ovsdb=proxied)
                wait(lambda: holders(bridges, targets) == {"m1", "m2"}, 30, "the bridges shared by m1 and m2")
                api(8080, "PUT", "/policy", cluster_policy("first", "10Mbit"))
                wait(lambda: all(max_rate(q) == "10000000" for q in qos_rows(bridges).values()), 20, "queues on every bridge")
                assert api(8080)["ovsdb"][proxied]["connected"] is True
                before = mastery(bridges)
                assert {name for name, _ in before.values()} == {"m1", "m2"} and len(before) == len(bridges), before
                proxy.reset(1.0)                                             # both ends hear it, at once
                unmoved(bridges, before, 2.0)                                # (they moved 0.0-0.1 s after the heal)
                proxy.open.clear()
                unmoved(bridges, before, 3.0)
                proxy.open.set()
                unmoved(bridges, before, 2.0)
                assert "revoked" not in (tmp_path / "m2.log").read_text()
                proxy.open.clear()                                           # everything dropped, nothing closed
                cut = time.monotonic()
                wait(lambda: api(8080)["ovsdb"][proxied]["connected"] is False, LEASE + 2, "m1 finding the partition")
                print(f"silent partition: found by m1 {time.monotonic() - cut:.2f} s later, lease {LEASE} s")
                # Its reconnections get a TCP connection from the proxy, and no answer: still not connected.
                for _ in range(20):
                    assert api(8080)["ovsdb"][proxied]["connected"] is False
                    time.sleep(0.3)
                wait(lambda: holders(bridges, targets) == {"m2"} and all(len(t) == 1 for t in masters(bridges).values()), 3 * LEASE + 10,
                     "every bridge mastered by m2")
                print(f"silent partition: m1's bridges mastered by m2 {time.monotonic() - cut:.2f} s after it began")
                api(8081, "PUT", "/policy", cluster_policy("second", "20Mbit"))
                wait(lambda: all(max_rate(q) == "20000000" for q in qos_rows(bridges).values()), 20,
                     "m2's PUT on every bridge")
                rows = {b: (q, max_rate(q)) for b, q in qos_rows(bridges).items()}
                proxy.open.set()                                             # healed
                samples = []
                deadline = time.monotonic() + 3 * LEASE + 15
                while holders(bridges, targets) != {"m1", "m2"}:
                    assert time.monotonic() < deadline, "m1 never mastered its share again after the heal"
                    samples.append({b: (q, max_rate(q)) for b, q in qos_rows(bridges).items()})
                    time.sleep(0.25)
                for _ in range(8):                                           # and a while after it took them
                    samples.append({b: (q, max_rate(q)) for b, q in qos_rows(bridges).items()})
                    time.sleep(0.25)
                # No old policy written back and no row rebuilt: the rows are the ones m2's PUT left.
                assert all(sample == rows for sample in samples), [s for s in samples if s != rows][:1]
                log = (tmp_path / "m1.log").read_text()
                # etcd was up throughout: nothing is reported as etcd being down.
                assert "Traceback" not in log and "changes no switch until it answers" not in log, log[-3000:]
                orphans = [b for b, (name, _) in mastery(bridges).items() if name == "m1"]
                os.kill(procs["m1"].pid, signal.SIGKILL)
                killed = time.monotonic()
                wait(lambda: all(mastered_by_survivor(b, "m1") for b in orphans), LEASE + 10,
                     "the killed member's bridges mastered by m2")
                print(f"kill -9 of m1 (OVSDB over TCP): its bridges mastered by m2 {time.monotonic() - killed:.2f} s later")
                assert time.monotonic() - killed < LEASE / 2             # heard, not its lease run out
                api(8081, "DELETE", "/policy")
            finally:
                for proc in procs.values():
                    stop_controller(proc, clear=False)
    finally:
        proxy.close()
        subprocess.run(["ovs-appctl", "-t", "ovsdb-server", "ovsdb-server/remove-remote", remote], capture_output=True)
