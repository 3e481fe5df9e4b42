"""Burst mode (``sqs-worker run --burst``): consume until the queue is empty, then stop and summarise.

Empty means the queue's ApproximateNumberOfMessages, ...NotVisible and ...Delayed are all 0, read while this
worker runs no job, and read so twice, about a second apart, with nothing received in between. A retried job
waiting for its delay is in flight for SQS (not visible), so the burst waits for it and runs it. The wait is
bounded: when no job has been received or finished for longer than the longest wait the settings allow (the visibility
timeout, the handlers' largest ``backoff_max_s``, or a longer retry delay this worker set, plus one long poll),
messages that are still there are not coming (held by another consumer, or delayed past that): the burst stops
and says how many are left (exit 1). While the endpoint does not answer, the counts cannot be read and the burst
waits, as the receive loops do.

:class:`Burst` is an Observer (it counts outcomes and sees the worker's in-flight gauge) and a companion
coroutine of ``worker.runtime.service.serve`` (:meth:`Burst.watch`), so the runtime itself does not change.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from worker.backends.aws import async_client, client_config, resolve_queue_url, translate
from worker.errors import QueueUnavailable
from worker.jobs import Registry
from worker.observability.events import Event, Kind
from worker.runtime.outcomes import CANCELLED_AT_SHUTDOWN, DLQ_TOO_SMALL, NOT_YET_DUE, SHUTDOWN
from worker.settings import WorkerSettings

#: Every state a message can be in: visible, in flight (received, not deleted, or a retry's delay), delayed.
COUNT_ATTRIBUTES = (
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
)
#: How often the queue's counts are read while the worker is idle.
CHECK_INTERVAL_S = 1.0
#: A burst's long polls last at most this long (not WORKER_POLL_WAIT_S): when it ends on an empty queue its receives
#: are abandoned, and SQS keeps each open until its wait is over, handing it whatever is sent meanwhile (that message
#: then reappears a visibility timeout later, one receive more). With 1 s, a job sent a second after a burst is safe.
BURST_POLL_WAIT_S = 1


@dataclass(frozen=True)
class Left:
    """What the queue still held when the burst gave up waiting."""

    visible: int
    in_flight: int
    delayed: int

    @property
    def total(self) -> int:
        return self.visible + self.in_flight + self.delayed


#: Releases a burst does not wait for: a long delay's hops (the job is not due: "delayed past that"), a message
#: its DLQ is too small for (it waits for a bigger DLQ), and the shutdown's own.
NOT_AWAITED = frozenset({NOT_YET_DUE, DLQ_TOO_SMALL, SHUTDOWN, CANCELLED_AT_SHUTDOWN})


def burst_settings(settings: WorkerSettings) -> WorkerSettings:
    """The settings a burst runs with: long polls of at most BURST_POLL_WAIT_S."""
    return settings.model_copy(update={"poll_wait_s": min(settings.poll_wait_s, BURST_POLL_WAIT_S)})


def idle_limit_s(*, visibility_timeout_s: int, backoff_max_s: float, poll_wait_s: int) -> float:
    """How long a non-empty queue may bring nothing before the burst stops: past the visibility timeout, a
    message another consumer holds without extending it is visible again; past the largest backoff, a retry
    is due. One long poll more to receive it."""
    return max(float(visibility_timeout_s), backoff_max_s) + poll_wait_s


class Burst:
    """Counts outcomes (an Observer) and stops the worker when its queue is empty (:meth:`watch`)."""

    def __init__(
        self,
        settings: WorkerSettings,
        registry: Registry,
        *,
        check_interval_s: float = CHECK_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.check_interval_s = check_interval_s
        self.limit_s = idle_limit_s(
            visibility_timeout_s=settings.visibility_timeout_s,
            backoff_max_s=max((spec.backoff_max_s for spec in registry.specs()), default=0.0),
            poll_wait_s=settings.poll_wait_s,
        )
        self._clock = clock
        self.succeeded = 0
        self.retried = 0
        self.dead_lettered = 0
        #: Jobs whose idempotency key had completed already: acknowledged without running.
        self.duplicates = 0
        self.received = 0
        self.in_flight = 0
        self.left: Left | None = None
        self.empty = False
        self._last_activity = clock()
        self._retry_due = 0.0

    # ------------------------------------------------------------------------------------------- the Observer

    def emit(self, event: Event) -> None:
        now = self._clock()
        if event.kind is Kind.RECEIVED:
            self.received += 1
            self._last_activity = now
        elif event.kind is Kind.SUCCEEDED:
            self.succeeded += 1
            self._last_activity = now
        elif event.kind is Kind.RETRY_SCHEDULED:
            self.retried += 1
            self._last_activity = now
            self._retry_due = max(self._retry_due, now + (event.delay_s or 0.0))
        elif event.kind is Kind.DEAD_LETTERED:
            self.dead_lettered += 1
            self._last_activity = now
        elif event.kind is Kind.DUPLICATE_SKIPPED:
            self.duplicates += 1
            self._last_activity = now
        elif event.kind is Kind.RELEASED and event.reason not in NOT_AWAITED:
            # the worker held it back itself (a rate limit, a breaker, a lease held elsewhere): its job to run
            self._retry_due = max(self._retry_due, now + (event.delay_s or 0.0))

    def gauge(self, *, in_flight: int, free_slots: int, stuck_threads: int = 0) -> None:
        self.in_flight = in_flight

    def connectivity(self, *, service: str, reachable: bool) -> None:
        return None

    # ------------------------------------------------------------------------------------------- the watcher

    async def watch(self, stop: asyncio.Event) -> None:
        """Read the queue's counts while the worker is idle; set ``stop`` once it is empty (twice in a row, with
        nothing received in between) or nothing has come for longer than :attr:`limit_s`."""
        try:
            await self._watch(stop)
        except BaseException:
            stop.set()  # a burst that cannot watch its queue must not run on forever
            raise

    async def _watch(self, stop: asyncio.Event) -> None:
        connection = self.settings.aws().client_kwargs()
        async with async_client("sqs", config=client_config(self.settings), connection=connection) as client:
            url = await self._queue_url(client, stop)
            received_at_zero: int | None = None
            while url is not None and not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.check_interval_s)
                if stop.is_set():
                    return
                if self.in_flight:
                    received_at_zero = None
                    continue
                received = self.received
                counts = await self._counts(client, url)
                if counts is None:
                    continue
                if not any(counts):
                    if received_at_zero is not None and received_at_zero == self.received == received:
                        self.empty = True
                        stop.set()
                        return
                    received_at_zero = received
                    continue
                received_at_zero = None
                if self._given_up():
                    self.left = Left(*counts)
                    stop.set()
                    return

    def _given_up(self) -> bool:
        now = self._clock()
        return now - self._last_activity > self.limit_s and now > self._retry_due + self.settings.poll_wait_s

    async def _queue_url(self, client: Any, stop: asyncio.Event) -> str | None:
        while not stop.is_set():
            try:
                url: str = await resolve_queue_url(client, self.settings.queue)
                return url
            except QueueUnavailable:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.check_interval_s)
        return None

    async def _counts(self, client: Any, url: str) -> tuple[int, int, int] | None:
        """Visible, in flight and delayed; None while the endpoint does not answer (the next tick tries again)."""
        try:
            response = await client.get_queue_attributes(QueueUrl=url, AttributeNames=list(COUNT_ATTRIBUTES))
        except (TimeoutError, BotoCoreError, ClientError, OSError) as exc:
            error = translate(exc, "GetQueueAttributes", resource=url.rsplit("/", 1)[-1])
            if isinstance(error, QueueUnavailable):
                return None
            raise error from exc
        attributes = response.get("Attributes", {})
        visible, in_flight, delayed = (int(attributes.get(name, "0")) for name in COUNT_ATTRIBUTES)
        return visible, in_flight, delayed

    # ------------------------------------------------------------------------------------------- the result

    @property
    def exit_code(self) -> int:
        """0 when the queue was emptied (or a signal stopped the burst), 1 when messages were left behind."""
        return 1 if self.left is not None else 0

    def summary(self) -> str:
        done = f"{self.succeeded} succeeded, {self.retried} retried, {self.dead_lettered} dead-lettered"
        if self.duplicates:
            done += f", {self.duplicates} duplicate{'s' if self.duplicates != 1 else ''} skipped"
        if self.empty:
            return f"burst done: {done}; queue empty"
        if self.left is not None:
            left = self.left
            return (
                f"burst stopped: {done}; {left.total} left in the queue ({left.visible} visible, "
                f"{left.in_flight} in flight, {left.delayed} delayed) after {self.limit_s:g} s without a message"
            )
        return f"burst stopped by a signal: {done}"
