"""Typed enqueue: ``send_email.enqueue(Email(...))`` validates the payload against the handler's model, then sends.

- :class:`JobRef` (``job_ref(name, Model)``): a job type and its payload model, for producers that must not import
  handler code; every ``@job`` handler carries the same methods (``.enqueue``, ``.enqueue_async``,
  ``.enqueue_many``, ``.enqueue_many_async``).
- A payload is validated before anything is sent: an invalid one raises ``ConfigError`` naming the fields (never
  their values) and sends nothing; ``enqueue_many`` checks every payload before the first request.
- Messages are built by ``worker.producer.message_entry`` (the one place that builds envelopes) and sent by a
  :class:`Producer`: by default :class:`SQSProducer`, the queue of ``WORKER_QUEUE`` through the AWS variables (a
  boto3 client of ``worker.backends.aws``, made once per process); ``use_producer(p)`` swaps it for the current
  context and the threads it runs (``worker.testing`` sets the in-memory queue this way).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, overload

from pydantic import BaseModel, ValidationError

from worker.envelope import describe_errors
from worker.errors import ConfigError, QueueUnavailable
from worker.producer import BatchResult, EntryFailure, Job, enqueue, message_entry, send_batch

if TYPE_CHECKING:
    from worker.backends.memory import MemoryQueue
    from worker.settings import WorkerSettings

M = TypeVar("M", bound=BaseModel)

#: SendMessageBatch takes at most 10 entries.
BATCH_SIZE = 10


class Producer(Protocol):
    """Sends built jobs somewhere: SQS (:class:`SQSProducer`) or an in-memory queue (:class:`MemoryProducer`)."""

    def send(self, job: Job) -> str: ...

    def send_many(self, jobs: Sequence[Job]) -> BatchResult: ...

    async def send_async(self, job: Job) -> str: ...

    async def send_many_async(self, jobs: Sequence[Job]) -> BatchResult: ...


class SQSProducer:
    """Jobs to an SQS queue with boto3: ``client`` and ``queue_url`` injectable, else from the settings
    (``WORKER_QUEUE``, the AWS variables), made on first use. The ``*_async`` methods run the same blocking call
    in a thread (boto3 clients are thread-safe), so an event loop never waits on the network."""

    def __init__(self, client: Any = None, queue_url: str | None = None, *, settings: WorkerSettings | None = None):
        self._client = client
        self._queue_url = queue_url
        self._settings = settings
        self._lock = threading.Lock()

    def _target(self) -> tuple[Any, str]:
        with self._lock:
            if self._client is None or self._queue_url is None:
                from worker.backends.aws import resolve_queue_url_sync, sync_client
                from worker.settings import WorkerSettings

                settings = self._settings or WorkerSettings()
                if self._client is None:
                    self._client = sync_client("sqs", connection=settings.aws().client_kwargs())
                if self._queue_url is None:
                    self._queue_url = resolve_queue_url_sync(self._client, settings.queue)
            return self._client, self._queue_url

    def send(self, job: Job) -> str:
        client, url = self._target()
        return enqueue(client, url, job)

    def send_many(self, jobs: Sequence[Job]) -> BatchResult:
        client, url = self._target()
        return send_batch(client, url, jobs)

    async def send_async(self, job: Job) -> str:
        return await asyncio.to_thread(self.send, job)

    async def send_many_async(self, jobs: Sequence[Job]) -> BatchResult:
        return await asyncio.to_thread(self.send_many, jobs)


class MemoryProducer:
    """Jobs to a queue of ``worker.backends.memory``, built exactly as for SQS; batches report per-entry failures
    as SendMessageBatch does (the code SQS would answer)."""

    def __init__(self, queue: MemoryQueue) -> None:
        self.queue = queue

    def send(self, job: Job) -> str:
        return self.queue.send_entry(message_entry(job, fifo=self.queue.is_fifo))

    def send_many(self, jobs: Sequence[Job]) -> BatchResult:
        entries = [message_entry(job, fifo=self.queue.is_fifo) for job in jobs]
        ids: list[str | None] = [None] * len(entries)
        failures: list[EntryFailure] = []
        for index, entry in enumerate(entries):
            try:
                ids[index] = self.queue.send_entry(entry)
            except QueueUnavailable as exc:
                code = _code_of(exc)
                failures.append(EntryFailure(index, code, str(exc)))
        return BatchResult(ids, failures)

    async def send_async(self, job: Job) -> str:
        return self.send(job)

    async def send_many_async(self, jobs: Sequence[Job]) -> BatchResult:
        return self.send_many(jobs)


def _code_of(exc: BaseException) -> str:
    cause = exc.__cause__
    response = getattr(cause, "response", None)
    if isinstance(response, Mapping):
        return str(response.get("Error", {}).get("Code", "Unknown"))
    return "Unknown"


_current: contextvars.ContextVar[Producer | None] = contextvars.ContextVar("sqs_worker_producer", default=None)
#: What ``use_producer`` set last, for threads that do not inherit the context (a plain ``def`` handler's thread).
_installed: list[Producer] = []
#: SQSProducers made from the settings, by queue and connection (a client each, made once).
_from_settings: dict[tuple[str, str], SQSProducer] = {}
_from_settings_lock = threading.Lock()


@contextlib.contextmanager
def use_producer(producer: Producer) -> Iterator[Producer]:
    """Send every ``.enqueue`` within this block (and the worker threads it starts) through ``producer``."""
    token = _current.set(producer)
    _installed.append(producer)
    try:
        yield producer
    finally:
        _installed.remove(producer)
        _current.reset(token)


def producer_in_use() -> Producer | None:
    """What ``use_producer`` set (in this context, else last in any), or None: the settings' SQS then."""
    producer = _current.get()
    if producer is not None:
        return producer
    return _installed[-1] if _installed else None


