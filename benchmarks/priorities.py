"""Priorities across queues: how soon a critical job starts while a bulk backlog saturates the worker.

    .venv/bin/python benchmarks/priorities.py                       # LocalStack, weighted critical:10,bulk:1
    .venv/bin/python benchmarks/priorities.py --mode strict --bulk-jobs 5000 --concurrency 20

One worker (in-process, the real runtime) consumes two queues, ``critical`` and ``bulk``. First, idle: a critical
job is sent every 100 ms for ``--idle-jobs`` jobs into the idle worker; its start latency (from just before the
SendMessage to the handler's first line, one clock) gives the idle figure. Then ``--bulk-jobs`` bulk jobs (each
sleeping ``--bulk-job-ms``) are preloaded and the worker drains them with every slot busy; meanwhile a critical job
is sent every 100 ms until 80% of the bulk is done (so every sample meets a backlog). Prints p50/p95 of both, their
ratio (the target: saturated p95 within 2x the idle p95), bulk jobs/s, and the receives made on the critical queue
while it was idle (long polls: about one per WORKER_POLL_WAIT_S).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aiobotocore.session import get_session

from benchmarks.throughput import start_backend
from tests.support.harness import sqs_client
from worker.backends.sqs import Queue
from worker.context import JobContext
from worker.flow.priorities import Mode
from worker.jobs import Registry
from worker.observability.events import Event, Kind, Observers
from worker.ops.bootstrap import ensure_queues
from worker.producer import Job, enqueue_many
from worker.runtime.queueset import Route
from worker.runtime.worker import RuntimeOptions, Worker

INTERVAL_S = 0.1


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * (len(ordered) - 1) + 0.5))]


class Sender(threading.Thread):
    """Sends a critical job every INTERVAL_S (on a fixed schedule) until stopped; each carries its send time."""

    def __init__(self, endpoint_url: str, queue_url: str, *, limit: int | None = None) -> None:
        super().__init__(daemon=True)
        self.client = sqs_client(endpoint_url)
        self.queue_url = queue_url
        self.limit = limit
        self.stop = threading.Event()
        self.sent = 0

    def run(self) -> None:
        next_at = time.monotonic()
        while not self.stop.is_set() and (self.limit is None or self.sent < self.limit):
            body = json.dumps({"type": "critical", "payload": {"sent_at": time.time()}})
            self.client.send_message(QueueUrl=self.queue_url, MessageBody=body)
            self.sent += 1
            next_at += INTERVAL_S
            self.stop.wait(max(0.0, next_at - time.monotonic()))


async def measure(endpoint_url: str, args: argparse.Namespace) -> dict[str, Any]:
    client = sqs_client(endpoint_url)
    prefix = f"prio-{uuid.uuid4().hex[:6]}"
    critical = ensure_queues(client, f"{prefix}-critical")
    bulk = ensure_queues(client, f"{prefix}-bulk")
    latencies_s: list[float] = []
    bulk_done = 0
    bulk_job_s = args.bulk_job_ms / 1000
    progress = asyncio.Event()  # set by each job

    async def until(condition: Callable[[], bool]) -> None:
        while not condition():
            progress.clear()
            await progress.wait()

    registry = Registry()

    accepted_at: dict[str, float] = {}  # critical message id -> when the worker took it (had a slot for it)
    to_accept_s: list[float] = []  # send -> taken, of each critical job

    class Accepted:
        def emit(self, event: Event) -> None:
            if event.kind is Kind.RECEIVED and event.queue.endswith("-critical"):
                accepted_at[event.message_id] = time.time()

        def gauge(self, *, in_flight: int, free_slots: int, stuck_threads: int = 0) -> None:
            return None

        def connectivity(self, *, service: str, reachable: bool) -> None:
            return None

    @registry.job("critical")
    async def critical_job(payload: dict[str, float], ctx: JobContext) -> None:
        latencies_s.append(time.time() - payload["sent_at"])
        to_accept_s.append(accepted_at.pop(ctx.message_id, time.time()) - payload["sent_at"])
        progress.set()

    @registry.job("bulk")
    async def bulk_job(payload: dict[str, int]) -> None:
        nonlocal bulk_done
        await asyncio.sleep(bulk_job_s)
        bulk_done += 1
        progress.set()

    async with get_session().create_client("sqs", endpoint_url=endpoint_url, region_name="us-east-1") as sqs:
        routes = [
            Route(Queue(sqs, critical.queue_url), Queue(sqs, critical.dlq_url), 10),
            Route(Queue(sqs, bulk.queue_url), Queue(sqs, bulk.dlq_url), 1),
        ]

        async def report(worker: Worker) -> None:  # progress on stderr, every 5 s
            while True:
                await asyncio.sleep(5)
                receivers = worker._receivers
                states = " ".join(
                    f"[{q.receives} open, {q.listening} lent, {'busy' if q.busy else 'quiet'}, last {q.last_received}]"
                    for q in receivers.policy.queues
                )
                print(
                    f"critical {len(latencies_s)} bulk {bulk_done} free {worker._slots.free} {states} "
                    f"answer {1000 * receivers.answer_times.typical_s:.0f} ms",
                    file=sys.stderr,
                )

        @contextlib.asynccontextmanager
        async def running() -> AsyncIterator[Worker]:
            worker = Worker(
                registry=registry,
                routes=routes,
                mode=Mode(args.mode),
                observers=Observers([Accepted()]),
                options=RuntimeOptions(
                    concurrency=args.concurrency, visibility_timeout_s=60, poll_wait_s=args.poll_wait_s
                ),
            )
            stop = asyncio.Event()
            task = asyncio.create_task(worker.run(stop))
            reporter = asyncio.create_task(report(worker))
            try:
                yield worker
            finally:
                reporter.cancel()
                stop.set()
                await task

        # Idle: critical jobs into an idle worker, then the critical queue left idle for two long polls.
        async with running():
            await asyncio.sleep(1.0)  # the first long polls settle (and lend their slots)
            receives_before = routes[0].queue.receive_calls
            idle_started = time.monotonic()
            sender = Sender(endpoint_url, critical.queue_url, limit=args.idle_jobs)
            sender.start()
            await until(lambda: len(latencies_s) >= args.idle_jobs)
            idle = list(latencies_s)
            idle_accept = list(to_accept_s)
            idle_s = time.monotonic() - idle_started
            idle_receives = routes[0].queue.receive_calls - receives_before
            await asyncio.sleep(args.poll_wait_s + 1.0)
            quiet_started, quiet_before = time.monotonic(), routes[0].queue.receive_calls
            await asyncio.sleep(args.poll_wait_s * 2)
            quiet_receives = routes[0].queue.receive_calls - quiet_before
            quiet_s = time.monotonic() - quiet_started

        # The idle worker's long polls, abandoned at its stop, stay open at SQS until their wait ends: a message
        # they took would be hidden for a visibility timeout (60 s) from the next worker.
        await asyncio.sleep(args.poll_wait_s + 1.0)

        # Saturated: the bulk backlog queued first, then a worker drains it; critical jobs every 100 ms meanwhile.
        await asyncio.to_thread(
            enqueue_many, client, bulk.queue_url, [Job("bulk", {"n": n}) for n in range(args.bulk_jobs)]
        )
        latencies_s.clear()
        to_accept_s.clear()
        async with running():
            drain_started = time.monotonic()
            sender = Sender(endpoint_url, critical.queue_url)
            await until(lambda: bulk_done >= args.concurrency)  # every slot busy with bulk before the first sample
            sender.start()
            await until(lambda: bulk_done >= 0.8 * args.bulk_jobs)
            sender.stop.set()
            await asyncio.to_thread(sender.join)
            await until(lambda: len(latencies_s) >= sender.sent)
            saturated = list(latencies_s)
            saturated_accept = list(to_accept_s)
            await until(lambda: bulk_done >= args.bulk_jobs)
            drain_s = time.monotonic() - drain_started

    def ms(value: float) -> float:
        return round(1000 * value, 1)

    idle_p95, saturated_p95 = percentile(idle, 0.95), percentile(saturated, 0.95)
    return {
        "mode": args.mode,
        "concurrency": args.concurrency,
        "bulk_jobs": args.bulk_jobs,
        "bulk_job_ms": args.bulk_job_ms,
        "idle_samples": len(idle),
        "idle_p50_ms": ms(statistics.median(idle)),
        "idle_p95_ms": ms(idle_p95),
        "saturated_samples": len(saturated),
        "saturated_p50_ms": ms(statistics.median(saturated)),
        "saturated_p95_ms": ms(saturated_p95),
        "saturated_max_ms": ms(max(saturated)),
        "p95_ratio": round(saturated_p95 / idle_p95, 2),
        "idle_to_taken_p95_ms": ms(percentile(idle_accept, 0.95)),
        "saturated_to_taken_p95_ms": ms(percentile(saturated_accept, 0.95)),
        "within_2x": saturated_p95 <= 2 * idle_p95,
        "bulk_jobs_per_s": round(args.bulk_jobs / drain_s, 1),
        "critical_receives_while_idle_jobs": idle_receives,
        "idle_jobs_seconds": round(idle_s, 1),
        "critical_receives_while_quiet": quiet_receives,
        "quiet_seconds": round(quiet_s, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["moto", "localstack"], default="localstack")
    parser.add_argument("--endpoint-url", help="use a running endpoint instead of starting one")
    parser.add_argument("--mode", choices=[m.value for m in Mode], default="weighted")
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--bulk-jobs", type=int, default=5000)
    parser.add_argument("--bulk-job-ms", type=float, default=20.0, help="how long each bulk job sleeps")
    parser.add_argument("--idle-jobs", type=int, default=100)
    parser.add_argument("--poll-wait-s", type=int, default=5, help="WORKER_POLL_WAIT_S of the worker")
    args = parser.parse_args()
    defaults = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_REGION": "us-east-1"}
    for name, value in defaults.items():
        os.environ.setdefault(name, value)
    backend = None if args.endpoint_url else start_backend(args.backend)
    endpoint = args.endpoint_url or (backend.endpoint_url if backend else "")
    try:
        result = asyncio.run(measure(endpoint, args))
    finally:
        if backend is not None:
            backend.stop()
    print(json.dumps({"backend": args.backend, **result}, indent=2))


if __name__ == "__main__":
    main()
