"""serve-tasks against its HTTP contract directly (what the emulator cannot send: OIDC tokens, chosen retry
counts; and what it cannot see: status codes, Retry-After): a real server in-process, tables on the backend."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.support.backends import Backend
from tests.support.cloudtasks import (
    SECRET,
    dead_letters,
    make_dead_letter_table,
    post,
    serving,
    signing_keys,
    task_headers,
)
from tests.support.idempotency import dynamodb_client
from worker.backends.cloudtasks.auth import KeySet
from worker.errors import PermanentError, RetryableError
from worker.idempotency import create_table
from worker.jobs import Registry
from worker.observability.events import Kind

AUDIENCE = "https://worker.example/tasks"
ACCOUNT = "tasks@test-project.iam.gserviceaccount.com"


@pytest.fixture
def env(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> Backend:
    monkeypatch.setenv("AWS_ENDPOINT_URL", backend.endpoint_url)
    return backend


def registry_with(ran: list[str], gate: threading.Event | None = None) -> Registry:
    registry = Registry()

    @registry.job("ok", max_attempts=3)
    async def ok(payload: dict[str, Any]) -> str:
        ran.append(f"ok {payload.get('n')}")
        return "done"

    @registry.job("later", max_attempts=5)
    async def later(payload: dict[str, Any]) -> None:
        ran.append("later")
        raise RetryableError("rate limited", delay_s=7)

    @registry.job("flaky", max_attempts=5)
    async def flaky(payload: dict[str, Any]) -> None:
        ran.append("flaky")
        raise RuntimeError("upstream 502")

    @registry.job("refuse")
    async def refuse(payload: dict[str, Any]) -> None:
        ran.append("refuse")
        raise PermanentError("the address is invalid")

    @registry.job("block", timeout_s=30)
    def block(payload: dict[str, Any]) -> None:
        ran.append(f"block {payload.get('n')}")
        assert gate is not None
        gate.wait(20)

    return registry


def envelope(job_type: str, **payload: Any) -> bytes:
    return json.dumps({"type": job_type, "payload": payload}).encode()


async def call(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], Any]:
    return await asyncio.to_thread(post, url, body, headers)


async def test_success_retry_delay_permanent_and_invalid_input(env: Backend, tmp_path: Any) -> None:
    table = await make_dead_letter_table(env.endpoint_url)
    ran: list[str] = []
    async with serving(registry_with(ran), queue="q", dead_letter_table=table, tmp_path=tmp_path) as server:
        status, _, body = await call(server.url, envelope("ok", n=1), task_headers("t-ok"))
        assert (status, body["outcome"]) == (200, "succeeded")
        status, headers, body = await call(server.url, envelope("later"), task_headers("t-later"))
        assert (status, headers["retry-after"], body["outcome"]) == (429, "7", "retry_after")
        status, headers, body = await call(server.url, envelope("flaky"), task_headers("t-flaky"))
        assert (status, body["outcome"]) == (500, "retry")
        assert "retry-after" not in headers  # the queue's own backoff applies
        status, _, body = await call(server.url, envelope("refuse"), task_headers("t-refuse"))
        assert (status, body["outcome"], body["detail"]) == (200, "dead_lettered", "permanent")
        status, _, body = await call(server.url, b"{not json", task_headers("t-bad"))
        assert (status, body["detail"]) == (200, "invalid_message")
        status, _, body = await call(server.url, envelope("nope"), task_headers("t-unknown"))
        assert (status, body["detail"]) == (200, "unknown_type")
        status, _, body = await call(server.url, b"\xff\xfe", task_headers("t-binary"))
        assert (status, body["detail"]) == (200, "invalid_message")
    assert ran == ["ok 1", "later", "flaky", "refuse"]
    records = {r.task: r for r in await dead_letters(env.endpoint_url, table, "q")}
    assert sorted(records) == ["t-bad", "t-binary", "t-refuse", "t-unknown"]
    refused = records["t-refuse"]
    assert refused.attributes["error_category"] == "permanent"
    assert refused.attributes["error_message"] == "PermanentError: the address is invalid"
    assert refused.attributes["attempts"] == "1"
    assert refused.attributes["source_queue"] == "q"
    assert refused.attributes["original_message_id"] == "t-refuse"
    assert refused.attributes["failed_at"].endswith("Z")
    assert refused.job_type == "refuse"
    assert records["t-binary"].body == b"\xff\xfe"  # byte for byte
    assert records["t-bad"].body == b"{not json"


async def test_last_attempt_is_dead_lettered_as_exhausted(env: Backend, tmp_path: Any) -> None:
    """The queue's max attempts (3 here) and X-CloudTasks-TaskRetryCount tell the last attempt."""
    table = await make_dead_letter_table(env.endpoint_url)
    ran: list[str] = []
    async with serving(registry_with(ran), queue="q", dead_letter_table=table, tmp_path=tmp_path) as server:
        status, _, _ = await call(server.url, envelope("flaky"), task_headers("t", retry_count=1))
        assert status == 500
        status, _, body = await call(server.url, envelope("flaky"), task_headers("t", retry_count=2))
        assert (status, body["detail"]) == (200, "exhausted")
        # a redelivery of a task decided dead is recorded again without running
        status, _, body = await call(server.url, envelope("flaky"), task_headers("t", retry_count=3))
        assert (status, body["detail"]) == (200, "exhausted")
    assert ran == ["flaky", "flaky"]
    [record] = await dead_letters(env.endpoint_url, table, "q")
    assert (record.attributes["error_category"], record.attributes["attempts"]) == ("exhausted", "3")


