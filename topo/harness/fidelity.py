"""The fidelity monitor: does a measurement show the policy, or the emulator's limits?

After Mininet-HiFi's idea: a run says when the emulator, not the policy, decided the outcome.
While traffic runs, a thread samples the bottleneck port every 0.25 s: its HTB class counters
(a netlink dump: no GETs, which the kernel would announce to the controller's tc watcher), the CPU
time ovs-vswitchd spent waiting to run (/proc/PID/task/*/schedstat: it forwards every packet of the
userspace datapath) and the host's CPU pressure (/proc/pressure/cpu). The kind of each class's
queue is read when the sampling starts and when it ends. `assess` then judges a window of those samples
(pure), with these signals:

- lost outside the queue: TCP retransmitted more than twice what its queue dropped (plus 10, plus
  what a loss configured on the path, netem's, drops of the packets sent): its packets died
  somewhere the policy does not act (the batch losses controller/core/queues.py explains, a socket
  overflow). The drops are counted from a second before the window to half a second after it:
  retransmits are read from the sender's half-second intervals, so those of drops just before a
  window spill into it (auto's FIFO, dropping until the controller programs the queues, right
  before a step's window opens), and the interval that overlaps the window's end brings in part of
  the retransmits of drops just after it (TCP's own class, which overflows as TCP takes the rate a
  finished UDP step left, in the gap before the next).
- stalled: TCP got under 5 % of the bottleneck for a second or more while its queue dropped
  nothing and the path is set to lose nothing, so no loss explains the stall (a retransmission
  timeout).
- idle bottleneck: the port carried under 85 % of its capacity while dropping under 1 % of its
  packets: the queue was not full, yet the senders, who always have data, did not fill it. Not
  judged when the queue is shorter than the path's bandwidth-delay product, or when the path is set
  to lose packets (netem): then a loss-based TCP leaves the link idle after each loss by design
  (the studied mechanism, not the emulator).
- receiver silent: the iperf3 receiver reported nothing for over a second.
- datapath starved: ovs-vswitchd waited for a CPU more than 25 % of the window.
A step is faithful when none fires. The latency probe is judged apart (probe_lost_outside): an echo
lost on the way back, or more packets lost on the way out than its queue (its class, or the default
one) dropped, makes the probe's figures unfaithful, not TCP's. The thresholds hold on a quiet 2-core
host (none fired in its runs) and each signal fired in a run built to trigger it.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from controller.adapters.tc import ClassCounters, Tc
from controller.core.plan import HTB_PARENT, htb_classid
from topo.net.iperf import REPORT_SECONDS, Interval, longest_gap

SAMPLE_SECONDS = 0.25
FINE_SECONDS = 0.01
LOST_FACTOR, LOST_SLACK = 2.0, 10
LOSS_LEAD_SECONDS = 1.0      # a sender interval (0.5 s) and the 200 ms minimum RTO, with room
LOSS_TRAIL_SECONDS = REPORT_SECONDS   # a sender interval that overlaps the window's end counts in part
STALL_SHARE, STALL_SECONDS = 0.05, 1.0
IDLE_UTILISATION, IDLE_LOSS = 0.85, 0.01
GAP_SECONDS = 1.0
WAIT_RATIO = 0.25


@dataclass(frozen=True)
class Sample:
    t: float                               # launcher wall clock
    classes: dict[str, ClassCounters]      # HTB class → counters, of the watched port
    datapath_wait_ns: int | None           # ovs-vswitchd's run-queue delay so far, all threads
    cpu_pressure_us: int | None            # /proc/pressure/cpu "some" total so far


@dataclass(frozen=True)
class Received:
    """A TCP flow's receiver intervals, with the launcher time its test started."""
    intervals: list[Interval]
    offset: float


