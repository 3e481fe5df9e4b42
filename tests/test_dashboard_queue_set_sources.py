"""The dashboard's Sources over a queue set on a real endpoint (moto server and LocalStack): one lane per queue
with its own DLQ, redrive all sending each DLQ back to its own queue, and the charts asking CloudWatch for the
first queue's name, the ``Queue`` dimension the worker publishes for the whole set."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import boto3
import pytest

from tests.support.backends import Backend
from tests.support.harness import make_queues, sqs_client
from tests.support.queues import message_count
from worker.dashboard.config import DashboardSettings
from worker.dashboard.sources import Sources
from worker.errors import ConfigError
from worker.observability.metrics import JOBS_SUCCEEDED, QUEUE
from worker.ops.bootstrap import Created


def _name(url: str) -> str:
    return url.rsplit("/", 1)[-1]


@pytest.fixture
def queue_set(backend: Backend, queues: Created, monkeypatch: pytest.MonkeyPatch) -> tuple[Created, Created]:
    second = make_queues(backend.endpoint_url)
    monkeypatch.delenv("WORKER_QUEUE")
    monkeypatch.setenv("WORKER_QUEUES", f"{_name(queues.queue_url)}:10,{_name(second.queue_url)}:1")
    return queues, second


def test_each_queue_of_the_set_redrives_from_its_own_dlq(backend: Backend, queue_set: tuple[Created, Created]) -> None:
    first, second = queue_set
    sqs = sqs_client(backend.endpoint_url)
    sources = Sources(DashboardSettings())
    assert [(lane.queue_url, lane.dlq_url) for lane in sources.lanes] == [
        (first.queue_url, first.dlq_url),
        (second.queue_url, second.dlq_url),
    ]
    rows = [first.queue_url, first.dlq_url, second.queue_url, second.dlq_url]
    assert [row.name for row in sources.queues()] == [_name(url) for url in rows]
    with pytest.raises(ConfigError, match="several queues"):
        sources.lane(None)
    assert sources.lane(_name(second.queue_url)) == sources.lanes[1]
    for created, count in ((first, 1), (second, 2)):
        for _ in range(count):
            sqs.send_message(QueueUrl=created.dlq_url, MessageBody=json.dumps({"type": "x", "payload": {}}))
    assert {letter.queue for letter in sources.dead_letters()} == {_name(first.queue_url), _name(second.queue_url)}
    result = sources.redrive_all()
    assert result.moved == 3
    assert result.ok
    for created, count in ((first, 1), (second, 2)):
        assert message_count(sqs, created.dlq_url) == 0
        assert message_count(sqs, created.queue_url) == count


def test_the_charts_ask_for_the_first_queue_of_the_set(backend: Backend, queue_set: tuple[Created, Created]) -> None:
    first, _ = queue_set
    cloudwatch = boto3.client("cloudwatch", endpoint_url=backend.endpoint_url, region_name="us-east-1")
    cloudwatch.put_metric_data(
        Namespace="SqsWorker",
        MetricData=[
            {
                "MetricName": JOBS_SUCCEEDED,
                "Dimensions": [{"Name": QUEUE, "Value": _name(first.queue_url)}],
                "Timestamp": datetime.fromtimestamp(time.time() - 30, UTC),
                "Value": 4,
                "Unit": "Count",
            }
        ],
    )
    series = Sources(DashboardSettings()).published_series(now=datetime.now(UTC))
    assert series is not None
    assert sum(value for _, value in series["succeeded"]) == 4
