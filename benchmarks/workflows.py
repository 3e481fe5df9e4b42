"""Workflows on a local endpoint: a group of N no-op members with a callback, and a chain of M no-op steps, run by
the in-process Worker with its ledger. Prints the time from start() to the callback's (or last step's) success and
the DynamoDB writes and SQS sends each member or step cost.

    .venv/bin/python benchmarks/workflows.py --backend localstack --members 200 --steps 20 --concurrency 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import boto3
from aiobotocore.session import get_session

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.throughput import start_backend
from worker.backends.sqs import Queue
from worker.idempotency import Ledger, create_table
from worker.jobs import Registry
from worker.observability.events import Event, Kind, Observers
from worker.ops.bootstrap import ensure_queues
from worker.producer import Job
from worker.runtime.worker import RuntimeOptions, Worker
from worker.workflows import WorkflowHooks, WorkflowStore, chain, group

WRITES = frozenset({"PutItem", "UpdateItem"})


class Finish:
    """An observer that sets ``done`` when a job of ``job_type`` succeeded."""

    def __init__(self, job_type: str) -> None:
        self.job_type = job_type
        self.done = asyncio.Event()

    def emit(self, event: Event) -> None:
        if event.kind is Kind.SUCCEEDED and event.job_type == self.job_type:
            self.done.set()

    def gauge(self, *, in_flight: int, free_slots: int, stuck_threads: int = 0) -> None:
        return None

    def connectivity(self, *, service: str, reachable: bool) -> None:
        return None


async def run(endpoint_url: str, *, kind: str, size: int, concurrency: int) -> dict[str, Any]:
    sqs = boto3.client("sqs", endpoint_url=endpoint_url, region_name="us-east-1")
    created = ensure_queues(sqs, f"bench-wf-{uuid.uuid4().hex[:8]}")
    table = f"bench-wf-{uuid.uuid4().hex[:8]}"
    registry = Registry()

    @registry.job("noop")
    async def noop(payload: dict[str, int]) -> int:
        return payload["n"]

    @registry.job("last")
    async def last(payload: dict[str, int]) -> None:
        return None

    writes: list[str] = []
    session = get_session()
    async with (
        session.create_client("sqs", endpoint_url=endpoint_url, region_name="us-east-1") as client,
        session.create_client("dynamodb", endpoint_url=endpoint_url, region_name="us-east-1") as dynamodb,
    ):
        await create_table(dynamodb, table)
        dynamodb.meta.events.register(
            "before-call.dynamodb.*", lambda model, **_: writes.append(model.name) if model.name in WRITES else None
        )
        queue, dlq = Queue(client, created.queue_url), Queue(client, created.dlq_url)
        finish = Finish("last")
        worker = Worker(
            registry=registry,
            queue=queue,
            dlq=dlq,
            options=RuntimeOptions(concurrency=concurrency, visibility_timeout_s=60, poll_wait_s=1),
            observers=Observers([finish]),
            ledger=Ledger(dynamodb, table, owner="bench"),
            workflows=WorkflowHooks(WorkflowStore(dynamodb, table), queue=queue, dlq=dlq),
        )
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        ddb = boto3.client("dynamodb", endpoint_url=endpoint_url, region_name="us-east-1")
        started = time.perf_counter()
        if kind == "group":
            flow: Any = group([Job("noop", {"n": n}) for n in range(size)], callback=Job("last"))
        else:
            flow = chain(*[Job("noop", {"n": n}) for n in range(size - 1)], Job("last"))
        await asyncio.to_thread(flow.start, sqs=sqs, dynamodb=ddb, queue=created.queue_url, table=table)
        await asyncio.wait_for(finish.done.wait(), timeout=600)
        elapsed_s = time.perf_counter() - started
        stop.set()
        await task
    jobs = size + (1 if kind == "group" else 0)
    ledger_writes = 2 * jobs  # claim and completion of each job
    return {
        "workflow": kind,
        "size": size,
        "seconds_to_finish": round(elapsed_s, 2),
        "dynamodb_writes": len(writes),
        "workflow_writes_per_member_or_step": round((len(writes) - ledger_writes) / size, 2),
        "sqs_sends_by_the_worker": queue.send_calls,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["moto", "localstack"], default="localstack")
    parser.add_argument("--endpoint-url", help="use a running endpoint instead of starting one")
    parser.add_argument("--members", type=int, default=200)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=20)
    args = parser.parse_args()
    for name, value in {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"}.items():
        os.environ.setdefault(name, value)
    backend = None if args.endpoint_url else start_backend(args.backend)
    endpoint = args.endpoint_url or (backend.endpoint_url if backend else "")
    try:
        for kind, size in (("group", args.members), ("chain", args.steps)):
            print(json.dumps(asyncio.run(run(endpoint, kind=kind, size=size, concurrency=args.concurrency))))
    finally:
        if backend is not None:
            backend.stop()


if __name__ == "__main__":
    main()
