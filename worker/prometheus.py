"""An optional Prometheus endpoint (``WORKER_PROMETHEUS_PORT``): counters and gauges of the worker in the
text exposition format (version 0.0.4), served by the same small HTTP server as the health endpoint."""

from __future__ import annotations

from collections import defaultdict

from worker.events import Event, Kind

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_OUTCOMES = {
    Kind.SUCCEEDED: "succeeded",
    Kind.RETRY_SCHEDULED: "retried",
    Kind.DEAD_LETTERED: "dead_lettered",
    Kind.RELEASED: "released",
    Kind.DUPLICATE_SKIPPED: "duplicate_skipped",
}

Labels = tuple[tuple[str, str], ...]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: Labels) -> str:
    return "{" + ",".join(f'{name}="{_escape(value)}"' for name, value in labels) + "}" if labels else ""


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


class PrometheusObserver:
    """Keeps counters from the worker's events and renders them for a scrape."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self._counters: dict[str, dict[Labels, float]] = defaultdict(lambda: defaultdict(float))
        self._gauges: dict[str, float] = {"sqs_worker_in_flight": 0, "sqs_worker_free_slots": 0}
        self._reachable: dict[str, bool] = {}

    def emit(self, event: Event) -> None:
        job_type = event.job_type or "_none"
        base: Labels = (("queue", self.queue), ("job_type", job_type))
        outcome = _OUTCOMES.get(event.kind)
        if outcome is not None:
            self._counters["sqs_worker_jobs_total"][(*base, ("outcome", outcome))] += 1
        if event.kind is Kind.DEAD_LETTERED:
            self._counters["sqs_worker_dead_lettered_total"][(*base, ("category", event.category or "unknown"))] += 1
        if event.kind is Kind.HEARTBEAT:
            self._counters["sqs_worker_heartbeat_extensions_total"][base] += 1
        if event.duration_s is not None:
            self._counters["sqs_worker_job_duration_seconds_sum"][base] += event.duration_s
            self._counters["sqs_worker_job_duration_seconds_count"][base] += 1
        if event.kind is Kind.STARTED and event.queue_wait_s is not None:
            self._counters["sqs_worker_queue_wait_seconds_sum"][base] += event.queue_wait_s
            self._counters["sqs_worker_queue_wait_seconds_count"][base] += 1

    def gauge(self, *, in_flight: int, free_slots: int) -> None:
        self._gauges["sqs_worker_in_flight"] = in_flight
        self._gauges["sqs_worker_free_slots"] = free_slots

    def connectivity(self, *, service: str, reachable: bool) -> None:
        self._reachable[service] = reachable

    def render(self) -> str:
        lines: list[str] = []
        for name in sorted(self._counters):
            family = name.removesuffix("_sum").removesuffix("_count")
            kind = "summary" if family != name else "counter"
            if not name.endswith("_count"):
                lines.append(f"# TYPE {family} {kind}")
            for labels, value in sorted(self._counters[name].items()):
                lines.append(f"{name}{_labels(labels)} {_number(value)}")
        queue: Labels = (("queue", self.queue),)
        for name, value in sorted(self._gauges.items()):
            lines.append(f"# TYPE {name} gauge")
            lines.append(f"{name}{_labels(queue)} {_number(value)}")
        lines.append("# TYPE sqs_worker_endpoint_up gauge")
        for service, reachable in sorted(self._reachable.items()):
            lines.append(f'sqs_worker_endpoint_up{{service="{service}"}} {int(reachable)}')
        return "\n".join(lines) + "\n"

    def route(self) -> tuple[int, str, str]:
        return 200, CONTENT_TYPE, self.render()
