"""`bootstrap` (ensure_queues) is safe to repeat: a queue whose redrive policy names its own DLQ keeps that DLQ."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from tests.support.backends import Backend
from tests.support.harness import sqs_client
from worker.commands.__main__ import main
from worker.names import parse_redrive_policy
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


def test_bootstrap_never_lowers_a_count_someone_raised_unless_told(
    backend: Backend, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A FIFO queue set to 500 for its rate-limited jobs went back to the default on the next bootstrap."""
    client = sqs_client(backend.endpoint_url)
    name = f"raised-{uuid.uuid4().hex[:8]}"
    ensure_queues(client, name, max_receive_count=500)
    monkeypatch.setenv("AWS_ENDPOINT_URL", backend.endpoint_url)
    monkeypatch.setenv("WORKER_QUEUE", name)
    monkeypatch.delenv("WORKER_MAX_RECEIVE_COUNT", raising=False)
    monkeypatch.delenv("WORKER_HANDLERS", raising=False)
    assert main(["bootstrap"]) == 0
    assert "(maxReceiveCount 500)" in capsys.readouterr().out
    assert main(["bootstrap", "--max-receive-count", "12"]) == 0  # asked for: set as asked
    assert "(maxReceiveCount 12)" in capsys.readouterr().out
    url = client.get_queue_url(QueueName=name)["QueueUrl"]
    policy = client.get_queue_attributes(QueueUrl=url, AttributeNames=["RedrivePolicy"])["Attributes"]
    assert int(json.loads(policy["RedrivePolicy"])["maxReceiveCount"]) == 12


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"deadLetterTargetArn": "arn:aws:sqs:eu-west-1:1:jobs-dlq", "maxReceiveCount": "7"}', ("jobs-dlq", 7)),
        ('{"deadLetterTargetArn": "arn:aws:sqs:eu-west-1:1:jobs-dlq", "maxReceiveCount": 12}', ("jobs-dlq", 12)),
        (None, (None, None)),
        ("", (None, None)),
        ("not json", (None, None)),
        ('["a list"]', (None, None)),
        ('{"maxReceiveCount": "many"}', (None, None)),
    ],
)
def test_a_redrive_policy_reads_as_its_dlq_name_and_count(text: str | None, expected: tuple[Any, Any]) -> None:
    """One parser for the worker's start, the dlq commands and bootstrap."""
    assert parse_redrive_policy(text) == expected
