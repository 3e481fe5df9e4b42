"""The core contract on the Cloud Tasks backend: tasks created with google-cloud-tasks on the emulator, which
dispatches them over HTTP to serve-tasks; the ledger and the dead-letter table on the backend (moto, LocalStack).

The emulator retries a failed task at once (it has no retry config): backoff belongs to Cloud Tasks' queue and
is not seen here; the answers that steer it (500, 429 + Retry-After) are checked in test_cloudtasks_http.py.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tests.support.backends import Backend
from tests.support.cloudtasks import Emulator, dead_letters, make_dead_letter_table, serving, wait_until
from tests.support.idempotency import dynamodb_client
from worker.backends.cloudtasks.producer import build_task, create_task, enqueue_task, task_id
from worker.errors import PermanentError
from worker.idempotency import create_table
from worker.jobs import Registry
from worker.observability.events import Kind
from worker.producer import Job


@pytest.fixture
def env(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> Backend:
    monkeypatch.setenv("AWS_ENDPOINT_URL", backend.endpoint_url)
    return backend


def contract_registry(seen: list[str], *, keyed: bool = False) -> Registry:
    registry = Registry()

    @registry.job("ok")
    async def ok(payload: dict[str, Any], ctx: Any) -> None:
        seen.append(f"ok {payload['n']} attempt={ctx.attempt}")

    @registry.job("flaky_once", max_attempts=3)
    async def flaky_once(payload: dict[str, Any], ctx: Any) -> None:
        seen.append(f"flaky attempt={ctx.attempt} last={ctx.is_last_attempt}")
        if ctx.attempt == 1:
            raise RuntimeError("upstream 502")

    @registry.job("always_fails", max_attempts=10)
    async def always_fails(payload: dict[str, Any], ctx: Any) -> None:
        seen.append(f"fails attempt={ctx.attempt} of {ctx.max_attempts}")
        raise RuntimeError("still down")

    @registry.job("refuse")
    async def refuse(payload: dict[str, Any]) -> None:
        seen.append("refuse")
        raise PermanentError("no such account")

    @registry.job("slow_once", timeout_s=1)
    async def slow_once(payload: dict[str, Any], ctx: Any) -> None:
        seen.append(f"slow attempt={ctx.attempt}")
        if ctx.attempt == 1:
            await asyncio.sleep(10)

    if keyed:

        @registry.job("charge", key=lambda p: p["order"])
        async def charge(payload: dict[str, Any], ctx: Any) -> str:
            seen.append(f"charge {payload['order']} key={ctx.idempotency_key}")
            return "charged"

    return registry


async def test_contract_through_the_emulator(env: Backend, tasks_emulator: Emulator, tmp_path: Any) -> None:
    """Success, retry, permanent, invalid input, unknown type, exhausted and timeout, each task gone at the end."""
    table = await make_dead_letter_table(env.endpoint_url)
    queue = tasks_emulator.new_queue()
    seen: list[str] = []
    async with serving(
        contract_registry(seen),
        queue=queue,
        dead_letter_table=table,
        tmp_path=tmp_path,
        emulator_host=tasks_emulator.host,
    ) as server:
        client = tasks_emulator.client()
        ct = server.cloudtasks
        for job in (
            Job("ok", {"n": 1}),
            Job("flaky_once"),
            Job("refuse"),
            Job("nope"),
            Job("always_fails"),
            Job("slow_once"),
        ):
            await asyncio.to_thread(enqueue_task, client, ct, queue, job)
        path = ct.queue_path(queue)
        await asyncio.to_thread(create_task, client, ct, path, build_task(ct, path, b'{"type": 1}'))
        await server.recorder.wait_for(
            lambda r: len(r.of(Kind.SUCCEEDED)) >= 3 and len(r.of(Kind.DEAD_LETTERED)) >= 4, timeout_s=60
        )
        await wait_until(lambda: tasks_emulator.tasks(queue) == [], timeout_s=20)
    assert "ok 1 attempt=1" in seen
    assert [line for line in seen if line.startswith("flaky")] == [
        "flaky attempt=1 last=False",
        "flaky attempt=2 last=False",
    ]
    # the queue's max attempts (3) is below the job's (10): the worker dead-letters at the queue's last attempt
    assert [line for line in seen if line.startswith("fails")] == [f"fails attempt={n} of 3" for n in (1, 2, 3)]
    assert [line for line in seen if line.startswith("slow")] == ["slow attempt=1", "slow attempt=2"]
    retries = {(e.job_type, e.attempt): e.error for e in server.recorder.of(Kind.RETRY_SCHEDULED)}
    assert retries[("slow_once", 1)] == "TimeoutError: the handler ran longer than timeout_s=1"
    assert retries[("flaky_once", 1)] == "RuntimeError: upstream 502"
    records = await dead_letters(env.endpoint_url, table, queue)
    by_category = {r.attributes["error_category"]: r for r in records}
    assert sorted(by_category) == ["exhausted", "invalid_message", "permanent", "unknown_type"]
    assert by_category["exhausted"].attributes["attempts"] == "3"
    assert by_category["exhausted"].attributes["error_message"] == "RuntimeError: still down"
    assert by_category["permanent"].attributes["attempts"] == "1"
    assert by_category["invalid_message"].body == b'{"type": 1}'
    for record in records:
        assert record.attributes["source_queue"] == queue
        assert record.attributes["original_message_id"] == record.task


async def test_idempotent_duplicates_run_once(env: Backend, tasks_emulator: Emulator, tmp_path: Any) -> None:
    """Two tasks of one key (the emulator, unlike Cloud Tasks, accepts a second task of the same name): the ledger
    runs the job once and acknowledges the other delivery without running it."""
    table = await make_dead_letter_table(env.endpoint_url)
    ledger = f"ledger-{table}"
    async with dynamodb_client(env.endpoint_url) as client:
        await create_table(client, ledger)
    queue = tasks_emulator.new_queue()
    seen: list[str] = []
    async with serving(
        contract_registry(seen, keyed=True),
        queue=queue,
        dead_letter_table=table,
        tmp_path=tmp_path,
        emulator_host=tasks_emulator.host,
        idempotency_table=ledger,
    ) as server:
        client = tasks_emulator.client()
        first = await asyncio.to_thread(enqueue_task, client, server.cloudtasks, queue, Job("charge", {"order": "o-1"}))
        second = await asyncio.to_thread(
            enqueue_task, client, server.cloudtasks, queue, Job("charge", {"order": "o-1"}, idempotency_key="k-1")
        )
        third = await asyncio.to_thread(
            enqueue_task, client, server.cloudtasks, queue, Job("charge", {"order": "o-1"}, idempotency_key="k-1")
        )
        assert second.name == third.name == f"{server.cloudtasks.queue_path(queue)}/tasks/{task_id('k-1')}"
        assert first.name != second.name
        await server.recorder.wait_for(
            lambda r: len(r.of(Kind.SUCCEEDED)) + len(r.of(Kind.DUPLICATE_SKIPPED)) >= 3, timeout_s=30
        )
        await wait_until(lambda: tasks_emulator.tasks(queue) == [], timeout_s=20)
    # the envelope's key wins over the key function: two keys, each run once
    assert sorted(seen) == ["charge o-1 key=charge:o-1", "charge o-1 key=k-1"]
    assert [e.idempotency_key for e in server.recorder.of(Kind.DUPLICATE_SKIPPED)] == ["k-1"]


async def test_delay_via_schedule_time(env: Backend, tasks_emulator: Emulator, tmp_path: Any) -> None:
    table = await make_dead_letter_table(env.endpoint_url)
    queue = tasks_emulator.new_queue()
    seen: list[str] = []
    async with serving(
        contract_registry(seen),
        queue=queue,
        dead_letter_table=table,
        tmp_path=tmp_path,
        emulator_host=tasks_emulator.host,
    ) as server:
        created_at = time.monotonic()
        await asyncio.to_thread(
            enqueue_task, tasks_emulator.client(), server.cloudtasks, queue, Job("ok", {"n": 7}, delay_s=2)
        )
        await server.recorder.wait_count(Kind.SUCCEEDED, 1, timeout_s=30)
        assert time.monotonic() - created_at >= 1.5
    assert seen == ["ok 7 attempt=1"]
