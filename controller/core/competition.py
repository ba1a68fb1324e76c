"""Who competes at a port, sample by sample: what the congestion detector (congestion.py) is told besides
the port's own rates.

A class competes while it takes ACTIVE_SHARE of the port or more; one that did within RECENT_SECONDS still
does while the port loses packets (a flood silences a TCP sender within a poll or two, before it is
answered). A class HTB serves first (voice) is too small ever to compete by its rate, yet it shares the
port's one queue with the rest until a reservation is in force: when the port loses `loss_ratio` of its
packets over LOSS_WINDOW_SECONDS while such a class sends behind a busy one, it loses about as much, and
its reservation would help it at no cost to the others (HTB lends them whatever it leaves).

Pure: time is injected as `now`.
"""
from __future__ import annotations

from collections import deque

from controller.core.congestion import PortSample, bitrate
from controller.core.policy import Policy, PortPolicy
from controller.core.stats import PortRates

# Below this share of the port a class is idle, not squeezed: no reservation would help it, and it
# does not compete (a voice call's 80 kbit/s is under 2 % of a 5 Mbit/s port). A class above it within
# the last RECENT_SECONDS still competes.
ACTIVE_SHARE = 0.05
RECENT_SECONDS = 1.0
# One fast poll's drops say little about what a class served first loses: a lone TCP flow's own loss comes
# in bursts (a few packets when it overflows the queue, then none for seconds).
LOSS_WINDOW_SECONDS = 1.0


class Competition:
    """The classes of one switch's ports, as the detector sees them."""

    def __init__(self, policy: Policy, ports: tuple[PortPolicy, ...]):
        self._policy = policy
        self._first = served_first(policy)
        self._seen: dict[int, dict[str, float]] = {p.port_no: {} for p in ports}   # port → class → last active
        # port → (time, interval, packets sent, packets dropped) of each sample in the last LOSS_WINDOW_SECONDS
        self._window: dict[int, deque[tuple[float, float, float, float]]] = {p.port_no: deque() for p in ports}

    def sample(self, port: PortPolicy, rates: PortRates, drops_ps: float, class_bps: dict[str, float],
               now: float) -> PortSample:
        assert rates.tx_bps is not None and rates.tx_pps is not None
        seen = self._seen[port.port_no]
        active = {name for name, bps in class_bps.items() if bps > ACTIVE_SHARE * port.capacity_bps}
        seen.update(dict.fromkeys(active, now))
        lossy = drops_ps >= self._policy.congestion.loss_ratio * (rates.tx_pps + drops_ps) > 0
        recent = {name for name, at in seen.items() if now - at <= RECENT_SECONDS} if lossy else active
        loss = self._window_loss(port.port_no, rates.interval, rates.tx_pps, drops_ps, now)
        contention = class_contention(self._policy, port, class_bps, recent) or \
            self._suffering(class_bps, active, loss)
        return PortSample(rates.tx_bps, rates.tx_pps, drops_ps, port.capacity_bps, contention=contention,
                          offered_bps=sum(class_bps.values()), competing=not class_bps or len(recent) >= 2,
                          alone=bool(class_bps) and len(active) < 2)

    def _window_loss(self, port_no: int, interval: float, tx_pps: float, drops_ps: float, now: float) -> float | None:
        """The share of the port's packets dropped over the last LOSS_WINDOW_SECONDS (None until that long is seen)."""
        window = self._window[port_no]
        window.append((now, interval, tx_pps * interval, drops_ps * interval))
        while window[0][0] <= now - LOSS_WINDOW_SECONDS:
            window.popleft()
        if sum(w[1] for w in window) < 0.99 * LOSS_WINDOW_SECONDS:
            return None
        sent, dropped = sum(w[2] for w in window), sum(w[3] for w in window)
        return dropped / (sent + dropped) if dropped else 0.0

    def _suffering(self, class_bps: dict[str, float], active: set[str], loss: float | None) -> str | None:
        """A class served first sending, however little, behind an active one on a port that loses."""
        first = sorted(name for name in self._first if class_bps.get(name, 0.0) > 0)
        busy = sorted(active - self._first)
        if not first or not busy or loss is None or loss < self._policy.congestion.loss_ratio:
            return None
        return f"class {first[0]} shares a port that lost {loss:.1%} of its packets over {LOSS_WINDOW_SECONDS:g} s " \
               f"behind {busy[0]}"


def served_first(policy: Policy) -> frozenset[str]:
    """The classes HTB serves before every other (the lowest priority number, unless all share it)."""
    first = min((c.priority for c in policy.classes), default=0)
    names = frozenset(c.name for c in policy.classes if c.priority == first)
    return names if len(names) < len(policy.classes) else frozenset()


def class_contention(policy: Policy, port: PortPolicy, class_bps: dict[str, float],
                     recent: set[str] | None = None) -> str | None:
    """Which active class (or one active within RECENT_SECONDS: `recent`) gets less than its reservation
    while another takes more than its own."""
    cap, keep = port.capacity_bps, 1 - policy.congestion.shortfall
    for short in policy.classes:
        rate = class_bps.get(short.name)
        active = rate is not None and rate > ACTIVE_SHARE * cap or short.name in (recent or ())
        if rate is None or not active or rate >= keep * short.min_share * cap:
            continue
        for taker in policy.classes:
            taken = class_bps.get(taker.name, 0.0)
            if taker is not short and taken > taker.min_share * cap:
                return (f"class {short.name} at {bitrate(rate)} < {keep:.0%} of its {bitrate(short.min_share * cap)} "
                        f"while {taker.name} takes {bitrate(taken)}")
    return None
