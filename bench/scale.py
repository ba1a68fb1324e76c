"""The controller at scale, against real OVS: what an operator with many ports gets.

    sudo .venv/bin/python -m bench.scale --bridges 50 --ports 20 --seconds 60

Creates the bridges (userspace datapath, internal ports, secure fail mode) on the local OVS, starts
the real controller (or uses the one on 127.0.0.1:8080 with --running), puts a policy in which every
port is an `auto` port of 100 Mbit/s with the reserve classes and one `output: normal` flow, lets it
poll for --seconds, deletes the policy, and removes everything, Ctrl-C included. One line per figure:

  apply_seconds           PUT until every switch holds the policy (the API answers once they do)
  delete_seconds          DELETE until every flow and queue of ours is gone
  poll_hz                 statistics polls answered per switch per second (target 1)
  poll_lag_max_seconds    how late the latest polls were sent, the worst switch
  cpu_share_of_one_core   the controller and its children, over the steady window
  cpu_share_each_10s      the same, each 10 s of the window (whether the window's start still settles)
  peak_rss_mib            the controller's peak resident memory

With --join, one more bridge of --ports ports is then created beside the others, and its cost measured:

  join_in_sync_seconds    from its connection to its being in sync (the controller's log says both)
  join_cpu_seconds        the controller's CPU over --join-seconds from its creation, above the steady share
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
import urllib.request
from datetime import datetime
from pathlib import Path

from bench.process import (
    TICKS,
    bench_main,
    controller_pid,
    cpu_ticks,
    measured,
    peak_rss_kib,
    polls_counted,
)
from topo.net.bridges import idle_bridges, policy_switches

METRICS = "http://127.0.0.1:9101/metrics"
JOIN_DP_ID = 0x100000   # the joining bridge's: above any of the others'


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bridges", type=int, default=50)
    p.add_argument("--ports", type=int, default=20, help="ports per bridge")
    p.add_argument("--seconds", type=float, default=60, help="steady polling window")
    p.add_argument("--running", action="store_true", help="use the controller already on 127.0.0.1:8080")
    p.add_argument("--log", type=Path, help="keep the controller's log here (default: a temporary file)")
    p.add_argument("--network", action="store_true",
                   help="one network: section for every switch (the controller's own forwarding, every port "
                        "queued) instead of a flow and a port entry per port")
    p.add_argument("--join", action="store_true",
                   help="after the steady window, one more bridge joins: its time to sync and the CPU it costs")
    p.add_argument("--join-seconds", type=float, default=20, help="the window of the join's CPU cost")
    args = p.parse_args(argv)
    if args.join and args.running and not args.log:
        p.error("--join reads the controller's log: with --running, name it with --log")
    return bench_main("scale", args, run, "bridges, controller and queues removed")


def run(args, tmp: Path, record) -> int:
    ports = args.bridges * args.ports
    print(f"bridges {args.bridges} x ports {args.ports} = {ports} ports", flush=True)
    context = measured(args, tmp, record)
    with context as client, idle_bridges(ports, args.ports, prefix="scale", record=record) as bridges:
        pid = controller_pid()
        print(f"controller pid {pid}", flush=True)
        client.wait(lambda s: len(s["switches"]) == len(bridges), 120, "every bridge connected")
        doc: dict = {"name": "scale", "classes": {"tcp": {"queue": 1, "min": "80%", "max": "100%"},
                                                  "udp": {"queue": 2, "min": "10%", "max": "100%", "priority": 1}}}
        if args.network:   # one section for every switch: nothing per switch or port
            doc["network"] = {"classify": [{"match": {"ip_proto": "tcp"}, "class": "tcp"},
                                           {"match": {"ip_proto": "udp"}, "class": "udp"}],
                              "ports": {"capacity": "100Mbit", "queues": "auto"}}
        else:
            doc["switches"] = policy_switches(bridges, "100Mbit")
        print(f"policy_bytes           {len(json.dumps(doc))}", flush=True)
        started = time.monotonic()
        answer = client.put_policy(doc)
        apply_seconds = time.monotonic() - started
        # The answer comes at the latest after the change's confirmation time; polling is measured in sync.
        while not _all_in_sync(client.status(), len(bridges)):   # every 2 s: a status of 10,000 ports is work too
            assert time.monotonic() - started < 900, "not every switch in sync within 900 s"
            time.sleep(2)
        in_sync_seconds = time.monotonic() - started
        print(f"in sync after {in_sync_seconds:.2f} s; steady window of {args.seconds:g} s begins", flush=True)
        polls0, counted0 = polls_counted(METRICS)
        cpu0, at0 = cpu_ticks(pid), time.monotonic()   # the CPU window holds no scrape
        slices = _slices(pid, at0 + args.seconds)
        cpu1, at1 = cpu_ticks(pid), time.monotonic()
        polls1, counted1 = polls_counted(METRICS)
        lag = max(_gauges("ovsqos_poll_lag_seconds"), default=0.0)
        rss = peak_rss_kib(pid)
        share = (cpu1 - cpu0) / TICKS / (at1 - at0)
        joined = _join(args, pid, args.log or tmp / "controller.log", share, record) if args.join else None
        started = time.monotonic()
        cleared = client.clear_policy()
        delete_seconds = time.monotonic() - started
        # Said before the bridges go: at 10,000 ports their removal can outlast ovs-vsctl's timeout.
        print(f"apply_seconds          {apply_seconds:.2f}  (in sync: {answer.get('in_sync')})")
        print(f"in_sync_seconds        {in_sync_seconds:.2f}  (the PUT to every switch in sync)")
        print(f"delete_seconds         {delete_seconds:.2f}  (in sync: {cleared.get('in_sync')})")
        print(f"poll_hz                {(polls1 - polls0) / (counted1 - counted0) / len(bridges):.3f}")
        print(f"poll_lag_max_seconds   {lag:.3f}")
        print(f"cpu_share_of_one_core  {share:.3f}")
        print(f"cpu_share_each_10s     {' '.join(f'{x:.3f}' for x in slices)}")
        print(f"peak_rss_mib           {rss / 1024:.1f}", flush=True)
        if joined:
            print(f"join_in_sync_seconds   {joined[0]:.2f}  (bridge of {args.ports} ports, beside {len(bridges)})")
            print(f"join_cpu_seconds       {joined[1]:.2f}  (over {args.join_seconds:g} s, above {share:.3f} "
                  "of a core)", flush=True)
    return 0


def _join(args, pid: int, log: Path, share: float, record) -> tuple[float, float]:
    """One more bridge: (seconds from its connection to its in sync, CPU seconds above the steady `share`
    over --join-seconds from its creation). The policy's network: section takes it in as it connects."""
    seen = log.stat().st_size   # what the log said before: read from here on, not whole every 0.1 s
    cpu0, at0 = cpu_ticks(pid), time.monotonic()
    with idle_bridges(args.ports, args.ports, prefix="scalejoin", first_dp_id=JOIN_DP_ID, record=record) as (bridge,):
        said: dict[str, datetime] = {}
        while len(said) < 2:
            assert time.monotonic() - at0 < 300, f"the joining bridge not in sync within 300 s: {said}"
            said = _said(log, seen, bridge.dp_id)
            time.sleep(0.1)
        time.sleep(max(at0 + args.join_seconds - time.monotonic(), 0))
        cpu1, at1 = cpu_ticks(pid), time.monotonic()
    return (said["in sync"] - said["connected"]).total_seconds(), (cpu1 - cpu0) / TICKS - share * (at1 - at0)


