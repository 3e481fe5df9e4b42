"""Batching of per-message SQS calls (DeleteMessageBatch, ChangeMessageVisibilityBatch).

Entries are flushed when 10 are waiting or a few milliseconds after the first one, whichever comes first.
Each caller awaits the outcome of its own entry: per-entry failures are reported to that caller alone.
Transport failures (endpoint down, throttled) are retried as the BATCH budget of ``worker.budgets`` allows.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from worker.backends.aws import call_with_budget
from worker.budgets import BATCH, Budget
from worker.errors import QueueUnavailable, WorkerError

E = TypeVar("E")

MAX_BATCH = 10


class EntryFailed(WorkerError):
    """SQS refused one entry of a batch (for example ReceiptHandleIsInvalid)."""

    def __init__(self, code: str, message: str, *, sender_fault: bool = True) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.sender_fault = sender_fault


@dataclass
class _Pending(Generic[E]):
    entry: E
    future: asyncio.Future[None]


#: Sends one batch (at most 10 entries); returns the failed entries by their index in the batch.
FlushFunction = Callable[[list[E]], Awaitable[dict[int, EntryFailed]]]


class Batcher(Generic[E]):
    """Collects entries and sends them in batches of up to 10."""

    def __init__(
        self,
        flush: FlushFunction[E],
        *,
        name: str,
        max_delay_s: float = 0.005,
        budget: Budget = BATCH,
        rng: random.Random | None = None,
    ) -> None:
        self._flush = flush
        self._name = name
        self._max_delay_s = max_delay_s
        self._budget = budget
        self._rng = rng or random.Random()
        self._pending: list[_Pending[E]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.calls = 0

    async def submit(self, entry: E) -> None:
        """Queue ``entry`` and wait until its batch was sent. Raises EntryFailed or QueueUnavailable. The entry is
        queued before the first wait, so it is sent whatever its caller does next."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._pending.append(_Pending(entry, future))
        if len(self._pending) >= MAX_BATCH:
            self._start_flush()
        elif self._timer is None:
            self._timer = loop.call_later(self._max_delay_s, self._start_flush)
        # Not shielded: a caller cancelled meanwhile cancels only its future; its entry is still sent (``_send``
        # skips futures that are done).
        await future

    def _start_flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._pending:
            batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            task = asyncio.get_running_loop().create_task(self._send(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[_Pending[E]]) -> None:
        entries = [p.entry for p in batch]

        async def flush() -> dict[int, EntryFailed]:
            self.calls += 1
            return await self._flush(entries)

        try:
            failed = await call_with_budget(
                flush,
                budget=self._budget,
                rng=self._rng,
                monotonic=asyncio.get_running_loop().time,
                retryable=lambda exc: isinstance(exc, QueueUnavailable),
            )
        except Exception as exc:  # the budget is spent, or the batch was refused: each caller gets the error
            for pending in batch:
                if not pending.future.done():
                    pending.future.set_exception(exc)
            return
        for index, pending in enumerate(batch):
            if pending.future.done():
                continue
            if index in failed:
                pending.future.set_exception(failed[index])
            else:
                pending.future.set_result(None)

    async def drain(self) -> None:
        """Send everything pending now and wait for the batches in flight."""
        if self._pending:
            self._start_flush()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
