"""The in-memory backend as a third test backend: a broker per ``memory://`` endpoint, and a boto3-shaped SQS
client over it, so the suite's helpers (make_queues, send, drain, queue counts) work on it unchanged while the
worker talks to it through ``worker.backends.memory.MemoryQueue`` (no HTTP anywhere)."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from botocore.exceptions import ClientError

from worker.backends.batching import EntryFailed
from worker.backends.memory import MemoryBroker, MemoryQueue
from worker.backends.protocols import Message
from worker.errors import ConfigError, QueueUnavailable

#: The broker of each memory endpoint ("memory://<id>"), for the session.
BROKERS: dict[str, MemoryBroker] = {}
SCHEME = "memory://"
ACCOUNT = "000000000000"


def new_endpoint() -> str:
    endpoint = f"{SCHEME}{uuid.uuid4().hex[:8]}"
    BROKERS[endpoint] = MemoryBroker()
    return endpoint


def is_memory(endpoint_url: str) -> bool:
    return endpoint_url.startswith(SCHEME)


def broker_of(endpoint_url: str) -> MemoryBroker:
    return BROKERS[endpoint_url.split("/")[0] + "//" + endpoint_url.split("/")[2]]


def memory_queue(queue_url: str, queue_type: type[MemoryQueue] = MemoryQueue) -> MemoryQueue:
    broker, name = broker_of(queue_url), queue_url.rstrip("/").rsplit("/", 1)[-1]
    broker.queue(name)  # ConfigError when there is none
    return queue_type(broker, name)


def _error(code: str, message: str, operation: str) -> ClientError:
    response: Any = {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": 400}}
    return ClientError(response, operation)


class _Meta:
    def __init__(self, endpoint_url: str) -> None:
        self.endpoint_url = endpoint_url


class MemorySQSClient:
    """The SQS calls the suite's helpers and ``sqs-worker bootstrap`` make, as boto3 answers them."""

    def __init__(self, endpoint_url: str) -> None:
        self.meta = _Meta(endpoint_url)
        self.broker = broker_of(endpoint_url)

    def _name(self, queue_url: str) -> str:
        return queue_url.rstrip("/").rsplit("/", 1)[-1]

    def _url(self, name: str) -> str:
        return f"{self.meta.endpoint_url}/{ACCOUNT}/{name}"

    def create_queue(self, *, QueueName: str, Attributes: dict[str, str] | None = None) -> dict[str, Any]:
        attributes = Attributes or {}
        redrive = json.loads(attributes.get("RedrivePolicy", "null")) or {}
        dlq = str(redrive.get("deadLetterTargetArn", "")).rsplit(":", 1)[-1] or None
        self.broker.create_queue(
            QueueName,
            dead_letter_queue=dlq,
            max_receive_count=int(redrive["maxReceiveCount"]) if dlq else None,
            visibility_timeout_s=int(attributes.get("VisibilityTimeout", "30")),
            delay_s=int(attributes.get("DelaySeconds", "0")),
            content_based_deduplication=attributes.get("ContentBasedDeduplication") == "true",
        )
        return {"QueueUrl": self._url(QueueName)}

    def get_queue_url(self, *, QueueName: str) -> dict[str, Any]:
        try:
            self.broker.queue(QueueName)
        except ConfigError:
            raise _error("AWS.SimpleQueueService.NonExistentQueue", "no such queue", "GetQueueUrl") from None
        return {"QueueUrl": self._url(QueueName)}

    def get_queue_attributes(self, *, QueueUrl: str, AttributeNames: list[str]) -> dict[str, Any]:
        attributes = self.broker.attributes(self._name(QueueUrl))
        if "All" not in AttributeNames:
            attributes = {name: value for name, value in attributes.items() if name in AttributeNames}
        return {"Attributes": attributes}

    def set_queue_attributes(self, *, QueueUrl: str, Attributes: dict[str, str]) -> dict[str, Any]:
        redrive = json.loads(Attributes.get("RedrivePolicy", "null")) or {}
        self.broker.configure(
            self._name(QueueUrl),
            dead_letter_queue=str(redrive["deadLetterTargetArn"]).rsplit(":", 1)[-1] if redrive else None,
            max_receive_count=int(redrive["maxReceiveCount"]) if redrive else None,
            visibility_timeout_s=int(Attributes["VisibilityTimeout"]) if "VisibilityTimeout" in Attributes else None,
            maximum_message_bytes=(
                int(Attributes["MaximumMessageSize"]) if "MaximumMessageSize" in Attributes else None
            ),
        )
        return {}

    def send_message(self, *, QueueUrl: str, MessageBody: str, **options: Any) -> dict[str, Any]:
        try:
            message_id = self.broker.send(
                self._name(QueueUrl),
                MessageBody,
                attributes=options.get("MessageAttributes"),
                group_id=options.get("MessageGroupId"),
                deduplication_id=options.get("MessageDeduplicationId"),
                delay_s=options.get("DelaySeconds"),
            )
        except QueueUnavailable as exc:
            cause = exc.__cause__
            raise cause if isinstance(cause, ClientError) else exc from None
        return {"MessageId": message_id}

    def send_message_batch(self, *, QueueUrl: str, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        successful, failed = [], []
        for entry in Entries:
            options = {k: v for k, v in entry.items() if k not in ("Id", "MessageBody")}
            try:
                sent = self.send_message(QueueUrl=QueueUrl, MessageBody=entry["MessageBody"], **options)
            except ClientError as exc:
                error = exc.response.get("Error", {})
                failed.append({"Id": entry["Id"], "Code": error.get("Code"), "Message": error.get("Message")})
                continue
            successful.append({"Id": entry["Id"], "MessageId": sent["MessageId"]})
        return {"Successful": successful, "Failed": failed}

    def receive_message(self, *, QueueUrl: str, **options: Any) -> dict[str, Any]:
        """Long polling on the broker's clock: nothing visible, the clock skips to when a message is due, or to the
        end of the wait (a blocking client; nothing else can change the broker meanwhile)."""
        name = self._name(QueueUrl)
        remaining_s = float(options.get("WaitTimeSeconds", 0))
        while True:
            messages = self.broker.receive_now(
                name,
                max_messages=int(options.get("MaxNumberOfMessages", 1)),
                visibility_timeout_s=options.get("VisibilityTimeout"),
            )
            if messages or remaining_s <= 0:
                break
            due_s = self.broker.next_due_s(name)
            step_s = remaining_s if due_s is None else min(remaining_s, max(due_s, 0.001))
            self.broker.clock.advance(step_s)
            remaining_s -= step_s
        return {
            "Messages": [
                {
                    "MessageId": m.message_id,
                    "ReceiptHandle": m.receipt_handle,
                    "Body": m.body,
                    "Attributes": dict(m.attributes),
                    **({"MessageAttributes": m.message_attributes} if m.message_attributes else {}),
                }
                for m in messages
            ]
        }

    def delete_message(self, *, QueueUrl: str, ReceiptHandle: str) -> dict[str, Any]:
        try:
            self.broker.delete(self._name(QueueUrl), ReceiptHandle)
        except EntryFailed as exc:
            raise _error(exc.code, str(exc), "DeleteMessage") from None
        return {}

    def change_message_visibility(self, *, QueueUrl: str, ReceiptHandle: str, VisibilityTimeout: int) -> dict[str, Any]:
        try:
            self.broker.set_visibility(self._name(QueueUrl), ReceiptHandle, VisibilityTimeout)
        except EntryFailed as exc:
            raise _error(exc.code, str(exc), "ChangeMessageVisibility") from None
        return {}

    def purge_queue(self, *, QueueUrl: str) -> dict[str, Any]:
        self.broker.purge(self._name(QueueUrl))
        return {}


class LingeringQueue(MemoryQueue):
    """A memory queue whose long polls outlive their caller, as SQS's do: a receive the worker gives up on
    (cancelled at shutdown) goes on waiting at the broker until its ``wait_s`` ends, and a message it takes then
    is received (counted, invisible for its visibility timeout) with nobody to read it: ``orphaned``.

    ``polls`` are the receives still open; the test decides when they end (they end by the broker's clock)."""

    def __init__(self, broker: MemoryBroker, name: str) -> None:
        super().__init__(broker, name)
        self.polls: set[asyncio.Task[list[Message]]] = set()
        self.orphaned: list[Message] = []

    async def receive(self, *, max_messages: int, wait_s: int, visibility_timeout_s: int) -> list[Message]:
        poll = asyncio.ensure_future(
            super().receive(max_messages=max_messages, wait_s=wait_s, visibility_timeout_s=visibility_timeout_s)
        )
        self.polls.add(poll)
        poll.add_done_callback(self.polls.discard)
        try:
            return await asyncio.shield(poll)
        except asyncio.CancelledError:
            poll.add_done_callback(self._orphan)
            raise

    def _orphan(self, poll: asyncio.Task[list[Message]]) -> None:
        if not poll.cancelled() and poll.exception() is None:
            self.orphaned.extend(poll.result())
