"""The controller's decisions, as Faucet's valve.py makes its own: events and an injected `now` in,
actions out (pure: no os-ken, OVS or netlink here; controller/qos_app.py translates both ways).

It holds the policy in force, this controller's role (active or standby), and one Switch per datapath
(controller/core/switch.py). A second connection that claims a datapath id already connected does not
displace the switch: the switch's own connection is asked for an echo first, and kept if it answers
(plain OpenFlow is unauthenticated; TLS is the answer on an untrusted network). A REST change is
answered once every switch the old or the new policy names holds it, or after CONFIRM_SECONDS, saying
which do not and why (a switch that is not connected is changed when it connects).

What it reads and keeps outside itself is injected: the OVSDB replica and the owner's generation id
(`ovsdb`, an OvsdbView), the saved policy (`store`), the wall clock for the decisions' log, randomness.
"""
from __future__ import annotations

import collections
import logging
import random
from collections.abc import Callable
from typing import Any, Protocol

from controller.core import actions as act
from controller.core import events as ev
from controller.core.bridges import BridgeInfo, check_ports
from controller.core.congestion import Decision
from controller.core.errors import PolicyError, StorageError
from controller.core.jobs import JobResult
from controller.core.meters import desired_meters
from controller.core.policy import Policy, load_document, parse_policy
from controller.core.queues import OvsdbQos
from controller.core.stats import RateTracker
from controller.core.switch import BRIDGE_RETRIES, BRIDGE_RETRY_SECONDS, UNKNOWN_METERS, Switch
from controller.core.telemetry import Snapshot

LOG = logging.getLogger("qos")
UNSET, CLEARED, ACTIVE = "unset", "cleared", "active"   # no policy yet (hands off) / cleared / in force
ROLE_ACTIVE, ROLE_STANDBY = "active", "standby"
CONFIRM_SECONDS = 20.0      # a change is answered once every switch is in sync, or after this saying what is not
CLAIM_SECONDS = 3.0         # how long a switch's connection has to answer the echo that tests a rival's claim
CONFIRMED = ("set_policy", "clear_policy")
NOT_CONNECTED = "not connected to this controller; it is changed when it connects"
# Saved states (controller/adapters/statefile.py reads them into one of these).
SAVED_ABSENT, SAVED_CLEARED, SAVED_POLICY = "absent", "cleared", "policy"


class OvsdbView(Protocol):
    """What the core reads from the OVSDB remotes (their in-memory replicas) and asks of them."""
    names: tuple[str, ...]

    @property
    def generation(self) -> tuple[int, ...]: ...

    def bridge(self, dp_id: int, pinned: str | None = None) -> BridgeInfo | None: ...

    def port_qos(self, remote: str, iface: str) -> OvsdbQos | str | None: ...

    def generation_id(self) -> int: ...

    def claim_generation(self, above: int | None) -> int | None: ...

    def remotes(self) -> dict[str, dict[str, Any]]: ...


class Store(Protocol):
    """The policy in force, kept across restarts."""

    def read(self) -> tuple[str, Any]: ...

    def write(self, document: Any) -> None: ...


