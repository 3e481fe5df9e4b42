"""``WORKER_PREFETCH``: messages held beyond the concurrency start as jobs end, never more than the concurrency run
at once, and at shutdown the prefetched ones go back at once, unrun and uncounted."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.support.backends import Backend
from tests.support.harness import make_queues, running_worker, send, sqs_client
from tests.support.queues import assert_queue_empty, queue_counts
from tests.test_receive_loops import ScriptedQueue
from worker.backends.batching import EntryFailed
from worker.backends.sqs import Message
from worker.errors import QueueUnavailable
from worker.jobs import Registry
from worker.observability.events import Event, Kind, Observers
from worker.ops.bootstrap import Created
from worker.runtime.clock import SYSTEM_CLOCK, Clock
from worker.runtime.starts import Starts
from worker.runtime.worker import RuntimeOptions, Worker

pytestmark = pytest.mark.memory


class Gated:
    """``hold`` jobs that wait until the test opens their gate, counting how many run at once."""

    def __init__(self) -> None:
        self.registry = Registry()
        self.open = asyncio.Event()
        self.active = 0
        self.most_active = 0
        self.ran: list[int] = []

        @self.registry.job("hold")
        async def hold(payload: dict[str, int]) -> None:
            self.active += 1
            self.most_active = max(self.most_active, self.active)
            try:
                await self.open.wait()
                self.ran.append(payload["n"])
            finally:
                self.active -= 1


def hold(n: int) -> dict[str, Any]:
    return {"type": "hold", "payload": {"n": n}}


async def test_prefetched_messages_are_held_but_at_most_the_concurrency_runs(backend: Backend) -> None:
    queues = make_queues(backend.endpoint_url)
    gated = Gated()
    client = sqs_client(backend.endpoint_url)
    for n in range(8):
        send(backend.endpoint_url, queues.queue_url, hold(n))
    async with running_worker(backend.endpoint_url, queues, gated.registry, concurrency=2, prefetch=3) as running:
        await running.recorder.wait_count(Kind.RECEIVED, 5)
        await running.recorder.wait_count(Kind.STARTED, 2)
        # Held: 2 running and 3 waiting, all claimed at SQS (in flight); the other 3 still visible.
        counts = queue_counts(client, queues.queue_url)
        assert counts["ApproximateNumberOfMessagesNotVisible"] == 5
        assert counts["ApproximateNumberOfMessages"] == 3
        assert len(running.recorder.of(Kind.RECEIVED)) == 5
        assert len(running.recorder.of(Kind.STARTED)) == 2
        assert running.worker.in_flight == 5
        gated.open.set()
        await running.recorder.wait_count(Kind.SUCCEEDED, 8)
    assert gated.most_active == 2
    assert sorted(gated.ran) == list(range(8))
    assert_queue_empty(client, queues.queue_url)


async def sigterm_with_one_running(backend: Backend, queues: Created, gated: Gated) -> tuple[list[Event], list[Event]]:
    """Concurrency 1, prefetch 2, three messages held: SIGTERM while the one job runs. The messages released before
    that job may end (the held two must not wait for its grace), and the started events."""
    async with running_worker(
        backend.endpoint_url, queues, gated.registry, concurrency=1, prefetch=2, shutdown_grace_s=20
    ) as running:
        await running.recorder.wait_count(Kind.RECEIVED, 3)
        await running.recorder.wait_count(Kind.STARTED, 1)
        running.stop.set()
        released = await running.recorder.wait_count(Kind.RELEASED, 2)
        assert gated.active == 1 and len(running.recorder.of(Kind.STARTED)) == 1
        gated.open.set()
        await running.recorder.wait_count(Kind.SUCCEEDED, 1)
    return released, running.recorder.of(Kind.STARTED)


async def test_at_shutdown_prefetched_messages_go_back_at_once_unrun_and_uncounted(backend: Backend) -> None:
    queues = make_queues(backend.endpoint_url)
    gated = Gated()
    for n in range(3):
        send(backend.endpoint_url, queues.queue_url, hold(n))
    released, first_run = await sigterm_with_one_running(backend, queues, gated)
    started_first = {event.message_id for event in first_run}
    released_ids = {event.message_id for event in released}
    assert not started_first & released_ids
    # The next worker runs them as their first attempt: being prefetched and released cost them nothing.
    async with running_worker(backend.endpoint_url, queues, gated.registry, concurrency=1, prefetch=2) as again:
        started = await again.recorder.wait_count(Kind.STARTED, 2)
        await again.recorder.wait_count(Kind.SUCCEEDED, 2)
    assert [event.attempt for event in started] == [1, 1]
    assert sorted(gated.ran) == [0, 1, 2]
    assert_queue_empty(sqs_client(backend.endpoint_url), queues.queue_url)


class ThreeThenStall(ScriptedQueue):
    """The first receive brings three ``hold`` jobs; every later receive stalls (cancelled at shutdown)."""

    async def receive(self, *, max_messages: int, wait_s: int, visibility_timeout_s: int) -> list[Message]:
        self.calls += 1
        if self.calls == 1:
            self.asked = max_messages
            return [
                Message(f"id-{n}", f"handle-{n}", json.dumps(hold(n)), {"ApproximateReceiveCount": "1"}, {})
                for n in range(min(3, max_messages))
            ]
        await asyncio.Event().wait()
        return []


async def test_a_prefetched_job_starts_when_one_ends_without_another_receive() -> None:
    """Concurrency 1, prefetch 2: one receive brings three jobs; every later receive stalls, so the second and
    third can only start from what the worker already holds, each as the one before it ends."""
    queue = ThreeThenStall("jobs")
    registry = Registry()
    gates = [asyncio.Event() for _ in range(3)]
    started: list[int] = []
    changed = asyncio.Event()

    @registry.job("hold")
    async def run(payload: dict[str, int]) -> None:
        started.append(payload["n"])
        changed.set()
        await gates[payload["n"]].wait()

    async def started_count(count: int) -> None:
        while len(started) < count:
            changed.clear()
            await changed.wait()

    worker = Worker(
        registry=registry,
        queue=queue,
        dlq=ScriptedQueue("dlq"),
        options=RuntimeOptions(concurrency=1, prefetch=2, visibility_timeout_s=30, shutdown_grace_s=5, poll_wait_s=20),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        await asyncio.wait_for(started_count(1), timeout=5)
        assert queue.asked == 3  # one receive asked for the concurrency and the prefetch
        assert started == [0]
        gates[0].set()
        await asyncio.wait_for(started_count(2), timeout=5)
        assert started == [0, 1]
        gates[1].set()
        await asyncio.wait_for(started_count(3), timeout=5)
        gates[2].set()
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=10)
    assert started == [0, 1, 2]
    assert queue.deleted == ["handle-0", "handle-1", "handle-2"]


async def test_a_fifo_group_member_waits_its_turn_with_prefetched_messages() -> None:
    """Starts hands a freed start to offered items and waiting tasks alike, in the order they came."""
    started: list[str] = []
    starts: Starts[str] = Starts(1, started.append)
    starts.offer("a")
    starts.offer("b")
    assert started == ["a"]
    waiter = asyncio.ensure_future(starts.wait())
    await asyncio.sleep(0)  # the task waits behind b
    starts.offer("c")
    starts.end()  # a's start goes to b
    assert started == ["a", "b"]
    starts.end()  # b's start goes to the waiting task
    assert await asyncio.wait_for(waiter, timeout=1)
    assert started == ["a", "b"] and starts.running == 1
    assert starts.close() == ["c"]
    starts.end()
    assert started == ["a", "b"] and starts.running == 0
    assert not await starts.wait()


async def test_fifo_groups_keep_their_order_with_prefetch(backend: Backend) -> None:
    """Concurrency 1, prefetch 5: six messages of two groups are held at once; each group runs in order, one job
    at a time."""
    queues = make_queues(backend.endpoint_url, fifo=True)
    gated = Gated()
    gated.open.set()
    client = sqs_client(backend.endpoint_url)
    for n in range(6):
        client.send_message(
            QueueUrl=queues.queue_url,
            MessageBody=json.dumps(hold(n)),
            MessageGroupId="even" if n % 2 == 0 else "odd",
            MessageDeduplicationId=f"m-{n}",
        )
    async with running_worker(backend.endpoint_url, queues, gated.registry, concurrency=1, prefetch=5) as running:
        await running.recorder.wait_count(Kind.SUCCEEDED, 6)
    assert gated.most_active == 1
    assert [n for n in gated.ran if n % 2 == 0] == [0, 2, 4]
    assert [n for n in gated.ran if n % 2 == 1] == [1, 3, 5]
    assert_queue_empty(client, queues.queue_url)


async def test_at_shutdown_fifo_members_waiting_for_a_start_go_back_unrun(backend: Backend) -> None:
    """Concurrency 1, prefetch 2 on a FIFO queue: group a's job runs; group b's two wait (the first for a start,
    the second behind it). SIGTERM releases both at once, while a's job still has its grace."""
    queues = make_queues(backend.endpoint_url, fifo=True)
    gated = Gated()
    client = sqs_client(backend.endpoint_url)
    for n, group in ((0, "a"), (1, "b"), (2, "b")):
        client.send_message(
            QueueUrl=queues.queue_url,
            MessageBody=json.dumps(hold(n)),
            MessageGroupId=group,
            MessageDeduplicationId=f"m-{n}",
        )
    released, _ = await sigterm_with_one_running(backend, queues, gated)
    assert gated.ran == [0]
    assert {event.reason for event in released} == {"shutdown"}
    async with running_worker(backend.endpoint_url, queues, gated.registry, concurrency=1) as again:
        await again.recorder.wait_count(Kind.SUCCEEDED, 2)
    assert gated.ran == [0, 1, 2]
    assert_queue_empty(client, queues.queue_url)


