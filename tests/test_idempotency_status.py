"""``sqs-worker status KEY`` as a user runs it: a subprocess against a real endpoint."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import TYPE_CHECKING
from uuid import uuid4

import pytest
import pytest_asyncio

from tests.support.backends import Backend
from worker.commands.__main__ import main
from worker.idempotency import Ledger, create_table, payload_hash

if TYPE_CHECKING:
    from types_aiobotocore_dynamodb.client import DynamoDBClient


@pytest_asyncio.fixture(loop_scope="function")
async def ledger(dynamodb: DynamoDBClient) -> Ledger:
    name = f"status-{uuid4().hex[:12]}"
    await create_table(dynamodb, name)
    return Ledger(dynamodb, name, owner="host:42:cafe", progress_min_interval_s=0)


async def status(
    backend: Backend,
    *args: str,
    table: str | None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> tuple[int, str, str]:
    """Run the command in-process (in a thread: it calls asyncio.run) with the environment a user would set."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", backend.endpoint_url)
    if table is None:
        monkeypatch.delenv("WORKER_IDEMPOTENCY_TABLE", raising=False)
    else:
        monkeypatch.setenv("WORKER_IDEMPOTENCY_TABLE", table)
    capsys.readouterr()
    code = await asyncio.to_thread(main, ["status", *args])
    out, err = capsys.readouterr()
    return code, out, err


async def test_status_of_a_completed_job(
    backend: Backend, ledger: Ledger, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    key = f"order-{uuid4().hex[:8]}"
    claim = await ledger.claim(key=key, job_type="charge", payload_hash=payload_hash("charge", {}), lease_s=30)
    ledger.progress(claim, 40, "charging")
    assert await ledger.complete(claim, result={"charge_id": "ch_1"}) is True

    code, out, _ = await status(backend, key, table=ledger.table_name, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0
    lines = dict(line.split(":", 1) for line in out.strip().splitlines())
    fields = {label: value.strip() for label, value in lines.items()}
    assert fields["key"] == key
    assert fields["state"] == "COMPLETED"
    assert fields["job type"] == "charge"
    assert fields["attempts"] == "1"
    assert fields["last error"] == "-"
    assert fields["progress"] == "40% (charging)"
    assert fields["result"] == '{"charge_id": "ch_1"}'
    assert fields["owner"] == "host:42:cafe (token 1)"
    assert fields["lease"] == "none"

    code, out, _ = await status(backend, key, "--json", table=ledger.table_name, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0
    record = json.loads(out)
    assert record["state"] == "COMPLETED"
    assert record["result"] == {"charge_id": "ch_1"}
    assert (record["attempts"], record["progress"], record["progress_note"]) == (1, 40.0, "charging")


async def test_status_of_a_job_waiting_for_its_retry(
    backend: Backend, ledger: Ledger, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    key = f"order-{uuid4().hex[:8]}"
    claim = await ledger.claim(key=key, job_type="charge", payload_hash=payload_hash("charge", {}), lease_s=30)
    await ledger.release(claim, error="RetryableError: gateway timeout")

    code, out, _ = await status(
        backend, "--table", ledger.table_name, key, table=None, monkeypatch=monkeypatch, capsys=capsys
    )
    assert code == 0
    assert "state:      RETRY_PENDING" in out
    assert "last error: RetryableError: gateway timeout" in out
    assert "owner:      - (token 1)" in out


async def test_status_of_an_unknown_key_and_without_a_table(
    backend: Backend, ledger: Ledger, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = await status(
        backend, "never-seen", table=ledger.table_name, monkeypatch=monkeypatch, capsys=capsys
    )
    assert (code, out) == (3, "")
    assert "no record for key 'never-seen'" in err
    code, out, _ = await status(
        backend, "never-seen", "--json", table=ledger.table_name, monkeypatch=monkeypatch, capsys=capsys
    )
    assert (code, json.loads(out)) == (3, {"key": "never-seen", "state": None})
    code, _, err = await status(backend, "never-seen", table=None, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 2
    assert "WORKER_IDEMPOTENCY_TABLE" in err
    # An empty key (DynamoDB refuses one) or bytes that are not UTF-8: said so, not blamed on the endpoint.
    for key, says in [("", "KEY is empty"), ("caf\udce9", "is not valid UTF-8")]:
        code, out, err = await status(backend, key, table=ledger.table_name, monkeypatch=monkeypatch, capsys=capsys)
        assert (code, out) == (2, "")
        assert says in err and len(err.splitlines()) == 1, err


async def test_status_of_a_key_that_names_no_job_says_so_in_one_line(
    backend: Backend,
    ledger: Ledger,
    dynamodb: DynamoDBClient,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The worker's own items (breakers, presence) and items something else wrote printed a traceback (exit 1)."""
    table = ledger.table_name
    await dynamodb.put_item(TableName=table, Item={"key": {"S": "sqs-worker:breakers"}, "keys": {"SS": ["a", "b"]}})
    await dynamodb.put_item(TableName=table, Item={"key": {"S": "theirs"}, "status": {"S": "SOMETHING"}})
    for key in ("sqs-worker:breakers", "sqs-worker#worker#host:1:ab", "theirs"):
        code, out, err = await status(backend, key, table=table, monkeypatch=monkeypatch, capsys=capsys)
        assert (code, out) == (3, ""), err
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err


async def test_the_installed_command_prints_the_record(backend: Backend, ledger: Ledger) -> None:
    """One run of the real entry point in a subprocess, as a user types it."""
    key = f"order-{uuid4().hex[:8]}"
    claim = await ledger.claim(key=key, job_type="charge", payload_hash=payload_hash("charge", {}), lease_s=30)
    await ledger.fail(claim, error="PermanentError: card declined")
    env = {**os.environ, "AWS_ENDPOINT_URL": backend.endpoint_url, "WORKER_IDEMPOTENCY_TABLE": ledger.table_name}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "worker.commands",
        "status",
        key,
        "--json",
        env=env,
        stdout=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(60):
        stdout, _ = await process.communicate()
    assert process.returncode == 0
    record = json.loads(stdout)
    assert (record["state"], record["last_error"], record["attempts"]) == ("FAILED", "PermanentError: card declined", 1)
