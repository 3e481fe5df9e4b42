"""Running the real worker in-process against a local AWS endpoint, and watching what it does."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import boto3
import pytest
from aiobotocore.session import get_session

from tests.support.memory import MemorySQSClient, broker_of, is_memory, memory_queue
from tests.support.virtualtime import virtual_time
from worker.backends.memory import MemoryQueue
from worker.backends.protocols import MessageQueue
from worker.backends.sqs import Queue
from worker.jobs import Registry
from worker.observability.events import Event, Kind, Observers
from worker.ops.bootstrap import Created, ensure_queues
from worker.runtime.clock import SYSTEM_CLOCK, Clock
from worker.runtime.worker import RuntimeOptions, Worker


def sqs_client(endpoint_url: str) -> Any:
    """A blocking SQS client of the backend (on the memory backend, a boto3-shaped client over its broker)."""
    if is_memory(endpoint_url):
        return MemorySQSClient(endpoint_url)
    return boto3.client("sqs", endpoint_url=endpoint_url, region_name="us-east-1")


def clock_of(endpoint_url: str) -> Clock:
    """The clock the worker reads on this backend: the memory broker's (it skips ahead), else the system's."""
    return broker_of(endpoint_url).clock if is_memory(endpoint_url) else SYSTEM_CLOCK


def make_queues(endpoint_url: str, *, fifo: bool = False, max_receive_count: int = 10) -> Created:
    name = f"q-{uuid.uuid4().hex[:10]}" + (".fifo" if fifo else "")
    return ensure_queues(sqs_client(endpoint_url), name, max_receive_count=max_receive_count)


class Recorder:
    """An Observer that keeps every event and lets a test await a condition on them."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.connectivity_changes: list[tuple[str, bool]] = []
        self.gauges: list[tuple[int, int]] = []
        self.stuck_threads: list[int] = []
        self._changed = asyncio.Event()

    def emit(self, event: Event) -> None:
        self.events.append(event)
        self._changed.set()

    def gauge(self, *, in_flight: int, free_slots: int, stuck_threads: int = 0) -> None:
        self.gauges.append((in_flight, free_slots))
        self.stuck_threads.append(stuck_threads)
        self._changed.set()

    def connectivity(self, *, service: str, reachable: bool) -> None:
        self.connectivity_changes.append((service, reachable))
        self._changed.set()

    def of(self, kind: Kind) -> list[Event]:
        return [e for e in self.events if e.kind is kind]

    async def wait_for(self, condition: Callable[[Recorder], bool], timeout_s: float = 30.0) -> None:
        async def waiter() -> None:
            while not condition(self):
                self._changed.clear()
                await self._changed.wait()

        try:
            await asyncio.wait_for(waiter(), timeout=timeout_s)
        except TimeoutError:
            kinds = [(e.kind.value, e.job_type, e.attempt, e.category) for e in self.events]
            raise AssertionError(f"condition not met within {timeout_s} s; events: {kinds}") from None

    async def wait_count(self, kind: Kind, count: int, timeout_s: float = 30.0) -> list[Event]:
        await self.wait_for(lambda r: len(r.of(kind)) >= count, timeout_s)
        return self.of(kind)


@dataclass
class Running:
    worker: Worker
    recorder: Recorder
    stop: asyncio.Event
    task: asyncio.Task[None]


@contextlib.asynccontextmanager
async def running_worker(
    endpoint_url: str,
    queues: Created,
    registry: Registry,
    *,
    concurrency: int = 4,
    prefetch: int = 0,
    visibility_timeout_s: int = 30,
    shutdown_grace_s: float = 10.0,
    poll_wait_s: int = 1,
    max_hop_s: int = 900,
    ledger: Any = None,
    rng: random.Random | None = None,
    workflows: Callable[[Any, Any], Any] | None = None,
    gate: Any = None,
    queue_type: type[MemoryQueue] = MemoryQueue,
) -> AsyncIterator[Running]:
    """``workflows``: makes the worker's WorkflowHooks from its queue and DLQ. ``queue_type``: the worker's queue
    on the memory backend (``LingeringQueue``: long polls that outlive their caller, as on SQS)."""
    async with contextlib.AsyncExitStack() as stack:
        queue: MessageQueue
        dlq: MessageQueue
        clock: Clock = SYSTEM_CLOCK
        if is_memory(endpoint_url):
            queue, dlq = memory_queue(queues.queue_url, queue_type), memory_queue(queues.dlq_url)
            clock = clock_of(endpoint_url)
        else:
            client = await stack.enter_async_context(
                get_session().create_client("sqs", endpoint_url=endpoint_url, region_name="us-east-1")
            )
            queue, dlq = Queue(client, queues.queue_url), Queue(client, queues.dlq_url)
        recorder = Recorder()
        worker = Worker(
            registry=registry,
            queue=queue,
            dlq=dlq,
            options=RuntimeOptions(
                concurrency=concurrency,
                prefetch=prefetch,
                visibility_timeout_s=visibility_timeout_s,
                shutdown_grace_s=shutdown_grace_s,
                poll_wait_s=poll_wait_s,
                max_hop_s=max_hop_s,
            ),
            observers=Observers([recorder]),
            ledger=ledger,
            rng=rng,
            workflows=workflows(queue, dlq) if workflows is not None else None,
            gate=gate,
            clock=clock,
        )
        if is_memory(endpoint_url):
            # Plain def handlers run in threads, in real time: no skipping while the worker waits for one, or one
            # it gave up on (stuck) still runs.
            threads = worker._threads
            stack.enter_context(
                virtual_time(broker_of(endpoint_url).clock, realtime=lambda: threads.awaited + threads.stuck > 0)
            )
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        running = Running(worker, recorder, stop, task)
        try:
            yield running
        finally:
            stop.set()
            await asyncio.wait_for(task, timeout=shutdown_grace_s + 30)


def send(endpoint_url: str, queue_url: str, body: str | dict[str, Any], **kwargs: Any) -> str:
    text = body if isinstance(body, str) else json.dumps(body)
    response = sqs_client(endpoint_url).send_message(QueueUrl=queue_url, MessageBody=text, **kwargs)
    message_id: str = response["MessageId"]
    return message_id


def drain(endpoint_url: str, queue_url: str, *, expect: int, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """Receive (and delete) until ``expect`` messages were seen or the time is up.

    For reading what a queue holds; never to prove a message is gone (an invisible one is not received):
    that is ``tests.support.queues.assert_queue_empty``.
    """
    import time

    client = sqs_client(endpoint_url)
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout_s
    while len(seen) < expect and time.monotonic() < deadline:
        response = client.receive_message(
            QueueUrl=queue_url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=1,
            MessageAttributeNames=["All"],
            MessageSystemAttributeNames=["All"],
        )
        for message in response.get("Messages", []):
            seen.append(message)
            client.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
    return seen


async def start_warnings(registry: Registry, caplog: pytest.LogCaptureFixture) -> list[str]:
    """The warnings (logger ``worker``) the registry's lifespans log as a worker starts and stops."""
    from worker.lifecycle import open_lifespans

    caplog.clear()
    with caplog.at_level("WARNING", logger="worker"):
        async with open_lifespans(registry.lifespans):
            pass
    return [r.getMessage() for r in caplog.records if r.name == "worker"]
