"""WORKER_PROMETHEUS_PORT with WORKER_PROCESSES=2: one scrape of the supervisor's port gives the group's metrics.

Counters sum over the processes, a SIGKILLed child's counts stay in the sums after its restart, per-process gauges
carry a ``process`` label, and SIGTERM ends the group (its port closed, its metric files removed).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.parser import text_string_to_metric_families

from tests.support.backends import Backend
from tests.support.harness import sqs_client
from tests.support.process import ROOT, cli, start, wait_until, worker_env
from tests.support.queues import assert_queue_empty
from tests.test_processes import children, effects, get, group, send, stop
from worker.dev.localaws import free_port
from worker.observability.group_metrics import GroupMetrics, relabel_processes

Samples = dict[str, list[tuple[dict[str, str], float]]]


def scrape(port: int) -> Samples:
    """Sample name -> [(labels, value)] of one scrape of /metrics; {} while the port does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return samples_of(response.read().decode("utf-8"))
    except OSError:
        return {}


def samples_of(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        samples.setdefault(f"# {family.name}", [])  # every family, with or without samples
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def total(samples: Samples, name: str, **labels: str) -> float:
    return sum(value for found, value in samples.get(name, []) if labels.items() <= found.items())


def succeeded(port: int) -> float:
    return total(scrape(port), "sqs_worker_jobs_total", outcome="succeeded")


def test_one_scrape_sums_the_group_and_a_restart_does_not_lower_it(moto_backend: Backend, tmp_path: Path) -> None:
    port = free_port()
    settings = {"WORKER_HEALTH_PORT": str(port), "WORKER_PROMETHEUS_PORT": str(port), "WORKER_CONCURRENCY": "2"}
    env, url = group(moto_backend, tmp_path, TMPDIR=str(tmp_path), **settings)
    log = tmp_path / "worker.log"
    worker = start("run", env=env, stderr_path=log)
    try:
        wait_until(lambda: get(port, "/readyz")[0] == 200, 60, "the group to be ready")
        assert len(list(tmp_path.glob("sqs-worker-metrics-*/*.db"))) >= 2  # the processes' files, in $TMPDIR
        # Every family is listed before its first sample; gauges that add up do, without a process label.
        assert {"# sqs_worker_jobs", "# sqs_worker_job_duration_seconds", "# sqs_worker_endpoint_up"} <= set(
            scrape(port)
        )
        wait_until(lambda: total(scrape(port), "sqs_worker_free_slots") == 4, 30, "4 free slots (2 processes x 2)")
        assert [labels for labels, _ in scrape(port)["sqs_worker_free_slots"]] == [{"queue": url.rsplit("/", 1)[1]}]

        send(moto_backend, url, range(8), seconds=0.5)  # 4 slots in all: both processes take some
        wait_until(lambda: succeeded(port) == 8, 60, "the scrape to count 8 jobs")
        ran_by = list(effects(tmp_path, "end").values())
        assert set(ran_by) == children(worker.pid), "both processes should have run jobs"
        assert total(scrape(port), "sqs_worker_job_duration_seconds_count") == 8

        # SIGKILL the child that ran the most jobs: its counts stay in the group's totals after its restart.
        before = children(worker.pid)
        os.kill(max(before, key=ran_by.count), signal.SIGKILL)
        wait_until(lambda: len(children(worker.pid) - before) == 1, 30, "the child to be started again")
        wait_until(lambda: get(port, "/readyz")[0] == 200, 60, "the group to be ready again")
        after = scrape(port)
        assert total(after, "sqs_worker_jobs_total", outcome="succeeded") == 8
        assert total(after, "sqs_worker_job_duration_seconds_count") == 8

        send(moto_backend, url, range(8, 12), seconds=0)
        wait_until(lambda: succeeded(port) == 12, 60, "the scrape to count the jobs after the restart")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0, log.read_text()
    finally:
        stop(worker, log)
    assert scrape(port) == {}  # the group is gone, its port closed
    assert not list(tmp_path.glob("sqs-worker-metrics-*")), "the metric files outlived the group"
    assert_queue_empty(sqs_client(moto_backend.endpoint_url), url)


def test_a_prometheus_port_of_its_own(moto_backend: Backend, tmp_path: Path) -> None:
    health, metrics = free_port(), free_port()
    env, url = group(moto_backend, tmp_path, WORKER_HEALTH_PORT=str(health), WORKER_PROMETHEUS_PORT=str(metrics))
    log = tmp_path / "worker.log"
    worker = start("run", env=env, stderr_path=log)
    try:
        send(moto_backend, url, range(3), seconds=0)
        wait_until(lambda: succeeded(metrics) == 3, 60, "the scrape to count 3 jobs")
        wait_until(lambda: get(health, "/readyz")[0] == 200, 60, "the group to be ready")
        with pytest.raises(urllib.error.HTTPError) as answer:  # no /metrics on the health port
            urllib.request.urlopen(f"http://127.0.0.1:{health}/metrics", timeout=5)
        assert answer.value.code == 404
    finally:
        stop(worker, log)
    assert_queue_empty(sqs_client(moto_backend.endpoint_url), url)


#: A worker process's metrics, as a child writes them in the group's folder (PROMETHEUS_MULTIPROC_DIR).
CHILD = """
import os
from worker.observability.events import Event, Kind
from worker.observability.prometheus import PrometheusObserver
observer = PrometheusObserver("jobs")
observer.gauge(in_flight=2, free_slots=3)
observer.connectivity(service="sqs", reachable=False)
for _ in range(5):
    observer.emit(Event(Kind.SUCCEEDED, "jobs", "m", job_type="t", duration_s=0.1))
print(os.getpid())
"""


def test_the_group_scrape_merges_the_processes_files() -> None:
    metrics = GroupMetrics("jobs")
    try:
        pids = []
        for index in range(2):
            env = {**os.environ, **metrics.child_environment()}
            child = subprocess.run(
                [sys.executable, "-c", CHILD], env=env, cwd=ROOT, capture_output=True, text=True, check=False
            )
            assert child.returncode == 0, child.stderr
            pids.append(int(child.stdout))
            metrics.started(pids[-1], index)
        merged = samples_of(metrics.render())
        assert total(merged, "sqs_worker_jobs_total", outcome="succeeded") == 10
        assert total(merged, "sqs_worker_job_duration_seconds_count") == 10
        assert merged["sqs_worker_in_flight"] == [({"queue": "jobs"}, 4.0)]
        assert sorted(labels["process"] for labels, _ in merged["sqs_worker_endpoint_up"]) == ["0", "1"]
        metrics.exited(pids[0])
        merged = samples_of(metrics.render())
        assert total(merged, "sqs_worker_jobs_total", outcome="succeeded") == 10  # a dead process's counts stay
        assert merged["sqs_worker_in_flight"] == [({"queue": "jobs"}, 2.0)]  # its live gauges go
        assert [labels["process"] for labels, _ in merged["sqs_worker_endpoint_up"]] == ["1"]
        metrics.exited(pids[1])  # both dead: their counts live on in one file per kind
        assert sorted(path.name for path in Path(metrics.path).iterdir()) == [
            "counter_retired.db",
            "histogram_retired.db",
        ]
        merged = samples_of(metrics.render())
        assert total(merged, "sqs_worker_jobs_total", outcome="succeeded") == 10
        assert total(merged, "sqs_worker_job_duration_seconds_count") == 10
        assert total(merged, "sqs_worker_job_duration_seconds_bucket", le="0.1") == 10
        assert total(merged, "sqs_worker_job_duration_seconds_bucket", le="0.05") == 0
        assert "sqs_worker_in_flight" not in merged and "sqs_worker_endpoint_up" not in merged
    finally:
        metrics.close()
    assert not Path(metrics.path).exists()


def test_per_process_samples_get_the_process_index_and_dead_pids_go() -> None:
    registry = CollectorRegistry()
    Gauge("up", "Up.", ["service"], registry=registry).labels("sqs").set(1)
    Counter("jobs", "Jobs.", registry=registry).inc()
    up, jobs = list(registry.collect())
    up.samples = [up.samples[0]._replace(labels={"service": "sqs", "pid": pid}) for pid in ("11", "12", "13")]
    relabeled = relabel_processes(up, lambda pid: {"11": 0, "13": 1}.get(pid))
    assert [sample.labels for sample in relabeled.samples] == [
        {"service": "sqs", "process": "0"},
        {"service": "sqs", "process": "1"},
    ]
    assert relabel_processes(jobs, lambda pid: None).samples == jobs.samples  # no pid: untouched


def test_a_taken_prometheus_port_stops_the_group_with_2(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))  # the supervisor's address: all interfaces  # nosec B104
        taken.listen()
        port = taken.getsockname()[1]
        env = worker_env(
            "http://127.0.0.1:9",
            TMP=str(tmp_path),
            TMPDIR=str(tmp_path),
            WORKER_QUEUE="q",
            WORKER_HANDLERS="tests.support.group_handlers",
            WORKER_PROCESSES="2",
            WORKER_PROMETHEUS_PORT=str(port),
        )
        result = cli("run", env=env, timeout_s=60)
    assert result.returncode == 2, result.stderr
    assert f"WORKER_PROMETHEUS_PORT={port}: cannot listen on port {port}: Address already in use" in result.stderr
    assert not list(tmp_path.glob("sqs-worker-metrics-*")), "the metric folder outlived the refusal"
