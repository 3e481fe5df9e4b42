"""Applying a message's outcome to SQS: acknowledge (delete), retry later, release, or dead-letter.

Each outcome first stops the message's heartbeat and waits for an extension in flight, so no later visibility
change can undo it. Dead-lettering sends to the DLQ before it deletes from the source.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from datetime import UTC, datetime
from typing import Any

from worker.batching import EntryFailed
from worker.deadletter import dead_letter_attributes
from worker.errors import QueueUnavailable, WorkerError
from worker.events import Kind, Observers
from worker.held import Held
from worker.policy import visibility_cap_s
from worker.sqs import Queue

log = logging.getLogger("worker")

#: How long a message whose dead-lettering failed waits before another try.
DEAD_LETTER_RETRY_S = 30


class Outcomes:
    """The four ways a held message leaves this worker, each reported to the observers."""

    def __init__(self, *, queue: Queue, dlq: Queue, observers: Observers) -> None:
        self.queue = queue
        self.dlq = dlq
        self.observers = observers

    def emit(self, kind: Kind, held: Held, **fields: Any) -> None:
        self.observers.emit(held.event(kind, self.queue.name, **fields))

    async def settle(self, held: Held) -> None:
        """Stop heartbeats for ``held`` and wait for an extension in flight, so no later call undoes ours."""
        held.finishing = True
        if held.extension is not None and not held.extension.done():
            await asyncio.gather(held.extension, return_exceptions=True)

    async def ack(self, held: Held) -> None:
        await self.settle(held)
        try:
            await self.queue.delete(held.message.receipt_handle)
        except (EntryFailed, QueueUnavailable) as exc:
            log.warning(
                "delete failed; the message will be delivered again: %s", exc, extra=held.log_fields(self.queue.name)
            )

    async def retry(self, held: Held, delay_s: int, error: str, duration_s: float) -> None:
        await self.settle(held)
        delay_s = min(delay_s, visibility_cap_s(elapsed_since_receive_s=time.monotonic() - held.received_at))
        try:
            await self.queue.set_visibility(held.message.receipt_handle, delay_s)
        except (EntryFailed, QueueUnavailable) as exc:
            log.warning("could not set the retry delay: %s", exc, extra=held.log_fields(self.queue.name))
        self.emit(Kind.RETRY_SCHEDULED, held, delay_s=float(delay_s), error=error, duration_s=duration_s)

    async def release(self, held: Held, *, delay_s: int, reason: str) -> None:
        await self.settle(held)
        try:
            await self.queue.set_visibility(held.message.receipt_handle, delay_s)
        except (EntryFailed, QueueUnavailable) as exc:
            log.warning("could not release the message: %s", exc, extra=held.log_fields(self.queue.name))
        self.emit(Kind.RELEASED, held, delay_s=float(delay_s), reason=reason)

    async def dead_letter(self, held: Held, category: str, error: str, *, duration_s: float | None = None) -> None:
        """Send to the DLQ first, then delete from the source: a crash between the two duplicates, never loses."""
        await self.settle(held)
        message = held.message
        attributes = dead_letter_attributes(
            category=category,
            error_message=error,
            attempts=message.receive_count,
            source_queue=self.queue.name,
            original_message_id=message.message_id,
            failed_at=datetime.now(UTC),
            original=message.message_attributes,
        )
        try:
            await self.dlq.send(
                message.body,
                attributes=attributes,
                group_id=message.group_id,
                deduplication_id=message.message_id,
            )
        except WorkerError as exc:
            log.error(
                "dead-lettering failed; the message stays in the queue: %s", exc, extra=held.log_fields(self.queue.name)
            )
            with contextlib.suppress(EntryFailed, QueueUnavailable):  # else it reappears when its visibility lapses
                await self.queue.set_visibility(message.receipt_handle, DEAD_LETTER_RETRY_S)
            return
        try:
            await self.queue.delete(message.receipt_handle)
        except (EntryFailed, QueueUnavailable) as exc:
            log.warning("dead-lettered, but the delete failed (a duplicate may follow): %s", exc)
        self.emit(Kind.DEAD_LETTERED, held, category=category, error=error, duration_s=duration_s)
