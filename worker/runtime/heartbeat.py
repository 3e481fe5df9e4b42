"""Heartbeats: keep the claims of held messages alive (ChangeMessageVisibilityBatch, never past SQS's 12-hour
cap) and renew their idempotency leases, while their jobs run or wait their turn."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from worker.backends.batching import EntryFailed
from worker.backends.protocols import MessageQueue
from worker.errors import LedgerUnavailable, QueueUnavailable
from worker.observability.events import Kind, Observers
from worker.policy import visibility_cap_s
from worker.runtime.clock import SYSTEM_CLOCK, Clock
from worker.runtime.connectivity import Connectivity
from worker.runtime.held import Held
from worker.runtime.slots import Slots
from worker.runtime.threads import JobThreads

if TYPE_CHECKING:
    from worker.idempotency import Ledger

HEARTBEAT_TICK_S = 1.0
#: Extend a claim when less than this share of the visibility timeout is left.
EXTEND_BELOW_SHARE = 0.5


class Heartbeat:
    """Extends the visibility of the messages it tracks before it lapses; reports gauges once a tick.

    The runtime ``track``s a message from its receive and ``untrack``s it when its outcome begins; a tracked
    message is one this worker holds (``in_flight``)."""

    def __init__(
        self,
        *,
        queue: MessageQueue,
        slots: Slots,
        visibility_timeout_s: int,
        observers: Observers,
        sqs: Connectivity,
        dynamodb: Connectivity,
        ledger: Ledger | None = None,
        threads: JobThreads | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.queue = queue
        self.clock = clock
        self._held: dict[str, Held] = {}
        self.slots = slots
        self.visibility_timeout_s = visibility_timeout_s
        self.observers = observers
        self.sqs = sqs
        self.dynamodb = dynamodb
        self.ledger = ledger
        self.threads = threads

    def track(self, held: Held) -> None:
        self._held[held.message.receipt_handle] = held

    def untrack(self, held: Held) -> bool:
        """Stop extending ``held``; False when it was not tracked (already untracked)."""
        return self._held.pop(held.message.receipt_handle, None) is not None

    def tracked(self) -> list[Held]:
        return list(self._held.values())

    def __len__(self) -> int:
        return len(self._held)

    def _emit(self, kind: Kind, held: Held, **fields: Any) -> None:
        self.observers.emit(held.event(kind, self.queue.name, **fields))

    async def run(self) -> None:
        """Tick about once a second until cancelled: report gauges, extend claims that are due."""
        while True:
            # Free for jobs: slots a receive loop reserved for its long poll count as free, not busy.
            self.observers.gauge(
                in_flight=len(self._held),
                free_slots=self.slots.total - len(self._held),
                stuck_threads=0 if self.threads is None else self.threads.stuck,
            )
            now = self.clock.monotonic()
            threshold = self.visibility_timeout_s * EXTEND_BELOW_SHARE
            for held in self.tracked():
                if held.finishing or held.lost or (held.extension is not None and not held.extension.done()):
                    continue
                if held.visible_until - now < threshold:
                    held.extension = asyncio.create_task(self._extend(held))
            await asyncio.sleep(HEARTBEAT_TICK_S)  # a fixed cadence; nothing to await but time

    async def _extend(self, held: Held) -> None:
        now = self.clock.monotonic()
        timeout_s = min(self.visibility_timeout_s, visibility_cap_s(elapsed_since_receive_s=now - held.received_at))
        if timeout_s <= 0:
            return
        try:
            await held.queue_or(self.queue).set_visibility(held.message.receipt_handle, timeout_s)
        except EntryFailed as exc:
            held.lost = True
            self._emit(Kind.CLAIM_LOST, held, reason=str(exc))
            return
        except QueueUnavailable as exc:
            self.sqs.down(exc)
            return
        held.visible_until = now + timeout_s
        self._emit(Kind.HEARTBEAT, held, delay_s=float(timeout_s))
        if held.claim is not None and self.ledger is not None and not held.finishing:
            try:
                if not await self.ledger.renew(held.claim, lease_s=timeout_s):
                    self._emit(Kind.CLAIM_LOST, held, reason="idempotency lease was taken over; handler stopped")
                    held.stop_handler()
            except LedgerUnavailable as exc:
                self.dynamodb.down(exc)
