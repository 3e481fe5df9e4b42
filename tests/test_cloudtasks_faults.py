"""serve-tasks when things go wrong around a job: DynamoDB gone between the handler's return and its completion,
an instance that dies holding a key, a shutdown that meets a task's last attempt (Cloud Tasks drops a task after
it, so the worker must keep it as a dead letter), and refused input that names its job type."""

from __future__ import annotations

import asyncio
import time
from typing import Any
from urllib.parse import urlsplit

import pytest
from aiobotocore.session import get_session
from pydantic import BaseModel

from tests.support.backends import Backend
from tests.support.cloudtasks import dead_letters, make_dead_letter_table, serving, task_headers
from tests.support.idempotency import dynamodb_client
from tests.support.proxy import Proxy
from tests.test_cloudtasks_http import call, envelope
from worker.backends.cloudtasks import runner as runner_module
from worker.backends.cloudtasks.contract import TaskRequest
from worker.backends.cloudtasks.deadletters import DeadLetterStore
from worker.backends.cloudtasks.runner import (
    CANCELLED_AT_LAST,
    SHUTDOWN_AT_LAST,
    RunnerOptions,
    TaskRunner,
)
from worker.idempotency import create_table
from worker.jobs import Registry
from worker.observability.events import Kind


class Mail(BaseModel):
    to: str


