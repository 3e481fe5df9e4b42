"""Running the worker as a process: logging, observers, health endpoint, signals, then the runtime."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Callable, Coroutine
from typing import Any, NoReturn, TypeVar

from worker.errors import ConfigError, QueueUnavailable
from worker.jobs import Registry
from worker.names import queue_name_of
from worker.observability.events import Observer, Observers
from worker.observability.health import (
    HealthObserver,
    Route,
    check_liveness_folder,
    health_routes,
    listen_http,
    serve_until,
)
from worker.observability.logs import LogObserver
from worker.observability.metrics import build_metrics_observer
from worker.observability.prometheus import PrometheusObserver
from worker.runtime.assemble import open_worker
from worker.runtime.presence import PresenceObserver, presence_companion
from worker.settings import WorkerSettings, supervised

log = logging.getLogger("worker")

T = TypeVar("T")

#: Extra coroutines to run beside the worker (the local scheduler of ``sqs-worker dev``); they get ``stop``.
Companion = Callable[[asyncio.Event], Coroutine[Any, Any, None]]


#: The supervisor's "exit at once" to the processes it started (it got a second signal). They take their stop signal
#: once: a signal to the whole process group reaches them directly and again from the supervisor, as late as its
#: share of the CPU lets it, so a repeat of SIGTERM or SIGINT says nothing new.
EXIT_NOW_SIGNAL = signal.SIGUSR1


def install_signal_handlers(stop: asyncio.Event) -> None:
    """First SIGTERM or SIGINT: stop receiving and shut down cleanly. A second one: exit at once.

    In a process the supervisor started, repeats of SIGTERM and SIGINT are the first arriving again (a signal to
    the whole process group reaches it directly and from the supervisor); it exits at once on EXIT_NOW_SIGNAL,
    which the supervisor sends on its own second signal, or on a repeat once the supervisor is gone."""
    loop = asyncio.get_running_loop()
    parent_pid = os.getppid() if supervised() else None

    def exit_now(signum: int, why: str) -> NoReturn:
        log.warning("%s: exiting at once", why)
        logging.shutdown()
        os._exit(128 + signum)

    def on_signal(signum: int) -> None:
        if stop.is_set():
            if parent_pid is not None and os.getppid() == parent_pid:
                log.debug("%s again: the group's signal, passed on by the supervisor", signal.Signals(signum).name)
                return
            exit_now(signum, f"second {signal.Signals(signum).name}")
        log.info("%s received: shutting down", signal.Signals(signum).name)
        stop.set()

    if parent_pid is not None:
        loop.add_signal_handler(EXIT_NOW_SIGNAL, exit_now, EXIT_NOW_SIGNAL, "the supervisor's second signal")
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)


def run_loop(settings: WorkerSettings, main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` to its end on the event loop ``WORKER_EVENT_LOOP`` names (as ``asyncio.run`` does)."""
    if settings.event_loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            main.close()
            raise ConfigError(
                "WORKER_EVENT_LOOP=uvloop needs uvloop: install the extra as you installed sqs-worker, "
                "pip install '/path/to/sqs-worker[uvloop]' (the container image has it)"
            ) from None
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(main)
    return asyncio.run(main)


async def serve(
    settings: WorkerSettings,
    registry: Registry,
    *,
    stop: asyncio.Event | None = None,
    companions: list[Companion] | None = None,
    extra_observers: list[Observer] | None = None,
) -> None:
    """Run the worker until ``stop`` (or SIGTERM/SIGINT) and a clean shutdown.

    The health and Prometheus ports are bound first: one that cannot be had stops the start with a
    ConfigError before the queue is touched.
    """
    try:
        check_liveness_folder(settings.health_file)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        where = f"WORKER_HEALTH_FILE={settings.health_file}"
        raise ConfigError(f"{where}: cannot write the liveness file there: {reason}") from None
    stop = stop or asyncio.Event()
    install_signal_handlers(stop)
    health = HealthObserver(settings)
    observers = Observers([LogObserver(), health, *(extra_observers or [])])
    routes_by_port: dict[int, dict[str, Route]] = {}
    if settings.health_port is not None:
        routes_by_port.setdefault(settings.health_port, {}).update(health_routes(health))
    if settings.prometheus_port is not None:
        prometheus = PrometheusObserver(queue_name_of(settings.queue))
        observers.add(prometheus)
        routes_by_port.setdefault(settings.prometheus_port, {})["/metrics"] = prometheus.route
    companions = list(companions or [])
    if settings.idempotency_table:  # the dashboard's list of live workers: one small put every 15 s
        presence = PresenceObserver()
        observers.add(presence)
        companions.append(presence_companion(settings, presence))
    servers = await listen_all(settings, routes_by_port)
    background = [asyncio.create_task(serve_until(server, stop)) for server in servers]
    metrics = None
    try:
        metrics = build_metrics_observer(settings, queue_name_of(settings.queue))
        if metrics is not None:
            observers.add(metrics)
        async with open_worker(settings, registry, stop=stop, observers=observers) as worker:
            for companion in companions:
                background.append(asyncio.create_task(companion(stop)))
            await worker.run(stop)
    except QueueUnavailable:
        if not stop.is_set():
            raise
        log.info("stopped before the queue could be reached")  # a signal while waiting for the endpoint
    finally:
        stop.set()
        try:
            for task in background:
                with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
                    await asyncio.wait_for(task, timeout=5)
        finally:
            if metrics is not None:
                metrics.close()
            health.close()


async def listen_all(settings: WorkerSettings, routes_by_port: dict[int, dict[str, Route]]) -> list[asyncio.Server]:
    """Bind every port on ``settings.listen_host`` (all interfaces by default: probes and scrapes come from outside
    the container; a supervisor's processes listen on loopback, the supervisor answers for them).

    A port that cannot be had is a ConfigError naming its setting; the ports bound before it are closed.
    """
    servers: list[asyncio.Server] = []
    try:
        for port, routes in routes_by_port.items():
            try:
                servers.append(await listen_http(routes, host=settings.listen_host, port=port))
            except socket.gaierror as exc:  # not an address: the host is wrong, not the port
                raise ConfigError(
                    f"WORKER_LISTEN_HOST={settings.listen_host}: not an address to listen on ({exc.strerror})"
                ) from None
            except OSError as exc:
                reason = os.strerror(exc.errno) if exc.errno else str(exc)
                raise ConfigError(f"{port_settings(settings, port)}: cannot listen on port {port}: {reason}") from None
    except BaseException:
        for server in servers:
            server.close()
        raise
    return servers


def port_settings(settings: WorkerSettings, port: int) -> str:
    """The settings that ask for ``port``, e.g. ``WORKER_HEALTH_PORT=8080``."""
    names = [
        name
        for name, value in (
            ("WORKER_HEALTH_PORT", settings.health_port),
            ("WORKER_PROMETHEUS_PORT", settings.prometheus_port),
        )
        if value == port
    ]
    return " and ".join(names) + f"={port}"
