"""One switch's ports as OVSDB and tc hold them, and the jobs that change or check them (a part of
controller/core/switch.py; the jobs run in the adapters' worker, their results come back as JobsDone).

A port gets a job when OVSDB does not hold the queues the plan wants (QoS), or when its device may
differ from the queues it has (a check: netlink announced a tc change, the queues' leaves changed in
the policy, a job failed, or the slow sweep is due). A port has one job in flight at most.
"""
from __future__ import annotations

from controller.core import actions as act
from controller.core.bridges import BridgeInfo
from controller.core.jobs import Job, JobResult
from controller.core.part import LOG, Link, SwitchPart
from controller.core.plan import ABSENT, FOREIGN
from controller.core.queues import OvsdbQos, QosSpec

TC_SWEEP_SECONDS = 300.0      # netlink announces tc changes; a slow sweep catches any it dropped


class PortJobs(SwitchPart):
    def __init__(self, link: Link, now: float):
        super().__init__(link)
        self.busy: dict[int, bool] = {}                   # ports with a job in flight → it changes QoS
        self.applied: dict[int, OvsdbQos | None] = {}     # what we last put in OVSDB
        self.specs: dict[int, QosSpec] = {}               # the queues each port's device was last made to have
        self.check: set[int] = set()                      # ports whose tc may have changed
        self.failed: set[int] = set()                     # ports whose last job failed: tried again next poll
        self.missing: set[int] = set()                    # ports whose HTB classes a check found gone
        self.rebuild: set[int] = set()                    # ports whose QoS must be taken off and put back
        self.ifindex: dict[int, int] = {}                 # port → its device
        self.foreign: set[int] = set()                    # ports another tool's QoS holds (said once)
        self.swept = now
        self.epoch = 0                                    # the cluster's epoch of the switch we last raised
        self._errors: dict[str, str] = {}

    def errors(self) -> dict[str, str]:
        return dict(self._errors)

    def tc_changed(self, ports: set[int]) -> bool:
        """Whether a port not busy must be checked now (a busy one is checked once its job is done: the
        job may have looked before the change)."""
        self.check |= ports
        return bool(ports - self.busy.keys())

    def poll(self, now: float) -> bool:
        """A poll: what failed is tried again, and now and then every port is checked. Whether to reconcile."""
        retry = bool(self.failed)
        self.failed.clear()
        if now - self.swept > TC_SWEEP_SECONDS:
            self.swept = now
            self.check |= set(self.ifindex)
        return retry or bool(self.check)

    def policy_installed(self) -> None:
        """A new policy is no retry: a port whose job failed under the last one is tried now, not at the next
        poll (else the switch looked settled and the change was answered before its queues were touched)."""
        self.failed.clear()

    def read(self, bridge: BridgeInfo, actual: dict[int, OvsdbQos | str | None]) -> None:
        """What OVSDB holds against what we put there: another client changed it (put right), or another
        tool's QoS is there (left alone, said once)."""
        for port_no, qos in actual.items():
            if qos == FOREIGN:
                self.applied.pop(port_no, None)
                if port_no not in self.foreign:
                    self.foreign.add(port_no)
                    LOG.warning("switch %016x port %d (%s): another tool's QoS is on it; left alone", self.link.dp_id,
                                port_no, bridge.ports[port_no])
                continue
            self.foreign.discard(port_no)
            if port_no in self.applied and qos not in (self.applied[port_no], ABSENT) and port_no not in self.busy:
                self.link.drift("qos", f"port {port_no} ({bridge.ports[port_no]}): OVSDB holds {_mode(qos)}, "
                                       "not what we put")
                del self.applied[port_no]

    def start(self, bridge: BridgeInfo, changes: dict[int, QosSpec | None], specs: dict[int, QosSpec],
              actual: dict[int, OvsdbQos | str | None], tags: tuple[tuple[str, str], ...], epoch: int = 0) -> None:
        """Jobs for the ports whose QoS must change, and checks for those whose device may differ from
        the queues they have; none for a port already busy, or failed until the next poll or policy."""
        waiting = self.busy.keys() | self.failed
        for port_no, wanted in specs.items():   # new to us (a start), or its leaves changed: the device follows
            if self.specs.get(port_no) != wanted:
                self.check.add(port_no)
        jobs = [self._job(bridge, port_no, spec, True, tags, epoch, bare=port_no in actual and actual[port_no] is None)
                for port_no, spec in changes.items() if port_no not in waiting]
        for port_no in (self.check | self.rebuild) - waiting - changes.keys():
            spec = specs.get(port_no)
            if spec is not None and isinstance(actual.get(port_no), OvsdbQos):
                rebuild = port_no in self.rebuild
                jobs.append(self._job(bridge, port_no, spec, rebuild, tags, epoch, rebuild))
        # A port's check is done by the job that starts now; one still busy keeps its mark for later.
        started = {job.port_no for job in jobs}
        self.check -= started
        self.rebuild -= started
        # A new owner raises the switch's epoch in OVSDB before anything else, even with nothing to change:
        # from then on the member it took the switch from can write nothing there.
        epochs = ((self.link.dp_id, epoch),) if epoch > self.epoch else ()
        self.epoch = max(self.epoch, epoch)
        if jobs or epochs:
            self.busy.update((job.port_no, job.qos) for job in jobs)
            for job in jobs:
                if job.spec is None:
                    self.specs.pop(job.port_no, None)
                else:
                    self.specs[job.port_no] = job.spec
            self.link.do(act.Submit(bridge.remote, tuple(jobs), epochs=epochs))

    def changing(self) -> bool:
        """Whether a job that changes QoS is in flight (a check alone changes nothing a user sees)."""
        return any(self.busy.values())

    def _job(self, bridge: BridgeInfo, port_no: int, spec: QosSpec | None, qos: bool,
             tags: tuple[tuple[str, str], ...], epoch: int, rebuild: bool = False, bare: bool = False) -> Job:
        return Job(self.link.dp_id, self.link.conn, port_no, bridge.ports[port_no], bridge.userspace, spec, qos,
                   rebuild, tags, epoch, bare)

    def done(self, results: list[JobResult]) -> None:
        for result in results:
            job = result.job
            self.busy.pop(job.port_no, None)
            key = f"port {job.port_no} ({job.iface})"
            if result.error:
                if self._errors.get(key) != result.error:   # said once; retried on every poll
                    LOG.error("switch %016x %s: %s", job.dp_id, key, result.error)
                self._errors[key] = result.error
                self.failed.add(job.port_no)
                self.check.add(job.port_no)
                self.specs.pop(job.port_no, None)
            else:
                failed_before = self._errors.pop(key, None) is not None
                if job.qos:
                    self.applied[job.port_no] = job.spec.ovsdb if job.spec else None
                    LOG.info("switch %016x %s: %s", job.dp_id, key, _queues(job.spec))
                elif result.tc and failed_before:   # our own work, finished at a retry: not a change made by hand
                    LOG.info("switch %016x %s: done on a retry: %s", job.dp_id, key, "; ".join(result.tc))
                elif result.tc:
                    self.link.drift("tc", f"{key}: {'; '.join(result.tc)}")
                self._missing(job, result)
            if result.ifindex:
                self.ifindex[job.port_no] = result.ifindex

    def _missing(self, job: Job, result: JobResult) -> None:
        if not result.missing:
            self.missing.discard(job.port_no)
        elif not job.qos:
            # Gone for a moment while OVS rebuilds them, or for good (a `tc qdisc del` by hand): look again
            # next poll, and rebuild the QoS if they are still gone then.
            if job.port_no in self.missing:
                self.link.drift("tc", f"port {job.port_no} ({job.iface}): the HTB qdisc is gone from the device; "
                                      "rebuilding the QoS")
                self.missing.discard(job.port_no)
                self.rebuild.add(job.port_no)
            else:
                self.missing.add(job.port_no)
                self.failed.add(job.port_no)
                self.check.add(job.port_no)


def _mode(actual: OvsdbQos | str | None) -> str:
    return f"{actual.mode} queues" if isinstance(actual, OvsdbQos) else actual or "no QoS"


def _queues(spec: QosSpec | None) -> str:
    if spec is None:
        return "queues removed"
    return f"{spec.mode} queues " + ", ".join(f"{q.queue_id}:{q.traffic_class} {q.min_bps}-{q.max_bps} bit/s"
                                              for q in spec.queues)
