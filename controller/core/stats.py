"""OpenFlow port and queue counters → per-second rates.

Pure: the caller passes the counters of each stats reply and a monotonic `now`,
so wraps, resets and late or missing replies are tested without a switch. Counters and rates are
named tuples: a 1000-port switch sends thousands a second, and they are built at C speed.
"""
from __future__ import annotations

from typing import Any, NamedTuple

ALL_ONES = 2**64 - 1     # OpenFlow "counter not supported"
_COUNTER_SPAN = 2**64    # OpenFlow counters are 64-bit
_WRAP_FLOOR = 2**63      # a counter that fell from above this wrapped; from below it, it was reset


class PortCounters(NamedTuple):
    """One OFPPortStats entry."""
    rx_bytes: int
    tx_bytes: int
    rx_packets: int
    tx_packets: int
    rx_dropped: int
    tx_dropped: int
    rx_errors: int
    tx_errors: int


class QueueCounters(NamedTuple):
    """One OFPQueueStats entry; OVS reports the HTB class drops as tx_errors."""
    tx_bytes: int
    tx_packets: int
    tx_errors: int


class MeterCounters(NamedTuple):
    """One OFPMeterStats entry: what reached the meter, and what its bands dropped."""
    packets: int
    bytes: int
    dropped_packets: int


class FlowCounters(NamedTuple):
    byte_count: int
    packet_count: int


# Rate fields are in the order of the counters they come from.
class PortRates(NamedTuple):
    """Per second; None where the switch reported the counter as unsupported."""
    rx_bps: float | None
    tx_bps: float | None
    rx_pps: float | None
    tx_pps: float | None
    rx_drops_ps: float | None
    tx_drops_ps: float | None
    rx_errors_ps: float | None
    tx_errors_ps: float | None
    interval: float      # seconds between the two samples


class QueueRates(NamedTuple):
    """Per second; None where the switch reported the counter as unsupported."""
    tx_bps: float | None
    tx_pps: float | None
    tx_errors_ps: float | None
    interval: float      # seconds between the two samples


class FlowRates(NamedTuple):
    bps: float | None
    pps: float | None
    interval: float      # seconds between the two samples


class _Baseline(NamedTuple):
    values: tuple[int, ...]
    at: float


def _scales(counters_type: Any) -> tuple[int, ...]:
    """Each counter's factor to its rate unit (bytes → bits)."""
    return tuple(8 if name.endswith(("_bytes", "byte_count")) else 1 for name in counters_type._fields)


_PORT_SCALES, _QUEUE_SCALES, _FLOW_SCALES = _scales(PortCounters), _scales(QueueCounters), _scales(FlowCounters)


def _rates(old: tuple[int, ...], new: tuple[int, ...], scales: tuple[int, ...],
           interval: float) -> list[float | None] | None:
    """Each counter's increase per second, scaled (None if unsupported), or None if any counter was reset."""
    if old == new:          # an idle port's: most of them, every poll
        return [None if value == ALL_ONES else 0.0 for value in new]
    rates: list[float | None] = []
    for before, after, scale in zip(old, new, scales):
        if before == ALL_ONES or after == ALL_ONES:
            rates.append(None)
        elif after >= before:
            rates.append((after - before) * scale / interval)
        elif before > _WRAP_FLOOR:
            rates.append((after + _COUNTER_SPAN - before) * scale / interval)
        else:
            return None
    return rates


