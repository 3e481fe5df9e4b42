"""The worker against a real SQS endpoint over HTTP: success, retry, dead-lettering of bad input."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from typing import Any

import pytest
from pydantic import BaseModel

from tests.support.backends import Backend
from tests.support.harness import drain, make_queues, running_worker, send, sqs_client
from tests.support.queues import assert_queue_empty
from worker import PermanentError
from worker.jobs import Registry
from worker.observability.events import Kind

pytestmark = pytest.mark.memory


class Email(BaseModel):
    to: str
    subject: str


def registry_with(calls: list[Any]) -> Registry:
    registry = Registry()

    @registry.job("send_email")
    async def send_email(payload: Email) -> None:
        calls.append(payload)

    @registry.job("echo")
    def echo(payload: dict[str, Any], ctx: Any) -> dict[str, Any]:
        calls.append((payload, ctx.attempt))
        return payload

    @registry.job("refuse")
    async def refuse(payload: dict[str, Any]) -> None:
        raise PermanentError("the account is closed")

    @registry.job("buggy")
    async def buggy(payload: dict[str, Any]) -> None:
        payload.no_such_method()  # type: ignore[attr-defined]

    return registry


async def test_success_deletes_the_message(backend: Backend) -> None:
    queues = make_queues(backend.endpoint_url)
    calls: list[Any] = []
    async with running_worker(backend.endpoint_url, queues, registry_with(calls)) as running:
        send(
            backend.endpoint_url, queues.queue_url, {"type": "send_email", "payload": {"to": "a@b.c", "subject": "hi"}}
        )
        send(backend.endpoint_url, queues.queue_url, {"type": "echo", "payload": {"n": 1}})
        await running.recorder.wait_count(Kind.SUCCEEDED, 2)
    assert Email(to="a@b.c", subject="hi") in calls
    assert ({"n": 1}, 1) in calls
    assert_queue_empty(sqs_client(backend.endpoint_url), queues.queue_url)


BAD_INPUTS = [
    ("not json {", "invalid_message"),
    ("[1, 2, 3]", "invalid_message"),
    (json.dumps({"payload": {}}), "invalid_message"),
    (json.dumps({"type": "no_such_job", "payload": {}}), "unknown_type"),
    (json.dumps({"type": "send_email", "payload": {"to": "x"}}), "invalid_payload"),
    # Garbage that SQS accepts (it refuses control characters other than tab and newlines): not JSON.
    ("\t\u00ff\ufffd garbage \u00e9\u4e2d\U0001f600\r\n\ue000", "invalid_message"),
    (json.dumps({"type": "refuse", "payload": {"password": "hunter2"}}), "permanent"),
    (json.dumps({"type": "buggy", "payload": {}}), "bug"),
]


async def test_bad_input_is_dead_lettered_with_its_category(backend: Backend) -> None:
    queues = make_queues(backend.endpoint_url)
    calls: list[Any] = []
    async with running_worker(backend.endpoint_url, queues, registry_with(calls)) as running:
        ids = {send(backend.endpoint_url, queues.queue_url, body): (body, category) for body, category in BAD_INPUTS}
        dead = await running.recorder.wait_count(Kind.DEAD_LETTERED, len(BAD_INPUTS))
        # Metrics and logs name the job type where a registered one is known, never a producer's unregistered name.
        assert {(event.category, event.job_type) for event in dead} == {
            ("invalid_message", None),
            ("unknown_type", None),
            ("invalid_payload", "send_email"),
            ("permanent", "refuse"),
            ("bug", "buggy"),
        }
        # The worker keeps running: a good job after the bad ones still succeeds.
        send(backend.endpoint_url, queues.queue_url, {"type": "echo", "payload": {"after": True}})
        await running.recorder.wait_count(Kind.SUCCEEDED, 1)
    records = drain(backend.endpoint_url, queues.dlq_url, expect=len(BAD_INPUTS))
    assert len(records) == len(BAD_INPUTS)
    for record in records:
        assert record.get("MessageAttributes"), f"dead-lettered without its attributes: {record}"
        attributes = {k: v["StringValue"] for k, v in record["MessageAttributes"].items()}
        body, category = ids[attributes["original_message_id"]]
        assert record["Body"] == body
        assert attributes["error_category"] == category
        assert attributes["attempts"] == "1"
        assert attributes["source_queue"] == queues.queue_url.rsplit("/", 1)[-1]
        assert attributes["failed_at"].endswith("Z")
        assert attributes["error_message"]
        assert "hunter2" not in attributes["error_message"]
    assert_queue_empty(sqs_client(backend.endpoint_url), queues.queue_url)


async def test_retries_grow_then_exhaust_to_the_dlq(backend: Backend) -> None:
    queues = make_queues(backend.endpoint_url)
    registry = Registry()
    attempts: list[int] = []
    started_at: list[float] = []

    @registry.job("flaky", max_attempts=4, backoff_base_s=1, backoff_max_s=60)
    async def flaky(payload: dict[str, Any], ctx: Any) -> None:
        attempts.append(ctx.attempt)
        started_at.append(asyncio.get_running_loop().time())  # on memory: its skipping clock
        raise ConnectionError("upstream refused")

    async with running_worker(backend.endpoint_url, queues, registry) as running:
        send(backend.endpoint_url, queues.queue_url, {"type": "flaky", "payload": {}})
        dead = await running.recorder.wait_count(Kind.DEAD_LETTERED, 1, timeout_s=40)
    retries = running.recorder.of(Kind.RETRY_SCHEDULED)
    assert [e.attempt for e in retries] == [1, 2, 3]
    assert attempts == [1, 2, 3, 4]
    delays = [e.delay_s for e in retries]
    # Drawn from [50%, 100%] of 1, 2, 4 seconds, rounded up: they grow.
    assert delays[0] == 1
    assert delays[1] is not None and 1 <= delays[1] <= 2
    assert delays[2] is not None and 2 <= delays[2] <= 4
    gaps = [b - a for a, b in itertools.pairwise(started_at)]
    for gap, delay in zip(gaps, delays, strict=True):
        assert delay is not None and gap >= delay - 0.1  # the message stayed invisible for its delay
    assert dead[0].category == "exhausted"
    record = drain(backend.endpoint_url, queues.dlq_url, expect=1)[0]
    attributes = {k: v["StringValue"] for k, v in record["MessageAttributes"].items()}
    assert attributes["error_category"] == "exhausted"
    assert attributes["attempts"] == "4"
    assert attributes["error_message"] == "ConnectionError: upstream refused"
    assert_queue_empty(sqs_client(backend.endpoint_url), queues.queue_url)  # dead-lettered: gone from the source


async def test_plain_def_handlers_get_a_thread_per_slot(backend: Backend) -> None:
    """Ten sync jobs with concurrency 10 all run at once (the default pool would give a 2-core machine 6)."""
    queues = make_queues(backend.endpoint_url)
    registry = Registry()
    barrier = threading.Barrier(10, timeout=20)

    @registry.job("meet", max_attempts=1)
    def meet(payload: dict[str, Any]) -> None:
        barrier.wait()  # raises BrokenBarrierError unless all ten run at the same time

    async with running_worker(backend.endpoint_url, queues, registry, concurrency=10) as running:
        for n in range(10):
            send(backend.endpoint_url, queues.queue_url, {"type": "meet", "payload": {"n": n}})
        await running.recorder.wait_count(Kind.SUCCEEDED, 10, timeout_s=40)
    assert running.recorder.of(Kind.DEAD_LETTERED) == []


async def test_an_idle_worker_reports_all_slots_free(backend: Backend) -> None:
    """Slots a receive loop reserved for its long poll are free for jobs, not busy."""
    queues = make_queues(backend.endpoint_url)
    async with running_worker(
        backend.endpoint_url, queues, registry_with([]), concurrency=25, poll_wait_s=5
    ) as running:
        await running.recorder.wait_for(lambda r: len(r.gauges) >= 2)
    assert running.recorder.gauges[-1] == (0, 25)
