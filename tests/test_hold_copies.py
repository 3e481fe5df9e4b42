"""A held job (here: not due yet) goes back as a delayed copy carrying its counts; a copy SQS fails to take for a
transport failure is sent again (the HOLD_COPY budget) before the job is released in place, where the receive
counts toward the redrive policy's maxReceiveCount."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.support.harness import Recorder
from tests.test_receive_loops import ScriptedQueue
from worker.backends.sqs import Message
from worker.budgets import HOLD_COPY
from worker.errors import QueueUnavailable
from worker.jobs import Registry
from worker.observability.events import Event, Kind, Observers
from worker.runtime.worker import RuntimeOptions, Worker


class NotDueThenIdle(ScriptedQueue):
    """Receive 1 brings a job due in an hour; later receives stall. Its first ``failing_sends`` sends fail as a
    dropped connection does; the visibility changes it is asked for are recorded."""

    def __init__(self, failing_sends: int) -> None:
        super().__init__("jobs")
        self.failing_sends = failing_sends
        self.sends: list[dict[str, Any]] = []
        self.visibility_changes: list[tuple[str, int]] = []

    async def receive(self, *, max_messages: int, wait_s: int, visibility_timeout_s: int) -> list[Message]:
        self.calls += 1
        if self.calls == 1:
            due = (datetime.now(UTC) + timedelta(hours=1)).isoformat(timespec="milliseconds").replace("+00:00", "Z")
            attributes = {"sqs_worker_due_at": {"DataType": "String", "StringValue": due}}
            body = json.dumps({"type": "later", "payload": {}})
            return [Message("id-1", "handle-1", body, {"ApproximateReceiveCount": "1"}, attributes)]
        await asyncio.Event().wait()  # cancelled at shutdown
        return []

    async def send(self, body: str, **kwargs: Any) -> str:
        self.sends.append(kwargs)
        if len(self.sends) <= self.failing_sends:
            raise QueueUnavailable("SendMessage: connection dropped")
        return f"copy-{len(self.sends)}"

    async def _visibility_batch(self, items: list[tuple[str, int]]) -> dict[int, Any]:
        self.visibility_changes.extend(items)
        return {}


async def hold_once(queue: NotDueThenIdle) -> Event:
    registry = Registry()

    @registry.job("later")
    async def later(payload: dict[str, Any]) -> None:
        raise AssertionError("not due: never run")

    recorder = Recorder()

    worker = Worker(
        registry=registry,
        queue=queue,
        dlq=ScriptedQueue("dlq"),
        options=RuntimeOptions(concurrency=1, visibility_timeout_s=30, shutdown_grace_s=5, poll_wait_s=20),
        observers=Observers([recorder]),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        [event] = await recorder.wait_count(Kind.RELEASED, 1, timeout_s=10)
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=10)
    assert len(recorder.of(Kind.RELEASED)) == 1
    return event


async def test_a_copy_that_failed_twice_is_sent_again_and_the_original_deleted() -> None:
    queue = NotDueThenIdle(failing_sends=2)
    await hold_once(queue)
    assert len(queue.sends) == 3  # two dropped, the third taken
    assert queue.deleted == ["handle-1"]  # the copy carries the job: the received message goes
    assert not [handle for handle, _ in queue.visibility_changes if handle == "handle-1"]  # not released in place


async def test_a_copy_that_keeps_failing_releases_the_job_in_place_within_the_budget(
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue = NotDueThenIdle(failing_sends=1_000)
    started = asyncio.get_running_loop().time()
    await hold_once(queue)
    assert HOLD_COPY.give_up_after_s is not None
    assert asyncio.get_running_loop().time() - started < HOLD_COPY.give_up_after_s + 5
    assert 2 <= len(queue.sends) < 20  # tried again, and bounded
    assert queue.deleted == []  # nothing else carries the job: it stays, put back by its visibility
    assert [h for h, _ in queue.visibility_changes] == ["handle-1"]
    assert any("releasing it in place" in r.getMessage() for r in caplog.records)
