"""The controller's decisions, as Faucet's valves_manager.py makes its own: events and an injected `now`
in, actions out (pure: no os-ken, OVS or netlink here, and no I/O; controller/qos_app.py translates both
ways and does what the actions ask, reporting back with an event).

It holds the policy in force and the changes to it (controller/core/keeper.py), this controller's
authority (controller/core/authority.py), one Switch per datapath (controller/core/switch.py), each
handed a read-only view of what it may know, the fabric among the switches a policy's network: section
covers (controller/core/forwarding.py), and the rival claims to a connected datapath id
(controller/core/rivals.py).
"""
from __future__ import annotations

import contextlib
import functools
import logging
import random
from collections.abc import Callable
from typing import Any, assert_never

from controller.core import actions as act
from controller.core import events as ev
from controller.core.authority import LEASE_SECONDS, Authority
from controller.core.checks import check_policy
from controller.core.cluster import Cluster
from controller.core.connections import Connections
from controller.core.errors import PolicyError
from controller.core.forwarding import Forwarding
from controller.core.held import Held
from controller.core.keeper import SAVED_CLEARED, SAVED_POLICY, PolicyKeeper, from_saved
from controller.core.policy import Policy, parse_policy
from controller.core.switch import BRIDGE_RETRIES, Switch
from controller.core.telemetry import Decisions, Snapshot
from controller.core.view import Mode, OvsdbReplica, SwitchView

LOG = logging.getLogger("qos")


