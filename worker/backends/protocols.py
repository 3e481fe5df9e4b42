"""What the runtime and the ledger need of a backend, as small Protocols; each backend implements them.

- :class:`MessageQueue`: one queue (the work queue or its DLQ) as the runtime uses it. Implemented by
  ``worker.backends.sqs.Queue`` (SQS over aiobotocore) and ``worker.backends.memory.MemoryQueue``.
- :class:`LedgerStore`: the idempotency ledger's item store (gets and conditional writes). Implemented by
  ``worker.idempotency.dynamodb.DynamoDBStore`` and ``worker.idempotency.memory.MemoryStore``.
- :class:`Message`: a received message, the same for every backend (SQS's names for its system attributes).

Errors follow the ``worker.errors`` tree whatever the backend: an endpoint that cannot serve a call raises
``QueueUnavailable`` / ``LedgerUnavailable``, a wrong setting ``ConfigError``, and one refused entry of a delete or
visibility change ``worker.backends.batching.EntryFailed`` for its caller alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from worker.idempotency.expressions import Condition, Update, WriteResult


@dataclass(frozen=True)
class Message:
    """A received message. ``attributes`` are the system attributes by their SQS names (ApproximateReceiveCount,
    SentTimestamp, MessageGroupId, ...); ``message_attributes`` the producer's, as SQS returns them."""

    message_id: str
    receipt_handle: str
    body: str
    attributes: dict[str, str]
    message_attributes: dict[str, Any]

    @property
    def receive_count(self) -> int:
        return int(self.attributes.get("ApproximateReceiveCount", "1"))

    @property
    def sent_timestamp_ms(self) -> int | None:
        value = self.attributes.get("SentTimestamp")
        return int(value) if value else None

    @property
    def group_id(self) -> str | None:
        return self.attributes.get("MessageGroupId")


class MessageQueue(Protocol):
    """One queue as the runtime talks to it: receive, acknowledge, change visibility, send (dead letters)."""

    @property
    def name(self) -> str:
        """The queue's name (its URL's last part), for logs and dead-letter records."""

    @property
    def is_fifo(self) -> bool: ...

    async def receive(self, *, max_messages: int, wait_s: int, visibility_timeout_s: int) -> list[Message]:
        """Up to ``max_messages`` (at most 10) messages, each invisible for ``visibility_timeout_s`` and its receive
        counted; waits up to ``wait_s`` for one to arrive (long polling)."""

    async def delete(self, receipt_handle: str) -> None:
        """Acknowledge a received message."""

    async def set_visibility(self, receipt_handle: str, timeout_s: int) -> None:
        """Make a received message visible again ``timeout_s`` from now (0: at once)."""

    async def send(
        self,
        body: str,
        *,
        attributes: dict[str, Any] | None = None,
        group_id: str | None = None,
        deduplication_id: str | None = None,
        delay_s: int | None = None,
    ) -> str:
        """Send one message; returns its MessageId."""

    async def maximum_message_bytes(self) -> int | None:
        """The queue's MaximumMessageSize (body plus attributes), or None when it cannot be read."""

    async def drain(self) -> None:
        """Send whatever calls are still batched, and wait for them."""

    @property
    def request_count(self) -> int:
        """Requests this queue object made (each one is billed on SQS)."""


class LedgerStore(Protocol):
    """The idempotency ledger's items: strongly consistent reads and conditional writes, no policy."""

    @property
    def table_name(self) -> str: ...

    async def get(self, key: str) -> dict[str, object] | None:
        """The item, or None."""

    async def update(
        self, key: str, update: Update, *, condition: Condition, values: Mapping[str, object], return_new: bool = False
    ) -> WriteResult:
        """Apply ``update`` when ``condition`` holds: ok with the new item (when ``return_new``), else ``ok=False``
        with the item as it was."""

    async def put(
        self, item: Mapping[str, object], *, condition: Condition, values: Mapping[str, object]
    ) -> WriteResult:
        """Replace the whole item when ``condition`` holds; else ``ok=False`` with the item as it was."""
