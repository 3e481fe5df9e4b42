"""Handler slots: how many more messages this worker may hold. Receive loops reserve slots before they
ask SQS for messages, so a worker never takes more than it can start at once; messages that arrived without a
slot (a slow receive whose slots went to another loop) wait for one ahead of any new receive."""

from __future__ import annotations

import asyncio
import math
from collections import deque


class Slots:
    """A counter of free handler slots that receive loops can reserve in bulk (at most 10 at a time)."""

    def __init__(self, total: int) -> None:
        if total < 1:
            raise ValueError("total must be >= 1")
        self.total = total
        self.free = total
        self._available = asyncio.Event()
        self._available.set()
        self._waiters: deque[asyncio.Future[bool]] = deque()

    async def reserve(self, most: int) -> int:
        """Wait until at least one slot is free and no message waits for one, then take up to ``most``."""
        while self.free == 0 or self._waiters:
            self._available.clear()
            await self._available.wait()
        taken = min(most, self.free)
        self.free -= taken
        return taken

    def take(self, most: int) -> int:
        """Take up to ``most`` free slots without waiting (possibly none)."""
        taken = min(most, self.free)
        self.free -= taken
        return taken

    async def acquire(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for one slot, ahead of ``reserve``. True when it was taken."""
        if self.free > 0 and not self._waiters:
            self.free -= 1
            return True
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        self._waiters.append(waiter)
        timer = loop.call_later(timeout_s, self._expire, waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                if waiter.result():  # handed a slot in the same instant: give it back
                    self.release(1)
            else:
                self._drop(waiter)
            raise
        finally:
            timer.cancel()

    def _expire(self, waiter: asyncio.Future[bool]) -> None:
        if not waiter.done():
            self._drop(waiter)
            waiter.set_result(False)

    def _drop(self, waiter: asyncio.Future[bool]) -> None:
        if waiter in self._waiters:
            self._waiters.remove(waiter)
        self._wake()

    def release(self, count: int = 1) -> None:
        if count <= 0:
            return
        self.free = min(self.total, self.free + count)
        while self.free > 0 and self._waiters:
            self.free -= 1
            self._waiters.popleft().set_result(True)
        self._wake()

    def _wake(self) -> None:
        if self.free > 0 and not self._waiters:
            self._available.set()

    @property
    def in_use(self) -> int:
        return self.total - self.free


#: Receive loops beyond one per 10 slots, to use the slots a slow receive gave back (``worker.runtime``).
SPARE_RECEIVE_LOOPS = 3


def receive_loops(concurrency: int) -> int:
    """Receive loops for ``concurrency`` slots: one per 10 slots (a receive takes at most 10), plus spares."""
    return math.ceil(concurrency / 10) + SPARE_RECEIVE_LOOPS
