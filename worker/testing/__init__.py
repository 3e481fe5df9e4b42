"""Test handlers without AWS: the real worker over an in-memory queue, run until the queue is idle.

::

    from worker.testing import InMemoryWorker

    def test_welcome_mail() -> None:
        kit = InMemoryWorker()                 # the handlers of `from worker import job`, a queue and its DLQ
        with kit.producing():                  # `.enqueue` goes to this queue meanwhile
            send_email.enqueue(Email(to="ada@example.com", subject="Hi"))
        result = kit.run_until_idle()          # backoff delays pass at once (the clock skips ahead)
        assert result.succeeded == 1

The pytest plugin (``worker.testing.plugin``, registered by the package) gives the ``sqs_worker`` fixture: an
``InMemoryWorker`` whose queue ``.enqueue`` sends to for the whole test.

What runs is the production consume loop (``worker.runtime.worker.Worker``) with its heartbeats, retries,
dead-lettering and idempotency ledger (``worker.idempotency.memory``), over ``worker.backends.memory``: visibility
timeouts and receive counts, delays, the redrive policy, FIFO groups and deduplication, the DLQ's size limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from worker.backends.memory import MemoryBroker, MemoryQueue, QueueCounts
from worker.enqueue import MemoryProducer, use_producer
from worker.errors import ConfigError
from worker.flow.gate import Gate
from worker.idempotency import Ledger, Record, parse_record
from worker.idempotency.memory import MemoryStore
from worker.jobs import Registry, default_registry
from worker.names import default_dlq_name
from worker.observability.events import Event, Kind, Observer, Observers
from worker.producer import Job
from worker.runtime.worker import RuntimeOptions, Worker

__all__ = ["DeadLetter", "InMemoryWorker", "RunSummary"]

#: How often the driver looks at the queue when nothing told it of a change (a bound, not a pace).
CHECK_EVERY_S = 0.05


@dataclass(frozen=True)
class DeadLetter:
    """A message in the dead-letter queue, with its dead-letter record (``error_category`` and the others)."""

    message_id: str
    body: str
    attributes: dict[str, str]

    @property
    def category(self) -> str | None:
        """``error_category``: invalid_message, unknown_type, invalid_payload, permanent, bug or exhausted (None
        for a message the queue's redrive policy moved, which carries no record)."""
        return self.attributes.get("error_category")

    @property
    def error_message(self) -> str | None:
        return self.attributes.get("error_message")

    @property
    def attempts(self) -> int | None:
        """``attempts``: the handler's runs of the job (None without a record)."""
        return self._count("attempts")

    @property
    def receive_count(self) -> int | None:
        """``receive_count``: the job's receives in all, runs and holds (None without a record)."""
        return self._count("receive_count")

    def _count(self, name: str) -> int | None:
        value = self.attributes.get(name)
        return int(value) if value is not None else None

    @property
    def job_type(self) -> str | None:
        envelope = self._envelope()
        value = envelope.get("type") if envelope is not None else None
        return value if isinstance(value, str) else None

    @property
    def payload(self) -> Any:
        envelope = self._envelope()
        return envelope.get("payload") if envelope is not None else None

    def _envelope(self) -> dict[str, Any] | None:
        try:
            value = json.loads(self.body)
        except (ValueError, RecursionError):  # not JSON, an integer of too many digits, or nested past the parser
            return None
        return value if isinstance(value, dict) else None


@dataclass(frozen=True)
class RunSummary:
    """What one ``run_until_idle`` did: jobs that succeeded, attempts that were retried, jobs dead-lettered by the
    worker in this run (``dead_letters``: everything the DLQ holds), and the seconds the clock skipped."""

    succeeded: int
    retried: int
    dead_lettered: int
    duplicates_skipped: int
    dead_letters: list[DeadLetter]
    events: list[Event] = field(repr=False)
    skipped_s: float = 0.0

    def __str__(self) -> str:
        return (
            f"{self.succeeded} succeeded, {self.retried} retried, {self.dead_lettered} dead-lettered "
            f"({self.duplicates_skipped} duplicates skipped; {self.skipped_s:g} s skipped)"
        )

    def of(self, kind: Kind) -> list[Event]:
        return [event for event in self.events if event.kind is kind]


class _Recorder:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.changed = asyncio.Event()

    def emit(self, event: Event) -> None:
        self.events.append(event)
        self.changed.set()

    def gauge(self, *, in_flight: int, free_slots: int, stuck_threads: int = 0) -> None:
        self.changed.set()

    def connectivity(self, *, service: str, reachable: bool) -> None:
        self.changed.set()


class InMemoryWorker:
    """The worker's runtime over an in-memory queue, its DLQ and an in-memory idempotency ledger.

    ``registry`` defaults to the handlers of ``from worker import job``. ``queue`` names the queue (``.fifo`` for
    a FIFO queue); its DLQ is ``<queue>-dlq`` with a redrive policy of ``max_receive_count`` (default: the largest
    ``max_attempts`` + 2, as ``sqs-worker bootstrap`` sets). State (queues, ledger) lasts across runs.
    """

    def __init__(
        self,
        registry: Registry | None = None,
        *,
        queue: str = "jobs",
        max_receive_count: int | None = None,
        concurrency: int = 4,
        visibility_timeout_s: int = 30,
        observers: list[Observer] | None = None,
    ) -> None:
        self.registry = registry if registry is not None else default_registry
        self.broker = MemoryBroker()
        self.dlq: MemoryQueue = self.broker.create_queue(default_dlq_name(queue))
        if max_receive_count is None:
            max_receive_count = self.registry.max_receive_count(fifo=queue.endswith(".fifo"))
        self.queue: MemoryQueue = self.broker.create_queue(
            queue,
            dead_letter_queue=self.dlq.name,
            max_receive_count=max_receive_count,
            visibility_timeout_s=visibility_timeout_s,
        )
        self.store = MemoryStore()
        #: Rate limits and circuit breakers, on the queue's clock (its skips pass for them too), kept across runs
        #: as a fleet's table keeps them.
        self.gate = Gate(owner="memory-worker", now_ms=lambda: int(self.broker.clock.time() * 1000))
        self.producer = MemoryProducer(self.queue)
        self.options = RuntimeOptions(
            concurrency=concurrency, visibility_timeout_s=visibility_timeout_s, shutdown_grace_s=5.0, poll_wait_s=1
        )
        self._observers = list(observers or [])

    # ------------------------------------------------------------------------------------------- sending

    @contextlib.contextmanager
    def producing(self) -> Iterator[MemoryProducer]:
        """Within this block, every ``.enqueue`` (of ``@job`` handlers and ``JobRef``) sends to this queue."""
        with use_producer(self.producer) as producer:
            yield producer  # type: ignore[misc]

    def enqueue(
        self,
        job_type: str,
        payload: Mapping[str, Any] | None = None,
        *,
        delay_s: int | None = None,
        idempotency_key: str | None = None,
        group_id: str | None = None,
    ) -> str:
        """Send one job as it is, unvalidated (for payloads a handler's model would refuse); returns its id."""
        job = Job(job_type, dict(payload or {}), idempotency_key, delay_s or 0, group_id)
        return self.producer.send(job)

    def send_raw(self, body: str, *, group_id: str | None = None, deduplication_id: str | None = None) -> str:
        """Send any body (not JSON, not an envelope): what a careless producer might send."""
        return self.broker.send(self.queue.name, body, group_id=group_id, deduplication_id=deduplication_id)

    # ------------------------------------------------------------------------------------------- running

    def run_until_idle(self, *, timeout_s: float = 30.0) -> RunSummary:
        """Run the worker until the queue is idle (nothing visible, in flight or delayed); see the async twin."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.run_until_idle_async(timeout_s=timeout_s))
        raise ConfigError("run_until_idle() called inside an event loop: use `await kit.run_until_idle_async()`")

    async def run_until_idle_async(self, *, timeout_s: float = 30.0) -> RunSummary:
        """Run the real worker until the queue holds nothing (visible, in flight or delayed) and no job runs.

        When nothing can run now but messages wait (a retry's backoff, a delay), the clock skips to the next one.
        Raises TimeoutError (after stopping the worker) when the queue is not idle within ``timeout_s`` of real
        time, for example a handler that enqueues itself forever; an error that stops the worker is raised.
        """
        recorder = _Recorder()
        worker = Worker(
            registry=self.registry,
            queue=self.queue,
            dlq=self.dlq,
            options=self.options,
            observers=Observers([recorder, *self._observers]),
            ledger=Ledger(store=self.store, owner="memory-worker", clock=self.broker.clock.time),
            gate=self.gate,
            clock=self.broker.clock,
        )
        stop = asyncio.Event()
        with use_producer(self.producer):
            task = asyncio.create_task(worker.run(stop), name="sqs-worker-memory")
            skipped_s = 0.0
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout_s
            try:
                while not task.done():
                    counts = self.queue.counts()
                    if worker.idle:
                        if counts.total == 0:
                            break
                        skipped_s += self.broker.advance_to_next_due(self.queue.name)
                    if loop.time() >= deadline:
                        raise TimeoutError(f"the queue was not idle after {timeout_s:g} s: {counts}")
                    recorder.changed.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(recorder.changed.wait(), timeout=CHECK_EVERY_S)
            finally:
                stop.set()
                await task
        return RunSummary(
            succeeded=sum(1 for e in recorder.events if e.kind is Kind.SUCCEEDED),
            retried=sum(1 for e in recorder.events if e.kind is Kind.RETRY_SCHEDULED),
            dead_lettered=sum(1 for e in recorder.events if e.kind is Kind.DEAD_LETTERED),
            duplicates_skipped=sum(1 for e in recorder.events if e.kind is Kind.DUPLICATE_SKIPPED),
            dead_letters=self.dead_letters,
            events=recorder.events,
            skipped_s=skipped_s,
        )

    # ------------------------------------------------------------------------------------------- inspecting

    @property
    def dead_letters(self) -> list[DeadLetter]:
        """Everything the DLQ holds, oldest first (not removed)."""
        return [
            DeadLetter(message.message_id, message.body, message.attribute_values) for message in self.dlq.messages()
        ]

    def counts(self) -> QueueCounts:
        return self.queue.counts()

    def ledger_record(self, key: str) -> Record | None:
        """The idempotency ledger's record of ``key`` (as ``sqs-worker status KEY`` shows it)."""
        item = self.store.items().get(key)
        return parse_record(item) if item is not None else None
