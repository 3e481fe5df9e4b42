"""A convenience producer over plain boto3. Never required: any ``send_message`` of the envelope works.

Failures are translated by the edge's one error table (``worker.backends.aws.translate``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import ValidationError

from worker.backends.aws import translate
from worker.envelope import describe_errors, dump_envelope
from worker.errors import ConfigError
from worker.names import queue_name_of
from worker.observability.tracing import trace_attributes

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

#: SQS caps DelaySeconds at 15 minutes.
MAX_DELAY_S = 900


@dataclass(frozen=True)
class Job:
    """One job to enqueue."""

    type: str
    payload: dict[str, Any] = field(default_factory=dict)
    idempotency_key: str | None = None
    delay_s: int = 0
    group_id: str | None = None  # FIFO queues: the MessageGroupId (default: the job type)


def _entry(job: Job, *, fifo: bool) -> dict[str, Any]:
    if not 0 <= job.delay_s <= MAX_DELAY_S:
        raise ConfigError(f"delay_s must be between 0 and {MAX_DELAY_S} (SQS limit)")
    try:
        body = dump_envelope(job.type, job.payload, job.idempotency_key)
    except ValidationError as exc:
        raise ConfigError("job " + describe_errors(exc)) from None
    entry: dict[str, Any] = {"MessageBody": body}
    trace = trace_attributes()  # the current span's W3C traceparent (the otel extra installed)
    if trace:
        entry["MessageAttributes"] = trace
    if fifo:
        if job.delay_s:
            raise ConfigError("FIFO queues take no per-message delay")
        entry["MessageGroupId"] = job.group_id or job.type
        entry["MessageDeduplicationId"] = job.idempotency_key or uuid.uuid4().hex
    elif job.delay_s:
        entry["DelaySeconds"] = job.delay_s
    return entry


def enqueue(client: SQSClient, queue_url: str, job: Job) -> str:
    """Send one job; returns its MessageId."""
    try:
        response = client.send_message(QueueUrl=queue_url, **_entry(job, fifo=queue_url.endswith(".fifo")))
    except (BotoCoreError, ClientError, OSError) as exc:
        raise translate(
            exc, "SendMessage", resource=queue_name_of(queue_url), endpoint=client.meta.endpoint_url
        ) from exc
    return response["MessageId"]


def enqueue_many(client: SQSClient, queue_url: str, jobs: Iterable[Job]) -> list[str]:
    """Send jobs with SendMessageBatch, 10 per request; returns MessageIds in order.

    Entries that SQS refuses are retried once on their own; a job that still fails raises, naming it.
    """
    fifo = queue_url.endswith(".fifo")
    all_jobs = list(jobs)
    ids: list[str] = [""] * len(all_jobs)
    for start in range(0, len(all_jobs), 10):
        chunk = all_jobs[start : start + 10]
        entries = [{"Id": str(start + i), **_entry(job, fifo=fifo)} for i, job in enumerate(chunk)]
        try:
            response = client.send_message_batch(QueueUrl=queue_url, Entries=entries)  # type: ignore[arg-type]
        except (BotoCoreError, ClientError, OSError) as exc:
            name = queue_name_of(queue_url)
            raise translate(exc, "SendMessageBatch", resource=name, endpoint=client.meta.endpoint_url) from exc
        for ok in response.get("Successful", []):
            ids[int(ok["Id"])] = ok["MessageId"]
        for failed in response.get("Failed", []):
            index = int(failed["Id"])
            ids[index] = enqueue(client, queue_url, all_jobs[index])
    return ids
