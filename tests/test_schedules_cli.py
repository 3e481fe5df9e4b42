"""``sqs-worker schedules list|fire``: next fire times, and exactly Scheduler's message on a real queue."""

from __future__ import annotations

import hashlib
import json
import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.support.backends import Backend
from worker.commands.__main__ import main
from worker.scheduling.schedules import load_schedules, utc_now

SCHEDULES = """\
schedules:
  - name: weekday-report
    expression: cron(0 9 ? * MON-FRI *)
    timezone: Europe/Berlin
    type: send_report
    payload: {report: daily}
    flexible_window_minutes: 15
  - name: launch
    expression: at(2199-01-01T00:00:00)
    type: launch
  - name: paused
    expression: rate(1 hour)
    type: tick
    enabled: false
"""


@pytest.fixture
def schedules_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "schedules.yaml"
    path.write_text(SCHEDULES, encoding="utf-8")
    monkeypatch.setenv("WORKER_SCHEDULES_FILE", str(path))
    monkeypatch.setenv("WORKER_QUEUE", "unused-by-list")
    return path


def test_list_prints_the_next_fire_times_in_utc_and_local_time(
    schedules_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["schedules", "list", "--count", "3"]) == 0
    out = capsys.readouterr().out
    report = load_schedules(schedules_file)[0]
    lines = out.splitlines()
    assert lines[0] == (
        "weekday-report: cron(0 9 ? * MON-FRI *) in Europe/Berlin, flexible window 15 min -> job send_report"
    )
    expected = [moment.strftime("%Y-%m-%dT%H:%M:%SZ") for moment in report.next_fire_times(utc_now(), 3)]
    assert [line.split()[0] for line in lines[1:4]] == expected
    assert all("09:00 CE" in line for line in lines[1:4])  # 09:00 CET or CEST, whatever the season
    assert "paused (disabled): rate(1 hour) in UTC -> job tick" in out
    assert "launch: at(2199-01-01T00:00:00) in UTC -> job launch\n  2199-01-01T00:00:00Z" in out


def test_list_validates_count_and_file(
    schedules_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["schedules", "list", "--count", "0"]) == 2
    assert main(["schedules", "list", "--file", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read the schedule file" in capsys.readouterr().err


@pytest.fixture
def aws(moto_backend: Backend, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_backend.endpoint_url)
    return boto3.client("sqs", endpoint_url=moto_backend.endpoint_url, region_name="us-east-1")


def _receive(sqs: Any, queue_url: str) -> list[dict[str, Any]]:
    response = sqs.receive_message(
        QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1, AttributeNames=["All"]
    )
    messages: list[dict[str, Any]] = response.get("Messages", [])
    return messages


def test_fire_sends_exactly_what_scheduler_sends(
    schedules_file: Path, aws: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"sched-{uuid.uuid4().hex[:8]}"
    queue_url = aws.create_queue(QueueName=name)["QueueUrl"]
    monkeypatch.setenv("WORKER_QUEUE", name)  # a name is resolved to its URL
    assert main(["schedules", "fire", "weekday-report", "--at", "2026-11-30T09:00:00"]) == 0  # Berlin wall time
    assert "weekday-report fired for 2026-11-30T08:00:00Z" in capsys.readouterr().out
    (message,) = _receive(aws, queue_url)
    assert message["Body"] == (
        '{"idempotency_key":"schedule:weekday-report:2026-11-30T08:00:00Z","payload":{"report":"daily"},'
        '"type":"send_report"}'
    )


def test_fire_defaults_to_the_latest_due_time(schedules_file: Path, aws: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    queue_url = aws.create_queue(QueueName=f"sched-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    monkeypatch.setenv("WORKER_QUEUE", queue_url)
    report = load_schedules(schedules_file)[0]
    before = report.latest_fire_time(utc_now())
    assert main(["schedules", "fire", "weekday-report"]) == 0
    after = report.latest_fire_time(utc_now())
    (message,) = _receive(aws, queue_url)
    key = json.loads(message["Body"])["idempotency_key"]
    assert before is not None and after is not None
    assert key in {f"schedule:weekday-report:{moment:%Y-%m-%dT%H:%M:%SZ}" for moment in (before, after)}


def test_fire_on_a_fifo_queue_groups_by_schedule_and_deduplicates_by_body(
    schedules_file: Path, aws: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue_url = aws.create_queue(QueueName=f"sched-{uuid.uuid4().hex[:8]}.fifo", Attributes={"FifoQueue": "true"})[
        "QueueUrl"
    ]
    monkeypatch.setenv("WORKER_QUEUE", queue_url)
    for _ in range(2):  # a double fire within the deduplication window is one message
        assert main(["schedules", "fire", "weekday-report", "--at", "2026-11-30T08:00:00Z"]) == 0
    (message,) = _receive(aws, queue_url)
    assert message["Attributes"]["MessageGroupId"] == "weekday-report"
    assert message["Attributes"]["MessageDeduplicationId"] == hashlib.sha256(message["Body"].encode()).hexdigest()


def test_fire_refuses_unknown_schedules_and_times_not_yet_due(
    schedules_file: Path, aws: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["schedules", "fire", "nope"]) == 3  # nothing by that name
    assert "no schedule named 'nope' (known: weekday-report, launch, paused)" in capsys.readouterr().err
    assert main(["schedules", "fire", "launch"]) == 2
    assert "no due fire time yet: pass --at" in capsys.readouterr().err
    assert main(["schedules", "fire", "launch", "--at", "tomorrow"]) == 2
    assert "not an ISO 8601 time" in capsys.readouterr().err
    assert main(["schedules", "fire", "weekday-report", "--at", "2026-11-29T09:00:00"]) == 2  # a Sunday
    assert "not a fire time of schedule 'weekday-report'" in capsys.readouterr().err
    assert main(["schedules", "fire", "weekday-report", "--at", "2026-11-30T10:00:00"]) == 2  # not 09:00
    assert "the next one is 2026-12-01T08:00:00Z" in capsys.readouterr().err
