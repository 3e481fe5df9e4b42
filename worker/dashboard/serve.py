"""Serving the dashboard with uvicorn: alone (``sqs-worker dashboard``) or beside the worker (``sqs-worker dev``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Callable, Iterator
from typing import Any

from worker.dashboard.config import DashboardSettings
from worker.dashboard.security import Gate, check_exposure
from worker.errors import ConfigError


def _uvicorn() -> Any:
    try:
        import jinja2  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn
    except ImportError as exc:
        raise ConfigError(
            f"the dashboard needs the 'dashboard' extra ({exc.name} is missing): install sqs-worker again with it, "
            "as you installed it (pip install '/path/to/sqs-worker[dashboard]')"
        ) from None
    return uvicorn


def bind(host: str, port: int) -> socket.socket:
    """The listening socket (port 0: a free one), so the URL is known before serving; a ConfigError when taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        where = f"port {port} (--port or WORKER_DASHBOARD_PORT)"
        raise ConfigError(f"{where}: cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/"


async def serve_dashboard(
    settings: DashboardSettings,
    *,
    stop: asyncio.Event | None = None,
    on_listening: Callable[[str], None] | None = None,
    handle_signals: bool = True,
) -> None:
    """Serve until ``stop`` is set (or, with ``handle_signals``, SIGINT/SIGTERM)."""
    uvicorn = _uvicorn()
    from worker.dashboard.app import create_app
    from worker.dashboard.sources import Sources

    token = settings.dashboard_token.get_secret_value() if settings.dashboard_token else None
    check_exposure(host=settings.dashboard_host, token=token, trust_alb_oidc=settings.dashboard_trust_alb_oidc)
    sources = await asyncio.to_thread(Sources, settings)
    gate = Gate.create(
        token=token, trust_alb_oidc=settings.dashboard_trust_alb_oidc, actions_enabled=settings.dashboard_actions
    )
    app = create_app(settings, sources, gate)
    sock = bind(settings.dashboard_host, settings.dashboard_port)
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="on", timeout_graceful_shutdown=5)

    class Server(uvicorn.Server):  # type: ignore[misc,name-defined]
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            """SIGINT/SIGTERM end the serving and the command exits 0, as ``run`` does (uvicorn's own handling
            re-raises the signal, exiting 143). Beside the worker its handlers set ``stop`` instead."""
            if not handle_signals:
                yield
                return
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(signum, self.handle_exit, signum, None)
            try:
                yield
            finally:
                for signum in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(signum)

    server = Server(config)
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)  # its start-up chatter; errors still show

    async def stop_on(event: asyncio.Event) -> None:
        await event.wait()
        server.should_exit = True

    watcher = asyncio.create_task(stop_on(stop)) if stop is not None else None
    if on_listening is not None:
        on_listening(url_of(sock))
    try:
        await server.serve(sockets=[sock])
    finally:
        if watcher is not None:
            watcher.cancel()
        sock.close()
