"""``sqs-worker serve-tasks``: the HTTP server Cloud Tasks pushes tasks to (Starlette on uvicorn).

Routes: ``POST /<any path>`` runs the task whose body is the envelope (see ``contract`` for the answers);
``GET /healthz`` (liveness) and ``GET /readyz`` (readiness: the loop turns, DynamoDB reachable, not shutting
down) as ``run`` serves them; ``GET /metrics`` when ``WORKER_PROMETHEUS_PORT`` is set (on this same port: Cloud
Run exposes one). Each POST is authenticated first (``auth``): 401 runs nothing.

SIGTERM or SIGINT: stop accepting connections, answer 503 to new deliveries on open ones, let running jobs
finish within ``WORKER_SHUTDOWN_GRACE_S``, cancel the rest (their deliveries answer 503: Cloud Tasks retries
them), then exit 0. A second signal exits at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from worker.backends.aws import async_client, client_config, is_transient
from worker.backends.cloudtasks.auth import Authenticator, KeySet, KeysUnavailable, Unauthorized
from worker.backends.cloudtasks.contract import MAX_TASK_BODY_BYTES, parse_request
from worker.backends.cloudtasks.deadletters import (
    PARTITION_KEY,
    SORT_KEY,
    DeadLetterStore,
    translate_dead_letter_error,
)
from worker.backends.cloudtasks.runner import RunnerOptions, TaskRunner
from worker.backends.cloudtasks.settings import CloudTasksSettings, load_cloudtasks_settings
from worker.errors import ConfigError
from worker.jobs import Registry
from worker.lifecycle import open_lifespans
from worker.names import queue_name_of
from worker.observability.events import Observer, Observers
from worker.observability.health import HealthObserver
from worker.observability.logs import LogObserver
from worker.observability.metrics import build_metrics_observer
from worker.observability.prometheus import PrometheusObserver
from worker.settings import WorkerSettings

log = logging.getLogger("worker")

#: A request body beyond Cloud Tasks' task size (plus room) is not a task: 413, nothing runs.
MAX_BODY_BYTES = MAX_TASK_BODY_BYTES
GAUGE_INTERVAL_S = 1.0
#: Retry-After when Google's signing keys cannot be fetched.
KEYS_RETRY_S = 10
#: After the grace, how long uvicorn still waits for the cancelled deliveries' answers.
ANSWER_MARGIN_S = 5.0


class _Server(uvicorn.Server):
    """uvicorn, with the worker's own signal handling (``install_signal_handlers``) instead of its own."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def build_app(
    runner: TaskRunner,
    auth: Authenticator,
    health: HealthObserver,
    *,
    prometheus: PrometheusObserver | None = None,
) -> Starlette:
    """The ASGI app: task deliveries, health and (optionally) metrics."""

    async def task(request: Request) -> Response:
        headers = {name.lower(): value for name, value in request.headers.items()}
        try:
            await auth.check(headers)
        except Unauthorized as exc:
            log.warning("request refused (401): %s", exc, extra={"path": request.url.path})
            return JSONResponse({"outcome": "unauthorized", "detail": str(exc)}, status_code=401)
        except KeysUnavailable as exc:
            log.error("request not checked (503): %s", exc, extra={"path": request.url.path})
            headers = {"Retry-After": str(KEYS_RETRY_S)}
            return JSONResponse({"outcome": "keys_unavailable", "detail": str(exc)}, status_code=503, headers=headers)
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                return JSONResponse({"outcome": "too_large", "detail": "larger than a Cloud Tasks task"}, 413)
        delivery = parse_request(bytes(body), headers, default_queue=runner.options.queue)
        reply = await runner.answer(delivery)
        return JSONResponse(reply.body(), status_code=reply.status, headers=reply.headers())

    def check(name: str, probe: Callable[[], Any]) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            status = probe()
            ok = status.ok and not (name == "readyz" and runner.stopping)
            text = (
                status.as_json()
                if not runner.stopping or name != "readyz"
                else ('{"status": "fail", "reason": "shutting down"}')
            )
            return Response(text + "\n", status_code=200 if ok else 503, media_type="application/json")

        return endpoint

    routes = [
        Route("/healthz", check("healthz", health.liveness), methods=["GET", "HEAD"]),
        Route("/readyz", check("readyz", health.readiness), methods=["GET", "HEAD"]),
    ]
    if prometheus is not None:
        observer = prometheus

        async def metrics(request: Request) -> Response:
            status, content_type, text = observer.route()
            return Response(text, status_code=status, media_type=content_type)

        routes.append(Route("/metrics", metrics, methods=["GET"]))
    routes.append(Route("/{path:path}", task, methods=["POST"]))
    return Starlette(routes=routes)


