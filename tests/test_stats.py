"""Queue statistics: formatting, and the stats command against each backend."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.support.backends import Backend
from tests.support.harness import make_queues, sqs_client
from worker.commands.__main__ import main
from worker.ops.stats import QueueStats, format_age, format_stats, oldest_age_s


@pytest.mark.parametrize(
    ("age", "text"),
    [(None, "n/a"), (5.9, "5s"), (125, "2m05s"), (3 * 3600 + 120, "3h02m"), (2 * 86400 + 4 * 3600, "2d04h")],
)
def test_format_age(age: float | None, text: str) -> None:
    assert format_age(age) == text


def test_format_stats_table() -> None:
    table = format_stats([QueueStats("queue", "jobs", 5, 2, 1, None), QueueStats("dlq", "jobs-dlq", 0, 0, 0, 61.0)])
    assert "n/a" in table
    assert "1m01s" in table
    assert table.splitlines()[1].split()[:5] == ["queue", "jobs", "5", "2", "1"]


class FakeCloudWatch:
    def __init__(self, points: list[dict[str, Any]]) -> None:
        self.points = points
        self.calls: list[dict[str, Any]] = []

    def get_metric_statistics(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        return {"Datapoints": self.points}


def test_oldest_age_takes_the_latest_datapoint() -> None:
    now = datetime.now(UTC)
    cloudwatch = FakeCloudWatch(
        [
            {"Timestamp": now - timedelta(minutes=3), "Maximum": 50.0},
            {"Timestamp": now - timedelta(minutes=1), "Maximum": 7.0},
        ]
    )
    assert oldest_age_s(cloudwatch, "jobs", now=now) == 7.0
    assert cloudwatch.calls[0]["Dimensions"] == [{"Name": "QueueName", "Value": "jobs"}]
    assert oldest_age_s(FakeCloudWatch([]), "jobs", now=now) is None


def test_stats_command(backend: Backend, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    queues = make_queues(backend.endpoint_url)
    monkeypatch.setenv("AWS_ENDPOINT_URL", backend.endpoint_url)
    monkeypatch.setenv("WORKER_QUEUE", queues.queue_url.rsplit("/", 1)[-1])
    monkeypatch.delenv("WORKER_DEAD_LETTER_QUEUE", raising=False)
    client = sqs_client(backend.endpoint_url)
    for _ in range(3):
        client.send_message(QueueUrl=queues.queue_url, MessageBody="{}")
    client.send_message(QueueUrl=queues.queue_url, MessageBody="{}", DelaySeconds=60)
    client.receive_message(QueueUrl=queues.queue_url, MaxNumberOfMessages=1, VisibilityTimeout=60)
    client.send_message(QueueUrl=queues.dlq_url, MessageBody="{}")
    assert main(["stats", "--json", "--watch", "--interval-s", "0.1", "--count", "2"]) == 0
    reports = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(reports) == 2
    queue, dlq = reports[-1]["queues"]
    assert (queue["role"], queue["visible"], queue["in_flight"], queue["delayed"]) == ("queue", 2, 1, 1)
    assert (dlq["role"], dlq["visible"]) == ("dlq", 1)
    assert queue["oldest_age_s"] is None  # no CloudWatch datapoints on a local emulator: n/a
    assert main(["stats"]) == 0
    assert "n/a" in capsys.readouterr().out
