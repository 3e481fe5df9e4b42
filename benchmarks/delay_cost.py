"""SQS requests a long delay costs per hop, and a hold per job, measured on the real worker.

    .venv/bin/python benchmarks/delay_cost.py --backend moto --jobs 1
    .venv/bin/python benchmarks/delay_cost.py --backend localstack --jobs 50

Jobs are sent due ``--due-s`` seconds ahead (the ``sqs_worker_due_at`` attribute) while the worker hops them in
``--hop-s`` hops (900 s in production; shorter here so it finishes), then run a no-op. The same jobs sent
without a due time give the baseline; the difference divided by the hops is the cost of one hop. Requests are
counted on the worker's own client, by operation (ReceiveMessage, SendMessage, DeleteMessageBatch, ...).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import uuid
from collections import Counter as Tally
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aiobotocore.session import get_session

from benchmarks.throughput import start_backend
from tests.support.harness import sqs_client
from worker.backends.sqs import Queue
from worker.flow.delays import DUE_AT_ATTRIBUTE, format_due_at
from worker.jobs import Registry
from worker.observability.events import Event, Kind, Observers
from worker.ops.bootstrap import ensure_queues
from worker.runtime.worker import RuntimeOptions, Worker


class Watch:
    def __init__(self, target: int) -> None:
        self.target = target
        self.succeeded = 0
        self.hops = 0
        self.done = asyncio.Event()

    def emit(self, event: Event) -> None:
        if event.kind is Kind.RELEASED and event.reason == "not yet due":
            self.hops += 1
        if event.kind is Kind.SUCCEEDED:
            self.succeeded += 1
            if self.succeeded >= self.target:
                self.done.set()

    def gauge(self, *, in_flight: int, free_slots: int, stuck_threads: int = 0) -> None:
        return None

    def connectivity(self, *, service: str, reachable: bool) -> None:
        return None


async def measure(endpoint_url: str, *, jobs: int, due_s: float | None, hop_s: int) -> tuple[Tally[str], int]:
    """Requests by operation the worker made to run ``jobs`` jobs (due ``due_s`` ahead, or at once), and hops."""
    created = ensure_queues(sqs_client(endpoint_url), f"delay-{uuid.uuid4().hex[:8]}", max_receive_count=5)
    registry = Registry()

    @registry.job("noop")
    async def noop(payload: dict[str, Any]) -> None:
        return None

    client_sync = sqs_client(endpoint_url)
    for n in range(jobs):
        attributes = {}
        if due_s is not None:
            due_at = datetime.now(UTC) + timedelta(seconds=due_s)
            attributes = {DUE_AT_ATTRIBUTE: {"DataType": "String", "StringValue": format_due_at(due_at)}}
        client_sync.send_message(
            QueueUrl=created.queue_url,
            MessageBody=json.dumps({"type": "noop", "payload": {"n": n}}),
            MessageAttributes=attributes,  # type: ignore[arg-type]
        )
    calls: Tally[str] = Tally()
    watch = Watch(jobs)
    async with get_session().create_client("sqs", endpoint_url=endpoint_url, region_name="us-east-1") as client:
        client.meta.events.register("before-call.sqs.*", lambda model, **_: calls.update([model.name]))
        worker = Worker(
            registry=registry,
            queue=Queue(client, created.queue_url),
            dlq=Queue(client, created.dlq_url),
            options=RuntimeOptions(concurrency=10, visibility_timeout_s=30, poll_wait_s=1, max_hop_s=hop_s),
            observers=Observers([watch]),
        )
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        await asyncio.wait_for(watch.done.wait(), timeout=120)
        stop.set()
        await task
    return calls, watch.hops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["moto", "localstack"], default="moto")
    parser.add_argument("--endpoint-url", default=None)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--due-s", type=float, default=8.0)
    parser.add_argument("--hop-s", type=int, default=2)
    args = parser.parse_args()
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        os.environ.setdefault(name, value)  # a local endpoint takes any keys
    backend = None if args.endpoint_url else start_backend(args.backend)
    endpoint_url = args.endpoint_url or (backend.endpoint_url if backend else "")
    try:
        base, _ = asyncio.run(measure(endpoint_url, jobs=args.jobs, due_s=None, hop_s=args.hop_s))
        delayed, hops = asyncio.run(measure(endpoint_url, jobs=args.jobs, due_s=args.due_s, hop_s=args.hop_s))
    finally:
        if backend is not None:
            backend.stop()
    # The worker long-polls while it waits: count what the hops add, not the idle polls of the longer run.
    writes = ("SendMessage", "SendMessageBatch", "DeleteMessageBatch", "ChangeMessageVisibilityBatch")
    base_writes = sum(base[name] for name in writes)
    delayed_writes = sum(delayed[name] for name in writes)
    print(f"jobs {args.jobs}, due in {args.due_s:g} s, hops of {args.hop_s} s: {hops} hops")
    print(f"  baseline (no delay): {dict(base)}")
    print(f"  delayed:             {dict(delayed)}")
    print(f"  send+delete requests per hop: {(delayed_writes - base_writes) / max(1, hops):.2f}")
    receives = delayed["ReceiveMessage"] / max(1, hops)
    print(f"  receives per hop (upper bound: idle long polls included): {receives:.2f}")


if __name__ == "__main__":
    main()
