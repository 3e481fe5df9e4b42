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

    from worker.idempotency import Record
    from worker.scheduling.schedules import Schedule


def skip_note(key: str, record: Record | None, *, name: str, table: str, now_ms: int) -> str | None:
    """What the worker will do with a fired slot whose key the ledger already holds as done or running (pure; read
    the record before the send: after it, a running worker may have completed this very message)."""
    from worker.idempotency.ledger import State

    state = record.state(now_ms) if record is not None else None
    if state is State.COMPLETED:
        return (
            f"note: key {key} is already COMPLETED in table {table}: the worker will skip this message as a "
            f"duplicate; for a fresh run: sqs-worker schedules fire {name} --now"
        )
    if state is State.RUNNING:
        return f"note: key {key} is RUNNING in table {table}: the worker skips this message if that run completes"
    return None


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
