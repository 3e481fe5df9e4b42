"""Circuit breakers: the ``Breaker`` option of ``@job`` and its state transitions, pure (values in, states out).

States of one key (for example a downstream host)::

    CLOSED --N counted failures within window_s--> OPEN --cooldown_s passed, one job takes the probe--> HALF_OPEN
    HALF_OPEN --the probe succeeds--> CLOSED          HALF_OPEN --the probe fails--> OPEN (a new cool-down)

A counted failure is one the job would retry, or its last attempt (dead-lettered as ``exhausted``): the downstream
may be at fault. A permanent error, a bug or bad input says nothing about the downstream and is not counted.
Failures are counted in windows of ``window_s`` starting at the first failure of a window. While OPEN, and while a
live probe runs in HALF_OPEN, the key's jobs are held back unrun. The probe is owned by one job (``owner``) under
a lease (its ``timeout_s`` and a margin): a probe whose worker died lapses and another job takes it.
Each transition is written with a version check (``worker.flow.store``), so concurrent workers never both win.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from worker.errors import ConfigError

#: A probe's lease beyond its job's ``timeout_s``.
PROBE_MARGIN_MS = 5_000


class State(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True)
class Breaker:
    """``@job(..., breaker=Breaker(key=lambda p: host(p["url"]), failures=5, window_s=60, cooldown_s=30))``.

    ``key`` gets the payload (as the handler does) and names the downstream; without it, the job type.
    """

    key: Callable[[Any], str] | None = None
    failures: int = 5
    window_s: float = 60.0
    cooldown_s: float = 30.0

    def __post_init__(self) -> None:
        if isinstance(self.failures, bool) or not isinstance(self.failures, int) or self.failures < 1:
            raise ConfigError("Breaker: failures must be a whole number >= 1")
        if not all(math.isfinite(value) and value > 0 for value in (self.window_s, self.cooldown_s)):
            raise ConfigError("Breaker: window_s and cooldown_s must be finite numbers > 0")


@dataclass(frozen=True)
class Record:
    """A key's breaker as stored. ``version`` grows by one with each write (the condition of the next)."""

    state: State = State.CLOSED
    failures: int = 0
    window_start_ms: int = 0
    open_until_ms: int = 0
    probe_owner: str | None = None
    probe_until_ms: int = 0
    changed_at_ms: int = 0
    version: int = 0


class Verdict(StrEnum):
    RUN = "run"
    HOLD = "hold"
    PROBE = "probe"


@dataclass(frozen=True)
class Admission:
    verdict: Verdict
    until_ms: int = 0  # HOLD: until when


def admit(record: Record, *, now_ms: int, cooldown_s: float) -> Admission:
    """Whether a job of this key may run now: RUN (closed), HOLD until a time, or PROBE (it may take the probe)."""
    if record.state is State.CLOSED:
        return Admission(Verdict.RUN)
    if record.state is State.OPEN:
        if now_ms < record.open_until_ms:
            return Admission(Verdict.HOLD, record.open_until_ms)
        return Admission(Verdict.PROBE)
    if record.probe_owner is not None and now_ms < record.probe_until_ms:
        return Admission(Verdict.HOLD, min(record.probe_until_ms, now_ms + int(cooldown_s * 1000)))
    return Admission(Verdict.PROBE)


def take_probe(record: Record, *, now_ms: int, owner: str, lease_ms: int) -> Record:
    """HALF_OPEN with ``owner`` running the one probe (only when ``admit`` said PROBE)."""
    return _next(
        record,
        now_ms,
        state=State.HALF_OPEN,
        probe_owner=owner,
        probe_until_ms=now_ms + lease_ms,
        changed_at_ms=now_ms if record.state is not State.HALF_OPEN else record.changed_at_ms,
    )


def on_failure(record: Record, *, now_ms: int, owner: str, breaker: Breaker) -> Record:
    """After a counted failure of ``owner``'s job. Unchanged (the same object) when nothing changes."""
    if record.state is State.HALF_OPEN:
        if record.probe_owner == owner:  # the probe failed: open again
            return _opened(record, now_ms, breaker)
        return record
    if record.state is State.OPEN:
        return record  # a job that started before the breaker opened
    if record.failures == 0 or now_ms - record.window_start_ms >= breaker.window_s * 1000:
        failures, window_start_ms = 1, now_ms
    else:
        failures, window_start_ms = record.failures + 1, record.window_start_ms
    if failures >= breaker.failures:
        return _opened(record, now_ms, breaker)
    return _next(record, now_ms, failures=failures, window_start_ms=window_start_ms)


def on_success(record: Record, *, now_ms: int, owner: str) -> Record:
    """After ``owner``'s job succeeded: the probe's success closes the breaker; any other success changes nothing."""
    if record.state is State.HALF_OPEN and record.probe_owner == owner:
        return _next(
            record,
            now_ms,
            state=State.CLOSED,
            failures=0,
            window_start_ms=0,
            open_until_ms=0,
            probe_owner=None,
            probe_until_ms=0,
            changed_at_ms=now_ms,
        )
    return record


def on_inconclusive(record: Record, *, now_ms: int, owner: str) -> Record:
    """The probe ended in a failure that says nothing of the downstream (permanent, bug): another job probes."""
    if record.state is State.HALF_OPEN and record.probe_owner == owner:
        return _next(record, now_ms, probe_owner=None, probe_until_ms=0)
    return record


def _opened(record: Record, now_ms: int, breaker: Breaker) -> Record:
    return _next(
        record,
        now_ms,
        state=State.OPEN,
        failures=0,
        window_start_ms=0,
        open_until_ms=now_ms + int(breaker.cooldown_s * 1000),
        probe_owner=None,
        probe_until_ms=0,
        changed_at_ms=now_ms,
    )


def _next(record: Record, now_ms: int, **changes: Any) -> Record:
    del now_ms
    return replace(record, version=record.version + 1, **changes)