class Controller:
    def __init__(self, ovsdb: OvsdbReplica, *, owner: str, saved: ev.PolicyLoaded,
                 pinned: tuple[Any, Policy] | None = None,
                 active: bool = True, standby: bool = False, cluster: Cluster | None = None,
                 wall: Callable[[], float], rng: random.Random | None = None, probe_key: bytes | None = None):
        """`saved`: the policy the store held at start; `pinned`: the configured policy file's document and
        its Policy, which win over the saved one and a take-over alike; `probe_key`: what the fabric's
        discovery frames are signed with (a cluster's members share it)."""
        self.ovsdb, self.owner, self.pinned = ovsdb, owner, pinned[0] if pinned else None
        self.wall, rng = wall, rng or random.Random()
        self.forwarding = Forwarding(probe_key or rng.randbytes(32), rng, wall, shared=cluster is not None)
        self.keeper = PolicyKeeper(*(Mode.IN_FORCE, *pinned, saved.revision)
                                   if pinned is not None else from_saved(saved), shared=cluster is not None)
        self.authority = Authority(active, standby, cluster)
        self.switches: dict[int, Switch] = {}          # datapath id → the switch (its accepted connection)
        self.conns = Connections()                     # by connection; their devices; rival claims
        self.decisions = Decisions(wall)                # the last programs, rollbacks and moves, for the status
        self.reported = ev.RemotesChanged({})         # the remotes as the app last reported them
        self.held = Held(self.authority)               # what our switches hold of the policy in force
        self.out: list[act.Action] = []
        LOG.info("owner %s, policy %s (%s)", owner, self.keeper.name, self.keeper.mode)

    def view(self, dp_id: int, now: float) -> SwitchView:
        owns = self.authority.owns(dp_id)
        return SwitchView(self.keeper.policy, self.keeper.mode, owns, owns and self.authority.confirmed(now),
                          self.authority.generation_of(dp_id), self.ovsdb, self.authority.epoch_of(dp_id),
                          self.forwarding.rules.get(dp_id))

    # --- the one entry point ------------------------------------------------------------------------------
    def handle(self, event: ev.Event, now: float) -> list[act.Action]:
        self.out = []
        # A switch's own event (its replies and timers, most of what a controller handles) or a device's news
        # can change what those switches hold only; any other event may change ownership or every switch.
        touched: list[Switch] | None = None
        match event:
            case ev.SwitchUp():
                self._switch_up(event, now)
                self._refresh(now)
            case ev.SwitchDown():
                self._switch_down(event.conn)
                self._refresh(now)
            case ev.ClaimDue():
                rival = self.conns.due(event.conn)
                if rival is not None:
                    self._forget(self.conns.switches[rival.conn])
                    self.out.append(act.Close(rival.conn))
                    self._accept(rival.up, now)
            case ev.EchoReply():   # each switch's, every 10 s: it changes what no switch holds
                touched = []
                self.out += self.conns.echoed(event)
            case ev.PortsChanged():
                sw = self.conns.switches.get(event.conn)
                touched = [] if sw is None else [sw]
                if sw is not None:
                    self.forwarding.fabric.set_ports(sw.dp_id, event.ports, event.down, now)
                    self._to(sw, event, now)
                    self._refresh(now)
            case ev.PacketIn():
                sw = self.conns.switches.get(event.conn)
                if sw is not None:
                    self.out += self.forwarding.packet_in(sw, event, *self._writable(now), now)
                    self._refresh(now)
            case ev.DiscoveryDue():
                self.out += self.forwarding.round(event, *self._writable(now), now)
                self._refresh(now)
            case (ev.BridgeDue() | ev.PollDue() | ev.RoleReply() | ev.ErrorReply()
                  | ev.BarrierReply() | ev.FlowStatsReply() | ev.FlowCountReply() | ev.MeterFeaturesReply()
                  | ev.MeterConfigReply() | ev.MeterStatsReply() | ev.QueueStatsReply() | ev.PortStatsReply()):
                sw = self.conns.switches.get(event.conn)
                touched = [] if sw is None else [sw]   # else a connection gone, or one whose claim is being tested
                if sw is not None:
                    self._to(sw, event, now)
            case ev.GetPolicy():
                self.out.append(act.Answer(event.token, {"policy": self.keeper.document,
                                                         "revision": self.keeper.revision}))
            case ev.GetStatus():
                self.out.append(act.Answer(event.token, self._status(now)))
            case ev.SetPolicy() | ev.ClearPolicy():   # checked, saved (the app's I/O), installed, confirmed
                check = functools.partial(check_policy, switches=self.switches, ovsdb=self.ovsdb)
                refused = self._refused(now)
                self.out += [act.Answer(event.token, error=refused)] if refused else \
                    self.keeper.change(event, check, now)
            case ev.Reload():   # answered to the Reload itself: the app logs it
                with contextlib.suppress(PolicyError):
                    parse_policy(event.document)
                    self.pinned = event.document     # what a take-over puts in force from now on
                refused = self._refused(now)
                check = functools.partial(check_policy, switches=self.switches, ovsdb=self.ovsdb)
                self.out += [act.Answer(event, error=refused)] if refused else \
                    self.keeper.change(ev.SetPolicy(event, event.document), check, now)
            case ev.PolicySaved():
                actions, installed = self.keeper.saved(event, now)
                if installed:
                    self._installed(now)
                self.out += actions
            case ev.PolicyLoaded():   # the policy the one before us saved: taking over continues
                self.keeper.install(*from_saved(event))
                self._refresh(now, tell=False)
                self._everywhere(ev.TakingOver(), now)
            case ev.ConfirmDue():
                pass
            case ev.JobsDone():
                self._jobs_done(event, now)
            case ev.TcChanged():   # None: announcements were lost, any device may have changed
                news = set(self.switches) if event.devices is None else \
                    {self.conns.devices[d] for d in event.devices if d in self.conns.devices}
                touched = [self.switches[dp] for dp in news if dp in self.switches]
                for sw in touched:
                    self._to(sw, event, now)
            case ev.RemotesChanged():
                self._remotes_changed(event, now)
            case ev.Beaten():   # confirmed again after a lapse: what it could not write meanwhile
                lapsed = not self.authority.confirmed(now)
                self.authority.beaten(event)
                if lapsed and self.authority.confirmed(now):
                    self._everywhere(ev.Reconcile(), now)
            case ev.ClusterChanged() | ev.SwitchClaimed():
                self._cluster(event, now)
            case ev.GenerationClaimed():
                self.out += self.authority.claimed(event.generation)
                if event.generation is not None:
                    self._everywhere(ev.RoleDue(), now)   # the new id everywhere, so no switch keeps the older one
                elif self.authority.active:
                    LOG.warning("owner %s: could not claim an OpenFlow generation id (the OVSDB lock is not ours)",
                                self.owner)
                    self._stand_down(now)
            case ev.LockHeld():
                self.out.append(act.Exit(1, event.reason))
            case _:
                assert_never(event)
        if self.held.update(self.switches.values(), touched):
            cluster = self.authority.cluster
            if cluster:   # for the answers the other members give (why not: once settled)
                self.out += cluster.publish(self.held.record, self.keeper.revision)
            if self.keeper.waiting:
                self.out += self.keeper.answer(self.held.owned(self.switches.values()), now,
                                               cluster.shared() if cluster else None)
        out, self.out = self.out, []
        return out

    def _to(self, sw: Switch, event: ev.SwitchEvent, now: float) -> None:
        """One switch handles an event; what it asks of the controller is done here, the rest goes out."""
        for action in sw.handle(event, now, self.view(sw.dp_id, now)):
            match action:
                case act.NeedGeneration():
                    self.out += self.authority.need(action.dp_id, action.above)
                case act.Decided():
                    moves = self.forwarding.relieve(sw.dp_id, action.port_no, self.keeper.policy, now) \
                        if action.deferred else None
                    if moves is None:
                        self.decisions.decided(action)
                    if action.deferred:
                        self._to(sw, ev.Relieved(action.port_no, moves is not None), now)
                    if self.decisions.moved(moves or []):
                        self._refresh(now)
                case act.Loads():
                    if self.decisions.moved(self.forwarding.loads(action, self.keeper.policy, now)):
                        self._refresh(now)
                case _:
                    self.out.append(action)

    def _everywhere(self, event: ev.SwitchEvent, now: float) -> None:
        for sw in list(self.switches.values()):
            if sw.bridge is not None:
                self._to(sw, event, now)

    def _installed(self, now: float) -> None:
        """Another policy in force: what the fabric says of each switch first, as their tables are built anew."""
        self._refresh(now, tell=False)
        self._everywhere(ev.PolicyInstalled(), now)

    # --- the fabric: the controller's own forwarding under a policy's network: (controller/core/forwarding.py) --
    def _writable(self, now: float) -> tuple[dict[int, Switch], set[int]]:
        covered = self.forwarding.covered(self.keeper.policy, self.switches)
        return covered, {dp for dp, sw in covered.items() if sw.role.writable(self.view(dp, now))}

    def _refresh(self, now: float, tell: bool = True) -> None:
        """What the fabric says of each switch anew; those it changed for rebuild their tables (unless `tell` is
        False: the caller has them all rebuild)."""
        actions, changed = self.forwarding.refresh(self.keeper.policy, self.switches, now)
        self.out += actions
        for sw in changed if tell else ():
            if sw.bridge is not None:
                self._to(sw, ev.FabricChanged(), now)

    # --- connections, and rival claims to a datapath id --------------------------------------------------------
    def _switch_up(self, up: ev.SwitchUp, now: float) -> None:
        live = self.switches.get(up.dp_id)
        if live is None:
            self._accept(up, now)
        else:
            self.out += self.conns.claim(up, live)

    def _accept(self, up: ev.SwitchUp, now: float) -> None:
        sw = Switch(up.conn, up.dp_id, up.ports, now, self.forwarding.fabric.rng.random())
        self.switches[up.dp_id] = sw
        self.conns.accepted(sw)
        self.forwarding.fabric.connect(up.dp_id, up.ports, up.down, now)
        self._to(sw, ev.BridgeDue(up.conn, BRIDGE_RETRIES), now)

    def _switch_down(self, conn: int) -> None:
        if self.conns.left(conn):
            return       # a rival that left before its claim was decided
        sw = self.conns.switches.get(conn)
        if sw is None:
            return       # never the switch's connection
        self._forget(sw)
        if sw.bridge is not None and self.authority.active:
            self.out.append(act.Submit(sw.bridge.remote, sweep=True))   # a bridge that went leaves our rows behind
        LOG.info("switch %016x left", sw.dp_id)

    def _forget(self, sw: Switch) -> None:
        del self.switches[sw.dp_id]
        self.conns.forget(sw)
        self.forwarding.fabric.disconnect(sw.dp_id)

    # --- authority: active or standby, and the generation id behind OpenFlow mastership ---------------------
    def _remotes_changed(self, change: ev.RemotesChanged, now: float) -> None:
        for name, up in change.connected.items():
            if self.reported.connected.get(name, up) != up:
                (LOG.info if up else LOG.error)("OVSDB %s %s", name, "is back" if up else
                                               "is not connected; its switches' queues wait for it")
        self.reported = change
        self.out += self.authority.watch(change, now)
        if not self.authority.active and change.locked:
            self._take_over(now)
        elif self.authority.active and change.taken:
            self._stand_down(now)
        elif self.authority.active:   # rows of ours that a dead run left on ports that are gone
            self.out += [act.Submit(name, sweep=True) for name in change.new]
        if change.new:      # bridges that were not found may be in the remote connected now
            for sw in list(self.switches.values()):
                if sw.bridge is None:
                    self._to(sw, ev.BridgeDue(sw.conn, BRIDGE_RETRIES), now)

    def _take_over(self, now: float) -> None:
        """The lock is ours: the active controller is gone. Master of every switch (with a newer generation
        id), the policy it saved, what the switches hold read again and adopted, not rolled back."""
        LOG.warning("owner %s: the OVSDB lock is ours, the active controller is gone; taking over", self.owner)
        self.authority.take_over()
        if self.pinned is None:
            self.out.append(act.LoadPolicy())   # then the switches (PolicyLoaded)
        else:
            self._everywhere(ev.TakingOver(), now)
        self.out += [act.Submit(remote, sweep=True) for remote in self.ovsdb.names]

    def _stand_down(self, now: float) -> None:
        """Another controller of our owner has the lock: it is the active one now. Slave to every switch,
        and nothing more from us."""
        LOG.warning("owner %s: another controller holds the OVSDB lock; standing by", self.owner)
        self.authority.stand_down()
        self._everywhere(ev.StandingDown(), now)

    # --- REST changes ---------------------------------------------------------------------------------------
    def _refused(self, now: float) -> Standby | None:
        """Why this controller may not change the policy now, if it may not."""
        if not self.authority.active:
            return Standby(f"this controller is the standby of owner {self.owner}: send changes to the active one")
        if self.authority.cluster is not None and not self.authority.confirmed(now):
            return Standby("coordination lost: this member has not reached etcd within its lease; try again, or "
                           "send the change to another member")
        if not self.authority.confirmed(now):
            return Standby(f"this controller of owner {self.owner} has not confirmed within {LEASE_SECONDS:g} s "
                           "that it still holds its owner's OVSDB lock; try again, or send the change to the other one")
        return None

    def _status(self, now: float) -> dict[str, Any]:
        cluster = self.authority.cluster
        # role_since: the wall-clock time the switch confirmed its role, for tools that time a take-over.
        switches = {f"{dp_id:016x}": sw.status(self.view(dp_id, now))
                    | {"role_since": None if sw.role.since is None else round(self.wall() - now + sw.role.since, 3)}
                    | ({"owner": cluster.owners.get(dp_id)} if cluster else {})
                    for dp_id, sw in self.switches.items() if sw.bridge is not None}
        reported = self.reported
        remotes = {name: {"connected": reported.connected.get(name, False),
                          **({"error": reported.errors[name]} if name in reported.errors else {})}
                   for name in self.ovsdb.names}
        return {"role": self.authority.label(now), "policy": self.keeper.name,
                "mode": str(self.keeper.mode), "owner": self.owner, "ovsdb": remotes, "switches": switches,
                "decisions": list(self.decisions.last), **({"cluster": cluster.status()} if cluster else {}),
                **({"fabric": self.forwarding.fabric.status()} if self.forwarding.rules else {})}

    # --- a cluster's members sharing the switches (controller/core/cluster.py) -------------------------------
    def _cluster(self, event: ev.ClusterChanged | ev.SwitchClaimed, now: float) -> None:
        cluster = self.authority.cluster
        assert cluster is not None, "a coordination event without a cluster"
        if isinstance(event, ev.SwitchClaimed):
            if cluster.claimed(event) and event.dp_id in self.switches:
                LOG.info("switch %016x is ours (ownership revision %d)", event.dp_id, event.revision)
                self._to(self.switches[event.dp_id], ev.TakingOver(), now)
            return
        # Switches whose OVSDB we cannot reach: given up, so that a member that can reach it takes it.
        self.out += cluster.reach((dp for dp, sw in self.switches.items() if sw.bridge is not None
                                   and not self.reported.connected.get(sw.bridge.remote, False)), now)
        actions, lost = cluster.report(event, now, self.switches)
        self.out += actions
        for dp_id in lost & self.switches.keys():
            LOG.info("switch %016x is another member's now", dp_id)
            self._to(self.switches[dp_id], ev.StandingDown(), now)
        if event.probe_key is not None and event.probe_key != self.forwarding.fabric.key:
            LOG.info("discovery frames signed with the cluster's key")
            self.forwarding.fabric.key = event.probe_key
        if event.policy is not None and event.policy[0] > self.keeper.revision:   # put through another member
            self.keeper.install(*from_saved(ev.PolicyLoaded(SAVED_POLICY if event.policy[1] is not None
                                                            else SAVED_CLEARED, event.policy[1],
                                                            revision=event.policy[0])))
            self._installed(now)

    # --- the worker --------------------------------------------------------------------------------------
    def _jobs_done(self, done: ev.JobsDone, now: float) -> None:
        touched: dict[int, list[Any]] = {}
        for result in done.results:
            if result.job.conn in self.conns.switches:    # else for a connection that is gone
                touched.setdefault(result.job.conn, []).append(result)
                if result.ifindex:
                    self.conns.devices[result.ifindex] = result.job.dp_id
        for conn, results in touched.items():
            self._to(self.conns.switches[conn], ev.JobsDone(tuple(results)), now)

    # --- what the metrics show ----------------------------------------------------------------------------
    def snapshot(self, now: float) -> Snapshot:
        snap = Snapshot(policy=self.keeper.name, role=self.authority.label(now), load_error=self.keeper.load_error,
                        ovsdb_connected=dict(self.reported.connected))
        for dp_id, sw in self.switches.items():
            if sw.bridge is not None:
                snap.switches[dp_id], snap.in_sync[dp_id] = sw.telemetry, sw.in_sync
        if self.keeper.policy is not None and self.keeper.policy.network is not None:
            snap.fabric = self.forwarding.fabric.figures()     # from 0 on, whether it covers a switch yet or not
        return snap


class Standby(RuntimeError):
    """A change sent to the standby controller."""