@pytest.fixture
def env(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> Backend:
    monkeypatch.setenv("AWS_ENDPOINT_URL", backend.endpoint_url)
    return backend


async def _ledger_table(endpoint_url: str) -> str:
    name = f"ledger-{time.time_ns()}"
    async with dynamodb_client(endpoint_url) as client:
        await create_table(client, name)
    return name


async def _ledger_item(endpoint_url: str, table: str, key: str) -> dict[str, Any]:
    async with dynamodb_client(endpoint_url) as client:
        item: dict[str, Any] = (await client.get_item(TableName=table, Key={"key": {"S": key}}, ConsistentRead=True))[
            "Item"
        ]
    return item


def hanging_registry() -> tuple[Registry, asyncio.Event]:
    """A registry whose job ``hang`` (3 attempts) runs until cancelled, and the event it sets when it starts."""
    registry = Registry()
    started = asyncio.Event()

    @registry.job("hang", max_attempts=3, timeout_s=60)
    async def hang(payload: dict[str, Any]) -> None:
        started.set()
        await asyncio.Event().wait()

    return registry, started


async def test_a_completion_not_recorded_is_recorded_by_the_redelivery_without_running_again(
    env: Backend, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job ran; DynamoDB went away before its completion was written. The redelivery (this process remembers
    the run) writes the completion and answers 200: it neither runs the job again nor waits out a lease into an
    `exhausted` dead letter."""
    endpoint = urlsplit(env.endpoint_url)
    assert endpoint.hostname is not None and endpoint.port is not None
    proxy = Proxy(endpoint.hostname, endpoint.port)
    await proxy.start()
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", proxy.endpoint_url)
    table = await make_dead_letter_table(env.endpoint_url)
    ledger = await _ledger_table(env.endpoint_url)
    ran: list[int] = []
    registry = Registry()

    @registry.job("charge", key=lambda payload: str(payload["n"]), max_attempts=5)
    async def charge(payload: dict[str, Any]) -> str:
        ran.append(payload["n"])
        await proxy.stop()  # DynamoDB is gone before the completion is written
        return "charged"

    try:
        async with serving(
            registry, queue="q", dead_letter_table=table, tmp_path=tmp_path, idempotency_table=ledger
        ) as s:
            status, _, body = await call(s.url, envelope("charge", n=1), task_headers("t1"))
            assert (status, body["outcome"]) == (503, "completion_unrecorded")
            await proxy.start()
            status, _, body = await call(s.url, envelope("charge", n=1), task_headers("t1", retry_count=1))
            assert (status, body["outcome"]) == (200, "succeeded")
    finally:
        await proxy.stop()
    assert ran == [1]
    item = await _ledger_item(env.endpoint_url, ledger, "charge:1")
    assert (item["status"]["S"], item["result"]["S"]) == ("COMPLETED", '"charged"')
    assert await dead_letters(env.endpoint_url, table, "q") == []


async def test_a_running_jobs_lease_is_short_and_renewed(
    env: Backend, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key's lease lasts a minute and is renewed while its request runs: an instance that dies holding it frees
    the key within that minute, not after the handler's whole timeout (which outlasted a queue's attempts)."""
    monkeypatch.setattr(runner_module, "LEASE_RENEW_S", 0.2)
    table = await make_dead_letter_table(env.endpoint_url)
    ledger = await _ledger_table(env.endpoint_url)
    registry = Registry()
    started, finish = asyncio.Event(), asyncio.Event()

    @registry.job("long", key=lambda payload: "1", timeout_s=900)
    async def long(payload: dict[str, Any]) -> None:
        started.set()
        await finish.wait()

    async with serving(registry, queue="q", dead_letter_table=table, tmp_path=tmp_path, idempotency_table=ledger) as s:
        running = asyncio.create_task(call(s.url, envelope("long"), task_headers("t1")))
        await asyncio.wait_for(started.wait(), 10)
        first = await _ledger_item(env.endpoint_url, ledger, "long:1")
        lease_ms = int(first["lease_expires_at_ms"]["N"])
        assert lease_ms - time.time() * 1000 <= runner_module.LEASE_S * 1000 + 1000  # not timeout_s + 30

        async def renewed() -> bool:
            item = await _ledger_item(env.endpoint_url, ledger, "long:1")
            return int(item["lease_expires_at_ms"]["N"]) > lease_ms

        deadline = time.monotonic() + 10
        while not await renewed():  # the table's state: no event to await
            assert time.monotonic() < deadline, "the running job's lease was not renewed within 10 s"
            await asyncio.sleep(0.05)
        finish.set()
        status, _, body = await running
        assert (status, body["outcome"]) == (200, "succeeded")


async def test_a_last_attempt_cancelled_at_shutdown_is_kept_as_a_dead_letter(env: Backend, tmp_path: Any) -> None:
    table = await make_dead_letter_table(env.endpoint_url)
    registry, started = hanging_registry()

    async with serving(registry, queue="q", dead_letter_table=table, tmp_path=tmp_path, shutdown_grace_s=0.5) as s:
        last = asyncio.create_task(call(s.url, envelope("hang"), task_headers("last", retry_count=2)))
        await asyncio.wait_for(started.wait(), 10)
        s.stop.set()
        status, _, body = await last
    assert (status, body["outcome"], body.get("detail")) == (200, "dead_lettered", "exhausted")
    [dead] = await dead_letters(env.endpoint_url, table, "q")
    assert (dead.task, dead.job_type, dead.attributes["error_message"]) == ("last", "hang", CANCELLED_AT_LAST)
    assert dead.attributes["attempts"] == "3"


async def test_a_last_attempt_still_waiting_for_a_slot_at_shutdown_is_kept_as_a_dead_letter(
    env: Backend, tmp_path: Any
) -> None:
    table = await make_dead_letter_table(env.endpoint_url)
    registry, started = hanging_registry()

    async with serving(
        registry, queue="q", dead_letter_table=table, tmp_path=tmp_path, shutdown_grace_s=0.5, concurrency=1
    ) as s:
        first = asyncio.create_task(call(s.url, envelope("hang"), task_headers("first")))
        await asyncio.wait_for(started.wait(), 10)
        waiting = asyncio.create_task(call(s.url, envelope("hang"), task_headers("waiting", retry_count=2)))
        await s.recorder.wait_count(Kind.RECEIVED, 2, timeout_s=10)
        s.stop.set()
        first_status, _, first_body = await first
        status, _, body = await waiting
    assert (first_status, first_body["outcome"]) == (503, "cancelled_at_shutdown")  # attempts remain
    assert (status, body["outcome"], body.get("detail")) == (200, "dead_lettered", "exhausted")
    [dead] = await dead_letters(env.endpoint_url, table, "q")
    assert (dead.task, dead.attributes["error_message"]) == ("waiting", SHUTDOWN_AT_LAST)


async def test_while_stopping_a_last_attempt_is_dead_lettered_and_others_answered_503(env: Backend) -> None:
    """A delivery that reaches the runner after shutdown began runs nothing: Cloud Tasks tries it again, unless it
    is its last attempt (it would drop it): that one is recorded. Refused input names its registered job type."""
    table = await make_dead_letter_table(env.endpoint_url)
    registry = Registry()
    ran: list[str] = []

    @registry.job("send", max_attempts=3)
    async def send(payload: Mail) -> None:
        ran.append("send")

    async with get_session().create_client(
        "dynamodb", endpoint_url=env.endpoint_url, region_name="us-east-1"
    ) as client:
        runner = TaskRunner(
            registry=registry, options=RunnerOptions(queue="q"), dead_letters=DeadLetterStore(client, table, "q")
        )
        runner.stopping = True
        early = await runner.answer(TaskRequest(envelope("send", to="a@b"), "early", "q", retry_count=0))
        final = await runner.answer(TaskRequest(envelope("send", to="a@b"), "final", "q", retry_count=2))
        runner.stopping = False
        typed = await runner.answer(TaskRequest(b'{"type":"send","payload":{}}', "typed", "q"))
        await runner.drain(1)
    assert (early.status, early.outcome) == (503, "shutting_down")
    assert (final.status, final.outcome, final.detail) == (200, "dead_lettered", "exhausted")
    assert (typed.status, typed.outcome, typed.detail) == (200, "dead_lettered", "invalid_payload")
    assert ran == []
    found = {dead.task: dead for dead in await dead_letters(env.endpoint_url, table, "q")}
    assert found["final"].attributes["error_message"] == SHUTDOWN_AT_LAST
    assert (found["typed"].job_type, found["final"].job_type) == ("send", "send")
    assert sorted(found) == ["final", "typed"]
