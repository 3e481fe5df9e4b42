"""Health: a liveness file, an HTTP endpoint (/healthz, /readyz) and the check behind ``sqs-worker health``.

- Liveness: the main loop turned within ``health_max_age_s``. The runtime calls ``gauge()`` about once a
  second while its loop turns; :class:`HealthObserver` records that and writes the wall-clock time into
  ``health_file`` (at most once a second), which ``sqs-worker health --check`` reads (container HEALTHCHECK).
- Readiness: live, every endpoint the worker uses (SQS, DynamoDB) reachable as last reported through
  ``connectivity()``, and not every handler thread stuck (``gauge(stuck_threads=...)`` below the most threads
  the worker may have for plain ``def`` handlers: no such job could start).

The HTTP server is a few lines on asyncio streams (no framework): GET or HEAD, bounded request size and
read time, one response per connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker.observability.events import Event
from worker.runtime.threads import thread_limit
from worker.settings import WorkerSettings

log = logging.getLogger("worker.health")

#: The liveness file is rewritten at most this often.
FILE_WRITE_INTERVAL_S = 1.0
MAX_REQUEST_BYTES = 8192
REQUEST_READ_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class HealthStatus:
    """One answer of a health check."""

    ok: bool
    reason: str
    details: dict[str, Any]

    def as_json(self) -> str:
        return json.dumps({"status": "ok" if self.ok else "fail", "reason": self.reason, **self.details})


def liveness_from_timestamp(last_turn_epoch_s: float | None, *, now_epoch_s: float, max_age_s: float) -> HealthStatus:
    """Whether a loop turn at ``last_turn_epoch_s`` is recent enough (pure)."""
    if last_turn_epoch_s is None:
        return HealthStatus(False, "the worker loop has not turned yet", {})
    age_s = now_epoch_s - last_turn_epoch_s
    details = {"last_turn_age_s": round(age_s, 3), "max_age_s": max_age_s}
    if age_s > max_age_s:
        return HealthStatus(False, f"the worker loop last turned {age_s:.1f} s ago (limit {max_age_s:g} s)", details)
    return HealthStatus(True, "the worker loop is turning", details)


def read_liveness_file(path: str | os.PathLike[str]) -> float | None:
    """The epoch time written in the liveness file, or None when it is missing or unreadable."""
    try:
        text = Path(path).read_text(encoding="ascii").strip()
        return float(text)
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def check_liveness_file(
    path: str | os.PathLike[str], *, max_age_s: float, now_epoch_s: float | None = None
) -> HealthStatus:
    """The liveness of the worker that writes ``path`` (what ``sqs-worker health --check`` reports)."""
    now = time.time() if now_epoch_s is None else now_epoch_s
    last_turn = read_liveness_file(path)
    if last_turn is None:
        return HealthStatus(False, f"no readable liveness file at {path}: the worker loop has not started", {})
    return liveness_from_timestamp(last_turn, now_epoch_s=now, max_age_s=max_age_s)


def check_liveness_folder(path: str | os.PathLike[str]) -> None:
    """Raise OSError unless the liveness file can be written at ``path`` (its folder made if missing); the file
    itself is not touched: it says the loop turned, and it has not yet."""
    if Path(path).is_dir():
        raise IsADirectoryError(21, "a folder, not a file", str(path))
    folder = Path(path).parent
    folder.mkdir(parents=True, exist_ok=True)
    fd, probe = tempfile.mkstemp(prefix=".health-", dir=folder)
    os.close(fd)
    os.unlink(probe)


def write_liveness_file(path: str | os.PathLike[str], epoch_s: float) -> None:
    """Atomically replace the liveness file's content with ``epoch_s``."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".health-", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as handle:
            handle.write(f"{epoch_s:.3f}\n")
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


