"""OVSDB and tc work, done by one greenthread so the app's event loop never waits on it.

The app submits jobs (a port's queues to change, or only its tc to check) and goes on handling
OpenFlow events; the worker takes every job waiting, does them as one batch and hands the results
back through the app's event queue. One OVSDB transaction serves the whole batch (a batch of more
than ovsdb.TRANSACTION_PORTS ports, several), so applying a policy to 1000 ports is one transaction,
not 1000. The worker hands the loop over after each port's
tc calls: netlink answers at once, so a green socket never waits, and a batch of thousands of ports
would hold the loop for seconds (OpenFlow echo replies, a cluster member's lease refresh).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar, TypeVarTuple, overload

from controller.adapters.hostlock import SwitchLocks
from controller.adapters.ovsdb import OvsdbError, Unconfirmed
from controller.adapters.tc import Tc
from controller.compat import hub
from controller.core.jobs import Job, JobResult
from controller.core.plan import spec_classes, tc_changes
from controller.core.queues import QosSpec, leaf_chain

LOG = logging.getLogger(__name__)
CLASS_WAIT_SECONDS = 3.0   # Ovsdb.apply returns once vswitchd applied the change; the classes follow at once


SWEEP = "sweep"   # in the queue: remove our QoS rows that no port uses any more
# What a job is answered while this controller may not write: one of a standby pair, or a cluster's member.
LOCK_UNCONFIRMED = "this controller does not hold its owner's OVSDB lock; it changes nothing"
LEASE_UNCONFIRMED = "this member has not refreshed its lease in etcd lately (coordination lost); it changes nothing"



@dataclass(frozen=True)
class Epoch:
    """In the queue: a cluster member's epoch of a switch it now owns, raised in OVSDB before its writes."""
    dp_id: int
    epoch: int


T = TypeVar("T")
Args = TypeVarTuple("Args")


class OvsdbWriter(Protocol):
    """What a worker changes in its OVSDB remote (controller/adapters/remotes.py's RemoteView)."""

    def apply(self, changes: dict[str, QosSpec | None], tags: dict[str, str] | None = None,
              port_tags: dict[str, dict[str, str]] | None = None, epochs: dict[int, int] | None = None) -> None: ...

    def fence(self, epochs: dict[int, int]) -> dict[int, str]: ...

    def remove_orphans(self, everywhere: bool = True) -> int: ...


