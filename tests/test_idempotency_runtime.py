"""The ledger wired into the runtime (in-process worker, real endpoint): write cost per job, duplicates,
conflicts, retries and failures as the ledger records them."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import TYPE_CHECKING, Any

import pytest
import pytest_asyncio

from tests.support.backends import Backend
from tests.support.harness import drain, make_queues, running_worker, send, sqs_client
from tests.support.idempotency import WriteCounter
from tests.support.memory import broker_of
from tests.support.queues import assert_queue_empty
from worker import JobContext, PermanentError, RetryableError
from worker.idempotency import CONFLICT_REASON, Ledger, Status, create_table, payload_hash
from worker.idempotency.memory import MemoryStore
from worker.jobs import Registry
from worker.observability.events import Kind

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb.client import DynamoDBClient


@pytest_asyncio.fixture(loop_scope="function")
async def table(dynamodb: DynamoDBClient) -> str:
    name = f"rt-{uuid.uuid4().hex[:12]}"
    await create_table(dynamodb, name)
    return name


@pytest.fixture
def ledger(backend: Backend, request: pytest.FixtureRequest) -> Ledger:
    """The ledger in a fresh table (its client the test's ``dynamodb``); on the memory backend in a MemoryStore."""
    owner = f"test:{uuid.uuid4().hex[:8]}"
    if backend.name == "memory":
        return Ledger(store=MemoryStore(), owner=owner, clock=broker_of(backend.endpoint_url).clock.time)
    return Ledger(request.getfixturevalue("dynamodb"), request.getfixturevalue("table"), owner=owner)


@pytest.fixture
def thief(backend: Backend, ledger: Ledger, request: pytest.FixtureRequest) -> Ledger:
    """Another worker's ledger over the same items, its clock an hour ahead."""
    if backend.name == "memory":
        clock = broker_of(backend.endpoint_url).clock
        return Ledger(store=ledger._store, owner="thief", clock=lambda: clock.time() + 3600)
    dynamodb = request.getfixturevalue("dynamodb")
    return Ledger(dynamodb, ledger.table_name, owner="thief", clock=lambda: time.time() + 3600)


async def test_an_idempotent_job_costs_two_writes(backend: Backend, dynamodb: DynamoDBClient, ledger: Ledger) -> None:
    queues = make_queues(backend.endpoint_url)
    registry = Registry()
    ran: list[int] = []

    @registry.job("charge", idempotent=True)
    async def charge(payload: dict[str, Any]) -> dict[str, int]:
        ran.append(payload["n"])
        return {"n": payload["n"]}

    writes = WriteCounter(dynamodb)
    async with running_worker(backend.endpoint_url, queues, registry, ledger=ledger) as running:
        for n in range(5):
            send(backend.endpoint_url, queues.queue_url, {"type": "charge", "payload": {"n": n}})
        await running.recorder.wait_count(Kind.SUCCEEDED, 5)
    assert sorted(ran) == [0, 1, 2, 3, 4]
    assert writes.operations == ["UpdateItem"] * 10  # per job: one claim, one completion


@pytest.mark.memory
async def test_a_duplicate_of_a_completed_job_is_acknowledged_without_running(backend: Backend, ledger: Ledger) -> None:
    queues = make_queues(backend.endpoint_url)
    registry = Registry()
    ran: list[str] = []

    @registry.job("email")
    async def email(payload: dict[str, Any]) -> None:
        ran.append(payload["to"])

    body = {"type": "email", "payload": {"to": "a@example.com"}, "idempotency_key": f"welcome-{uuid.uuid4().hex}"}
    async with running_worker(backend.endpoint_url, queues, registry, ledger=ledger) as running:
        send(backend.endpoint_url, queues.queue_url, body)
        await running.recorder.wait_count(Kind.SUCCEEDED, 1)
        send(backend.endpoint_url, queues.queue_url, body)
        # Skipped, or (the broken promise) started again: either ends the wait, so the check below says which.
        await running.recorder.wait_for(lambda r: bool(r.of(Kind.DUPLICATE_SKIPPED)) or len(r.of(Kind.STARTED)) > 1)
    assert ran == ["a@example.com"]  # an envelope key makes even a plain job idempotent
    skipped = running.recorder.of(Kind.DUPLICATE_SKIPPED)
    assert [e.idempotency_key for e in skipped] == [body["idempotency_key"]]
    assert_queue_empty(sqs_client(backend.endpoint_url), queues.queue_url)


@pytest.mark.memory
async def test_a_reused_key_with_another_payload_is_dead_lettered_as_permanent(
    backend: Backend, ledger: Ledger
) -> None:
    queues = make_queues(backend.endpoint_url)
    registry = Registry()
    ran: list[int] = []

    @registry.job("charge")
    async def charge(payload: dict[str, Any]) -> None:
        ran.append(payload["amount"])

    key = f"order-{uuid.uuid4().hex}"
    async with running_worker(backend.endpoint_url, queues, registry, ledger=ledger) as running:
        send(
            backend.endpoint_url, queues.queue_url, {"type": "charge", "payload": {"amount": 5}, "idempotency_key": key}
        )
        await running.recorder.wait_count(Kind.SUCCEEDED, 1)
        send(
            backend.endpoint_url, queues.queue_url, {"type": "charge", "payload": {"amount": 9}, "idempotency_key": key}
        )
        await running.recorder.wait_count(Kind.DEAD_LETTERED, 1)
    assert ran == [5]
    [dead] = drain(backend.endpoint_url, queues.dlq_url, expect=1)
    attributes = dead["MessageAttributes"]
    assert attributes["error_category"]["StringValue"] == "permanent"
    assert CONFLICT_REASON in attributes["error_message"]["StringValue"]
    assert json.loads(dead["Body"])["payload"] == {"amount": 9}


@pytest.mark.memory
async def test_retries_and_failures_are_recorded(backend: Backend, ledger: Ledger) -> None:
    queues = make_queues(backend.endpoint_url)
    registry = Registry()

    @registry.job("flaky", key=lambda payload: payload["id"], backoff_base_s=0, backoff_max_s=0)
    async def flaky(payload: dict[str, Any], ctx: JobContext) -> str:
        if ctx.attempt == 1:
            raise RetryableError("gateway timeout", delay_s=0)
        return "ok"

    @registry.job("doomed", key=lambda payload: payload["id"])
    async def doomed(payload: dict[str, Any]) -> None:
        raise PermanentError("card declined")

    async with running_worker(backend.endpoint_url, queues, registry, ledger=ledger) as running:
        send(backend.endpoint_url, queues.queue_url, {"type": "flaky", "payload": {"id": "f1"}})
        send(backend.endpoint_url, queues.queue_url, {"type": "doomed", "payload": {"id": "d1"}})
        await running.recorder.wait_count(Kind.SUCCEEDED, 1)
        await running.recorder.wait_count(Kind.DEAD_LETTERED, 1)

    flaky_record = await ledger.get("flaky:f1")
    assert flaky_record is not None
    assert (flaky_record.status, flaky_record.attempts, flaky_record.result) == (Status.COMPLETED, 2, "ok")
    assert flaky_record.last_error is not None
    assert "gateway timeout" in flaky_record.last_error  # kept from the failed attempt
    doomed_record = await ledger.get("doomed:d1")
    assert doomed_record is not None
    assert (doomed_record.status, doomed_record.attempts) == (Status.FAILED, 1)
    assert doomed_record.last_error is not None
    assert "card declined" in doomed_record.last_error


@pytest.mark.memory
async def test_the_context_carries_the_ledger_key(backend: Backend, ledger: Ledger) -> None:
    queues = make_queues(backend.endpoint_url)
    registry = Registry()
    seen: list[str | None] = []

    @registry.job("ship", key=lambda payload: payload["order"])
    async def ship(payload: dict[str, Any], ctx: JobContext) -> None:
        seen.append(ctx.idempotency_key)

    async with running_worker(backend.endpoint_url, queues, registry, ledger=ledger) as running:
        send(backend.endpoint_url, queues.queue_url, {"type": "ship", "payload": {"order": "o-1"}})
        await running.recorder.wait_count(Kind.SUCCEEDED, 1)
    assert seen == ["ship:o-1"]


@pytest.mark.memory
async def test_a_broken_key_function_is_dead_lettered_as_a_bug(backend: Backend, ledger: Ledger) -> None:
    queues = make_queues(backend.endpoint_url)
    registry = Registry()
    ran: list[object] = []

    @registry.job("broken", key=lambda payload: None)  # type: ignore[arg-type,return-value]
    async def broken(payload: dict[str, Any]) -> None:
        ran.append(payload)

    async with running_worker(backend.endpoint_url, queues, registry, ledger=ledger) as running:
        send(backend.endpoint_url, queues.queue_url, {"type": "broken", "payload": {}})
        dead = await running.recorder.wait_count(Kind.DEAD_LETTERED, 1, timeout_s=20)
    assert ran == []
    assert dead[0].category == "bug"


@pytest.mark.memory
async def test_a_handler_whose_lease_is_taken_over_is_stopped(backend: Backend, ledger: Ledger, thief: Ledger) -> None:
    """A worker that finds at a heartbeat that another worker took its lease over stops its handler at once and
    leaves the message and the ledger to the new owner."""
    queues = make_queues(backend.endpoint_url)
    registry = Registry()
    started = asyncio.Event()
    cancelled: list[bool] = []

    @registry.job("long", timeout_s=120)
    async def long(payload: dict[str, Any]) -> None:
        started.set()
        try:
            await asyncio.Event().wait()  # runs until stopped
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    payload = {"report": 7}
    async with running_worker(backend.endpoint_url, queues, registry, ledger=ledger, visibility_timeout_s=6) as running:
        send(backend.endpoint_url, queues.queue_url, {"type": "long", "payload": payload, "idempotency_key": "rep-7"})
        await asyncio.wait_for(started.wait(), timeout=30)
        # Another worker whose clock is an hour ahead (the ``thief``) sees the lease as lapsed and takes the job over.
        stolen = await thief.claim(key="rep-7", job_type="long", payload_hash=payload_hash("long", payload), lease_s=30)
        assert stolen.outcome == "run"
        lost = await running.recorder.wait_count(Kind.CLAIM_LOST, 1, timeout_s=30)
        await running.recorder.wait_for(lambda _: bool(cancelled), timeout_s=10)
    assert "handler stopped" in (lost[0].reason or "")
    for kind in (Kind.SUCCEEDED, Kind.RETRY_SCHEDULED, Kind.DEAD_LETTERED, Kind.RELEASED):
        assert running.recorder.of(kind) == []  # not released either (as a shutdown's cancel would)
    record = await ledger.get("rep-7")
    assert record is not None
    assert record.owner == "thief"


async def test_a_job_whose_claim_answers_after_sigterm_is_put_back_not_started(
    backend: Backend, ledger: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shutdown lets running jobs finish and puts back the ones not started: a job still waiting for its claim
    when the signal came is one of those (its handler started after the signal before)."""
    from tests.support.queues import message_count

    queues = make_queues(backend.endpoint_url)
    registry = Registry()
    ran: list[int] = []

    @registry.job("charge", idempotent=True)
    async def charge(payload: dict[str, Any]) -> None:
        ran.append(payload["n"])

    claiming, may_answer = asyncio.Event(), asyncio.Event()
    claim = ledger.claim
    keys: list[str] = []

    async def slow_claim(**kwargs: Any) -> Any:
        keys.append(kwargs["key"])
        claiming.set()
        await may_answer.wait()
        return await claim(**kwargs)

    monkeypatch.setattr(ledger, "claim", slow_claim)
    send(backend.endpoint_url, queues.queue_url, {"type": "charge", "payload": {"n": 1}})
    async with running_worker(backend.endpoint_url, queues, registry, ledger=ledger) as running:
        await asyncio.wait_for(claiming.wait(), timeout=30)
        shutting_down = asyncio.Event()
        shutdown = running.worker._shutdown

        async def noted_shutdown(*args: Any) -> None:
            shutting_down.set()
            await shutdown(*args)  # its first step, before any wait, marks the worker as stopping

        monkeypatch.setattr(running.worker, "_shutdown", noted_shutdown)
        running.stop.set()
        await asyncio.wait_for(shutting_down.wait(), timeout=10)
        assert running.worker._stopping
        may_answer.set()  # the claim answers after the signal
        await asyncio.wait_for(asyncio.shield(running.task), timeout=30)
    assert ran == []
    assert [e.reason for e in running.recorder.of(Kind.RELEASED)] == ["shutdown"]
    assert message_count(sqs_client(backend.endpoint_url), queues.queue_url) == 1  # back in the queue, once
    record = await ledger.get(keys[0])
    assert record is not None and record.status is Status.IN_PROGRESS and record.owner is None  # given back
    assert record.lease_expires_at_ms == 0
