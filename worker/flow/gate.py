"""The gate a job passes before its handler runs: its circuit breaker, then its rate limit.

``Gate.admit`` answers RUN (maybe after waiting for a reserved start), or HOLD with a delay and a reason (the
runtime releases the message with that visibility delay through ``Outcomes.hold_back``; no handler runs, nothing
fails). ``Gate.report`` tells the breaker how the job ended. Policy lives in ``gcra`` and ``breaker``; the store
(``store``) is the DynamoDB table or this process; this module holds the per-worker caches and the order of steps.

Costs, per key and worker: a breaker is read at most once per ``BREAKER_CACHE_S`` (a job of a key whose breaker
was read less than that ago uses what was read), written on counted failures and on its transitions; a rate limit
writes once per start, plus each try another worker's write beat (1.66 writes per start in all with 3 workers on
a saturated key, benchmarks/rate_limit.py), and not at all for a message held back while this worker knows the key
is saturated.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from worker.flow import breaker as policy
from worker.flow import gcra
from worker.flow.store import FlowStore, MemoryFlowStore
from worker.jobs import JobSpec
from worker.observability.events import Event, Kind

log = logging.getLogger("worker.flow")

#: A new breaker item's first version is drawn below this (DynamoDB numbers are exact to 38 digits).
FIRST_VERSIONS = 2**62
#: A breaker read is reused this long by the jobs of its key on this worker.
BREAKER_CACHE_S = 1.0
#: Conditional writes tried for one slot or one breaker change before giving up (contention).
MAX_WRITES = 4
#: Keys whose slots and breakers a worker remembers (the oldest are forgotten first: memory stays bounded).
MAX_KEYS = 10_000
#: A held message comes back at most this late and asks again: a saturated key's turns may lie months ahead (a
#: monthly limit with a backlog), beyond the year a due time may name.
MAX_HOLD_S = 86_400


class Step(StrEnum):
    RUN = "run"
    HOLD = "hold"


@dataclass
class Ticket:
    """What the gate let through, for the report after the outcome."""

    breaker_key: str | None = None
    breaker: policy.Breaker | None = None
    owner: str = ""
    probe: bool = False


@dataclass(frozen=True)
class Decision:
    step: Step
    delay_s: int = 0
    reason: str = ""
    ticket: Ticket = field(default_factory=Ticket)


@dataclass(frozen=True)
class Change:
    """A breaker's state change, as the gate reports it to its listener (log line and metric)."""

    key: str
    job_type: str
    previous: policy.State
    state: policy.State


class Outcome(StrEnum):
    SUCCEEDED = "succeeded"
    COUNTED = "counted"  # a failure the breaker counts (retryable, exhausted, timeout)
    NOT_COUNTED = "not_counted"  # permanent, bug, bad input


def flow_keys(spec: JobSpec, payload: Any) -> tuple[str | None, str | None]:
    """The job's rate-limit key and breaker key (None: no limit, no breaker); the job type by default. A key
    function that raises, or returns anything but a non-empty str, is the job's bug (its exception, or TypeError)."""
    rate_key = _key(spec, spec.rate_key, payload, "rate_key") if spec.rate is not None else None
    breaker_key = _key(spec, spec.breaker.key, payload, "Breaker key") if spec.breaker is not None else None
    return rate_key, breaker_key


def _key(spec: JobSpec, function: Callable[[Any], str] | None, payload: Any, what: str) -> str:
    if function is None:
        return spec.name
    value = function(payload)
    if not isinstance(value, str) or not value:
        raise TypeError(f"{what} function of job {spec.name!r} must return a non-empty str, got {type(value).__name__}")
    return value


def change_event(change: Change, queue: str) -> Event:
    """A breaker's state change as an event for the observers (log line, metrics); no message is its subject."""
    return Event(
        kind=Kind.BREAKER_CHANGED,
        queue=queue,
        message_id="",
        job_type=change.job_type,
        reason=f"{change.previous.value} -> {change.state.value}",
        extra={"breaker_key": change.key, "previous": change.previous.value, "state": change.state.value},
    )


