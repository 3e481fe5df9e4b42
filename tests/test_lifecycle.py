"""Lifespans: resources opened once per worker before the first receive, closed after the last job."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.backends import Backend
from tests.support.harness import make_queues, running_worker, send, sqs_client
from tests.support.process import bootstrapped_queue, cli, lines, start, wait_until
from tests.support.queues import assert_queue_empty, queue_counts
from worker import ConfigError, JobContext, Resources
from worker.jobs import Registry
from worker.lifecycle import check_lifespan, open_lifespans
from worker.observability.events import Kind


class Pool:
    def __init__(self) -> None:
        self.open = True


@pytest.mark.memory
async def test_resources_reach_async_and_sync_handlers_and_close_after_the_last_job(backend: Backend) -> None:
    queues = make_queues(backend.endpoint_url)
    steps: list[str] = []
    registry = Registry()
    release = asyncio.Event()

    @registry.lifespan
    async def pool() -> AsyncIterator[dict[str, Any]]:
        resource = Pool()
        steps.append("pool open")
        yield {"pool": resource}
        resource.open = False
        steps.append("pool closed")

    @registry.lifespan
    def config() -> Iterator[dict[str, Any]]:  # a plain def lifespan
        steps.append("config open")
        yield {"config": {"region": "eu-west-1"}}
        steps.append("config closed")

    @registry.job("async_job")
    async def async_job(payload: dict[str, Any], ctx: JobContext) -> None:
        steps.append(f"async pool open={ctx.resources.get_as('pool', Pool).open}")
        await release.wait()
        steps.append(f"async done pool open={ctx.resources['pool'].open}")

    @registry.job("sync_job")
    def sync_job(payload: dict[str, Any], ctx: JobContext) -> None:
        steps.append(f"sync region={ctx.resources['config']['region']}")

    send(backend.endpoint_url, queues.queue_url, {"type": "sync_job"})
    send(backend.endpoint_url, queues.queue_url, {"type": "async_job"})
    async with running_worker(backend.endpoint_url, queues, registry) as running:
        await running.recorder.wait_count(Kind.STARTED, 2)
        assert steps[:2] == ["pool open", "config open"]  # before the first receive
        await running.recorder.wait_count(Kind.SUCCEEDED, 1)
        running.stop.set()  # shutdown while async_job still runs: the lifespans wait for it
        await asyncio.sleep(0)
        assert "pool closed" not in steps
        release.set()
    assert steps[-3:] == ["async done pool open=True", "config closed", "pool closed"]
    assert "sync region=eu-west-1" in steps and "async pool open=True" in steps
    assert_queue_empty(sqs_client(backend.endpoint_url), queues.queue_url)


@pytest.mark.memory
async def test_a_failing_startup_stops_the_worker_before_anything_is_received(backend: Backend) -> None:
    queues = make_queues(backend.endpoint_url)
    send(backend.endpoint_url, queues.queue_url, {"type": "noop"})
    closed: list[str] = []
    registry = Registry()

    @registry.lifespan
    async def first() -> AsyncIterator[None]:
        yield
        closed.append("first")

    @registry.lifespan
    async def broken() -> AsyncIterator[None]:
        raise OSError("pool unreachable")
        yield

    @registry.job("noop")
    async def noop(payload: dict[str, Any]) -> None:
        raise AssertionError("must not run")

    with pytest.raises(ConfigError, match=r"lifespan .*broken failed at startup: OSError: pool unreachable"):
        async with running_worker(backend.endpoint_url, queues, registry) as running:
            await asyncio.wait_for(asyncio.shield(running.task), timeout=30)
    assert closed == ["first"]  # what had started is stopped again
    assert running.recorder.of(Kind.RECEIVED) == []
    assert queue_counts(sqs_client(backend.endpoint_url), queues.queue_url)["ApproximateNumberOfMessages"] == 1


async def test_a_lifespan_calling_sys_exit_at_start_is_a_failure_of_one_line() -> None:
    """A `sys.exit(3)` in a lifespan's start ended the command with exit 3 and no line at all."""

    async def exits() -> AsyncIterator[None]:
        sys.exit(3)
        yield

    with pytest.raises(ConfigError, match=r"lifespan .*exits failed at startup: SystemExit: 3"):
        async with open_lifespans([exits]):
            raise AssertionError("must not start")


