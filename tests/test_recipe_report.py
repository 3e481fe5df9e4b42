"""The report recipe on moto and LocalStack (S3 included): a request fans out chunks as a group, status goes from
0% to ready, and the presigned URL serves the assembled CSV."""

from __future__ import annotations

import json
import logging
import time
import urllib.request
import uuid
from collections.abc import Callable

import boto3
import pytest

from tests.support.backends import Backend
from tests.support.harness import make_queues, running_worker, sqs_client
from tests.support.idempotency import dynamodb_client
from tests.support.process import cli, worker_env
from tests.support.queues import assert_queue_empty
from worker.backends.sqs import Queue
from worker.context import JobContext
from worker.idempotency import Ledger, create_table
from worker.jobs import Registry
from worker.observability.events import Kind
from worker.recipes import report
from worker.recipes.report import ReportRequest, chunk_bounds, to_csv
from worker.workflows import WorkflowHooks, WorkflowStore


def test_chunk_bounds_cover_every_row_once() -> None:
    assert chunk_bounds(2500, 1000) == [(0, 1000), (1000, 2000), (2000, 2500)]
    assert chunk_bounds(0, 1000) == [(0, 0)]
    assert to_csv([(1, 2)], ["a", "b"]) == "a,b\n1,2\n"


def context() -> JobContext:
    return JobContext("report", "m-1", 1, 1, None, time.monotonic() + 60, logging.LoggerAdapter(logging.getLogger()))


async def test_report_goes_from_zero_to_ready_with_a_presigned_url(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    queues = make_queues(backend.endpoint_url, max_receive_count=20)
    table, bucket = f"rp-{uuid.uuid4().hex[:10]}", f"reports-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=backend.endpoint_url, region_name="us-east-1").create_bucket(Bucket=bucket)
    settings = {
        "AWS_ENDPOINT_URL": backend.endpoint_url,
        "WORKER_QUEUE": queues.queue_url,
        "WORKER_IDEMPOTENCY_TABLE": table,
        "WORKER_REPORT_BUCKET": bucket,
    }
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    env = worker_env(backend.endpoint_url, **settings)
    report_id = uuid.uuid4().hex[:8]
    async with dynamodb_client(backend.endpoint_url) as client:
        await create_table(client, table)
        # The request job's effect, called as the worker calls it: the group is started, no chunk has run.
        request = ReportRequest(report_id=report_id, source="numbers", rows=2500, chunk_rows=1000)
        started = report.request(request, context())
        assert started == {"report_id": report_id, "workflow_id": f"report-{report_id}", "chunks": 3}
        before = cli("status", f"report-{report_id}", env=env)
        assert "progress: 0 of 3 done (0%)" in before.stdout, before.stderr
        registry = Registry()
        report.register(registry, backoff_base_s=0)
        ledger = Ledger(client, table, owner="t")
        async with running_worker(
            backend.endpoint_url, queues, registry, ledger=ledger, workflows=hooks(client, table)
        ) as run:
            await run.recorder.wait_count(Kind.SUCCEEDED, 4)  # three chunks and the assembly
    after = cli("status", f"report-{report_id}", "--json", env=env)
    status = json.loads(after.stdout)
    assert (status["state"], status["percent"]) == ("succeeded", 100.0), after.stdout
    result = status["result"]
    assert (result["key"], result["rows"]) == (f"reports/{report_id}.csv", 2500)
    lines = fetch(result["url"]).splitlines()
    assert lines[0] == "n,square,cube" and len(lines) == 2501
    assert lines[1:4] == ["0,0,0", "1,1,1", "2,4,8"] and lines[-1] == f"2499,{2499**2},{2499**3}"
    listed = boto3.client("s3", endpoint_url=backend.endpoint_url, region_name="us-east-1").list_objects_v2(
        Bucket=bucket
    )
    assert [item["Key"] for item in listed.get("Contents", [])] == [f"reports/{report_id}.csv"]  # parts removed
    assert_queue_empty(sqs_client(backend.endpoint_url), queues.queue_url)


def hooks(client: object, table: str) -> Callable[[Queue, Queue], WorkflowHooks]:
    return lambda queue, dlq: WorkflowHooks(WorkflowStore(client, table), queue=queue, dlq=dlq)


def fetch(url: str) -> str:
    """GET the presigned URL (plain HTTP, no AWS credentials: the signature in the URL is the access)."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text: str = response.read().decode()
        return text
