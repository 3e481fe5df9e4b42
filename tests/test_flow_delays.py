"""Long delays (hops of at most 15 minutes) and attempts that count runs, on the real worker over HTTP."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.support.backends import Backend
from tests.support.harness import clock_of, drain, make_queues, running_worker, send, sqs_client
from tests.support.process import cli, worker_env
from tests.support.queues import assert_queue_empty, queue_counts
from worker import JobContext, RetryableError
from worker.errors import ConfigError
from worker.flow.attempts import RECEIVES_ATTRIBUTE, RUNS_ATTRIBUTE
from worker.flow.delays import DUE_AT_ATTRIBUTE, format_due_at, parse_due_at
from worker.jobs import Registry
from worker.observability.events import Kind
from worker.producer import Job, enqueue


def due_attribute(moment: datetime) -> dict[str, Any]:
    return {DUE_AT_ATTRIBUTE: {"DataType": "String", "StringValue": format_due_at(moment)}}


@pytest.mark.memory
async def test_hops_cost_no_attempts_and_the_dead_letter_shows_runs_and_receives(backend: Backend) -> None:
    """Hopped until due (1 s hops: how many depends on the endpoint's latency), then failing retryably: still all
    3 runs, numbered 1, 2, 3; the dead-letter record says attempts 3 and receive_count 3 + the hops."""
    queues = make_queues(backend.endpoint_url)
    clock = clock_of(backend.endpoint_url)  # on memory: the broker's, which skips ahead
    registry = Registry()
    runs: list[tuple[int, int, float]] = []

    @registry.job("flaky", max_attempts=3)
    async def flaky(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append((ctx.attempt, ctx.receive_count, clock.time()))
        raise RetryableError("downstream unavailable", delay_s=0)

    due_at = parse_due_at(format_due_at(datetime.fromtimestamp(clock.time(), UTC) + timedelta(seconds=3.5)))  # in ms
    send(
        backend.endpoint_url,
        queues.queue_url,
        {"type": "flaky", "payload": {}},
        MessageAttributes={**due_attribute(due_at), "trace_id": {"DataType": "String", "StringValue": "t-1"}},
    )
    async with running_worker(backend.endpoint_url, queues, registry, poll_wait_s=1, max_hop_s=1) as running:
        await running.recorder.wait_count(Kind.DEAD_LETTERED, 1, timeout_s=60)
    holds = [e for e in running.recorder.of(Kind.RELEASED) if e.reason == "not yet due"]
    assert len(holds) >= 1, running.recorder.events
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


@pytest.mark.memory
async def test_three_shutdown_holds_then_a_retryable_failure_still_get_every_attempt(backend: Backend) -> None:
    """A job cancelled by three shutdowns in a row (held back each time), then failing retryably: it still gets its
    3 attempts, and its dead-letter record says attempts 3, receive_count 6."""
    queues = make_queues(backend.endpoint_url)
    registry = Registry()
    runs: list[tuple[int, int]] = []

    @registry.job("slow_then_failing", max_attempts=3, timeout_s=60)
    async def slow_then_failing(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append((ctx.attempt, ctx.receive_count))
        if len(runs) <= 3:
            await asyncio.Event().wait()  # runs until the shutdown cancels it
        raise RetryableError("downstream unavailable", delay_s=0)

    send(backend.endpoint_url, queues.queue_url, {"type": "slow_then_failing", "payload": {}})
    for shutdown in range(3):
        async with running_worker(backend.endpoint_url, queues, registry, shutdown_grace_s=0.1) as running:
            await running.recorder.wait_count(Kind.STARTED, 1, timeout_s=30)
        [held] = running.recorder.of(Kind.RELEASED)
        assert held.reason == "cancelled at shutdown", shutdown
    async with running_worker(backend.endpoint_url, queues, registry) as running:
        await running.recorder.wait_count(Kind.DEAD_LETTERED, 1, timeout_s=60)
    assert runs == [(1, 1), (1, 2), (1, 3), (1, 4), (2, 5), (3, 6)]
    [record] = drain(backend.endpoint_url, queues.dlq_url, expect=1)
    attributes = {name: value["StringValue"] for name, value in record["MessageAttributes"].items()}
    assert (attributes["error_category"], attributes["attempts"], attributes["receive_count"]) == (
        "exhausted",
        "3",
        "6",
    )
    assert_queue_empty(sqs_client(backend.endpoint_url), queues.queue_url)


@pytest.mark.memory
async def test_a_long_delay_runs_once_after_its_due_time(backend: Backend) -> None:
    queues = make_queues(backend.endpoint_url)
    clock = clock_of(backend.endpoint_url)  # on memory: the broker's, which skips ahead
    registry = Registry()
    started: list[float] = []

    @registry.job("later")
    async def later(payload: dict[str, Any]) -> None:
        started.append(clock.time())

    due_at = parse_due_at(format_due_at(datetime.fromtimestamp(clock.time(), UTC) + timedelta(seconds=4.2)))  # in ms
    send(
        backend.endpoint_url,
        queues.queue_url,
        {"type": "later", "payload": {}},
        MessageAttributes=due_attribute(due_at),
    )
    async with running_worker(backend.endpoint_url, queues, registry, poll_wait_s=1, max_hop_s=2) as running:
        await running.recorder.wait_count(Kind.SUCCEEDED, 1, timeout_s=30)
        hops = running.recorder.of(Kind.RELEASED)
        assert 1 <= len(hops) <= 4, hops  # 4.2 s in hops of at most 2 s (a late first receive needs fewer)
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


@pytest.mark.memory
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


@pytest.mark.memory
def test_fifo_queues_refuse_per_message_delays(backend: Backend) -> None:
    queues = make_queues(backend.endpoint_url, fifo=True)
    client = sqs_client(backend.endpoint_url)
    for job in (Job("later", delay_s=5), Job("later", run_at=datetime.now(UTC) + timedelta(hours=1))):
        with pytest.raises(ConfigError, match="FIFO queues take no per-message delay"):
            enqueue(client, queues.queue_url, job)
    assert sum(queue_counts(client, queues.queue_url).values()) == 0


@pytest.mark.memory
async def test_a_due_time_on_a_fifo_message_or_a_malformed_one_is_dead_lettered(backend: Backend) -> None:
    registry = Registry()
    calls: list[Any] = []

    @registry.job("later")
    async def later(payload: dict[str, Any]) -> None:
        calls.append(payload)

    cases = [
        (True, format_due_at(datetime.now(UTC) + timedelta(hours=1))),
        (False, "next tuesday"),
        (False, "9999-12-31T00:00:00Z"),  # more than a year ahead: would hop every 15 minutes forever
        (False, format_due_at(datetime.now(UTC) + timedelta(days=366 + 2))),
    ]
    for fifo, text in cases:
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


@pytest.mark.memory
async def test_fifo_releases_are_remembered_and_cost_no_attempt(backend: Backend) -> None:
    """FIFO: B waits behind A in its group and is released (in place: a copy would lose its place) each time A
    fails; those releases are no attempts of B's, which still gets its 2 runs."""
    queues = make_queues(backend.endpoint_url, fifo=True)
    registry = Registry()
    runs: dict[str, list[int]] = {"a": [], "b": []}

    @registry.job("step", max_attempts=2)
    async def step(payload: dict[str, Any], ctx: JobContext) -> None:
        runs[payload["name"]].append(ctx.attempt)
        if payload["name"] == "b" or len(runs["a"]) < 2:
            raise RetryableError("not yet", delay_s=1)

    client = sqs_client(backend.endpoint_url)
    for name in ("a", "b"):
        client.send_message(
            QueueUrl=queues.queue_url,
            MessageBody=json.dumps({"type": "step", "payload": {"name": name}}),
            MessageGroupId="g",
            MessageDeduplicationId=name,
        )
    async with running_worker(backend.endpoint_url, queues, registry) as running:
        [dead] = await running.recorder.wait_count(Kind.DEAD_LETTERED, 1, timeout_s=60)
    assert runs == {"a": [1, 2], "b": [1, 2]}
    released = [e for e in running.recorder.of(Kind.RELEASED) if e.message_id == dead.message_id]
    assert len(released) >= 1  # received with A at first, released when A failed
    assert running.worker.outcomes.holds.count(dead.message_id) == len(released)
    [record] = drain(backend.endpoint_url, queues.dlq_url, expect=1)
    assert record["MessageAttributes"]["attempts"]["StringValue"] == "2"
    assert record["MessageAttributes"]["receive_count"]["StringValue"] == str(2 + len(released))


def test_the_enqueue_command_takes_run_at_and_long_delays(backend: Backend, tmp_path: Path) -> None:
    queues = make_queues(backend.endpoint_url)
    env = worker_env(backend.endpoint_url, WORKER_QUEUE=queues.queue_url, TMP=str(tmp_path))
    client = sqs_client(backend.endpoint_url)
    now_due = format_due_at(datetime.now(UTC) - timedelta(seconds=5)).replace(".000", "")
    result = cli("enqueue", "later", "--payload", '{"n": 1}', "--run-at", now_due, env=env)
    assert result.returncode == 0, result.stderr
    [message] = drain(backend.endpoint_url, queues.queue_url, expect=1, timeout_s=3)
    assert message["MessageId"] == result.stdout.strip()
    assert parse_due_at(message["MessageAttributes"][DUE_AT_ATTRIBUTE]["StringValue"]) == parse_due_at(now_due)
    long = cli("enqueue", "later", "--delay-s", "7200", env=env)
    assert long.returncode == 0, long.stderr
    assert queue_counts(client, queues.queue_url)["ApproximateNumberOfMessagesDelayed"] == 1
    for args, expected in [
        (("--run-at", "2026-12-01T09:00"), "has no timezone"),
        (("--run-at", "soon"), "not an ISO 8601"),
        (("--delay-s", str(400 * 86400)), "a year"),
        (("--delay-s", "10", "--run-at", now_due), "not both"),
    ]:
        bad = cli("enqueue", "later", *args, env=env)
        assert bad.returncode == 2 and expected in bad.stderr, (args, bad.stderr)
    assert queue_counts(client, queues.queue_url)["ApproximateNumberOfMessagesDelayed"] == 1


@pytest.mark.memory
async def test_a_message_with_no_room_for_the_counts_is_held_in_place(backend: Backend) -> None:
    """Nine attributes of its own leave no room for the two counts (SQS allows 10): the hop releases the message
    in place (visibility), remembered by this worker, and it still runs once, as its first attempt."""
    queues = make_queues(backend.endpoint_url)
    clock = clock_of(backend.endpoint_url)  # on memory: the broker's, which skips ahead
    registry = Registry()
    runs: list[tuple[int, int]] = []

    @registry.job("later")
    async def later(payload: dict[str, Any], ctx: JobContext) -> None:
        runs.append((ctx.attempt, ctx.receive_count))

    own = {f"a{n}": {"DataType": "String", "StringValue": str(n)} for n in range(8)}
    due_at = datetime.fromtimestamp(clock.time(), UTC) + timedelta(seconds=2.5)
    message_id = send(
        backend.endpoint_url,
        queues.queue_url,
        {"type": "later", "payload": {}},
        MessageAttributes={**own, **due_attribute(due_at)},
    )
    async with running_worker(backend.endpoint_url, queues, registry, poll_wait_s=1, max_hop_s=1) as running:
        await running.recorder.wait_count(Kind.SUCCEEDED, 1, timeout_s=30)
    hops = running.recorder.of(Kind.RELEASED)
    assert hops and all(e.message_id == message_id for e in hops)  # never a copy: the same message each time
    assert runs == [(1, len(hops) + 1)]
    assert_queue_empty(sqs_client(backend.endpoint_url), queues.queue_url)
