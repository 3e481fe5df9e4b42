"""Applying a message's outcome to SQS: acknowledge (delete), retry later, hold back, release, or dead-letter.

Each outcome first stops the message's heartbeat and waits for an extension in flight, so no later visibility
change can undo it. Dead-lettering sends to the DLQ before it deletes from the source. A dead-letter send that
fails is retried as a send (with backoff, the message kept invisible meanwhile), never as another run of the
handler: the decision is remembered by message id, so a copy that reappears is dead-lettered (or, once the send
went through, deleted) without running again.

Holding back (``hold_back``: the job was not run and must not lose an attempt) sends a delayed copy carrying the
run and receive counts and the due time, then deletes the message received (see ``worker.flow.attempts`` and
``worker.flow.delays``); on a FIFO queue, or when no copy can be sent, it releases the message in place and
remembers the hold in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from worker.backends.aws import content_refused
from worker.backends.batching import EntryFailed
from worker.backends.protocols import MessageQueue
from worker.budgets import HOLD_COPY, SEND, retry_delay_s
from worker.deadletter import SQS_MAX_MESSAGE_BYTES, dead_letter_record, message_bytes
from worker.errors import QueueUnavailable
from worker.flow.attempts import MAX_MESSAGE_ATTRIBUTES, HoldMemory, held_copy_attributes, without_counts
from worker.flow.delays import DUE_AT_ATTRIBUTE, MAX_HOP_S, due_at_of, format_due_at
from worker.observability.events import Kind, Observers
from worker.policy import visibility_cap_s
from worker.runtime.clock import SYSTEM_CLOCK, Clock
from worker.runtime.held import Held
from worker.runtime.queueset import Route

log = logging.getLogger("worker")
V = TypeVar("V")

#: While a dead-letter send is retried, the message is kept invisible this long past the next try.
DEAD_LETTER_HOLD_S = 60
#: Dead-letter decisions remembered by message id (the oldest are forgotten first; about 1 KiB each).
MAX_DECIDED = 1_000
#: Messages whose job ended here (acknowledged) while their delete had not gone through yet, or failed: a copy SQS
#: hands back to this process is deleted, not run again (the oldest are forgotten first; about 100 bytes each).
MAX_UNDELETED = 1_000
#: The release reason of a message whose body alone is larger than its DLQ's MaximumMessageSize.
DLQ_TOO_SMALL = "too large for the DLQ"
#: Reasons of releases that others tell apart (a burst does not wait for them).
NOT_YET_DUE = "not yet due"
SHUTDOWN = "shutdown"
CANCELLED_AT_SHUTDOWN = "cancelled at shutdown"
#: Such a message is kept in its source queue, invisible this long (at most to the 12-hour limit) each time.
DLQ_TOO_SMALL_HOLD_S = 3600
#: SQS's maximum message size before August 2025, still the default of some queues and emulators.
LEGACY_MAX_MESSAGE_BYTES = 262_144


@dataclass
class Decided:
    """A message decided dead: its dead-letter category and error, the receipt handle of the receive being
    sent (a newer receive takes over), and whether the DLQ has it already. Never holds the body."""

    category: str
    error: str
    job_type: str | None
    owner: str
    sent: bool = False
    workflow_id: str | None = None


class Outcomes:
    """The four ways a held message leaves this worker, each reported to the observers."""

    def __init__(
        self,
        *,
        queue: MessageQueue,
        dlq: MessageQueue,
        observers: Observers,
        max_hop_s: int = MAX_HOP_S,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.queue = queue
        self.clock = clock
        self.dlq = dlq
        self.observers = observers
        self.max_hop_s = max_hop_s
        #: Holds applied in place (FIFO, or no copy could be sent): subtracted from the receive count.
        self.holds = HoldMemory()
        self._decided: OrderedDict[str, Decided] = OrderedDict()
        self._undeleted: OrderedDict[str, None] = OrderedDict()
        self._dlq_limits: dict[str, int | None] = {}

    def emit(self, kind: Kind, held: Held, **fields: Any) -> None:
        self.observers.emit(held.event(kind, self.queue.name, **fields))

    async def settle(self, held: Held) -> None:
        """Stop heartbeats for ``held`` and wait for an extension in flight, so no later call undoes ours."""
        held.finishing = True
        if held.extension is not None and not held.extension.done():
            await asyncio.gather(held.extension, return_exceptions=True)

    async def ack(self, held: Held) -> None:
        """Delete a message whose job ended (succeeded, or a completed duplicate). Until the delete went through
        its id is remembered (``acknowledged``): a copy SQS hands back meanwhile, or after the delete failed, is
        deleted again rather than run again."""
        await self.settle(held)
        message_id = held.message.message_id
        _remember(self._undeleted, message_id, None, capacity=MAX_UNDELETED)
        try:
            await held.queue_or(self.queue).delete(held.message.receipt_handle)
        except (EntryFailed, QueueUnavailable) as exc:
            log.warning(
                "delete failed; if the message comes back to this worker it is deleted again, elsewhere it runs "
                "again: %s",
                exc,
                extra=held.log_fields(self.queue.name),
            )
            return
        self._undeleted.pop(message_id, None)

    def acknowledged(self, message_id: str) -> bool:
        """This process acknowledged the message and its delete has not gone through (in flight, or failed)."""
        return message_id in self._undeleted

    async def retry(self, held: Held, delay_s: int, error: str, duration_s: float) -> None:
        await self.settle(held)
        delay_s = min(delay_s, visibility_cap_s(elapsed_since_receive_s=self.clock.monotonic() - held.received_at))
        try:
            await held.queue_or(self.queue).set_visibility(held.message.receipt_handle, delay_s)
        except (EntryFailed, QueueUnavailable) as exc:
            log.warning("could not set the retry delay: %s", exc, extra=held.log_fields(self.queue.name))
        self.emit(Kind.RETRY_SCHEDULED, held, delay_s=float(delay_s), error=error, duration_s=duration_s)

    async def release(self, held: Held, *, delay_s: int, reason: str) -> None:
        await self.settle(held)
        try:
            await held.queue_or(self.queue).set_visibility(held.message.receipt_handle, delay_s)
        except (EntryFailed, QueueUnavailable) as exc:
            log.warning("could not release the message: %s", exc, extra=held.log_fields(self.queue.name))
        self.emit(Kind.RELEASED, held, delay_s=float(delay_s), reason=reason)

    async def hold_back(self, held: Held, delay_s: int, reason: str) -> None:
        """Put back a job that was not run (a FIFO release, a lease held elsewhere, a shutdown, a job not yet due,
        a limit or a breaker), for ``delay_s``, without costing it an attempt.

        Standard queue: a copy delayed by ``min(delay_s, max_hop_s)`` carries the counts (and, past one hop, the
        due time), then the received message is deleted; a failed delete may leave a duplicate. FIFO queue (a copy
        would lose the group's order), or when the copy cannot be sent: released in place (visibility), the hold
        remembered by this process.
        """
        await self.settle(held)
        queue = held.queue_or(self.queue)
        if not queue.is_fifo and await self._send_copy(held, delay_s):
            try:
                await queue.delete(held.message.receipt_handle)
            except (EntryFailed, QueueUnavailable) as exc:
                log.warning(
                    "held back, but the delete failed; the job may run twice: %s",
                    exc,
                    extra=held.log_fields(self.queue.name),
                )
            self.emit(Kind.RELEASED, held, delay_s=float(delay_s), reason=reason)
            return
        self.holds.note(held.message.message_id)
        cap_s = visibility_cap_s(elapsed_since_receive_s=self.clock.monotonic() - held.received_at)
        try:
            await queue.set_visibility(held.message.receipt_handle, min(delay_s, cap_s))
        except (EntryFailed, QueueUnavailable) as exc:
            log.warning("could not release the message: %s", exc, extra=held.log_fields(self.queue.name))
        self.emit(Kind.RELEASED, held, delay_s=float(delay_s), reason=reason)

    async def _send_copy(self, held: Held, delay_s: int) -> bool:
        """Send the held message's delayed copy with its counts; False when it cannot be sent."""
        message = held.message
        attributes = held_copy_attributes(
            message.message_attributes, attempt=held.attempt, receive_count=held.receive_count
        )
        if delay_s > self.max_hop_s:
            try:
                due_at = due_at_of(message.message_attributes)
            except ValueError:
                due_at = None
            wanted = datetime.fromtimestamp(self.clock.time(), UTC) + timedelta(seconds=delay_s)
            attributes[DUE_AT_ATTRIBUTE] = {
                "DataType": "String",
                "StringValue": format_due_at(max(wanted, due_at) if due_at is not None else wanted),
            }
        if len(attributes) > MAX_MESSAGE_ATTRIBUTES:
            return False
        tries, first_try = 0, self.clock.monotonic()
        while True:
            try:
                await held.queue_or(self.queue).send(
                    message.body, attributes=attributes, delay_s=min(delay_s, self.max_hop_s)
                )
                return True
            except QueueUnavailable as exc:  # a transport failure: tried again by HOLD_COPY
                tries += 1
                wait_s = retry_delay_s(
                    budget=HOLD_COPY,
                    failures=tries,
                    elapsed_s=self.clock.monotonic() - first_try,
                    jitter=random.random(),
                )
                if wait_s is None:
                    failure: Exception = exc
                    break
                await asyncio.sleep(wait_s)
            except Exception as exc:  # anything else: the in-place release still puts the job back
                failure = exc
                break
        log.warning(
            "could not send the held message's copy; releasing it in place (this receive counts toward "
            "maxReceiveCount): %s",
            failure,
            extra=held.log_fields(self.queue.name),
        )
        return False

    def decided(self, message_id: str) -> Decided | None:
        """The dead-letter decision already taken for this message, if this worker took one."""
        return self._decided.get(message_id)

    async def dead_letter(self, held: Held, category: str, error: str, *, duration_s: float | None = None) -> None:
        """Send to the DLQ first, then delete from the source: a crash between the two duplicates, never loses.

        A failed send is tried again (backoff, message kept invisible) until it goes through; a refused content
        falls back to fewer attributes. A copy of a message whose record is in the DLQ already is only deleted.
        """
        await self.settle(held)
        message = held.message
        previous = self._decided.get(message.message_id)
        if previous is not None and previous.sent:
            await self._delete_dead_lettered(held)
            return
        if await self._too_large_for_dlq(held, category):
            return
        entry = _remember(
            self._decided,
            message.message_id,
            Decided(category, error, held.job_type, message.receipt_handle, workflow_id=held.workflow_id),
            capacity=MAX_DECIDED,
        )
        attributes = await self._attributes(held, category, error)
        tries, first_try = 0, self.clock.monotonic()
        while True:
            try:
                dlq_message_id = await self._dlq(held).send(
                    message.body,
                    attributes=attributes,
                    group_id=message.group_id,
                    deduplication_id=message.message_id,
                )
                break
            except Exception as exc:  # anything: a loop of sends, never another run of the handler
                current = self._decided.get(message.message_id)
                if current is not None and current is not entry:
                    return  # a newer receive of this message took the dead-lettering over
                tries += 1
                delay_s = retry_delay_s(
                    budget=SEND, failures=tries, elapsed_s=self.clock.monotonic() - first_try, jitter=random.random()
                )
                assert delay_s is not None  # SEND never gives up
                if content_refused(exc) and attributes:
                    attributes = self._smaller(held, category, error, attributes)
                    delay_s = 0.0
                log.log(
                    logging.ERROR if tries == 1 else logging.WARNING,
                    "dead-letter send failed (try %d); trying again in %.1f s, the message stays invisible: %s",
                    tries,
                    delay_s,
                    exc,
                    extra=held.log_fields(self.queue.name),
                )
                if not await self._hold(held, delay_s):
                    log.error(
                        "dead-letter send still failing at the 12-hour visibility limit; the message will "
                        "reappear and be dead-lettered again",
                        extra=held.log_fields(self.queue.name),
                    )
                    return
                await asyncio.sleep(delay_s)
        entry.sent = True
        await self._delete_dead_lettered(held)
        # The DLQ's id of the record: `dlq show` finds a record by it, even one with no room for attributes.
        extra = {"dlq_message_id": dlq_message_id} if dlq_message_id else {}
        self.emit(Kind.DEAD_LETTERED, held, category=category, error=error, duration_s=duration_s, extra=extra)

    async def check_dlq_sizes(self, routes: Sequence[Route]) -> None:
        """At start: one ERROR line per DLQ whose MaximumMessageSize is smaller than its source queue's (a body
        between the two could never be dead-lettered; it would be kept in the source queue)."""
        for route in routes:
            source_bytes = await route.queue.maximum_message_bytes()
            dlq_bytes = await self.dlq_max_message_bytes(route.dlq)
            if source_bytes is not None and dlq_bytes < source_bytes:
                log.error(
                    "the DLQ %s takes messages of at most %d bytes (its MaximumMessageSize) but %s takes %d: a "
                    "larger body can never be dead-lettered and stays in %s; run `sqs-worker bootstrap` or raise "
                    "the DLQ's MaximumMessageSize",
                    route.dlq.name,
                    dlq_bytes,
                    route.queue.name,
                    source_bytes,
                    route.queue.name,
                )

    async def _too_large_for_dlq(self, held: Held, category: str) -> bool:
        """True when the body alone is larger than the DLQ's MaximumMessageSize (read again, in case it was
        raised): the message can never be dead-lettered, so it is kept in its source queue, released for
        DLQ_TOO_SMALL_HOLD_S, with an ERROR line and a ``released`` event; never deleted, never sent in a loop."""
        dlq = self._dlq(held)
        size = message_bytes(held.message.body, {})
        if size <= await self.dlq_max_message_bytes(dlq):
            return False
        self._dlq_limits.pop(dlq.name, None)
        limit = await self.dlq_max_message_bytes(dlq)
        if size <= limit:
            return False
        queue = held.queue_or(self.queue)
        cap_s = visibility_cap_s(elapsed_since_receive_s=self.clock.monotonic() - held.received_at)
        hold_s = max(0, min(DLQ_TOO_SMALL_HOLD_S, math.floor(cap_s)))
        log.error(
            "cannot dead-letter (%s): the body is %d bytes and the DLQ %s takes at most %d (its MaximumMessageSize); "
            "kept in %s, invisible for %d s: raise the DLQ's MaximumMessageSize (sqs-worker bootstrap does)",
            category,
            size,
            dlq.name,
            limit,
            queue.name,
            hold_s,
            extra=held.log_fields(self.queue.name),
        )
        with contextlib.suppress(EntryFailed, QueueUnavailable):
            await queue.set_visibility(held.message.receipt_handle, hold_s)
        self.emit(Kind.RELEASED, held, delay_s=float(hold_s), reason=DLQ_TOO_SMALL, category=category)
        return True

    async def _attributes(self, held: Held, category: str, error: str) -> dict[str, dict[str, Any]]:
        return self._fitted(held, category, error, await self.dlq_max_message_bytes(self._dlq(held)))

    def _smaller(
        self, held: Held, category: str, error: str, attributes: dict[str, dict[str, Any]]
    ) -> dict[str, dict[str, Any]]:
        """Attributes for another try after SQS refused ``attributes``, which are sanitized and sized, so a limit
        we could not know was hit: fitted to SQS's former 256 KiB, else the category alone, else none. The body
        always stays as it is."""
        legacy = self._fitted(held, category, error, LEGACY_MAX_MESSAGE_BYTES)
        if message_bytes("", legacy) < message_bytes("", attributes):
            return legacy
        keep = {name: value for name, value in attributes.items() if name == "error_category"}
        return keep if keep != attributes else {}

    def _fitted(self, held: Held, category: str, error: str, limit: int) -> dict[str, dict[str, Any]]:
        message = held.message
        record = dead_letter_record(
            category=category,
            error_message=error,
            attempts=held.attempt,
            receive_count=held.receive_count,
            source_queue=held.queue_or(self.queue).name,
            original_message_id=message.message_id,
            failed_at=datetime.fromtimestamp(self.clock.time(), UTC),
            original=without_counts(message.message_attributes),
            body=message.body,
            max_message_bytes=limit,
            workflow_id=held.workflow_id,
        )
        if record.trimmed:
            log.warning(
                "dead-letter attributes trimmed to fit the DLQ's %d-byte message size: %s",
                limit,
                "; ".join(record.trimmed),
                extra=held.log_fields(self.queue.name),
            )
        return record.attributes

    def _dlq(self, held: Held) -> MessageQueue:
        """The DLQ of the queue ``held`` came from."""
        return held.route.dlq if held.route is not None else self.dlq

    async def dlq_max_message_bytes(self, dlq: MessageQueue | None = None) -> int:
        """A DLQ's MaximumMessageSize (default: this worker's first DLQ), read once each (1 MiB, SQS's limit,
        while it cannot be read)."""
        dlq = dlq or self.dlq
        if dlq.name not in self._dlq_limits:
            self._dlq_limits[dlq.name] = await dlq.maximum_message_bytes()
        return self._dlq_limits[dlq.name] or SQS_MAX_MESSAGE_BYTES

    async def _hold(self, held: Held, delay_s: float) -> bool:
        """Keep the message invisible past the next try. False when the 12-hour limit leaves no time."""
        cap_s = visibility_cap_s(elapsed_since_receive_s=self.clock.monotonic() - held.received_at)
        if cap_s <= delay_s:
            return False
        with contextlib.suppress(EntryFailed, QueueUnavailable):
            await held.queue_or(self.queue).set_visibility(
                held.message.receipt_handle, min(cap_s, math.ceil(delay_s) + DEAD_LETTER_HOLD_S)
            )
        return True

    async def _delete_dead_lettered(self, held: Held) -> None:
        try:
            await held.queue_or(self.queue).delete(held.message.receipt_handle)
        except (EntryFailed, QueueUnavailable) as exc:
            log.warning("dead-lettered, but the delete failed (a duplicate may follow): %s", exc)


def _remember(memory: OrderedDict[str, V], message_id: str, value: V, *, capacity: int) -> V:
    """Keep ``value`` as ``memory``'s newest entry for ``message_id``; the oldest beyond ``capacity`` are forgotten."""
    memory.pop(message_id, None)
    memory[message_id] = value
    while len(memory) > capacity:
        memory.popitem(last=False)
    return value
