"""The local AWS backends themselves: what the integration suite relies on them for.

LocalStack runs on the host from infra/localstack (its own venv, DynamoDB from the dynamodb:moto plugin). These
tests pin down that it starts, answers the services the worker uses, fails loudly when it cannot start, and that
both backends serialise DynamoDB item writes as real DynamoDB does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from threading import Barrier
from typing import TYPE_CHECKING, Any
from uuid import uuid4

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from tests.support.backends import LOCALSTACK_LAUNCHER, REPO_ROOT, Backend, start_localstack

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient
    from mypy_boto3_sqs.client import SQSClient

CLAIMERS = 6
CLAIMED_KEYS = 40


def sqs_client(endpoint_url: str, **session: Any) -> SQSClient:
    return boto3.session.Session(**session).client("sqs", endpoint_url=endpoint_url, region_name="us-east-1")


def dynamodb_client(endpoint_url: str, **session: Any) -> DynamoDBClient:
    config = Config(max_pool_connections=CLAIMERS * 2, retries={"max_attempts": 1})
    return boto3.session.Session(**session).client(
        "dynamodb", endpoint_url=endpoint_url, region_name="us-east-1", config=config
    )


def create_table(client: DynamoDBClient) -> str:
    name = f"smoke-{uuid4().hex[:12]}"
    client.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "key", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    return name


def test_localstack_reports_the_worker_services_available(localstack_backend: Backend) -> None:
    with urllib.request.urlopen(f"{localstack_backend.endpoint_url}/_localstack/health", timeout=10) as response:
        health = json.load(response)
    assert health["version"] == "4.13.1"
    for service in ("sqs", "dynamodb", "events", "scheduler", "cloudwatch", "logs", "sts"):
        assert health["services"][service] in ("available", "running"), service


def test_localstack_moves_a_message_to_the_redrive_dlq(localstack_backend: Backend) -> None:
    sqs = sqs_client(localstack_backend.endpoint_url)
    name = f"smoke-{uuid4().hex[:12]}"
    dlq_url = sqs.create_queue(QueueName=f"{name}-dlq")["QueueUrl"]
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    redrive = json.dumps({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "1"})
    url = sqs.create_queue(QueueName=name, Attributes={"RedrivePolicy": redrive, "VisibilityTimeout": "0"})["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody='{"type": "t", "payload": {}}')

    first = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1, AttributeNames=["ApproximateReceiveCount"])
    assert [m["Attributes"]["ApproximateReceiveCount"] for m in first["Messages"]] == ["1"]
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)
    moved = sqs.receive_message(QueueUrl=dlq_url, WaitTimeSeconds=2)["Messages"]
    assert [m["Body"] for m in moved] == ['{"type": "t", "payload": {}}']


def test_dynamodb_conditional_put_returns_the_old_item(backend: Backend) -> None:
    client = dynamodb_client(backend.endpoint_url)
    table = create_table(client)
    client.put_item(TableName=table, Item={"key": {"S": "k"}, "owner": {"S": "first"}})

    with pytest.raises(ClientError) as failed:
        client.put_item(
            TableName=table,
            Item={"key": {"S": "k"}, "owner": {"S": "second"}},
            ConditionExpression="attribute_not_exists(#k)",
            ExpressionAttributeNames={"#k": "key"},
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )

    assert failed.value.response["Error"]["Code"] == "ConditionalCheckFailedException"
    assert failed.value.response["Item"]["owner"] == {"S": "first"}  # type: ignore[typeddict-item]


def test_dynamodb_concurrent_conditional_claims_grant_each_key_once(backend: Backend) -> None:
    client = dynamodb_client(backend.endpoint_url)
    table = create_table(client)
    keys = [f"claim-{n}" for n in range(CLAIMED_KEYS)]

    def claim_all(claimer: int, barrier: Barrier) -> list[str]:
        won = []
        for key in keys:
            barrier.wait(timeout=30)  # all claimers race for the same key at once
            try:
                client.put_item(
                    TableName=table,
                    Item={"key": {"S": key}, "owner": {"S": str(claimer)}},
                    ConditionExpression="attribute_not_exists(#k)",
                    ExpressionAttributeNames={"#k": "key"},
                )
            except ClientError as exc:
                if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                    raise
            else:
                won.append(key)
        return won

    barrier = Barrier(CLAIMERS)
    with ThreadPoolExecutor(CLAIMERS) as pool:
        results = list(pool.map(claim_all, range(CLAIMERS), [barrier] * CLAIMERS))

    granted = sorted(key for won in results for key in won)
    assert granted == sorted(keys)  # every key exactly once: no double grant, none lost


@pytest.fixture
def private_account(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Credentials of a LocalStack account of this test's own (12-digit access key = account id)."""
    account = {"aws_access_key_id": "210987654321", "aws_secret_access_key": "testing"}
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", account["aws_access_key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", account["aws_secret_access_key"])
    return account


def test_localstack_reset_deletes_queues_and_tables(
    localstack_backend: Backend, private_account: dict[str, str]
) -> None:
    sqs = sqs_client(localstack_backend.endpoint_url, **private_account)
    dynamodb = dynamodb_client(localstack_backend.endpoint_url, **private_account)
    queue_url = sqs.create_queue(QueueName=f"reset-{uuid4().hex[:12]}")["QueueUrl"]
    assert "210987654321" in queue_url
    table = create_table(dynamodb)

    localstack_backend.reset()

    assert queue_url not in sqs.list_queues().get("QueueUrls", [])
    assert table not in dynamodb.list_tables()["TableNames"]


def test_start_localstack_fails_loudly_without_its_venv(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCALSTACK_VENV", "/nonexistent/localstack-venv")
    monkeypatch.delenv("LOCALSTACK_ENDPOINT_URL", raising=False)

    with pytest.raises(RuntimeError, match=r"no LocalStack virtualenv at /nonexistent/localstack-venv.*setup\.sh"):
        start_localstack(ready_timeout_s=10)


def test_launcher_help_runs_on_the_standard_library_alone() -> None:
    result = subprocess.run(
        [sys.executable, "-I", "-S", str(LOCALSTACK_LAUNCHER), "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": os.environ.get("PATH", "")},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "--port" in result.stdout


def test_dynamodb_moto_plugin_is_registered_and_locks_every_item_write() -> None:
    venv = Path(os.environ.get("LOCALSTACK_VENV", REPO_ROOT / ".tools" / "localstack-venv"))
    venv_python = venv / "bin" / "python"
    probe = """
import json
from importlib.metadata import entry_points
from moto.dynamodb.models import DynamoDBBackend
from localstack_dynamodb_moto.provider import WRITE_METHODS

(spec,) = [ep.load() for ep in entry_points(group="localstack.aws.provider") if ep.name == "dynamodb:moto"]
before = {name: hasattr(getattr(DynamoDBBackend, name), "__wrapped__") for name in WRITE_METHODS}
service = spec.factory().create_service()
spec.factory().create_service()  # a second load must not wrap twice
after = {name: getattr(DynamoDBBackend, name) for name in WRITE_METHODS}
print(json.dumps({
    "service": service.name(),
    "before": before,
    "wrapped_once": {n: hasattr(m, "__wrapped__") and not hasattr(m.__wrapped__, "__wrapped__")
                     for n, m in after.items()},
}))
"""
    result = subprocess.run([str(venv_python), "-c", probe], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["service"] == "dynamodb"
    assert not any(report["before"].values())
    assert set(report["wrapped_once"]) >= {"put_item", "update_item", "delete_item", "transact_write_items"}
    assert all(report["wrapped_once"].values()), report
