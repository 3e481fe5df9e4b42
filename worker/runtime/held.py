"""What the worker holds: a received message from its receive until its outcome was applied."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from worker.backends.protocols import Message, MessageQueue
from worker.observability.events import Event, Kind

if TYPE_CHECKING:
    from worker.flow.gate import Ticket
    from worker.idempotency import Claim
    from worker.runtime.queueset import Route

log = logging.getLogger("worker")


@dataclass(eq=False)
class Held:
    """A message this worker holds: from its receive until its outcome was applied."""

    message: Message
    received_at: float
    visible_until: float
    finishing: bool = False
    lost: bool = False
    #: It holds one of the worker's starts (``worker.runtime.starts``): from its start until its outcome began.
    started: bool = False
    claim: Claim | None = None
    lease_lost: bool = False
    job_type: str | None = None
    #: Handler runs of this job, this one included, and its receives (see ``worker.flow.attempts``).
    attempt: int = 1
    receive_count: int = 1
    workflow_id: str | None = None
    ticket: Ticket | None = None  # what the flow gate let through (rate limit, breaker), for its report
    extension: asyncio.Task[None] | None = field(default=None, repr=False)
    #: The task running the handler, while it runs, and the cancellations a lost lease sent it.
    handler: asyncio.Task[Any] | None = field(default=None, repr=False)
    lease_cancels: int = 0
    #: The last event about this message (the attempt's outcome once applied; read by the tracing span).
    last_event: Event | None = field(default=None, repr=False)
    #: The queue it came from and that queue's DLQ (None: the worker's only queue, as its Outcomes know it).
    route: Route | None = field(default=None, repr=False)

    def claim_running_out(self, now: float, *, margin_s: float) -> bool:
        """Its claim has less than ``margin_s`` left at ``now`` (monotonic): heartbeats extend ``visible_until``
        only when SQS answers."""
        return self.visible_until - now <= margin_s

    def queue_or(self, default: MessageQueue) -> MessageQueue:
        """The queue this message came from (its route's), else ``default``."""
        return self.route.queue if self.route is not None else default

    def stop_handler(self) -> None:
        """Cancel the running handler: its idempotency lease went to another worker, which runs the job now."""
        self.lease_lost = True
        if self.handler is not None and not self.handler.done() and self.handler.cancel():
            self.lease_cancels += 1

    def end_handler(self) -> None:
        """The handler returned or raised: no later lost lease cancels its task, and the cancellations one sent
        are taken back (``Task.uncancel``), so ``cancelling()`` counts only the worker's own (shutdown)."""
        task, self.handler = self.handler, None
        if task is not None:
            for _ in range(self.lease_cancels):
                task.uncancel()
        self.lease_cancels = 0

    def event(self, kind: Kind, queue: str, **fields: Any) -> Event:
        """An event about this message (``queue``: the name reported unless its route names its own queue;
        remembered as ``last_event``); never carries its payload."""
        self.last_event = Event(
            kind=kind,
            queue=self.route.queue.name if self.route is not None else queue,
            message_id=self.message.message_id,
            job_type=self.job_type,
            attempt=self.attempt,
            **fields,
        )
        return self.last_event

    def log_fields(self, queue: str) -> dict[str, Any]:
        name = self.route.queue.name if self.route is not None else queue
        return {"message_id": self.message.message_id, "job_type": self.job_type, "queue": name}
