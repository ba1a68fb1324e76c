"""Several active controllers sharing bridges through etcd, against real OVS: what a cluster costs and how
fast it recovers.

    sudo .venv/bin/python -m bench.cluster --members 3 --bridges 30 --ports 100 --seconds 30

Starts a private etcd (topo/harness/etcd.py), creates the bridges (userspace datapath, internal ports,
secure fail mode; topo/net/bridges.py) pointed at every member, starts N members of one owner (member k
listens for OpenFlow on 6652+k, REST on 8079+k, metrics on 9091+10k), waits until the ring is stable
(every bridge mastered by the member the ring names, as its status and OVSDB's Controller table say),
then measures, and removes everything, Ctrl-C included (a killed run's bridges, processes and QoS rows
are in the run record: the next run or `topo/run.py clean` removes them). One line per figure:

  apply_seconds           PUT of an `auto` policy on every port through m1: its answer, every port's QoS row, and
                          every switch in sync as its owner's status says (queues, classes and flows in place)
  apply_stall_seconds     m1's longest answer to a constant GET, asked every 0.1 s from the PUT until every switch
                          was in sync: how long its event loop was held at once (a switch drops a controller that
                          leaves its echo unanswered 5 s; etcd, a member whose lease it does not refresh)
  member <name>           per member over the steady window: switches owned, statistics polls per owned
                          switch per second, CPU (children included) as a share of one core, peak RSS
  scrape_seconds          one GET of m1's /metrics after the window (rendered anew: its cache is 0.5 s), and its
                          size: what each Prometheus scrape costs a member of this size
  kill9_remaster_seconds  kill -9 of a member (restarted in between): until every bridge it owned is mastered
                          by a survivor as the switch confirmed it (the role reply's time, `role_since` in that
                          survivor's status), median and max; and as OVSDB says
  sigterm_handoff_seconds a member stopped with SIGTERM (started again in between, --stops times): until every
                          bridge it owned is mastered by another, median and max
  leave_moved_fraction    switches whose owner changed when that member left (N -> N-1), next to 1/N
  join_moved_fraction     switches whose owner changed when it came back (N-1 -> N), next to 1/N
  sigstop_takeover_seconds  a member stopped with SIGSTOP (--stops times): until another masters its bridges
  fenced_writes           SIGSTOP of a member past its lease, SIGCONT: changes of QoS rows, Queue rows and flows on
                          the bridges it had, sampled for --fenced-seconds (expect 0)
  fenced_rejoined         whether that member is back in the ring, owning its bridges, soon after (else restarted)
  flap_moved_switches     with --flaps N: m2 reaches OVSDB through a proxy of its own (a unix socket beside OVS's),
                          whose connections are reset and refused for 1 s, or blackholed for 3 s and healed (N
                          times each, both shorter than the lease): the bridges whose ownership key in etcd was
                          made anew (a move, or a move and a move back) by the hold-down plus 2 s after the heal;
                          the goal is 0
  delete_seconds          DELETE through m1: its answer, and no QoS row left on any port

With --members 1 only apply, the member's figures and delete are measured.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.process import TICKS, bench_main, cpu_ticks, peak_rss_kib, polls_counted
from controller.adapters.etcd import text, under
from controller.core.cluster import HOLD_DOWN_SECONDS, Ring
from controller.core.policy import LOCAL_OVSDB
from tests.integration.proxy import Proxy  # the tests' fault injector, for the flaps
from topo.harness.controller import ControllerError
from topo.harness.etcd import etcd
from topo.harness.host import RunRecord
from topo.net.bridges import IdleBridge, idle_bridges, policy_switches

REPO = Path(__file__).resolve().parents[1]

OWNER = "bench-cluster"
ETCD_PORT = 23795               # and 23796 for its peers: apart from the tests' and the study's etcd
FIRST_DP_ID = 0x2000
START_SECONDS = 90
STATUS_EVERY = 1.0             # how often a take-over's progress is asked of the survivors


@dataclass
class Member:
    name: str
    openflow: int
    api: int
    metrics: int
    proc: subprocess.Popen | None = field(default=None, repr=False)
    ovsdb: str | None = None        # its [qos] ovsdb, if not the shipped default

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def members(count: int) -> list[Member]:
    return [Member(f"m{k}", 6652 + k, 8079 + k, 9091 + 10 * k) for k in range(1, count + 1)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--members", type=int, default=3)
    p.add_argument("--bridges", type=int, default=30)
    p.add_argument("--ports", type=int, default=100, help="ports per bridge")
    p.add_argument("--seconds", type=float, default=30, help="steady polling window")
    p.add_argument("--lease", type=float, default=4, help="[coordination] membership_timeout, seconds")
    p.add_argument("--kills", type=int, default=3, help="kill -9 trials")
    p.add_argument("--stops", type=int, default=1, help="SIGTERM trials, and as many SIGSTOP ones")
    p.add_argument("--fenced-seconds", type=float, default=5, help="how long a resumed member is watched")
    p.add_argument("--flaps", type=int, default=0, help="flaps of m2's OVSDB connection of each kind (a 1 s reset, a "
                                                        "3 s blackhole); m2 then reaches OVSDB through a proxy")
    p.add_argument("--flows", choices=("port", "bridge"), default="port",
                   help="the policy's flows: one per port (as bench/scale.py), or one per bridge")
    p.add_argument("--log-dir", type=Path, help="keep the members' and etcd's logs here (default: a temporary one)")
    args = p.parse_args(argv)
    if not 1 <= args.members <= 8:
        p.error("--members: 1 to 8")
    return bench_main("cluster", args, run, "members, etcd, bridges and queues removed")


# --- the members ---------------------------------------------------------------------------------------------

def config_text(member: Member, url: str, lease: float, state: Path) -> str:
    """The shipped config's [DEFAULT] with the member's OpenFlow port, its [qos] ports (and OVSDB, if its own) and
    the coordination."""
    text = (REPO / "controller" / "qos.conf").read_text().split("[qos]")[0]
    text = text.replace("ofp_tcp_listen_port = 6653", f"ofp_tcp_listen_port = {member.openflow}")
    return (text + f"[qos]\nowner = {OWNER}\napi_port = {member.api}\nmetrics_port = {member.metrics}\n"
            f"state_file = {state}\n" + (f"ovsdb = {member.ovsdb}\n" if member.ovsdb else "") +
            f"[coordination]\nbackend_url = {url}\nmembership_timeout = {lease:g}\nmember = {member.name}\n")


def start(member: Member, url: str, args: argparse.Namespace, logs: Path, record: RunRecord) -> None:
    conf = logs / f"{member.name}.conf"
    conf.write_text(config_text(member, url, args.lease, logs / f"{member.name}-state.json"))
    manager = Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin" / "osken-manager"
    with open(logs / f"{member.name}.log", "a") as log:
        member.proc = subprocess.Popen([str(manager), "--config-file", str(conf),
                                        str(REPO / "controller" / "qos_app.py")],
                                       stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
    record.process(member.proc.pid, "controller")
    deadline = time.monotonic() + START_SECONDS
    while True:
        if not member.alive:
            raise ControllerError(f"member {member.name} exited at start; see {logs / member.name}.log")
        try:
            api(member, timeout=2)
            return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise ControllerError(f"member {member.name}'s API did not answer within {START_SECONDS} s")
        time.sleep(0.2)


def stop(member: Member, seconds: float = 20) -> None:
    if member.proc is None:
        return
    if member.proc.poll() is None:
        member.proc.send_signal(signal.SIGCONT)          # a paused one cannot act on SIGTERM
        member.proc.terminate()
        try:
            member.proc.wait(seconds)
        except subprocess.TimeoutExpired:
            member.proc.kill()
            member.proc.wait()
    member.proc = None


@contextmanager
def running(group: list[Member], url: str, args: argparse.Namespace, logs: Path, record: RunRecord) -> Iterator[None]:
    record.rows(OWNER, (LOCAL_OVSDB,))              # a killed run's QoS rows go with its record
    try:
        for member in group:
            start(member, url, args, logs, record)
        yield
    finally:
        live = [m for m in group if m.alive]
        for member in live:
            if member.proc is not None:
                member.proc.send_signal(signal.SIGCONT)
        try:
            if live:                                 # a member leaves its flows and queues as it stops
                api(live[0], "DELETE", "/policy", timeout=120)
        except (OSError, ValueError, ControllerError):
            pass                                     # the record's sweep removes the owner's rows
        finally:
            for member in group:
                stop(member)


def api(member: Member, method: str = "GET", path: str = "/status", body: Any = None, timeout: float = 30) -> Any:
    request = urllib.request.Request(f"http://127.0.0.1:{member.api}/qos/v1{path}", method=method,
                                     data=None if body is None else json.dumps(body, separators=(",", ":")).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return json.load(answer)
    except urllib.error.HTTPError as err:
        raise ControllerError(f"{member.name}: {method} {path} answered {err.code}: {err.read()[:300]!r}") from None


class Stalls:
    """The member's API asked for its constant document (openapi.json) every 0.1 s in a thread until stopped:
    the longest answer is the longest the member's event loop was held by one thing (its OpenFlow echo
    replies and etcd lease refreshes wait as long)."""

    def __init__(self, member: Member):
        self.longest = 0.0
        self._member, self._stop = member, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.longest

    def _run(self) -> None:
        while not self._stop.is_set():
            asked = time.monotonic()
            with suppress(OSError, ControllerError):
                api(self._member, path="/openapi.json", timeout=60)
            self.longest = max(self.longest, time.monotonic() - asked)
            self._stop.wait(0.1)


def statuses(group: list[Member], skip: str | None = None) -> dict[str, dict]:
    """The live members' statuses but `skip`'s (one that does not answer is left out)."""
    found = {}
    for member in group:
        if member.alive and member.name != skip:
            try:
                found[member.name] = api(member, timeout=10)
            except OSError:
                pass
    return found


def mastered(found: dict[str, dict]) -> Iterator[tuple[str, str, dict]]:
    """(dpid, member, the switch's status) for each switch a member's status says it masters and owns."""
    for name, status in found.items():
        for dpid, switch in status.get("switches", {}).items():
            if switch.get("role") == "master" and switch.get("owner") == name:
                yield dpid, name, switch


def owners(found: dict[str, dict], dpids: list[str]) -> dict[str, str | None]:
    """Switch → the member whose status says it is master and the owner, or None."""
    out: dict[str, str | None] = dict.fromkeys(dpids)
    out.update((dpid, name) for dpid, name, _ in mastered(found) if dpid in out)
    return out


def all_in_sync(found: dict[str, dict], dpids: list[str]) -> bool:
    """Whether every switch is in sync as the member that masters and owns it says."""
    return {dpid for dpid, _, switch in mastered(found) if switch.get("in_sync")} >= set(dpids)


def metrics_url(member: Member) -> str:
    return f"http://127.0.0.1:{member.metrics}/metrics"


def scrape(member: Member) -> str:
    with urllib.request.urlopen(metrics_url(member), timeout=60) as answer:
        return answer.read().decode()


# --- OVS -----------------------------------------------------------------------------------------------------

def vsctl_json(*args: str) -> list[list[Any]]:
    done = subprocess.run(["ovs-vsctl", "--timeout=30", "--format=json", *args], capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout)["data"]


def ovsdb_masters(bridges: list[IdleBridge], targets: dict[str, str]) -> dict[str, list[str]]:
    """Bridge name → the members OVSDB's Controller table says are its connected masters."""
    rows = {row[0][1]: row[1:] for row in vsctl_json("--columns=_uuid,target,role,is_connected", "list", "controller")}
    names = {b.name for b in bridges}
    found = {}
    for name, ctl in vsctl_json("--columns=name,controller", "list", "bridge"):
        if name not in names:
            continue
        ids = [u[1] for u in ctl[1]] if ctl[0] == "set" else [ctl[1]]
        found[name] = [targets.get(rows[i][0], rows[i][0]) for i in ids
                       if i in rows and rows[i][1] == "master" and rows[i][2] is True]
    return found


def port_qos(bridges: list[IdleBridge]) -> dict[str, str]:
    """Each of the bridges' ports → its QoS row's uuid, "" for none."""
    ours = {f"{b.name}p{p}" for b in bridges for p in b.ports}
    return {name: (qos[1] if qos[0] == "uuid" else "") for name, qos in vsctl_json("--columns=name,qos", "list", "port")
            if name in ours}


def ovs_state(bridges: list[IdleBridge]) -> dict[str, Any]:
    """What a member writes on these bridges: ports' QoS, the QoS and Queue rows they use, the flows."""
    qos_of = port_qos(bridges)
    qos_rows = {row[0][1]: json.dumps(row[1:]) for row in vsctl_json("--columns=_uuid,other_config,queues", "list",
                                                                     "qos")}
    used = {u for u in qos_of.values() if u}
    queues = {q[1] for u in used if u in qos_rows for _, q in json.loads(qos_rows[u])[1][1]}
    queue_rows = {row[0][1]: json.dumps(row[1:]) for row in vsctl_json("--columns=_uuid,other_config", "list", "queue")
                  if row[0][1] in queues}
    flows = {}
    for bridge in bridges:
        out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", bridge.name, "--no-stats"],
                             capture_output=True, text=True, check=True).stdout
        flows[bridge.name] = sorted(line.strip() for line in out.splitlines() if "cookie=" in line)
    return {"port_qos": qos_of, "qos": {u: qos_rows.get(u) for u in used}, "queues": queue_rows, "flows": flows}


def changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What differs, one phrase per port, row or bridge."""
    out = []
    for kind in ("port_qos", "qos", "queues"):
        keys = before[kind].keys() | after[kind].keys()
        out += [f"{kind} {k}" for k in sorted(keys) if before[kind].get(k) != after[kind].get(k)]
    out += [f"flows of {b}" for b in sorted(before["flows"]) if before["flows"][b] != after["flows"].get(b)]
    return out


# --- waiting and timing --------------------------------------------------------------------------------------

def wait(ready: Callable[[], Any], timeout: float, what: str, every: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = ready()
        if got:
            return got
        if time.monotonic() > deadline:
            raise ControllerError(f"{what}: not within {timeout:g} s")
        time.sleep(every)


class Watch:
    """A condition polled in a thread from now on: when it first held, in seconds from the start."""

    def __init__(self, ready: Callable[[], bool], every: float = 0.2):
        self.started = time.monotonic()
        self._ready, self._every = ready, every
        self._at: float | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def since(self) -> float:
        return time.monotonic() - self.started

    def done(self, timeout: float) -> float:
        self._thread.join(timeout)
        if self._error is not None:
            raise self._error
        if self._at is None:
            raise ControllerError(f"not within {timeout:g} s")
        return self._at

    def _run(self) -> None:
        try:
            while not self._ready():
                time.sleep(self._every)
            self._at = self.since()
        except BaseException as err:      # handed to done()
            self._error = err


class Cluster:
    def __init__(self, group: list[Member], bridges: list[IdleBridge]):
        self.group, self.bridges = group, bridges
        self.dpids = [f"{b.dp_id:016x}" for b in bridges]
        self.by_dpid = {f"{b.dp_id:016x}": b.name for b in bridges}
        self.targets = {f"tcp:127.0.0.1:{m.openflow}": m.name for m in group}

    def live(self) -> list[Member]:
        return [m for m in self.group if m.alive]

    def owners(self, skip: str | None = None) -> dict[str, str | None]:
        return owners(statuses(self.group, skip), self.dpids)

    def stable(self) -> dict[str, str] | None:
        """Bridge dpid → owner once every bridge is mastered by the member the ring of the live members names,
        as that member and OVSDB say (one master each); else None."""
        ring = Ring(sorted(m.name for m in self.live()))
        now = self.owners()
        if any(now[d] != ring.owner(int(d, 16)) for d in self.dpids):
            return None
        masters = ovsdb_masters(self.bridges, self.targets)
        if any(masters[self.by_dpid[d]] != [now[d]] for d in self.dpids):
            return None
        return {d: o for d, o in now.items() if o is not None}

    def wait_stable(self, timeout: float = 120) -> dict[str, str]:
        result: dict[str, str] = wait(self.stable, timeout, "the ring stable, every bridge mastered by its owner", 0.5)
        return result

    def taken_over(self, orphans: list[str], gone: str, since: float) -> tuple[float, float]:
        """Seconds from `since` (the wall-clock time `gone` was stopped) until every orphan was mastered by another
        member as the switch confirmed it (its role reply, whose time the member's status gives: not when this
        polling saw it, which a status of hundreds of switches delays), and until OVSDB said so. `gone` is not
        asked: a member stopping with SIGTERM accepts a connection on its API port until its process is gone,
        and answers it never."""
        # Asked once a second, as a monitoring system would, from a second after the signal: a member's status of
        # a hundred switches holds its loop for 0.1-0.3 s, and asked at the signal, or every 0.1 s, it delayed the
        # very take-over it timed.
        time.sleep(STATUS_EVERY)
        wait(lambda: all(o is not None for d, o in self.owners(skip=gone).items() if d in orphans), 120,
             f"{gone}'s bridges mastered by another member", STATUS_EVERY)
        confirmed = max(switch["role_since"] for dpid, _, switch in mastered(statuses(self.group, gone))
                        if dpid in orphans) - since
        names = [self.by_dpid[d] for d in orphans]
        wait(lambda: all(len(m) == 1 and m[0] != gone for b, m in ovsdb_masters(self.bridges, self.targets).items()
                         if b in names), 120, f"{gone}'s bridges mastered in OVSDB", 0.1)
        return confirmed, time.time() - since


def spread(seconds: list[float]) -> str:
    """Median, 95th percentile (nearest rank) and max of some trials' times."""
    if not seconds:
        return "none run"
    ranked = sorted(seconds)
    p95 = ranked[max(0, -(-len(ranked) * 95 // 100) - 1)]
    return f"median {statistics.median(ranked):.2f} p95 {p95:.2f} max {ranked[-1]:.2f}"


def moved(before: dict[str, str], after: dict[str, str]) -> float:
    return sum(before.get(d) != after.get(d) for d in before) / max(len(before), 1)


def policy(bridges: list[IdleBridge], flows: str = "port") -> dict:
    """Every port an `auto` port of 100 Mbit/s with the reserve classes; forwarded the normal way by a flow
    per port (as bench/scale.py), or by one flow per bridge (`flows="bridge"`: 10,000 ports with a flow each
    are 1.17 MB of compact JSON, over the API's 1 MiB limit on a policy)."""
    switches = policy_switches(bridges, "100Mbit")
    if flows == "bridge":
        for entry in switches.values():
            entry["flows"] = [{"priority": 1000, "match": {}, "actions": [{"output": "normal"}]}]
    return {"name": "cluster", "classes": {"tcp": {"queue": 1, "min": "80%", "max": "100%"},
                                           "udp": {"queue": 2, "min": "10%", "max": "100%", "priority": 1}},
            "switches": switches}


# --- the run -------------------------------------------------------------------------------------------------

def run(args: argparse.Namespace, tmp: Path, record: RunRecord) -> int:
    logs = args.log_dir or tmp
    logs.mkdir(parents=True, exist_ok=True)
    group = members(args.members)
    ports = args.bridges * args.ports
    print(f"members {args.members}, bridges {args.bridges} x ports {args.ports} = {ports} ports, "
          f"lease {args.lease:g} s", flush=True)
    with ExitStack() as stack:
        url = stack.enter_context(etcd(ETCD_PORT, logs / "etcd.log"))
        _record_etcd(record)
        proxy = None
        if args.flaps and len(group) > 1:                # m2's OVSDB through a proxy beside OVS's socket (its tc too)
            socket = Path(LOCAL_OVSDB.removeprefix("unix:"))
            proxy = Proxy(str(socket.with_name(f"{OWNER}-{group[1].name}.sock")), str(socket))
            stack.callback(proxy.close)
            group[1].ovsdb = f"unix:{socket.with_name(f'{OWNER}-{group[1].name}.sock')}"
        bridges = stack.enter_context(idle_bridges(ports, args.ports, prefix="clu", first_dp_id=FIRST_DP_ID,
                                                   controller=[f"tcp:127.0.0.1:{m.openflow}" for m in group],
                                                   record=record))
        stack.enter_context(running(group, url, args, logs, record))
        cluster = Cluster(group, bridges)
        started = time.monotonic()
        cluster.wait_stable(180)
        print(f"ring stable           {time.monotonic() - started:.1f} s after the members started", flush=True)
        figures(args, cluster, record, url, logs, proxy)
    return 0


def figures(args: argparse.Namespace, cluster: Cluster, record: RunRecord, url: str, logs: Path,
            proxy: Proxy | None) -> None:
    group, bridges = cluster.group, cluster.bridges
    first = group[0]
    all_ports = len(bridges) * args.ports

    rows = Watch(lambda: sum(1 for u in port_qos(bridges).values() if u) == all_ports)
    stalls = Stalls(first)
    answer = api(first, "PUT", "/policy", policy(bridges, args.flows), timeout=600)
    answered = rows.since()
    rows_seconds = rows.done(600)
    wait(lambda: all_in_sync(statuses(group), cluster.dpids), 600, "every switch in sync", 1.0)
    print(f"apply_seconds          {answered:.2f} (answer: in_sync {answer.get('in_sync')}, "
          f"{len(answer.get('not_in_sync') or ())} not in sync), {rows_seconds:.2f} (every port's QoS row), "
          f"{rows.since():.2f} (every switch in sync, as its owner says)", flush=True)
    print(f"apply_stall_seconds    {stalls.stop():.2f} (m1's longest answer to GET /openapi.json, asked every 0.1 s "
          "from the PUT until every switch was in sync)", flush=True)

    owned = cluster.owners()
    pids = {m.name: m.proc.pid for m in group if m.proc}
    before = {m.name: polls_counted(metrics_url(m)) for m in group}
    ticks0, at0 = {m.name: cpu_ticks(pids[m.name]) for m in group}, time.monotonic()   # the CPU window holds no scrape
    time.sleep(args.seconds)
    ticks1, at1 = {m.name: cpu_ticks(pids[m.name]) for m in group}, time.monotonic()
    after = {m.name: polls_counted(metrics_url(m)) for m in group}
    for m in group:
        count = sum(1 for o in owned.values() if o == m.name)
        (polls0, counted0), (polls1, counted1) = before[m.name], after[m.name]
        hz = (polls1 - polls0) / (counted1 - counted0) / count if count else 0.0
        cpu = (ticks1[m.name] - ticks0[m.name]) / TICKS / (at1 - at0)
        print(f"member {m.name:<15} switches {count:3d} ({count * args.ports} ports)  poll_hz {hz:.3f}  "
              f"cpu_share_of_one_core {cpu:.3f}  peak_rss_mib {peak_rss_kib(pids[m.name]) / 1024:.1f}", flush=True)
    time.sleep(1.0)   # past the exposition's cache
    at0 = time.monotonic()
    text = scrape(group[0])
    print(f"scrape_seconds         {time.monotonic() - at0:.2f} ({len(text.encode()) / 2**20:.1f} MiB, "
          f"{sum(1 for line in text.splitlines() if not line.startswith('#'))} samples, m1)", flush=True)

    if len(group) > 1:
        faults(args, cluster, record, url, logs)
    if proxy is not None:
        flaps(args, cluster, proxy)

    cluster.wait_stable()
    rows = Watch(lambda: not any(port_qos(bridges).values()))
    answer = api(first, "DELETE", "/policy", timeout=600)
    answered = rows.since()
    print(f"delete_seconds         {answered:.2f} (answer: in_sync {answer.get('in_sync')}, "
          f"{len(answer.get('not_in_sync') or ())} not in sync), {rows.done(600):.2f} (no QoS row left)", flush=True)


def faults(args: argparse.Namespace, cluster: Cluster, record: RunRecord, url: str, logs: Path) -> None:
    group = cluster.group
    others = group[1:]                                # m1 stays: it is the one asked
    confirmed, recorded = [], []
    for trial in range(args.kills):
        owners_now = cluster.wait_stable()
        victim = max(others[trial % len(others):] + others[:trial % len(others)],
                     key=lambda m: sum(o == m.name for o in owners_now.values()))   # one that owns some, in turn
        orphans = [d for d, o in owners_now.items() if o == victim.name]
        assert victim.proc is not None
        victim.proc.kill()
        now = time.time()
        killed_at = time.strftime("%H:%M:%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"   # as the logs
        victim.proc.wait()
        took = cluster.taken_over(orphans, victim.name, now)
        confirmed.append(took[0])
        recorded.append(took[1])
        print(f"  kill -9 {victim.name} at {killed_at} ({len(orphans)} bridges): mastered by a survivor "
              f"{took[0]:.2f} s, in OVSDB {took[1]:.2f} s", flush=True)
        start(victim, url, args, logs, record)
    print(f"kill9_remaster_seconds {spread(confirmed)} (the switches' role replies); OVSDB {spread(recorded)}; "
          f"{len(confirmed)} kills, lease {args.lease:g} s", flush=True)

    handoffs, recorded = [], []
    for trial in range(args.stops):
        full = cluster.wait_stable()
        leaver = max(others, key=lambda m: sum(o == m.name for o in full.values()))
        orphans = [d for d, o in full.items() if o == leaver.name]
        assert leaver.proc is not None
        leaver.proc.terminate()
        now = time.time()
        took = cluster.taken_over(orphans, leaver.name, now)
        leaver.proc.wait(30)
        handoffs.append(took[0])
        recorded.append(took[1])
        print(f"  SIGTERM {leaver.name} at {time.strftime('%H:%M:%S', time.localtime(now))}.{int(now % 1 * 1000):03d} "
              f"({len(orphans)} bridges): mastered by another {took[0]:.2f} s, in OVSDB {took[1]:.2f} s", flush=True)
        if trial == 0:
            fewer = cluster.wait_stable()
            n = len(group)
            print(f"leave_moved_fraction   {moved(full, fewer):.3f} ({n} -> {n - 1} members; 1/N = {1 / n:.3f}; "
                  f"the leaver had {len(orphans)} of {len(full)})", flush=True)
        start(leaver, url, args, logs, record)
        if trial == 0:
            rejoined = cluster.wait_stable()
            print(f"join_moved_fraction    {moved(fewer, rejoined):.3f} ({n - 1} -> {n} members; 1/N = {1 / n:.3f})",
                  flush=True)
    print(f"sigterm_handoff_seconds {spread(handoffs)} (the switches' role replies); OVSDB {spread(recorded)}; "
          f"{len(handoffs)} stops", flush=True)

    takeovers = []
    for _ in range(args.stops):
        takeovers.append(_paused(args, cluster, others, url, logs, record))
    print(f"sigstop_takeover_seconds {spread(takeovers)} (the switches' role replies); {len(takeovers)} pauses, "
          f"lease {args.lease:g} s", flush=True)


def _paused(args: argparse.Namespace, cluster: Cluster, others: list[Member], url: str, logs: Path,
            record: RunRecord) -> float:
    """SIGSTOP of the member owning most, past its lease, then SIGCONT: the take-over's time (as the survivors'
    statuses say); what changed on its bridges after it resumed, and whether it took its place again, printed."""
    group = cluster.group
    rejoined = cluster.wait_stable()
    paused = max(others, key=lambda m: sum(o == m.name for o in rejoined.values()))
    assert paused.proc is not None
    held = [d for d, o in rejoined.items() if o == paused.name]
    watched = [b for b in cluster.bridges if f"{b.dp_id:016x}" in held]
    paused.proc.send_signal(signal.SIGSTOP)
    stopped = time.time()
    try:
        took = cluster.taken_over(held, paused.name, stopped)
        state = ovs_state(watched)
    finally:
        paused.proc.send_signal(signal.SIGCONT)
    print(f"  SIGSTOP {paused.name} ({len(held)} bridges): mastered by another {took[0]:.2f} s, in OVSDB "
          f"{took[1]:.2f} s", flush=True)
    resumed = time.monotonic()
    seen: set[str] = set()
    samples = 0
    while time.monotonic() - resumed < args.fenced_seconds:
        seen |= set(changes(state, ovs_state(watched)))
        samples += 1
    print(f"fenced_writes          {len(seen)} changes on the {len(watched)} bridges {paused.name} had, "
          f"{samples} samples in {args.fenced_seconds:g} s after SIGCONT (paused past its {args.lease:g} s lease)"
          + (f": {', '.join(sorted(seen)[:5])}" if seen else ""), flush=True)
    try:                                                 # does it take its place in the ring again?
        cluster.wait_stable(3 * args.lease + 10)
        print(f"fenced_rejoined        yes: {paused.name} back in every ring, its bridges its own again", flush=True)
    except ControllerError:
        ring = sorted(statuses([group[0]]).get(group[0].name, {}).get("cluster", {}).get("ring", []))
        print(f"fenced_rejoined        no: not within {3 * args.lease + 10:g} s after SIGCONT ({group[0].name}'s "
              f"ring: {', '.join(ring)}); restarted", flush=True)
        stop(paused)
        start(paused, url, args, logs, record)
    return took[0]


def flaps(args: argparse.Namespace, cluster: Cluster, proxy: Proxy) -> None:
    """m2's OVSDB connection reset for 1 s, or blackholed for 3 s, --flaps times each: the bridges that changed
    master, or were mastered anew (a move and a move back), in the 5 s after the heal."""
    victim = cluster.group[1]

    def blackhole() -> None:
        proxy.open.clear()
        time.sleep(3.0)
        proxy.open.set()

    for kind, strike in (("reset for 1 s", lambda: proxy.reset(1.0)), ("blackholed for 3 s", blackhole)):
        counts = []
        for _ in range(args.flaps):
            cluster.wait_stable()
            before = claims()
            strike()
            time.sleep(HOLD_DOWN_SECONDS + 2)
            after = claims()
            counts.append(sum(after.get(dpid) != claim for dpid, claim in before.items()))
            print(f"  {victim.name}'s OVSDB {kind}: {counts[-1]} of {len(before)} bridges moved", flush=True)
        print(f"flap_moved_switches    {kind}: {', '.join(map(str, counts))} of {len(cluster.bridges)} bridges "
              f"({args.flaps} flaps, lease {args.lease:g} s)", flush=True)


def claims() -> dict[int, tuple[str, int]]:
    """Switch → its ownership key's owner and create revision, as etcd holds them: a switch handed to another
    member, or back, has a key made anew (a renewal by its owner keeps it)."""
    prefix = f"/ovs-qos/{OWNER}/switch/"
    request = urllib.request.Request(f"http://127.0.0.1:{ETCD_PORT}/v3/kv/range",
                                     data=json.dumps(under(prefix)).encode())
    with urllib.request.urlopen(request, timeout=10) as answer:
        found = json.load(answer).get("kvs", [])
    return {int(text(kv["key"])[len(prefix):], 16): (text(kv["value"]), int(kv["create_revision"])) for kv in found}


def _record_etcd(record: RunRecord) -> None:
    """The private etcd in the run record, so that a killed run's is stopped too."""
    found = subprocess.run(["pgrep", "-f", "--", f"--listen-client-urls http://127.0.0.1:{ETCD_PORT} "],
                           capture_output=True, text=True).stdout.split()
    for pid in found:
        record.process(int(pid), "etcd")


if __name__ == "__main__":
    sys.exit(main())
