"""Health: liveness file and its check command, the HTTP endpoint's liveness and readiness."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.support.backends import Backend
from worker.commands.__main__ import main
from worker.observability.health import HealthObserver, check_liveness_file, liveness_from_timestamp, serve_health
from worker.settings import WorkerSettings


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_liveness_rule() -> None:
    assert not liveness_from_timestamp(None, now_epoch_s=100, max_age_s=10).ok
    assert liveness_from_timestamp(95, now_epoch_s=100, max_age_s=10).ok
    stale = liveness_from_timestamp(80, now_epoch_s=100, max_age_s=10)
    assert not stale.ok
    assert "20.0 s ago" in stale.reason


def test_observer_writes_the_file_at_most_once_a_second(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "health"
    mono, wall = Clock(10.0), Clock(1_000.0)
    observer = HealthObserver(WorkerSettings(queue="q", health_file=str(path)), monotonic=mono, wall_clock=wall)
    assert not observer.liveness().ok
    observer.gauge(in_flight=0, free_slots=1)
    assert path.read_text().strip() == "1000.000"
    mono.now, wall.now = 10.5, 1_000.5
    observer.gauge(in_flight=0, free_slots=1)
    assert path.read_text().strip() == "1000.000"  # rate-limited
    mono.now, wall.now = 11.2, 1_001.2
    observer.gauge(in_flight=0, free_slots=1)
    assert path.read_text().strip() == "1001.200"
    assert check_liveness_file(path, max_age_s=5, now_epoch_s=1_003).ok
    assert not check_liveness_file(path, max_age_s=5, now_epoch_s=1_010).ok
    observer.close()
    assert not path.exists()
    assert not check_liveness_file(path, max_age_s=5).ok


def test_readiness_follows_connectivity(tmp_path: Path) -> None:
    mono = Clock(0.0)
    settings = WorkerSettings(queue="q", health_file=str(tmp_path / "h"), health_max_age_s=30)
    observer = HealthObserver(settings, monotonic=mono, write_file=False)
    observer.gauge(in_flight=0, free_slots=1)
    assert observer.readiness().ok
    observer.connectivity(service="sqs", reachable=False)
    assert observer.liveness().ok
    assert not observer.readiness().ok
    assert observer.readiness().details["unreachable"] == ["sqs"]
    observer.connectivity(service="sqs", reachable=True)
    assert observer.readiness().ok
    mono.now = 31.0  # the loop stopped turning
    assert not observer.liveness().ok
    assert not observer.readiness().ok


def test_readiness_is_off_while_every_handler_thread_is_stuck(tmp_path: Path) -> None:
    """Concurrency 2 allows 4 handler threads (2 healthy plus 2 replacing stuck ones): not ready at 4 stuck."""
    settings = WorkerSettings(queue="q", health_file=str(tmp_path / "h"), concurrency=2)
    observer = HealthObserver(settings, monotonic=Clock(0.0), write_file=False)
    observer.gauge(in_flight=2, free_slots=0, stuck_threads=3)
    assert observer.readiness().ok
    observer.gauge(in_flight=2, free_slots=0, stuck_threads=4)
    status = observer.readiness()
    assert not status.ok and status.details["stuck_threads"] == 4
    assert "every handler thread (4) is stuck" in status.reason
    assert observer.liveness().ok  # alive: the loop turns
    observer.gauge(in_flight=0, free_slots=2, stuck_threads=3)
    assert observer.readiness().ok


def get(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def test_http_endpoint(tmp_path: Path) -> None:
    settings = WorkerSettings(queue="q", health_port=0, health_file=str(tmp_path / "h"), health_max_age_s=30)
    observer = HealthObserver(settings, write_file=False)
    stop = asyncio.Event()
    started: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    server = asyncio.create_task(serve_health(settings, observer, stop, host="127.0.0.1", started=started))
    port = await asyncio.wait_for(started, 10)
    base = f"http://127.0.0.1:{port}"
    try:
        status, body = await asyncio.to_thread(get, f"{base}/healthz")
        assert status == 503
        assert body["status"] == "fail"
        observer.gauge(in_flight=1, free_slots=3)
        assert (await asyncio.to_thread(get, f"{base}/healthz"))[0] == 200
        assert (await asyncio.to_thread(get, f"{base}/readyz"))[0] == 200
        observer.connectivity(service="dynamodb", reachable=False)
        status, body = await asyncio.to_thread(get, f"{base}/readyz")
        assert status == 503
        assert body["unreachable"] == ["dynamodb"]
        with pytest.raises(urllib.error.HTTPError) as missing:
            await asyncio.to_thread(urllib.request.urlopen, f"{base}/nope", None, 5)
        assert missing.value.code == 404
    finally:
        stop.set()
        await asyncio.wait_for(server, 10)


def test_health_check_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "health"
    monkeypatch.setenv("WORKER_HEALTH_FILE", str(path))
    monkeypatch.setenv("WORKER_HEALTH_MAX_AGE_S", "5")
    monkeypatch.delenv("WORKER_QUEUE", raising=False)  # the check needs no queue
    assert main(["health", "--check"]) == 1
    assert "unhealthy" in capsys.readouterr().out
    path.write_text(f"{time.time():.3f}\n")
    assert main(["health", "--check"]) == 0
    assert capsys.readouterr().out.startswith("healthy")
    path.write_text(f"{time.time() - 60:.3f}\n")
    assert main(["health"]) == 1
    assert json.loads(capsys.readouterr().out)["healthy"] is False


def test_health_check_command_as_a_process(tmp_path: Path) -> None:
    """What a container HEALTHCHECK runs: the console script, its exit code."""
    path = tmp_path / "health"
    path.write_text(f"{time.time():.3f}\n")
    env = {"WORKER_HEALTH_FILE": str(path), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-m", "worker.commands", "health", "--check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


async def test_health_file_is_removed_even_when_a_companion_fails(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """serve()'s shutdown closes health (and metrics) even when a task beside the worker raised."""
    import signal

    from tests.support.harness import Recorder, make_queues
    from worker.jobs import Registry
    from worker.runtime.service import serve

    monkeypatch.setenv("AWS_ENDPOINT_URL", backend.endpoint_url)
    health_file = tmp_path / "health"
    settings = WorkerSettings(
        queue=make_queues(backend.endpoint_url).queue_url, health_file=str(health_file), poll_wait_s=1, metrics="off"
    )
    registry = Registry()

    @registry.job("noop")
    async def noop(payload: dict[str, object]) -> None:
        return None

    turns = Recorder()
    written: list[bool] = []

    async def broken(stop: asyncio.Event) -> None:
        await turns.wait_for(lambda recorder: bool(recorder.gauges))  # the health observer wrote the file before
        written.append(health_file.exists())
        stop.set()
        raise RuntimeError("a companion broke")

    loop = asyncio.get_running_loop()
    try:
        with pytest.raises(RuntimeError, match="a companion broke"):
            await asyncio.wait_for(serve(settings, registry, companions=[broken], extra_observers=[turns]), 60)
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    assert written == [True]
    assert not health_file.exists(), "the liveness file outlived the worker"


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"health_file": "{tmp}/a-file/health"}, "WORKER_HEALTH_FILE={tmp}/a-file/health: cannot write the liveness"),
        ({"health_file": "{tmp}"}, "WORKER_HEALTH_FILE={tmp}: cannot write the liveness file there: a folder"),
        ({"listen_host": "not a host", "health_port": 0}, "WORKER_LISTEN_HOST=not a host: not an address to listen on"),
    ],
    ids=["health-file", "health-file-is-a-folder", "listen-host"],
)
async def test_a_start_setting_that_cannot_work_stops_the_start_naming_it(
    tmp_path: Path, overrides: dict[str, object], fragment: str
) -> None:
    """Before the queue is touched (the queue named here does not exist anywhere)."""
    from worker.errors import ConfigError
    from worker.jobs import Registry
    from worker.runtime.service import serve

    (tmp_path / "a-file").write_text("a file, not a folder")
    values = {key: str(value).replace("{tmp}", str(tmp_path)) for key, value in overrides.items()}
    settings = WorkerSettings(queue="http://127.0.0.1:9/000000000000/none", metrics="off", **values)  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as info:
        await asyncio.wait_for(serve(settings, Registry()), 30)
    assert str(info.value).startswith(fragment.replace("{tmp}", str(tmp_path)))