async def test_a_failing_shutdown_is_logged_and_the_others_still_stop(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stopped: list[str] = []

    async def first() -> AsyncIterator[dict[str, Any]]:
        yield {"a": 1}
        stopped.append("first")

    async def second() -> AsyncIterator[dict[str, Any]]:
        yield {"b": 2}
        raise RuntimeError("close failed")

    with caplog.at_level(logging.ERROR, logger="worker"):
        async with open_lifespans([first, second]) as resources:
            assert dict(resources) == {"a": 1, "b": 2}
    assert stopped == ["first"]
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == [
        f"lifespan {__name__}.test_a_failing_shutdown_is_logged_and_the_others_still_stop.<locals>.second "
        "failed at shutdown: RuntimeError: close failed"
    ]


async def test_what_a_lifespan_yields_is_checked() -> None:
    async def not_a_dict() -> AsyncIterator[Any]:
        yield ["pool"]

    async def clash() -> AsyncIterator[Any]:
        yield {"a": 2}

    async def first() -> AsyncIterator[Any]:
        yield {"a": 1}

    with pytest.raises(ConfigError, match="must yield a dict of named resources"):
        async with open_lifespans([not_a_dict]):
            pass
    with pytest.raises(ConfigError, match="resource 'a' is yielded by another lifespan too"):
        async with open_lifespans([first, clash]):
            pass


def test_registration_refuses_what_is_not_a_lifespan() -> None:
    async def coroutine() -> None:
        return None

    def takes_args(app: Any) -> Iterator[None]:
        yield

    with pytest.raises(ConfigError, match="must be a generator function"):
        check_lifespan(coroutine)
    with pytest.raises(ConfigError, match="must take no arguments"):
        check_lifespan(takes_args)


def test_resources_name_what_is_missing_and_check_types() -> None:
    resources = Resources({"http": "client"})
    with pytest.raises(KeyError, match=r"no resource 'db' \(the lifespans yielded: http\)"):
        resources["db"]
    with pytest.raises(TypeError, match="resource 'http' is a str, not a int"):
        resources.get_as("http", int)
    assert resources.get_as("http", str) == "client"


# ----------------------------------------------------------------------------------------------- as a process


def lifecycle_env(backend: Backend, tmp_path: Path, **settings: str) -> tuple[dict[str, str], str]:
    return bootstrapped_queue(
        backend.endpoint_url, tmp_path, handlers="tests.support.lifecycle_handlers", prefix="life", **settings
    )


def test_sigterm_closes_resources_after_the_running_job_finishes(backend: Backend, tmp_path: Path) -> None:
    env, url = lifecycle_env(backend, tmp_path, WORKER_SHUTDOWN_GRACE_S="20")
    client = sqs_client(backend.endpoint_url)
    client.send_message(QueueUrl=url, MessageBody=json.dumps({"type": "use_counter", "payload": {"n": 1}}))
    effects = tmp_path / "effects.txt"
    worker = start("run", env=env, stderr_path=tmp_path / "worker.log")
    try:
        wait_until(lambda: "finished 1 closed=False" in lines(effects), 30, "the first job")
        client.send_message(
            QueueUrl=url, MessageBody=json.dumps({"type": "use_counter", "payload": {"n": 2, "seconds": 2}})
        )
        wait_until(lambda: "started 2" in lines(effects), 30, "the second job to start")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, (tmp_path / "worker.log").read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
    assert lines(effects) == [
        "startup",
        "started 1",
        "finished 1 closed=False",
        "started 2",
        "finished 2 closed=False",
        "shutdown uses=2",
    ]
    assert_queue_empty(client, url)


def test_a_failing_startup_exits_2_with_one_line_and_receives_nothing(backend: Backend, tmp_path: Path) -> None:
    env, url = lifecycle_env(backend, tmp_path, TEST_LIFESPAN_FAIL="1")
    client = sqs_client(backend.endpoint_url)
    client.send_message(QueueUrl=url, MessageBody=json.dumps({"type": "use_counter", "payload": {"n": 1}}))
    result = cli("run", env=env, timeout_s=60)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    error_lines = [line for line in result.stderr.splitlines() if "error" in line]
    assert error_lines == [
        "sqs-worker: error: lifespan tests.support.lifecycle_handlers.counter failed at startup: "
        "ConnectionRefusedError: database at 127.0.0.1:9 refused the connection"
    ], result.stderr
    assert queue_counts(client, url) == {
        "ApproximateNumberOfMessages": 1,
        "ApproximateNumberOfMessagesNotVisible": 0,
        "ApproximateNumberOfMessagesDelayed": 0,
    }
    assert lines(tmp_path / "effects.txt") == []
