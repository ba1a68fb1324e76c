"""One policy of the main study on a fresh network: TCP h1 → h4 throughout, UDP h1 → h4 stepping up.

Raw iperf3 JSON is written as it arrives; the per-step numbers are computed from it.
"""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from controller.policy import Policy, parse_policy
from controller.tc import Tc, htb_classid
from topo import iperf
from topo.controller_client import ControllerClient
from topo.network import Network, network
from topo.scenario import Scenario
from topo.topos import StudyTopo

BOTTLENECK_IFACES = ("s1-eth1", "s2-eth1")   # both ends of the s1–s2 link; s1-eth1 carries h1 → h4
SLACK_PER_STEP = 1
UDP_TIMEOUT = 30.0


class StudyError(RuntimeError):
    """The study could not be carried out (connectivity, traffic tools)."""


@dataclass
class Step:
    udp_mbps: float
    start: float          # launcher wall-clock time
    end: float
    udp: dict[str, Any] | None = None


@dataclass
class Progress:
    """Hooks for the progress bar (`tick`, about twice a second) and the live exporter (`step`)."""
    tick: Callable[[str, float], None] = lambda label, elapsed: None
    step: Callable[[float], None] = lambda udp_mbps: None


@contextmanager
def bring_up(client: ControllerClient, topo, document: dict, datapath: str) -> Iterator[Network]:
    """`topo` up under `document`'s flows and queues (the policy states the queues' length)."""
    policy = parse_policy(document)
    # The new switches must connect to no policy: what a previous run left must not shape them.
    client.clear_policy()
    with network(topo, datapath) as net:
        wait_for_switches(client)
        client.put_policy(document)
        client.wait(lambda s: queues_in_force(s, policy), 20, f"policy {policy.name}'s queues in force")
        yield net


def run_policy(document: dict, scenario: Scenario, client: ControllerClient, raw_dir: Path,
               datapath: str, delay: str | None, progress: Progress) -> dict[str, Any]:
    policy = parse_policy(document)
    raw_dir.mkdir(parents=True, exist_ok=True)
    with bring_up(client, StudyTopo(delay=delay), document, datapath) as net:
        check_path(net, "h1", "h4")
        started = time.time()
        tcp_doc, steps, cooldown = _traffic(net, scenario, raw_dir, progress)
        tc = Tc()
        classes = {c: (n.bytes, n.packets, n.drops) for c, n in tc.classes(BOTTLENECK_IFACES[0]).items()}
        limits = {c: leaf.limit for c, leaf in tc.leaves(BOTTLENECK_IFACES[0]).items()}
        tc.close()
        decisions = [d for d in client.status()["decisions"] if d["time"] >= started]
    return _summarise(scenario, tcp_doc, steps, cooldown, classes, limits, decisions, policy)


def _traffic(net: Network, scenario: Scenario, raw_dir: Path, progress: Progress):
    h4_ip = net.host("h4").IP()
    # A server per UDP step: one still closing the last test would refuse the next.
    net.popen("h4", iperf.server_args(iperf.TCP_PORT))
    for k, rate in enumerate(scenario.udp_steps_mbps):
        if rate > 0:
            net.popen("h4", iperf.server_args(iperf.UDP_PORT + k))
    time.sleep(0.5)
    t0 = time.time()
    # Slack: a UDP test's control connection crosses the congested queue and may start late.
    tcp = net.popen("h1", iperf.client_args(h4_ip, iperf.TCP_PORT, scenario.tcp_seconds + SLACK_PER_STEP *
                                            len(scenario.udp_steps_mbps),
                                            congestion_control=scenario.tcp_congestion_control))
    tick = lambda label: lambda: progress.tick(label, time.time() - t0)  # noqa: E731
    steps = []
    for k, rate in enumerate(scenario.udp_steps_mbps):
        launched = time.time()
        progress.step(rate)
        if rate == 0:
            wait_for(lambda: time.time() >= launched + scenario.step_seconds, tick("UDP 0 Mbit/s"))
            steps.append(Step(rate, launched, time.time()))
            continue
        udp = net.popen("h1", iperf.client_args(h4_ip, iperf.UDP_PORT + k, scenario.step_seconds, udp_mbps=rate))
        wait_for(lambda: udp.poll() is not None, tick(f"UDP {rate:g} Mbit/s"),
              timeout=scenario.step_seconds + UDP_TIMEOUT, what=f"UDP {rate:g} Mbit/s iperf3")
        exited = time.time()
        doc = collect(udp, raw_dir / f"udp_{rate:g}mbps.json")
        # When the test really ran: it ended as the client exited (the closing exchange takes ms).
        duration = doc["end"]["sum_sent"]["seconds"]
        steps.append(Step(rate, max(launched, exited - duration), exited, doc))
    progress.step(0.0)
    wait_for(lambda: tcp.poll() is not None, tick("cooldown, TCP alone"),
          timeout=scenario.tcp_seconds + SLACK_PER_STEP * len(steps) + UDP_TIMEOUT, what="TCP iperf3")
    cooldown = Step(0.0, steps[-1].end, time.time())
    return (collect(tcp, raw_dir / "tcp.json"), t0), steps, cooldown


