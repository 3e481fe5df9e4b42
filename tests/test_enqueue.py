"""Typed enqueue: payloads validated before sending, SendMessageBatch by 10 with per-entry results, JobRef,
the awaitable twins, and the default producer (settings, or the in-memory queue of worker.testing)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel

from tests.support.backends import Backend
from tests.support.harness import drain, sqs_client
from tests.support.queues import message_count, queue_counts
from worker.enqueue import SQSProducer, current_producer, job_ref, use_producer
from worker.errors import ConfigError
from worker.jobs import Registry
from worker.ops.bootstrap import Created
from worker.producer import Job, send_batch
from worker.producer import enqueue as producer_enqueue
from worker.testing import InMemoryWorker


class Email(BaseModel):
    to: str
    subject: str


def registry_with_mail(sent: list[Email]) -> tuple[Registry, Any]:
    registry = Registry()

    @registry.job("send_email")
    async def send_email(payload: Email) -> None:
        sent.append(payload)

    return registry, send_email


def test_the_handler_stays_a_plain_callable_with_enqueue_methods() -> None:
    _, send_email = registry_with_mail([])
    assert send_email.__name__ == "send_email"
    assert send_email.job_ref.name == "send_email" and send_email.job_ref.model is Email
    for method in ("enqueue", "enqueue_async", "enqueue_many", "enqueue_many_async"):
        assert callable(getattr(send_email, method))


@pytest.mark.memory
async def test_enqueue_sends_the_validated_envelope(backend: Backend, queues: Created) -> None:
    client = sqs_client(backend.endpoint_url)
    producer = SQSProducer(client, queues.queue_url)
    _, send_email = registry_with_mail([])
    first = send_email.enqueue(Email(to="ada@example.com", subject="Hi"), producer=producer, idempotency_key="k-1")
    second = await send_email.enqueue_async({"to": "bob@example.com", "subject": "Yo"}, producer=producer, delay_s=60)
    assert first != second
    assert queue_counts(client, queues.queue_url)["ApproximateNumberOfMessagesDelayed"] == 1
    [message] = drain(backend.endpoint_url, queues.queue_url, expect=1)
    assert json.loads(message["Body"]) == {
        "type": "send_email",
        "payload": {"to": "ada@example.com", "subject": "Hi"},
        "idempotency_key": "k-1",
    }


@pytest.mark.memory
async def test_an_invalid_payload_raises_and_sends_nothing(backend: Backend, queues: Created) -> None:
    client = sqs_client(backend.endpoint_url)
    producer = SQSProducer(client, queues.queue_url)
    ref = job_ref("send_email", Email)
    with pytest.raises(ConfigError, match=r"job 'send_email': payload invalid: subject: Field required; nothing sent"):
        ref.enqueue({"to": "ada@example.com"}, producer=producer)
    with pytest.raises(ConfigError, match="payload invalid"):
        await ref.enqueue_async({"to": 1, "subject": "x"}, producer=producer)
    with pytest.raises(ConfigError, match="payload invalid"):  # one bad payload: none of the batch is sent
        ref.enqueue_many([{"to": "a@b.c", "subject": "ok"}, {"subject": "no to"}], producer=producer)
    with pytest.raises(ConfigError, match=r"delay_s must be between 0 and \d+ \(a year\)"):
        ref.enqueue({"to": "a@b.c", "subject": "x"}, producer=producer, delay_s=400 * 86400)
    assert message_count(client, queues.queue_url) == 0


@pytest.mark.memory
async def test_a_lone_surrogate_raises_config_error_and_sends_nothing(backend: Backend, queues: Created) -> None:
    client = sqs_client(backend.endpoint_url)
    producer = SQSProducer(client, queues.queue_url)
    _, send_email = registry_with_mail([])
    unicode_error = "not valid Unicode.*nothing sent"
    with pytest.raises(ConfigError, match=unicode_error):
        send_email.enqueue({"to": "ada\ud800@example.com", "subject": "Hi"}, producer=producer)
    with pytest.raises(ConfigError, match=unicode_error):
        await job_ref("untyped").enqueue_async({"\udc00": 1}, producer=producer)
    with pytest.raises(ConfigError, match=unicode_error):
        job_ref("untyped").enqueue_many([{"a": "ok"}, {"a": ["\udfff"]}], producer=producer)
    with pytest.raises(ConfigError, match="idempotency_key"):
        job_ref("untyped").enqueue({}, idempotency_key="k\ud800", producer=producer)
    with pytest.raises(ConfigError, match=unicode_error):
        producer_enqueue(client, queues.queue_url, Job("untyped", {"a": "\ud800"}))
    assert message_count(client, queues.queue_url) == 0


@pytest.mark.memory
async def test_a_payload_the_worker_would_refuse_is_not_sent(backend: Backend, queues: Created) -> None:
    """Nesting deeper than 100, an integer of more than 4,300 digits: the worker would dead-letter the message as
    invalid_message on its first receive; every producer refuses it instead, as the CLI does."""
    client = sqs_client(backend.endpoint_url)
    producer = SQSProducer(client, queues.queue_url)
    deep: Any = []
    for _ in range(150):
        deep = [deep]
    refused = "the worker would refuse it.*nothing sent"
    with pytest.raises(ConfigError, match=refused + "|nests deeper than 100"):
        job_ref("untyped").enqueue({"x": deep}, producer=producer)
    with pytest.raises(ConfigError, match="more than 4300 digits"):
        await job_ref("untyped").enqueue_async({"x": 10**4999}, producer=producer)
    with pytest.raises(ConfigError, match=refused):
        job_ref("untyped").enqueue_many([{"a": 1}, {"x": deep}], producer=producer)
    with pytest.raises(ConfigError, match=refused):
        producer_enqueue(client, queues.queue_url, Job("untyped", {"x": 10**4999}))
    assert message_count(client, queues.queue_url) == 0


async def test_enqueue_many_batches_ten_per_request(backend: Backend, queues: Created) -> None:
    client = sqs_client(backend.endpoint_url)
    calls: list[int] = []
    client.meta.events.register(
        "before-parameter-build.sqs.SendMessageBatch", lambda params, **_: calls.append(len(params["Entries"]))
    )
    ref = job_ref("send_email", Email)
    payloads = [Email(to=f"u{n}@example.com", subject="Hi") for n in range(25)]
    result = ref.enqueue_many(payloads, producer=SQSProducer(client, queues.queue_url))
    assert result.ok and len(result.message_ids) == 25 and all(result.message_ids)
    assert calls == [10, 10, 5]
    result = await ref.enqueue_many_async(payloads[:3], producer=SQSProducer(client, queues.queue_url))
    assert result.ok and calls == [10, 10, 5, 3]
    assert message_count(client, queues.queue_url) == 28


class RefusingClient:
    """A boto3 SQS client's SendMessageBatch that refuses every third entry, as SQS reports per-entry failures."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    def send_message_batch(self, *, QueueUrl: str, Entries: list[dict[str, Any]]) -> dict[str, Any]:
        self.batches.append(len(Entries))
        ok = [{"Id": e["Id"], "MessageId": f"m{e['Id']}"} for e in Entries if int(e["Id"]) % 3]
        failed = [
            {"Id": e["Id"], "Code": "InvalidParameterValue", "Message": "refused", "SenderFault": True}
            for e in Entries
            if int(e["Id"]) % 3 == 0
        ]
        return {"Successful": ok, "Failed": failed}


