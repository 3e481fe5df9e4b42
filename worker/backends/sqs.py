"""The worker's SQS queue: one class that speaks to the queue through an injected aiobotocore client.

Everything botocore raises is translated by the one error table of ``worker.backends.aws`` (connection failures,
throttling and 5xx become QueueUnavailable; a missing queue, refused credentials or access ConfigError);
per-entry batch failures become EntryFailed for the one caller concerned.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError

from worker.backends.aws import freeze_user_agent, translate
from worker.backends.batching import Batcher, EntryFailed
from worker.backends.protocols import Message
from worker.names import parse_redrive_policy

if TYPE_CHECKING:
    from types_aiobotocore_sqs import SQSClient

__all__ = ["Message", "Queue", "redrive_policy"]

#: The system attributes the worker reads (receive count, enqueue time, FIFO group) and keeps for FIFO messages;
#: asking for "All" makes SQS send, and botocore parse, more of them with every message.
SYSTEM_ATTRIBUTES = [
    "ApproximateReceiveCount",
    "SentTimestamp",
    "MessageGroupId",
    "MessageDeduplicationId",
    "SequenceNumber",
]
#: What a standard queue's messages carry of them (the last three are FIFO's).
STANDARD_SYSTEM_ATTRIBUTES = SYSTEM_ATTRIBUTES[:2]


class Queue:
    """One SQS queue (the work queue or its DLQ) behind an injected aiobotocore SQS client (a MessageQueue)."""

    def __init__(self, client: SQSClient, url: str, *, batch_delay_s: float = 0.005) -> None:
        self.client = client
        freeze_user_agent(client)
        self.url = url
        self.is_fifo = url.endswith(".fifo")
        self._system_attributes = SYSTEM_ATTRIBUTES if self.is_fifo else STANDARD_SYSTEM_ATTRIBUTES
        self.name = url.rstrip("/").rsplit("/", 1)[-1]
        self.deleter: Batcher[str] = Batcher(self._delete_batch, name="delete", max_delay_s=batch_delay_s)
        self.visibility: Batcher[tuple[str, int]] = Batcher(
            self._visibility_batch, name="visibility", max_delay_s=batch_delay_s
        )
        self.receive_calls = 0
        self.send_calls = 0

    async def receive(self, *, max_messages: int, wait_s: int, visibility_timeout_s: int) -> list[Message]:
        self.receive_calls += 1
        try:
            response = await self.client.receive_message(
                QueueUrl=self.url,
                MaxNumberOfMessages=max(1, min(10, max_messages)),
                WaitTimeSeconds=wait_s,
                VisibilityTimeout=visibility_timeout_s,
                MessageSystemAttributeNames=self._system_attributes,  # type: ignore[arg-type]
                MessageAttributeNames=["All"],
            )
        except (TimeoutError, BotoCoreError, ClientError, OSError) as exc:
            raise translate(exc, "ReceiveMessage", resource=self.name) from exc
        return [
            Message(
                message_id=raw["MessageId"],
                receipt_handle=raw["ReceiptHandle"],
                body=raw.get("Body", ""),
                attributes={str(k): v for k, v in raw.get("Attributes", {}).items()},
                message_attributes=dict(raw.get("MessageAttributes", {})),
            )
            for raw in response.get("Messages", [])
        ]

    async def delete(self, receipt_handle: str) -> None:
        """Delete one message (batched with others)."""
        await self.deleter.submit(receipt_handle)

    async def set_visibility(self, receipt_handle: str, timeout_s: int) -> None:
        """Set one message's visibility timeout (batched with others)."""
        await self.visibility.submit((receipt_handle, timeout_s))

    async def send(
        self,
        body: str,
        *,
        attributes: dict[str, Any] | None = None,
        group_id: str | None = None,
        deduplication_id: str | None = None,
        delay_s: int | None = None,
    ) -> str:
        kwargs: dict[str, Any] = {"QueueUrl": self.url, "MessageBody": body}
        if attributes:
            kwargs["MessageAttributes"] = attributes
        if self.is_fifo:
            kwargs["MessageGroupId"] = group_id or "default"
            if deduplication_id:
                kwargs["MessageDeduplicationId"] = deduplication_id
        elif delay_s:
            kwargs["DelaySeconds"] = delay_s
        self.send_calls += 1
        try:
            # One try: the caller (outcomes.dead_letter) retries by the SEND budget, keeping the message invisible.
            response = await self.client.send_message(**kwargs)
        except (TimeoutError, BotoCoreError, ClientError, OSError) as exc:
            raise translate(exc, "SendMessage", resource=self.name) from exc
        return response["MessageId"]

    async def maximum_message_bytes(self) -> int | None:
        """The queue's MaximumMessageSize attribute (body plus attributes), or None when it cannot be read."""
        try:
            response = await self.client.get_queue_attributes(
                QueueUrl=self.url,
                AttributeNames=["MaximumMessageSize"],
            )
            return int(response.get("Attributes", {})["MaximumMessageSize"])
        except (TimeoutError, BotoCoreError, ClientError, OSError, KeyError, ValueError):
            return None

    async def _delete_batch(self, handles: list[str]) -> dict[int, EntryFailed]:
        entries = [{"Id": str(i), "ReceiptHandle": handle} for i, handle in enumerate(handles)]
        try:
            response = await self.client.delete_message_batch(QueueUrl=self.url, Entries=entries)  # type: ignore[arg-type]
        except (TimeoutError, BotoCoreError, ClientError, OSError) as exc:
            raise translate(exc, "DeleteMessageBatch", resource=self.name) from exc
        return _failures(response)

    async def _visibility_batch(self, items: list[tuple[str, int]]) -> dict[int, EntryFailed]:
        entries = [
            {"Id": str(i), "ReceiptHandle": handle, "VisibilityTimeout": timeout_s}
            for i, (handle, timeout_s) in enumerate(items)
        ]
        try:
            response = await self.client.change_message_visibility_batch(
                QueueUrl=self.url,
                Entries=entries,  # type: ignore[arg-type]
            )
        except (TimeoutError, BotoCoreError, ClientError, OSError) as exc:
            raise translate(exc, "ChangeMessageVisibilityBatch", resource=self.name) from exc
        return _failures(response)

    async def drain(self) -> None:
        await asyncio.gather(self.deleter.drain(), self.visibility.drain())

    @property
    def request_count(self) -> int:
        """AWS requests this queue object made (each one is billed)."""
        return self.receive_calls + self.send_calls + self.deleter.calls + self.visibility.calls


def _failures(response: Any) -> dict[int, EntryFailed]:
    return {
        int(item["Id"]): EntryFailed(
            item.get("Code", "Unknown"), item.get("Message", ""), sender_fault=bool(item.get("SenderFault", True))
        )
        for item in response.get("Failed", [])
    }


async def redrive_policy(client: SQSClient, queue_url: str) -> tuple[str | None, int | None]:
    """The DLQ name and maxReceiveCount of the queue's redrive policy (``names.parse_redrive_policy``)."""
    try:
        response = await client.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["RedrivePolicy"])
    except (TimeoutError, BotoCoreError, ClientError, OSError) as exc:
        raise translate(exc, "GetQueueAttributes", resource=queue_url.rsplit("/", 1)[-1]) from exc
    return parse_redrive_policy(response.get("Attributes", {}).get("RedrivePolicy"))