@dataclass
class Monitor:
    """Samples `iface` every SAMPLE_SECONDS while in a `with` block; with `fine`, also each class's byte
    counter every FINE_SECONDS (`arrivals`): when packets begin to land in a class, to a hundredth of a
    second, is the switch's own evidence that steering into it took effect."""
    iface: str
    fine: bool = False
    samples: list[Sample] = field(default_factory=list)
    arrivals: list[tuple[float, dict[str, int]]] = field(default_factory=list)   # (wall clock, class → bytes)
    queues: dict[str, set[str]] = field(default_factory=dict)   # HTB class → the kinds of queue seen under it
    # HTB class → what its queue itself dropped over the block. An AQM drops at dequeue (CoDel), which
    # the class's own counter does not see.
    leaf_drops: dict[str, int] = field(default_factory=dict)

    def __enter__(self) -> Monitor:
        self._tc = Tc()
        self._pids = _pids("ovs-vswitchd")
        self._first = self._look_at_queues()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, daemon=True)]
        if self.fine:
            self._threads.append(threading.Thread(target=self._run_fine, daemon=True))
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        last = self._look_at_queues()
        self._tc.close()
        self.leaf_drops = {cls: leaf.drops - self._first[cls].drops for cls, leaf in last.items()
                           if cls in self._first and self._first[cls].kind == leaf.kind}

    def _look_at_queues(self) -> dict:
        try:
            leaves = self._tc.leaves(self.iface)
        except OSError:
            return {}
        for cls, leaf in leaves.items():
            self.queues.setdefault(cls, set()).add(leaf.kind)
        return leaves

    def _run(self) -> None:
        while True:
            try:
                classes = self._tc.classes(self.iface)
            except OSError:   # the port is not there yet, or no longer
                classes = {}
            self.samples.append(Sample(time.time(), classes, _run_delay(self._pids), _cpu_pressure()))
            if self._stop.wait(SAMPLE_SECONDS):
                return

    def _run_fine(self) -> None:
        tc = Tc()    # a netlink socket of its own: the other thread's must not be shared
        try:
            while not self._stop.wait(FINE_SECONDS):
                try:
                    classes = tc.classes(self.iface)
                except OSError:
                    continue
                self.arrivals.append((time.time(), {cls: c.bytes for cls, c in classes.items()}))
        finally:
            tc.close()


def assess(samples: list[Sample], start: float, end: float, capacity_bps: float, tcp_class: str | None,
           tcp_retransmits: int | None, received: list[Received], bdp_exceeds_queue: bool = False,
           path_loss: float = 0.0, queue_drops_at_least: int = 0) -> dict:
    """Judge [start, end] (launcher time): {"faithful", "fidelity_notes", "fidelity": the numbers}.
    `tcp_class` is the HTB class TCP is steered to while queues reserve, if the policy has one;
    `bdp_exceeds_queue`: the path's bandwidth-delay product is more than its queue holds;
    `path_loss`: the share of packets the path is set to lose (netem), as a fraction;
    `queue_drops_at_least`: what the queues themselves dropped (Monitor.leaf_drops), when no tcp_class."""
    inside = [s for s in samples if start <= s.t <= end]
    numbers: dict[str, float | int | None] = {"samples": len(inside)}
    notes: list[str] = []
    if len(inside) >= 2:
        first, last = inside[0], inside[-1]
        span = last.t - first.t
        drops, packets, tcp_drops, sent_bytes = _queue_deltas(inside, tcp_class)
        if tcp_class is None:
            drops = tcp_drops = max(drops, queue_drops_at_least)
        utilisation = sent_bytes * 8 / span / capacity_bps
        numbers.update(bottleneck_utilisation=round(utilisation, 3), queue_drops=drops, tcp_queue_drops=tcp_drops,
                       datapath_wait_ratio=_ratio(first.datapath_wait_ns, last.datapath_wait_ns, 1e9 * span),
                       cpu_pressure_ratio=_ratio(first.cpu_pressure_us, last.cpu_pressure_us, 1e6 * span))
        tcp_may_idle = bdp_exceeds_queue or path_loss > 0
        if utilisation < IDLE_UTILISATION and drops < IDLE_LOSS * max(packets + drops, 1) and not tcp_may_idle:
            notes.append(f"the bottleneck carried {utilisation:.0%} of its capacity while dropping "
                         f"{drops} packets: the senders did not fill an unsaturated queue (emulator too slow)")
        led_drops, _, led_tcp_drops, _ = _queue_deltas(
            [s for s in samples if start - LOSS_LEAD_SECONDS <= s.t <= end + LOSS_TRAIL_SECONDS], tcp_class)
        causes = max(led_drops, queue_drops_at_least) if tcp_class is None else led_tcp_drops
        if tcp_retransmits is not None and tcp_retransmits > LOST_FACTOR * (causes + path_loss * packets) + LOST_SLACK:
            notes.append(f"TCP retransmitted {tcp_retransmits} segments while its queue dropped {causes}: "
                         "packets were lost outside the queue the policy controls")
        wait = numbers["datapath_wait_ratio"]
        if wait is not None and wait > WAIT_RATIO:
            notes.append(f"ovs-vswitchd waited for a CPU {wait:.0%} of the time: the datapath was starved")
        stall = _longest_stall(inside, received, start, end, STALL_SHARE * capacity_bps, tcp_class)
        if stall >= STALL_SECONDS and not path_loss:   # a loss set on the path explains a timeout as a drop would
            notes.append(f"TCP stalled for {stall:.2f} s while its queue dropped nothing")
    else:
        notes.append("fewer than two samples of the bottleneck in this window")
    gap = max((longest_gap(r.intervals, r.offset, start, end) for r in received), default=0.0)
    numbers["receiver_gap_seconds"] = round(gap, 3)
    numbers["tcp_retransmits"] = tcp_retransmits
    if gap > GAP_SECONDS:
        notes.append(f"the receiver reported nothing for {gap:.2f} s")
    return {"faithful": not notes, "fidelity_notes": notes, "fidelity": numbers}


