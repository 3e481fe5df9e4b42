"""The ledger table's status index (what the dashboard lists without a Scan), on a real local DynamoDB: made by
``create_table`` for a new table and added to an old one, and queried for failed jobs, live workers (their
presence items) and the audit trail."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING
from uuid import uuid4

import pytest

from tests.support.backends import Backend
from worker.dashboard.config import DashboardSettings
from worker.dashboard.sources import Sources
from worker.idempotency import Ledger, create_table
from worker.idempotency.dynamodb import STATUS_INDEX
from worker.ops.bootstrap import Created
from worker.runtime.presence import PRESENCE_STALE_S, presence_item

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb.client import DynamoDBClient


async def _index_names(dynamodb: DynamoDBClient, table: str) -> list[str]:
    described = (await dynamodb.describe_table(TableName=table))["Table"]
    return [index["IndexName"] for index in described.get("GlobalSecondaryIndexes", [])]


async def test_create_table_makes_the_status_index_and_adds_it_to_an_older_table(dynamodb: DynamoDBClient) -> None:
    fresh = f"ledger-{uuid4().hex[:10]}"
    assert await create_table(dynamodb, fresh) is True
    assert await _index_names(dynamodb, fresh) == [STATUS_INDEX]

    old = f"ledger-{uuid4().hex[:10]}"  # as create_table made it before the index existed
    await dynamodb.create_table(
        TableName=old,
        AttributeDefinitions=[{"AttributeName": "key", "AttributeType": "S"}],
        KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}],
        BillingMode="PAY_PER_REQUEST",
    )
    assert await create_table(dynamodb, old) is False
    assert await _index_names(dynamodb, old) == [STATUS_INDEX]
    assert await create_table(dynamodb, old) is False  # repeatable: the index is not created twice


@pytest.fixture
def settings(backend: Backend, queues: Created, monkeypatch: pytest.MonkeyPatch) -> DashboardSettings:
    table = f"ledger-{uuid4().hex[:10]}"
    monkeypatch.setenv("WORKER_IDEMPOTENCY_TABLE", table)
    return DashboardSettings()


async def test_sources_list_failed_jobs_live_workers_and_the_audit_trail_by_queries(
    dynamodb: DynamoDBClient, settings: DashboardSettings
) -> None:
    table = settings.idempotency_table
    assert table is not None
    await create_table(dynamodb, table)
    ledger = Ledger(dynamodb, table, owner="w1")
    for number in range(3):
        claim = await ledger.claim(key=f"invoice-{number}", job_type="sync", payload_hash="h", lease_s=30)
        assert claim.outcome == "run"
        if number < 2:
            await ledger.fail(claim, error=f"PermanentError: rejected {number}")
    now_s = time.time()
    live = presence_item(owner="alive", queue="q", concurrency=8, busy=3, counts={"succeeded": 5}, now_s=now_s)
    gone = presence_item(owner="gone", queue="q", concurrency=8, busy=0, counts={}, now_s=now_s - PRESENCE_STALE_S - 5)
    for item in (live, gone):
        await dynamodb.put_item(TableName=table, Item=item)

    sources = Sources(settings)
    failed = sources.recent_jobs("FAILED")
    assert [record.key for record in failed] == ["invoice-1", "invoice-0"]  # newest first
    assert failed[0].last_error == "PermanentError: rejected 1"
    assert [record.key for record in sources.recent_jobs("IN_PROGRESS")] == ["invoice-2"]
    workers = sources.workers()
    assert [(w.owner, w.concurrency, w.busy, w.counts["succeeded"]) for w in workers] == [("alive", 8, 3, 5)]
    assert sources.job("invoice-0") is not None
    for key in (str(live["key"]["S"]), "sqs-worker:breakers"):  # the worker's own items: no job (was HTTP 500)
        assert sources.job(key) is None

    sources.record_audit(who="ada", action="purge", why="test data", count=4, detail="purged")
    again = Sources(settings)  # kept in the table: another dashboard process sees it
    assert [(a.who, a.action, a.why, a.count) for a in again.audit_trail()] == [("ada", "purge", "test data", 4)]


def test_the_overview_charts_the_workers_cloudwatch_metrics_when_they_are_published(
    backend: Backend, queues: Created
) -> None:
    import boto3

    from worker.observability.events import Event, Kind
    from worker.observability.metrics import MetricBuffer, metric_data

    sources = Sources(DashboardSettings())
    assert sources.published_series(now=datetime.now(UTC)) is None  # nothing published: the dashboard samples
    buffer = MetricBuffer()
    queue = sources.queue_name
    for kind in (Kind.SUCCEEDED, Kind.SUCCEEDED, Kind.RETRY_SCHEDULED):
        buffer.record(Event(kind, queue, str(uuid4()), job_type="send_email", duration_s=0.1))
    cloudwatch = boto3.client("cloudwatch", endpoint_url=backend.endpoint_url, region_name="us-east-1")
    data = metric_data(buffer.drain(), queue=queue, timestamp=time.time() - 30)
    # The worker also publishes each count per JobType; AWS matches a query's dimensions exactly, LocalStack adds
    # the datums of every superset too: the per-queue datums alone make the expected sums hold on both.
    per_queue = [datum for datum in data if [d["Name"] for d in datum["Dimensions"]] == ["Queue"]]
    cloudwatch.put_metric_data(Namespace="SqsWorker", MetricData=per_queue)
    fresh = Sources(DashboardSettings())  # the answer is cached for a minute: a new dashboard asks again
    series = fresh.published_series(now=datetime.now(UTC))
    assert series is not None
    assert sum(value for _, value in series["succeeded"]) == 2
    assert sum(value for _, value in series["retried"]) == 1
