"""The floor: a plain boto3 loop (receive 10, run, delete batch), as a worker process for compare_celery.py.

    AWS_ENDPOINT_URL=... BENCH_QUEUE_URL=... BENCH_EFFECTS_FILE=... python benchmarks/rawloop.py --threads 4

Each thread: ReceiveMessage (10, long poll 20 s) -> for each message json.loads the body and record the job in the
side channel (benchmarks/effects.py, the same call the other sides make) -> DeleteMessageBatch of what it got.
No retries, no heartbeats, no idempotency, no logging: the least any SQS consumer must do. SIGTERM ends it (the
threads are daemons; a receive in flight is abandoned, as a benchmark may).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import boto3

from benchmarks.effects import record


def consume(client: Any, queue_url: str, stop: threading.Event) -> None:
    while not stop.is_set():
        response = client.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=20)
        messages = response.get("Messages", [])
        if not messages:
            continue
        for message in messages:
            record(float(json.loads(message["Body"])["payload"]["sent_at"]))
        entries = [{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)]
        client.delete_message_batch(QueueUrl=queue_url, Entries=entries)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    queue_url = os.environ["BENCH_QUEUE_URL"]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    session = boto3.session.Session(region_name=os.environ.get("AWS_DEFAULT_REGION") or os.environ["AWS_REGION"])
    threads = []
    for n in range(args.threads):
        client = session.client("sqs")  # one client per thread (botocore clients are thread-safe; this avoids locks)
        thread = threading.Thread(target=consume, args=(client, queue_url, stop), name=f"raw-{n}", daemon=True)
        thread.start()
        threads.append(thread)
    stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
