"""What the dashboard reads and does, through blocking boto3 clients (the app runs these in threads).

It covers every configured queue (WORKER_QUEUES, else WORKER_QUEUE) and each one's own DLQ (its redrive
target, else ``<queue>-dlq``, as the ``dlq`` commands resolve it): a dead letter goes back to the queue whose
DLQ it was read from.

The queue counts come from ``worker.ops.stats``, the dead letters and their actions from ``worker.ops.dlq``
(the same code as the ``dlq`` commands: send before delete, snapshot-bounded redrive, audited requeue), the job
records from the ledger table: one GetItem by key, and Queries of its status index for the recent failed and
in-progress jobs, the live workers and the audit trail (never a Scan).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from worker.backends.aws import resolve_queue_url_sync, sync_client, translate
from worker.errors import ConfigError, LedgerUnavailable
from worker.idempotency import Record, parse_record, storage_key
from worker.idempotency.dynamodb import STATUS_INDEX, decode_item
from worker.idempotency.keys import is_worker_item
from worker.names import queue_name_of
from worker.observability.metrics import JOBS_DEAD_LETTERED, JOBS_RETRIED, JOBS_SUCCEEDED, QUEUE
from worker.ops.dlq import DeadLetterQueue, MoveResult, now_utc, redrive, requeue, resolve_dlq_url
from worker.ops.dlq_records import DeadLetter
from worker.ops.stats import QueueStats, queue_stats
from worker.runtime.presence import PRESENCE_STALE_S, PRESENCE_STATUS
from worker.settings import WorkerSettings
from worker.workflows.model import WorkflowStatus, final_key, lookup_key, read_status
from worker.workflows.store import decode as decode_workflow_item

AUDIT_STATUS = "AUDIT"
AUDIT_PREFIX = "sqs-worker#audit#"
AUDIT_TTL_S = 90 * 86400
#: How many dead letters a page reads (each read adds one to their receive count; they are released at once).
READ_LIMIT = 500
SERIES = {"succeeded": JOBS_SUCCEEDED, "retried": JOBS_RETRIED, "dead_lettered": JOBS_DEAD_LETTERED}


#: CloudWatch's datapoints are per minute: the dashboard asks again at most this often (each ask costs money).
METRICS_CACHE_S = 60.0


class CachedStatistics:
    """GetMetricStatistics answers kept METRICS_CACHE_S per metric and dimensions (``ops.stats`` asks per refresh)."""

    def __init__(self, cloudwatch: Any, *, clock: Any = time.monotonic) -> None:
        self._cloudwatch = cloudwatch
        self._clock = clock
        self._answers: dict[str, tuple[float, Any]] = {}

    def get_metric_statistics(self, **kwargs: Any) -> Any:
        key = json.dumps([kwargs.get("MetricName"), kwargs.get("Dimensions")], sort_keys=True)
        cached = self._answers.get(key)
        if cached is not None and self._clock() - cached[0] < METRICS_CACHE_S:
            return cached[1]
        answer = self._cloudwatch.get_metric_statistics(**kwargs)
        self._answers[key] = (self._clock(), answer)
        return answer


@dataclass(frozen=True)
class Lane:
    """One configured queue and its DLQ."""

    name: str
    queue_url: str
    dlq_url: str

    @property
    def dlq_name(self) -> str:
        return queue_name_of(self.dlq_url)


@dataclass(frozen=True)
class QueuedLetter:
    """A dead letter and the configured queue whose DLQ it was read from (where a requeue sends it)."""

    queue: str
    letter: DeadLetter


@dataclass(frozen=True)
class AuditEntry:
    at: str
    who: str
    action: str
    why: str
    count: int
    detail: str


@dataclass(frozen=True)
class WorkerInfo:
    owner: str
    queue: str
    host: str
    concurrency: int
    busy: int
    counts: dict[str, int]
    seen_s_ago: float


def counts_of(workers: Iterable[WorkerInfo], queue_names: Iterable[str]) -> dict[str, dict[str, int]]:
    """The job counts of the workers that consume one of ``queue_names`` (a worker of a queue set reports its
    first queue), by worker: the overview charts these queues, not every worker sharing the table."""
    names = set(queue_names)
    return {w.owner: w.counts for w in workers if queue_name_of(w.queue) in names}


class Sources:
    """The dashboard's reads and actions for the configured queues, their DLQs and (when set) the ledger table.

    ``queue_url``, ``dlq_url`` and ``queue_name`` are the first queue's: "fire now" sends there, and the worker
    publishes its metrics under that name for the whole set."""

    def __init__(self, settings: WorkerSettings) -> None:
        connection = settings.aws().client_kwargs()
        self.settings = settings
        self.sqs = sync_client("sqs", connection=connection)
        self.cloudwatch = sync_client("cloudwatch", connection=connection)
        self.dynamodb = sync_client("dynamodb", connection=connection) if settings.idempotency_table else None
        self.table = settings.idempotency_table
        self.lanes: list[Lane] = []
        for spec in settings.queue_set():
            queue_url = resolve_queue_url_sync(self.sqs, spec.queue)
            dlq_url = resolve_dlq_url(self.sqs, queue_url, settings.dead_letter_queue)
            self.lanes.append(Lane(queue_name_of(queue_url), queue_url, dlq_url))
        self.queue_url = self.lanes[0].queue_url
        self.dlq_url = self.lanes[0].dlq_url
        self.queue_name = self.lanes[0].name
        self._memory_audit: list[AuditEntry] = []
        self._statistics = CachedStatistics(self.cloudwatch)
        self._series: tuple[float, dict[str, list[tuple[int, float]]] | None] | None = None

    # -- queues and metrics

    @property
    def queue_names(self) -> list[str]:
        return [lane.name for lane in self.lanes]

    def lane(self, name: str | None) -> Lane:
        """The lane of queue ``name``; without a name, the only one (an error with several)."""
        if name:
            for lane in self.lanes:
                if name in (lane.name, lane.dlq_name):
                    return lane
            raise ConfigError(f"{name}: not a configured queue ({', '.join(self.queue_names)})")
        if len(self.lanes) > 1:
            raise ConfigError(f"several queues are configured ({', '.join(self.queue_names)}): name one")
        return self.lanes[0]

    def queues(self) -> list[QueueStats]:
        """Each queue, highest priority first, followed by its DLQ."""
        rows = []
        for lane in self.lanes:
            rows.append(queue_stats(self.sqs, lane.queue_url, role="queue", cloudwatch=self._statistics))
            rows.append(queue_stats(self.sqs, lane.dlq_url, role="dlq", cloudwatch=self._statistics))
        return rows

    def published_series(self, *, now: datetime) -> dict[str, list[tuple[int, float]]] | None:
        """Jobs per minute over the last hour from the worker's CloudWatch metrics, or None when none were
        published (WORKER_METRICS=off, an emulator, no permission). Asked at most once per METRICS_CACHE_S."""
        if self._series is not None and time.monotonic() - self._series[0] < METRICS_CACHE_S:
            return self._series[1]
        series = self._published_series(now=now)
        self._series = (time.monotonic(), series)
        return series

    def _published_series(self, *, now: datetime) -> dict[str, list[tuple[int, float]]] | None:
        queries = [
            {
                "Id": f"m{index}",
                "MetricStat": {
                    "Metric": {
                        "Namespace": self.settings.metrics_namespace,
                        "MetricName": metric,
                        "Dimensions": [{"Name": QUEUE, "Value": self.queue_name}],
                    },
                    "Period": 60,
                    "Stat": "Sum",
                },
            }
            for index, metric in enumerate(SERIES.values())
        ]
        try:
            response = self.cloudwatch.get_metric_data(
                MetricDataQueries=queries, StartTime=now - timedelta(hours=1), EndTime=now
            )
        except (BotoCoreError, ClientError):
            return None
        series: dict[str, list[tuple[int, float]]] = {}
        for index, name in enumerate(SERIES):
            results = response.get("MetricDataResults", [])
            result: dict[str, Any] = next((r for r in results if r.get("Id") == f"m{index}"), {})
            points = zip(result.get("Timestamps", []), result.get("Values", []), strict=False)
            series[name] = sorted((int(stamp.timestamp()), float(value)) for stamp, value in points)
        return series if any(series.values()) else None

    # -- dead letters

    def dlq(self, lane: Lane | None = None) -> DeadLetterQueue:
        chosen = lane or self.lanes[0]
        return DeadLetterQueue(self.sqs, dlq_url=chosen.dlq_url, source_url=chosen.queue_url)

    def dead_letters(self, *, limit: int = READ_LIMIT) -> list[QueuedLetter]:
        """Up to ``limit`` dead letters of each queue's DLQ, highest priority first, each with its queue."""
        return [QueuedLetter(lane.name, letter) for lane in self.lanes for letter in self.dlq(lane).read(limit=limit)]

    def dead_letter_total(self) -> int | None:
        """About how many letters the DLQs hold (ApproximateNumberOfMessages summed); None when one is unknown."""
        counts = [self.dlq(lane).approximate_count() for lane in self.lanes]
        return None if any(count is None for count in counts) else sum(c for c in counts if c is not None)

    def find(self, ident: str, *, limit: int = READ_LIMIT) -> QueuedLetter | None:
        for lane in self.lanes:
            letter = self.dlq(lane).find(ident, limit=limit)
            if letter is not None:
                return QueuedLetter(lane.name, letter)
        return None

    def requeue(self, *, ids: Sequence[str], group: tuple[str, str] | None, by: str, reason: str) -> MoveResult:
        """Requeue the dead letters with these ids, or those of one (category, error message) group, from every
        queue's DLQ, each back to its own queue."""
        wanted = set(ids)
        results = []
        for lane in self.lanes:
            dlq = self.dlq(lane)
            with dlq.held(limit=READ_LIMIT) as letters:
                if group is not None:
                    chosen = [letter for letter in letters if (letter.category, letter.error_message) == group]
                else:
                    chosen = [letter for letter in letters if wanted & {letter.message_id, letter.original_message_id}]
                if chosen:
                    results.append(requeue(dlq, chosen, by=by, reason=reason, at=now_utc()))
        return combined(results, "requeue")

    def redrive_all(self) -> MoveResult:
        """What ``sqs-worker dlq redrive --yes`` does, for each queue's DLQ back to that queue: a move task where
        the endpoint has them, else receive, send, delete; either way only the messages in the DLQ when it starts."""
        return combined([self._redrive(lane) for lane in self.lanes], "nothing to move")

    def _redrive(self, lane: Lane) -> MoveResult:
        dlq = self.dlq(lane)
        return redrive(dlq, dlq.snapshot(), move_task_timeout_s=120)

    def purge(self, lane: Lane) -> int:
        """Purge one queue's DLQ (as ``dlq purge --queue NAME``); returns about how many it held."""
        dlq = self.dlq(lane)
        total = dlq.approximate_count() or 0
        dlq.purge()
        return total

    # -- the ledger

    def job(self, key: str) -> Record | None:
        """The job record of ``key``; None when there is none (or the key names no job: one of the worker's own
        items, or an item something else wrote)."""
        if self.dynamodb is None or is_worker_item(storage_key(key)):
            return None
        try:
            item = decode_item(self._get_item(storage_key(key)))
            return parse_record(item) if item else None
        except ValueError:
            return None

    def workflow(self, workflow_id: str) -> WorkflowStatus | None:
        """The status of the workflow ``workflow_id`` (or ``workflow:<id>``), as ``sqs-worker status`` shows it;
        None when there is none."""
        if self.dynamodb is None:
            return None
        item = decode_workflow_item(self._get_item(lookup_key(workflow_id)))
        last = final_key(item) if item is not None else None
        if item is None or last is None:
            return None
        final = self.job(last)
        return read_status(item, final=final.to_json(int(time.time() * 1000)) if final else None)

    def _get_item(self, key: str) -> dict[str, Any] | None:
        """The table's item of ``key`` as DynamoDB answers it (typed values); one consistent read."""
        assert self.dynamodb is not None
        try:
            response = self.dynamodb.get_item(TableName=self.table, Key={"key": {"S": key}}, ConsistentRead=True)
        except (BotoCoreError, ClientError) as exc:
            raise self._unavailable("GetItem", exc) from exc
        item: dict[str, Any] | None = response.get("Item")
        return item

    def _by_status(self, status: str, *, limit: int, since_ms: int = 0) -> list[dict[str, object]]:
        if self.dynamodb is None:
            return []
        try:
            response = self.dynamodb.query(
                TableName=self.table,
                IndexName=STATUS_INDEX,
                KeyConditionExpression="#s = :s AND #u >= :since",
                ExpressionAttributeNames={"#s": "status", "#u": "updated_at"},
                ExpressionAttributeValues={":s": {"S": status}, ":since": {"N": str(since_ms)}},
                ScanIndexForward=False,
                Limit=limit,
            )
        except (BotoCoreError, ClientError) as exc:
            raise self._unavailable("Query", exc) from exc
        return [item for item in (decode_item(raw) for raw in response.get("Items", [])) if item]

    def recent_jobs(self, status: str, *, limit: int = 20) -> list[Record]:
        return [parse_record(item) for item in self._by_status(status, limit=limit)]

    def workers(self) -> list[WorkerInfo]:
        now_ms = int(time.time() * 1000)
        found = []
        for item in self._by_status(PRESENCE_STATUS, limit=100, since_ms=now_ms - int(PRESENCE_STALE_S * 1000)):
            try:
                detail = json.loads(str(item.get("detail") or "{}"))
            except ValueError:
                continue
            updated = item.get("updated_at")
            found.append(
                WorkerInfo(
                    owner=str(detail.get("owner", "?")),
                    queue=str(detail.get("queue", "?")),
                    host=str(detail.get("host", "?")),
                    concurrency=int(detail.get("concurrency", 0)),
                    busy=int(detail.get("busy", 0)),
                    counts={str(k): int(v) for k, v in dict(detail.get("counts", {})).items()},
                    seen_s_ago=max(0.0, (now_ms - int(updated)) / 1000) if isinstance(updated, int) else 0.0,
                )
            )
        return found

    # -- the audit trail

    def record_audit(self, *, who: str, action: str, why: str, count: int, detail: str) -> AuditEntry:
        """Keep one action in the audit trail: in the ledger table when configured (90 days), else in memory."""
        now = datetime.now(UTC)
        entry = AuditEntry(now.isoformat(timespec="seconds").replace("+00:00", "Z"), who, action, why, count, detail)
        if self.dynamodb is None:
            self._memory_audit.append(entry)
            return entry
        body = json.dumps(entry.__dict__, separators=(",", ":"))
        try:
            self.dynamodb.put_item(
                TableName=self.table,
                Item={
                    "key": {"S": f"{AUDIT_PREFIX}{int(now.timestamp() * 1000)}#{uuid.uuid4().hex[:8]}"},
                    "status": {"S": AUDIT_STATUS},
                    "updated_at": {"N": str(int(now.timestamp() * 1000))},
                    "expiration": {"N": str(int(now.timestamp()) + AUDIT_TTL_S)},
                    "detail": {"S": body},
                },
            )
        except (BotoCoreError, ClientError) as exc:
            self._memory_audit.append(entry)  # kept here at least; the log line has it too
            raise self._unavailable("PutItem", exc) from exc
        return entry

    def audit_trail(self, *, limit: int = 50) -> list[AuditEntry]:
        entries = list(reversed(self._memory_audit))
        for item in self._by_status(AUDIT_STATUS, limit=limit):
            try:
                entries.append(AuditEntry(**json.loads(str(item.get("detail")))))
            except (TypeError, ValueError):
                continue
        return sorted(entries, key=lambda e: e.at, reverse=True)[:limit]

    def _unavailable(self, operation: str, exc: Exception) -> LedgerUnavailable:
        return LedgerUnavailable(str(translate(exc, operation, service="dynamodb", resource=self.table)))


def combined(results: Sequence[MoveResult], nothing: str) -> MoveResult:
    """One result for the moves of several DLQs (their methods joined when they differ)."""
    moved = [result for result in results if result.method != "nothing to move"]
    if not moved:
        return MoveResult(nothing, total=0)
    methods = sorted({result.method for result in moved})
    totals = [result.total for result in results]
    return MoveResult(
        " and ".join(methods),
        moved=sum(result.moved for result in results),
        total=None if any(total is None for total in totals) else sum(t or 0 for t in totals),
        failed=[item for result in results for item in result.failed],
        new_message_ids=[item for result in results for item in result.new_message_ids],
    )


def describe_result(result: MoveResult) -> str:
    text = f"moved {result.moved}" + (f" of {result.total}" if result.total is not None else "")
    text += f" by {result.method}"
    if result.failed:
        text += f"; {len(result.failed)} not moved: " + "; ".join(f"{i}: {why}" for i, why in result.failed[:5])
    return text


def jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
