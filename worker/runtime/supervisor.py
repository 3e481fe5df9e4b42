"""``WORKER_PROCESSES``: one supervisor and N worker processes, each with its own event loop, on every core.

The supervisor starts ``sqs-worker run`` N times (``python -m worker.commands run``, same folder and environment,
``WORKER_PROCESSES=1``), forwards SIGTERM and SIGINT to all of them and exits after the last one; a child that dies
while the group runs is started again after a backoff (0.5 s doubling, at most 30 s; back to 0.5 s after a child
ran a minute). A child that exits 2 (a configuration error: every child would hit it) stops the group with 2.

Health for the whole group: each child writes its own liveness file (``<WORKER_HEALTH_FILE>.<n>``) and, when the
supervisor serves ``WORKER_HEALTH_PORT``, answers its own ``/readyz`` on a loopback port the supervisor picked; the
supervisor answers ``/healthz`` and ``/readyz`` as ok only when every child is, and writes ``WORKER_HEALTH_FILE``
while every child is live (so ``sqs-worker health --check`` keeps working unchanged).

Prometheus for the whole group: with ``WORKER_PROMETHEUS_PORT`` each child keeps its metrics in the files of one
folder (prometheus-client's multiprocess mode) and the supervisor's ``/metrics`` merges them
(worker/observability/group_metrics.py says how and why).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import math
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from worker.names import queue_name_of
from worker.observability.group_metrics import GroupMetrics
from worker.observability.health import (
    HealthStatus,
    Route,
    check_liveness_file,
    serve_until,
    write_liveness_file,
)
from worker.runtime.service import EXIT_NOW_SIGNAL, listen_all
from worker.settings import PROCESS_INDEX_ENV, WorkerSettings, child_environment

log = logging.getLogger("worker.supervisor")

#: How often the supervisor reads its children's health.
CHECK_INTERVAL_S = 0.5
#: A child that ran this long without dying resets its restart backoff.
STABLE_AFTER_S = 60.0
RESTART_FIRST_S = 0.5
RESTART_MAX_S = 30.0
#: Beyond the shutdown grace, how long a child gets to exit after SIGTERM before it is killed.
STOP_MARGIN_S = 15.0
CHILD_HTTP_TIMEOUT_S = 2.0
#: prctl option: the signal a process gets when its parent dies (linux/prctl.h).
PR_SET_PDEATHSIG = 1


# ------------------------------------------------------------------------------------------------- how many


def cpus_from_cgroup(cpu_max: str | None) -> int | None:
    """CPUs a cgroup v2 ``cpu.max`` line (``"200000 100000"`` or ``"max 100000"``) allows, rounded up (pure)."""
    if not cpu_max:
        return None
    parts = cpu_max.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return max(1, math.ceil(quota / period)) if quota > 0 and period > 0 else None


def usable_cpus(*, affinity: int, cgroup_cpus: int | None) -> int:
    """The cores a container may use: its CPU affinity, capped by its cgroup quota (pure)."""
    return max(1, min(affinity, cgroup_cpus) if cgroup_cpus else affinity)


def container_cpus() -> int:
    """``usable_cpus`` of this process: ``os.sched_getaffinity`` and the cgroup (v2, else v1) CPU quota."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    cgroup: int | None = None
    with contextlib.suppress(OSError):
        cgroup = cpus_from_cgroup(Path("/sys/fs/cgroup/cpu.max").read_text())
    if cgroup is None:
        with contextlib.suppress(OSError, ValueError):
            quota = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
            period = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
            cgroup = cpus_from_cgroup(f"{quota} {period}") if quota > 0 else None
    return usable_cpus(affinity=affinity, cgroup_cpus=cgroup)


def resolve_processes(value: str, *, cpus: Callable[[], int] = container_cpus) -> int:
    """``WORKER_PROCESSES`` as a number: ``auto`` is the usable cores."""
    return cpus() if value == "auto" else int(value)


