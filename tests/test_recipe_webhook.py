"""The webhook recipe: signing and verify (pure), and deliveries to a local receiver that fails on command."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.support.backends import Backend
from tests.support.harness import drain, make_queues, running_worker, send, sqs_client, start_warnings
from tests.support.idempotency import dynamodb_client
from tests.support.queues import assert_queue_empty
from tests.support.webhookserver import Reply, webhook_receiver
from worker.errors import PermanentError, RetryableError
from worker.idempotency import Ledger, create_table
from worker.jobs import Registry
from worker.observability.events import Kind
from worker.ops.bootstrap import Created
from worker.recipes import webhook
from worker.recipes.webhook import SignatureInvalid, judge, retry_after_s, sign, verify

SECRET = "whsec-test"
NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


def test_verify_accepts_what_sign_made_and_refuses_tampering_and_replays() -> None:
    body = b'{"id":"d-1","event":"order.paid","data":{}}'
    headers = {"webhook-timestamp": "1000", "Webhook-Signature": sign(SECRET, timestamp=1000, body=body)}
    verify(SECRET, body, headers, now_s=1100)
    with pytest.raises(SignatureInvalid, match="does not match"):
        verify(SECRET, body + b" ", headers, now_s=1100)
    with pytest.raises(SignatureInvalid, match="does not match"):
        verify("other-secret", body, headers, now_s=1100)
    with pytest.raises(SignatureInvalid, match="replay window"):
        verify(SECRET, body, headers, now_s=1000 + 301)
    with pytest.raises(SignatureInvalid, match="missing"):
        verify(SECRET, body, {"Webhook-Signature": headers["Webhook-Signature"]}, now_s=1000)
    rotated = {**headers, "Webhook-Signature": f"v1=00 {headers['Webhook-Signature']}"}
    verify(SECRET, body, rotated, now_s=1000)  # any of several signatures (a secret rotation)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", None),
        ("30", 30),
        ("99999", 3600),
        (format_datetime(NOW + timedelta(seconds=90), usegmt=True), 90),
        (format_datetime(NOW - timedelta(seconds=90), usegmt=True), 0),
        ("soon", None),
    ],
)
def test_retry_after_reads_seconds_and_http_dates(value: str | None, expected: int | None) -> None:
    assert retry_after_s(value, now=NOW, cap_s=3600) == expected


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (200, None),
        (204, None),
        (299, None),
        (408, RetryableError),
        (429, RetryableError),
        (500, RetryableError),
        (503, RetryableError),
        (400, PermanentError),
        (401, PermanentError),
        (404, PermanentError),
        (410, PermanentError),
        (301, PermanentError),
    ],
)
def test_judge_sorts_statuses(status: int, outcome: type[Exception] | None) -> None:
    if outcome is None:
        judge(status, retry_after=None, now=NOW, cap_s=60)
    else:
        with pytest.raises(outcome):
            judge(status, retry_after=None, now=NOW, cap_s=60)


def test_judge_passes_retry_after_on() -> None:
    with pytest.raises(RetryableError) as caught:
        judge(429, retry_after="7", now=NOW, cap_s=60)
    assert caught.value.delay_s == 7


# ----------------------------------------------------------------------------------------------- deliveries


@pytest_asyncio.fixture(loop_scope="function")
async def setup(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Created, Any]]:
    monkeypatch.setenv("WORKER_WEBHOOK_SECRET", SECRET)
    monkeypatch.setenv("WORKER_WEBHOOK_TIMEOUT_S", "1")
    table = f"wh-{uuid.uuid4().hex[:10]}"
    async with dynamodb_client(backend.endpoint_url) as client:
        await create_table(client, table)
        yield make_queues(backend.endpoint_url, max_receive_count=20), Ledger(client, table, owner="t")


def registry() -> Registry:
    jobs = Registry()
    webhook.register(jobs, backoff_base_s=0, max_attempts=5)
    return jobs


async def test_failures_are_retried_honouring_retry_after_then_delivered_once(
    backend: Backend, setup: tuple[Created, Any]
) -> None:
    queues, ledger = setup
    script = [Reply(503), Reply(429, {"Retry-After": "2"}), Reply(200, delay_s=3), Reply(500), Reply(204)]
    with webhook_receiver(*script) as receiver:
        body = {
            "type": "webhook",
            "payload": {"url": receiver.url, "event": "order.paid", "data": {"n": 1}, "id": "d-7"},
        }
        send(backend.endpoint_url, queues.queue_url, body)
        async with running_worker(
            backend.endpoint_url, queues, registry(), ledger=ledger, visibility_timeout_s=5
        ) as running:
            [done] = await running.recorder.wait_count(Kind.SUCCEEDED, 1, timeout_s=60)
        requests = list(receiver.received)
    assert done.attempt == 5
    assert [r.headers["Webhook-Id"] for r in requests] == ["d-7"] * 5
    for request in requests:  # each attempt signed afresh, each verifiable
        verify(SECRET, request.body, request.headers, now_s=request.at)
    assert json.loads(requests[0].body) == {"id": "d-7", "event": "order.paid", "data": {"n": 1}}
    assert requests[2].at - requests[1].at >= 2  # Retry-After: 2 honoured (the third answer timed out: retried)
    record = await ledger.get("webhook:d-7")
    assert record is not None and record.result == {"status": 204, "delivery_id": "d-7", "attempt": 5}
    assert_queue_empty(sqs_client(backend.endpoint_url), queues.queue_url)


async def test_other_4xx_is_dead_lettered_after_one_request(backend: Backend, setup: tuple[Created, Any]) -> None:
    queues, ledger = setup
    with webhook_receiver(Reply(404)) as receiver:
        payload = {"url": receiver.url, "event": "order.paid", "data": {}}
        send(backend.endpoint_url, queues.queue_url, {"type": "webhook", "payload": payload})
        async with running_worker(backend.endpoint_url, queues, registry(), ledger=ledger) as running:
            await running.recorder.wait_count(Kind.DEAD_LETTERED, 1)
        assert len(receiver.received) == 1
    [dead] = drain(backend.endpoint_url, queues.dlq_url, expect=1)
    attributes = dead["MessageAttributes"]
    assert attributes["error_category"]["StringValue"] == "permanent"
    assert attributes["error_message"]["StringValue"] == "PermanentError: receiver answered HTTP 404"


async def test_during_a_rotation_each_secret_signs(
    backend: Backend, setup: tuple[Created, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """WORKER_WEBHOOK_SECRET="new old": a receiver holding either secret verifies the delivery."""
    monkeypatch.setenv("WORKER_WEBHOOK_SECRET", "whsec-new whsec-old")
    queues, ledger = setup
    with webhook_receiver(Reply(204)) as receiver:
        payload = {"url": receiver.url, "event": "order.paid", "data": {}, "id": "rot-1"}
        send(backend.endpoint_url, queues.queue_url, {"type": "webhook", "payload": payload})
        async with running_worker(backend.endpoint_url, queues, registry(), ledger=ledger) as running:
            await running.recorder.wait_count(Kind.SUCCEEDED, 1)
        [request] = receiver.received
    assert len(request.headers["Webhook-Signature"].split(" ")) == 2
    for secret in ("whsec-new", "whsec-old"):
        verify(secret, request.body, request.headers, now_s=request.at)
    with pytest.raises(SignatureInvalid):
        verify("whsec-new whsec-old", request.body, request.headers, now_s=request.at)


def test_each_endpoint_host_gets_its_own_rate_limit_and_breaker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORKER_WEBHOOK_RATE_LIMIT", "120/m")
    jobs = Registry()
    webhook.register(jobs)
    spec = jobs.get("webhook")
    assert spec is not None and spec.rate is not None and spec.breaker is not None
    a = webhook.Webhook(url="https://Hooks.example.com:8443/a", event="e")
    b = webhook.Webhook(url="https://other.example.com/b", event="e")
    assert spec.rate_key is not None and spec.breaker.key is not None
    assert spec.rate_key(a) == spec.breaker.key(a) == "hooks.example.com:8443"
    assert spec.rate_key(b) == "other.example.com"
    monkeypatch.setenv("WORKER_WEBHOOK_RATE_LIMIT", "off")
    unlimited = Registry()
    webhook.register(unlimited)
    spec = unlimited.get("webhook")
    assert spec is not None and spec.rate is None and spec.breaker is not None


async def test_a_failing_host_opens_its_breaker_and_later_jobs_wait_unsent(
    backend: Backend, setup: tuple[Created, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WORKER_WEBHOOK_BREAKER_FAILURES", "2")
    monkeypatch.setenv("WORKER_WEBHOOK_BREAKER_COOLDOWN_S", "600")
    queues, ledger = setup
    with webhook_receiver(*[Reply(503)] * 10) as receiver:
        for n in range(3):
            payload = {"url": receiver.url, "event": "order.paid", "data": {"n": n}, "id": f"d-{n}"}
            send(backend.endpoint_url, queues.queue_url, {"type": "webhook", "payload": payload})
        async with running_worker(backend.endpoint_url, queues, registry(), ledger=ledger, concurrency=1) as running:
            [opened] = await running.recorder.wait_count(Kind.BREAKER_CHANGED, 1, timeout_s=60)
            await running.recorder.wait_for(
                lambda r: any(e.kind is Kind.RELEASED and "circuit breaker" in (e.reason or "") for e in r.events),
                timeout_s=60,
            )
        # two failures open it; a job that passed the gate just before may still go; then nothing more is sent
        # (without the breaker the retries, backoff 0, would go on until 5 attempts each)
        assert len(receiver.received) <= 3
    assert opened.extra["state"] == "open"


async def test_the_start_warns_when_no_secret_is_set(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """WORKER_WEBHOOK_SECRET is required: a worker running the job without it says so at start (a warning, not an
    error: a worker whose handlers import ``verify`` has the job too)."""
    monkeypatch.delenv("WORKER_WEBHOOK_SECRET", raising=False)
    monkeypatch.chdir(tmp_path)  # no .env here
    [warning] = await start_warnings(registry(), caplog)
    assert warning == (
        "job 'webhook': WORKER_WEBHOOK_SECRET is not set: webhooks are never sent unsigned; each of its jobs is "
        "dead-lettered (permanent) until it is set"
    )
    monkeypatch.setenv("WORKER_WEBHOOK_SECRET", SECRET)
    assert await start_warnings(registry(), caplog) == []