@contextlib.asynccontextmanager
async def one_slot_two_prefetched(
    queue: ScriptedQueue, registry: Registry, observer: Any, *, visibility_timeout_s: int, clock: Clock = SYSTEM_CLOCK
) -> AsyncIterator[Worker]:
    """A worker of concurrency 1 and prefetch 2 on ``queue``, running until the block ends."""
    worker = Worker(
        registry=registry,
        queue=queue,
        dlq=ScriptedQueue("dlq"),
        options=RuntimeOptions(
            concurrency=1, prefetch=2, visibility_timeout_s=visibility_timeout_s, shutdown_grace_s=5, poll_wait_s=20
        ),
        observers=Observers([observer]),
        clock=clock,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        yield worker
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=10)


class RefusesExtensions(ThreeThenStall):
    """Every visibility change fails as SQS fails it for a claim that lapsed (ReceiptHandleIsInvalid)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.extended: list[str] = []

    async def _visibility_batch(self, items: list[tuple[str, int]]) -> dict[int, EntryFailed]:
        self.extended.extend(handle for handle, _ in items)
        return {index: EntryFailed("ReceiptHandleIsInvalid", "lapsed") for index in range(len(items))}


async def test_a_prefetched_message_whose_claim_lapsed_is_not_started() -> None:
    """Concurrency 1, prefetch 2, a 1 s visibility timeout the heartbeat cannot extend: the waiting messages' claims
    are lost while job 0 runs, so they are not started when it ends (another worker may hold them now)."""
    queue = RefusesExtensions("jobs")
    registry = Registry()
    started: list[int] = []
    release = asyncio.Event()
    lost: list[str] = []
    both_lost, nothing_held = asyncio.Event(), asyncio.Event()

    @registry.job("hold")
    async def run(payload: dict[str, int]) -> None:
        started.append(payload["n"])
        if payload["n"] == 0:
            await release.wait()

    class Lost:
        def emit(self, event: Event) -> None:
            if event.kind is Kind.CLAIM_LOST:
                lost.append(event.message_id)
                if {"id-1", "id-2"} <= set(lost):
                    both_lost.set()

        def gauge(self, *, in_flight: int, **_: Any) -> None:
            if release.is_set() and in_flight == 0:  # the heartbeat's gauge, once a second
                nothing_held.set()

        def connectivity(self, **_: Any) -> None:
            return None

    async with one_slot_two_prefetched(queue, registry, Lost(), visibility_timeout_s=1):
        await asyncio.wait_for(both_lost.wait(), timeout=10)
        release.set()
        await asyncio.wait_for(nothing_held.wait(), timeout=5)  # job 0 ended; the lost two were let go, not run
    assert started == [0]
    assert queue.deleted == ["handle-0"]


class SqsUnreachable(ThreeThenStall):
    """Every visibility change fails as when SQS cannot be reached: the heartbeat cannot extend a claim."""

    async def _visibility_batch(self, items: list[tuple[str, int]]) -> dict[int, EntryFailed]:
        raise QueueUnavailable("ChangeMessageVisibilityBatch: could not connect to the endpoint")


class StoppedClock:
    """A monotonic clock that moves only when the test moves it."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return time.time()


