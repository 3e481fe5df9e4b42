"""Long delays (hops of at most 15 minutes) and attempts that count runs, on the real worker over HTTP."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.support.backends import Backend
from tests.support.harness import drain, make_queues, running_worker, send, sqs_client
from tests.support.queues import assert_queue_empty, queue_counts
from worker import JobContext, RetryableError
from worker.errors import ConfigError
from worker.flow.attempts import RECEIVES_ATTRIBUTE, RUNS_ATTRIBUTE
from worker.flow.delays import DUE_AT_ATTRIBUTE, format_due_at
from worker.jobs import Registry
from worker.observability.events import Kind
from worker.producer import Job, enqueue


def due_attribute(moment: datetime) -> dict[str, Any]:
    return {DUE_AT_ATTRIBUTE: {"DataType": "String", "StringValue": format_due_at(moment)}}


async def test_holds_cost_no_attempts_and_the_dead_letter_shows_runs_and_receives(backend: Backend) -> None:
    """Held back at least 3 times (not yet due, 1 s hops), then failing retryably: still all 3 runs, numbered
    1, 2, 3; the dead-letter record says attempts 3 and receive_count 3 + the holds."""
    queues = make_queues(backend.endpoint_url)
    registry = Registry()
    runs: list[tuple[int, int, float]] = []

    @registry.job("flaky", max_attempts=3)
    async def flaky(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append((ctx.attempt, ctx.receive_count, time.time()))
        raise RetryableError("downstream unavailable", delay_s=0)

    due_at = datetime.now(UTC) + timedelta(seconds=3.5)
    send(
        backend.endpoint_url,
        queues.queue_url,
        {"type": "flaky", "payload": {}},
        MessageAttributes={**due_attribute(due_at), "trace_id": {"DataType": "String", "StringValue": "t-1"}},
    )
    async with running_worker(backend.endpoint_url, queues, registry, poll_wait_s=1, max_hop_s=1) as running:
        await running.recorder.wait_count(Kind.DEAD_LETTERED, 1, timeout_s=60)
    holds = [e for e in running.recorder.of(Kind.RELEASED) if e.reason == "not yet due"]
    assert len(holds) >= 3, running.recorder.events
    assert all(e.attempt == 1 for e in holds)  # a hold is no run: the next run is still the first
    assert [attempt for attempt, _, _ in runs] == [1, 2, 3]
    assert [receives for _, receives, _ in runs] == [len(holds) + 1, len(holds) + 2, len(holds) + 3]
    assert runs[0][2] >= due_at.timestamp()  # never before its due time
    [record] = drain(backend.endpoint_url, queues.dlq_url, expect=1)
    attributes = {name: value["StringValue"] for name, value in record["MessageAttributes"].items()}
    assert attributes["error_category"] == "exhausted"
    assert attributes["attempts"] == "3"
    assert attributes["receive_count"] == str(len(holds) + 3)
    assert attributes["trace_id"] == "t-1"  # the producer's own attributes travel with every copy
    assert RUNS_ATTRIBUTE not in attributes and RECEIVES_ATTRIBUTE not in attributes  # a redrive starts afresh
    assert_queue_empty(sqs_client(backend.endpoint_url), queues.queue_url)


async def test_a_long_delay_runs_once_after_its_due_time(backend: Backend) -> None:
    queues = make_queues(backend.endpoint_url)
    registry = Registry()
    started: list[float] = []

    @registry.job("later")
    async def later(payload: dict[str, Any]) -> None:
        started.append(time.time())

    due_at = datetime.now(UTC) + timedelta(seconds=4.2)
    send(
        backend.endpoint_url,
        queues.queue_url,
        {"type": "later", "payload": {}},
        MessageAttributes=due_attribute(due_at),
    )
    async with running_worker(backend.endpoint_url, queues, registry, poll_wait_s=1, max_hop_s=2) as running:
        await running.recorder.wait_count(Kind.SUCCEEDED, 1, timeout_s=30)
        hops = running.recorder.of(Kind.RELEASED)
        assert 2 <= len(hops) <= 4, hops  # 4.2 s in hops of at most 2 s
        assert all(e.reason == "not yet due" and (e.delay_s or 0) <= 2 for e in hops)
    assert len(started) == 1
    late_s = started[0] - due_at.timestamp()
    assert 0 <= late_s < 2.0, late_s  # waits out the last second itself: starts at its due time
    assert_queue_empty(sqs_client(backend.endpoint_url), queues.queue_url)


async def test_one_real_fifteen_minute_hop(backend: Backend) -> None:
    """A job due in 20 minutes, received at once: not run, sent on a full 900 s hop (a delayed copy), the
    received message deleted."""
    queues = make_queues(backend.endpoint_url)
    registry = Registry()
    calls: list[Any] = []

    @registry.job("later")
    async def later(payload: dict[str, Any]) -> None:
        calls.append(payload)

    due_at = datetime.now(UTC) + timedelta(minutes=20)
    send(
        backend.endpoint_url,
        queues.queue_url,
        {"type": "later", "payload": {}},
        MessageAttributes=due_attribute(due_at),
    )
    async with running_worker(backend.endpoint_url, queues, registry, poll_wait_s=1) as running:
        [hop] = await running.recorder.wait_count(Kind.RELEASED, 1)
        await running.worker.queue.drain()
    assert hop.reason == "not yet due" and hop.delay_s == 900
    assert calls == []
    counts = queue_counts(sqs_client(backend.endpoint_url), queues.queue_url)
    assert counts == {
        "ApproximateNumberOfMessages": 0,
        "ApproximateNumberOfMessagesNotVisible": 0,
        "ApproximateNumberOfMessagesDelayed": 1,
    }


def test_the_producer_sends_long_delays_with_their_due_time(backend: Backend) -> None:
    queues = make_queues(backend.endpoint_url)
    client = sqs_client(backend.endpoint_url)
    before = datetime.now(UTC)
    enqueue(client, queues.queue_url, Job("later", {"n": 1}, delay_s=1200))
    enqueue(client, queues.queue_url, Job("later", {"n": 2}, run_at=before + timedelta(days=30)))
    enqueue(client, queues.queue_url, Job("soon", {"n": 3}, run_at=before - timedelta(seconds=1)))  # due: at once
    assert queue_counts(client, queues.queue_url)["ApproximateNumberOfMessagesDelayed"] == 2
    [now_due] = drain(backend.endpoint_url, queues.queue_url, expect=1, timeout_s=3)
    assert json.loads(now_due["Body"]) == {"type": "soon", "payload": {"n": 3}}  # the envelope as before
    assert DUE_AT_ATTRIBUTE in now_due["MessageAttributes"]


def test_fifo_queues_refuse_per_message_delays(backend: Backend) -> None:
    queues = make_queues(backend.endpoint_url, fifo=True)
    client = sqs_client(backend.endpoint_url)
    for job in (Job("later", delay_s=5), Job("later", run_at=datetime.now(UTC) + timedelta(hours=1))):
        with pytest.raises(ConfigError, match="FIFO queues take no per-message delay"):
            enqueue(client, queues.queue_url, job)
    assert sum(queue_counts(client, queues.queue_url).values()) == 0


async def test_a_due_time_on_a_fifo_message_or_a_malformed_one_is_dead_lettered(backend: Backend) -> None:
    registry = Registry()
    calls: list[Any] = []

    @registry.job("later")
    async def later(payload: dict[str, Any]) -> None:
        calls.append(payload)

    for fifo, text in ((True, format_due_at(datetime.now(UTC) + timedelta(hours=1))), (False, "next tuesday")):
        queues = make_queues(backend.endpoint_url, fifo=fifo)
        extra: dict[str, Any] = {"MessageGroupId": "g", "MessageDeduplicationId": "d"} if fifo else {}
        send(
            backend.endpoint_url,
            queues.queue_url,
            {"type": "later", "payload": {}},
            MessageAttributes={DUE_AT_ATTRIBUTE: {"DataType": "String", "StringValue": text}},
            **extra,
        )
        async with running_worker(backend.endpoint_url, queues, registry, poll_wait_s=1) as running:
            [dead] = await running.recorder.wait_count(Kind.DEAD_LETTERED, 1)
        assert dead.category == "invalid_message"
        assert DUE_AT_ATTRIBUTE in (dead.error or "")
    assert calls == []
