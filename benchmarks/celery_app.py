"""The Celery side of benchmarks/compare_celery.py: one no-op task on one SQS queue. Runs in .tools/celery-venv.

Worker:   celery -A benchmarks.celery_app worker --pool=threads --concurrency=20 ...  (compare_celery.py starts it)
Producer: python benchmarks/celery_app.py send --jobs N [--rate-per-s R]   (sends with apply_async, one
          SendMessage each, to the endpoint in BENCH_SEND_BROKER_URL; the worker reads BENCH_BROKER_URL)

Configuration comes from the environment compare_celery.py sets: BENCH_BROKER_URL ("sqs://key:secret@host:port",
plain http: kombu builds the boto3 endpoint_url from the URL's host and port and ``is_secure``), BENCH_QUEUE_NAME
and BENCH_QUEUE_URL (a predefined queue: Celery neither lists nor creates queues), AWS_REGION, BENCH_EFFECTS_FILE.

Settings chosen to match sqs-worker's semantics, not to tune Celery:
- task_acks_late=True: the SQS message is deleted after the task returns (sqs-worker deletes after success);
  Celery's default would delete it before running the task.
- worker_prefetch_multiplier=1: at most ``concurrency`` unacknowledged messages held by the worker, the same bound
  as sqs-worker (which receives only for free slots). Celery's default (4) would hold 4x concurrency; the
  benchmark can pass --celery-prefetch-multiplier to try it.
- kombu's SQS defaults otherwise: wait_time_seconds=10 (long polling), polling_interval=1 s after an empty
  receive, one DeleteMessage per acknowledged message (kombu does not batch deletes).
- visibility_timeout=60 (the queue's own is 60 too); no result backend (task_ignore_result); no remote control,
  gossip, mingle or heartbeat (pidbox needs broadcast queues the benchmark does not predefine).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from celery import Celery

if __package__ in (None, ""):  # run as a script: make `benchmarks.effects` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.effects import record

QUEUE_NAME = os.environ.get("BENCH_QUEUE_NAME", "bench-celery")
QUEUE_URL = os.environ.get("BENCH_QUEUE_URL", "")
REGION = os.environ.get("AWS_REGION", "us-east-1")

app = Celery("bench")
app.conf.update(
    broker_url=os.environ.get("BENCH_BROKER_URL", "sqs://bench:bench@127.0.0.1:4566"),
    broker_transport_options={
        "region": REGION,
        "is_secure": False,
        "visibility_timeout": 60,
        "predefined_queues": {QUEUE_NAME: {"url": QUEUE_URL}},
    },
    broker_connection_retry_on_startup=True,
    task_default_queue=QUEUE_NAME,
    task_create_missing_queues=False,
    task_acks_late=True,
    task_ignore_result=True,
    worker_prefetch_multiplier=int(os.environ.get("BENCH_PREFETCH_MULTIPLIER", "1")),
    worker_enable_remote_control=False,
    worker_hijack_root_logger=False,
    task_serializer="json",
    accept_content=["json"],
)


@app.task(name="bench.noop")
def noop(n: int, sent_at: float) -> None:
    """The no-op job: record the start in the side channel, as benchmarks/noop_handlers.py does."""
    del n
    record(sent_at)


def send(jobs: int, rate_per_s: float) -> None:
    """Send ``jobs`` tasks one apply_async each (Celery publishes one SendMessage per task), optionally paced."""
    send_url = os.environ.get("BENCH_SEND_BROKER_URL")
    if send_url:
        app.conf.broker_url = send_url
    interval_s = 1.0 / rate_per_s if rate_per_s > 0 else 0.0
    started = time.monotonic()
    with app.producer_or_acquire() as producer:
        for n in range(jobs):
            if interval_s:
                pause_s = started + n * interval_s - time.monotonic()
                if pause_s > 0:
                    time.sleep(pause_s)  # pacing a producer: there is no event to await
            noop.apply_async(args=(n, time.time()), producer=producer)


def main() -> int:
    parser = argparse.ArgumentParser(description="send benchmark tasks to the Celery SQS queue")
    sub = parser.add_subparsers(dest="command", required=True)
    sender = sub.add_parser("send")
    sender.add_argument("--jobs", type=int, required=True)
    sender.add_argument("--rate-per-s", type=float, default=0.0, help="pace the sends (0: as fast as possible)")
    args = parser.parse_args()
    send(args.jobs, args.rate_per_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