def _queue_deltas(samples: list[Sample], tcp_class: str | None) -> tuple[int, int, int, int]:
    """(drops, packets sent, TCP's drops, bytes sent) over the samples; a class that appeared or went
    counts from when it is in two consecutive samples. TCP's drops are its class's while that class
    carries bytes (steered), else every class's (an auto port's classes are there while nothing is
    steered into them)."""
    drops = packets = tcp_drops = sent = 0
    for a, b in zip(samples, samples[1:]):
        common = {c for c in a.classes.keys() & b.classes.keys() if c != HTB_PARENT}   # the children only
        d = {c: b.classes[c].drops - a.classes[c].drops for c in common}
        drops += sum(d.values())
        packets += sum(b.classes[c].packets - a.classes[c].packets for c in common)
        sent += sum(b.classes[c].bytes - a.classes[c].bytes for c in common)
        if tcp_class is not None and tcp_class in common and b.classes[tcp_class].bytes > a.classes[tcp_class].bytes:
            tcp_drops += d[tcp_class]       # steered
        else:
            tcp_drops += sum(d.values())
    return drops, packets, tcp_drops, sent


def probe_lost_outside(samples: list[Sample], start: float, end: float, step: dict,
                       voice_class: str | None) -> list[str]:
    """Notes on the latency probe's packets lost in [start, end] where the policy does not act, the
    emulator's doing: echoes lost on the way back, which crosses no queue the step measures, and packets
    lost on the way out beyond what their queue dropped (from a second before the window, as for TCP).
    Its queue is its own class while that class carries bytes, else the default one. They judge the
    probe's figures only: TCP's are judged by TCP's own counters."""
    lost = round((step.get("probe_loss_percent") or 0) * (step.get("probe_packets") or 0) / 100)
    back = step.get("probe_lost_back") or 0
    notes = [f"probe: {back} echoes lost on the way back, where no queue of the step is"] if back else []
    out = lost - back
    inside = [s for s in samples if start - LOSS_LEAD_SECONDS <= s.t <= end]
    if not out or len(inside) < 2:
        return notes
    first, last = inside[0].classes, inside[-1].classes
    steered = voice_class in first and voice_class in last and last[voice_class].bytes > first[voice_class].bytes
    queue = voice_class if steered else htb_classid(0)   # the default queue
    dropped = last[queue].drops - first[queue].drops if queue in first and queue in last else 0
    if out > dropped:
        notes.append(f"probe: {out} packets lost on the way out, their queue ({queue}) dropped {dropped}: "
                     "lost outside the queues")
    return notes


def _longest_stall(samples: list[Sample], received: list[Received], start: float, end: float,
                   floor_bps: float, tcp_class: str | None) -> float:
    longest = 0.0
    for flow in received:
        run_start = None
        for i in flow.intervals:
            lo, hi = i.start + flow.offset, i.end + flow.offset
            if hi <= start or lo >= end:
                continue
            if i.bps < floor_bps:
                run_start = lo if run_start is None else run_start
                if _drops_between(samples, run_start, hi, tcp_class) == 0:
                    longest = max(longest, hi - run_start)
            else:
                run_start = None
    return longest


def _drops_between(samples: list[Sample], lo: float, hi: float, tcp_class: str | None) -> int:
    around = [s for s in samples if lo - SAMPLE_SECONDS <= s.t <= hi + SAMPLE_SECONDS]
    return _queue_deltas(around, tcp_class)[2] if len(around) >= 2 else 1


def _ratio(before: int | None, after: int | None, span: float) -> float | None:
    return None if before is None or after is None or span <= 0 else round((after - before) / span, 3)


def _pids(name: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == name:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _run_delay(pids: list[int]) -> int | None:
    """Nanoseconds the processes' threads have waited on a run queue (schedstat's second field)."""
    total, seen = 0, False
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                total += int((task / "schedstat").read_text().split()[1])
                seen = True
            except (OSError, IndexError, ValueError):
                continue
    return total if seen else None


def _cpu_pressure() -> int | None:
    try:
        some = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except OSError:
        return None
    return int(some.rsplit("total=", 1)[1])


def bdp_packets(capacity_bps: float, rtt_seconds: float, frame_bytes: int = 1514) -> float:
    """The path's bandwidth-delay product in full-size frames."""
    return capacity_bps * rtt_seconds / 8 / frame_bytes
