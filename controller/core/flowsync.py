"""The flows and meters of ours one switch holds, and the batches that change them (a part of
controller/core/switch.py).

What the switch holds is read before anything is changed, taken from the barrier that confirms a batch,
or read again after an error, when a poll finds the table changed, or a moment after the switch says a flow
of ours was deleted (our flows ask it to) or its flow monitor says another changed one: never a memory of
what was sent.
A batch sends the meters its flows use, the flow changes, the meters no flow uses any more, then a
barrier; its errors are matched to it by xid.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from controller.core import actions as act
from controller.core import events as ev
from controller.core.flows import CLASSIFIED
from controller.core.meters import MeterChanges
from controller.core.part import LOG, Link, SwitchPart
from controller.core.plan import ActualFlow, FlowChanges
from controller.core.policy import Police

UNKNOWN_METERS = "the switch has not said yet which meters it has"
REREAD_SECONDS = 0.5    # a flow said deleted: how long the switch must stay connected before its table is read
METER_EXISTS = "OFPET_METER_MOD_FAILED/OFPMMFC_METER_EXISTS"


@dataclass
class Batch:
    """A flow batch (with the meters its flows use) sent and not yet confirmed by its barrier."""
    changes: FlowChanges
    meters: MeterChanges
    xids: frozenset[int]
    errors: list[str] = field(default_factory=list)
    meters_unknown: bool = False      # a meter added was there already: read what it is


class FlowSync(SwitchPart):
    def __init__(self, link: Link):
        super().__init__(link)
        self.flows: dict[int, ActualFlow] | None = None   # what the switch holds; None until it has said
        self.meters: dict[int, Police | None] | None = None   # our meters on it → band; ditto
        self.cannot_police: str | None = UNKNOWN_METERS   # why its meters cannot police; None: they can
        self.batches: dict[int, Batch] = {}               # barrier xid → batch
        self.failed = False                               # the switch refused a batch: tried again next poll
        self.reread = False                               # a flow of ours was said deleted: the table is to be read
        self.monitored = False                            # the switch says each change others make to its flows
        self._errors: dict[str, str] = {}

    def start(self) -> None:
        """What the switch can do and what it holds, before anything is changed."""
        for kind in (act.METER_FEATURES, act.FLOW_MONITOR, act.METER_CONFIG, act.FLOWS):   # monitored, then read
            self.link.ask(kind)

    def read_anew(self) -> None:
        self.flows = self.meters = None
        self.link.ask(act.METER_CONFIG)
        self.link.ask(act.FLOWS)

    def errors(self) -> dict[str, str]:
        return dict(self._errors)

    def current(self, epoch: int | None) -> bool:
        """Whether a reply asked in `epoch` says what the switch holds now: asked after our last batch,
        with none in flight."""
        return epoch == self.link.epoch and not self.batches

    # --- replies -------------------------------------------------------------------------------------
    def error(self, reply: ev.ErrorReply) -> bool:
        """Whether the error is no error: the flow monitor refused (a switch without it has its whole table read
        more often, poller.py), or a meter of ours found there already (adopted, read again)."""
        if self.link.answered(reply.xid)[0] == act.FLOW_MONITOR:   # a request refused is answered
            LOG.info("switch %016x has no flow monitor (%s); a flow changed by hand is found by reading its whole "
                     "table", self.link.dp_id, reply.what)
            return True
        batch = next((b for b in self.batches.values() if reply.xid in b.xids), None)
        if batch is None:
            return False
        if reply.what == METER_EXISTS:
            # Ours, from before: a restart, or a change another controller of ours made. Adopted as it is,
            # and put right if it differs once it has been read.
            batch.meters_unknown = True
            LOG.info("switch %016x: a meter we added was there already (xid %d); adopting it", self.link.dp_id,
                     reply.xid)
            return True
        batch.errors.append(f"{reply.what} (xid {reply.xid})")
        return False

    def barrier(self, reply: ev.BarrierReply) -> bool:
        """Whether it confirmed (or refused) a batch of ours."""
        batch = self.batches.pop(reply.xid, None)
        if batch is None:
            return False
        if batch.errors:
            self._errors["flows"] = "; ".join(batch.errors)
            self.failed = True
            self.flows = self.meters = None   # not what we think: ask the switch
            self.link.ask(act.METER_CONFIG)
            self.link.ask(act.FLOWS)
        else:
            self._errors.pop("flows", None)
            self.flows = batch.changes.applied_to(self.flows or {})
            self.meters = batch.meters.applied_to(self.meters or {})
            if batch.meters_unknown:
                self.meters = None
                self.link.ask(act.METER_CONFIG)
        return True

    def flow_table(self, reply: ev.FlowStatsReply, what: str | None, current: bool) -> bool:
        """Whether the flows the switch holds differ from what we knew."""
        if not current or self.flows is None and what != act.FLOWS:
            return False
        if what == act.CLASSIFIED_FLOWS:
            if reply.flows != {c: f for c, f in (self.flows or {}).items() if c & CLASSIFIED}:
                self.link.ask(act.FLOWS)   # something changed: read the whole table
            return False
        if reply.flows == self.flows:
            return False
        if self.flows is not None:
            self.link.drift("flows", difference(reply.flows, self.flows, "flows"))
        self.flows = reply.flows
        return True

    def removed(self, cookie: int) -> None:
        """The switch says a flow of ours went. Our own deletions are said too (before their barrier). Any other has
        the table read REREAD_SECONDS later, if the switch is still connected (a bridge being deleted says each of
        its flows went just before its connection closes: nothing to repair there); the read finds what differs,
        and the switch is put right. One read for a deletion of many flows."""
        if not any(cookie in batch.changes.delete for batch in self.batches.values()):
            self.changed()

    def changed(self) -> None:
        """Another connection changed flows of ours (the flow monitor says so; never of our own changes): the table
        is read REREAD_SECONDS later, as after a deletion."""
        if self.reread:
            return
        self.reread = True
        self.link.later(REREAD_SECONDS, ev.TableDue(self.link.conn))

    def table_due(self) -> None:
        """A read asked while a batch is in flight is answered after its barrier (OpenFlow answers in order):
        as current as one asked then. Flows may have gone with their meter (a del-meter): the meters are read
        after them, and nothing is planned until both are in (a flow put back without its meter is refused)."""
        self.reread = False
        self.link.ask(act.FLOWS)
        if self.meters:
            self.meters = None
            self.link.ask(act.METER_CONFIG)

    def meter_config(self, reply: ev.MeterConfigReply, current: bool) -> bool:
        if not current or reply.meters == self.meters:
            return False
        if self.meters is not None:
            self.link.drift("meters", difference(reply.meters, self.meters, "meters"))
        self.meters = reply.meters
        return True

    def meter_set(self, reply: ev.MeterStatsReply, current: bool) -> None:
        if current and self.meters is not None and reply.counters.keys() != self.meters.keys():
            # Meters added or removed (and with a meter, its flows): nothing is planned until they are read.
            self.link.drift("meters", f"{len(reply.counters.keys() ^ self.meters.keys())} meters added or removed")
            self.meters = None
            self.link.ask(act.METER_CONFIG)

    # --- changes -------------------------------------------------------------------------------------
    def sync(self, changes: FlowChanges, meters: MeterChanges) -> None:
        """Send what the plan changes, unless a batch is in flight or the last one failed (next poll)."""
        cannot = self.cannot_police if meters.add or meters.modify else None
        if cannot:   # a policy that needs it is refused; this is a switch that came later, left as it is
            self._errors["meters"] = f"{cannot}: nothing of the policy is written to it, whose flows police; remove " \
                                     "police from their classes or run the bridge on a datapath with meters"
        elif (changes or meters) and not self.batches and not self.failed:
            self._errors.pop("meters", None)
            self._send_batch(changes, meters)

    def pending(self, changes: FlowChanges, meters: MeterChanges) -> bool:
        """Whether the switch will move without anything else happening: a batch in flight, or one to send."""
        cannot = self.cannot_police if meters.add or meters.modify else None
        return bool(self.batches) or bool(changes or meters) and not self.failed and not cannot

    def _send_batch(self, changes: FlowChanges, meters: MeterChanges) -> None:
        link = self.link
        messages: list[act.Message] = [
            *(act.MeterMod(link.xid(), "add", m, band) for m, band in meters.add),
            *(act.MeterMod(link.xid(), "modify", m, band) for m, band in meters.modify),
            *(act.DeleteFlow(link.xid(), cookie) for cookie in changes.delete),
            *(act.ModifyFlow(link.xid(), entry) for entry in changes.modify),
            *(act.AddFlow(link.xid(), entry) for entry in changes.add),
            *(act.MeterMod(link.xid(), "delete", m) for m in meters.delete)]
        barrier = link.xid()
        link.send(*messages, act.Barrier(barrier))
        self.batches[barrier] = Batch(changes, meters, frozenset(m.xid for m in messages))
        link.epoch += 1
        LOG.info("switch %016x: flows -%d ~%d +%d%s", link.dp_id, len(changes.delete), len(changes.modify),
                 len(changes.add), f", meters -{len(meters.delete)} ~{len(meters.modify)} +{len(meters.add)}"
                 if meters else "")


def difference(actual: dict[int, Any], known: dict[int, Any], what: str) -> str:
    """How what a switch holds differs from what we thought it held, for the drift log."""
    return (f"{len(actual.keys() ^ known.keys())} {what} added or removed, "
            f"{sum(actual[k] != known[k] for k in actual.keys() & known.keys())} changed")