async def test_a_prefetched_message_whose_claim_ran_out_unextended_is_not_started() -> None:
    """Concurrency 1, prefetch 2, SQS unreachable for the heartbeat: no visibility change says the claims are lost,
    but their visibility timeout runs out while job 0 runs (the clock jumps past it), so SQS may hand them to another
    worker. When job 0 ends they are not started: a claim_lost event each, and no delete."""
    queue = SqsUnreachable("jobs")
    clock = StoppedClock()
    registry = Registry()
    started: list[int] = []
    running, release = asyncio.Event(), asyncio.Event()
    received: set[str] = set()
    lost: dict[str, str] = {}
    both_received, both_lost = asyncio.Event(), asyncio.Event()

    @registry.job("hold")
    async def run(payload: dict[str, int]) -> None:
        started.append(payload["n"])
        running.set()
        if payload["n"] == 0:
            await release.wait()

    class Watch:
        def emit(self, event: Event) -> None:
            if event.kind is Kind.RECEIVED:
                received.add(event.message_id)
                if {"id-1", "id-2"} <= received:
                    both_received.set()
            if event.kind is Kind.CLAIM_LOST:
                lost[event.message_id] = event.reason or ""
                if {"id-1", "id-2"} <= set(lost):
                    both_lost.set()

        def gauge(self, **_: Any) -> None:
            return None

        def connectivity(self, **_: Any) -> None:
            return None

    async with one_slot_two_prefetched(queue, registry, Watch(), visibility_timeout_s=30, clock=clock):
        await asyncio.wait_for(asyncio.gather(running.wait(), both_received.wait()), timeout=10)
        clock.now += 31  # past the 30 s claims of the two prefetched messages
        release.set()
        await asyncio.wait_for(both_lost.wait(), timeout=10)
    assert started == [0]
    assert set(lost) == {"id-1", "id-2"}
    assert all("ran out while it waited to start" in reason for reason in lost.values())
    assert queue.deleted == ["handle-0"]
