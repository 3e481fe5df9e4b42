"""`bootstrap` (ensure_queues) is safe to repeat: a queue whose redrive policy names its own DLQ keeps that DLQ."""

from __future__ import annotations

import json
import uuid

from tests.support.backends import Backend
from tests.support.harness import sqs_client
from worker.ops.bootstrap import ensure_queues


def test_bootstrap_keeps_the_dlq_an_existing_queue_redrives_to(backend: Backend) -> None:
    client = sqs_client(backend.endpoint_url)
    name = f"orders-{uuid.uuid4().hex[:8]}"
    failed = client.create_queue(QueueName=f"{name}-failed")["QueueUrl"]
    arn = client.get_queue_attributes(QueueUrl=failed, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    policy = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": "10"})
    client.create_queue(QueueName=name, Attributes={"RedrivePolicy": policy})
    created = ensure_queues(client, name, max_receive_count=9)
    assert created.dlq_url == failed
    attributes = client.get_queue_attributes(QueueUrl=created.queue_url, AttributeNames=["RedrivePolicy"])
    redrive = json.loads(attributes["Attributes"]["RedrivePolicy"])
    assert (redrive["deadLetterTargetArn"], int(redrive["maxReceiveCount"])) == (arn, 9)
    assert not [url for url in client.list_queues(QueueNamePrefix=f"{name}-dlq").get("QueueUrls", [])]


def test_bootstrap_of_a_new_queue_makes_its_dlq(backend: Backend) -> None:
    client = sqs_client(backend.endpoint_url)
    name = f"fresh-{uuid.uuid4().hex[:8]}"
    created = ensure_queues(client, name)
    assert created.dlq_url.endswith(f"/{name}-dlq")
    assert ensure_queues(client, name).dlq_url == created.dlq_url  # again: the same DLQ
