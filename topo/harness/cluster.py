"""The study's --controllers N: N active controllers of the study's owner sharing the switches through a
private etcd (topo/harness/etcd.py), as docs/operations.md runs a site's cluster, all on this host.

Member k listens for switches on 6652+k, for REST on 8079+k and for metrics on 9091+10k, keeps its own
state file, and is named ck. The names matter: the ring over them names each switch's owner
(controller/core/cluster.py), and under c1..cN it gives the study's s1 and s2 to different members for
every N from 2 to 8 (under m1..m6 it gives both to one). The ring stays the judge: each
trial records the owners the members report, and the launcher says which member owns which switch.

Seen from a study the members are one controller (ClusterClient): a change goes through the first, who
saves it in etcd for every member to apply on the switches it owns; a switch's status is its owner's;
each member's decisions are its own, named.
"""
from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.core.policy import LOCAL_OVSDB
from topo.harness.controller import STUDY_OWNER, ControllerClient, ControllerError, listening, start, wait_started
from topo.harness.etcd import EtcdError, etcd
from topo.harness.host import RunRecord
from topo.net.processes import end_all

MAX_MEMBERS = 8
ETCD_PORT = 23793          # and 23794 for its peers: apart from the tests' (23791-23792) and etcd's default
LEASE_SECONDS = 4          # [coordination] membership_timeout: a member's switches move this long after it dies
RING_SECONDS = 30          # for every member to see all the others in its ring (a newcomer is held down 3 s)


@dataclass(frozen=True)
class Member:
    name: str
    openflow: int
    api: int
    metrics: int


def members(count: int) -> list[Member]:
    return [Member(f"c{k}", 6652 + k, 8079 + k, 9091 + 10 * k) for k in range(1, count + 1)]


def ports(count: int) -> list[int]:
    """Every TCP port the cluster listens on: its members' and its etcd's."""
    return [p for m in members(count) for p in (m.openflow, m.api, m.metrics)] + [ETCD_PORT, ETCD_PORT + 1]


def described(count: int) -> dict[str, Any]:
    """What summary.json records of the cluster."""
    return {"count": count, "etcd": f"127.0.0.1:{ETCD_PORT}", "lease_seconds": LEASE_SECONDS,
            "members": {m.name: {"openflow": m.openflow, "api": m.api, "metrics": m.metrics} for m in members(count)}}


def point(bridges: list[str], openflow_ports: tuple[int, ...]) -> None:
    """Bridges made outside Mininet (--idle-ports') pointed at every member."""
    targets = [f"tcp:127.0.0.1:{port}" for port in openflow_ports]
    subprocess.run(["ovs-vsctl", "--timeout=120", *(a for b in bridges for a in ("--", "set-controller", b, *targets))],
                   check=True, capture_output=True)


def check_host(count: int) -> None:
    """Before anything starts: etcd installed, and every port the cluster needs free."""
    flag = f"--controllers {count}"
    if shutil.which("etcd") is None:
        raise ControllerError(f"{flag}: etcd is not installed; run scripts/setup.sh (Debian's etcd-server), or run "
                              "without --controllers")
    busy = [p for p in ports(count) if listening(("127.0.0.1", p))]
    if busy:
        first, last = members(count)[0], members(count)[-1]
        raise ControllerError(f"{flag}: 127.0.0.1:{busy[0]} is in use (a controller already running?); its members "
                              f"need OpenFlow {first.openflow}-{last.openflow}, REST {first.api}-{last.api}, metrics "
                              f"{first.metrics}-{last.metrics} and etcd {ETCD_PORT}-{ETCD_PORT + 1}: stop what "
                              "listens there, or run without --controllers")


class ClusterClient(ControllerClient):
    def __init__(self, clients: dict[str, ControllerClient], openflow_ports: tuple[int, ...],
                 procs: dict[str, subprocess.Popen], restart: Callable[[str], subprocess.Popen]):
        first = next(iter(clients.values()))
        super().__init__(first.api, first.token)
        self.clients, self.openflow_ports, self._procs, self._restart = clients, openflow_ports, procs, restart
        self.down: set[str] = set()      # members killed (--fault), not asked until started again

    def status(self) -> dict:
        return merged({name: client.status() for name, client in self.clients.items() if name not in self.down})

    def kill(self, name: str) -> None:
        """kill -9 of a member, as a crash: its sessions close with it, and its lease is left to run out."""
        self.down.add(name)
        self._procs[name].kill()
        self._procs[name].wait()

    def revive(self) -> None:
        """Every killed member started again, and back in every member's ring."""
        for name in sorted(self.down):
            self._procs[name] = self._restart(name)
        self.down.clear()
        names = sorted(self.clients)
        self.wait(lambda s: all(m["ring"] == names for m in s["members"].values()), RING_SECONDS,
                  "every member back in every member's ring")