async def test_unauthenticated_requests_get_401_and_run_nothing(env: Backend, tmp_path: Any) -> None:
    table = await make_dead_letter_table(env.endpoint_url)
    ran: list[str] = []
    other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    with signing_keys() as keys:
        key_set = KeySet(keys.url, cache_s=3600)
        async with serving(
            registry_with(ran),
            queue="q",
            dead_letter_table=table,
            tmp_path=tmp_path,
            keys=key_set,
            service_account=ACCOUNT,
            audience=AUDIENCE,
        ) as server:

            def bearer(token: str) -> dict[str, str]:
                return {**task_headers(secret=None), "Authorization": f"Bearer {token}"}

            status, _, body = await call(server.url, envelope("ok", n=1), bearer(keys.token()))
            assert (status, body["outcome"]) == (200, "succeeded")
            refused = {
                "no credentials": task_headers(secret=None),
                "wrong secret": task_headers(secret="x" * 24),
                "wrong audience": bearer(keys.token(aud="https://other.example")),
                "wrong issuer": bearer(keys.token(iss="https://evil.example")),
                "expired": bearer(keys.token(exp=1_000_000, iat=999_000)),
                "no expiry": bearer(keys.token(exp=None)),
                "other signer": bearer(keys.token(key=other_key)),
                "unknown key id": bearer(keys.token(kid="not-a-key")),
                "other account": bearer(keys.token(email="someone@example.com")),
                "unverified email": bearer(keys.token(email_verified=False)),
                "HS256": bearer(keys.token(key="a-guessable-hmac-secret-of-32-bytes!", algorithm="HS256")),
                "garbage": bearer("not.a.token"),
            }
            for reason, headers in refused.items():
                status, _, body = await call(server.url, envelope("ok", n=2), headers)
                assert (reason, status) == (reason, 401), body
            assert keys.fetches <= 2  # cached: an unknown kid refetches at most once per interval
    assert ran == ["ok 1"]
    assert not server.recorder.of(Kind.STARTED)[1:]


async def test_unfetchable_keys_answer_503_and_run_nothing(env: Backend, tmp_path: Any) -> None:
    """Google's keys out of reach is not the caller's fault: 503 (Cloud Tasks tries again), not 401."""
    from worker.dev.localaws import free_port

    table = await make_dead_letter_table(env.endpoint_url)
    ran: list[str] = []
    with signing_keys() as keys:
        token = keys.token()
    key_set = KeySet(f"http://127.0.0.1:{free_port()}/certs", cache_s=3600)  # nothing listens there
    async with serving(
        registry_with(ran),
        queue="q",
        dead_letter_table=table,
        tmp_path=tmp_path,
        keys=key_set,
        service_account=ACCOUNT,
        audience=AUDIENCE,
    ) as server:
        headers = {**task_headers(secret=None), "Authorization": f"Bearer {token}"}
        status, response_headers, body = await call(server.url, envelope("ok", n=1), headers)
        assert (status, body["outcome"], response_headers["retry-after"]) == (503, "keys_unavailable", "10")
    assert ran == []


async def test_over_capacity_answers_503_but_the_last_attempt_waits(env: Backend, tmp_path: Any) -> None:
    table = await make_dead_letter_table(env.endpoint_url)
    ran: list[str] = []
    gate = threading.Event()
    async with serving(
        registry_with(ran, gate), queue="q", dead_letter_table=table, tmp_path=tmp_path, concurrency=1
    ) as server:
        first = asyncio.create_task(call(server.url, envelope("block", n=1), task_headers("a")))
        await server.recorder.wait_count(Kind.STARTED, 1)
        status, headers, body = await call(server.url, envelope("ok", n=2), task_headers("b"))
        assert (status, headers["retry-after"], body["outcome"]) == (503, "1", "over_capacity")
        last = asyncio.create_task(call(server.url, envelope("ok", n=3), task_headers("c", retry_count=2)))
        await asyncio.sleep(0.2)  # a chance to (wrongly) answer before the slot frees
        assert not last.done()
        gate.set()
        assert (await first)[0] == 200
        assert (await last)[0] == 200
    assert ran == ["block 1", "ok 3"]


