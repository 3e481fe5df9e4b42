"""Assembling a worker from settings: AWS clients, queue URLs, the DLQ, the ledger, observers."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from worker.backends.aws import async_client, client_config, is_transient, resolve_queue_url, translate
from worker.backends.sqs import Queue, redrive_policy
from worker.budgets import retry_delay_s, start_budget
from worker.errors import ConfigError, QueueUnavailable
from worker.jobs import FIFO_FLOW_RECEIVE_COUNT, Registry
from worker.names import default_dlq_name, queue_name_of
from worker.observability.events import Observers
from worker.runtime.queueset import Route
from worker.runtime.worker import RuntimeOptions, Worker
from worker.settings import WorkerSettings

if TYPE_CHECKING:
    from types_aiobotocore_sqs import SQSClient

log = logging.getLogger("worker")

#: A connection that SQS does not accept within this is given up (the call is retried on a new one).
CONNECT_TIMEOUT_S = 3
#: Beyond the long poll's wait: an answer later than this is given up as a stalled connection.
READ_TIMEOUT_MARGIN_S = 5


def worker_id() -> str:
    """Names this process in leases and logs: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


__all__ = [
    "check_table",
    "client_config",
    "open_worker",
    "resolve_dlq_url",
    "resolve_queue_set",
    "wait_for_endpoint",
    "worker_id",
]


async def resolve_dlq_url(client: SQSClient, settings: WorkerSettings, queue_url: str, target: str | None) -> str:
    """WORKER_DEAD_LETTER_QUEUE, else the queue's redrive ``target`` (a name), else ``<queue>-dlq``."""
    candidate = settings.dead_letter_queue or target or default_dlq_name(queue_name_of(queue_url))
    try:
        return await resolve_queue_url(client, candidate)
    except ConfigError as exc:
        raise ConfigError(
            f"dead-letter queue {candidate!r} does not exist: run `sqs-worker bootstrap` "
            "or set WORKER_DEAD_LETTER_QUEUE"
        ) from exc


@dataclass(frozen=True)
class Resolved:
    """One queue to consume: its URL, its DLQ's URL, its weight, and its redrive policy's maxReceiveCount."""

    queue_url: str
    dlq_url: str
    weight: int
    max_receive_count: int | None


async def resolve_queue_set(client: SQSClient, settings: WorkerSettings) -> list[Resolved]:
    """Each queue to consume (WORKER_QUEUES, else WORKER_QUEUE), highest priority first. Each queue of a set
    dead-letters into its own DLQ: its redrive target, else ``<queue>-dlq``. One read of each queue's redrive
    policy serves both the DLQ and the start's maxReceiveCount check."""
    resolved = []
    for spec in settings.queue_set():
        queue_url = await resolve_queue_url(client, spec.queue)
        target, receives = await redrive_policy(client, queue_url)
        dlq_url = await resolve_dlq_url(client, settings, queue_url, target)
        resolved.append(Resolved(queue_url, dlq_url, spec.weight, receives))
    return resolved


async def wait_for_endpoint(client: SQSClient, settings: WorkerSettings, stop: asyncio.Event) -> tuple[str, str]:
    """Resolve the queue and DLQ URLs, waiting out an unreachable endpoint for WORKER_START_TIMEOUT_S (the start
    budget of ``worker.budgets``); then, or when ``stop`` is set, the last QueueUnavailable is raised. (The first
    queue of a set; ``wait_for_queue_set`` resolves them all.)"""
    first = (await wait_for_queue_set(client, settings, stop))[0]
    return first.queue_url, first.dlq_url


async def wait_for_queue_set(client: SQSClient, settings: WorkerSettings, stop: asyncio.Event) -> list[Resolved]:
    """``resolve_queue_set``, waiting out an unreachable endpoint as ``wait_for_endpoint`` says."""
    import random

    budget = start_budget(settings.start_timeout_s)
    loop = asyncio.get_running_loop()
    started = loop.time()
    failures = 0
    while True:
        try:
            return await resolve_queue_set(client, settings)
        except QueueUnavailable as exc:
            failures += 1
            delay_s = retry_delay_s(
                budget=budget, failures=failures, elapsed_s=loop.time() - started, jitter=random.random()
            )
            if stop.is_set():
                raise
            if delay_s is None:
                raise QueueUnavailable(
                    f"{exc} (gave up after {budget.give_up_after_s:g} s, WORKER_START_TIMEOUT_S)"
                ) from exc
            if failures == 1:
                log.warning("sqs unreachable at start, trying for %g s: %s", budget.give_up_after_s, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay_s)


async def check_table(client: Any, table: str) -> None:
    """A missing or forbidden table stops the start; an unreachable endpoint does not (the worker fails closed
    until it is back). One GetItem: the task role may read items, not describe tables."""
    from worker.idempotency import KEY_ATTRIBUTE

    try:
        await client.get_item(TableName=table, Key={KEY_ATTRIBUTE: {"S": "sqs-worker:startup-check"}})
    except Exception as exc:
        if is_transient(exc):
            return
        error = translate(exc, "GetItem", service="dynamodb", resource=table)
        if isinstance(error, ConfigError):
            raise error from exc
        raise ConfigError(f"idempotency table {table!r}: {error}") from exc


