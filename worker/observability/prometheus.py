"""An optional Prometheus endpoint (``WORKER_PROMETHEUS_PORT``): the worker's events as prometheus-client metrics.

Each :class:`PrometheusObserver` keeps its metrics in a registry of its own (never prometheus-client's global
default one), so several workers or tests in one process do not collide. A scrape renders that registry in the
text exposition format (version 0.0.4) through the health endpoint's small HTTP server (worker/observability/health.py).

Names and labels are a public contract (docs/operations.md). To add a metric: declare it in ``__init__`` with
``registry=self.registry`` and set it in the Observer hook (worker/observability/events.py) that delivers its value;
a gauge also says how a group of processes merges it (``multiprocess_mode``: worker/observability/group_metrics.py).
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from worker.observability.events import Event, Kind
from worker.observability.metrics import MAX_JOB_TYPES, JobTypeNames

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

#: Histogram buckets (upper bounds, seconds). Handler run time up to the default job timeout (900 s); queue wait
#: (sent to started) up to SQS's 12-hour visibility limit, since retries and delays add to it.
JOB_DURATION_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)
QUEUE_WAIT_BUCKETS_S = (0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 14_400, 43_200)

_OUTCOMES = {
    Kind.SUCCEEDED: "succeeded",
    Kind.RETRY_SCHEDULED: "retried",
    Kind.DEAD_LETTERED: "dead_lettered",
    Kind.RELEASED: "released",
    Kind.DUPLICATE_SKIPPED: "duplicate_skipped",
}

_JOB = ("queue", "job_type")


class PrometheusObserver:
    """An Observer that keeps the worker's counters, histograms and gauges and renders them for a scrape."""

    def __init__(self, queue: str, *, max_job_types: int = MAX_JOB_TYPES) -> None:
        self.queue = queue
        self.registry = CollectorRegistry()
        self._job_types = JobTypeNames(limit=max_job_types)
        registry = self.registry
        self.jobs = Counter("sqs_worker_jobs_total", "Jobs by outcome.", [*_JOB, "outcome"], registry=registry)
        self.dead_lettered = Counter(
            "sqs_worker_dead_lettered_total",
            "Jobs the worker dead-lettered, by category.",
            [*_JOB, "category"],
            registry=registry,
        )
        self.heartbeat_extensions = Counter(
            "sqs_worker_heartbeat_extensions_total",
            "Visibility extensions of running jobs.",
            _JOB,
            registry=registry,
        )
        self.job_duration = Histogram(
            "sqs_worker_job_duration_seconds",
            "Handler run time of finished attempts.",
            _JOB,
            buckets=JOB_DURATION_BUCKETS_S,
            registry=registry,
        )
        self.queue_wait = Histogram(
            "sqs_worker_queue_wait_seconds",
            "Time from a job's send to its handler's start.",
            _JOB,
            buckets=QUEUE_WAIT_BUCKETS_S,
            registry=registry,
        )
        self.in_flight = Gauge(
            "sqs_worker_in_flight",
            "Messages the worker holds (running or waiting for a slot).",
            ["queue"],
            registry=registry,
            multiprocess_mode="livesum",
        ).labels(queue)
        self.free_slots = Gauge(
            "sqs_worker_free_slots",
            "Handler slots free for more jobs.",
            ["queue"],
            registry=registry,
            multiprocess_mode="livesum",
        ).labels(queue)
        self.stuck_threads = Gauge(
            "sqs_worker_stuck_threads",
            "Plain def handlers still running in their thread after their job timed out or was stopped.",
            ["queue"],
            registry=registry,
            multiprocess_mode="livesum",
        ).labels(queue)
        self.breaker_transitions = Counter(
            "sqs_worker_breaker_transitions_total",
            "Circuit breaker state changes this worker made, by the state entered (closed, open, half_open).",
            [*_JOB, "state"],
            registry=registry,
        )
        self.endpoint_up = Gauge(
            "sqs_worker_endpoint_up",
            "1 while the endpoint of a service (sqs, dynamodb) is reachable, 0 while not.",
            ["service"],
            registry=registry,
            multiprocess_mode="liveall",
        )

    def emit(self, event: Event) -> None:
        labels = (self.queue, self._job_types.of(event))
        outcome = _OUTCOMES.get(event.kind)
        if outcome is not None:
            self.jobs.labels(*labels, outcome).inc()
        if event.kind is Kind.DEAD_LETTERED:
            self.dead_lettered.labels(*labels, event.category or "unknown").inc()
        elif event.kind is Kind.BREAKER_CHANGED:
            self.breaker_transitions.labels(*labels, event.extra.get("state", "unknown")).inc()
        elif event.kind is Kind.HEARTBEAT:
            self.heartbeat_extensions.labels(*labels).inc()
        elif event.kind is Kind.STARTED and event.queue_wait_s is not None:
            self.queue_wait.labels(*labels).observe(max(0.0, event.queue_wait_s))
        if event.duration_s is not None:
            self.job_duration.labels(*labels).observe(max(0.0, event.duration_s))

    def gauge(self, *, in_flight: int, free_slots: int, stuck_threads: int = 0) -> None:
        self.in_flight.set(in_flight)
        self.free_slots.set(free_slots)
        self.stuck_threads.set(stuck_threads)

    def connectivity(self, *, service: str, reachable: bool) -> None:
        self.endpoint_up.labels(service).set(1 if reachable else 0)

    def render(self) -> str:
        return generate_latest(self.registry).decode("utf-8")

    def route(self) -> tuple[int, str, str]:
        return 200, CONTENT_TYPE, self.render()
