"""The SQS semantics the worker relies on, checked on each backend alike: moto, LocalStack and the in-memory
backend (through the suite's boto3-shaped client over its broker). What holds here holds for ``MemoryQueue``."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from tests.support.backends import Backend
from tests.support.harness import make_queues, sqs_client
from tests.support.queues import queue_counts

pytestmark = pytest.mark.memory


def receive(client: object, url: str, *, count: int = 10, visibility_timeout_s: int = 30) -> list[dict[str, object]]:
    response = client.receive_message(  # type: ignore[attr-defined]
        QueueUrl=url,
        MaxNumberOfMessages=count,
        VisibilityTimeout=visibility_timeout_s,
        MessageSystemAttributeNames=["All"],
        MessageAttributeNames=["All"],
        WaitTimeSeconds=0,
    )
    messages: list[dict[str, object]] = response.get("Messages", [])
    return messages


def test_receives_are_counted_and_hide_the_message(backend: Backend) -> None:
    queues = make_queues(backend.endpoint_url)
    client = sqs_client(backend.endpoint_url)
    client.send_message(
        QueueUrl=queues.queue_url,
        MessageBody="one",
        MessageAttributes={"origin": {"DataType": "String", "StringValue": "test"}},
    )
    [first] = receive(client, queues.queue_url, visibility_timeout_s=0)
    [second] = receive(client, queues.queue_url, visibility_timeout_s=30)
    assert first["MessageId"] == second["MessageId"] and first["ReceiptHandle"] != second["ReceiptHandle"]
    assert [m["Attributes"]["ApproximateReceiveCount"] for m in (first, second)] == ["1", "2"]  # type: ignore[index]
    assert second["MessageAttributes"] == {"origin": {"DataType": "String", "StringValue": "test"}}
    assert receive(client, queues.queue_url) == []
    counts = queue_counts(client, queues.queue_url)
    assert (counts["ApproximateNumberOfMessages"], counts["ApproximateNumberOfMessagesNotVisible"]) == (0, 1)
    client.change_message_visibility(
        QueueUrl=queues.queue_url, ReceiptHandle=second["ReceiptHandle"], VisibilityTimeout=0
    )
    [third] = receive(client, queues.queue_url)
    client.delete_message(QueueUrl=queues.queue_url, ReceiptHandle=third["ReceiptHandle"])
    assert sum(queue_counts(client, queues.queue_url).values()) == 0


def test_a_delayed_message_waits_its_delay(backend: Backend) -> None:
    queues = make_queues(backend.endpoint_url)
    client = sqs_client(backend.endpoint_url)
    client.send_message(QueueUrl=queues.queue_url, MessageBody="later", DelaySeconds=2)
    assert queue_counts(client, queues.queue_url)["ApproximateNumberOfMessagesDelayed"] == 1
    assert receive(client, queues.queue_url) == []
    found: list[dict[str, object]] = []
    for _ in range(2):  # a long poll returns when the delay has passed (on memory: on the broker's clock, at once)
        found = found or client.receive_message(QueueUrl=queues.queue_url, WaitTimeSeconds=5).get("Messages", [])
    assert [m["Body"] for m in found] == ["later"]


def test_the_receive_after_max_receive_count_moves_the_message_to_the_dlq(backend: Backend) -> None:
    queues = make_queues(backend.endpoint_url, max_receive_count=2)
    client = sqs_client(backend.endpoint_url)
    message_id = client.send_message(QueueUrl=queues.queue_url, MessageBody="poison")["MessageId"]
    for _ in range(2):
        assert len(receive(client, queues.queue_url, visibility_timeout_s=0)) == 1
    assert receive(client, queues.queue_url) == []  # the third receive moves it
    [moved] = receive(client, queues.dlq_url)
    assert (moved["MessageId"], moved["Body"]) == (message_id, "poison")
    assert sum(queue_counts(client, queues.queue_url).values()) == 0


def test_fifo_holds_a_group_while_its_message_is_in_flight_and_deduplicates(backend: Backend) -> None:
    queues = make_queues(backend.endpoint_url, fifo=True)
    client = sqs_client(backend.endpoint_url)
    for body, group in (("a1", "a"), ("a2", "a"), ("b1", "b")):
        client.send_message(
            QueueUrl=queues.queue_url, MessageBody=body, MessageGroupId=group, MessageDeduplicationId=body
        )
    client.send_message(QueueUrl=queues.queue_url, MessageBody="a1", MessageGroupId="a", MessageDeduplicationId="a1")
    assert sum(queue_counts(client, queues.queue_url).values()) == 3  # the second a1 was a duplicate
    [a1] = receive(client, queues.queue_url, count=1)
    assert a1["Body"] == "a1"
    [b1] = receive(client, queues.queue_url)  # a2 waits for a1
    assert b1["Body"] == "b1"
    client.delete_message(QueueUrl=queues.queue_url, ReceiptHandle=a1["ReceiptHandle"])
    [a2] = receive(client, queues.queue_url)
    assert a2["Body"] == "a2"
    assert a2["Attributes"]["MessageGroupId"] == "a"  # type: ignore[index]


def test_a_message_over_the_maximum_size_is_refused(backend: Backend) -> None:
    queues = make_queues(backend.endpoint_url)
    client = sqs_client(backend.endpoint_url)
    client.set_queue_attributes(QueueUrl=queues.queue_url, Attributes={"MaximumMessageSize": "1024"})
    client.send_message(QueueUrl=queues.queue_url, MessageBody="x" * 1024)
    with pytest.raises(ClientError) as refused:
        client.send_message(QueueUrl=queues.queue_url, MessageBody="x" * 1025)
    assert refused.value.response["Error"]["Code"] in ("InvalidParameterValue", "InvalidParameterValueException")
    assert sum(queue_counts(client, queues.queue_url).values()) == 1