def _slices(pid: int, until: float, seconds: float = 10.0) -> list[float]:
    """The process's CPU share over each `seconds` from now until `until` (the last slice may be shorter)."""
    shares = []
    while (left := until - time.monotonic()) > 0:
        cpu0, at0 = cpu_ticks(pid), time.monotonic()
        time.sleep(min(seconds, left))
        shares.append((cpu_ticks(pid) - cpu0) / TICKS / (time.monotonic() - at0))
    return shares


def _said(log: Path, start: int, dp_id: int) -> dict[str, datetime]:
    """When the controller's log, from byte `start` on, first said switch `dp_id` connected, and in sync."""
    found: dict[str, datetime] = {}
    with log.open("rb") as f:
        f.seek(start)
        text = f.read().decode(errors="replace")
    for m in re.finditer(rf"^(\S+ \S+) INFO \S+: switch {dp_id:016x} (?:\(.*\) )?(connected|in sync)$", text, re.M):
        found.setdefault(m.group(2), datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f"))
    return found


def _all_in_sync(status: dict, bridges: int) -> bool:
    return len(status["switches"]) == bridges and all(v["in_sync"] for v in status["switches"].values())


def _metrics() -> str:
    with urllib.request.urlopen(METRICS, timeout=10) as resp:
        return resp.read().decode()


def _gauges(name: str) -> list[float]:
    return [float(line.split()[-1]) for line in _metrics().splitlines() if line.startswith(name + "{")]


if __name__ == "__main__":
    sys.exit(main())
