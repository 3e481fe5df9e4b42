"""A job that ended here but whose delete did not go through is not run again when SQS hands the message back to the
same worker: the copy is deleted (a ``duplicate_skipped`` event), as a completed idempotency key's would be."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from tests.test_receive_loops import ScriptedQueue
from worker.backends.batching import EntryFailed
from worker.backends.sqs import Message
from worker.jobs import Registry
from worker.observability.events import Event, Kind, Observers
from worker.runtime.worker import RuntimeOptions, Worker


class DeleteLostThenRedelivered(ScriptedQueue):
    """Receive 1 brings job id-1; its delete fails (SQS answered InternalError for the entry). Receive 2 brings the
    same message again (its visibility timeout ran out), with a new receipt handle; later receives stall."""

    def __init__(self) -> None:
        super().__init__("jobs")
        self.failed_deletes: list[str] = []
        self.delete_failed = asyncio.Event()

    async def receive(self, *, max_messages: int, wait_s: int, visibility_timeout_s: int) -> list[Message]:
        self.calls += 1
        if self.calls == 2:
            await self.delete_failed.wait()  # the copy comes back after the delete failed
        if self.calls <= 2:
            body = json.dumps({"type": "charge", "payload": {"order": 7}})
            return [Message("id-1", f"handle-{self.calls}", body, {"ApproximateReceiveCount": str(self.calls)}, {})]
        await asyncio.Event().wait()  # cancelled at shutdown
        return []

    async def _delete_batch(self, handles: list[str]) -> dict[int, EntryFailed]:
        failed = {i: EntryFailed("InternalError", "we encountered an internal error") for i, h in enumerate(handles)}
        if handles == ["handle-1"]:
            self.failed_deletes.extend(handles)
            self.delete_failed.set()
            return failed
        return await super()._delete_batch(handles)


async def test_a_copy_of_a_job_that_ended_here_is_deleted_not_run_again() -> None:
    queue = DeleteLostThenRedelivered()
    registry = Registry()
    charged: list[int] = []
    skipped: list[Event] = []
    copy_deleted = asyncio.Event()

    @registry.job("charge")
    async def charge(payload: dict[str, int]) -> None:
        charged.append(payload["order"])

    class Watch:
        def emit(self, event: Event) -> None:
            if event.kind is Kind.DUPLICATE_SKIPPED:
                skipped.append(event)
                copy_deleted.set()

        def gauge(self, **_: Any) -> None:
            return None

        def connectivity(self, **_: Any) -> None:
            return None

    worker = Worker(
        registry=registry,
        queue=queue,
        dlq=ScriptedQueue("dlq"),
        options=RuntimeOptions(concurrency=1, visibility_timeout_s=30, shutdown_grace_s=5, poll_wait_s=20),
        observers=Observers([Watch()]),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        await asyncio.wait_for(copy_deleted.wait(), timeout=10)
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=10)
    assert charged == [7]  # once
    assert queue.failed_deletes == ["handle-1"]
    assert queue.deleted == ["handle-2"]  # the copy, by its own receipt handle
    assert [(e.message_id, e.reason) for e in skipped] == [
        ("id-1", "its job ended here; the delete had not gone through")
    ]