def bind(host: str, port: int) -> socket.socket:
    """The listening socket; a port that cannot be had is a ConfigError naming the setting."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP (not 0): asyncio sets TCP_NODELAY only on accepted sockets of that proto, and without it
    # Nagle's algorithm holds each response's body behind its headers for a delayed ACK (about 40 ms).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise ConfigError(f"WORKER_CLOUDTASKS_PORT={port}: cannot listen on {host}:{port}: {reason}") from None
    sock.listen(1024)
    sock.setblocking(False)
    return sock


async def check_dead_letter_table(client: Any, table: str) -> None:
    """A missing or forbidden dead-letter table stops the start (an unreachable endpoint does not)."""
    try:
        await client.get_item(
            TableName=table, Key={PARTITION_KEY: {"S": "sqs-worker"}, SORT_KEY: {"S": "startup-check"}}
        )
    except Exception as exc:
        if is_transient(exc):
            return
        error = translate_dead_letter_error(exc, "GetItem", table)
        if isinstance(error, ConfigError):
            raise error from exc
        raise ConfigError(f"dead-letter table {table!r}: {error}") from exc


@contextlib.asynccontextmanager
async def open_runner(
    settings: WorkerSettings, cloudtasks: CloudTasksSettings, registry: Registry, observers: Observers
) -> AsyncIterator[TaskRunner]:
    """A TaskRunner wired to the dead-letter table and (when configured) the idempotency ledger."""
    from worker.runtime.assemble import check_registry, check_table, worker_id

    if not cloudtasks.dead_letter_table:
        raise ConfigError("WORKER_CLOUDTASKS_DEAD_LETTER_TABLE is not set: Cloud Tasks keeps no dead letters itself")
    check_registry(settings, registry)
    queue = queue_name_of(settings.queue.rsplit("/", 1)[-1])
    async with contextlib.AsyncExitStack() as stack:
        dynamodb = await stack.enter_async_context(
            async_client("dynamodb", config=client_config(settings), connection=settings.aws().client_kwargs())
        )
        await check_dead_letter_table(dynamodb, cloudtasks.dead_letter_table)
        ledger: Any = None
        if settings.idempotency_table:
            from worker.idempotency import Ledger

            await check_table(dynamodb, settings.idempotency_table)
            ledger = Ledger(dynamodb, settings.idempotency_table, owner=worker_id())
            stack.push_async_callback(ledger.aclose)
        # the lifespans stop after the runner drained (the caller's block ends after ``drain``)
        resources = await stack.enter_async_context(open_lifespans(registry.lifespans))
        yield TaskRunner(
            registry=registry,
            options=RunnerOptions(
                queue=queue,
                queue_max_attempts=cloudtasks.max_attempts,
                concurrency=settings.concurrency,
                dead_letter_write_s=cloudtasks.dead_letter_write_s,
            ),
            dead_letters=DeadLetterStore(dynamodb, cloudtasks.dead_letter_table, queue),
            observers=observers,
            ledger=ledger,
            resources=resources,
        )


async def serve_tasks(
    settings: WorkerSettings,
    registry: Registry,
    *,
    cloudtasks: CloudTasksSettings | None = None,
    stop: asyncio.Event | None = None,
    started: asyncio.Future[int] | None = None,
    signals: bool = True,
    keys: KeySet | None = None,
    extra_observers: list[Observer] | None = None,
) -> None:
    """Serve task deliveries until ``stop`` (or SIGTERM/SIGINT), then shut down cleanly.

    ``started`` receives the bound port; ``keys`` replaces Google's signing keys (tests)."""
    from worker.runtime.service import install_signal_handlers

    cloudtasks = cloudtasks or load_cloudtasks_settings()
    stop = stop or asyncio.Event()
    if signals:
        install_signal_handlers(stop)
    auth = Authenticator(cloudtasks, keys=keys)
    health = HealthObserver(settings)
    observers = Observers([LogObserver(), health, *(extra_observers or [])])
    prometheus = None
    if settings.prometheus_port is not None:
        prometheus = PrometheusObserver(queue_name_of(settings.queue))
        observers.add(prometheus)
    metrics = build_metrics_observer(settings, queue_name_of(settings.queue))
    if metrics is not None:
        observers.add(metrics)
    try:
        async with open_runner(settings, cloudtasks, registry, observers) as runner:
            _warn_deadline(registry, cloudtasks.dispatch_deadline_s)
            sock = bind(cloudtasks.host, cloudtasks.port)
            config = uvicorn.Config(
                build_app(runner, auth, health, prometheus=prometheus),
                log_config=None,
                access_log=False,
                lifespan="off",
                server_header=False,
                timeout_graceful_shutdown=int(settings.shutdown_grace_s + ANSWER_MARGIN_S) + 3,
            )
            server = _Server(config)
            serving = asyncio.create_task(server.serve(sockets=[sock]), name="uvicorn")
            gauges = asyncio.create_task(_gauges(runner), name="gauges")
            port: int = sock.getsockname()[1]
            log.info(
                "serve-tasks listening on %s:%d for queue %s (concurrency %d)",
                cloudtasks.host,
                port,
                runner.options.queue,
                settings.concurrency,
                extra={"job_types": registry.names()},
            )
            if started is not None and not started.done():
                started.set_result(port)
            stopped = asyncio.create_task(stop.wait())
            await asyncio.wait({serving, stopped}, return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            runner.stopping = True
            server.should_exit = True
            await runner.drain(settings.shutdown_grace_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(serving), timeout=ANSWER_MARGIN_S + 5)
            if not serving.done():
                server.force_exit = True
                await serving
            gauges.cancel()
            await asyncio.gather(gauges, return_exceptions=True)
            sock.close()
            log.info("serve-tasks stopped", extra={"queue": runner.options.queue})
            serving.result()  # an error of the server itself
    finally:
        if metrics is not None:
            metrics.close()
        health.close()


def _warn_deadline(registry: Registry, dispatch_deadline_s: int) -> None:
    from worker.backends.cloudtasks.contract import deadline_warnings, flow_warnings

    for warning in [*deadline_warnings(registry.specs(), dispatch_deadline_s), *flow_warnings(registry.specs())]:
        log.warning("%s", warning)


async def _gauges(runner: TaskRunner) -> None:
    """Liveness and gauges about once a second (as the SQS worker's heartbeat tick)."""
    while True:
        runner.gauge()
        await asyncio.sleep(GAUGE_INTERVAL_S)  # a fixed cadence; cancelled at shutdown
