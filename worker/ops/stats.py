"""Queue statistics for ``sqs-worker stats``: visible, in flight, delayed and the oldest message's age.

SQS's API has no "age of the oldest message"; CloudWatch's ``AWS/SQS`` metric ``ApproximateAgeOfOldestMessage``
has it (published every minute for active queues). It is read with GetMetricStatistics; where CloudWatch has
no datapoint (a new or idle queue, a local emulator, no permission) the age is ``None`` and shown as ``n/a``.
Peeking at messages would change their receive counts, so it is never done.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from botocore.exceptions import BotoCoreError, ClientError

from worker.names import queue_name_of
from worker.ops.dlq import queue_attributes

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

#: How far back to look for the latest ApproximateAgeOfOldestMessage datapoint.
AGE_LOOKBACK_S = 900


class MetricStatistics(Protocol):
    def get_metric_statistics(self, **kwargs: Any) -> Any: ...


@dataclass(frozen=True)
class QueueStats:
    role: str  # "queue" or "dlq"
    name: str
    visible: int
    in_flight: int
    delayed: int
    oldest_age_s: float | None


def oldest_age_s(cloudwatch: MetricStatistics | None, queue_name: str, *, now: datetime) -> float | None:
    """The latest ApproximateAgeOfOldestMessage (Maximum, 1-minute periods) in the last 15 minutes, or None."""
    if cloudwatch is None:
        return None
    try:
        response = cloudwatch.get_metric_statistics(
            Namespace="AWS/SQS",
            MetricName="ApproximateAgeOfOldestMessage",
            Dimensions=[{"Name": "QueueName", "Value": queue_name}],
            StartTime=now - timedelta(seconds=AGE_LOOKBACK_S),
            EndTime=now,
            Period=60,
            Statistics=["Maximum"],
        )
    except (BotoCoreError, ClientError):
        return None
    points = [p for p in response.get("Datapoints", []) if "Maximum" in p and "Timestamp" in p]
    if not points:
        return None
    latest = max(points, key=lambda p: p["Timestamp"])
    return float(latest["Maximum"])


def queue_stats(
    sqs: SQSClient, url: str, *, role: str, cloudwatch: MetricStatistics | None, now: datetime | None = None
) -> QueueStats:
    attrs = queue_attributes(
        sqs,
        url,
        [
            "ApproximateNumberOfMessages",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed",
        ],
    )
    name = queue_name_of(url)
    return QueueStats(
        role=role,
        name=name,
        visible=int(attrs.get("ApproximateNumberOfMessages", 0)),
        in_flight=int(attrs.get("ApproximateNumberOfMessagesNotVisible", 0)),
        delayed=int(attrs.get("ApproximateNumberOfMessagesDelayed", 0)),
        oldest_age_s=oldest_age_s(cloudwatch, name, now=now or datetime.now(UTC)),
    )


def format_age(age_s: float | None) -> str:
    """``n/a``, ``42s``, ``12m05s``, ``3h02m``, ``2d04h`` (pure)."""
    if age_s is None:
        return "n/a"
    seconds = int(age_s)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def format_stats(rows: Sequence[QueueStats]) -> str:
    """A table for a terminal (pure)."""
    width = max([len(r.name) for r in rows] + [5])
    lines = [f"{'':<5} {'QUEUE':<{width}} {'VISIBLE':>9} {'IN FLIGHT':>9} {'DELAYED':>9} {'OLDEST':>8}"]
    for r in rows:
        lines.append(
            f"{r.role:<5} {r.name:<{width}} {r.visible:>9} {r.in_flight:>9} {r.delayed:>9} "
            f"{format_age(r.oldest_age_s):>8}"
        )
    return "\n".join(lines)


def stats_json(rows: Sequence[QueueStats], *, at: datetime) -> str:
    return json.dumps(
        {
            "at": at.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
            "queues": [asdict(r) for r in rows],
        }
    )
