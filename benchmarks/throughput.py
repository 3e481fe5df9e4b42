"""Throughput and AWS requests per job of the real worker against a local SQS endpoint.

    .venv/bin/python benchmarks/throughput.py --backend localstack --jobs 2000 --concurrency 50
    .venv/bin/python benchmarks/throughput.py --backend moto --jobs 300          # moto slows with depth

Prints: jobs/s for no-op jobs, SQS requests per job (ReceiveMessage, DeleteMessageBatch, ...; each request is
billed), the latency from send to start (p50/p95) and the process's peak RSS. LocalStack's SQS cost does not
grow with queue depth; moto's does (see shared field notes), so use LocalStack for deep queues.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiobotocore.session import get_session

from tests.support.backends import Backend, start_moto
from tests.support.harness import sqs_client
from worker.backends.sqs import Queue
from worker.jobs import Registry
from worker.observability.events import Event, Kind, Observers
from worker.ops.bootstrap import ensure_queues
from worker.producer import Job, enqueue_many
from worker.runtime.worker import RuntimeOptions, Worker


class Counter:
    def __init__(self, target: int) -> None:
        self.succeeded = 0
        self.waits_s: list[float] = []
        self.target = target
        self.done = asyncio.Event()

    def emit(self, event: Event) -> None:
        if event.kind is Kind.STARTED and event.queue_wait_s is not None:
            self.waits_s.append(event.queue_wait_s)
        if event.kind is Kind.SUCCEEDED:
            self.succeeded += 1
            if self.succeeded >= self.target:
                self.done.set()

    def gauge(self, *, in_flight: int, free_slots: int, stuck_threads: int = 0) -> None:
        return None

    def connectivity(self, *, service: str, reachable: bool) -> None:
        return None


def start_backend(name: str) -> Backend:
    if name == "moto":
        return start_moto()
    from tests.support.backends import start_localstack

    backend: Backend = start_localstack()
    return backend


async def measure(endpoint_url: str, *, jobs: int, concurrency: int, preload: bool) -> dict[str, float]:
    client = sqs_client(endpoint_url)
    created = ensure_queues(client, f"bench-{uuid.uuid4().hex[:8]}")
    registry = Registry()

    @registry.job("noop")
    async def noop(payload: dict[str, int]) -> None:
        return None

    batch = [Job("noop", {"n": n}) for n in range(jobs)]
    if preload:
        enqueue_many(client, created.queue_url, batch)
    counter = Counter(jobs)
    async with get_session().create_client("sqs", endpoint_url=endpoint_url, region_name="us-east-1") as sqs:
        queue, dlq = Queue(sqs, created.queue_url), Queue(sqs, created.dlq_url)
        worker = Worker(
            registry=registry,
            queue=queue,
            dlq=dlq,
            options=RuntimeOptions(concurrency=concurrency, visibility_timeout_s=60, poll_wait_s=1),
            observers=Observers([counter]),
        )
        stop = asyncio.Event()
        started = time.perf_counter()
        task = asyncio.create_task(worker.run(stop))
        if not preload:
            await asyncio.to_thread(enqueue_many, client, created.queue_url, batch)
        await asyncio.wait_for(counter.done.wait(), timeout=600)
        elapsed_s = time.perf_counter() - started
        stop.set()
        await task
        requests = queue.request_count + dlq.request_count
    waits = sorted(counter.waits_s)
    return {
        "jobs": jobs,
        "seconds": round(elapsed_s, 2),
        "jobs_per_s": round(jobs / elapsed_s, 1),
        "sqs_requests": requests,
        "sqs_requests_per_job": round(requests / jobs, 3),
        "receive_calls": queue.receive_calls,
        "delete_batches": queue.deleter.calls,
        "wait_p50_ms": round(1000 * statistics.median(waits), 1) if waits else 0.0,
        "wait_p95_ms": round(1000 * waits[int(0.95 * (len(waits) - 1))], 1) if waits else 0.0,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["moto", "localstack"], default="localstack")
    parser.add_argument("--endpoint-url", help="use a running endpoint instead of starting one")
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--live", action="store_true", help="enqueue while the worker runs (default: preload)")
    args = parser.parse_args()
    defaults = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1"}
    for name, value in defaults.items():
        os.environ.setdefault(name, value)
    backend = None if args.endpoint_url else start_backend(args.backend)
    endpoint = args.endpoint_url or (backend.endpoint_url if backend else "")
    try:
        result = asyncio.run(measure(endpoint, jobs=args.jobs, concurrency=args.concurrency, preload=not args.live))
    finally:
        if backend is not None:
            backend.stop()
    result_with_setup = {"backend": args.backend, "concurrency": args.concurrency, **result}
    print(json.dumps(result_with_setup, indent=2))


if __name__ == "__main__":
    main()