def _held_reason(key: str, record: policy.Record | None) -> str:
    """Why a job of ``key`` is held back: its breaker is open, or half-open with a probe running (None)."""
    if record is not None and record.state is policy.State.OPEN:
        return f"circuit breaker {key!r} open"
    return f"circuit breaker {key!r} half-open: a probe runs elsewhere"


def _remember(cache: dict[str, Any], key: str, value: Any) -> Any:
    """Store ``value`` under ``key``, forgetting the oldest keys beyond MAX_KEYS; returns ``value``."""
    cache.pop(key, None)
    cache[key] = value
    while len(cache) > MAX_KEYS:
        del cache[next(iter(cache))]
    return value


@dataclass(frozen=True)
class _Known:
    """A key's breaker as this worker last learned it: when, what, and the call number current then (after every
    store call sent before it)."""

    at_s: float
    record: policy.Record | None
    learned: int


def _first_version() -> int:
    """Where a key's new item starts counting versions: at random, so that a record of an item deleted since (by
    ``breakers reset``, or its TTL) never passes the version check of the new one. Counting from 0 each time, a
    worker's cached open record of the old item matched the new item's third write and opened it again."""
    return secrets.randbelow(FIRST_VERSIONS)


def _wall_ms() -> int:
    return int(time.time() * 1000)


