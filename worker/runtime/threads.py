"""Threads for plain ``def`` handlers, whose timeout counts from the moment their thread starts them.

A thread cannot be stopped. When the worker stops waiting for one (its job timed out, or was stopped because its
idempotency lease went to another worker), the thread runs on, *stuck*: it no longer counts as capacity, and a
replacement thread starts, so the next job never waits behind it. Threads are bounded (:func:`thread_limit`:
as many stuck ones as healthy ones at most); past that, jobs wait for a thread, which is logged, and
:attr:`JobThreads.all_stuck` says so (readiness turns off while every thread is stuck).

The threads are daemon threads: the interpreter does not wait for them at exit, so a process exit ends a
handler that is still running before it completes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from enum import Enum
from typing import Any, TypeVar, cast

from worker.errors import JobTimeout

log = logging.getLogger("worker")

T = TypeVar("T")

#: Threads at most per healthy thread: room for as many stuck threads as healthy ones.
THREADS_PER_SLOT = 2


def thread_limit(size: int) -> int:
    """The most threads a pool keeping ``size`` healthy threads may have (healthy plus stuck)."""
    return THREADS_PER_SLOT * size


class _State(Enum):
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    WITHDRAWN = "withdrawn"


class _Call:
    """One handler call: queued, then running, then finished (or withdrawn before any thread took it)."""

    def __init__(self, fn: Callable[[], Any], loop: asyncio.AbstractEventLoop, owner: object, fields: dict[str, Any]):
        self.fn = fn
        self.loop = loop
        self.owner = owner
        self.fields = fields
        self.state = _State.QUEUED
        self.stuck = False
        self.started_at = 0.0
        self.started: asyncio.Future[None] = loop.create_future()
        self.done: asyncio.Future[Any] = loop.create_future()


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    """On the loop: resolve ``future`` unless its waiter gave up on it (then it was cancelled)."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class JobThreads:
    """Runs blocking calls in threads, keeping ``size`` healthy threads whatever the stuck ones do."""

    def __init__(
        self,
        size: int,
        *,
        max_threads: int | None = None,
        name: str = "sqs-worker-job",
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if size < 1:
            raise ValueError("size must be >= 1")
        self.size = size
        self.max_threads = thread_limit(size) if max_threads is None else max_threads
        if self.max_threads < size:
            raise ValueError("max_threads must be >= size")
        self._name = name
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._queue: deque[_Call] = deque()
        self._running: set[_Call] = set()
        self._threads = 0
        self._idle = 0
        self._stuck = 0
        self._serial = 0
        self._closed = False
        self._waiting_logged = False
        self._wait_on_cancel_until: float | None = None
        self._awaited = 0

    # ------------------------------------------------------------------------------------------ the loop's side

    async def run(
        self, fn: Callable[[], T], *, timeout_s: float, owner: object = None, log_fields: dict[str, Any] | None = None
    ) -> T:
        """Run ``fn`` in a thread; raise JobTimeout (a TimeoutError) when it runs past ``timeout_s`` from its start.

        On a timeout or a cancellation the thread runs on as a stuck thread and a replacement starts. ``owner``
        names the call for :meth:`is_running`; ``log_fields`` go on the log lines about it.
        """
        self._awaited += 1
        try:
            return await self._run(fn, timeout_s=timeout_s, owner=owner, log_fields=log_fields)
        finally:
            self._awaited -= 1

    async def _run(
        self, fn: Callable[[], T], *, timeout_s: float, owner: object, log_fields: dict[str, Any] | None
    ) -> T:
        call = _Call(fn, asyncio.get_running_loop(), owner, dict(log_fields or {}))
        self._submit(call)
        try:
            await call.started
        except asyncio.CancelledError:
            if self._withdraw(call):
                raise  # never started: it never runs
            return cast(T, await self._cancelled(call))  # a thread took it at this very moment
        try:
            remaining_s = call.started_at + timeout_s - self._monotonic()
            await asyncio.wait({call.done}, timeout=max(0.0, remaining_s))
        except asyncio.CancelledError:
            return cast(T, await self._cancelled(call))
        if call.done.done():
            return cast(T, call.done.result())
        self._give_up(call, f"ran past its timeout_s={timeout_s:g}")
        raise JobTimeout(timeout_s)

    async def _cancelled(self, call: _Call) -> Any:
        """The call's waiter was cancelled while its thread runs. Within :meth:`wait_on_cancel`'s window, keep
        waiting for the thread and return its outcome as if nothing had been cancelled; else give it up."""
        until = self._wait_on_cancel_until
        remaining_s = 0.0 if until is None else until - self._monotonic()
        if remaining_s > 0:
            with contextlib.suppress(asyncio.CancelledError):  # cancelled again: give up at once
                await asyncio.wait({call.done}, timeout=remaining_s)
            if call.done.done() and not call.done.cancelled():
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()
                return call.done.result()
        self._give_up(call, "was cancelled")
        raise asyncio.CancelledError

    def wait_on_cancel(self, seconds: float) -> None:
        """From now on, for ``seconds``: a call cancelled while its thread runs waits for that thread instead of
        being given up, and returns its outcome if it finishes in time (shutdown: a handler that completes
        before the process exits gets its message acknowledged, not released)."""
        self._wait_on_cancel_until = self._monotonic() + seconds

    def _give_up(self, call: _Call, why: str) -> None:
        """Stop waiting for ``call``: its thread, if still running, is stuck from now on (no longer capacity)."""
        call.done.cancel()  # a late outcome is dropped, not left unretrieved
        with self._lock:
            if call.state is not _State.RUNNING or call.stuck:
                return
            call.stuck = True
            self._stuck += 1
            self._start_threads_locked()
            stuck, threads = self._stuck, self._threads
        log.warning(
            "a plain def handler %s; its thread cannot be killed and runs on (%d stuck of %d thread(s), at most %d)",
            why,
            stuck,
            threads,
            self.max_threads,
            extra={**call.fields, "event": "thread_stuck", "stuck_threads": stuck},
        )

    def _submit(self, call: _Call) -> None:
        with self._lock:
            self._queue.append(call)
            self._start_threads_locked()
            must_wait = len(self._queue) > self._idle and self._threads >= self.max_threads
            warn = must_wait and not self._waiting_logged
            if warn:
                self._waiting_logged = True
            stuck = self._stuck
            self._work.notify()
        if warn:
            log.warning(
                "every handler thread is busy, %d of %d stuck: plain def jobs wait for a thread",
                stuck,
                self.max_threads,
                extra={**call.fields, "event": "threads_exhausted", "stuck_threads": stuck},
            )

    def _withdraw(self, call: _Call) -> bool:
        with self._lock:
            if call.state is not _State.QUEUED:
                return False
            self._queue.remove(call)
            call.state = _State.WITHDRAWN
            return True

    def is_running(self, owner: object) -> bool:
        """Whether a thread is running a call of ``owner`` now (stuck or not)."""
        with self._lock:
            return any(call.owner is owner for call in self._running)

    @property
    def awaited(self) -> int:
        """Calls the loop is waiting for now (queued, running, or their outcome on its way to the loop)."""
        return self._awaited

    @property
    def stuck(self) -> int:
        """Threads running a handler nobody waits for any more (timed out or stopped)."""
        return self._stuck

    @property
    def threads(self) -> int:
        return self._threads

    @property
    def all_stuck(self) -> bool:
        """Every thread the pool may have is stuck: no plain ``def`` job can start."""
        return self._stuck >= self.max_threads

    def close(self) -> None:
        """Let idle threads end (threads still running end with their call, or with the process)."""
        with self._lock:
            self._closed = True
            self._work.notify_all()

    # ------------------------------------------------------------------------------------------ the threads' side

    def _start_threads_locked(self) -> None:
        """Start threads for queued calls no idle thread will take, keeping ``size`` healthy ones at most."""
        while (
            len(self._queue) > self._idle
            and self._threads - self._stuck < self.size
            and self._threads < self.max_threads
            and not self._closed
        ):
            self._threads += 1
            self._idle += 1  # counted idle until it takes a call
            self._serial += 1
            thread = threading.Thread(target=self._serve, name=f"{self._name}-{self._serial}", daemon=True)
            thread.start()

    def _serve(self) -> None:
        while True:
            with self._lock:
                call = self._next_locked()
            if call is None:
                return
            self._call(call)

    def _next_locked(self) -> _Call | None:
        """Wait for a call and take it; None when this thread should end (closed, or more healthy threads
        than needed after a stuck one came back)."""
        while not self._queue:
            if self._closed or self._threads - self._stuck > self.size:
                self._idle -= 1
                self._threads -= 1
                return None
            self._work.wait()
        self._idle -= 1
        call = self._queue.popleft()
        call.state = _State.RUNNING
        call.started_at = self._monotonic()
        self._running.add(call)
        return call

    def _call(self, call: _Call) -> None:
        self._to_loop(call, call.started, None, None)
        result: Any = None
        error: BaseException | None = None
        try:
            result = call.fn()
        except BaseException as exc:  # delivered to the waiter, as an executor would
            error = exc
        with self._lock:
            call.state = _State.FINISHED
            self._running.discard(call)
            self._idle += 1
            was_stuck = call.stuck
            if was_stuck:
                self._stuck -= 1
                self._waiting_logged = False
        if was_stuck:
            log.info(
                "a stuck handler thread finished %.1f s after its start; its outcome is dropped",
                self._monotonic() - call.started_at,
                extra={**call.fields, "event": "thread_unstuck", "stuck_threads": self._stuck},
            )
            return
        self._to_loop(call, call.done, result, error)

    @staticmethod
    def _to_loop(call: _Call, future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            call.loop.call_soon_threadsafe(_settle, future, result, error)
