"""Assembling a worker from settings: AWS clients, queue URLs, the DLQ, the ledger, observers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import BotoCoreError, ClientError

from worker.errors import ConfigError, QueueUnavailable
from worker.events import Observers
from worker.jobs import Registry
from worker.names import default_dlq_name, queue_name_of
from worker.runtime import RuntimeOptions, Worker, receive_loops
from worker.settings import WorkerSettings, aws_region
from worker.sqs import Queue, is_transient, redrive_target_url, resolve_queue_url

if TYPE_CHECKING:
    from types_aiobotocore_sqs import SQSClient


#: A connection that SQS does not accept within this is given up (the call is retried on a new one).
CONNECT_TIMEOUT_S = 3
#: Beyond the long poll's wait: an answer later than this is given up as a stalled connection.
READ_TIMEOUT_MARGIN_S = 5


def worker_id() -> str:
    """Names this process in leases and logs: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def client_config(settings: WorkerSettings) -> AioConfig:
    return AioConfig(
        max_pool_connections=receive_loops(settings.concurrency) + 16,
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=settings.poll_wait_s + READ_TIMEOUT_MARGIN_S,
        retries={"mode": "standard", "total_max_attempts": 3},
    )


async def resolve_dlq_url(client: SQSClient, settings: WorkerSettings, queue_url: str) -> str:
    """WORKER_DEAD_LETTER_QUEUE, else the queue's redrive target, else ``<queue>-dlq``."""
    if settings.dead_letter_queue:
        candidate = settings.dead_letter_queue
    else:
        target = await redrive_target_url(client, queue_url)
        if target is not None:
            return target
        candidate = default_dlq_name(queue_name_of(queue_url))
    try:
        return await resolve_queue_url(client, candidate)
    except ConfigError as exc:
        raise ConfigError(
            f"dead-letter queue {candidate!r} does not exist: run `sqs-worker bootstrap` "
            "or set WORKER_DEAD_LETTER_QUEUE"
        ) from exc


async def wait_for_endpoint(client: SQSClient, settings: WorkerSettings, stop: asyncio.Event) -> tuple[str, str]:
    """Resolve the queue and DLQ URLs, waiting out an unreachable endpoint (until ``stop``)."""
    import logging

    log = logging.getLogger("worker")
    delay_s = 0.5
    warned = False
    while True:
        try:
            queue_url = await resolve_queue_url(client, settings.queue)
            return queue_url, await resolve_dlq_url(client, settings, queue_url)
        except QueueUnavailable as exc:
            if not warned:
                log.warning("sqs unreachable at start, waiting for it: %s", exc)
                warned = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay_s)
            if stop.is_set():
                raise
            delay_s = min(delay_s * 2, 20.0)


async def check_table(client: Any, table: str) -> None:
    """A missing or forbidden table stops the start; an unreachable endpoint does not (the worker fails closed
    until it is back). One GetItem: the task role may read items, not describe tables."""
    from worker.idempotency import KEY_ATTRIBUTE

    try:
        await client.get_item(TableName=table, Key={KEY_ATTRIBUTE: {"S": "sqs-worker:startup-check"}})
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "ResourceNotFoundException":
            raise ConfigError(
                f"idempotency table {table!r} does not exist: "
                "run `sqs-worker bootstrap` or fix WORKER_IDEMPOTENCY_TABLE"
            ) from exc
        if not is_transient(exc):
            raise ConfigError(f"idempotency table {table!r}: {exc}") from exc
    except (BotoCoreError, OSError, TimeoutError):
        return


@contextlib.asynccontextmanager
async def open_worker(
    settings: WorkerSettings,
    registry: Registry,
    *,
    stop: asyncio.Event,
    observers: Observers | None = None,
) -> AsyncIterator[Worker]:
    """A Worker wired to the configured queue, DLQ and (when configured) idempotency table."""
    if len(registry) == 0:
        raise ConfigError("no job handlers registered: set WORKER_HANDLERS to the modules that define @job handlers")
    guarded = [spec.name for spec in registry.specs() if spec.uses_ledger]
    if guarded and not settings.idempotency_table:
        raise ConfigError(
            f"job(s) {', '.join(guarded)} are idempotent but WORKER_IDEMPOTENCY_TABLE is not set: "
            "they would run unguarded"
        )
    session = get_session()
    region = aws_region()
    config = client_config(settings)
    async with contextlib.AsyncExitStack() as stack:
        sqs: SQSClient = await stack.enter_async_context(
            session.create_client("sqs", region_name=region, config=config)
        )
        queue_url, dlq_url = await wait_for_endpoint(sqs, settings, stop)
        ledger: Any = None
        if settings.idempotency_table:
            from worker.idempotency import Ledger

            dynamodb = await stack.enter_async_context(
                session.create_client("dynamodb", region_name=region, config=config)
            )
            await check_table(dynamodb, settings.idempotency_table)
            ledger = Ledger(dynamodb, settings.idempotency_table, owner=worker_id())
            stack.push_async_callback(ledger.aclose)
        yield Worker(
            registry=registry,
            queue=Queue(sqs, queue_url),
            dlq=Queue(sqs, dlq_url),
            options=RuntimeOptions(
                concurrency=settings.concurrency,
                visibility_timeout_s=settings.visibility_timeout_s,
                shutdown_grace_s=settings.shutdown_grace_s,
                poll_wait_s=settings.poll_wait_s,
            ),
            observers=observers,
            ledger=ledger,
        )
