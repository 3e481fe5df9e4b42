"""The runtime's side of workflows: telling a step's outcome to ``worker.workflows`` without ever failing the
message's handling. Each call answers False when the table or the queue failed: the worker then puts the message
back (``LEDGER_RETRY_S``) and its next copy tells the outcome again (every call is safe to repeat)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from worker.envelope import Envelope, parse_envelope
from worker.errors import InvalidMessage, LedgerUnavailable, QueueUnavailable
from worker.runtime.held import Held

if TYPE_CHECKING:
    from worker.workflows import WorkflowHooks

log = logging.getLogger("worker")


class WorkflowSteps:
    """Wraps the workflow hooks (None: workflows are off, nothing to tell) for one queue's worker."""

    def __init__(self, hooks: WorkflowHooks | None, *, queue_name: str) -> None:
        self.hooks = hooks
        self.queue_name = queue_name

    async def succeeded(self, held: Held, envelope: Envelope, result: Any) -> bool:
        """A step succeeded (or a completed copy came back): send the next step, count the member."""
        if self.hooks is None or envelope.workflow is None:
            return True
        return await self._tell("advance the workflow", held, self.hooks.succeeded(envelope, result, **self._id(held)))

    async def failed(self, held: Held, envelope: Envelope, error: str) -> bool:
        """A step failed for good: record it before it is dead-lettered."""
        if self.hooks is None or envelope.workflow is None:
            return True
        return await self._tell("record the failed step", held, self.hooks.failed(envelope, error, **self._id(held)))

    async def refused(self, held: Held, error: InvalidMessage) -> bool:
        """A step whose type or payload is refused fails its step too (a group must not wait for it forever)."""
        try:
            envelope = parse_envelope(held.message.body)
        except InvalidMessage:
            return True  # not an envelope: it names no workflow
        if envelope.workflow is None:
            return True
        held.workflow_id = envelope.workflow.id
        return await self.failed(held, envelope, f"{error.category}: {error}")

    @staticmethod
    def _id(held: Held) -> dict[str, str]:
        return {"message_id": held.message.message_id}

    async def _tell(self, what: str, held: Held, call: Any) -> bool:
        try:
            await call
        except (LedgerUnavailable, QueueUnavailable) as exc:
            log.error("could not %s; trying again: %s", what, exc, extra=held.log_fields(self.queue_name))
            return False
        return True
