"""Promises no other test could fail on: each test here turns red under one breakage of ``tests/mutations.py``
(shutdown release, refused deletes, the worker's jitter, bootstrap's redrive policy, the redrive limit)."""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from typing import Any

import pytest
from aiobotocore.session import get_session

from tests.support.backends import Backend
from tests.support.harness import make_queues, running_worker, send, sqs_client
from tests.support.memory import LingeringQueue
from tests.support.queues import assert_queue_empty, message_count, queue_counts
from worker.backends.batching import EntryFailed
from worker.backends.sqs import Queue
from worker.jobs import Registry
from worker.observability.events import Kind
from worker.ops.bootstrap import ensure_queues
from worker.ops.dlq import DeadLetterQueue, redrive_by_receiving
from worker.ops.progress import RateLimiter
from worker.runtime.worker import Worker


@pytest.mark.memory
async def test_shutdown_releases_unstarted_and_cancelled_messages(backend: Backend) -> None:
    """At shutdown a message waiting its turn in a FIFO group and a job cancelled after the grace period are both
    put back at once (visible), not left invisible for a whole visibility timeout."""
    queues = make_queues(backend.endpoint_url, fifo=True)
    registry = Registry()

    @registry.job("block", timeout_s=120)
    async def block(payload: dict[str, Any]) -> None:
        await asyncio.Event().wait()  # runs until cancelled

    client = sqs_client(backend.endpoint_url)
    for n in (1, 2):
        client.send_message(
            QueueUrl=queues.queue_url,
            MessageBody=json.dumps({"type": "block", "payload": {"n": n}}),
            MessageGroupId="g",
            MessageDeduplicationId=f"g-{n}",
        )
    async with running_worker(
        backend.endpoint_url, queues, registry, concurrency=2, visibility_timeout_s=60, shutdown_grace_s=0.5
    ) as running:
        await running.recorder.wait_count(Kind.RECEIVED, 2)  # the second waits behind the first in its group
        await running.recorder.wait_count(Kind.STARTED, 1)
    released = running.recorder.of(Kind.RELEASED)
    assert sorted(e.reason or "" for e in released) == ["cancelled at shutdown", "shutdown"]
    # Visible again as soon as the long polls the shutdown abandoned have ended (poll_wait_s 1 s, + 1 s), not
    # after the 60 s visibility timeout.
    assert all((e.delay_s or 0) <= 2 for e in released), released
    await wait_until_counts(client, queues.queue_url, visible=2, timeout_s=5)


async def wait_until_counts(client: Any, queue_url: str, *, visible: int, timeout_s: float) -> None:
    """Bounded polling of the queue's counts (SQS has no event for a message turning visible)."""
    loop = asyncio.get_running_loop()  # on the memory backend its clock skips ahead (tests/support/virtualtime.py)
    deadline = loop.time() + timeout_s
    while True:
        counts = queue_counts(client, queue_url)
        if counts["ApproximateNumberOfMessages"] == visible and counts["ApproximateNumberOfMessagesNotVisible"] == 0:
            return
        assert loop.time() < deadline, f"not {visible} visible within {timeout_s} s: {counts}"
        await asyncio.sleep(0.1)


