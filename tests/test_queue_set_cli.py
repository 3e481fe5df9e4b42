"""The commands over a queue set (WORKER_QUEUES): bootstrap creates every queue with its own DLQ; stats and the
dlq commands cover the set or the queue ``--queue`` names; enqueue and purge need ``--queue`` with several."""

from __future__ import annotations

import json
import uuid

import pytest

from tests.support.backends import Backend
from tests.support.harness import sqs_client
from tests.support.queues import message_count
from worker.commands.__main__ import main


@pytest.fixture
def queue_set(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    prefix = f"cli-{uuid.uuid4().hex[:8]}"
    critical, bulk = f"{prefix}-critical", f"{prefix}-bulk"
    monkeypatch.setenv("AWS_ENDPOINT_URL", backend.endpoint_url)
    monkeypatch.delenv("WORKER_QUEUE", raising=False)
    monkeypatch.delenv("WORKER_DEAD_LETTER_QUEUE", raising=False)
    monkeypatch.setenv("WORKER_QUEUES", f"{critical}:10,{bulk}:1")
    monkeypatch.setenv("WORKER_QUEUES_MODE", "strict")
    monkeypatch.setenv("LOGNAME", "pytest-operator")
    return critical, bulk


def test_bootstrap_stats_dlq_and_enqueue_cover_the_set(
    backend: Backend, queue_set: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    critical, bulk = queue_set
    assert main(["bootstrap"]) == 0
    out = capsys.readouterr().out
    client = sqs_client(backend.endpoint_url)
    for name in (critical, bulk):
        assert f"/{name}\n" in out and f"/{name}-dlq (maxReceiveCount" in out
        url = client.get_queue_url(QueueName=name)["QueueUrl"]
        policy = client.get_queue_attributes(QueueUrl=url, AttributeNames=["RedrivePolicy"])["Attributes"]
        assert json.loads(policy["RedrivePolicy"])["deadLetterTargetArn"].endswith(f":{name}-dlq")

    assert main(["enqueue", "mark", "--payload", "{}"]) == 2
    assert "pick one with --queue NAME" in capsys.readouterr().err
    assert main(["enqueue", "mark", "--payload", "{}", "--queue", bulk]) == 0
    bulk_url = client.get_queue_url(QueueName=bulk)["QueueUrl"]
    assert message_count(client, bulk_url) == 1
    capsys.readouterr()

    client.send_message(QueueUrl=client.get_queue_url(QueueName=f"{bulk}-dlq")["QueueUrl"], MessageBody="dead")
    assert main(["stats", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["queues"]
    assert [(row["role"], row["name"], row["visible"]) for row in rows] == [
        ("queue", critical, 0),
        ("dlq", f"{critical}-dlq", 0),
        ("queue", bulk, 1),
        ("dlq", f"{bulk}-dlq", 1),
    ]
    assert main(["stats", "--json", "--queue", bulk]) == 0
    assert [row["name"] for row in json.loads(capsys.readouterr().out)["queues"]] == [bulk, f"{bulk}-dlq"]
    assert main(["stats", "--queue", "no-such-queue"]) == 2
    assert "not a configured queue" in capsys.readouterr().err

    assert main(["dlq", "list", "--json"]) == 0
    documents = json.loads(capsys.readouterr().out)
    assert [(d["dead_letter_queue"], d["read"]) for d in documents] == [(f"{critical}-dlq", 0), (f"{bulk}-dlq", 1)]
    assert main(["dlq", "list", "--json", "--queue", bulk]) == 0
    assert json.loads(capsys.readouterr().out)["dead_letter_queue"] == f"{bulk}-dlq"

    assert main(["dlq", "redrive", "--yes", "--no-move-task"]) == 0
    assert f"redrive to {bulk}: moved 1 of 1" in capsys.readouterr().out
    assert message_count(client, bulk_url) == 2, "the bulk dead letter went back to bulk"

    assert main(["dlq", "purge", "--yes"]) == 2
    assert "pick one with --queue NAME" in capsys.readouterr().err
    assert main(["dlq", "purge", "--yes", "--queue", critical]) == 0
    assert f"purged {critical}-dlq" in capsys.readouterr().out


def test_both_queue_settings_is_a_config_error(
    queue_set: tuple[str, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WORKER_QUEUE", "jobs")
    assert main(["stats"]) == 2
    assert "set WORKER_QUEUE (one queue) or WORKER_QUEUES (several), not both" in capsys.readouterr().err
