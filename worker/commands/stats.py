"""``sqs-worker stats [--watch] [--interval-s N] [--json] [--queue NAME]``: depth of the queue and of its
dead-letter queue (with WORKER_QUEUES: of each queue of the set and its own DLQ, or of the one --queue names).

Visible, in flight and delayed come from SQS (approximate, as SQS reports them). The oldest message's age
comes from CloudWatch (``AWS/SQS ApproximateAgeOfOldestMessage``) and shows ``n/a`` where CloudWatch has no
recent datapoint (a new or idle queue, a local emulator, no cloudwatch:GetMetricStatistics permission).
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from typing import Any

from worker.backends.aws import resolve_queue_url_sync, sync_client
from worker.commands import plain_help
from worker.commands.selection import add_queue_option, selected_queues
from worker.errors import ConfigError
from worker.ops.dlq import resolve_dlq_url
from worker.ops.stats import MetricStatistics, format_stats, queue_stats, stats_json
from worker.settings import load_settings


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "stats",
        help="messages visible, in flight, delayed and oldest age, for the queue and its DLQ",
        description=plain_help(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--watch", action="store_true", help="repeat until interrupted")
    parser.add_argument("--interval-s", type=float, default=5.0, help="seconds between refreshes (default 5)")
    parser.add_argument("--json", action="store_true", help="one JSON object per refresh")
    add_queue_option(parser, "every queue of the set")
    parser.add_argument("--count", type=int, default=None, help=argparse.SUPPRESS)  # refreshes, for tests
    parser.set_defaults(func=run)


def _cloudwatch() -> MetricStatistics:
    client: MetricStatistics = sync_client("cloudwatch", read_timeout_s=10)
    return client


def run(args: argparse.Namespace) -> int:
    if args.interval_s <= 0:
        raise ConfigError("--interval-s must be > 0")
    settings = load_settings()
    sqs = sync_client("sqs")
    cloudwatch = _cloudwatch()
    pairs = []
    for queue in selected_queues(settings, args.queue):
        queue_url = resolve_queue_url_sync(sqs, queue)
        pairs.append((queue_url, resolve_dlq_url(sqs, queue_url, settings.dead_letter_queue)))
    refreshes = args.count if args.count is not None else (None if args.watch else 1)
    done = 0
    while refreshes is None or done < refreshes:
        if done:
            time.sleep(args.interval_s)
        now = datetime.now(UTC)
        rows = [
            queue_stats(sqs, url, role=role, cloudwatch=cloudwatch, now=now)
            for queue_url, dlq_url in pairs
            for url, role in ((queue_url, "queue"), (dlq_url, "dlq"))
        ]
        if args.json:
            print(stats_json(rows, at=now))
        else:
            if args.watch and sys.stdout.isatty():
                print("\x1b[2J\x1b[H", end="")  # clear the screen between refreshes
            print(now.isoformat(timespec="seconds"))
            print(format_stats(rows))
        sys.stdout.flush()
        done += 1
    return 0