class Controller:
    def __init__(self, ovsdb: OvsdbView, store: Store, *, owner: str, policy_file: str | None = None,
                 active: bool = True, wall: Callable[[], float], rng: random.Random | None = None):
        self.ovsdb, self.store, self.owner, self.policy_file = ovsdb, store, owner, policy_file
        self.wall, self.rng = wall, rng or random.Random()
        self.mode, self.document, self.policy = self.initial_policy()
        self.role = ROLE_ACTIVE if active else ROLE_STANDBY
        self.generation = 0           # our OpenFlow generation id as master (claimed when it is needed)
        self.switches: dict[int, Switch] = {}          # datapath id → the switch (its accepted connection)
        self.conns: dict[int, Switch] = {}             # accepted connection → its switch
        self.claims: dict[int, tuple[int, frozenset[int], int, int]] = {}   # rival conn → (dp, ports, conn, xid)
        self.rates = RateTracker()
        self.snapshot = Snapshot(policy=self.policy.name if self.policy else None, role=self.role)
        self.decisions: collections.deque[dict[str, Any]] = collections.deque(maxlen=1000)
        self.ports_by_ifindex: dict[int, tuple[int, int]] = {}   # device → (switch, port), for netlink
        self.waiting: list[tuple[Any, dict[str, Any], float, frozenset[int]]] = []   # changes answered once in sync
        self.out: list[act.Action] = []
        self.now = 0.0
        self._late_logged: set[int] = set()
        LOG.info("owner %s, policy %s (%s)", owner, self.policy.name if self.policy else None, self.mode)

    @property
    def active(self) -> bool:
        return self.role == ROLE_ACTIVE

    @property
    def interval(self) -> float:
        return self.policy.poll_interval if self.policy else 1.0

    def initial_policy(self) -> tuple[str, Any, Policy | None]:
        """The configured policy file (a bad one raises PolicyError), else the one saved when this owner
        last ran; a saved state that cannot be used leaves the switches as they are."""
        if self.policy_file:
            document = load_document(self.policy_file)
            return ACTIVE, document, parse_policy(document)
        try:
            saved, document = self.store.read()
        except (OSError, PolicyError) as err:
            LOG.error("cannot use the saved policy (%s); starting without one, switches left as they are", err)
            return UNSET, None, None
        if saved != SAVED_POLICY:
            return (CLEARED if saved == SAVED_CLEARED else UNSET), None, None
        try:
            return ACTIVE, document, parse_policy(document)
        except PolicyError as err:
            LOG.error("the saved policy is no longer valid (%s); starting without one, switches left as they are",
                      err)
            return UNSET, None, None

    # --- the one entry point ------------------------------------------------------------------------------
    def handle(self, event: Any, now: float) -> list[act.Action]:
        self.now, self.out = now, []
        match event:
            case ev.SwitchUp():
                self._switch_up(event)
            case ev.SwitchDown():
                self._switch_down(event.conn)
            case ev.EchoReply():
                self._echo_reply(event)
            case ev.ClaimDue():
                self._claim_due(event.conn)
            case ev.Request():
                self._request(event)
            case ev.ConfirmDue():
                pass
            case ev.JobsDone():
                self._jobs_done(event.results)
            case ev.TcChanged():
                self._tc_changed(event.devices)
            case ev.RemotesChanged():
                self._remotes_changed(event)
            case _:
                self._to_switch(event)
        if self.waiting:
            self._answer_waiting()
        out, self.out = self.out, []
        return out

    def _to_switch(self, event: Any) -> None:
        """OpenFlow replies and the switch's own timers, for the switch on that connection only."""
        sw = self.conns.get(event.conn)
        if sw is None:
            return       # a connection gone, or one whose claim is being tested
        match event:
            case ev.BridgeDue():
                sw.find_bridge(event.tries)
            case ev.PortsChanged():
                sw.ports = event.ports
                # OVSDB numbers a new port a moment after the switch reports it: read until it has.
                self.out.append(act.Later(BRIDGE_RETRY_SECONDS, ev.BridgeDue(sw.conn, BRIDGE_RETRIES)))
            case ev.PollDue():
                sw.poll_due(event)
            case ev.RoleReply():
                sw.role_reply(event)
            case ev.ErrorReply():
                sw.error(event)
            case ev.BarrierReply():
                sw.barrier(event)
            case ev.FlowStatsReply():
                sw.flow_stats(event, self.now)
            case ev.FlowCountReply():
                sw.flow_count(event)
            case ev.MeterFeaturesReply():
                sw.meter_features(event)
            case ev.MeterConfigReply():
                sw.meter_config(event)
            case ev.MeterStatsReply():
                sw.meter_stats(event, self.now)
            case ev.QueueStatsReply():
                sw.queue_stats(event, self.now)
            case ev.PortStatsReply():
                sw.port_stats(event, self.now)
            case _:
                raise TypeError(f"not an event of the core: {event!r}")

    # --- connections, and rival claims to a datapath id --------------------------------------------------------
    def _switch_up(self, up: ev.SwitchUp) -> None:
        live = self.switches.get(up.dp_id)
        if live is None:
            self._accept(up.conn, up.dp_id, up.ports)
            return
        if any(claim[0] == up.dp_id for claim in self.claims.values()):
            LOG.warning("datapath %016x: a third connection claims it while a claim is tested; closed", up.dp_id)
            self.out.append(act.Close(up.conn))
            return
        # Plain OpenFlow lets any peer say any datapath id: the switch's own connection decides.
        xid = live.xid()
        live.send(act.Echo(xid))
        self.claims[up.conn] = (up.dp_id, up.ports, live.conn, xid)
        self.out.append(act.Later(CLAIM_SECONDS, ev.ClaimDue(up.conn)))

    def _echo_reply(self, reply: ev.EchoReply) -> None:
        for rival, (dp_id, _, conn, xid) in list(self.claims.items()):
            if (conn, xid) == (reply.conn, reply.xid):
                del self.claims[rival]
                LOG.warning("datapath %016x: another connection claimed it while the switch answers on its own; "
                            "closed that one (an impostor? use OpenFlow over TLS on an untrusted network)", dp_id)
                self.out.append(act.Close(rival))

    def _claim_due(self, rival: int) -> None:
        claim = self.claims.pop(rival, None)
        if claim is None:
            return
        dp_id, ports, conn, _ = claim
        LOG.warning("datapath %016x: its connection did not answer within %g s; the new one is the switch now",
                    dp_id, CLAIM_SECONDS)
        self._forget(self.conns[conn])
        self.out.append(act.Close(conn))
        self._accept(rival, dp_id, ports)

    def _accept(self, conn: int, dp_id: int, ports: frozenset[int]) -> None:
        sw = Switch(self, conn, dp_id, ports)
        self.switches[dp_id] = self.conns[conn] = sw
        sw.find_bridge(BRIDGE_RETRIES)

    def _switch_down(self, conn: int) -> None:
        if self.claims.pop(conn, None) is not None:
            return       # a rival that left before its claim was decided
        sw = self.conns.get(conn)
        if sw is None:
            return       # never the switch's connection
        self._forget(sw)
        if sw.bridge is not None and self.active:
            self.out.append(act.Submit(sw.bridge.remote, sweep=True))   # a bridge that went leaves our rows behind
        LOG.info("switch %016x left", sw.dp_id)

    def _forget(self, sw: Switch) -> None:
        del self.conns[sw.conn]
        del self.switches[sw.dp_id]
        self.rates.forget_datapath(sw.dp_id)
        self.snapshot.forget(sw.dp_id)
        for index in [i for i, (dp, _) in self.ports_by_ifindex.items() if dp == sw.dp_id]:
            del self.ports_by_ifindex[index]

    # --- role: active or standby, and the generation id behind OpenFlow mastership ----------------------
    def generation_for(self, sw: Switch) -> int | None:
        """The generation id of our role request to `sw`: as master, ours, claimed anew (in OVSDB, which
        only the lock's holder can do) when the switch has seen a newer one; as slave, the switch's."""
        if not self.active:
            return sw.generation_seen if sw.generation_seen is not None else self.ovsdb.generation_id()
        seen = sw.generation_seen
        if self.generation and (seen is None or _not_older(self.generation, seen)):
            return self.generation
        claimed = self.ovsdb.claim_generation(seen)
        if claimed is None:
            LOG.warning("owner %s: could not claim an OpenFlow generation id (the OVSDB lock is not ours)", self.owner)
            self._stand_down()
            return None
        LOG.info("OpenFlow master with generation id %d", claimed)
        self.generation = claimed
        for other in self.switches.values():
            if other is not sw and other.role == "master":
                other.claim_role()      # the new id everywhere, so no switch keeps the older one
        return claimed

    def _remotes_changed(self, change: ev.RemotesChanged) -> None:
        for name, up in change.connected.items():
            if self.snapshot.ovsdb_connected.get(name, up) != up:
                (LOG.info if up else LOG.error)("OVSDB %s %s", name, "is back" if up else
                                               "is not connected; its switches' queues wait for it")
        self.snapshot.ovsdb_connected = dict(change.connected)
        if not self.active and change.locked:
            self._take_over()
        elif self.active and change.taken:
            self._stand_down()
        if change.new:   # bridges that were not found may be in the remote connected now
            for sw in self.switches.values():
                if sw.bridge is None:
                    sw.find_bridge(BRIDGE_RETRIES)

    def _take_over(self) -> None:
        """The lock is ours: the active controller is gone. Master of every switch (with a newer generation
        id), the policy it saved, what the switches hold read again and adopted, not rolled back."""
        LOG.warning("owner %s: the OVSDB lock is ours, the active controller is gone; taking over", self.owner)
        self.role = self.snapshot.role = ROLE_ACTIVE
        self.generation = 0           # claimed anew, above every switch's
        if not self.policy_file:
            self.mode, self.document, self.policy = self.initial_policy()
            self.snapshot.policy = self.policy.name if self.policy else None
        for sw in self.switches.values():
            if sw.bridge is None:
                continue
            sw.flows = sw.meters = sw.state = None   # read again; a fresh state adopts what is there
            sw.set_state()
            sw.ask(act.METER_CONFIG)
            sw.ask(act.FLOWS)
            sw.claim_role()
            sw.start_polling()
        for remote in self.ovsdb.names:
            self.out.append(act.Submit(remote, sweep=True))

    def _stand_down(self) -> None:
        """Another controller of our owner has the lock: it is the active one now. Slave to every switch,
        and nothing more from us."""
        if not self.active:
            return
        LOG.warning("owner %s: another controller holds the OVSDB lock; standing by", self.owner)
        self.role = self.snapshot.role = ROLE_STANDBY
        for sw in self.switches.values():
            sw.next_due = sw.next_fast = None
            sw.claim_role()

    # --- REST ------------------------------------------------------------------------------------------
    def _request(self, req: ev.Request) -> None:
        previous = self.policy
        try:
            result = getattr(self, f"_op_{req.op}")(req.arg)
        except (PolicyError, StorageError, Standby) as err:
            self.out.append(act.Answer(req.token, error=err))
            return
        except Exception as err:   # noqa: BLE001 - answered as a 500; the traceback goes to the log
            LOG.exception("request %s failed", req.op)
            self.out.append(act.Answer(req.token, error=err))
            return
        if req.op not in CONFIRMED:
            self.out.append(act.Answer(req.token, result))
            return
        named = frozenset(s.dp_id for p in (previous, self.policy) if p for s in p.switches)
        self.waiting.append((req.token, result, self.now + CONFIRM_SECONDS, named))
        self.out.append(act.Later(CONFIRM_SECONDS, ev.ConfirmDue()))   # answered then even if nothing else happens

    def _answer_waiting(self) -> None:
        """Answer the changes waiting for every switch to settle (in sync, or failed and shown as such),
        or for their time to run out."""
        switches = [sw for sw in self.switches.values() if sw.bridge is not None]
        settled = all(sw.settled for sw in switches)
        waiting = []
        for token, result, deadline, named in self.waiting:
            if not (settled or self.now > deadline):
                waiting.append((token, result, deadline, named))
                continue
            known = {sw.dp_id for sw in switches}
            not_in_sync: dict[str, Any] = {f"{sw.dp_id:016x}": dict(sw.errors) or "in progress" for sw in switches
                                           if not sw.in_sync}
            not_in_sync |= {f"{dp_id:016x}": NOT_CONNECTED for dp_id in sorted(named - known)}
            self.out.append(act.Answer(token, {**result, "in_sync": not not_in_sync,
                                               **({"not_in_sync": not_in_sync} if not_in_sync else {})}))
        self.waiting = waiting

    def _refuse_unless_active(self) -> None:
        if not self.active:
            raise Standby(f"this controller is the standby of owner {self.owner}: send changes to the active one")

    def _op_policy(self, _: Any) -> Any:
        return self.document

    def _op_set_policy(self, document: Any) -> dict[str, Any]:
        """Validate, check against the connected switches, save, then apply; on error nothing changes."""
        self._refuse_unless_active()
        try:
            policy = parse_policy(document)
            self.check(policy)
        except PolicyError:
            self.snapshot.load_error = True
            raise
        self.snapshot.load_error = False
        if self.mode == ACTIVE and policy == self.policy:
            return {"applied": policy.name, "changed": False}
        self._save(document)
        LOG.info("policy %s in force", policy.name)
        self._install(ACTIVE, document, policy)
        return {"applied": policy.name, "changed": True}

    def _op_clear_policy(self, _: Any) -> dict[str, Any]:
        """No policy: take our flows and queues off every switch."""
        self._refuse_unless_active()
        previous = self.policy
        self._save(None)
        self._install(CLEARED, None, None)
        LOG.info("policy %s cleared", previous.name if previous else None)
        return {"cleared": previous.name if previous else None}

    def _save(self, document: Any) -> None:
        try:
            self.store.write(document)
        except OSError as err:
            raise StorageError(f"cannot save the policy in force ({err}); nothing was changed: make the state "
                               "directory writable, or set [qos] state_file") from None

    def check(self, policy: Policy) -> None:
        """A policy against this controller and the switches connected to it: its pinned remotes, each
        switch's ports (the one check the offline checker makes too), and the switches' meters."""
        for switch in policy.switches:
            if switch.ovsdb and switch.ovsdb not in self.ovsdb.names:
                raise PolicyError(f"switches.{switch.name}.ovsdb: {switch.ovsdb} is not one of this controller's "
                                  f"OVSDB remotes ({', '.join(self.ovsdb.names)}); fix it, or add it to the "
                                  "controller's ovsdb option")
            sw = self.switches.get(switch.dp_id)
            if sw is None or sw.bridge is None:
                continue
            sw.find_bridge(0)     # OVSDB as it is now: it may have numbered a port since the last read
            check_ports(switch, set(sw.bridge.ports))
            if sw.cannot_police not in (None, UNKNOWN_METERS) and desired_meters(policy, switch):
                policed = next(c.name for c in policy.classes if c.police and any(r.traffic_class == c.name
                                                                                  for r in switch.flows))
                raise PolicyError(f"classes.{policed}.police: switch {switch.name} (bridge {sw.bridge.name}) cannot "
                                  f"police, {sw.cannot_police}; remove police, or run the bridge on a datapath with "
                                  "meters (datapath_type netdev, or the kernel's on Linux 4.18 or later)")

    def _op_status(self, _: Any) -> dict[str, Any]:
        switches = {f"{dp_id:016x}": sw.status() for dp_id, sw in self.switches.items() if sw.bridge is not None}
        return {"role": self.role, "policy": self.policy.name if self.policy else None, "mode": self.mode,
                "owner": self.owner, "ovsdb": self.ovsdb.remotes(), "switches": switches,
                "decisions": list(self.decisions)}

    def _install(self, mode: str, document: Any, policy: Policy | None) -> None:
        self.mode, self.document, self.policy = mode, document, policy
        self.snapshot.policy = policy.name if policy else None
        for sw in self.switches.values():
            sw.set_state()
            sw.reconcile()

    # --- the worker and netlink ----------------------------------------------------------------------------
    def _jobs_done(self, results: tuple[JobResult, ...]) -> None:
        touched: dict[int, list[JobResult]] = {}
        for result in results:
            sw = self.conns.get(result.job.conn)
            if sw is not None:    # else for a connection that is gone
                touched.setdefault(sw.conn, []).append(result)
        for conn, done in touched.items():
            self.conns[conn].jobs_done(done)

    def _tc_changed(self, devices: frozenset[int] | None) -> None:
        touched: dict[int, set[int]] = {}
        if devices is None:   # announcements were lost: any port may have changed
            touched = {dp_id: set(sw.ifindex) for dp_id, sw in self.switches.items()}
        for index in devices or ():
            if index in self.ports_by_ifindex:
                dp_id, port_no = self.ports_by_ifindex[index]
                touched.setdefault(dp_id, set()).add(port_no)
        for dp_id, ports in touched.items():
            sw = self.switches.get(dp_id)
            if sw is not None:
                sw.tc_changed(ports)

    # --- what switches report --------------------------------------------------------------------------------
    def drift(self, sw: Switch, kind: str, what: str) -> None:
        self.snapshot.drift_repairs[kind] = self.snapshot.drift_repairs.get(kind, 0) + 1
        LOG.warning("switch %016x: drift (%s) repaired: %s", sw.dp_id, kind, what)

    def late(self, sw: Switch, lag: float, took: float) -> None:
        if sw.dp_id not in self._late_logged:
            self._late_logged.add(sw.dp_id)
            LOG.warning("switch %016x: statistics cannot be polled every %g s (the last poll was %.2f s late and "
                        "took %.2f s); congestion is answered that much later", sw.dp_id, self.interval, lag, took)

    def decided(self, sw: Switch, port_no: int, decision: Decision) -> None:
        LOG.info("switch %016x port %d: %s — %s", sw.dp_id, port_no, decision.action, decision.reason)
        key = (sw.dp_id, port_no, decision.action)
        self.snapshot.events[key] = self.snapshot.events.get(key, 0) + 1
        self.decisions.append({"time": self.wall(), "dp_id": f"{sw.dp_id:016x}", "port": port_no,
                               "action": decision.action, "reason": decision.reason,
                               "utilisation": decision.utilisation, "loss_ratio": decision.loss_ratio})


class Standby(RuntimeError):
    """A change sent to the standby controller."""


def _not_older(ours: int, theirs: int) -> bool:
    """Whether the switch accepts generation id `ours` after `theirs` (OpenFlow compares them as the
    signed difference of two 64-bit numbers, so that they may wrap)."""
    return (ours - theirs) % 2**64 < 2**63
