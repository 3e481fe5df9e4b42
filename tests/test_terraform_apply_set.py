"""A real ``terraform apply`` of the module with a queue set (``queues``) against the moto server (as
``test_terraform_apply``: the suite's LocalStack runs no SNS, and leaves a deleted RedriveAllowPolicy as an empty
string, which the provider waits out forever), then
``sqs-worker run`` with exactly the settings the module outputs: every queue of the set runs its jobs, and a dead
letter from ``bulk`` lands in bulk's own DLQ (the redrive target Terraform set), not in the first queue's."""

from __future__ import annotations

import json
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.backends import Backend
from tests.support.process import lines, start, wait_until, worker_env
from tests.support.queues import message_count
from tests.support.terraform import Applied, applied_local_example
from worker.settings import WorkerSettings

QUEUES = '[{name="critical", weight=10}, {name="bulk"}]'


@pytest.fixture(scope="module")
def applied_set(moto_backend: Backend, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Applied]:
    work = tmp_path_factory.mktemp("tf-apply-set")
    name = f"tfs-{uuid.uuid4().hex[:8]}"
    variables = {"queues": QUEUES, "queues_mode": "strict"}
    with applied_local_example(moto_backend.endpoint_url, work, name=name, variables=variables) as done:
        yield done
    left = done.client("sqs").list_queues(QueueNamePrefix=name)
    assert not left.get("QueueUrls"), f"destroy left queues behind: {left['QueueUrls']}"


@pytest.mark.timeout(900)
def test_each_queue_of_the_set_has_its_own_dlq(applied_set: Applied) -> None:
    sqs = applied_set.client("sqs")
    urls, dlq_urls = applied_set.outputs["queue_urls"], applied_set.outputs["dead_letter_queue_urls"]
    assert [url.rsplit("/", 1)[-1] for url in urls] == [f"{applied_set.name}-critical", f"{applied_set.name}-bulk"]
    for url, dlq_url in zip(urls, dlq_urls, strict=True):
        queue = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        dlq = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["All"])["Attributes"]
        assert json.loads(queue["RedrivePolicy"])["deadLetterTargetArn"] == dlq["QueueArn"]
        assert int(dlq["MessageRetentionPeriod"]) > int(queue["MessageRetentionPeriod"])
    alarms = applied_set.client("cloudwatch").describe_alarms(AlarmNamePrefix=applied_set.name)["MetricAlarms"]
    names = {alarm["AlarmName"] for alarm in alarms}
    for queue in ("critical", "bulk"):
        assert {f"{applied_set.name}-{queue}-{kind}" for kind in ("dlq-not-empty", "queue-depth")} <= names


def test_the_outputs_are_a_queue_set_the_worker_reads(applied_set: Applied, monkeypatch: pytest.MonkeyPatch) -> None:
    environment: dict[str, str] = applied_set.outputs["worker_environment"]
    assert "WORKER_QUEUE" not in environment and "WORKER_DEAD_LETTER_QUEUE" not in environment
    for variable, value in environment.items():
        monkeypatch.setenv(variable, value)
    settings = WorkerSettings(_env_file=None)
    urls = applied_set.outputs["queue_urls"]
    assert [(spec.queue, spec.weight) for spec in settings.queue_set()] == [(urls[0], 10), (urls[1], 1)]
    assert settings.queues_mode == "strict"


@pytest.mark.timeout(300)
def test_the_worker_runs_every_queue_and_dead_letters_into_its_dlq(applied_set: Applied, tmp_path: Path) -> None:
    effects = tmp_path / "effects.txt"
    env = worker_env(
        applied_set.endpoint_url,
        TMP=str(tmp_path),
        TEST_EFFECTS_FILE=str(effects),
        **applied_set.outputs["worker_environment"],
    )
    env["WORKER_HANDLERS"] = "tests.support.terraform_handlers"
    env["WORKER_METRICS"] = "off"
    sqs = applied_set.client("sqs")
    (critical_url, bulk_url), (critical_dlq, bulk_dlq) = (
        applied_set.outputs["queue_urls"],
        applied_set.outputs["dead_letter_queue_urls"],
    )
    stderr = tmp_path / "worker.stderr"
    worker = start("run", env=env, stderr_path=stderr)
    try:
        for url, n in ((critical_url, 1), (bulk_url, 2)):
            sqs.send_message(QueueUrl=url, MessageBody=json.dumps({"type": "barrier", "payload": {"n": n}}))
        sqs.send_message(QueueUrl=bulk_url, MessageBody=json.dumps({"type": "refuse", "payload": {"n": 3}}))
        wait_until(lambda: len(lines(effects)) >= 2, 60, "a job of each queue to run")
        wait_until(lambda: message_count(sqs, critical_url) + message_count(sqs, bulk_url) == 0, 60, "both to drain")
        dead = _receive_one(sqs, bulk_dlq)
        assert message_count(sqs, critical_dlq) == 0
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            code = worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            raise
    assert code == 0, stderr.read_text(encoding="utf-8")[-3000:]
    assert sorted(lines(effects)) == ["barrier 1", "barrier 2"]
    attributes = {key: value["StringValue"] for key, value in dead["MessageAttributes"].items()}
    assert (attributes["error_category"], attributes["source_queue"]) == ("permanent", f"{applied_set.name}-bulk")


def _receive_one(sqs: Any, queue_url: str) -> dict[str, Any]:
    response = sqs.receive_message(
        QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=10, MessageAttributeNames=["All"]
    )
    messages = response.get("Messages", [])
    assert len(messages) == 1, f"expected one dead-lettered message, got {messages}"
    message: dict[str, Any] = messages[0]
    return message