class HealthObserver:
    """An Observer that tracks liveness (loop turns) and readiness (endpoint reachability)."""

    def __init__(
        self,
        settings: WorkerSettings,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        write_file: bool = True,
    ) -> None:
        self.max_age_s = settings.health_max_age_s
        self.health_file = settings.health_file if write_file else None
        self._monotonic = monotonic
        self._wall_clock = wall_clock
        self._last_turn: float | None = None
        self._last_file_write: float | None = None
        self._unreachable: set[str] = set()
        self._file_error_logged = False
        self._stuck_threads = 0
        self._thread_limit = thread_limit(settings.concurrency)

    def emit(self, event: Event) -> None:
        return None

    def gauge(self, *, in_flight: int, free_slots: int, stuck_threads: int = 0) -> None:
        now = self._monotonic()
        self._last_turn = now
        self._stuck_threads = stuck_threads
        if self.health_file is None:
            return
        if self._last_file_write is not None and now - self._last_file_write < FILE_WRITE_INTERVAL_S:
            return
        self._last_file_write = now
        try:
            write_liveness_file(self.health_file, self._wall_clock())
        except OSError as exc:
            if not self._file_error_logged:  # once: a read-only filesystem would otherwise log every second
                self._file_error_logged = True
                log.warning("cannot write the liveness file %s: %s", self.health_file, exc)

    def connectivity(self, *, service: str, reachable: bool) -> None:
        if reachable:
            self._unreachable.discard(service)
        else:
            self._unreachable.add(service)

    def liveness(self) -> HealthStatus:
        if self._last_turn is None:
            return HealthStatus(False, "the worker loop has not turned yet", {})
        age_s = self._monotonic() - self._last_turn
        details = {"last_turn_age_s": round(age_s, 3), "max_age_s": self.max_age_s}
        if age_s > self.max_age_s:
            return HealthStatus(False, f"the worker loop last turned {age_s:.1f} s ago", details)
        return HealthStatus(True, "the worker loop is turning", details)

    def readiness(self) -> HealthStatus:
        live = self.liveness()
        if not live.ok:
            return live
        if self._unreachable:
            names = sorted(self._unreachable)
            return HealthStatus(False, "unreachable: " + ", ".join(names), {"unreachable": names})
        if self._stuck_threads >= self._thread_limit:
            return HealthStatus(
                False,
                f"every handler thread ({self._stuck_threads}) is stuck in a plain def handler past its timeout",
                {"unreachable": [], "stuck_threads": self._stuck_threads},
            )
        return HealthStatus(True, "ready", {"unreachable": []})

    def close(self) -> None:
        """Remove the liveness file: a stopped worker is not alive."""
        if self.health_file is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.health_file)


Route = Callable[[], tuple[int, str, str]]  # () -> (status, content type, body)

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, routes: dict[str, Route]) -> None:
    try:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_READ_TIMEOUT_S)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            return
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = request_line.split(" ")
        if len(parts) != 3:
            status, content_type, body = 400, "text/plain", "bad request\n"
            method = "GET"
        else:
            method, target = parts[0], parts[1].split("?", 1)[0]
            route = routes.get(target)
            if method not in ("GET", "HEAD"):
                status, content_type, body = 405, "text/plain", "method not allowed\n"
            elif route is None:
                status, content_type, body = 404, "text/plain", "not found\n"
            else:
                status, content_type, body = route()
        payload = body.encode("utf-8")
        headers = (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\n"
            f"Content-Type: {content_type}\r\nContent-Length: {len(payload)}\r\n"
            "Cache-Control: no-store\r\nConnection: close\r\n\r\n"
        )
        writer.write(headers.encode("latin-1") + (b"" if method == "HEAD" else payload))
        await writer.drain()
    except (ConnectionError, OSError):
        return
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()


async def listen_http(routes: dict[str, Route], *, host: str, port: int) -> asyncio.Server:
    """Bind ``routes`` to ``host:port`` and start answering; OSError when the port cannot be had."""
    server = await asyncio.start_server(
        lambda r, w: _handle(r, w, routes), host=host, port=port, limit=MAX_REQUEST_BYTES
    )
    bound_port: int = server.sockets[0].getsockname()[1]
    log.info("serving %s on %s:%d", ", ".join(sorted(routes)), host, bound_port)
    return server


async def serve_until(server: asyncio.Server, stop_event: asyncio.Event) -> None:
    """Keep ``server`` answering until ``stop_event``, then close it."""
    try:
        async with server:
            await stop_event.wait()
    finally:
        server.close()
        await server.wait_closed()


async def serve_http(
    routes: dict[str, Route],
    *,
    host: str,
    port: int,
    stop_event: asyncio.Event,
    started: asyncio.Future[int] | None = None,
) -> None:
    """Serve ``routes`` until ``stop_event`` is set. ``started`` receives the bound port (useful with port 0)."""
    server = await listen_http(routes, host=host, port=port)
    if started is not None and not started.done():
        started.set_result(server.sockets[0].getsockname()[1])
    await serve_until(server, stop_event)


def _json_route(check: Callable[[], HealthStatus]) -> Route:
    def route() -> tuple[int, str, str]:
        status = check()
        return (200 if status.ok else 503), "application/json", status.as_json() + "\n"

    return route


def health_routes(observer: HealthObserver) -> dict[str, Route]:
    return {"/healthz": _json_route(observer.liveness), "/readyz": _json_route(observer.readiness)}


async def serve_health(
    settings: WorkerSettings,
    observer: HealthObserver,
    stop_event: asyncio.Event,
    *,
    host: str = "0.0.0.0",  # noqa: S104 - probes come from outside the container  # nosec B104
    started: asyncio.Future[int] | None = None,
) -> None:
    """Serve /healthz (liveness) and /readyz (readiness) on ``settings.health_port`` until ``stop_event``."""
    if settings.health_port is None:
        raise ValueError("serve_health needs settings.health_port")
    await serve_http(
        health_routes(observer), host=host, port=settings.health_port, stop_event=stop_event, started=started
    )