@pytest.mark.memory
async def test_a_release_at_shutdown_outlasts_the_abandoned_long_polls(backend: Backend) -> None:
    """At shutdown the worker abandons its long polls, but SQS keeps them open: a message released at visibility 0
    went to one of them and stayed invisible for a whole visibility timeout (with one more receive counted). The
    release waits out those polls instead: visible again within poll_wait_s + 1 s, received once."""
    queues = make_queues(backend.endpoint_url)
    registry = Registry()

    @registry.job("block", timeout_s=120)
    async def block(payload: dict[str, Any]) -> None:
        await asyncio.Event().wait()  # runs until cancelled

    client = sqs_client(backend.endpoint_url)
    send(backend.endpoint_url, queues.queue_url, {"type": "block", "payload": {}})
    async with running_worker(
        backend.endpoint_url,
        queues,
        registry,
        concurrency=2,
        visibility_timeout_s=60,
        shutdown_grace_s=0.2,
        poll_wait_s=3,
    ) as running:
        await running.recorder.wait_count(Kind.STARTED, 1)
        await asyncio.sleep(0.3)  # the other receive loops are in their long polls now (nothing to await across HTTP)
    [released] = running.recorder.of(Kind.RELEASED)
    assert 0 < (released.delay_s or 0) <= 4, released
    # Past the end of every poll the shutdown abandoned (SQS's own deadline: no event to await), the message
    # must be visible; taken by an abandoned poll it would be invisible for its 60 s visibility timeout.
    await asyncio.sleep(max(0.0, running.worker._abandoned_until - running.worker.clock.monotonic()) + 0.5)
    await wait_until_counts(client, queues.queue_url, visible=1, timeout_s=5)
    [message] = client.receive_message(
        QueueUrl=queues.queue_url,
        AttributeNames=["ApproximateReceiveCount"],
        MessageAttributeNames=["All"],
        WaitTimeSeconds=1,
    )["Messages"]
    # Held back as a copy carrying its counts (worker.flow.attempts): one receive before it, this one its first.
    assert message["MessageAttributes"]["sqs_worker_receives"]["StringValue"] == "1"
    assert message["MessageAttributes"]["sqs_worker_runs"]["StringValue"] == "0"  # the cancelled run is no attempt
    assert message["Attributes"]["ApproximateReceiveCount"] == "1", "an abandoned long poll took it first"


@pytest.mark.parametrize("guarded", [True, False], ids=["guarded", "released-at-once"])
async def test_an_abandoned_poll_held_open_never_takes_the_released_message(
    memory_backend: Backend, monkeypatch: pytest.MonkeyPatch, guarded: bool
) -> None:
    """The deterministic twin of the test above, on the memory backend only: its queue keeps every receive the
    worker abandons at shutdown open until the receive's own wait ends, as SQS does (``LingeringQueue``), and the
    test decides when they end. Released at once, the message goes to one of them (the race the guard closes);
    released after them, it never does."""
    endpoint = memory_backend.endpoint_url
    queues = make_queues(endpoint)
    registry = Registry()

    @registry.job("block", timeout_s=120)
    async def block(payload: dict[str, Any]) -> None:
        await asyncio.Event().wait()  # runs until cancelled

    if not guarded:
        monkeypatch.setattr(Worker, "_release_delay_s", lambda self: 0)
    send(endpoint, queues.queue_url, {"type": "block", "payload": {}})
    async with running_worker(
        endpoint,
        queues,
        registry,
        concurrency=2,
        visibility_timeout_s=60,
        shutdown_grace_s=0.2,
        poll_wait_s=3,
        queue_type=LingeringQueue,
    ) as running:
        queue = running.worker.queue
        assert isinstance(queue, LingeringQueue)
        await running.recorder.wait_count(Kind.STARTED, 1)
        await running.recorder.wait_for(lambda _: bool(queue.polls))  # a free slot's long poll is open
    [released] = running.recorder.of(Kind.RELEASED)
    if not guarded:  # an abandoned poll took the message as soon as it was released; nobody reads it
        await asyncio.gather(*queue.polls)
        assert [m.receive_count for m in queue.orphaned] == [1], queue.orphaned
        return
    assert queue.polls, "the polls the shutdown abandoned are still open at the queue"
    await asyncio.gather(*queue.polls)  # now let them end (on the broker's clock: at once), empty
    assert queue.orphaned == []
    assert 0 < (released.delay_s or 0) <= 4, released
    client = sqs_client(endpoint)
    [message] = client.receive_message(QueueUrl=queues.queue_url, MessageAttributeNames=["All"], WaitTimeSeconds=5)[
        "Messages"
    ]
    assert message["MessageAttributes"]["sqs_worker_receives"]["StringValue"] == "1"