class RateTracker:
    """Keeps the previous sample per key and turns the next one into rates."""

    def __init__(self, max_gap: float = 10.0, min_gap: float = 0.01):
        """Rates over more than `max_gap` s are not given (an average would hide the bursts in it), nor over
        less than `min_gap` s (a slow and a fast poll that meet: a few bytes' difference would be noise);
        such a sample leaves the baseline where it was."""
        self._max_gap, self._min_gap = max_gap, min_gap
        # dp_id → (port_no, queue_id or None for the port itself) or ("flow", cookie) → last sample
        self._baselines: dict[int, dict[tuple[int | str, int | None], _Baseline]] = {}
        self._still: dict[tuple[int, str], float] = {}   # (dp_id, kind) → until when none of them moved (unchanged)

    def port(self, dp_id: int, port_no: int, counters: PortCounters, now: float) -> PortRates | None:
        measured = self._measure(dp_id, (port_no, None), counters, _PORT_SCALES, now, "port")
        return None if measured is None else PortRates._make([*measured[0], measured[1]])

    def queue(self, dp_id: int, port_no: int, queue_id: int, counters: QueueCounters,
              now: float) -> QueueRates | None:
        measured = self._measure(dp_id, (port_no, queue_id), counters, _QUEUE_SCALES, now)
        return None if measured is None else QueueRates._make([*measured[0], measured[1]])

    def flow(self, dp_id: int, cookie: int, counters: FlowCounters, now: float) -> FlowRates | None:
        measured = self._measure(dp_id, ("flow", cookie), counters, _FLOW_SCALES, now, "flow")
        return None if measured is None else FlowRates._make([*measured[0], measured[1]])

    def meter(self, dp_id: int, meter: int, counters: MeterCounters, now: float) -> FlowRates | None:
        """What entered a meter, as bit/s and packets/s."""
        measured = self._measure(dp_id, ("meter", meter), FlowCounters(counters.bytes, counters.packets),
                                 _FLOW_SCALES, now)
        return None if measured is None else FlowRates._make([*measured[0], measured[1]])

    def still(self, dp_id: int, kind: str, now: float) -> None:
        """The counters of every `kind` ("flow", "port") known and not measured at `now` did not move up to it
        (they were read unchanged, or nothing came in to match them): each next rate is over the time since
        `now`, as if read then. A queue's or meter's are left: its first rate after an idle spell is an average
        over it, which no decision reads alone (a port busy again is fast polled, over 50 ms)."""
        self._still[(dp_id, kind)] = now

    def unchanged(self, dp_id: int, kind: str, now: float) -> list[int]:
        """As `still`, for counters that were not read: their keys are returned (each rate was 0)."""
        self.still(dp_id, kind, now)
        return [int(number) for key, number in self._baselines.get(dp_id, {}) if key == kind and number is not None]

    def _measure(self, dp_id: int, key: tuple[int | str, int | None], values: tuple[int, ...],
                 scales: tuple[int, ...], now: float, kind: str = "") -> tuple[list[float | None], float] | None:
        """Rates since the baseline (or since its kind was last known unchanged) and the interval, then `values`
        becomes the baseline."""
        baselines = self._baselines.setdefault(dp_id, {})
        previous = baselines.get(key)
        if previous is not None and now - previous.at < self._min_gap:
            return None  # a duplicate, a late reply, or too soon after the last: keep the baseline held
        baselines[key] = _Baseline(values, now)
        if previous is None:
            return None
        interval = now - max(previous.at, self._still.get((dp_id, kind), previous.at)) if kind else now - previous.at
        if interval > self._max_gap:
            return None  # an average over a long gap would hide the bursts in it
        rates = _rates(previous.values, values, scales, interval)
        if rates is None:
            return None  # switch restarted or port re-created: start again from this sample
        return rates, interval


class Multipart:
    """Replies split over several OpenFlow messages (OFPMPF_REPLY_MORE), joined before anything reads
    them: at 1000 ports a switch's port and queue statistics no longer fit one message, and acting on
    each part would see most ports missing. Parts of one reply share the request's xid."""

    def __init__(self) -> None:
        self._parts: dict[tuple[int, str, int], list[Any]] = {}

    def add(self, dp_id: int, kind: str, xid: int, body: list[Any], more: bool) -> list[Any] | None:
        """The whole body once the last part has arrived, else None."""
        key = (dp_id, kind, xid)
        self._parts.setdefault(key, []).extend(body)
        return None if more else self._parts.pop(key)

    def forget(self, dp_id: int) -> None:
        """The switch went away: its unfinished replies never will."""
        for key in [k for k in self._parts if k[0] == dp_id]:
            del self._parts[key]