def check_registry(settings: WorkerSettings, registry: Registry) -> None:
    """Handlers are registered, and idempotent ones have their table (every backend checks this at start)."""
    if len(registry) == 0:
        raise ConfigError("no job handlers registered: set WORKER_HANDLERS to the modules that define @job handlers")
    guarded = [spec.name for spec in registry.specs() if spec.uses_ledger]
    if guarded and not settings.idempotency_table:
        raise ConfigError(
            f"job(s) {', '.join(guarded)} are idempotent but WORKER_IDEMPOTENCY_TABLE is not set: "
            "they would run unguarded"
        )


def local_gate(registry: Registry) -> Any:
    """Rate limits and breakers of this worker alone (no table); says so once when a job has either."""
    from worker.flow.gate import Gate

    limited = registry.flow_controlled()
    if limited:
        log.warning(
            "WORKER_IDEMPOTENCY_TABLE is not set: the rate limits and circuit breakers of %s are local to this "
            "process (each process of a fleet, WORKER_PROCESSES counted, applies them on its own)",
            ", ".join(limited),
        )
    return Gate(owner=worker_id())


def shared_gate(dynamodb: Any, table: str, *, owner: str) -> Any:
    """Rate limits and breakers shared by every worker of the fleet through the idempotency table."""
    from worker.flow.gate import Gate
    from worker.flow.store import DynamoFlowStore

    return Gate(DynamoFlowStore(dynamodb, table), owner=owner)


def warn_low_receive_count(queue: Resolved, registry: Registry) -> None:
    """A warning at start when the queue's redrive maxReceiveCount is too low for its jobs (as ``bootstrap``
    warns): not above the largest ``max_attempts``, SQS would move retried jobs to the DLQ before the worker
    dead-letters them, reasonless; on a FIFO queue with rate-limited or breaker jobs, below
    ``FIFO_FLOW_RECEIVE_COUNT``, their holds (each a receive there) would move good jobs to the DLQ unrun.
    No redrive policy: the worker's own dead letters are the only ones."""
    queue_url, receives = queue.queue_url, queue.max_receive_count
    if receives is None:
        return
    fifo = queue_url.endswith(".fifo")
    largest = max((spec.max_attempts for spec in registry.specs()), default=0)
    wanted = registry.max_receive_count(fifo=fifo)
    held = registry.flow_controlled() if fifo else []
    if receives <= largest:
        log.warning(
            "the queue %s moves a message to its DLQ after %d receives, not above the largest max_attempts (%d): "
            "retried jobs may reach the DLQ without their reason; raise it (sqs-worker bootstrap sets %d)",
            queue_name_of(queue_url),
            receives,
            largest,
            wanted,
        )
    elif held and receives < FIFO_FLOW_RECEIVE_COUNT:
        log.warning(
            "the FIFO queue %s moves a message to its DLQ after %d receives, and each hold of a rate-limited or "
            "breaker job (%s) is a receive there: held jobs may reach the DLQ unrun; raise it to at least %d "
            "(sqs-worker bootstrap sets %d)",
            queue_name_of(queue_url),
            receives,
            ", ".join(held),
            FIFO_FLOW_RECEIVE_COUNT,
            wanted,
        )


@contextlib.asynccontextmanager
async def open_worker(
    settings: WorkerSettings,
    registry: Registry,
    *,
    stop: asyncio.Event,
    observers: Observers | None = None,
) -> AsyncIterator[Worker]:
    """A Worker wired to the configured queue, DLQ and (when configured) idempotency table."""
    check_registry(settings, registry)
    connection = settings.aws().client_kwargs()
    config = client_config(settings)
    async with contextlib.AsyncExitStack() as stack:
        sqs: SQSClient = await stack.enter_async_context(
            async_client("sqs", config=client_config(settings, validate=False), connection=connection)
        )
        queue_set = await wait_for_queue_set(sqs, settings, stop)
        for resolved in queue_set:
            warn_low_receive_count(resolved, registry)
        ledger: Any = None
        workflows: Any = None
        routes = [Route(Queue(sqs, q.queue_url), Queue(sqs, q.dlq_url), q.weight) for q in queue_set]
        gate = None
        if settings.idempotency_table:
            from worker.idempotency import Ledger

            dynamodb = await stack.enter_async_context(async_client("dynamodb", config=config, connection=connection))
            await check_table(dynamodb, settings.idempotency_table)
            ledger = Ledger(dynamodb, settings.idempotency_table, owner=worker_id())
            stack.push_async_callback(ledger.aclose)
            from worker.workflows import WorkflowHooks, WorkflowStore

            # a workflow's next steps go to the first queue of a set (and its DLQ)
            store = WorkflowStore(dynamodb, settings.idempotency_table)
            workflows = WorkflowHooks(store, queue=routes[0].queue, dlq=routes[0].dlq)
            gate = shared_gate(dynamodb, settings.idempotency_table, owner=ledger.owner)
        else:
            gate = local_gate(registry)
        yield Worker(
            registry=registry,
            routes=routes,
            mode=settings.queues_mode,
            options=RuntimeOptions(
                concurrency=settings.concurrency,
                prefetch=settings.prefetch,
                visibility_timeout_s=settings.visibility_timeout_s,
                shutdown_grace_s=settings.shutdown_grace_s,
                poll_wait_s=settings.poll_wait_s,
            ),
            observers=observers,
            ledger=ledger,
            workflows=workflows,
            gate=gate,
        )
