"""Metrics: an Observer that aggregates the worker's events and publishes them to CloudWatch.

Two sinks share one aggregation (:class:`MetricBuffer`):

- ``emf`` (default): CloudWatch Embedded Metric Format documents, one JSON object per line on stdout.
  CloudWatch Logs turns them into metrics; no API calls, no credentials needed for metrics.
- ``cloudwatch``: batched ``PutMetricData`` from a background thread, for setups without CloudWatch Logs.

Values are buffered and flushed about every ``flush_interval_s`` seconds, when a value list reaches
:data:`MAX_VALUES_PER_METRIC`, and at shutdown (``flush()`` / ``close()``), not one line per job.

Names and dimensions are a public contract (alarms and dashboards depend on them)::

    per job type, dimension sets [Queue] and [Queue, JobType]:
        JobsProcessed, JobsSucceeded, JobsRetried, JobsDeadLettered (Count), HeartbeatExtensions,
        DuplicatesSkipped (Count), JobDuration, QueueWait (Milliseconds), Attempts (Count)
    per category, dimension set [Queue, Category]:  JobsDeadLettered (Count)
    per worker, dimension set [Queue]:              InFlight, FreeSlots, StuckThreads (Count, one sample a second)
    per breaker state, dimension set [Queue, BreakerState]: BreakerTransitions (Count; closed, open, half_open)
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TextIO

from worker.observability.events import Event, Kind
from worker.settings import WorkerSettings

log = logging.getLogger("worker.metrics")

# Metric names (fixed: Terraform alarms and dashboards use them).
JOBS_PROCESSED = "JobsProcessed"
JOBS_SUCCEEDED = "JobsSucceeded"
JOBS_RETRIED = "JobsRetried"
JOBS_DEAD_LETTERED = "JobsDeadLettered"
JOB_DURATION = "JobDuration"
QUEUE_WAIT = "QueueWait"
ATTEMPTS = "Attempts"
HEARTBEAT_EXTENSIONS = "HeartbeatExtensions"
DUPLICATES_SKIPPED = "DuplicatesSkipped"
IN_FLIGHT = "InFlight"
FREE_SLOTS = "FreeSlots"
STUCK_THREADS = "StuckThreads"
BREAKER_TRANSITIONS = "BreakerTransitions"

JOB_COUNTERS = (
    JOBS_PROCESSED,
    JOBS_SUCCEEDED,
    JOBS_RETRIED,
    JOBS_DEAD_LETTERED,
    HEARTBEAT_EXTENSIONS,
    DUPLICATES_SKIPPED,
)
JOB_DISTRIBUTIONS = (JOB_DURATION, QUEUE_WAIT, ATTEMPTS)
WORKER_GAUGES = (IN_FLIGHT, FREE_SLOTS, STUCK_THREADS)
UNITS = {JOB_DURATION: "Milliseconds", QUEUE_WAIT: "Milliseconds"}  # everything else: Count

# Dimension names and sets.
QUEUE = "Queue"
JOB_TYPE = "JobType"
CATEGORY = "Category"
BREAKER_STATE = "BreakerState"
JOB_DIMENSIONS = [[QUEUE], [QUEUE, JOB_TYPE]]
CATEGORY_DIMENSIONS = [[QUEUE, CATEGORY]]
WORKER_DIMENSIONS = [[QUEUE]]
BREAKER_DIMENSIONS = [[QUEUE, BREAKER_STATE]]

#: EMF limits (CloudWatch embedded metric format specification): 100 metric definitions per directive,
#: 100 values per metric array, 30 dimension keys per dimension set.
MAX_METRICS_PER_DIRECTIVE = 100
MAX_VALUES_PER_METRIC = 100
MAX_DIMENSIONS_PER_SET = 30
#: PutMetricData: 1,000 metric data per request, 150 distinct values per datum (Values/Counts).
MAX_DATA_PER_PUT = 1000
MAX_VALUES_PER_DATUM = 150

#: Job types beyond this many distinct ones are counted as OTHER_JOB_TYPE (a bound on metric cardinality:
#: an unknown_type message carries whatever type a producer wrote).
MAX_JOB_TYPES = 100
OTHER_JOB_TYPE = "_other"
NO_JOB_TYPE = "_none"

DEFAULT_FLUSH_INTERVAL_S = 60.0


@dataclass
class JobStats:
    counters: Counter[str] = field(default_factory=Counter)
    values: dict[str, list[float]] = field(default_factory=lambda: {name: [] for name in JOB_DISTRIBUTIONS})


@dataclass
class Snapshot:
    """What a buffer held between two flushes."""

    jobs: dict[str, JobStats] = field(default_factory=dict)
    dead_letters_by_category: Counter[str] = field(default_factory=Counter)
    gauges: dict[str, list[float]] = field(default_factory=lambda: {name: [] for name in WORKER_GAUGES})
    breaker_transitions: Counter[str] = field(default_factory=Counter)  # by the state entered

    def is_empty(self) -> bool:
        return (
            not self.jobs
            and not self.dead_letters_by_category
            and not any(self.gauges.values())
            and not self.breaker_transitions
        )


class JobTypeNames:
    """The job type an event is counted under: its own for the first ``limit`` distinct types, then
    :data:`OTHER_JOB_TYPE` (a bound on metric cardinality shared by every sink)."""

    def __init__(self, *, limit: int = MAX_JOB_TYPES) -> None:
        self.limit = limit
        self._known: set[str] = set()

    def of(self, event: Event) -> str:
        name = event.job_type or NO_JOB_TYPE
        if name in self._known:
            return name
        if len(self._known) >= self.limit:
            return OTHER_JOB_TYPE
        self._known.add(name)
        return name


class MetricBuffer:
    """Aggregates events into counters and value lists (pure; not thread-safe on its own)."""

    def __init__(self, *, max_job_types: int = MAX_JOB_TYPES) -> None:
        self.max_job_types = max_job_types
        self._snapshot = Snapshot()
        self._job_types = JobTypeNames(limit=max_job_types)

    def _job_type(self, event: Event) -> str:
        return self._job_types.of(event)

    def _stats(self, job_type: str) -> JobStats:
        stats = self._snapshot.jobs.get(job_type)
        if stats is None:
            stats = self._snapshot.jobs[job_type] = JobStats()
        return stats

    def record(self, event: Event) -> None:
        kind = event.kind
        if kind in (Kind.RECEIVED, Kind.RELEASED, Kind.CLAIM_LOST):
            return
        if kind is Kind.BREAKER_CHANGED:
            self._snapshot.breaker_transitions[event.extra.get("state", "unknown")] += 1
            return
        stats = self._stats(self._job_type(event))
        if kind is Kind.STARTED:
            if event.queue_wait_s is not None:
                stats.values[QUEUE_WAIT].append(max(0.0, event.queue_wait_s * 1000.0))
            return
        if kind is Kind.HEARTBEAT:
            stats.counters[HEARTBEAT_EXTENSIONS] += 1
            return
        if kind is Kind.DUPLICATE_SKIPPED:
            stats.counters[DUPLICATES_SKIPPED] += 1
            return
        # A finished attempt: succeeded, retry scheduled or dead-lettered.
        stats.counters[JOBS_PROCESSED] += 1
        if kind is Kind.SUCCEEDED:
            stats.counters[JOBS_SUCCEEDED] += 1
        elif kind is Kind.RETRY_SCHEDULED:
            stats.counters[JOBS_RETRIED] += 1
        elif kind is Kind.DEAD_LETTERED:
            stats.counters[JOBS_DEAD_LETTERED] += 1
            self._snapshot.dead_letters_by_category[event.category or "unknown"] += 1
        if event.duration_s is not None:
            stats.values[JOB_DURATION].append(max(0.0, event.duration_s * 1000.0))
        if event.attempt > 0 and kind is not Kind.RETRY_SCHEDULED:
            stats.values[ATTEMPTS].append(float(event.attempt))

    def gauge(self, *, in_flight: int, free_slots: int, stuck_threads: int = 0) -> None:
        self._snapshot.gauges[IN_FLIGHT].append(float(in_flight))
        self._snapshot.gauges[FREE_SLOTS].append(float(free_slots))
        self._snapshot.gauges[STUCK_THREADS].append(float(stuck_threads))

    def longest_value_list(self) -> int:
        lengths = [len(v) for stats in self._snapshot.jobs.values() for v in stats.values.values()]
        lengths.extend(len(v) for v in self._snapshot.gauges.values())
        return max(lengths, default=0)

    def drain(self) -> Snapshot:
        snapshot, self._snapshot = self._snapshot, Snapshot()
        return snapshot


def _chunks(values: list[float], size: int) -> list[list[float]]:
    return [values[i : i + size] for i in range(0, len(values), size)] or [[]]


def _number(value: float) -> float | int:
    return int(value) if float(value).is_integer() else round(value, 3)


def _document(
    namespace: str, timestamp_ms: int, dimensions: list[list[str]], members: dict[str, str], metrics: dict[str, Any]
) -> dict[str, Any]:
    definitions = [{"Name": name, "Unit": UNITS.get(name, "Count")} for name in metrics]
    document: dict[str, Any] = {
        "_aws": {
            "Timestamp": timestamp_ms,
            "CloudWatchMetrics": [{"Namespace": namespace, "Dimensions": dimensions, "Metrics": definitions}],
        }
    }
    document.update(members)
    document.update(metrics)
    return document


def emf_documents(snapshot: Snapshot, *, namespace: str, queue: str, timestamp_ms: int) -> list[dict[str, Any]]:
    """The EMF documents of one flush (pure). Value lists longer than 100 are split over several documents."""
    documents: list[dict[str, Any]] = []
    for job_type, stats in sorted(snapshot.jobs.items()):
        members = {QUEUE: queue, JOB_TYPE: job_type}
        chunked = {name: _chunks(values, MAX_VALUES_PER_METRIC) for name, values in stats.values.items() if values}
        rounds = max((len(chunks) for chunks in chunked.values()), default=1)
        for index in range(rounds):
            metrics: dict[str, Any] = {}
            if index == 0:
                metrics.update({name: stats.counters.get(name, 0) for name in JOB_COUNTERS})
            for name, chunks in chunked.items():
                if index < len(chunks):
                    metrics[name] = [_number(v) for v in chunks[index]]
            documents.append(_document(namespace, timestamp_ms, JOB_DIMENSIONS, members, metrics))
    for category, count in sorted(snapshot.dead_letters_by_category.items()):
        documents.append(
            _document(
                namespace,
                timestamp_ms,
                CATEGORY_DIMENSIONS,
                {QUEUE: queue, CATEGORY: category},
                {JOBS_DEAD_LETTERED: count},
            )
        )
    for state, count in sorted(snapshot.breaker_transitions.items()):
        documents.append(
            _document(
                namespace,
                timestamp_ms,
                BREAKER_DIMENSIONS,
                {QUEUE: queue, BREAKER_STATE: state},
                {BREAKER_TRANSITIONS: count},
            )
        )
    gauges = {name: _chunks(values, MAX_VALUES_PER_METRIC) for name, values in snapshot.gauges.items() if values}
    for index in range(max((len(chunks) for chunks in gauges.values()), default=0)):
        metrics = {name: [_number(v) for v in chunks[index]] for name, chunks in gauges.items() if index < len(chunks)}
        documents.append(_document(namespace, timestamp_ms, WORKER_DIMENSIONS, {QUEUE: queue}, metrics))
    return documents


class _Clock(Protocol):
    def __call__(self) -> float: ...


class _BufferedObserver(ABC):
    """Shared plumbing: a locked buffer, flushed by time or size."""

    def __init__(
        self,
        *,
        namespace: str,
        queue: str,
        flush_interval_s: float,
        monotonic: _Clock = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.namespace = namespace
        self.queue = queue
        self._wall_clock = wall_clock
        self.flush_interval_s = flush_interval_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._buffer = MetricBuffer()
        self._last_flush = monotonic()
        self._closed = False

    def emit(self, event: Event) -> None:
        with self._lock:
            self._buffer.record(event)
        self._maybe_flush()

    def gauge(self, *, in_flight: int, free_slots: int, stuck_threads: int = 0) -> None:
        with self._lock:
            self._buffer.gauge(in_flight=in_flight, free_slots=free_slots, stuck_threads=stuck_threads)
        self._maybe_flush()

    def connectivity(self, *, service: str, reachable: bool) -> None:
        return None

    def _due(self) -> bool:
        return (
            self._monotonic() - self._last_flush >= self.flush_interval_s
            or self._buffer.longest_value_list() >= MAX_VALUES_PER_METRIC
        )

    def _maybe_flush(self) -> None:
        if self._due():
            self.flush()

    def _take(self) -> Snapshot:
        with self._lock:
            self._last_flush = self._monotonic()
            return self._buffer.drain()

    @abstractmethod
    def flush(self) -> None:
        """Publish what the buffer holds now."""

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.flush()


class EmfObserver(_BufferedObserver):
    """Writes aggregated EMF documents, one per line, to a stream (stdout)."""

    def __init__(
        self,
        *,
        namespace: str,
        queue: str,
        stream: TextIO,
        flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
        monotonic: _Clock = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(
            namespace=namespace,
            queue=queue,
            flush_interval_s=flush_interval_s,
            monotonic=monotonic,
            wall_clock=wall_clock,
        )
        self.stream = stream

    def flush(self) -> None:
        snapshot = self._take()
        if snapshot.is_empty():
            return
        timestamp_ms = int(self._wall_clock() * 1000)
        lines = [
            json.dumps(doc, separators=(",", ":"))
            for doc in emf_documents(snapshot, namespace=self.namespace, queue=self.queue, timestamp_ms=timestamp_ms)
        ]
        try:
            self.stream.write("\n".join(lines) + "\n")
            self.stream.flush()
        except (OSError, ValueError) as exc:  # a closed stdout must not stop the worker
            log.warning("could not write metrics: %s", exc)


def metric_data(snapshot: Snapshot, *, queue: str, timestamp: float) -> list[dict[str, Any]]:
    """PutMetricData entries for a snapshot (pure): one datum per metric and dimension set.

    Value lists become ``Values``/``Counts`` (at most 150 distinct values per datum).
    """
    data: list[dict[str, Any]] = []

    def add(name: str, dims: dict[str, str], value: int | list[float]) -> None:
        base = {"MetricName": name, "Unit": UNITS.get(name, "Count"), "Timestamp": timestamp}
        dimensions = [{"Name": k, "Value": v} for k, v in dims.items()]
        if isinstance(value, int):
            data.append({**base, "Dimensions": dimensions, "Value": float(value)})
            return
        counted = sorted(Counter(round(v, 3) for v in value).items())
        for start in range(0, len(counted), MAX_VALUES_PER_DATUM):
            part = counted[start : start + MAX_VALUES_PER_DATUM]
            data.append(
                {
                    **base,
                    "Dimensions": dimensions,
                    "Values": [v for v, _ in part],
                    "Counts": [float(c) for _, c in part],
                }
            )

    for job_type, stats in sorted(snapshot.jobs.items()):
        for dims in ({QUEUE: queue}, {QUEUE: queue, JOB_TYPE: job_type}):
            for name in JOB_COUNTERS:
                add(name, dims, stats.counters.get(name, 0))
            for name, values in stats.values.items():
                if values:
                    add(name, dims, values)
    for category, count in sorted(snapshot.dead_letters_by_category.items()):
        add(JOBS_DEAD_LETTERED, {QUEUE: queue, CATEGORY: category}, count)
    for name, values in snapshot.gauges.items():
        if values:
            add(name, {QUEUE: queue}, values)
    for state, count in sorted(snapshot.breaker_transitions.items()):
        add(BREAKER_TRANSITIONS, {QUEUE: queue, BREAKER_STATE: state}, count)
    return data


class CloudWatchPutter(Protocol):
    def put_metric_data(self, **kwargs: Any) -> Any: ...


class CloudWatchObserver(_BufferedObserver):
    """Publishes aggregated metrics with PutMetricData from a background thread (boto3 client, blocking).

    The event loop only appends to the buffer; the thread flushes every ``flush_interval_s`` and at close.
    A failed put is logged and its data dropped (memory stays bounded).
    """

    def __init__(
        self,
        *,
        namespace: str,
        queue: str,
        client: CloudWatchPutter,
        flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
        monotonic: _Clock = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(
            namespace=namespace,
            queue=queue,
            flush_interval_s=flush_interval_s,
            monotonic=monotonic,
            wall_clock=wall_clock,
        )
        self.client = client
        self._flush_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sqs-worker-metrics", daemon=True)
        self._thread.start()

    def _maybe_flush(self) -> None:
        if self._due():
            self._wake.set()  # never call the API on the event loop

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            if not self._stop.is_set():
                self.flush()

    def flush(self) -> None:
        with self._flush_lock:
            snapshot = self._take()
            if snapshot.is_empty():
                return
            data = metric_data(snapshot, queue=self.queue, timestamp=self._wall_clock())
            for start in range(0, len(data), MAX_DATA_PER_PUT):
                try:
                    self.client.put_metric_data(
                        Namespace=self.namespace, MetricData=data[start : start + MAX_DATA_PER_PUT]
                    )
                except Exception as exc:  # metrics must never stop the worker
                    log.warning("PutMetricData failed; %d data dropped: %s", len(data[start:]), exc)
                    return

    def close(self) -> None:
        if self._closed:
            return
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=30)
        super().close()


def build_metrics_observer(
    settings: WorkerSettings,
    queue_name: str,
    *,
    stream: TextIO = sys.stdout,
    cloudwatch_client: CloudWatchPutter | None = None,
    flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
) -> EmfObserver | CloudWatchObserver | None:
    """The metrics observer the settings ask for; None when ``WORKER_METRICS=off``.

    Call ``close()`` on it at shutdown so the last interval's values are written.
    """
    if settings.metrics == "off":
        return None
    if settings.metrics == "cloudwatch":
        if cloudwatch_client is None:
            from worker.backends.aws import sync_client

            # botocore's attempts are the only retry of a put; a put that still fails drops its data (logged)
            cloudwatch_client = sync_client("cloudwatch", connection=settings.aws().client_kwargs())
        return CloudWatchObserver(
            namespace=settings.metrics_namespace,
            queue=queue_name,
            client=cloudwatch_client,
            flush_interval_s=flush_interval_s,
        )
    return EmfObserver(
        namespace=settings.metrics_namespace, queue=queue_name, stream=stream, flush_interval_s=flush_interval_s
    )