def merged(statuses: dict[str, dict]) -> dict[str, Any]:
    """The members' statuses as one: each switch as its owner reports it once the switch confirmed it master
    (none yet: absent), every member's decisions with its name, by time; the rest is the first member's."""
    switches = {dp: {**sw, "member": name} for name, status in statuses.items()
                for dp, sw in status["switches"].items() if sw.get("owner") == name and sw["role"] == "master"}
    decisions = sorted(({**d, "member": name} for name, status in statuses.items() for d in status["decisions"]),
                       key=lambda d: d["time"])
    return {**next(iter(statuses.values())), "switches": switches, "decisions": decisions,
            "members": {name: {"role": s["role"], "ring": s.get("cluster", {}).get("ring", [])}
                        for name, s in statuses.items()}}


@contextmanager
def cluster(out: Path, count: int, record: RunRecord, ovsdb: tuple[str, ...] = (),
            openflow_host: str | None = None) -> Iterator[ClusterClient]:
    """etcd and `count` members started (logs, configs and state files in `out`), every one seeing all in its
    ring; stopped at the end (the members with SIGTERM, then etcd, whose data goes with it)."""
    crew = members(count)
    with ExitStack() as stack:
        try:
            url = stack.enter_context(etcd(ETCD_PORT, out / "etcd.log", record))
        except EtcdError as err:
            raise ControllerError(f"--controllers {count}: {err}") from None
        procs: dict[str, subprocess.Popen] = {}

        # Before etcd stops: a member leaves the group as it stops, in about a second, so all at once.
        stack.callback(lambda: end_all(list(procs.values()), 20))

        record.rows(STUDY_OWNER, tuple(ovsdb) or (LOCAL_OVSDB,))
        clients = {m.name: ControllerClient(f"http://127.0.0.1:{m.api}/qos/v1") for m in crew}

        def launch(member: Member) -> subprocess.Popen:
            log = out / f"controller-{member.name}.log"
            proc = start(_config(out, member, url, ovsdb, openflow_host), log, append=member.name in procs)
            procs[member.name] = proc
            record.process(proc.pid, "controller")
            return proc
        for member in crew:
            launch(member)
        for member in crew:
            wait_started(procs[member.name], clients[member.name], (openflow_host or "127.0.0.1", member.openflow),
                         out / f"controller-{member.name}.log")

        def restart(name: str) -> subprocess.Popen:
            member = next(m for m in crew if m.name == name)
            proc = launch(member)
            wait_started(proc, clients[name], (openflow_host or "127.0.0.1", member.openflow),
                         out / f"controller-{name}.log")
            return proc
        client = ClusterClient(clients, tuple(m.openflow for m in crew), procs, restart)
        names = sorted(clients)
        client.wait(lambda s: all(m["ring"] == names for m in s["members"].values()), RING_SECONDS,
                    "every member in every member's ring")
        try:
            yield client
        finally:
            try:
                client.clear_policy()     # saved in etcd: members take their queues off any switch still there
            except ControllerError:
                pass


def _config(out: Path, member: Member, url: str, ovsdb: tuple[str, ...], openflow_host: str | None) -> Path:
    path = out / f"controller-{member.name}.conf"
    path.write_text("[DEFAULT]\n" + (f"ofp_listen_host = {openflow_host}\n" if openflow_host else "")
                    + f"ofp_tcp_listen_port = {member.openflow}\n"
                    + f"[qos]\nowner = {STUDY_OWNER}\napi_port = {member.api}\nmetrics_port = {member.metrics}\n"
                    + f"state_file = {out / f'controller-{member.name}-state.json'}\n"
                    + (f"ovsdb = {','.join(ovsdb)}\n" if ovsdb else "")
                    + f"[coordination]\nbackend_url = {url}\nmembership_timeout = {LEASE_SECONDS}\n"
                    + f"member = {member.name}\n")
    return path