def restart_delay_s(*, failures: int) -> float:
    """Pause before starting a child again after its ``failures``-th quick death in a row (pure)."""
    return float(min(RESTART_MAX_S, RESTART_FIRST_S * 2 ** max(0, failures - 1)))


def group_status(members: list[tuple[int, HealthStatus]], what: str) -> HealthStatus:
    """One answer for the group: ok when every child's is (pure)."""
    failing = [(index, status) for index, status in members if not status.ok]
    details = {
        "processes": [
            {"process": index, "status": "ok" if status.ok else "fail", "reason": status.reason}
            for index, status in members
        ]
    }
    if not members:
        return HealthStatus(False, "no worker process is running", details)
    if failing:
        index, status = failing[0]
        more = f" (and {len(failing) - 1} more)" if len(failing) > 1 else ""
        return HealthStatus(False, f"process {index}: {status.reason}{more}", details)
    return HealthStatus(True, f"all {len(members)} processes {what}", details)


def silent_reason(started_at: float, answered_at: float, now: float) -> str:
    """Why a child is not ready when its health endpoint does not answer (pure; monotonic seconds)."""
    if answered_at <= started_at:
        return f"its health endpoint does not answer yet (started {now - started_at:.0f} s ago)"
    return f"its health endpoint has not answered for {now - answered_at:.0f} s (is its event loop blocked?)"


# ------------------------------------------------------------------------------------------------- the group


@dataclass
class Child:
    index: int
    health_file: str
    health_port: int | None
    #: Its ``/metrics`` on loopback (the health port when there is one); None without WORKER_PROMETHEUS_PORT.
    prometheus_port: int | None = None
    process: asyncio.subprocess.Process | None = None
    started_at: float = 0.0
    #: When its health endpoint last answered (monotonic), 0 before the first answer since its start.
    answered_at: float = 0.0
    failures: int = 0
    restarts: int = 0
    ready: HealthStatus = field(default_factory=lambda: HealthStatus(False, "not started", {}))


