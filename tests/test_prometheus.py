"""The Prometheus endpoint: counters from events, the text format, served over HTTP."""

from __future__ import annotations

import asyncio
import re
import urllib.request

from worker.events import Event, Kind
from worker.health import serve_http
from worker.prometheus import CONTENT_TYPE, PrometheusObserver

LINE = re.compile(r'^(# TYPE [a-z_]+ (counter|gauge|summary)|[a-z_]+(\{([a-z_]+="[^"]*",?)*\})? -?[0-9.e+-]+)$')


def fed() -> PrometheusObserver:
    observer = PrometheusObserver("jobs")
    observer.emit(Event(Kind.STARTED, "jobs", "m1", job_type="email", attempt=1, queue_wait_s=0.25))
    observer.emit(Event(Kind.SUCCEEDED, "jobs", "m1", job_type="email", attempt=1, duration_s=0.5))
    observer.emit(Event(Kind.RETRY_SCHEDULED, "jobs", "m2", job_type="email", attempt=1, duration_s=1.5))
    observer.emit(Event(Kind.DEAD_LETTERED, "jobs", "m3", job_type=None, attempt=1, category="invalid_message"))
    observer.gauge(in_flight=3, free_slots=7)
    observer.connectivity(service="sqs", reachable=False)
    return observer


def test_render_is_valid_text_format() -> None:
    text = fed().render()
    for line in text.splitlines():
        assert LINE.match(line), line
    assert 'sqs_worker_jobs_total{queue="jobs",job_type="email",outcome="succeeded"} 1' in text
    assert 'sqs_worker_jobs_total{queue="jobs",job_type="email",outcome="retried"} 1' in text
    assert 'sqs_worker_dead_lettered_total{queue="jobs",job_type="_none",category="invalid_message"} 1' in text
    assert 'sqs_worker_job_duration_seconds_sum{queue="jobs",job_type="email"} 2' in text
    assert 'sqs_worker_job_duration_seconds_count{queue="jobs",job_type="email"} 2' in text
    assert 'sqs_worker_queue_wait_seconds_sum{queue="jobs",job_type="email"} 0.25' in text
    assert 'sqs_worker_in_flight{queue="jobs"} 3' in text
    assert 'sqs_worker_endpoint_up{service="sqs"} 0' in text


def test_label_values_are_escaped() -> None:
    observer = PrometheusObserver('we"ird\\q')
    observer.emit(Event(Kind.SUCCEEDED, "x", "m", job_type="a\nb", duration_s=1))
    assert 'queue="we\\"ird\\\\q",job_type="a\\nb"' in observer.render()


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
    assert content_type == CONTENT_TYPE
    assert "sqs_worker_jobs_total" in body
