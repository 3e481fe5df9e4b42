"""What a queue holds, by its counts: the one way the tests prove a message is gone.

A short drain cannot tell "deleted" from "received and never deleted" (the message is merely invisible until its
visibility timeout lapses): an ``ack`` that never deletes would pass it. The queue's counts can: a message exists
until it is deleted, visible, in flight or delayed.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient
    from mypy_boto3_sqs.literals import QueueAttributeNameType

#: Every state a message can be in: visible, in flight (received, not deleted), delayed (DelaySeconds).
COUNT_ATTRIBUTES: tuple[QueueAttributeNameType, ...] = (
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
)


def queue_counts(client: SQSClient, queue_url: str) -> dict[str, int]:
    """The queue's visible, not visible and delayed counts (exact on moto and LocalStack, approximate on AWS)."""
    response = client.get_queue_attributes(QueueUrl=queue_url, AttributeNames=list(COUNT_ATTRIBUTES))
    attributes = response.get("Attributes", {})
    return {name: int(attributes.get(name, "0")) for name in COUNT_ATTRIBUTES}


def message_count(client: SQSClient, queue_url: str) -> int:
    """How many messages the queue holds in any state: visible + not visible + delayed."""
    return sum(queue_counts(client, queue_url).values())


def assert_queue_empty(client: SQSClient, queue_url: str, *, settle_s: float = 2.0) -> None:
    """Fail unless the queue holds no message at all (visible + not visible + delayed == 0).

    Polls for up to ``settle_s`` for the counts to settle (AWS's are approximate); a message that is merely
    invisible stays counted however long it waits, so it always fails this check.
    """
    deadline = time.monotonic() + settle_s
    while True:
        counts = queue_counts(client, queue_url)
        if not any(counts.values()):
            return
        if time.monotonic() >= deadline:
            name = queue_url.rstrip("/").rsplit("/", 1)[-1]
            raise AssertionError(f"queue {name} is not empty after {settle_s} s: {counts}")
        time.sleep(0.1)  # counts of another process's deletes: nothing to await but the endpoint
