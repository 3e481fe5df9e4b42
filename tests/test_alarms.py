"""The Terraform module's dead-letter alarms, proven end to end on LocalStack (its CloudWatch evaluates alarms).

A LocalStack of this module's own (the session's shared one runs without SNS, which the module's alarm topic
needs, and without AWS/SQS metrics, which make SQS slower): SNS added, SQS publishing its queue metrics every
5 s. Then ``terraform apply`` of ``terraform/examples/local``, ``sqs-worker run`` with ``WORKER_METRICS=cloudwatch``
and the settings the module outputs, one job that dead-letters (PermanentError), SIGTERM (the worker flushes its
metrics with PutMetricData at shutdown), and both dead-letter alarms of the module must reach ALARM:

- ``<name>-dlq-not-empty``: AWS/SQS ``ApproximateNumberOfMessagesVisible`` of the DLQ, published by LocalStack;
- ``<name>-job-failures``: the worker's own ``JobsDeadLettered`` (namespace SqsWorker, ``Queue=<name>``).

LocalStack evaluates an alarm when it is created and then once a period (60 s) over the last period, so ALARM
comes within about a minute of the data; the wait is bounded by ALARM_DEADLINE_S. The whole test takes about
2-3 minutes.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BACKENDS
from tests.support.backends import Backend, start_localstack
from tests.support.process import start, wait_until, worker_env
from tests.support.terraform import Applied, applied_local_example

ALARM_DEADLINE_S = 240
SQS_METRICS_INTERVAL_S = 5

pytestmark = pytest.mark.skipif("localstack" not in BACKENDS, reason="LocalStack-only (SQS_WORKER_TEST_BACKENDS)")


@pytest.fixture(scope="module")
def alarm_localstack() -> Iterator[Backend]:
    backend = start_localstack(
        options=["--extra-services", "sns", "--sqs-metrics-interval-s", str(SQS_METRICS_INTERVAL_S)]
    )
    yield backend
    backend.stop()


@pytest.fixture(scope="module")
def applied(alarm_localstack: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Applied]:
    work = tmp_path_factory.mktemp("tf-alarms")
    name = f"tfa-{uuid.uuid4().hex[:8]}"
    # No destroy: the LocalStack instance goes, with all it holds, at the end of the module.
    with applied_local_example(alarm_localstack.endpoint_url, work, name=name, destroy=False) as done:
        yield done


def counts(sqs: Any, queue_url: str) -> tuple[int, int, int]:
    names = [
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
        "ApproximateNumberOfMessagesDelayed",
    ]
    attributes = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=names)["Attributes"]
    visible, invisible, delayed = (int(attributes[name]) for name in names)
    return visible, invisible, delayed


def states(cloudwatch: Any, names: list[str]) -> dict[str, tuple[str, str]]:
    """Each alarm's (state, reason)."""
    alarms = cloudwatch.describe_alarms(AlarmNames=names)["MetricAlarms"]
    return {alarm["AlarmName"]: (alarm["StateValue"], alarm["StateReason"]) for alarm in alarms}


def await_alarms(cloudwatch: Any, names: list[str], deadline_s: float) -> dict[str, str]:
    """Poll until every alarm in ``names`` has been seen in ALARM (its reason kept); AssertionError at the deadline.

    An alarm whose data ages out of its period goes back to OK at a later evaluation, so each one is recorded
    when first seen in ALARM.
    """
    seen: dict[str, str] = {}
    deadline = time.monotonic() + deadline_s
    last: dict[str, tuple[str, str]] = {}
    while time.monotonic() < deadline:
        last = states(cloudwatch, names)
        seen.update({name: reason for name, (state, reason) in last.items() if state == "ALARM" and name not in seen})
        if seen.keys() == set(names):
            return seen
        time.sleep(2)  # another process's evaluation loop: nothing to await
    raise AssertionError(f"not all of {names} reached ALARM within {deadline_s} s (seen: {sorted(seen)}); last: {last}")


@pytest.mark.timeout(720)
def test_a_dead_lettered_job_sets_off_the_modules_dead_letter_alarms(applied: Applied, tmp_path: Path) -> None:
    dlq_alarm, job_alarm = f"{applied.name}-dlq-not-empty", f"{applied.name}-job-failures"
    assert {dlq_alarm, job_alarm} <= set(applied.outputs["alarm_names"])
    cloudwatch, sqs = applied.client("cloudwatch"), applied.client("sqs")
    before = states(cloudwatch, [dlq_alarm, job_alarm])
    assert all(state != "ALARM" for state, _ in before.values()), f"in ALARM before any failure: {before}"

    env = worker_env(applied.endpoint_url, TMP=str(tmp_path), **applied.outputs["worker_environment"])
    env.update(WORKER_HANDLERS="tests.support.terraform_handlers", WORKER_METRICS="cloudwatch")
    stderr = tmp_path / "worker.stderr"
    worker = start("run", env=env, stderr_path=stderr)
    try:
        sqs.send_message(
            QueueUrl=applied.outputs["queue_url"], MessageBody=json.dumps({"type": "refuse", "payload": {"n": 1}})
        )
        dlq_url = applied.outputs["dead_letter_queue_url"]
        wait_until(lambda: counts(sqs, dlq_url)[0] == 1, 60, "the job in the DLQ")
        wait_until(lambda: counts(sqs, applied.outputs["queue_url"]) == (0, 0, 0), 30, "the source queue empty")
    finally:
        worker.send_signal(signal.SIGTERM)  # the worker flushes its metrics (PutMetricData) at shutdown
        try:
            code = worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
            raise
    assert code == 0, stderr.read_text(encoding="utf-8")[-3000:]
    now = datetime.now(UTC)
    sent = cloudwatch.get_metric_statistics(
        Namespace="SqsWorker",
        MetricName="JobsDeadLettered",
        Dimensions=[{"Name": "Queue", "Value": applied.name}],
        StartTime=now - timedelta(minutes=5),
        EndTime=now + timedelta(minutes=1),
        Period=60,
        Statistics=["Sum"],
    )["Datapoints"]
    # >= 1, not == 1: LocalStack also counts the [Queue, JobType] and [Queue, Category] data under [Queue].
    assert sum(point["Sum"] for point in sent) >= 1, f"the worker's JobsDeadLettered in CloudWatch: {sent}"

    reasons = await_alarms(cloudwatch, [dlq_alarm, job_alarm], ALARM_DEADLINE_S)
    assert all("Threshold Crossed" in reason for reason in reasons.values()), reasons