async def test_a_refused_delete_is_reported_to_its_caller_alone(backend: Backend) -> None:
    """Two deletes share one DeleteMessageBatch; SQS refuses one entry: that caller gets EntryFailed, the other
    message is deleted."""
    queues = make_queues(backend.endpoint_url)
    send(backend.endpoint_url, queues.queue_url, {"type": "t", "payload": {}})
    async with get_session().create_client("sqs", endpoint_url=backend.endpoint_url, region_name="us-east-1") as client:
        queue = Queue(client, queues.queue_url)
        [message] = await queue.receive(max_messages=1, wait_s=5, visibility_timeout_s=60)
        good, refused = await asyncio.gather(
            queue.delete(message.receipt_handle), queue.delete("not-a-receipt-handle"), return_exceptions=True
        )
    assert queue.deleter.calls == 1  # one batch of two entries
    assert good is None
    assert isinstance(refused, EntryFailed), f"the refused entry was reported as {refused!r}"
    assert_queue_empty(sqs_client(backend.endpoint_url), queues.queue_url)


class Draws(random.Random):
    """A random source that always draws ``value``: the jitter the worker applies becomes predictable."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


@pytest.mark.memory
async def test_retry_delays_are_drawn_from_the_workers_random_source(backend: Backend) -> None:
    """The runtime jitters each retry with its injected random source: a draw of 0 gives the 50% end."""
    queues = make_queues(backend.endpoint_url)
    registry = Registry()

    @registry.job("flaky", max_attempts=3, backoff_base_s=8, backoff_max_s=8)
    async def flaky(payload: dict[str, Any]) -> None:
        raise ConnectionError("upstream refused")

    async with running_worker(backend.endpoint_url, queues, registry, rng=Draws(0.0)) as running:
        send(backend.endpoint_url, queues.queue_url, {"type": "flaky", "payload": {}})
        [retry] = await running.recorder.wait_count(Kind.RETRY_SCHEDULED, 1)
    assert retry.delay_s == 4  # 50% of 8 s; without the draw it would be the full 8


def test_bootstrap_sets_the_redrive_policy_it_reports(backend: Backend) -> None:
    """The queue's redrive policy (the safety net for messages that crash the process) names the DLQ and the
    maxReceiveCount bootstrap was given, also when bootstrap runs again with another count."""
    client = sqs_client(backend.endpoint_url)
    name = f"boot-{uuid.uuid4().hex[:8]}"
    for count in (3, 4):
        created = ensure_queues(client, name, max_receive_count=count)
        policy = json.loads(
            client.get_queue_attributes(QueueUrl=created.queue_url, AttributeNames=["RedrivePolicy"])["Attributes"][
                "RedrivePolicy"
            ]
        )
        dlq_arn = client.get_queue_attributes(QueueUrl=created.dlq_url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        assert created.max_receive_count == count
        assert int(policy["maxReceiveCount"]) == count
        assert policy["deadLetterTargetArn"] == dlq_arn


def test_a_redrive_moves_no_more_than_its_limit(backend: Backend) -> None:
    queues = make_queues(backend.endpoint_url)
    client = sqs_client(backend.endpoint_url)
    for n in range(5):
        client.send_message(QueueUrl=queues.dlq_url, MessageBody=json.dumps({"type": "t", "payload": {"n": n}}))
    dlq = DeadLetterQueue(client, dlq_url=queues.dlq_url, source_url=queues.queue_url)
    result = redrive_by_receiving(dlq, limiter=RateLimiter(None), snapshot=dlq.snapshot(), limit=2)
    assert (result.moved, result.failed) == (2, [])
    assert message_count(client, queues.queue_url) == 2
    assert message_count(client, queues.dlq_url) == 3