def current_producer() -> Producer:
    """The producer ``.enqueue`` uses now: ``use_producer``'s, else an SQSProducer for the settings as they are
    now (``WORKER_QUEUE`` and the AWS variables; one per queue and endpoint, made once)."""
    producer = _current.get()
    if producer is not None:
        return producer
    if _installed:
        return _installed[-1]
    from worker.settings import botocore_endpoint_variables, load_settings

    settings = load_settings()  # a missing WORKER_QUEUE is one ConfigError line
    endpoints = botocore_endpoint_variables()
    key = (settings.queue, repr((sorted(settings.aws().client_kwargs().items()), endpoints)))
    with _from_settings_lock:
        found = _from_settings.get(key)
        if found is None:
            found = _from_settings[key] = SQSProducer(settings=settings)
        return found


class JobRef(Generic[M]):
    """A job type and its payload model: enough to send it, without importing its handler.

    ``JobRef("send_email", Email).enqueue({"to": "ada@example.com", "subject": "Hi"})``; without a model the
    payload is any JSON object (a mapping)."""

    def __init__(self, name: str, model: type[M] | None = None) -> None:
        self.name = name
        self.model = model

    def __repr__(self) -> str:
        model = self.model.__name__ if self.model is not None else "dict"
        return f"JobRef({self.name!r}, {model})"

    def build(
        self,
        payload: M | Mapping[str, Any],
        *,
        delay_s: int | None = None,
        idempotency_key: str | None = None,
        group_id: str | None = None,
        run_at: datetime | None = None,
    ) -> Job:
        """The job to send: the payload validated (ConfigError naming the fields when it is not valid)."""
        return Job(
            type=self.name,
            payload=self.payload_of(payload),
            idempotency_key=idempotency_key,
            delay_s=delay_s or 0,
            group_id=group_id,
            run_at=run_at,
        )

    def payload_of(self, payload: M | Mapping[str, Any]) -> dict[str, Any]:
        if self.model is None:
            if isinstance(payload, BaseModel):
                return payload.model_dump(mode="json")
            if not isinstance(payload, Mapping):
                raise ConfigError(f"job {self.name!r}: the payload must be a JSON object, not {type(payload).__name__}")
            return dict(payload)
        try:
            model = payload if isinstance(payload, self.model) else self.model.model_validate(payload)
        except ValidationError as exc:
            raise ConfigError(f"job {self.name!r}: payload {describe_errors(exc)}; nothing sent") from None
        dumped: dict[str, Any] = model.model_dump(mode="json")
        return dumped

    def enqueue(
        self,
        payload: M | Mapping[str, Any],
        *,
        delay_s: int | None = None,
        idempotency_key: str | None = None,
        group_id: str | None = None,
        run_at: datetime | None = None,
        producer: Producer | None = None,
    ) -> str:
        """Validate and send one job; returns its MessageId."""
        job = self.build(payload, delay_s=delay_s, idempotency_key=idempotency_key, group_id=group_id, run_at=run_at)
        return (producer or current_producer()).send(job)

    async def enqueue_async(
        self,
        payload: M | Mapping[str, Any],
        *,
        delay_s: int | None = None,
        idempotency_key: str | None = None,
        group_id: str | None = None,
        run_at: datetime | None = None,
        producer: Producer | None = None,
    ) -> str:
        """:meth:`enqueue`, awaitable."""
        job = self.build(payload, delay_s=delay_s, idempotency_key=idempotency_key, group_id=group_id, run_at=run_at)
        return await (producer or current_producer()).send_async(job)

    def enqueue_many(
        self,
        payloads: Iterable[M | Mapping[str, Any]],
        *,
        delay_s: int | None = None,
        group_id: str | None = None,
        run_at: datetime | None = None,
        producer: Producer | None = None,
    ) -> BatchResult:
        """Validate every payload, then send them 10 per SendMessageBatch. Entries the queue refuses are reported
        in the result's ``failures`` (by index), not raised; the others are sent."""
        jobs = [self.build(payload, delay_s=delay_s, group_id=group_id, run_at=run_at) for payload in payloads]
        return (producer or current_producer()).send_many(jobs)

    async def enqueue_many_async(
        self,
        payloads: Iterable[M | Mapping[str, Any]],
        *,
        delay_s: int | None = None,
        group_id: str | None = None,
        run_at: datetime | None = None,
        producer: Producer | None = None,
    ) -> BatchResult:
        """:meth:`enqueue_many`, awaitable."""
        jobs = [self.build(payload, delay_s=delay_s, group_id=group_id, run_at=run_at) for payload in payloads]
        return await (producer or current_producer()).send_many_async(jobs)


@overload
def job_ref(name: str) -> JobRef[Any]: ...


@overload
def job_ref(name: str, model: type[M]) -> JobRef[M]: ...


def job_ref(name: str, model: type[M] | None = None) -> JobRef[Any]:
    """A :class:`JobRef`: ``job_ref("send_email", Email).enqueue(Email(...))``; ``job_ref("import_rows")`` for a
    job whose payload is any JSON object."""
    return JobRef(name, model)


#: The methods every ``@job`` handler carries, taken from its JobRef.
METHODS = ("enqueue", "enqueue_async", "enqueue_many", "enqueue_many_async")


def attach(handler: Any, name: str, model: type[BaseModel] | None) -> None:
    """Give a handler its ``.enqueue`` methods (and ``.job_ref``); a callable that takes no attributes keeps
    none (it can still be sent with ``job_ref``)."""
    ref: JobRef[Any] = JobRef(name, model)
    with contextlib.suppress(AttributeError, TypeError):
        handler.job_ref = ref
        for method in METHODS:
            setattr(handler, method, getattr(ref, method))
