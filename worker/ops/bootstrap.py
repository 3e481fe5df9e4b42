"""Creating the queue, its dead-letter queue and the redrive policy (and the idempotency table): safe to repeat."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from worker.backends.aws import translate
from worker.errors import ConfigError
from worker.names import parse_redrive_policy

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

#: A DLQ keeps messages longer than its source (14 days, the SQS maximum), so nothing expires on the way.
DLQ_RETENTION_S = 1_209_600
QUEUE_RETENTION_S = 345_600


@dataclass(frozen=True)
class Created:
    queue_url: str
    dlq_url: str
    max_receive_count: int
    #: The DLQ's MaximumMessageSize before this run raised it to the queue's (None: it was not raised).
    dlq_size_raised_from: int | None = None


def ensure_queues(
    client: SQSClient,
    queue: str,
    *,
    dlq: str | None = None,
    max_receive_count: int = 7,
    visibility_timeout_s: int = 30,
    keep_higher_count: bool = False,
) -> Created:
    """Create (or update) the queue and its DLQ with a redrive policy. Names, not URLs. Without ``dlq`` the DLQ is
    the existing queue's redrive target (as the worker resolves it), else ``<queue>-dlq``: running it again never
    points a queue at another DLQ. ``keep_higher_count``: an existing policy's larger maxReceiveCount stays (a
    default never lowers what someone raised)."""
    from worker.names import default_dlq_name, queue_name_of

    queue_name = queue_name_of(queue)
    try:
        target, existing_count = _existing_redrive(client, queue_name)
    except (BotoCoreError, ClientError, OSError) as exc:
        raise translate(exc, "GetQueueAttributes", resource=queue_name, endpoint=client.meta.endpoint_url) from exc
    dlq_name = queue_name_of(dlq) if dlq else target or default_dlq_name(queue_name)
    if keep_higher_count and existing_count is not None:
        max_receive_count = max(max_receive_count, existing_count)
    fifo = queue_name.endswith(".fifo")
    if fifo != dlq_name.endswith(".fifo"):
        raise ConfigError("a FIFO queue needs a FIFO dead-letter queue (both names end in .fifo), and vice versa")
    try:
        dlq_attributes = {"MessageRetentionPeriod": str(DLQ_RETENTION_S), "SqsManagedSseEnabled": "true"}
        if fifo:
            dlq_attributes["FifoQueue"] = "true"
        dlq_url = _create(client, dlq_name, dlq_attributes)
        dlq_arn = client.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        attributes = {
            "MessageRetentionPeriod": str(QUEUE_RETENTION_S),
            "VisibilityTimeout": str(visibility_timeout_s),
            "ReceiveMessageWaitTimeSeconds": "20",
            "SqsManagedSseEnabled": "true",
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": str(max_receive_count)}),
        }
        if fifo:
            attributes["FifoQueue"] = "true"
        queue_url = _create(client, queue_name, attributes)
        queue_arn = client.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        dlq_changes = {
            "RedriveAllowPolicy": json.dumps({"redrivePermission": "byQueue", "sourceQueueArns": [queue_arn]})
        }
        sizes = [_max_message_bytes(client, url) for url in (queue_url, dlq_url)]
        if sizes[1] < sizes[0]:  # a body the source takes would never fit the DLQ: it could not be dead-lettered
            dlq_changes["MaximumMessageSize"] = str(sizes[0])
        client.set_queue_attributes(QueueUrl=dlq_url, Attributes=dlq_changes)  # type: ignore[arg-type]
    except (BotoCoreError, ClientError, OSError) as exc:
        raise translate(exc, "CreateQueue", resource=queue_name, endpoint=client.meta.endpoint_url) from exc
    raised_from = sizes[1] if sizes[1] < sizes[0] else None
    return Created(queue_url, dlq_url, max_receive_count, dlq_size_raised_from=raised_from)


def _existing_redrive(client: SQSClient, queue_name: str) -> tuple[str | None, int | None]:
    """The DLQ name and maxReceiveCount an existing queue's redrive policy names; (None, None) for a new queue or
    one without a policy."""
    try:
        url = client.get_queue_url(QueueName=queue_name)["QueueUrl"]
    except ClientError as exc:
        error = exc.response.get("Error", {})
        if any(
            word in str(error.get(field, ""))
            for word in ("NonExistentQueue", "QueueDoesNotExist")
            for field in ("Code", "QueryErrorCode")
        ):
            return None, None
        raise
    attributes = client.get_queue_attributes(QueueUrl=url, AttributeNames=["RedrivePolicy"])["Attributes"]
    return parse_redrive_policy(attributes.get("RedrivePolicy"))


def _max_message_bytes(client: SQSClient, url: str) -> int:
    attributes = client.get_queue_attributes(QueueUrl=url, AttributeNames=["MaximumMessageSize"])["Attributes"]
    return int(attributes["MaximumMessageSize"])


def _create(client: SQSClient, name: str, attributes: dict[str, str]) -> str:
    """Create a queue, or update the attributes of the one that exists (CreateQueue rejects changed ones)."""
    try:
        return client.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]  # type: ignore[arg-type]
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in ("QueueAlreadyExists", "QueueNameExists"):
            raise
    url = client.get_queue_url(QueueName=name)["QueueUrl"]
    changeable = {k: v for k, v in attributes.items() if k != "FifoQueue"}
    client.set_queue_attributes(QueueUrl=url, Attributes=changeable)  # type: ignore[arg-type]
    return url
