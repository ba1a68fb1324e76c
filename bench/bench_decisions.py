"""Cost of the pure decision path: counters → rates → congestion decisions.

For N ports over S simulated 1 Hz polls it feeds what the app feeds per port and poll:
RateTracker.port, RateTracker.queue for 2 queues, RateTracker.flow for the 2 class flows
(tcp, udp), then SwitchState.observe (class contention + the congestion detector) of a
policy whose N ports are all `auto`, with synthetic counters. Ports
are a mix: a third flooded (1.5 × capacity offered, a third of the packets dropped)
for the first half of the run and idle after it, so both programs and rollbacks
happen; a third idle; a third at a steady 60 % whose counters wrap the 64-bit range
halfway through. Building the counter objects is the reply parser's job and is left
out of the timed part. Peak memory comes from a separate pass under tracemalloc,
whose bookkeeping would otherwise slow the timed pass.

Target: under 5 % of one core for 1000 ports at 1 Hz (under 50 µs per port-sample).

    .venv/bin/python -m bench.bench_decisions [--ports 1000] [--seconds 60]
"""
from __future__ import annotations

import argparse
import time
import tracemalloc
from collections import Counter

from controller.core.congestion import PROGRAM, ROLLBACK, Decision
from controller.core.policy import parse_policy
from controller.core.stats import FlowCounters, PortCounters, QueueCounters, RateTracker
from controller.core.switch_state import SwitchState

DP_ID = 1
CAPACITY_BPS = 10_000_000
PACKET_BYTES = 1250            # 10 kbit: 1000 packets per second fill the port
ACK_BYTES = 64                 # received: one ACK per two packets sent
QUEUE_0_SHARE = 0.7            # the rest goes to queue 1
COUNTER_SPAN = 2**64
Reply = tuple[PortCounters, tuple[QueueCounters, QueueCounters]]


def traffic(port_no: int, poll: int, polls: int) -> tuple[int, int]:
    """(packets sent, packets dropped) by the port in one second."""
    kind = port_no % 3
    if kind == 0:
        return (990, 500) if poll < polls // 2 else (1, 0)
    return (600, 0) if kind == 2 else (1, 0)


def raw_counters(sent: int, dropped: int) -> tuple[int, ...]:
    """Port counters, then (bytes, packets, drops) of queue 0 and queue 1, before any wrap."""
    sent_0, dropped_0 = int(sent * QUEUE_0_SHARE), int(dropped * QUEUE_0_SHARE)
    sent_1, dropped_1 = sent - sent_0, dropped - dropped_0
    acks = sent // 2
    return (acks * ACK_BYTES, sent * PACKET_BYTES, acks, sent, 0, 0, 0, 0,
            sent_0 * PACKET_BYTES, sent_0, dropped_0, sent_1 * PACKET_BYTES, sent_1, dropped_1)


def wrap_offsets(port_no: int, polls: int) -> tuple[int, ...]:
    """Starting points that make every counter of a wrapping port wrap halfway through the run."""
    if port_no % 3 != 2:
        return (0,) * 14
    sent, dropped = traffic(port_no, 0, polls)
    at_half = raw_counters(sent * (polls // 2), dropped * (polls // 2))
    return tuple(COUNTER_SPAN - value if value else 0 for value in at_half)


def reply(raw: tuple[int, ...], offsets: tuple[int, ...]) -> Reply:
    values = [(value + offset) % COUNTER_SPAN for value, offset in zip(raw, offsets)]
    return PortCounters(*values[:8]), (QueueCounters(*values[8:11]), QueueCounters(*values[11:]))


def switch_state(ports: int) -> SwitchState:
    """One switch whose every port is `auto`, with the study's tcp and udp classes."""
    policy = parse_policy({"name": "bench", "classes": {"tcp": {"queue": 1, "min": "80%"},
                                                        "udp": {"queue": 2, "min": "10%"}},
                           "switches": {"s1": {"dp_id": DP_ID, "ports": {
                               p: {"capacity": CAPACITY_BPS, "queues": "auto"} for p in range(1, ports + 1)}}}})
    return SwitchState(policy, policy.switches[0], userspace=True)


def decide(tracker: RateTracker, state: SwitchState, port_no: int, counters: Reply,
           now: float) -> tuple[bool, Decision | None]:
    """The path under test, as the app runs it per port and poll: (detector stepped, decision)."""
    port_counters, queue_counters = counters
    port = tracker.port(DP_ID, port_no, port_counters, now)
    queues = [tracker.queue(DP_ID, port_no, queue_id, c, now) for queue_id, c in enumerate(queue_counters)]
    # The class flows count what the queues carry: tcp in queue 0's share, udp in queue 1's.
    flows = {name: tracker.flow(DP_ID, port_no * 2 + k, FlowCounters(c.tx_bytes, c.tx_packets), now)
             for k, (name, c) in enumerate(zip(("tcp", "udp"), queue_counters))}
    known = [queue for queue in queues if queue is not None]
    if port is None or len(known) < len(queues):
        return False, None
    drops_ps = sum(queue.tx_errors_ps or 0.0 for queue in known)
    class_bps = {name: rates.bps for name, rates in flows.items() if rates is not None and rates.bps is not None}
    return True, state.observe(port_no, port, drops_ps, class_bps, now)


def run(ports: int, polls: int) -> tuple[float, int, Counter[str]]:
    """Seconds spent in `decide`, detector steps, and decisions by action."""
    tracker, state = RateTracker(), switch_state(ports)
    port_nos = range(1, ports + 1)
    offsets = {port_no: wrap_offsets(port_no, polls) for port_no in port_nos}
    totals = {port_no: (0, 0) for port_no in port_nos}   # packets sent, dropped so far
    elapsed, steps = 0.0, 0
    actions: Counter[str] = Counter()
    for poll in range(polls):
        replies = {port_no: reply(raw_counters(*totals[port_no]), offsets[port_no]) for port_no in port_nos}
        start = time.perf_counter()
        for port_no, counters in replies.items():
            stepped, decision = decide(tracker, state, port_no, counters, float(poll))
            steps += stepped
            if decision is not None:
                actions[decision.action] += 1
        elapsed += time.perf_counter() - start
        for port_no in port_nos:
            sent, dropped = traffic(port_no, poll, polls)
            totals[port_no] = (totals[port_no][0] + sent, totals[port_no][1] + dropped)
    return elapsed, steps, actions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ports", type=int, default=1000)
    parser.add_argument("--seconds", type=int, default=60, help="simulated 1 Hz polls")
    args = parser.parse_args()

    elapsed, steps, actions = run(args.ports, args.seconds)
    tracemalloc.start()
    run(args.ports, args.seconds)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()

    port_samples = args.ports * args.seconds
    cost = elapsed / port_samples
    print(f"ports              {args.ports}")
    print(f"polls              {args.seconds} (simulated, 1 Hz)")
    print(f"port-samples       {port_samples} (port + 2 queue + 2 class-flow rates each), "
          f"{steps} reached the detector")
    print(f"decisions          {actions[PROGRAM]} program, {actions[ROLLBACK]} rollback")
    print(f"cost               {cost * 1e6:.2f} µs per port-sample")
    print(f"share of one core  {cost * args.ports * 100:.2f} % for {args.ports} ports at 1 Hz (target < 5 %)")
    print(f"peak memory        {peak / 2**20:.2f} MiB (tracemalloc pass, with one poll of synthetic replies)")


if __name__ == "__main__":
    main()
