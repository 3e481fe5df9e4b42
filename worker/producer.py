"""A convenience producer over plain boto3. Never required: any ``send_message`` of the envelope works.

The one place that builds a job's SQS entry (body, attributes, delay). A delay past SQS's 900 s, or a ``run_at``,
adds the ``sqs_worker_due_at`` attribute and sends with the first hop's delay (``worker.flow.delays``).

Failures are translated by the edge's one error table (``worker.backends.aws.translate``)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import ValidationError
from pydantic_core import PydanticSerializationError

from worker.backends.aws import translate
from worker.envelope import describe_errors, dump_envelope, parse_envelope
from worker.errors import ConfigError, InvalidMessage
from worker.flow.delays import DUE_AT_ATTRIBUTE, MAX_DELAY_S, format_due_at, schedule
from worker.names import queue_name_of
from worker.observability.tracing import trace_attributes

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

__all__ = ["MAX_DELAY_S", "Job", "enqueue", "enqueue_many"]


@dataclass(frozen=True)
class Job:
    """One job to enqueue."""

    type: str
    payload: dict[str, Any] = field(default_factory=dict)
    idempotency_key: str | None = None
    delay_s: int = 0  # up to a year; past 900 s the worker re-delays it in hops of 15 minutes
    group_id: str | None = None  # FIFO queues: the MessageGroupId (default: the job type)
    run_at: datetime | None = None  # when to run (timezone-aware), instead of delay_s


def _entry(job: Job, *, fifo: bool) -> dict[str, Any]:
    if fifo and (job.delay_s or job.run_at is not None):
        raise ConfigError(
            "FIFO queues take no per-message delay (SQS delays a FIFO queue's messages only as a whole): "
            "send without delay_s/run_at, or use a standard queue"
        )
    timing = schedule(delay_s=job.delay_s, run_at=job.run_at, now=datetime.now(UTC))
    entry: dict[str, Any] = {"MessageBody": envelope_body(job)}
    trace = trace_attributes()  # the current span's W3C traceparent (the otel extra installed)
    if trace:
        entry["MessageAttributes"] = trace
    if fifo:
        entry["MessageGroupId"] = job.group_id or job.type
        entry["MessageDeduplicationId"] = job.idempotency_key or uuid.uuid4().hex
    else:
        if timing.delay_s:
            entry["DelaySeconds"] = timing.delay_s
        if timing.due_at is not None:
            due = {"DataType": "String", "StringValue": format_due_at(timing.due_at)}
            entry["MessageAttributes"] = {**entry.get("MessageAttributes", {}), DUE_AT_ATTRIBUTE: due}
    return entry


def envelope_body(job: Job) -> str:
    """The envelope of ``job`` as JSON text, for any backend. Raises ConfigError (nothing sent) for a job the
    envelope refuses, for text that is not valid Unicode (a lone surrogate: UTF-8, and so SQS or a task's body,
    cannot carry it), and for a body the worker would refuse (nesting deeper than 100, an integer of more than
    4,300 digits)."""
    not_unicode = ConfigError(
        f"job {job.type!r}: the payload holds a string that is not valid Unicode "
        "(a lone surrogate such as '\\ud800'); nothing sent"
    )
    try:
        body = dump_envelope(job.type, job.payload, job.idempotency_key)
    except ValidationError as exc:
        raise ConfigError("job " + describe_errors(exc)) from None
    except PydanticSerializationError:  # a lone surrogate in a value
        raise not_unicode from None
    if "\ufffd" in body and not _utf8_encodable(job.payload):  # pydantic replaces one in a key: refuse it too
        raise not_unicode
    try:  # read as the worker reads it: what it would dead-letter as invalid_message is not sent
        parse_envelope(body)
    except InvalidMessage as exc:
        raise ConfigError(f"job {job.type!r}: the worker would refuse it ({exc}); nothing sent") from None
    return body


def _utf8_encodable(payload: dict[str, Any]) -> bool:
    try:
        json.dumps(payload, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def message_entry(job: Job, *, fifo: bool) -> dict[str, Any]:
    """The SendMessage arguments of ``job`` (body, and group, deduplication id or delay): the one place every
    producer (boto3, the typed ``.enqueue``, the in-memory queue of ``worker.testing``) builds a message."""
    return _entry(job, fifo=fifo)


@dataclass(frozen=True)
class EntryFailure:
    """One job of a batch that SQS refused: its index in the jobs given, SQS's code and message."""

    index: int
    code: str
    message: str
    sender_fault: bool = True


@dataclass(frozen=True)
class BatchResult:
    """What a batch send did, per job: ``message_ids[i]`` is job i's MessageId, None when it failed."""

    message_ids: list[str | None]
    failures: list[EntryFailure] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def send_batch(client: SQSClient, queue_url: str, jobs: Iterable[Job]) -> BatchResult:
    """Send jobs with SendMessageBatch, 10 per request, without retrying: entries SQS refuses are reported in
    ``failures`` (the others were sent); a request that fails as a whole raises (QueueUnavailable, ConfigError),
    naming how many jobs were sent before it."""
    fifo = queue_url.endswith(".fifo")
    all_jobs = list(jobs)
    entries = [message_entry(job, fifo=fifo) for job in all_jobs]  # every job checked before the first send
    ids: list[str | None] = [None] * len(all_jobs)
    failures: list[EntryFailure] = []
    for start in range(0, len(entries), 10):
        chunk = [{"Id": str(start + i), **entry} for i, entry in enumerate(entries[start : start + 10])]
        try:
            response = client.send_message_batch(QueueUrl=queue_url, Entries=chunk)  # type: ignore[arg-type]
        except (BotoCoreError, ClientError, OSError) as exc:
            name = queue_name_of(queue_url)
            error = translate(exc, "SendMessageBatch", resource=name, endpoint=client.meta.endpoint_url)
            raise type(error)(f"{error} ({start} of {len(entries)} jobs sent before)") from exc
        for sent in response.get("Successful", []):
            ids[int(sent["Id"])] = sent["MessageId"]
        for failed in response.get("Failed", []):
            failures.append(
                EntryFailure(
                    int(failed["Id"]),
                    failed.get("Code", "Unknown"),
                    failed.get("Message", ""),
                    bool(failed.get("SenderFault", True)),
                )
            )
    return BatchResult(ids, sorted(failures, key=lambda failure: failure.index))


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
