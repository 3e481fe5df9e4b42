"""The Prometheus endpoint: prometheus-client metrics from events, parsed back as a scraper would, over HTTP."""

from __future__ import annotations

import asyncio
import urllib.request

from prometheus_client import REGISTRY
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from worker.observability.events import Event, Kind
from worker.observability.health import serve_http
from worker.observability.prometheus import CONTENT_TYPE, JOB_DURATION_BUCKETS_S, PrometheusObserver


def fed(queue: str = "jobs") -> PrometheusObserver:
    observer = PrometheusObserver(queue)
    observer.emit(Event(Kind.STARTED, queue, "m1", job_type="email", attempt=1, queue_wait_s=0.25))
    observer.emit(Event(Kind.SUCCEEDED, queue, "m1", job_type="email", attempt=1, duration_s=0.5))
    observer.emit(Event(Kind.RETRY_SCHEDULED, queue, "m2", job_type="email", attempt=1, duration_s=1.5))
    observer.emit(Event(Kind.DEAD_LETTERED, queue, "m3", job_type=None, attempt=1, category="invalid_message"))
    observer.emit(Event(Kind.HEARTBEAT, queue, "m4", job_type="email", attempt=1))
    observer.gauge(in_flight=3, free_slots=7, stuck_threads=2)
    observer.connectivity(service="sqs", reachable=False)
    return observer


def families(text: str) -> dict[str, Metric]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def value(family: Metric, name: str, **labels: str) -> float:
    matches = [s.value for s in family.samples if s.name == name and s.labels == labels]
    assert len(matches) == 1, f"{name}{labels} in {family.samples}"
    return matches[0]


def test_every_family_has_help_and_its_type() -> None:
    text = fed().render()
    parsed = families(text)
    expected = {
        "sqs_worker_jobs": "counter",
        "sqs_worker_dead_lettered": "counter",
        "sqs_worker_heartbeat_extensions": "counter",
        "sqs_worker_job_duration_seconds": "histogram",
        "sqs_worker_queue_wait_seconds": "histogram",
        "sqs_worker_in_flight": "gauge",
        "sqs_worker_free_slots": "gauge",
        "sqs_worker_stuck_threads": "gauge",
        "sqs_worker_endpoint_up": "gauge",
    }
    assert {name: parsed[name].type for name in expected} == expected
    for name in expected:
        assert parsed[name].documentation, f"{name} has no HELP text"
        exposed = name + ("_total" if expected[name] == "counter" else "")
        assert f"# HELP {exposed} " in text and f"# TYPE {exposed} {expected[name]}\n" in text


def test_values_and_labels_are_the_documented_ones() -> None:
    parsed = families(fed().render())
    jobs = parsed["sqs_worker_jobs"]
    email = {"queue": "jobs", "job_type": "email"}
    assert value(jobs, "sqs_worker_jobs_total", **email, outcome="succeeded") == 1
    assert value(jobs, "sqs_worker_jobs_total", **email, outcome="retried") == 1
    assert value(jobs, "sqs_worker_jobs_total", queue="jobs", job_type="_none", outcome="dead_lettered") == 1
    dead = parsed["sqs_worker_dead_lettered"]
    assert (
        value(dead, "sqs_worker_dead_lettered_total", queue="jobs", job_type="_none", category="invalid_message") == 1
    )
    assert value(parsed["sqs_worker_heartbeat_extensions"], "sqs_worker_heartbeat_extensions_total", **email) == 1
    assert value(parsed["sqs_worker_queue_wait_seconds"], "sqs_worker_queue_wait_seconds_sum", **email) == 0.25
    assert value(parsed["sqs_worker_in_flight"], "sqs_worker_in_flight", queue="jobs") == 3
    assert value(parsed["sqs_worker_free_slots"], "sqs_worker_free_slots", queue="jobs") == 7
    assert value(parsed["sqs_worker_stuck_threads"], "sqs_worker_stuck_threads", queue="jobs") == 2
    assert value(parsed["sqs_worker_endpoint_up"], "sqs_worker_endpoint_up", service="sqs") == 0


def test_job_duration_is_a_histogram_with_cumulative_buckets() -> None:
    duration = families(fed().render())["sqs_worker_job_duration_seconds"]
    email = {"queue": "jobs", "job_type": "email"}
    buckets: list[Sample] = [
        s for s in duration.samples if s.name.endswith("_bucket") and s.labels["job_type"] == "email"
    ]
    bounds = [float(s.labels["le"]) for s in buckets]
    assert bounds == [*map(float, JOB_DURATION_BUCKETS_S), float("inf")]
    counts = {float(s.labels["le"]): s.value for s in buckets}
    assert counts[0.25] == 0 and counts[0.5] == 1 and counts[1] == 1 and counts[2.5] == 2 and counts[float("inf")] == 2
    assert value(duration, "sqs_worker_job_duration_seconds_count", **email) == 2
    assert value(duration, "sqs_worker_job_duration_seconds_sum", **email) == 2.0


def test_label_values_with_quotes_backslashes_and_newlines_are_escaped() -> None:
    queue, job_type = 'we"ird\\q', 'a\nb"c\\'
    observer = PrometheusObserver(queue)
    observer.emit(Event(Kind.SUCCEEDED, queue, "m", job_type=job_type, duration_s=1))
    text = observer.render()
    assert 'job_type="a\\nb\\"c\\\\"' in text and 'queue="we\\"ird\\\\q"' in text
    assert len([line for line in text.splitlines() if line.startswith("sqs_worker_jobs_total{")]) == 1
    jobs = families(text)["sqs_worker_jobs"]
    assert value(jobs, "sqs_worker_jobs_total", queue=queue, job_type=job_type, outcome="succeeded") == 1


def test_each_observer_has_its_own_registry() -> None:
    first, second = fed("first"), PrometheusObserver("second")  # the same names twice: no collision
    second.emit(Event(Kind.SUCCEEDED, "second", "m", job_type="other", duration_s=1))
    assert 'queue="second"' not in first.render() and 'queue="first"' not in second.render()
    assert not [family.name for family in REGISTRY.collect() if family.name.startswith("sqs_worker")]


def test_job_types_beyond_the_limit_count_as_other() -> None:
    observer = PrometheusObserver("jobs", max_job_types=2)
    for job_type in ("a", "b", "c", "d", "a"):
        observer.emit(Event(Kind.SUCCEEDED, "jobs", "m", job_type=job_type, duration_s=0.1))
    jobs = families(observer.render())["sqs_worker_jobs"]
    seen = {s.labels["job_type"]: s.value for s in jobs.samples if s.name == "sqs_worker_jobs_total"}
    assert seen == {"a": 2, "b": 1, "_other": 2}


async def test_served_over_http() -> None:
    observer = fed()
    stop = asyncio.Event()
    started: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    server = asyncio.create_task(
        serve_http({"/metrics": observer.route}, host="127.0.0.1", port=0, stop_event=stop, started=started)
    )
    port = await asyncio.wait_for(started, 10)

    def scrape() -> tuple[str, str]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return response.headers["Content-Type"], response.read().decode()

    content_type, body = await asyncio.to_thread(scrape)
    stop.set()
    await asyncio.wait_for(server, 10)
    assert content_type == CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"
    assert families(body)["sqs_worker_jobs"].type == "counter"