async def test_health_and_shutdown_finish_running_jobs(env: Backend, tmp_path: Any) -> None:
    table = await make_dead_letter_table(env.endpoint_url)
    ran: list[str] = []
    gate = threading.Event()
    async with serving(
        registry_with(ran, gate), queue="q", dead_letter_table=table, tmp_path=tmp_path, shutdown_grace_s=10
    ) as server:
        health = f"http://127.0.0.1:{server.port}"
        await server.recorder.wait_for(lambda r: bool(r.gauges))
        assert (await asyncio.to_thread(_get, health + "/healthz"))[0] == 200
        assert (await asyncio.to_thread(_get, health + "/readyz"))[0] == 200
        running = asyncio.create_task(call(server.url, envelope("block", n=1), task_headers("a")))
        await server.recorder.wait_count(Kind.STARTED, 1)
        server.stop.set()
        await asyncio.sleep(0.3)  # the shutdown has begun while the job runs
        gate.set()
        status, _, body = await running
        assert (status, body["outcome"]) == (200, "succeeded")
        await asyncio.wait_for(server.task, 20)
    assert ran == ["block 1"]


async def test_cancelled_past_the_grace_answers_503_and_releases_the_claim(env: Backend, tmp_path: Any) -> None:
    table = await make_dead_letter_table(env.endpoint_url)
    ledger_table = f"ledger-{table}"
    async with dynamodb_client(env.endpoint_url) as client:
        await create_table(client, ledger_table)
    registry = Registry()
    started = asyncio.Event()

    @registry.job("hang", idempotent=True, timeout_s=60)
    async def hang(payload: dict[str, Any]) -> None:
        started.set()
        await asyncio.sleep(60)

    async with serving(
        registry,
        queue="q",
        dead_letter_table=table,
        tmp_path=tmp_path,
        shutdown_grace_s=0.5,
        idempotency_table=ledger_table,
    ) as server:
        running = asyncio.create_task(call(server.url, envelope("hang"), task_headers("a")))
        await asyncio.wait_for(started.wait(), 10)
        server.stop.set()
        status, headers, body = await running
        assert (status, body["outcome"], headers["retry-after"]) == (503, "cancelled_at_shutdown", "1")
    async with dynamodb_client(env.endpoint_url) as client:
        items = (await client.scan(TableName=ledger_table))["Items"]
    assert [item["status"]["S"] for item in items] == ["IN_PROGRESS"]
    assert "owner" not in items[0]  # released: the next delivery runs it at once


def _get(url: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_secret_is_compared_not_logged() -> None:
    assert len(SECRET) >= 16


async def test_lifespans_and_middleware_serve_cloud_tasks_handlers_too(env: Backend, tmp_path: Any) -> None:
    """The same handlers as on SQS: ctx.resources from a lifespan, the middleware around each job, the lifespan
    stopped after the server."""
    from collections.abc import AsyncIterator

    from worker import JobContext
    from worker.middleware import CallNext

    table = await make_dead_letter_table(env.endpoint_url)
    seen: list[str] = []
    registry = Registry()

    @registry.lifespan
    async def pool() -> AsyncIterator[dict[str, Any]]:
        seen.append("open")
        yield {"pool": "the pool"}
        seen.append("close")

    @registry.middleware
    async def around(ctx: JobContext, call_next: CallNext) -> Any:
        seen.append(f"before {ctx.job_type}")
        result = await call_next()
        seen.append(f"after {result}")
        return result

    @registry.job("uses_pool")
    async def uses_pool(payload: dict[str, Any], ctx: JobContext) -> str:
        return str(ctx.resources["pool"])

    async with serving(registry, queue="q", dead_letter_table=table, tmp_path=tmp_path) as server:
        status, _, body = await call(server.url, envelope("uses_pool"), task_headers("t-pool"))
        assert (status, body["outcome"]) == (200, "succeeded")
    assert seen == ["open", "before uses_pool", "after the pool", "close"]


async def test_hostile_count_headers_read_as_a_first_attempt_not_a_500(env: Backend, tmp_path: Any) -> None:
    """Past the secret, X-CloudTasks-TaskRetryCount and ...ExecutionCount of 5,000 digits (more than int() takes)
    or a superscript digit ('²'.isdigit() is true) answered a bare 500 with a traceback."""
    table = await make_dead_letter_table(env.endpoint_url)
    ran: list[str] = []
    async with serving(registry_with(ran), queue="q", dead_letter_table=table, tmp_path=tmp_path) as server:
        for n, value in enumerate(["9" * 5000, "\u00b2", "\u00b9", " 12345678901 ", "-3", "0x10"]):
            headers = {
                **task_headers(f"t-count-{n}"),
                "X-CloudTasks-TaskRetryCount": value,
                "X-CloudTasks-TaskExecutionCount": value,
            }
            status, _, body = await call(server.url, envelope("ok", n=n), headers)
            assert (status, body["outcome"]) == (200, "succeeded"), (value[:20], status, body)
    assert ran == [f"ok {n}" for n in range(6)]


@pytest.mark.parametrize("value", ["9" * 5000, "\u00b2", "\u0663", "-1", "1e3", "", None, "12345678901"])
def test_a_count_header_that_is_not_plain_ascii_digits_counts_as_0(value: str | None) -> None:
    from worker.backends.cloudtasks.contract import parse_request

    headers = {"x-cloudtasks-taskretrycount": value} if value is not None else {}
    assert parse_request(b"{}", headers, default_queue="q").attempt == 1