def test_partial_batch_failures_are_reported_per_entry_not_raised() -> None:
    client = RefusingClient()
    result = send_batch(client, "https://sqs.example/1/jobs", [Job("t", {"n": n}) for n in range(12)])  # type: ignore[arg-type]
    assert client.batches == [10, 2]
    assert not result.ok
    assert [f.index for f in result.failures] == [0, 3, 6, 9]
    assert result.failures[0].code == "InvalidParameterValue"
    assert [i for i, mid in enumerate(result.message_ids) if mid is None] == [0, 3, 6, 9]
    assert result.message_ids[1] == "m1"


def test_memory_batches_report_what_the_queue_refuses() -> None:
    kit = InMemoryWorker(Registry())
    with kit.producing():
        result = job_ref("t").enqueue_many([{"n": 1}, {"big": "x" * 1_100_000}, {"n": 3}])
    assert [f.index for f in result.failures] == [1]
    assert result.failures[0].code == "InvalidParameterValue"
    assert kit.counts().total == 2


async def test_the_default_producer_follows_the_settings(backend: Backend, queues: Created) -> None:
    """Without use_producer: the queue of WORKER_QUEUE at the AWS endpoint (the `queues` fixture sets both)."""
    sent = await job_ref("send_email", Email).enqueue_async(Email(to="ada@example.com", subject="Hi"))
    assert sent
    assert message_count(sqs_client(backend.endpoint_url), queues.queue_url) == 1
    kit = InMemoryWorker(Registry())
    with use_producer(kit.producer):
        assert current_producer() is kit.producer
        job_ref("send_email", Email).enqueue(Email(to="bob@example.com", subject="Hi"))
    assert kit.counts().total == 1
    assert message_count(sqs_client(backend.endpoint_url), queues.queue_url) == 1


def test_a_handler_enqueue_under_the_fixture_goes_to_memory_and_runs(sqs_worker: InMemoryWorker) -> None:
    sent: list[Email] = []
    registry, send_email = registry_with_mail(sent)
    send_email.enqueue(Email(to="ada@example.com", subject="Hi"))
    sqs_worker.registry = registry
    assert sqs_worker.run_until_idle().succeeded == 1
    assert sent == [Email(to="ada@example.com", subject="Hi")]


@pytest.mark.memory
def test_enqueue_takes_a_run_at_past_fifteen_minutes(backend: Backend, queues: Created) -> None:
    from datetime import UTC, datetime, timedelta

    client = sqs_client(backend.endpoint_url)
    producer = SQSProducer(client, queues.queue_url)
    due = datetime.now(UTC) + timedelta(hours=2)
    job_ref("send_email", Email).enqueue({"to": "a@b.c", "subject": "later"}, run_at=due, producer=producer)
    assert queue_counts(client, queues.queue_url)["ApproximateNumberOfMessagesDelayed"] == 1
    with pytest.raises(ConfigError, match="give delay_s or run_at, not both"):
        job_ref("send_email", Email).enqueue({"to": "a@b.c", "subject": "x"}, delay_s=5, run_at=due, producer=producer)
