"""A rate limit shared by a fleet: W worker processes, one ``@job(rate_limit=...)`` job type, N preloaded jobs.

    .venv/bin/python benchmarks/rate_limit.py                             # the full run: 3 workers, 60/m, 600 jobs
    .venv/bin/python benchmarks/rate_limit.py --rate 600/m --jobs 600     # scaled to about a minute

Starts LocalStack (or uses ``--endpoint-url``), creates a queue (maxReceiveCount 1000: held-back messages are
received again and SQS counts each receive), its DLQ and a table, preloads the jobs, then runs ``sqs-worker run``
W times as separate processes sharing the table, all through one counting proxy (benchmarks/countproxy.py). Each
job appends its start time to a side file. Prints:

- the most starts in any rolling window of the limit's period (must not exceed the limit's count), and the fewest
  in any window that lies wholly within the saturated run (first start to last start; must be at least 90% of it);
- dead letters (must be 0) and the jobs that ran more than once;
- requests per job: DynamoDB writes (UpdateItem/PutItem/DeleteItem) and reads, SQS requests by action.

Exit status 1 when a bound is broken. Every wait is bounded (``--timeout-s``); workers are stopped in a ``finally``.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import effects  # noqa: E402
from benchmarks.countproxy import CountingProxy  # noqa: E402
from tests.support.backends import Backend, start_localstack  # noqa: E402
from tests.support.harness import sqs_client  # noqa: E402
from tests.support.queues import message_count  # noqa: E402
from worker.flow import parse_rate  # noqa: E402
from worker.ops.bootstrap import ensure_queues  # noqa: E402

SQS_WORKER_BIN = Path(sys.executable).parent / "sqs-worker"
DYNAMODB_WRITES = ("UpdateItem", "PutItem", "DeleteItem")
DYNAMODB_READS = ("GetItem",)
POLL_S = 0.25
STOP_TIMEOUT_S = 30.0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=3, help="worker processes (default 3)")
    parser.add_argument("--rate", default="60/m", help="the job's rate_limit (default 60/m)")
    parser.add_argument("--jobs", type=int, default=600, help="preloaded jobs (default 600)")
    parser.add_argument("--concurrency", type=int, default=10, help="WORKER_CONCURRENCY of each worker (default 10)")
    parser.add_argument("--endpoint-url", default=None, help="a running LocalStack (default: start one)")
    parser.add_argument("--timeout-s", type=float, default=None, help="bound of the drain (default: 2x the ideal)")
    parser.add_argument("--json-out", default=None, help="also write the figures here as JSON")
    return parser.parse_args()


def create_table(endpoint_url: str, name: str) -> None:
    from aiobotocore.session import get_session

    from worker.idempotency import create_table as create

    async def run() -> None:
        async with get_session().create_client("dynamodb", endpoint_url=endpoint_url, region_name="us-east-1") as c:
            await create(c, name)

    asyncio.run(run())


def preload(client: Any, queue_url: str, jobs: int) -> None:
    for start in range(0, jobs, 10):
        entries = [
            {"Id": str(n), "MessageBody": json.dumps({"type": "limited", "payload": {"n": n, "sent_at": time.time()}})}
            for n in range(start, min(jobs, start + 10))
        ]
        client.send_message_batch(QueueUrl=queue_url, Entries=entries)


def start_workers(args: argparse.Namespace, proxy_url: str, queue_url: str, table: str, workdir: Path) -> list[Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_ENDPOINT_URL")}
    env.update(
        {
            "PYTHONPATH": str(ROOT),
            "AWS_ENDPOINT_URL": proxy_url,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "BENCH_RATE": args.rate,
            effects.EFFECTS_ENV: str(workdir / "starts"),
            "WORKER_QUEUE": queue_url,
            "WORKER_HANDLERS": "benchmarks.limited_handlers",
            "WORKER_IDEMPOTENCY_TABLE": table,
            "WORKER_CONCURRENCY": str(args.concurrency),
            "WORKER_METRICS": "off",
            "WORKER_LOG_LEVEL": "WARNING",
        }
    )
    processes = []
    for index in range(args.workers):
        log = (workdir / f"worker-{index}.log").open("wb")
        processes.append(
            subprocess.Popen(  # noqa: S603 - our own console script, arguments fixed
                [str(SQS_WORKER_BIN), "run"],
                env={**env, "WORKER_HEALTH_FILE": str(workdir / f"health-{index}")},
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    return processes


def stop_workers(processes: list[Any]) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def depth(client: Any, queue_url: str) -> int:
    names = [
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
        "ApproximateNumberOfMessagesDelayed",
    ]
    attributes = client.get_queue_attributes(QueueUrl=queue_url, AttributeNames=names)["Attributes"]
    return sum(int(attributes.get(name, 0)) for name in names)


def wait_done(
    client: Any, queue_url: str, starts_file: Path, jobs: int, processes: list[Any], timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for process in processes:
            if process.poll() is not None:
                raise RuntimeError(f"a worker exited with {process.returncode}")
        if effects.count(starts_file) >= jobs and message_count(client, queue_url) == 0:
            return
        time.sleep(POLL_S)  # polling other processes' progress: nothing to await here
    raise TimeoutError(f"{effects.count(starts_file)}/{jobs} jobs within {timeout_s:.0f} s")


def window_counts(starts: list[float], period_s: float) -> tuple[int, int]:
    """The most starts in any window [s, s + period) and the fewest in any window (s, s + period] that ends by the
    last start (a window wholly within the saturated run)."""
    ordered = sorted(starts)
    most = max(bisect.bisect_left(ordered, s + period_s) - i for i, s in enumerate(ordered))
    fewest = [
        bisect.bisect_right(ordered, s + period_s) - (i + 1)
        for i, s in enumerate(ordered)
        if s + period_s <= ordered[-1]
    ]
    return most, min(fewest, default=-1)


def main() -> int:
    args = parse_args()
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        os.environ.setdefault(name, value)  # a local endpoint: dummy credentials
    rate = parse_rate(args.rate)
    ideal_s = args.jobs / rate.count * rate.period_s
    timeout_s = args.timeout_s or 2 * ideal_s + 60
    backend: Backend | None = None
    proxy: CountingProxy | None = None
    processes: list[Any] = []
    with tempfile.TemporaryDirectory(prefix="rate-limit-") as tmp:
        workdir = Path(tmp)
        try:
            if args.endpoint_url:
                endpoint_url = args.endpoint_url
            else:
                backend = start_localstack()
                endpoint_url = backend.endpoint_url
            client = sqs_client(endpoint_url)
            name = f"rl-{uuid.uuid4().hex[:8]}"
            created = ensure_queues(client, name, max_receive_count=1000)
            table = f"rl-{uuid.uuid4().hex[:8]}"
            create_table(endpoint_url, table)
            preload(client, created.queue_url, args.jobs)
            proxy = CountingProxy(endpoint_url)
            proxy.start()
            started = time.monotonic()
            processes = start_workers(args, proxy.endpoint_url, created.queue_url, table, workdir)
            wait_done(client, created.queue_url, workdir / "starts", args.jobs, processes, timeout_s)
            drain_s = time.monotonic() - started
            stop_workers(processes)
            tally = proxy.snapshot()
            dead_letters = message_count(client, created.dlq_url)
        finally:
            stop_workers(processes)
            if proxy is not None:
                proxy.stop()
            if backend is not None:
                backend.stop()
        rows = effects.read(workdir / "starts")
    starts = [started_at for _, started_at in rows]
    most, fewest = window_counts(starts, rate.period_s)
    counts: Counter[str] = tally.counts
    figures = {
        "workers": args.workers,
        "rate": args.rate,
        "jobs": args.jobs,
        "concurrency": args.concurrency,
        "runs": len(starts),
        "drain_s": round(drain_s, 1),
        "span_of_starts_s": round(max(starts) - min(starts), 1),
        "most_starts_in_a_window": most,
        "fewest_starts_in_a_saturated_window": fewest,
        "limit": rate.count,
        "window_s": rate.period_s,
        "dead_letters": dead_letters,
        "dynamodb_writes_per_job": round(sum(counts[a] for a in DYNAMODB_WRITES) / args.jobs, 3),
        "dynamodb_reads_per_job": round(sum(counts[a] for a in DYNAMODB_READS) / args.jobs, 3),
        "requests": dict(sorted(counts.items())),
        "sqs_requests_per_job": round(
            sum(n for a, n in counts.items() if a not in DYNAMODB_WRITES + DYNAMODB_READS) / args.jobs, 3
        ),
    }
    print(json.dumps(figures, indent=2))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    ok = most <= rate.count and fewest >= 0.9 * rate.count and dead_letters == 0 and len(starts) >= args.jobs
    print("bounds:", "held" if ok else "BROKEN", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
