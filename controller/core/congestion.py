"""Per-second port rates → decisions to program or roll back congestion handling.

A sample is *hot* when the port is nearly full (tx / capacity ≥ `utilisation`)
and either losing packets (drops / (sent + dropped) ≥ `loss_ratio`) or showing
contention between traffic classes: an active class getting less than its
reservation while another takes more than its own. Contention catches what loss
misses: a rate-based TCP (BBR) squeezed by UDP yields bandwidth without losing
packets, yet it is short of what the reservation would give it. Loss counts
only while traffic classes compete (`competing`): a lone flow's own loss, as in
TCP slow start, is nothing a reservation could fix.
Utilisation alone is not enough: a single elastic TCP flow fills a link to
~100 % while its congestion control keeps loss near zero. That is the link
doing its job, not the congestion to answer. With `loss_ratio` 0 utilisation
alone decides, both to declare congestion and to clear it.

Hysteresis keeps a flood from flapping: congestion begins after `samples`
consecutive hot samples and clears only after `hold_seconds` of continuous
calm. One sample is enough when it shows an overload: two classes or more offer
OVERLOAD times the port's capacity (their rates are counted before the queue,
so a flood shows in the first poll after its onset, before the queue has even
filled, let alone dropped): a queue-fill time sooner than two samples. A hot
sample is never calm, so a steady input, whatever the thresholds, causes at
most one transition.

Pure: time is injected as `now`, as in Faucet's valve.py.
"""
from __future__ import annotations

from dataclasses import dataclass

PROGRAM = "program"     # congestion began
ROLLBACK = "rollback"   # congestion cleared
# Offered at this multiple of the port's capacity, by two classes or more, a full port decides in one sample: a
# lone flow offers about the capacity (it adapts to it), a few packets of a blip add little over a fast poll.
OVERLOAD = 1.2


@dataclass(frozen=True)
class CongestionConfig:
    utilisation: float = 0.9         # tx rate / capacity at or above which a sample can be hot
    loss_ratio: float = 0.01         # loss at or above which a sample can be hot; 0: utilisation decides
    samples: int = 2                 # consecutive hot samples to declare congestion
    clear_utilisation: float = 0.5   # a sample is calm if utilisation is below this...
    clear_loss_ratio: float = 0.001  # ...or loss is below this
    hold_seconds: float = 3.0        # calm for this long (continuously) before congestion clears
    shortfall: float = 0.1           # a class below (1 - shortfall) of its reservation is short of it

    def is_hot(self, sample: PortSample) -> bool:
        lossy = sample.competing and sample.loss_ratio >= self.loss_ratio
        return sample.utilisation >= self.utilisation and (lossy or sample.contention is not None)

    def is_overloaded(self, sample: PortSample) -> bool:
        return (sample.utilisation >= self.utilisation and not sample.alone
                and sample.offered_bps >= OVERLOAD * sample.capacity_bps)

    def is_calm(self, sample: PortSample) -> bool:
        """Calm: little traffic, little loss, or no classes competing (a lone flow's own loss, once the
        flood has gone, is nothing the reservation is for)."""
        low_loss = self.loss_ratio > 0 and sample.loss_ratio < self.clear_loss_ratio
        quiet = sample.utilisation < self.clear_utilisation or low_loss or sample.alone
        return quiet and not self.is_hot(sample)


@dataclass(frozen=True)
class PortSample:
    """What the detector needs from one poll of one port."""
    tx_bps: float
    tx_pps: float
    drops_ps: float      # queue drops + port tx drops per second
    capacity_bps: float
    contention: str | None = None   # which class is short of its reservation, and who takes it
    competing: bool = True          # two or more classes active (lately), or the port has no classes
    alone: bool = False             # fewer than two classes active now
    offered_bps: float = 0.0        # what its classes offer, counted before the queue

    def __post_init__(self) -> None:
        if self.capacity_bps <= 0:
            raise ValueError(f"capacity_bps must be positive, got {self.capacity_bps}")

    @property
    def utilisation(self) -> float:
        return self.tx_bps / self.capacity_bps

    @property
    def loss_ratio(self) -> float:
        offered = self.tx_pps + self.drops_ps
        return self.drops_ps / offered if offered else 0.0


@dataclass(frozen=True)
class Decision:
    action: str          # PROGRAM or ROLLBACK
    at: float            # the injected time of the sample that decided it
    utilisation: float   # of that sample
    loss_ratio: float    # of that sample
    reason: str          # one human line with those numbers


_BITRATE_UNITS = (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3), ("bit/s", 1))


def bitrate(bps: float) -> str:
    unit, scale = next(((u, s) for u, s in _BITRATE_UNITS if bps >= s), _BITRATE_UNITS[-1])
    return f"{bps / scale:.2f}".rstrip("0").rstrip(".") + f" {unit}"


def _load(sample: PortSample) -> str:
    return (f"tx {bitrate(sample.tx_bps)} = {sample.utilisation:.1%} of {bitrate(sample.capacity_bps)}, "
            f"loss {sample.loss_ratio:.1%}" + (f", {sample.contention}" if sample.contention else ""))


class PortCongestion:
    """Hysteresis state machine for one port."""

    def __init__(self, config: CongestionConfig):
        self._config = config
        self._congested = False
        self._hot_streak = 0                   # consecutive hot samples while not congested
        self._calm_since: float | None = None  # first sample of the current calm run while congested

    @property
    def congested(self) -> bool:
        return self._congested

    @property
    def resting(self) -> bool:
        """Not congested and no hot sample in a row: a sample that is not hot changes nothing."""
        return not self._congested and self._hot_streak == 0

    def reset(self) -> None:
        """Not congested, as if it had never been: what made it so was answered another way."""
        self._congested, self._hot_streak, self._calm_since = False, 0, None

    def adopt(self) -> None:
        """The port was found with its reservation in force (a controller before this one decided so):
        congested until it has been calm for the hold time, as if this detector had decided it."""
        self._congested, self._hot_streak, self._calm_since = True, 0, None

    def observe(self, sample: PortSample, now: float) -> Decision | None:
        config = self._config
        utilisation, loss_ratio = sample.utilisation, sample.loss_ratio
        if not self._congested:
            overloaded = config.is_overloaded(sample)
            self._hot_streak = self._hot_streak + 1 if config.is_hot(sample) else 0
            if self._hot_streak < config.samples and not overloaded:
                return None
            self._congested, self._hot_streak = True, 0
            trigger = "contention" if loss_ratio < config.loss_ratio else f"loss ≥ {config.loss_ratio:.1%}"
            reason = (f"{_load(sample)}; classes offer {bitrate(sample.offered_bps)} = "
                      f"{sample.offered_bps / sample.capacity_bps:.0%} of it: overload" if overloaded
                      else f"{_load(sample)}; {trigger} for {config.samples} samples")
            return Decision(PROGRAM, now, utilisation, loss_ratio, reason)
        if not config.is_calm(sample):
            self._calm_since = None
            return None
        if self._calm_since is None:
            self._calm_since = now
        calm_for = now - self._calm_since
        if calm_for < config.hold_seconds:
            return None
        self._congested, self._calm_since = False, None
        reason = f"{_load(sample)}, calm for {calm_for:g} s ≥ {config.hold_seconds:g} s"
        return Decision(ROLLBACK, now, utilisation, loss_ratio, reason)