class Worker:
    """One OVSDB remote's work; `tc` None when its ports are devices of another machine."""

    def __init__(self, ovsdb: OvsdbWriter, tc: Tc | None, done: Callable[[list[JobResult]], None],
                 may_write: Callable[[], bool] = lambda: True, unconfirmed: str = LOCK_UNCONFIRMED,
                 locks: SwitchLocks | None = None) -> None:
        """`may_write`: whether this controller holds its owner's lock (a cluster's member: its lease) now, and
        `unconfirmed` what a job is answered while it does not. OVSDB fences our transactions by the lock or
        the epoch itself; tc has no such guard, so a controller that lost either while it hung writes none,
        and a cluster member's tc writes are fenced by `locks`, the switches' host locks."""
        self._ovsdb, self._tc, self._done, self._may_write, self._locks = ovsdb, tc, done, may_write, locks
        self._unconfirmed = unconfirmed
        self._queue = hub.Queue()

    def submit(self, jobs: list[Job]) -> None:
        for job in jobs:
            self._queue.put(job)

    def sweep_orphans(self) -> None:
        self._queue.put(SWEEP)

    def raise_epochs(self, epochs: dict[int, int]) -> None:
        for dp_id, epoch in epochs.items():
            self._queue.put(Epoch(dp_id, epoch))

    def run(self) -> None:
        while True:
            batch = [self._queue.get()]
            while not self._queue.empty():
                batch.append(self._queue.get())
            try:
                results = self.execute(batch)
            except Exception as err:   # noqa: BLE001 - a dead worker would stop every repair silently
                LOG.exception("OVSDB/tc batch failed")
                results = [JobResult(job, f"internal error: {err}") for job in batch]
            self._done(results)

    def execute(self, batch: list[Job | Epoch | str]) -> list[JobResult]:
        """`batch`: jobs, epochs to raise, and SWEEP if asked."""
        sweep = SWEEP in batch
        jobs = [job for job in batch if isinstance(job, Job)]
        raised = {item.dp_id: item.epoch for item in batch if isinstance(item, Epoch)}
        if not self._may_write():
            return [JobResult(job, self._unconfirmed) for job in jobs]
        results = {id(job): JobResult(job) for job in jobs}
        epochs = raised | {job.dp_id: job.epoch for job in jobs if job.epoch}
        # A member has ovsdb-server verify (or raise) its epochs, and writes tc, under the switches' host locks,
        # so that no tc write of a deposed member comes after a newer epoch (controller/adapters/hostlock.py).
        with self._switch_locks(epochs) as busy:
            self._held(self._fenced(jobs, results, epochs, raised, busy), results, sweep)
        return list(results.values())

    def _switch_locks(self, dp_ids: Iterable[int]) -> AbstractContextManager[dict[int, str]]:
        """Only a writer of tc needs them: OVSDB fences its transactions itself."""
        if self._locks and self._tc:
            return self._locks.held(dp_ids)
        return nullcontext({})

    def _held(self, jobs: list[Job], results: dict[int, JobResult], sweep: bool) -> None:
        """The batch's work, under the switches' locks: tc filters off, OVSDB, unused rows, then tc."""
        changes = [job for job in jobs if job.qos]
        took = [time.monotonic()]   # where a batch's time goes, said of each batch that changes QoS
        for job in changes:
            if job.userspace and self._tc and not job.bare:
                # HTB refuses to delete a class a filter points at: our filters go first.
                self._tc_call(results[id(job)], self._tc.replace_filters, job.iface, ())
                hub.sleep(0)
        took.append(time.monotonic())
        if changes:
            self._apply(changes, results)
        took.append(time.monotonic())
        if sweep or changes:
            # Rows a port no longer uses: a bridge that went away, or a QoS cleared off its port by hand.
            try:
                removed = self._ovsdb.remove_orphans(everywhere=sweep)
                if removed:
                    LOG.info("removed %d QoS/Queue rows no port uses any more", removed)
            except (OvsdbError, RuntimeError) as err:
                LOG.error("could not remove unused QoS/Queue rows: %s", err)
        took.append(time.monotonic())
        deadline = time.monotonic() + CLASS_WAIT_SECONDS   # for the whole batch: classes come together, or not
        for job in jobs:
            result = results[id(job)]
            if job.spec is not None and result.error is None:
                self._ensure_tc(job, result, deadline if job.qos else 0.0)
                hub.sleep(0)
        took.append(time.monotonic())
        if changes:
            LOG.info("%d ports' QoS changed and %d checked in %.2f s: filters off %.2f s, OVSDB and vswitchd %.2f s, "
                     "unused rows %.2f s, classes, leaves and filters %.2f s", len(changes), len(jobs) - len(changes),
                     took[-1] - took[0], *(b - a for a, b in zip(took, took[1:])))

    def _fenced(self, jobs: list[Job], results: dict[int, JobResult], epochs: dict[int, int], raised: dict[int, int],
                busy: dict[int, str]) -> list[Job]:
        """A cluster member's or a standby pair's jobs: `epochs`, their switches' (and those `raised`), raised to
        ours first, and the jobs refused of the switches another controller of our owner holds now (tc included,
        which OVSDB does not guard) and of those whose host lock is `busy` (neither checked nor raised)."""
        checked = {dp: epoch for dp, epoch in epochs.items() if dp not in busy}
        if not epochs:
            return jobs
        try:
            refused = busy | (self._ovsdb.fence(checked) if checked else {})
        except (OvsdbError, RuntimeError) as err:
            refused = busy | dict.fromkeys(checked, f"OVSDB did not take our epoch ({err})")
        for dp_id in raised.keys() & refused.keys():
            LOG.warning("switch %016x: %s", dp_id, refused[dp_id])
        for job in jobs:
            if job.dp_id in refused:
                results[id(job)].error = refused[job.dp_id]
        return [job for job in jobs if job.dp_id not in refused]

    def _apply(self, jobs: list[Job], results: dict[int, JobResult]) -> None:
        port_tags = {job.iface: dict(job.tags) for job in jobs}
        epochs = {job.dp_id: job.epoch for job in jobs if job.epoch} or None
        try:
            rebuilt: dict[str, QosSpec | None] = {job.iface: None for job in jobs if job.rebuild}
            if rebuilt:
                self._ovsdb.apply(rebuilt, port_tags=port_tags, epochs=epochs)
            self._ovsdb.apply({job.iface: job.spec for job in jobs}, port_tags=port_tags, epochs=epochs)
        except Unconfirmed as err:   # no refusal to narrow down: one by one would only wait for vswitchd N times
            for job in jobs:
                results[id(job)].error = str(err)
        except (OvsdbError, RuntimeError) as err:
            if len(jobs) == 1:
                results[id(jobs[0])].error = str(err)
                return
            # One bad port fails the whole transaction: find it, and still change the others.
            LOG.warning("OVSDB refused a batch of %d ports (%s); applying them one by one", len(jobs), err)
            for job in jobs:
                self._apply([job], results)

    def _ensure_tc(self, job: Job, result: JobResult, deadline: float) -> None:
        """`deadline`: until when to wait for OVS to build the classes (a change's; a check waits not)."""
        assert job.spec is not None   # only jobs that put queues on a port are checked
        if self._tc is None:
            if job.userspace and job.spec.marks:   # its classes would get nothing: all would land in queue 0
                result.error = (f"{job.iface}: a userspace-datapath bridge steers classes by tc filters, which "
                                "the controller sets only for a unix: OVSDB remote (its own host and namespace); "
                                "name the OVS's unix socket, or run the bridge on the kernel datapath")
            return   # set_queue steers on the kernel datapath; the queues keep OVS's default leaf
        # Only a QoS change waits for OVS to build its classes; a check finds them there or not. After a
        # change, the leaves are written without being read first (they are OVS's new defaults, or ours
        # that a rewrite keeps), and our filters are gone (execute took them off): half the netlink
        # calls of applying a policy to many ports.
        wanted = set(spec_classes(job.spec))
        while True:
            classes = self._tc_call(result, self._tc.classes, job.iface)
            if classes is None:
                return
            leaves = {} if job.qos else self._tc_call(result, self._tc.leaves, job.iface, wanted & set(classes))
            filters = self._tc_call(result, self._tc.filters, job.iface) if job.userspace and not job.qos else set()
            if leaves is None or filters is None:
                return
            plan = tc_changes(job.spec, job.userspace, set(classes),
                              {c: (leaf.kind, leaf.limit, leaf.delay_us) for c, leaf in leaves.items()}, filters)
            if not plan.waiting or time.monotonic() > deadline:
                break
            hub.sleep(0.05)
        if plan.waiting:
            if job.qos:
                result.error = (f"{job.iface}: OVS did not build the {job.spec.qos_type} classes within "
                                f"{CLASS_WAIT_SECONDS:g} s; `topo/run.py doctor` says whether the kernel has the qdisc")
            result.missing = True
            return
        chain = leaf_chain(job.spec)
        for cls in plan.leaves:
            if self._tc_call(result, self._tc.replace_leaf, job.iface, cls, chain) is not None:
                result.tc.append(f"{' / '.join(' '.join(qdisc) for qdisc in chain)} under {cls}")
        if plan.filters is not None and self._tc_call(result, self._tc.replace_filters, job.iface,
                                                      plan.filters, not job.qos) is not None:
            result.tc.append(f"filters for DSCP marks {plan.filters}")
        result.ifindex = self._tc.ifindex(job.iface)   # None for a device that is gone: no netlink index for it

    @overload
    @staticmethod
    def _tc_call(result: JobResult, method: Callable[[*Args], None], *args: *Args) -> Literal[True] | None: ...

    @overload
    @staticmethod
    def _tc_call(result: JobResult, method: Callable[[*Args], T], *args: *Args) -> T | None: ...

    @staticmethod
    def _tc_call(result: JobResult, method: Callable[[*Args], object], *args: *Args) -> object:
        """The call's value (True for one that returns nothing), or None with the error recorded."""
        try:
            value = method(*args)
        except OSError as err:
            result.error = f"{result.job.iface}: tc: {err}"
            return None
        return True if value is None else value
