"""Running the worker as a process: logging, observers, health endpoint, signals, then the runtime."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable, Coroutine
from typing import Any

from worker.app import open_worker
from worker.errors import QueueUnavailable
from worker.events import Observer, Observers
from worker.health import HealthObserver, Route, health_routes, serve_http
from worker.jobs import Registry
from worker.logs import LogObserver
from worker.metrics import build_metrics_observer
from worker.names import queue_name_of
from worker.prometheus import PrometheusObserver
from worker.settings import WorkerSettings

log = logging.getLogger("worker")

#: Extra coroutines to run beside the worker (the local scheduler of ``sqs-worker dev``); they get ``stop``.
Companion = Callable[[asyncio.Event], Coroutine[Any, Any, None]]


def install_signal_handlers(stop: asyncio.Event) -> None:
    """First SIGTERM or SIGINT: stop receiving and shut down cleanly. A second one: exit at once."""
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if stop.is_set():
            log.warning("second %s: exiting at once", signal.Signals(signum).name)
            logging.shutdown()
            os._exit(128 + signum)
        log.info("%s received: shutting down", signal.Signals(signum).name)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)


async def serve(
    settings: WorkerSettings,
    registry: Registry,
    *,
    stop: asyncio.Event | None = None,
    companions: list[Companion] | None = None,
    extra_observers: list[Observer] | None = None,
) -> None:
    """Run the worker until ``stop`` (or SIGTERM/SIGINT) and a clean shutdown."""
    stop = stop or asyncio.Event()
    install_signal_handlers(stop)
    health = HealthObserver(settings)
    metrics = build_metrics_observer(settings, queue_name_of(settings.queue))
    observers = Observers([LogObserver(), health, *(extra_observers or [])])
    if metrics is not None:
        observers.add(metrics)
    background: list[asyncio.Task[None]] = []
    routes_by_port: dict[int, dict[str, Route]] = {}
    if settings.health_port is not None:
        routes_by_port.setdefault(settings.health_port, {}).update(health_routes(health))
    if settings.prometheus_port is not None:
        prometheus = PrometheusObserver(queue_name_of(settings.queue))
        observers.add(prometheus)
        routes_by_port.setdefault(settings.prometheus_port, {})["/metrics"] = prometheus.route
    for port, routes in routes_by_port.items():
        # All interfaces: probes and scrapes come from outside the container.
        server = serve_http(routes, host="0.0.0.0", port=port, stop_event=stop)  # noqa: S104 # nosec B104
        background.append(asyncio.create_task(server))
    try:
        async with open_worker(settings, registry, stop=stop, observers=observers) as worker:
            for companion in companions or []:
                background.append(asyncio.create_task(companion(stop)))
            await worker.run(stop)
    except QueueUnavailable:
        if not stop.is_set():
            raise
        log.info("stopped before the queue could be reached")  # a signal while waiting for the endpoint
    finally:
        stop.set()
        for task in background:
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(task, timeout=5)
        if metrics is not None:
            metrics.close()
        health.close()
