"""``schedules fire`` is honest about the ledger: a slot whose key is already done is said to be skipped by the
worker, and ``--now`` fires a fresh run keyed by the current time."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING
from uuid import uuid4

import boto3
import pytest

from tests.support.backends import Backend
from worker.commands.__main__ import main
from worker.idempotency import Ledger, create_table, payload_hash
from worker.scheduling.schedules import utc_now

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb.client import DynamoDBClient

SCHEDULES = """\
schedules:
  - name: tick
    expression: rate(1 minute)
    type: tick
"""


async def test_fire_says_a_done_slot_is_skipped_and_now_fires_a_fresh_run(
    backend: Backend,
    dynamodb: DynamoDBClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    table = f"fire-{uuid4().hex[:12]}"
    await create_table(dynamodb, table)
    ledger = Ledger(dynamodb, table, owner="host:1:dev")
    sqs = boto3.client("sqs", endpoint_url=backend.endpoint_url, region_name="us-east-1")
    queue_url = sqs.create_queue(QueueName=f"fire-{uuid4().hex[:8]}")["QueueUrl"]
    (tmp_path / "schedules.yaml").write_text(SCHEDULES, encoding="utf-8")
    for name, value in {
        "AWS_ENDPOINT_URL": backend.endpoint_url,
        "WORKER_QUEUE": queue_url,
        "WORKER_IDEMPOTENCY_TABLE": table,
        "WORKER_SCHEDULES_FILE": str(tmp_path / "schedules.yaml"),
    }.items():
        monkeypatch.setenv(name, value)
    slot = "2026-11-30T08:00:00Z"
    key = f"schedule:tick:{slot}"
    claim = await ledger.claim(key=key, job_type="tick", payload_hash=payload_hash("tick", {}), lease_s=30)
    assert await ledger.complete(claim, result=None) is True  # the dev cron's run of this slot

    capsys.readouterr()
    assert await asyncio.to_thread(main, ["schedules", "fire", "tick", "--at", slot]) == 0
    out = capsys.readouterr().out
    assert f"tick fired for {slot}: message " in out
    assert f"key {key} is already COMPLETED in table {table}: the worker will skip this message" in out
    assert "for a fresh run: sqs-worker schedules fire tick --now" in out  # the schedule's name, not NAME

    before = utc_now()
    for _ in range(2):  # twice within a second: each a fresh key (they shared one, and the second was skipped)
        assert await asyncio.to_thread(main, ["schedules", "fire", "tick", "--now"]) == 0
    out = capsys.readouterr().out
    assert "already" not in out
    bodies = []
    for _ in range(10):
        response = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
        bodies += [json.loads(m["Body"]) for m in response.get("Messages", [])]
        if len(bodies) == 3:
            break
    keys = sorted(body["idempotency_key"] for body in bodies)
    fresh = [k for k in keys if k != key]
    assert len(keys) == 3 and len(set(fresh)) == 2
    for fresh_key in fresh:  # keyed by the current time, to the millisecond
        moment = datetime.fromisoformat(fresh_key.removeprefix("schedule:tick:"))
        assert moment >= before.replace(microsecond=before.microsecond // 1000 * 1000)
        assert f"tick fired for {fresh_key.removeprefix('schedule:tick:')}: message " in out


def test_the_key_a_fire_is_checked_by_is_the_key_its_message_carries() -> None:
    """`schedules fire` and the dashboard's fire now read the ledger by Schedule.idempotency_key."""
    from datetime import UTC, datetime

    import yaml

    from worker.scheduling.schedules import parse_schedules

    [schedule] = parse_schedules(yaml.safe_load(SCHEDULES))
    slot = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
    body = json.loads(schedule.message_body(slot))
    assert body["idempotency_key"] == schedule.idempotency_key(slot) == "schedule:tick:2026-11-30T08:00:00Z"
