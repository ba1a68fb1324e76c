"""The controller's decisions, as Faucet's valves_manager.py makes its own: events and an injected `now`
in, actions out (pure: no os-ken, OVS or netlink here, and no I/O; controller/qos_app.py translates both
ways and does what the actions ask, reporting back with an event).

It holds the policy in force and the changes to it (controller/core/keeper.py), this controller's
authority (controller/core/ha.py: alone, one of a pair, or a cluster's member, asked alike), one Switch
per datapath (controller/core/switch.py), each handed a read-only view of what it may know, the fabric
among the switches a policy's network: section covers (controller/core/forwarding.py), and the rival
claims to a connected datapath id (controller/core/connections.py).
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
from controller.core.authority import Alone
from controller.core.checks import check_policy
from controller.core.connections import Connections
from controller.core.errors import PolicyError
from controller.core.forwarding import Forwarding
from controller.core.ha import Authority, Handover
from controller.core.held import Held
from controller.core.keeper import PolicyKeeper, from_saved
from controller.core.policy import Policy, parse_policy
from controller.core.poller import LatePolls
from controller.core.switch import BRIDGE_RETRIES, Switch
from controller.core.telemetry import Decisions, Snapshot
from controller.core.view import Mode, OvsdbReplica, SwitchView

LOG = logging.getLogger("qos")


class Controller:
    def __init__(self, ovsdb: OvsdbReplica, *, owner: str, saved: ev.PolicyLoaded,
                 pinned: tuple[Any, Policy] | None = None, authority: Authority | None = None,
                 wall: Callable[[], float], rng: random.Random | None = None, probe_key: bytes | None = None):
        """`saved`: the policy the store held at start; `pinned`: the configured policy file's document and
        its Policy, which win over the saved one and a take-over alike; `authority`: how this controller shares
        its owner's switches (alone by default); `probe_key`: what the fabric's discovery frames are signed with
        (a cluster's members share it)."""
        self.authority: Authority = authority or Alone()
        self.ovsdb, self.owner, self.pinned = ovsdb, owner, pinned[0] if pinned else None
        self.wall, rng = wall, rng or random.Random()
        self.forwarding = Forwarding(probe_key or rng.randbytes(32), rng, wall, shared=self.authority.shares)
        self.keeper = PolicyKeeper(*(Mode.IN_FORCE, *pinned, saved.revision)
                                   if pinned is not None else from_saved(saved))
        self.switches: dict[int, Switch] = {}          # datapath id → the switch (its accepted connection)
        self.conns = Connections()                     # by connection; their devices; rival claims
        self.decisions = Decisions(wall)                # the last programs, rollbacks and moves, for the status
        self.reported = ev.RemotesChanged({})         # the remotes as the app last reported them
        self.held = Held(self.authority)               # what our switches hold of the policy in force
        self.late_polls = LatePolls()
        self.out: list[act.Action] = []
        self.handled: dict[int, Switch] = {}           # the switches the event being handled went to
        LOG.info("owner %s, policy %s (%s)", owner, self.keeper.name, self.keeper.mode)

    def view(self, dp_id: int, now: float) -> SwitchView:
        owns, sw = self.authority.owns(dp_id), self.switches.get(dp_id)
        bridge = sw.bridge if sw is not None else None
        return SwitchView(self.keeper.policy, self.keeper.mode, owns, owns and self.authority.confirmed(now),
                          self.authority.generation_of(dp_id), self.ovsdb, self.authority.epoch_of(dp_id),
                          self.forwarding.rules.get(dp_id),
                          bridge is None or self.reported.connected.get(bridge.remote, True))

    # --- the one entry point ------------------------------------------------------------------------------
    def handle(self, event: ev.Event, now: float) -> list[act.Action]:
        self.out, self.handled = [], {}
        # A switch's own event (its replies and timers, most of what a controller handles), a device's news, the
        # fabric's (its discovery, four rounds a second) or the remotes' report and heartbeat (each second) can
        # change what the switches it went to hold only; any other event may change ownership or every switch.
        local = False
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
                local = True
                self.out += self.conns.echoed(event)
            case ev.PortsChanged():
                sw, local = self.conns.switches.get(event.conn), True
                if sw is not None:
                    self.forwarding.fabric.set_ports(sw.dp_id, event.ports, event.down, now)
                    self._to(sw, event, now)
                    self._refresh(now)
            case ev.PacketIn():
                sw, local = self.conns.switches.get(event.conn), True
                if sw is not None:
                    self.out += self.forwarding.packet_in(sw, event, *self._writable(now), now)
                    self._refresh(now)
            case ev.DiscoveryDue():
                local = True
                self.out += self.forwarding.round(event, *self._writable(now), now)
                self._refresh(now)
            case (ev.BridgeDue() | ev.TableDue() | ev.PollDue() | ev.RoleReply() | ev.ErrorReply()
                  | ev.BarrierReply() | ev.FlowStatsReply() | ev.FlowsChanged() | ev.FlowRemoved()
                  | ev.MeterFeaturesReply() | ev.MeterConfigReply() | ev.MeterStatsReply() | ev.QueueStatsReply()
                  | ev.PortStatsReply()):
                sw, local = self.conns.switches.get(event.conn), True   # None: a connection gone, or on trial
                if sw is not None:
                    self._to(sw, event, now)
                    if sw.poller.late is not None:
                        self.late_polls.add(sw.dp_id, sw.poller.late, now)
                        sw.poller.late = None
            case ev.GetPolicy():
                self.out.append(act.Answer(event.token, {"policy": self.keeper.document,
                                                         "revision": self.keeper.revision}))
            case ev.GetStatus():
                self.out.append(act.Answer(event.token, self._status(now)))
            case ev.SetPolicy() | ev.ClearPolicy():   # checked, saved (the app's I/O), installed, confirmed
                check = functools.partial(check_policy, switches=self.switches, ovsdb=self.ovsdb)
                refused = self.authority.refusal(now, self.owner)
                self.out += [act.Answer(event.token, error=Standby(refused))] if refused else \
                    self.keeper.change(event, check, now, self.authority.peers())
            case ev.Reload():   # answered to the Reload itself: the app logs it
                with contextlib.suppress(PolicyError):
                    parse_policy(event.document)
                    self.pinned = event.document     # what a take-over puts in force from now on
                refused = self.authority.refusal(now, self.owner)
                check = functools.partial(check_policy, switches=self.switches, ovsdb=self.ovsdb)
                self.out += [act.Answer(event, error=Standby(refused))] if refused else \
                    self.keeper.change(ev.SetPolicy(event, event.document), check, now, self.authority.peers())
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
                local = True
                for dp in news & self.switches.keys():
                    self._to(self.switches[dp], event, now)
            case ev.RemotesChanged():   # every second: switches change hands only in a take-over or a stand-down,
                local = True            # which go to every switch (or wait for PolicyLoaded, which does)
                self._remotes_changed(event, now)
                self.late_polls.say(now)
            case ev.Beaten():   # confirmed again after a lapse: what it could not write meanwhile
                local = True    # (who may write, not who owns)
                lapsed = not self.authority.confirmed(now)
                self.authority.beaten(event)
                if lapsed and self.authority.confirmed(now):
                    self._everywhere(ev.Reconcile(), now)
            case ev.ClusterChanged() | ev.SwitchClaimed():
                self._hand_over(self.authority.coordinate(event, now, self.switches, self.reported.connected), now)
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
        if self.held.update(self.switches.values(), list(self.handled.values()) if local else None):
            # For the answers other controllers give (why not: once settled).
            self.out += self.authority.publish(self.held.record, self.keeper.revision)
            if self.keeper.waiting:
                self.out += self.keeper.answer(self.held.owned(self.switches.values()), now, self.authority.peers())
        out, self.out = self.out, []
        return out

    def _to(self, sw: Switch, event: ev.SwitchEvent, now: float) -> None:
        """One switch handles an event; what it asks of the controller is done here, the rest goes out."""
        self.handled[sw.dp_id] = sw
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
    def _writable(self, now: float) -> tuple[dict[int, Switch], Callable[[int], bool]]:
        """The switches the fabric covers, and whether one of them is ours to write now."""
        covered = self.forwarding.covered(self.keeper.policy, self.switches)
        return covered, lambda dp: covered[dp].role.writable(self.view(dp, now))

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

    # --- what the status says ------------------------------------------------------------------------------
    def _status(self, now: float) -> dict[str, Any]:
        # role_since: the wall-clock time the switch confirmed its role, for tools that time a take-over.
        switches = {f"{dp_id:016x}": sw.status(self.view(dp_id, now))
                    | {"role_since": None if sw.role.since is None else round(self.wall() - now + sw.role.since, 3)}
                    | self.authority.about(dp_id)
                    for dp_id, sw in self.switches.items() if sw.bridge is not None}
        reported = self.reported
        remotes = {name: {"connected": reported.connected.get(name, False),
                          **({"error": reported.errors[name]} if name in reported.errors else {})}
                   for name in self.ovsdb.names}
        return {"role": self.authority.label(now), "policy": self.keeper.name,
                "mode": str(self.keeper.mode), "owner": self.owner, "ovsdb": remotes, "switches": switches,
                "decisions": list(self.decisions.last), **self.authority.status(),
                **({"fabric": self.forwarding.fabric.status()} if self.forwarding.rules else {})}

    # --- a cluster's members sharing the switches (controller/core/member.py) --------------------------------
    def _hand_over(self, handover: Handover, now: float) -> None:
        """The coordination service's news: switches taken over or given up, the cluster's discovery key, and a
        policy put through another member."""
        self.out += handover.actions
        for dp_id in handover.ours:
            self._to(self.switches[dp_id], ev.TakingOver(), now)
        for dp_id in handover.theirs:
            self._to(self.switches[dp_id], ev.StandingDown(), now)
        if handover.probe_key is not None and handover.probe_key != self.forwarding.fabric.key:
            LOG.info("discovery frames signed with the cluster's key")
            self.forwarding.fabric.key = handover.probe_key
        if handover.policy is not None and handover.policy.revision > self.keeper.revision:
            self.keeper.install(*from_saved(handover.policy))
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
                snap.switches[dp_id], snap.in_sync[dp_id] = sw.telemetry.now(), sw.in_sync
        if self.keeper.policy is not None and self.keeper.policy.network is not None:
            snap.fabric = self.forwarding.fabric.figures()     # from 0 on, whether it covers a switch yet or not
        return snap


class Standby(RuntimeError):
    """A change sent to the standby controller."""
