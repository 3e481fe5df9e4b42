"""One worker consuming a set of queues (WORKER_QUEUES): every queue's jobs run, each dead letter lands in the
DLQ of the queue it came from, and the weighted and strict orders hold (a 1-slot worker, queues preloaded)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any, cast

from aiobotocore.session import get_session

from tests.support.backends import Backend
from tests.support.harness import Recorder, drain, send, sqs_client
from tests.support.queues import assert_queue_empty
from worker import PermanentError
from worker.backends.sqs import Message, Queue
from worker.flow.priorities import Mode
from worker.jobs import Registry
from worker.observability.events import Kind, Observers
from worker.ops.bootstrap import Created, ensure_queues
from worker.runtime.queueset import Route
from worker.runtime.slots import Slots
from worker.runtime.worker import RuntimeOptions, Worker


def make_set(endpoint_url: str, *labels: str) -> dict[str, Created]:
    prefix = f"set-{uuid.uuid4().hex[:8]}"
    client = sqs_client(endpoint_url)
    return {label: ensure_queues(client, f"{prefix}-{label}", max_receive_count=10) for label in labels}


def marks() -> Registry:
    registry = Registry()

    @registry.job("mark")
    async def mark(payload: dict[str, Any]) -> None:
        return None

    @registry.job("refuse")
    async def refuse(payload: dict[str, Any]) -> None:
        raise PermanentError("the account is closed")

    return registry


@contextlib.asynccontextmanager
async def running_set(
    endpoint_url: str, queues: dict[str, Created], weights: dict[str, int], *, mode: Mode, concurrency: int
) -> AsyncIterator[Recorder]:
    async with get_session().create_client("sqs", endpoint_url=endpoint_url, region_name="us-east-1") as client:
        recorder = Recorder()
        routes = [
            Route(Queue(client, created.queue_url), Queue(client, created.dlq_url), weights[label])
            for label, created in queues.items()
        ]
        worker = Worker(
            registry=marks(),
            routes=routes,
            mode=mode,
            options=RuntimeOptions(concurrency=concurrency, visibility_timeout_s=30, shutdown_grace_s=5, poll_wait_s=1),
            observers=Observers([recorder]),
        )
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        try:
            yield recorder
        finally:
            stop.set()
            await asyncio.wait_for(task, timeout=40)


def preload(endpoint_url: str, queue_url: str, count: int) -> None:
    client = sqs_client(endpoint_url)
    for start in range(0, count, 10):
        entries = [
            {"Id": str(n), "MessageBody": json.dumps({"type": "mark", "payload": {"n": n}})}
            for n in range(start, min(count, start + 10))
        ]
        assert not client.send_message_batch(QueueUrl=queue_url, Entries=entries).get("Failed")


async def test_every_queue_runs_and_dead_letters_go_to_their_own_dlq(backend: Backend) -> None:
    queues = make_set(backend.endpoint_url, "critical", "default", "bulk")
    url = backend.endpoint_url
    for label in queues:
        preload(url, queues[label].queue_url, 3)
    send(url, queues["bulk"].queue_url, {"type": "refuse", "payload": {"order": 7}})
    send(url, queues["critical"].queue_url, "not an envelope")
    weights = {"critical": 10, "default": 3, "bulk": 1}
    async with running_set(url, queues, weights, mode=Mode.WEIGHTED, concurrency=4) as recorder:
        await recorder.wait_count(Kind.SUCCEEDED, 9)
        dead = await recorder.wait_count(Kind.DEAD_LETTERED, 2)
    names = {label: created.queue_url.rsplit("/", 1)[-1] for label, created in queues.items()}
    started = [event.queue for event in recorder.of(Kind.STARTED)]
    assert sorted(started) == sorted([names["critical"]] * 3 + [names["default"]] * 3 + [names["bulk"]] * 4)
    assert {(event.queue, event.category) for event in dead} == {
        (names["bulk"], "permanent"),
        (names["critical"], "invalid_message"),
    }
    bulk_dead = drain(url, queues["bulk"].dlq_url, expect=1)
    assert [json.loads(m["Body"]) for m in bulk_dead] == [{"type": "refuse", "payload": {"order": 7}}]
    attributes = {key: value["StringValue"] for key, value in bulk_dead[0]["MessageAttributes"].items()}
    assert attributes["error_category"] == "permanent"
    assert attributes["error_message"] == "PermanentError: the account is closed"
    assert attributes["source_queue"] == names["bulk"]
    assert attributes["attempts"] == "1"
    critical_dead = drain(url, queues["critical"].dlq_url, expect=1)
    assert [m["Body"] for m in critical_dead] == ["not an envelope"]
    client = sqs_client(url)
    for created in queues.values():
        assert_queue_empty(client, created.queue_url)
    assert_queue_empty(client, queues["default"].dlq_url)
    assert_queue_empty(client, queues["bulk"].dlq_url)
    assert_queue_empty(client, queues["critical"].dlq_url)


async def started_order(backend: Backend, *, mode: Mode, weights: dict[str, int], loads: dict[str, int]) -> str:
    """The queues of the jobs a 1-slot worker starts, in order, as one letter each (c, b)."""
    queues = make_set(backend.endpoint_url, *weights)
    for label, count in loads.items():
        preload(backend.endpoint_url, queues[label].queue_url, count)
    letters = {created.queue_url.rsplit("/", 1)[-1]: label[0] for label, created in queues.items()}
    async with running_set(backend.endpoint_url, queues, weights, mode=mode, concurrency=1) as recorder:
        await recorder.wait_count(Kind.SUCCEEDED, sum(loads.values()), timeout_s=60)
    return "".join(letters[event.queue] for event in recorder.of(Kind.STARTED))


async def test_weighted_order_with_one_slot(backend: Backend) -> None:
    order = await started_order(
        backend, mode=Mode.WEIGHTED, weights={"critical": 2, "bulk": 1}, loads={"critical": 6, "bulk": 6}
    )
    assert order == "cbccbccbcbbb"


async def test_strict_order_with_one_slot(backend: Backend) -> None:
    order = await started_order(
        backend, mode=Mode.STRICT, weights={"critical": 5, "bulk": 1}, loads={"critical": 5, "bulk": 4}
    )
    assert order == "cccccbbbb"


class IdleQueue(Queue):
    """An empty queue: each receive is a long poll that never answers (cancelled at shutdown)."""

    def __init__(self, name: str) -> None:
        super().__init__(cast(Any, None), f"http://127.0.0.1:1/000000000000/{name}")
        self.open_polls = 0
        self.asked: list[int] = []
        self.polled = asyncio.Event()

    async def receive(self, *, max_messages: int, wait_s: int, visibility_timeout_s: int) -> list[Message]:
        self.receive_calls += 1
        self.asked.append(max_messages)
        self.open_polls += 1
        self.polled.set()
        try:
            await asyncio.Event().wait()
        finally:
            self.open_polls -= 1
        return []

    async def maximum_message_bytes(self) -> int | None:
        return None  # not readable: the worker's start check then says nothing


async def test_an_idle_set_keeps_one_long_poll_per_queue_holding_one_slot() -> None:
    queues = [IdleQueue(name) for name in ("critical", "default", "bulk")]
    weights = (10, 3, 1)
    worker = Worker(
        registry=marks(),
        routes=[Route(queue, IdleQueue(f"{queue.name}-dlq"), w) for queue, w in zip(queues, weights, strict=True)],
        options=RuntimeOptions(concurrency=20, visibility_timeout_s=30, shutdown_grace_s=1, poll_wait_s=20),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        for queue in queues:
            await asyncio.wait_for(queue.polled.wait(), timeout=5)
        # Three times the first lending delay (0.5 s before any answer was timed): each long poll has lent its
        # slots, and nothing more may happen on idle queues.
        await asyncio.sleep(1.5)
        assert [queue.open_polls for queue in queues] == [1, 1, 1]
        assert [queue.receive_calls for queue in queues] == [1, 1, 1]
        assert worker._slots.free == 17, "each idle long poll lends its slots but one"
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=10)


async def test_a_waiting_message_of_a_higher_queue_gets_the_next_slot_first() -> None:
    slots = Slots(1)
    assert slots.take(1) == 1  # the slot runs a bulk job
    bulk = asyncio.create_task(slots.acquire(timeout_s=5, rank=1))
    await asyncio.sleep(0)
    critical = asyncio.create_task(slots.acquire(timeout_s=5, rank=0))
    await asyncio.sleep(0)
    slots.release(1)
    assert await asyncio.wait_for(critical, timeout=1) is True
    assert not bulk.done(), "the bulk message waits for the slot after"
    slots.release(1)
    assert await asyncio.wait_for(bulk, timeout=1) is True
    assert slots.free == 0