class Gate:
    """Admits jobs by their rate limit and breaker; one per worker, its store shared by the fleet or not."""

    def __init__(
        self,
        store: FlowStore | None = None,
        *,
        owner: str = "",
        now_ms: Callable[[], int] = _wall_ms,
        sleep: Callable[[float], Any] = asyncio.sleep,
        on_change: Callable[[Change], None] | None = None,
    ) -> None:
        self.store: FlowStore = store if store is not None else MemoryFlowStore()
        self.owner = owner
        self._now_ms = now_ms
        self._sleep = sleep
        self.on_change = on_change
        self._backlogs: dict[str, gcra.Backlog] = {}
        self._tat_ms: dict[str, float] = {}
        self._breakers: dict[str, _Known] = {}
        self._asked = itertools.count()  # numbers the breaker reads and writes in the order they are sent
        self._locks: dict[str, asyncio.Lock] = {}
        self._change_locks: dict[str, asyncio.Lock] = {}

    @property
    def shared(self) -> bool:
        return self.store.shared

    # ------------------------------------------------------------------------------------------------ admit

    async def admit(
        self,
        *,
        job_type: str,
        rate: gcra.Rate | None,
        rate_key: str | None,
        breaker: policy.Breaker | None,
        breaker_key: str | None,
        message_id: str,
        timeout_s: float,
    ) -> Decision:
        """Breaker first (an open one costs no rate slot), then the rate limit, then the probe's claim."""
        ticket = Ticket(owner=f"{self.owner}:{message_id}")
        probe = False
        if breaker is not None and breaker_key is not None:
            ticket.breaker, ticket.breaker_key = breaker, breaker_key
            record = await self._breaker(breaker_key)
            admission = policy.admit(record or policy.Record(), now_ms=self._now_ms(), cooldown_s=breaker.cooldown_s)
            if admission.verdict is policy.Verdict.HOLD:
                return self._hold(admission.until_ms - self._now_ms(), _held_reason(breaker_key, record))
            probe = admission.verdict is policy.Verdict.PROBE
        if rate is not None and rate_key is not None:
            held = await self._take_slot(rate_key, rate)
            if held is not None:
                return held
        if probe:
            assert breaker is not None
            assert breaker_key is not None
            lease_ms = int(timeout_s * 1000) + policy.PROBE_MARGIN_MS
            try:
                taken = await self._take_probe(breaker_key, job_type, ticket.owner, lease_ms, breaker)
            except BaseException:
                owner = ticket.owner
                self._breakers.pop(breaker_key, None)  # the write may have landed: change the stored record
                give_back = self._change(
                    breaker_key, job_type, lambda r: policy.on_inconclusive(r, now_ms=self._now_ms(), owner=owner)
                )
                with contextlib.suppress(Exception):
                    await asyncio.shield(give_back)
                raise
            if not taken:
                return self._hold(breaker.cooldown_s * 1000, _held_reason(breaker_key, None))
            ticket.probe = True
        return Decision(Step.RUN, ticket=ticket)

    def _hold(self, delay_ms: float, reason: str) -> Decision:
        return Decision(Step.HOLD, delay_s=min(MAX_HOLD_S, max(1, math.ceil(delay_ms / 1000))), reason=reason)

    async def _take_slot(self, key: str, rate: gcra.Rate) -> Decision | None:
        """Reserve a start for ``key`` and wait for it (None), or a HOLD for a saturated key. This worker's tries
        for one key take turns (a lock held for the write, not the wait): messages that come back together would
        otherwise all write with the same stale view of the key, and all but one be refused."""
        lock = self._locks.get(key) or _remember(self._locks, key, asyncio.Lock())
        async with lock:
            reserved = await self._reserve(key, rate)
        if isinstance(reserved, Decision):
            return reserved
        if reserved > 0:
            await self._sleep(reserved / 1000)
        return None

    async def _reserve(self, key: str, rate: gcra.Rate) -> Decision | float:
        """A HOLD, or the milliseconds until the reserved start."""
        backlog = self._backlogs.get(key) or _remember(self._backlogs, key, gcra.Backlog())
        now_ms = self._now_ms()
        if backlog.blocked(now_ms):  # known saturated: no write
            return self._saturated(key, backlog, rate, now_ms)
        tat_ms = self._tat_ms.get(key)
        refused = False
        for _ in range(MAX_WRITES):
            now_ms = self._now_ms()
            plan = gcra.plan(tat_ms=tat_ms, now_ms=now_ms, rate=rate)
            if plan.form is gcra.Form.SATURATED:
                # After a refused try, one more interval: another worker is taking these slots (fewer refusals)
                backlog.learn(free_at_ms=plan.free_at_ms + (rate.interval_ms if refused else 0))
                return self._saturated(key, backlog, rate, now_ms)
            answer = await self.store.take_slot(key, plan)
            refused = not answer.ok
            tat_ms = answer.tat_ms
            if tat_ms is not None:
                _remember(self._tat_ms, key, tat_ms)
            if answer.ok:
                assert tat_ms is not None
                backlog.learn(free_at_ms=tat_ms - rate.horizon_ms)
                return gcra.start_of(tat_ms, plan.interval_ms) - self._now_ms()
        backlog.learn(free_at_ms=self._now_ms() + rate.interval_ms)  # contended: step back one interval
        return self._saturated(key, backlog, rate, self._now_ms())

    def _saturated(self, key: str, backlog: gcra.Backlog, rate: gcra.Rate, now_ms: float) -> Decision:
        wait_ms = backlog.hold_back_ms(now_ms=now_ms, interval_ms=rate.interval_ms)
        return self._hold(wait_ms, f"rate limit {rate} of {key!r}")

    # ------------------------------------------------------------------------------------------------ breakers

    async def _breaker(self, key: str) -> policy.Record | None:
        known = self._breakers.get(key)
        if known is not None and time.monotonic() - known.at_s < BREAKER_CACHE_S:
            return known.record
        asked = next(self._asked)
        return self._learn(key, await self.store.breaker(key), asked)

    def _learn(self, key: str, record: policy.Record | None, asked: int) -> policy.Record | None:
        """Remember the record that the store call numbered ``asked`` answered; returns the newest record known.

        A call sent after the known record was learned answers later news, whatever its version (a reset answers
        None). One that overlapped it (the known record was learned while this call was in flight) may have been
        served before or after it: the higher version wins. Remembering the later answer alone brought back the
        breaker as it was: the worker that had just opened it ran its jobs for another BREAKER_CACHE_S."""
        known = self._breakers.get(key)
        kept = known.record if known is not None and known.learned > asked else None
        if kept is not None and (record is None or record.version <= kept.version):
            return kept
        _remember(self._breakers, key, _Known(time.monotonic(), record, next(self._asked)))
        return record

    async def _change(
        self, key: str, job_type: str, change: Callable[[policy.Record], policy.Record]
    ) -> policy.Record | None:
        """Apply ``change`` to the key's record with a version check, again on the stored record when refused."""
        lock = self._change_locks.get(key) or _remember(self._change_locks, key, asyncio.Lock())
        async with lock:
            return await self._change_locked(key, job_type, change)

    async def _change_locked(
        self, key: str, job_type: str, change: Callable[[policy.Record], policy.Record]
    ) -> policy.Record | None:
        known = self._breakers.get(key)
        if known is not None:
            current, asked = known.record, known.learned
        else:
            asked = next(self._asked)
            current = await self.store.breaker(key)
        for _ in range(MAX_WRITES):
            base = current or policy.Record(version=_first_version())
            new = change(base)
            if new is base:
                self._learn(key, current, asked)
                return None  # nothing to write
            asked = next(self._asked)
            ok, stored = await self.store.write_breaker(
                key, new, seen_version=None if current is None else current.version
            )
            if ok:
                self._learn(key, new, asked)
                if new.state is not base.state:
                    self._changed(Change(key, job_type, base.state, new.state))
                return new
            current = stored
        log.warning("circuit breaker %r: gave up a change after %d contended writes", key, MAX_WRITES)
        return None

    async def _take_probe(self, key: str, job_type: str, owner: str, lease_ms: int, breaker: policy.Breaker) -> bool:
        def probe(record: policy.Record) -> policy.Record:
            now_ms = self._now_ms()
            if policy.admit(record, now_ms=now_ms, cooldown_s=breaker.cooldown_s).verdict is not policy.Verdict.PROBE:
                return record  # somebody else took it (or it closed meanwhile: then the job just runs)
            return policy.take_probe(record, now_ms=now_ms, owner=owner, lease_ms=lease_ms)

        written = await self._change(key, job_type, probe)
        if written is not None:
            return True
        known = self._breakers.get(key)
        record = known.record if known is not None else None
        return record is None or record.state is policy.State.CLOSED

    # ------------------------------------------------------------------------------------------------ report

    async def report(self, ticket: Ticket, outcome: Outcome, *, job_type: str) -> None:
        """Tell the job's breaker how it ended (nothing for a job without one)."""
        if ticket.breaker is None or ticket.breaker_key is None:
            return
        settings, owner = ticket.breaker, ticket.owner
        if outcome is Outcome.SUCCEEDED:
            if not ticket.probe:
                return  # a closed breaker does not change on success: no write
            await self._change(
                ticket.breaker_key, job_type, lambda r: policy.on_success(r, now_ms=self._now_ms(), owner=owner)
            )
        elif outcome is Outcome.COUNTED:
            await self._change(
                ticket.breaker_key,
                job_type,
                lambda r: policy.on_failure(r, now_ms=self._now_ms(), owner=owner, breaker=settings),
            )
        elif ticket.probe:
            await self._change(
                ticket.breaker_key, job_type, lambda r: policy.on_inconclusive(r, now_ms=self._now_ms(), owner=owner)
            )

    def _changed(self, change: Change) -> None:
        if self.on_change is not None:  # the worker's observers write the log line and count the metric
            self.on_change(change)
            return
        log.warning(
            "circuit breaker %r: %s -> %s",
            change.key,
            change.previous.value,
            change.state.value,
            extra={
                "event": "breaker_changed",
                "breaker_key": change.key,
                "job_type": change.job_type,
                "previous": change.previous.value,
                "state": change.state.value,
            },
        )
