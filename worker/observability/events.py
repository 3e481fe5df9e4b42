"""Job lifecycle events the worker emits, and the Observer interface that metrics and logs implement.

The runtime calls ``observer.emit(event)`` at each state change of a job, ``observer.gauge(...)`` about
once a second while its main loop turns (a liveness signal too; ``stuck_threads`` counts plain ``def``
handlers still running in their thread after their job timed out or was stopped), and
``observer.connectivity(...)`` when an endpoint (service "sqs" or "dynamodb") becomes unreachable or reachable
again.
Observers must be quick and must not raise: they run on the event loop.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

log = logging.getLogger("worker")


class Kind(StrEnum):
    """A job's state changes, in the order they usually happen."""

    RECEIVED = "received"  # claimed from the queue
    STARTED = "started"  # handler called
    SUCCEEDED = "succeeded"  # handler returned; message deleted (or being deleted)
    RETRY_SCHEDULED = "retry_scheduled"  # failed, will reappear after delay_s
    DEAD_LETTERED = "dead_lettered"  # sent to the DLQ with its category, deleted from the source
    RELEASED = "released"  # put back unprocessed (shutdown, FIFO group failure, idempotency lease held, not yet due)
    DUPLICATE_SKIPPED = "duplicate_skipped"  # idempotency key already COMPLETED: acknowledged without running
    HEARTBEAT = "heartbeat"  # visibility extended while the job ran
    CLAIM_LOST = "claim_lost"  # a heartbeat found the receipt handle no longer valid
    BREAKER_CHANGED = "breaker_changed"  # a circuit breaker changed state (extra: breaker_key, previous, state)


@dataclass(frozen=True)
class Event:
    """One state change of one message. Never carries payload values."""

    kind: Kind
    queue: str
    message_id: str
    job_type: str | None = None
    attempt: int = 0
    duration_s: float | None = None  # handler run time (succeeded, retry_scheduled, dead_lettered)
    queue_wait_s: float | None = None  # from send to start (started)
    delay_s: float | None = None  # retry delay (retry_scheduled), visibility set (released)
    category: str | None = None  # dead-letter category (dead_lettered)
    error: str | None = None  # "<ExceptionType>: <message>", truncated (retry_scheduled, dead_lettered)
    reason: str | None = None  # why a message was released
    idempotency_key: str | None = None
    extra: dict[str, str] = field(default_factory=dict)


class Observer(Protocol):
    """Receives the worker's events. Implementations: JSON logs, EMF metrics, a test recorder."""

    def emit(self, event: Event) -> None: ...

    def gauge(self, *, in_flight: int, free_slots: int, stuck_threads: int = 0) -> None: ...

    def connectivity(self, *, service: str, reachable: bool) -> None: ...


class Observers:
    """Fans events out to several observers; one failing observer never stops the others or the worker.

    The first failure of each observer is logged with its traceback; later ones are not (an observer failing
    on every event would flood the log).
    """

    def __init__(self, observers: list[Observer] | None = None) -> None:
        self._observers: list[Observer] = list(observers or [])
        self._failed: set[int] = set()  # ids of observers whose failure was logged

    def add(self, observer: Observer) -> None:
        self._observers.append(observer)

    def emit(self, event: Event) -> None:
        for observer in self._observers:
            try:
                observer.emit(event)
            except Exception:  # an observer bug must not stop jobs
                self._failure(observer, "emit")

    def gauge(self, *, in_flight: int, free_slots: int, stuck_threads: int = 0) -> None:
        for observer in self._observers:
            try:
                observer.gauge(in_flight=in_flight, free_slots=free_slots, stuck_threads=stuck_threads)
            except Exception:
                self._failure(observer, "gauge")

    def connectivity(self, *, service: str, reachable: bool) -> None:
        for observer in self._observers:
            try:
                observer.connectivity(service=service, reachable=reachable)
            except Exception:
                self._failure(observer, "connectivity")

    def _failure(self, observer: Observer, method: str) -> None:
        """Log an observer's first failure with its traceback (called inside the ``except`` block)."""
        if id(observer) in self._failed:
            return
        self._failed.add(id(observer))
        log.exception(
            "observer %s failed in %s(); it stays registered, and its further failures are not logged",
            type(observer).__qualname__,
            method,
        )
