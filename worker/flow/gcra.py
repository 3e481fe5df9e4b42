"""Rate limits as GCRA (generic cell rate algorithm): pure arithmetic on one number per key, no clocks, no I/O.

A key's state is its *theoretical arrival time* ``tat_ms``: the earliest moment its next start may happen. Starts
are spaced one ``interval_ms`` apart (to the microsecond; no burst), so at most ``count`` starts fall in any window of
``period_s``;
the interval carries a margin of :data:`SPACING_MARGIN` of itself, slack for the delay between a start's slot and
its handler's first line (event loop, thread hand-off) and for clock skew between workers.

A start is *reserved*: a worker may take the slot at ``tat_ms`` when it lies within ``horizon_ms`` of now, then
waits for it while holding the message (the heartbeat keeps it invisible). Further ahead the key is saturated and
the message is held back. Taking a slot is one conditional write (``worker.flow.store``), in one of two forms:

- ``IDLE`` (the key's slot is now or past): ``tat := now + interval`` if ``tat <= now`` (or no item);
- ``QUEUE`` (the slot is ahead, within the horizon): ``tat := tat + interval`` if ``now < tat <= now + horizon``.
  An atomic increment: concurrent workers each get their own slot, none is lost.

A refused write returns the item as it was, and :func:`plan` is asked again with it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

#: Starts are spaced this share of an interval wider than ``period / count`` (slack for scheduling jitter).
SPACING_MARGIN = 0.02
#: The reservation horizon: a start may be reserved this far ahead, at least MIN and at most MAX, else 2 intervals.
MIN_HORIZON_MS = 1_000
MAX_HORIZON_MS = 5_000

_UNITS_S = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hour": 3600, "d": 86_400, "day": 86_400}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*(?:\.\d+)?)\s*([a-z]+)\s*$")


@dataclass(frozen=True)
class Rate:
    """At most ``count`` starts per ``period_s`` seconds."""

    count: int
    period_s: float

    @property
    def interval_ms(self) -> float:
        """The spacing of starts, margin included, in milliseconds to the microsecond (``"1000/s"``: 1.02 ms)."""
        return max(0.001, round(self.period_s * 1000 / self.count * (1 + SPACING_MARGIN), 3))

    @property
    def horizon_ms(self) -> float:
        """How far ahead a start may be reserved (the worker waits for it holding the message)."""
        return min(MAX_HORIZON_MS, max(MIN_HORIZON_MS, 2 * self.interval_ms))

    def __str__(self) -> str:
        return f"{self.count}/{self.period_s:g}s"


def parse_rate(text: str) -> Rate:
    """``"100/m"``, ``"10/s"``, ``"1000/h"``, ``"5/d"``, ``"30/10s"``, ``"2/1.5min"``: count / [number] unit.

    Units: s, sec, m, min, h, hour, d, day. Raises ValueError with the accepted forms.
    """
    match = _RATE.match(text.lower()) if isinstance(text, str) else None
    if match is not None and text.rstrip().endswith("M"):
        raise ValueError(f"rate_limit {text!r}: 'M' could mean minutes or months; write 'm' (or 'min') for minutes")
    if match is None or match.group(3) not in _UNITS_S:
        raise ValueError(f"rate_limit {text!r}: expected COUNT/UNIT or COUNT/NUMBER UNIT, e.g. '100/m', '30/10s'")
    count = int(match.group(1))
    period_s = float(match.group(2) or 1) * _UNITS_S[match.group(3)]
    if count < 1 or period_s <= 0:
        raise ValueError(f"rate_limit {text!r}: count and period must be positive")
    return Rate(count=count, period_s=period_s)


class Form(StrEnum):
    """Which conditional write takes the next slot."""

    IDLE = "idle"  # tat := now + interval, if tat <= now (or no item)
    QUEUE = "queue"  # tat := tat + interval, if now < tat <= now + horizon
    SATURATED = "saturated"  # no write: the next slot is beyond the horizon


@dataclass(frozen=True)
class Plan:
    """What to try for a start at ``now_ms`` given the key's last known ``tat_ms`` (None: no item)."""

    form: Form
    now_ms: float
    interval_ms: float
    latest_ms: float  # QUEUE's condition: tat <= latest_ms (now + horizon)
    free_at_ms: float  # SATURATED: when a slot becomes reservable again (tat - horizon)


def plan(*, tat_ms: float | None, now_ms: float, rate: Rate) -> Plan:
    """The write that takes the next slot for a start at ``now_ms`` (pure)."""
    interval_ms, horizon_ms = rate.interval_ms, rate.horizon_ms
    latest_ms = now_ms + horizon_ms
    if tat_ms is None or tat_ms <= now_ms:
        return Plan(Form.IDLE, now_ms, interval_ms, latest_ms, now_ms)
    if tat_ms <= latest_ms:
        return Plan(Form.QUEUE, now_ms, interval_ms, latest_ms, now_ms)
    return Plan(Form.SATURATED, now_ms, interval_ms, latest_ms, tat_ms - horizon_ms)


def apply(plan_: Plan, tat_ms: float | None) -> float | None:
    """The new ``tat_ms`` when ``plan_``'s write succeeds on an item holding ``tat_ms``, else None (its condition
    fails). What DynamoDB's condition and update expression compute, as one pure function (the in-memory store
    and the tests use it)."""
    if plan_.form is Form.IDLE:
        if tat_ms is None or tat_ms <= plan_.now_ms:
            return plan_.now_ms + plan_.interval_ms
        return None
    if plan_.form is Form.QUEUE:
        if tat_ms is not None and plan_.now_ms < tat_ms <= plan_.latest_ms:
            return tat_ms + plan_.interval_ms
        return None
    return None


def start_of(new_tat_ms: float, interval_ms: float) -> float:
    """The slot a successful write took: the interval before the new ``tat``."""
    return new_tat_ms - interval_ms


@dataclass
class Backlog:
    """One worker's view of a saturated key: until when no slot can be reserved (``free_at_ms``, learnt from the
    last write's answer) and the turns it handed to the messages it held back (``next_turn_ms``). Held-back
    messages get turns one interval apart after ``free_at_ms``, so they come back about as fast as the key can
    start them (times the number of workers), not all at once."""

    free_at_ms: float = 0
    next_turn_ms: float = 0

    def blocked(self, now_ms: float) -> bool:
        return now_ms < self.free_at_ms

    def learn(self, *, free_at_ms: float) -> None:
        self.free_at_ms = max(self.free_at_ms, free_at_ms)

    def hold_back_ms(self, *, now_ms: float, interval_ms: float) -> float:
        """How long the next held-back message waits (its turn), and reserve the turn after it."""
        turn_ms = max(self.next_turn_ms, self.free_at_ms, now_ms)
        self.next_turn_ms = turn_ms + interval_ms
        return turn_ms - now_ms