class Supervisor:
    """Runs ``count`` worker processes until SIGTERM/SIGINT; ``run`` returns the exit code of the group."""

    def __init__(self, settings: WorkerSettings, count: int, *, command: list[str] | None = None) -> None:
        self.settings = settings
        self.command = command or [sys.executable, "-m", "worker.commands", "run"]
        self.children = [
            Child(index=n, health_file=f"{settings.health_file}.{n}", health_port=None) for n in range(count)
        ]
        for child in self.children:
            self._pick_ports(child)
        self.metrics: GroupMetrics | None = None  # made by run (a folder)
        self.stop = asyncio.Event()
        self.exit_code = 0
        #: A signal that came after the first (the children were told to exit at once): the group exits 128 + it.
        self._second_signal: int | None = None
        #: The signal the children were told to stop with (a child started after it is told too).
        self._stop_signal = signal.SIGTERM

    # ------------------------------------------------------------------------------------- health

    def liveness(self) -> HealthStatus:
        now = time.time()
        return group_status([(child.index, self._child_liveness(child, now)) for child in self.children], "are live")

    def readiness(self) -> HealthStatus:
        live = self.liveness()
        if not live.ok:
            return live
        return group_status([(child.index, child.ready) for child in self.children], "are ready")

    def _child_liveness(self, child: Child, now: float) -> HealthStatus:
        if child.process is None:
            return HealthStatus(False, "not started yet", {})
        if child.process.returncode is not None:
            return HealthStatus(False, "not running (restarting)", {})
        return check_liveness_file(child.health_file, max_age_s=self.settings.health_max_age_s, now_epoch_s=now)

    def routes(self) -> dict[str, Route]:
        def route(check: Callable[[], HealthStatus]) -> Route:
            def answer() -> tuple[int, str, str]:
                status = check()
                return (200 if status.ok else 503), "application/json", status.as_json() + "\n"

            return answer

        return {"/healthz": route(self.liveness), "/readyz": route(self.readiness)}

    async def _watch_health(self) -> None:
        """Every CHECK_INTERVAL_S: each child's readiness (its own /readyz), and the group's liveness file."""
        while not self.stop.is_set():
            await asyncio.gather(*(self._poll_ready(child) for child in self.children))
            if self.liveness().ok:
                with contextlib.suppress(OSError):
                    write_liveness_file(self.settings.health_file, time.time())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), CHECK_INTERVAL_S)

    async def _poll_ready(self, child: Child) -> None:
        if child.health_port is None:
            child.ready = HealthStatus(True, "ready", {})  # nobody asks for readiness without a health port
            return
        try:
            status, body = await asyncio.wait_for(http_get("127.0.0.1", child.health_port, "/readyz"), 2.0)
            reason = json.loads(body).get("reason", "") if body else ""
            child.ready = HealthStatus(status == 200, str(reason) or f"HTTP {status}", {})
            child.answered_at = time.monotonic()
        except (OSError, TimeoutError, ValueError):
            child.ready = HealthStatus(False, silent_reason(child.started_at, child.answered_at, time.monotonic()), {})

    # ------------------------------------------------------------------------------------- running

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._on_signal, signum)
        routes_by_port: dict[int, dict[str, Route]] = {}
        if self.settings.health_port is not None:
            routes_by_port[self.settings.health_port] = self.routes()
        if self.settings.prometheus_port is not None:
            self.metrics = GroupMetrics(queue_name_of(self.settings.queue))
            routes_by_port.setdefault(self.settings.prometheus_port, {})["/metrics"] = self.metrics.route
        try:
            servers = await listen_all(self.settings, routes_by_port)
        except BaseException:
            self._close_metrics()
            raise
        log.info("starting %d worker processes", len(self.children))
        background = [asyncio.create_task(self._watch_health())]
        background += [asyncio.create_task(serve_until(server, self.stop)) for server in servers]
        try:
            await asyncio.gather(*(self._keep_running(child) for child in self.children))
        finally:
            self.stop.set()
            self._signal_all(signal.SIGTERM)  # only on an error of the supervisor itself: no child is left behind
            await asyncio.gather(*background, return_exceptions=True)
            with contextlib.suppress(OSError):
                os.unlink(self.settings.health_file)
            self._close_metrics()
        log.info("all worker processes stopped")
        if self._second_signal is not None and self.exit_code != 2:
            return 128 + self._second_signal  # as one process exits after a second signal
        return self.exit_code

    def _on_signal(self, signum: int) -> None:
        if not self.stop.is_set():
            log.info("%s received: stopping %d worker processes", signal.Signals(signum).name, len(self.children))
            self.stop.set()
            self._stop_signal = signal.Signals(signum)
            self._signal_all(signum)
            return
        self._second_signal = signum
        log.warning("second %s: telling the worker processes to exit at once", signal.Signals(signum).name)
        # Not the signal itself: a process takes repeats of its stop signal as the group's signal arriving twice.
        self._signal_all(EXIT_NOW_SIGNAL)

    def _signal_all(self, signum: int) -> None:
        for child in self.children:
            self._signal(child, signum)

    @staticmethod
    def _signal(child: Child, signum: int) -> None:
        if child.process is not None and child.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                child.process.send_signal(signum)

    async def _keep_running(self, child: Child) -> None:
        """Start ``child``, start it again whenever it dies while the group runs; on stop, wait for its exit."""
        while not self.stop.is_set():
            with contextlib.suppress(OSError):  # a dead child's file would vouch for the new one until it turns
                os.unlink(child.health_file)
            child.process = await asyncio.create_subprocess_exec(
                *self.command, env=self._child_env(child), preexec_fn=die_with_parent
            )
            if self.stop.is_set():  # stopped while it was being started: the signal passed it by
                self._signal(child, self._stop_signal if self._second_signal is None else EXIT_NOW_SIGNAL)
            child.started_at = time.monotonic()
            if self.metrics is not None:
                self.metrics.started(child.process.pid, child.index)
            waiting = asyncio.ensure_future(child.process.wait())
            stopping = asyncio.ensure_future(self.stop.wait())
            await asyncio.wait({waiting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if not waiting.done():  # stopping: the signal was passed on; wait for the child's clean exit
                await self._await_exit(child, waiting)
                self._exited(child)
                return
            code = waiting.result()
            self._exited(child)
            if self.stop.is_set():
                return
            if code == 2:  # a configuration error: every child would hit it; stop the group with it
                log.error("worker process %d exited with 2 (configuration): stopping the group", child.index)
                self.exit_code = 2
                self.stop.set()
                self._signal_all(signal.SIGTERM)
                return
            ran_s = time.monotonic() - child.started_at
            child.failures = 1 if ran_s >= STABLE_AFTER_S else child.failures + 1
            child.restarts += 1
            delay_s = restart_delay_s(failures=child.failures)
            log.warning(
                "worker process %d (pid %d) exited with %s after %.1f s: starting it again in %.1f s",
                child.index,
                child.process.pid,
                code,
                ran_s,
                delay_s,
                extra={"worker_process": child.index, "exit_code": code, "restarts": child.restarts},
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), delay_s)
            self._pick_ports(child)

    def _exited(self, child: Child) -> None:
        if self.metrics is not None and child.process is not None:
            self.metrics.exited(child.process.pid)

    def _close_metrics(self) -> None:
        if self.metrics is not None:
            self.metrics.close()

    async def _await_exit(self, child: Child, waiting: asyncio.Future[int]) -> None:
        assert child.process is not None
        try:
            await asyncio.wait_for(asyncio.shield(waiting), self.settings.shutdown_grace_s + STOP_MARGIN_S)
        except TimeoutError:
            log.error("worker process %d did not exit in time: killing it", child.index)
            with contextlib.suppress(ProcessLookupError):
                child.process.kill()
            await waiting
        by_signal = {-s for s in (signal.SIGTERM, signal.SIGINT, EXIT_NOW_SIGNAL)} | {
            128 + s for s in (signal.SIGTERM, signal.SIGINT, EXIT_NOW_SIGNAL)
        }
        if waiting.result() != 0 and waiting.result() not in by_signal and self.exit_code == 0:
            self.exit_code = 1

    def _pick_ports(self, child: Child) -> None:
        """Free loopback ports for the child's health and metrics, picked anew for each start: a port kept from
        the child's last start could be taken by then, and the restart would stop the group with exit 2."""
        child.health_port = free_loopback_port() if self.settings.health_port is not None else None
        if self.settings.prometheus_port is not None:
            child.prometheus_port = child.health_port or free_loopback_port()

    def _child_env(self, child: Child) -> dict[str, str]:
        env = child_environment(
            WORKER_PROCESSES="1",
            WORKER_HEALTH_FILE=child.health_file,
            WORKER_LISTEN_HOST="127.0.0.1",  # the supervisor alone answers from outside
            **{PROCESS_INDEX_ENV: str(child.index)},
        )
        if child.health_port is not None:
            env["WORKER_HEALTH_PORT"] = str(child.health_port)
        if self.metrics is not None and child.prometheus_port is not None:
            env.update(self.metrics.child_environment(), WORKER_PROMETHEUS_PORT=str(child.prometheus_port))
        return env


def die_with_parent() -> None:
    """In a child before exec (Linux): SIGTERM it when the supervisor dies, even by SIGKILL (no orphans)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def http_get(host: str, port: int, path: str) -> tuple[int, str]:
    """(status, body) of one GET (the children's health endpoints answer one request per connection)."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode("latin-1"))
        await writer.drain()
        raw = await reader.read()
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    head, _, body = raw.decode("utf-8", "replace").partition("\r\n\r\n")
    return int(head.split(" ", 2)[1]), body


def supervise(settings: WorkerSettings, count: int) -> int:
    """Run the group (``sqs-worker run`` with WORKER_PROCESSES above 1); the process's exit code."""
    return asyncio.run(Supervisor(settings, count).run())
