"""Shutdown waits for outcomes already being applied: a job cancelled past the grace period while its dead letter
is being sent still gets to the DLQ and out of its queue before the worker's ``run`` returns."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.test_receive_loops import ScriptedQueue
from worker.backends.sqs import Message
from worker.errors import PermanentError
from worker.jobs import Registry
from worker.runtime import worker as worker_module
from worker.runtime.worker import RuntimeOptions, Worker


class OneJobQueue(ScriptedQueue):
    """The first receive brings one ``refuse`` job; every later one is an idle long poll."""

    async def receive(self, *, max_messages: int, wait_s: int, visibility_timeout_s: int) -> list[Message]:
        self.calls += 1
        if self.calls == 1:
            body = json.dumps({"type": "refuse", "payload": {}})
            return [Message("id-1", "handle-1", body, {"ApproximateReceiveCount": "1"}, {})]
        await asyncio.Event().wait()  # cancelled at shutdown
        return []


class SlowDeadLetterQueue(ScriptedQueue):
    """A DLQ whose SendMessage answers only when the test says."""

    def __init__(self) -> None:
        super().__init__("dlq")
        self.sending = asyncio.Event()
        self.may_answer = asyncio.Event()
        self.sent: list[str] = []

    async def send(self, body: str, **kwargs: Any) -> str:
        self.sending.set()
        await self.may_answer.wait()
        self.sent.append(body)
        return "dead-1"


def refusing_worker(queue: ScriptedQueue, dlq: ScriptedQueue) -> Worker:
    """A worker whose one job type fails permanently (a dead letter at once), with a 50 ms shutdown grace."""
    registry = Registry()

    @registry.job("refuse")
    async def refuse(payload: dict[str, Any]) -> None:
        raise PermanentError("no such account")

    return Worker(
        registry=registry,
        queue=queue,
        dlq=dlq,
        options=RuntimeOptions(concurrency=2, visibility_timeout_s=30, shutdown_grace_s=0.05, poll_wait_s=20),
    )


async def test_a_dead_letter_in_flight_at_the_grace_deadline_is_finished_before_run_returns() -> None:
    queue, dlq = OneJobQueue("jobs"), SlowDeadLetterQueue()
    stop = asyncio.Event()
    running = asyncio.create_task(refusing_worker(queue, dlq).run(stop))
    await asyncio.wait_for(dlq.sending.wait(), timeout=5)  # the dead letter is being sent
    stop.set()  # the grace (50 ms) ends while the send waits: the job is cancelled
    await asyncio.sleep(0.2)
    assert not running.done(), "run returned with a dead letter still being sent"
    dlq.may_answer.set()
    await asyncio.wait_for(running, timeout=5)
    assert len(dlq.sent) == 1
    assert queue.deleted == ["handle-1"]  # sent to the DLQ, then deleted from its queue


async def test_an_outcome_that_never_finishes_is_given_up_after_its_bound(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(worker_module, "OUTCOME_FINISH_WAIT_S", 0.2)
    queue, dlq = OneJobQueue("jobs"), SlowDeadLetterQueue()  # the DLQ never answers
    stop = asyncio.Event()
    running = asyncio.create_task(refusing_worker(queue, dlq).run(stop))
    await asyncio.wait_for(dlq.sending.wait(), timeout=5)
    stop.set()
    await asyncio.wait_for(running, timeout=5)  # bounded: the grace, then 0.2 s for the outcome
    assert dlq.sent == [] and queue.deleted == []  # nothing half done: the message reappears and runs again
    assert "1 outcome(s) still being applied at exit" in caplog.text
