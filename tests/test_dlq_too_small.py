"""A DLQ whose MaximumMessageSize is smaller than its source queue's: a body that can never fit it is kept in the
source queue (an ERROR line, a ``released`` event, a long hold), never sent in a loop, never deleted; bootstrap
raises the DLQ's size to match."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from tests.support.backends import Backend
from tests.support.harness import make_queues, running_worker, sqs_client
from tests.support.queues import queue_counts
from worker.jobs import Registry
from worker.observability.events import Kind
from worker.ops.bootstrap import ensure_queues
from worker.runtime.outcomes import DLQ_TOO_SMALL

MIB = 1_048_576


def max_size(client: Any, url: str) -> int:
    attributes = client.get_queue_attributes(QueueUrl=url, AttributeNames=["MaximumMessageSize"])["Attributes"]
    return int(attributes["MaximumMessageSize"])


@pytest.mark.memory
async def test_a_body_too_large_for_the_dlq_is_kept_in_the_source_queue(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    queues = make_queues(backend.endpoint_url)
    client = sqs_client(backend.endpoint_url)
    client.set_queue_attributes(QueueUrl=queues.queue_url, Attributes={"MaximumMessageSize": str(MIB)})
    client.set_queue_attributes(QueueUrl=queues.dlq_url, Attributes={"MaximumMessageSize": "262144"})
    body = json.dumps({"type": "nobody_handles_this", "payload": {"x": "a" * 400_000}})
    client.send_message(QueueUrl=queues.queue_url, MessageBody=body)
    caplog.set_level(logging.ERROR, logger="worker")
    async with running_worker(backend.endpoint_url, queues, Registry(), poll_wait_s=1) as running:
        [released] = await running.recorder.wait_count(Kind.RELEASED, 1)
    assert released.reason == DLQ_TOO_SMALL and released.category == "unknown_type"
    assert (released.delay_s or 0) >= 3000  # a long hold, not a loop of sends
    assert running.recorder.of(Kind.DEAD_LETTERED) == []
    counts = queue_counts(client, queues.queue_url)
    assert counts["ApproximateNumberOfMessagesNotVisible"] == 1  # kept, invisible, not deleted
    assert sum(queue_counts(client, queues.dlq_url).values()) == 0
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    size = f"body is {len(body)} bytes"
    assert any("262144" in e and "MaximumMessageSize" in e and size in e for e in errors), errors
    [at_start] = [e for e in errors if "can never be dead-lettered" in e]  # one line at start, naming both sizes
    assert "takes messages of at most 262144 bytes" in at_start and f"takes {MIB}" in at_start


def test_bootstrap_raises_a_smaller_dlq_size_to_the_source_queues(backend: Backend) -> None:
    queues = make_queues(backend.endpoint_url)
    client = sqs_client(backend.endpoint_url)
    client.set_queue_attributes(QueueUrl=queues.queue_url, Attributes={"MaximumMessageSize": str(MIB)})
    client.set_queue_attributes(QueueUrl=queues.dlq_url, Attributes={"MaximumMessageSize": "262144"})
    name = queues.queue_url.rsplit("/", 1)[1]
    assert ensure_queues(client, name).dlq_size_raised_from == 262144  # bootstrap prints it
    assert max_size(client, queues.dlq_url) >= max_size(client, queues.queue_url)
    assert ensure_queues(client, name).dlq_size_raised_from is None  # raised already
