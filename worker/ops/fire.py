"""Firing a schedule by hand: what ``sqs-worker schedules fire`` and the dashboard's "fire now" send."""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from worker.backends.aws import resolve_queue_url_sync, translate
from worker.names import queue_name_of

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

    from worker.scheduling.schedules import Schedule


def send_scheduled(client: SQSClient, queue: str, schedule: Schedule, scheduled: datetime) -> str:
    """Send what Scheduler sends for one fire; returns the MessageId.

    FIFO queues get the schedule's name as MessageGroupId (as the module's target sets it) and the body's
    SHA-256 as MessageDeduplicationId (what content-based deduplication would use).
    """
    body = schedule.message_body(scheduled)
    queue_url = resolve_queue_url_sync(client, queue)
    try:
        extra: dict[str, str] = {}
        if queue_name_of(queue_url).endswith(".fifo"):
            extra = {
                "MessageGroupId": schedule.name,
                "MessageDeduplicationId": hashlib.sha256(body.encode("utf-8")).hexdigest(),
            }
        response = client.send_message(QueueUrl=queue_url, MessageBody=body, **extra)  # type: ignore[arg-type]
    except (BotoCoreError, ClientError, OSError) as exc:
        raise translate(
            exc, "SendMessage", resource=queue_name_of(queue_url), endpoint=client.meta.endpoint_url
        ) from exc
    return response["MessageId"]
