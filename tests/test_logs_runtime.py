"""A failing job that logs its secret: the real worker against a real endpoint, every log line checked."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from tests.support.backends import Backend
from tests.support.harness import drain, make_queues, running_worker, send
from worker.jobs import Registry
from worker.observability.events import Kind
from worker.observability.logs import LogObserver

SECRET = "s3cr3t-Value-7781"


def leaky_registry() -> Registry:
    registry = Registry()

    @registry.job("login", max_attempts=2, backoff_base_s=0.0, backoff_max_s=0.0)
    async def login(payload: dict[str, Any], ctx: Any) -> None:
        ctx.logger.info("logging in with %s", payload)  # the whole payload, secret included
        ctx.logger.info("password=%s", payload["password"])
        ctx.logger.warning("raw value %s", payload["password"])  # unkeyed: caught as a remembered value
        raise RuntimeError(f"login refused for {payload['user']}: {payload['password']} / {payload}")

    return registry


@pytest.mark.memory
async def test_secret_appears_in_no_log_line_of_a_failing_job(backend: Backend, log_stream: io.StringIO) -> None:
    queues = make_queues(backend.endpoint_url)
    async with running_worker(backend.endpoint_url, queues, leaky_registry()) as running:
        running.worker.observers.add(LogObserver())
        send(backend.endpoint_url, queues.queue_url, {"type": "login", "payload": {"user": "bob", "password": SECRET}})
        await running.recorder.wait_count(Kind.DEAD_LETTERED, 1)
    output = log_stream.getvalue()
    records = [json.loads(line) for line in output.splitlines()]
    assert SECRET not in output
    events = [r.get("event") for r in records]
    for kind in ("received", "started", "retry_scheduled", "dead_lettered"):
        assert kind in events, f"no {kind} line in {events}"
    job_lines = [r for r in records if r["logger"] == "worker.job"]
    assert len(job_lines) == 6  # three lines per attempt, two attempts
    assert all(r["job_type"] == "login" and "message_id" in r for r in job_lines)
    dead = next(r for r in records if r.get("event") == "dead_lettered")
    assert dead["category"] == "exhausted"
    assert "RuntimeError" in dead["error"]
    assert drain(backend.endpoint_url, queues.dlq_url, expect=1)  # the message itself is kept, in the DLQ