def wait_for(done: Callable[[], bool], tick: Callable[[], None], timeout: float = 3600, what: str = "") -> None:
    deadline = time.time() + timeout
    while not done():
        if time.time() > deadline:
            raise StudyError(f"{what} did not finish within {timeout:g} s")
        tick()
        time.sleep(0.2)


def collect(proc, path: Path) -> dict[str, Any]:
    out, err = proc.communicate()
    path.write_text(out)
    try:
        doc = json.loads(out)
    except ValueError:
        raise StudyError(f"iperf3 wrote no JSON ({path.name}): {err.strip()[:200]}") from None
    if iperf.error(doc):
        raise StudyError(f"iperf3 failed ({path.name}): {iperf.error(doc)}")
    return doc


def _summarise(scenario: Scenario, tcp: tuple[dict, float], steps: list[Step], cooldown: Step, classes,
               limits: dict[str, int], decisions, policy: Policy) -> dict[str, Any]:
    tcp_doc, t0 = tcp
    received, sent = iperf.received(tcp_doc), iperf.sent(tcp_doc)
    rows = []
    for step in steps:
        window = (step.start + scenario.settle_seconds, step.end)
        tcp_bps = iperf.window_mean_bps(received, t0, *window)
        udp_bps = iperf.window_mean_bps(iperf.received(step.udp), step.start, *window) if step.udp else 0.0
        udp_sum = (step.udp or {}).get("end", {}).get("sum", {})
        rows.append({
            "udp_mbps_offered": step.udp_mbps,
            "udp_mbps_delivered": _mbps(udp_bps),
            "udp_lost_percent": udp_sum.get("lost_percent"),
            "tcp_mbps": _mbps(tcp_bps),
            "tcp_retransmits": iperf.window_retransmits(sent, t0, *window),
            "start_s": round(step.start - t0, 3), "end_s": round(step.end - t0, 3),
        })
    series = [{"t": round(i.start, 3), "seconds": round(i.end - i.start, 3), "tcp_mbps": _mbps(i.bps)}
              for i in received]
    after = (cooldown.start + scenario.settle_seconds, cooldown.end)
    tc = {cid: {"bytes": b, "packets": p, "drops": d, "limit_packets": limits.get(cid)}
          for cid, (b, p, d) in sorted(classes.items())}
    return {"steps": rows, "cooldown": {"tcp_mbps": _mbps(iperf.window_mean_bps(received, t0, *after)),
                                        "start_s": round(cooldown.start - t0, 3), "end_s": round(cooldown.end - t0, 3)},
            "tcp_series": series, "tc_classes": _name_classes(tc, policy),
            "decisions": [{**d, "t": round(d["time"] - t0, 3)} for d in decisions], "t0": t0}


def _name_classes(tc: dict, policy: Policy) -> dict:
    names = {htb_classid(0): "default", **{htb_classid(c.queue): c.name for c in policy.classes}}
    return {cid: {"class": names.get(cid, "parent"), **counts} for cid, counts in tc.items()}


def _mbps(bps: float | None) -> float | None:
    return None if bps is None else round(bps / 1e6, 3)


def wait_for_switches(client: ControllerClient) -> None:
    client.wait(lambda s: {"0000000000000001", "0000000000000002"} <= set(s["switches"]), 30,
                "both switches connected")


def queues_in_force(status: dict, policy: Policy) -> bool:
    """Every QoS port has the queues its mode starts with (auto starts as fifo)."""
    return all(status["switches"].get(f"{sw.dp_id:016x}", {}).get("ports", {}).get(str(p.port_no), {})
               .get("queues") == ("reserve" if p.queues == "reserve" else "fifo")
               for sw in policy.switches for p in sw.ports)


def check_path(net: Network, src: str, dst: str) -> None:
    # Userspace bridges take a moment before forwarding the first packets.
    a, b = net.host(src), net.host(dst)
    for _ in range(10):
        if "1 received" in a.cmd(f"ping -c1 -W1 {b.IP()}"):
            return
        time.sleep(0.5)
    raise StudyError(f"{src} cannot reach {dst}: the flows or the switches are not forwarding")
