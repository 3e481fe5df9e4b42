"""A real ``terraform apply`` of the module against the moto server, then the worker on what it created.

Once per session (module-scoped fixture, about a minute: the provider waits for each SQS queue to settle):
apply ``terraform/examples/local`` (ECS off) with a schedule file, check what the emulator now holds, run
``sqs-worker run`` with exactly the settings the module outputs, fire a schedule the way Scheduler would
(twice: it runs once), dead-letter a malformed message into the DLQ Terraform created, then ``destroy``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.backends import Backend
from tests.support.process import cli, lines, start, wait_until, worker_env
from tests.support.queues import message_count
from tests.support.terraform import Applied, applied_local_example
from worker.scheduling.schedules import load_schedules
from worker.settings import WorkerSettings

SCHEDULES = """\
schedules:
  - name: weekday-report
    expression: cron(0 9 ? * MON-FRI *)
    timezone: Europe/Berlin
    type: send_report
    payload: {report: "daily <sales> & more"}
    flexible_window_minutes: 10
  - name: hourly
    expression: rate(1 hour)
    type: barrier
    enabled: false
"""


@pytest.fixture(scope="module")
def applied(moto_backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Applied]:
    work = tmp_path_factory.mktemp("tf-apply")
    schedules_file = work / "schedules.yaml"
    schedules_file.write_text(SCHEDULES, encoding="utf-8")
    name = f"tfw-{uuid.uuid4().hex[:8]}"
    with applied_local_example(
        moto_backend.endpoint_url, work, name=name, variables={"schedules_file": str(schedules_file)}
    ) as done:
        yield done
    left = done.client("sqs").list_queues(QueueNamePrefix=name)
    assert not left.get("QueueUrls"), f"destroy left queues behind: {left['QueueUrls']}"


@pytest.mark.timeout(900)
def test_queues_are_as_declared(applied: Applied) -> None:
    sqs = applied.client("sqs")
    queue = sqs.get_queue_attributes(QueueUrl=applied.outputs["queue_url"], AttributeNames=["All"])["Attributes"]
    dlq = sqs.get_queue_attributes(QueueUrl=applied.outputs["dead_letter_queue_url"], AttributeNames=["All"])[
        "Attributes"
    ]
    redrive = json.loads(queue["RedrivePolicy"])
    assert redrive["deadLetterTargetArn"] == dlq["QueueArn"] == applied.outputs["dead_letter_queue_arn"]
    assert int(redrive["maxReceiveCount"]) == 9
    assert queue["MaximumMessageSize"] == dlq["MaximumMessageSize"] == "262144"  # the module says it, both alike
    assert int(dlq["MessageRetentionPeriod"]) > int(queue["MessageRetentionPeriod"])
    assert queue["SqsManagedSseEnabled"] == "true" and dlq["SqsManagedSseEnabled"] == "true"


def test_idempotency_table_is_as_declared(applied: Applied) -> None:
    dynamodb = applied.client("dynamodb")
    table = dynamodb.describe_table(TableName=applied.outputs["idempotency_table_name"])["Table"]
    assert table["KeySchema"] == [{"AttributeName": "key", "KeyType": "HASH"}]
    assert [index["IndexName"] for index in table.get("GlobalSecondaryIndexes", [])] == ["status-updated_at"]
    assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    ttl = dynamodb.describe_time_to_live(TableName=table["TableName"])["TimeToLiveDescription"]
    assert ttl == {"TimeToLiveStatus": "ENABLED", "AttributeName": "expiration"}
    backups = dynamodb.describe_continuous_backups(TableName=table["TableName"])["ContinuousBackupsDescription"]
    assert backups["PointInTimeRecoveryDescription"]["PointInTimeRecoveryStatus"] == "ENABLED"


def test_schedules_send_exactly_the_workers_body(applied: Applied) -> None:
    scheduler = applied.client("scheduler")
    for schedule in load_schedules(Path(applied.variables["schedules_file"])):
        remote = scheduler.get_schedule(Name=schedule.name, GroupName=applied.name)
        assert remote["ScheduleExpression"] == schedule.expression
        assert remote["ScheduleExpressionTimezone"] == schedule.timezone
        assert remote["State"] == ("ENABLED" if schedule.enabled else "DISABLED")
        assert remote["Target"]["Arn"] == applied.outputs["queue_arn"]
        assert remote["Target"]["Input"] == schedule.body_template(), "Terraform and the worker disagree on the body"
        assert remote["Target"]["DeadLetterConfig"]["Arn"].endswith(f"{applied.name}-scheduler-dlq")
    window = scheduler.get_schedule(Name="weekday-report", GroupName=applied.name)["FlexibleTimeWindow"]
    assert window == {"Mode": "FLEXIBLE", "MaximumWindowInMinutes": 10}


def test_alarms_exist(applied: Applied) -> None:
    alarms = applied.client("cloudwatch").describe_alarms(AlarmNamePrefix=applied.name)["MetricAlarms"]
    assert sorted(alarm["AlarmName"] for alarm in alarms) == sorted(applied.outputs["alarm_names"])
    failures = next(alarm for alarm in alarms if alarm["AlarmName"] == f"{applied.name}-job-failures")
    assert failures["Namespace"] == "SqsWorker" and failures["MetricName"] == "JobsDeadLettered"
    assert failures["Dimensions"] == [{"Name": "Queue", "Value": applied.name}]
    assert all(alarm["AlarmActions"] == [applied.outputs["alarm_topic_arn"]] for alarm in alarms)


def test_module_outputs_are_the_settings_the_worker_reads(applied: Applied, monkeypatch: pytest.MonkeyPatch) -> None:
    environment: dict[str, str] = applied.outputs["worker_environment"]
    fields = WorkerSettings.model_fields
    for variable in environment:
        assert variable.startswith("WORKER_"), variable
        assert variable.removeprefix("WORKER_").lower() in fields, f"{variable} is no WorkerSettings field"
    required = {f"WORKER_{name.upper()}" for name, field in fields.items() if field.is_required()}
    assert required <= environment.keys()
    for variable in [name for name in os.environ if name.startswith("WORKER_")]:
        monkeypatch.delenv(variable)
    for variable, value in environment.items():
        monkeypatch.setenv(variable, value)
    settings = WorkerSettings(_env_file=None)
    assert settings.queue == applied.outputs["queue_url"]
    assert settings.dead_letter_queue == applied.outputs["dead_letter_queue_url"]
    assert settings.idempotency_table == applied.outputs["idempotency_table_name"]
    assert settings.max_receive_count == 9
    assert settings.shutdown_grace_s == 5
    assert settings.metrics_namespace == "SqsWorker"


@pytest.mark.timeout(300)
def test_worker_runs_jobs_from_the_created_queue_and_dead_letters_into_the_created_dlq(
    applied: Applied, tmp_path: Path
) -> None:
    effects = tmp_path / "effects.txt"
    env = worker_env(
        applied.endpoint_url,
        TMP=str(tmp_path),
        TEST_EFFECTS_FILE=str(effects),
        WORKER_SCHEDULES_FILE=applied.variables["schedules_file"],
        **applied.outputs["worker_environment"],
    )
    env["WORKER_HANDLERS"] = "tests.support.terraform_handlers"
    env["WORKER_METRICS"] = "off"
    stderr = tmp_path / "worker.stderr"
    worker = start("run", env=env, stderr_path=stderr)
    try:
        # Scheduler's double delivery of one fire: the same body twice; the idempotent job runs once.
        for _ in range(2):
            fired = cli("schedules", "fire", "weekday-report", "--at", "2026-11-30T09:00:00+01:00", env=env)
            assert fired.returncode == 0, fired.stderr
            assert "fired for 2026-11-30T08:00:00Z" in fired.stdout
        sqs = applied.client("sqs")
        sqs.send_message(QueueUrl=applied.outputs["queue_url"], MessageBody="this is not an envelope")
        wait_until(lambda: len(lines(effects)) >= 1, 60, "the scheduled job to run")
        wait_until(lambda: _depth(sqs, applied.outputs["queue_url"]) == 0, 60, "the queue to drain")
        dead = _receive_one(sqs, applied.outputs["dead_letter_queue_url"])
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            code = worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            raise
    assert code == 0, stderr.read_text(encoding="utf-8")[-3000:]
    assert lines(effects) == ["send_report daily <sales> & more key=schedule:weekday-report:2026-11-30T08:00:00Z"]
    assert dead["Body"] == "this is not an envelope"
    attributes = {key: value["StringValue"] for key, value in dead["MessageAttributes"].items()}
    assert attributes["error_category"] == "invalid_message"
    assert attributes["source_queue"].endswith(applied.name)


def _depth(sqs: Any, queue_url: str) -> int:
    return message_count(sqs, queue_url)


def _receive_one(sqs: Any, queue_url: str) -> dict[str, Any]:
    response = sqs.receive_message(
        QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=10, MessageAttributeNames=["All"]
    )
    messages = response.get("Messages", [])
    assert len(messages) == 1, f"expected one dead-lettered message, got {messages}"
    message: dict[str, Any] = messages[0]
    return message
